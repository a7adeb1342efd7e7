"""Tests for softmaxbook.sampling.speculative: speculative decoding's acceptance rule.

The statistical tests use a chi-square goodness-of-fit test at level
``ALPHA = 1e-3``: for a correct implementation each fails with probability
about 1e-3 over random seeds (the seeds here are fixed, so the outcome is
deterministic); ``test_the_chi_square_test_detects_a_wrong_rule`` shows that
the same test rejects the common mistakes.
"""

from __future__ import annotations

import pytest
import torch

import softmaxbook as sb

ALPHA = 1e-3
N_DRAWS = 200_000

# A target with a filtered token (p = 0) and a draft that disagrees in every way:
# q > p, q < p, q = 0 where p > 0, and q > 0 where p = 0.
P = torch.tensor([0.30, 0.25, 0.20, 0.15, 0.10, 0.00], dtype=torch.float64)
Q = torch.tensor([0.10, 0.40, 0.00, 0.15, 0.20, 0.15], dtype=torch.float64)


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """P-value of Pearson's goodness-of-fit test of ``counts`` against ``probs``.

    Cells with probability 0 must have count 0 (checked by the callers); they
    carry no degree of freedom.
    """
    keep = probs > 0
    n = counts.sum()
    expected = n * probs[keep]
    statistic = ((counts[keep] - expected) ** 2 / expected).sum()
    df = int(keep.sum()) - 1
    # P(chi2_df > x) is the regularized upper incomplete gamma Q(df / 2, x / 2)
    return float(torch.special.gammaincc(torch.tensor(df / 2), statistic / 2))


def first_tokens(p, q, seed, n=N_DRAWS):
    """The first token emitted by one verification step with K = 1, n times."""
    g = torch.Generator().manual_seed(seed)
    drafts = torch.multinomial(q.expand(n, -1), 1, replacement=True, generator=g)
    target = torch.stack([p, p]).expand(n, 2, -1)  # p_1 and the bonus p_2
    result = sb.speculative_accept(target, q.expand(n, 1, -1), drafts, generator=g)
    return torch.where(result.n_accepted == 1, drafts[:, 0], result.next_token)


def test_the_chi_square_test_itself_on_exact_multinomial_draws():
    # sanity check of the helper: counts drawn from P pass, counts from Q fail
    g = torch.Generator().manual_seed(1)
    from_p = torch.bincount(torch.multinomial(P, N_DRAWS, True, generator=g), None, 6)
    assert chi_square_p_value(from_p.double(), P) > ALPHA
    from_q = torch.bincount(torch.multinomial(Q, N_DRAWS, True, generator=g), None, 6)
    assert chi_square_p_value(from_q[:5].double(), P[:5] / P[:5].sum()) < 1e-12


def test_accepted_tokens_follow_the_target_distribution_exactly():
    tokens = first_tokens(P, Q, seed=0)
    counts = torch.bincount(tokens, minlength=6).double()
    assert counts[5] == 0  # a token the target filtered out never appears
    assert chi_square_p_value(counts, P) > ALPHA


def test_every_position_of_a_block_follows_its_target_distribution():
    # K = 2 draft tokens; the target's distributions differ per position (a
    # unigram model, so they do not depend on the prefix). Each emitted token,
    # and the bonus token, must follow its own position's target.
    n, g = N_DRAWS, torch.Generator().manual_seed(5)
    p = torch.stack([P, P.flip(0), torch.full((6,), 1 / 6, dtype=torch.float64)])
    q = torch.stack([Q, Q.roll(2)])
    drafts = torch.stack(
        [torch.multinomial(q[i].expand(n, -1), 1, True, generator=g)[:, 0]
         for i in range(2)], dim=1,
    )  # fmt: skip
    result = sb.speculative_accept(p.expand(n, 3, 6), q.expand(n, 2, 6), drafts,
                                   generator=g)  # fmt: skip
    m = result.n_accepted
    second = torch.where(m == 2, drafts[:, 1], result.next_token)[m >= 1]
    bonus = result.next_token[m == 2]
    p_values = []
    for tokens, probs in ((second, p[1]), (bonus, p[2])):
        counts = torch.bincount(tokens, minlength=6).double()
        assert (counts[probs == 0] == 0).all()
        p_values.append(chi_square_p_value(counts, probs))
    assert min(p_values) > ALPHA, p_values
    # the acceptance rate of each position is the overlap sum(min(p, q))
    overlap = torch.minimum(p[0], q[0]).sum()
    rate = (m >= 1).double().mean()
    assert abs(float(rate - overlap)) < 5 * float((overlap * (1 - overlap) / n) ** 0.5)


