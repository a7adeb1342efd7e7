"""softmaxbook.normalizers.stickbreaking: the stick-breaking weights of Tan et al.
(2025).

Against the product formula and the authors' log-space reference, the recency
it builds in, the sum it leaves below one, and how masked keys leave the stick
alone. The normalizer contract is checked in test_normalizer_contract.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import softmaxbook as sb
from random_inputs import scores


def product_formula(x):
    """A_j = b_j prod_{k > j} (1 - b_k) along the last dimension, as written."""
    b = torch.sigmoid(x)
    n = x.shape[-1]
    out = torch.empty_like(x)
    for j in range(n):
        out[..., j] = b[..., j] * torch.prod(1 - b[..., j + 1 :], dim=-1)
    return out


def authors_reference(logits, mask):
    """stickbreaking_attention/sb_ref.py: queries in rows, keys in columns.

    ``mask`` is True where a key is *hidden*; ``cum_weight`` sums over the
    keys strictly after j (the reference builds it as a triangular matrix).
    """
    n = logits.shape[-1]
    cum_weight = torch.tril(torch.ones(n, n, dtype=logits.dtype), -1)
    log_z = F.logsigmoid(logits).masked_fill(mask, -1e5)
    log_beta = F.logsigmoid(-logits).masked_fill(mask, 0)
    re_cum_log_beta = torch.einsum("ij,jk->ik", log_beta, cum_weight)
    return (log_z + re_cum_log_beta).exp()


def test_matches_the_product_formula():
    x = scores((5, 8))
    torch.testing.assert_close(sb.stick_breaking(x), product_formula(x))
    torch.testing.assert_close(sb.stick_breaking(x, dim=0), product_formula(x.T).T)


def test_matches_the_authors_reference_under_a_causal_mask():
    L = 6
    logits = scores((L, L))
    hidden = ~sb.causal_mask(L)
    ours = sb.stick_breaking(logits.masked_fill(hidden, float("-inf")))
    torch.testing.assert_close(ours, authors_reference(logits, hidden))


def test_weights_sum_to_one_minus_the_unbroken_stick():
    x = scores((7, 10))
    p = sb.stick_breaking(x)
    rest = torch.prod(1 - torch.sigmoid(x), -1)
    torch.testing.assert_close(p.sum(-1), 1 - rest)
    assert (p.sum(-1) < 1).all()
    quiet = torch.full((1, 20), -8.0, dtype=torch.float64)
    assert float(sb.stick_breaking(quiet).sum()) < 20 * torch.sigmoid(
        torch.tensor(-8.0)
    )


def test_equal_scores_favour_the_most_recent_key():
    row = torch.tensor([3.0, 0.0, 3.0, -4.0], dtype=torch.float64)
    p = sb.stick_breaking(row)
    assert p[2] > 0.9 and p[0] < 0.05  # softmax would split them evenly
    soft = torch.softmax(row, -1)
    torch.testing.assert_close(soft[0], soft[2])


def test_a_removed_key_leaves_the_stick_untouched():
    x = scores((3, 6))
    removed = x.clone()
    removed[:, 4] = float("-inf")
    kept = torch.cat([x[:, :4], x[:, 5:]], -1)
    p = sb.stick_breaking(removed)
    assert (p[:, 4] == 0).all()
    torch.testing.assert_close(
        torch.cat([p[:, :4], p[:, 5:]], -1), sb.stick_breaking(kept)
    )


def test_attend_current_false_leaves_out_the_last_visible_key():
    # Tan et al.'s code (attend_current=False) masks the diagonal: a query's own
    # key, the last key of its causal row, takes nothing from the stick.
    x = scores((4, 7))
    p = sb.stick_breaking(x, attend_current=False)
    assert (p[:, -1] == 0).all()
    torch.testing.assert_close(p[:, :-1], sb.stick_breaking(x[:, :-1]))
    # Under a causal mask the last visible key is the diagonal one.
    L = 6
    logits = scores((L, L))
    causal = logits.masked_fill(~sb.causal_mask(L), float("-inf"))
    strict = torch.tril(torch.ones(L, L, dtype=torch.bool), -1)
    expected = authors_reference(logits, ~strict)
    expected[0] = 0  # the first query has no key before it: it attends to nothing
    ours = sb.stick_breaking(causal, attend_current=False)
    torch.testing.assert_close(ours, expected)
    assert (ours.diagonal() == 0).all() and (ours[0] == 0).all()


def test_attend_current_true_is_the_default_and_keeps_the_diagonal():
    x = scores((3, 5))
    torch.testing.assert_close(
        sb.stick_breaking(x, attend_current=True), sb.stick_breaking(x)
    )
    torch.testing.assert_close(sb.stick_breaking(x), product_formula(x))


def test_attend_current_along_another_dim_and_gradients():
    x = scores((6, 3))
    torch.testing.assert_close(
        sb.stick_breaking(x, dim=0, attend_current=False),
        sb.stick_breaking(x.T, attend_current=False).T,
    )
    y = scores((2, 5)).requires_grad_()
    y.data[1, 3:] = float("-inf")  # a row whose last visible key is key 2
    p = sb.stick_breaking(y, attend_current=False)
    assert p[1, 2] == 0 and torch.isfinite(p).all()
    p.sum().backward()
    assert torch.isfinite(y.grad).all() and (y.grad[1, 2:] == 0).all()
    z = scores((3, 4))
    assert torch.autograd.gradcheck(
        lambda t: sb.stick_breaking(t, attend_current=False), (z.requires_grad_(),)
    )


def test_attend_current_rejects_a_non_bool():
    import pytest

    with pytest.raises(TypeError, match="attend_current"):
        sb.stick_breaking(scores((2, 3)), attend_current=1)