def test_the_chi_square_test_detects_a_wrong_rule():
    # The same test, applied to two wrong rules, rejects them: it can fail.
    g = torch.Generator().manual_seed(2)
    drafts = torch.multinomial(Q.expand(N_DRAWS, -1), 1, True, generator=g)[:, 0]
    u = torch.rand(N_DRAWS, generator=g, dtype=torch.float64)
    accept = u * Q[drafts] < P[drafts]
    # (1) on rejection, resample from p instead of the residual
    from_p = torch.multinomial(P, N_DRAWS, True, generator=g)
    wrong = torch.where(accept, drafts, from_p)
    counts = torch.bincount(wrong, minlength=6).double()
    assert chi_square_p_value(counts, P) < ALPHA
    # (2) the draft's probabilities computed at another temperature than the one
    # its tokens were drawn with: q_used = softmax(log q / 0.7)
    q_used = torch.softmax(torch.log(Q) / 0.7, -1)
    tokens = first_tokens(P, Q, seed=3)  # the correct rule, for contrast
    counts_ok = torch.bincount(tokens, minlength=6).double()
    assert chi_square_p_value(counts_ok, P) > ALPHA
    g = torch.Generator().manual_seed(4)
    target = torch.stack([P, P]).expand(N_DRAWS, 2, -1)
    result = sb.speculative_accept(
        target, q_used.expand(N_DRAWS, 1, -1), drafts[:, None], generator=g
    )
    mixed = torch.where(result.n_accepted == 1, drafts, result.next_token)
    counts = torch.bincount(mixed, minlength=6).double()
    assert chi_square_p_value(counts[:5], P[:5] / P[:5].sum()) < ALPHA


def test_identical_draft_is_always_accepted_and_k_zero_samples_the_target():
    p = torch.softmax(torch.randn(4, 3, 7, dtype=torch.float64), -1)
    drafts = torch.multinomial(p[:, :2].reshape(-1, 7), 1).reshape(4, 2)
    result = sb.speculative_accept(p, p[:, :2], drafts)
    assert (result.n_accepted == 2).all()
    # no draft: the next token is a plain sample of p_1
    g = torch.Generator().manual_seed(0)
    none = sb.speculative_accept(
        P.expand(N_DRAWS, 1, 6), torch.empty(N_DRAWS, 0, 6, dtype=torch.float64),
        torch.empty(N_DRAWS, 0, dtype=torch.long), generator=g,
    )  # fmt: skip
    assert (none.n_accepted == 0).all()
    counts = torch.bincount(none.next_token, minlength=6).double()
    assert counts[5] == 0 and chi_square_p_value(counts, P) > ALPHA


def test_shapes_dtypes_and_reproducibility():
    p = torch.softmax(torch.randn(2, 3, 4, 10), -1)
    q = torch.softmax(torch.randn(2, 3, 3, 10), -1)
    x = torch.multinomial(q.reshape(-1, 10), 1).reshape(2, 3, 3)
    a = sb.speculative_accept(p, q, x, generator=torch.Generator().manual_seed(9))
    b = sb.speculative_accept(p, q, x, generator=torch.Generator().manual_seed(9))
    assert a.n_accepted.shape == a.next_token.shape == (2, 3)
    assert a.n_accepted.dtype == a.next_token.dtype == torch.long
    assert torch.equal(a.n_accepted, b.n_accepted)
    assert torch.equal(a.next_token, b.next_token)
    assert ((0 <= a.n_accepted) & (a.n_accepted <= 3)).all()
    half = sb.speculative_accept(p.half(), q.half(), x)
    assert half.next_token.dtype == torch.long


def test_speculative_errors():
    p = torch.softmax(torch.randn(3, 5), -1)
    q = torch.softmax(torch.randn(2, 5), -1)
    x = torch.tensor([0, 1])
    with pytest.raises(ValueError, match=r"target_probs \(\.\.\., K \+ 1, V\)"):
        sb.speculative_accept(p[:2], q, x)
    with pytest.raises(ValueError, match="must sum to 1"):
        sb.speculative_accept(torch.rand(3, 5), q, x)
    with pytest.raises(ValueError, match="nothing negative"):
        sb.speculative_accept(p, q - 0.5, x)
    with pytest.raises(TypeError, match="integer"):
        sb.speculative_accept(p, q, x.double())
    with pytest.raises(ValueError, match=r"in \[0, 5\)"):
        sb.speculative_accept(p, q, torch.tensor([0, 5]))
    zero = q.clone()
    zero[0] = torch.tensor([0.0, 0.5, 0.5, 0.0, 0.0])
    with pytest.raises(ValueError, match="probability 0 under draft_probs"):
        sb.speculative_accept(p, zero, x)
    with pytest.raises(TypeError, match="generator"):
        sb.speculative_accept(p, q, x, generator=1)
    with pytest.raises(TypeError, match="floating-point"):
        sb.speculative_accept(p, q.long(), x)
