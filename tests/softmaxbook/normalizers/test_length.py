"""softmaxbook.normalizers.length: Scalable-Softmax, YaRN's logit scale, adaptive
temperature.

Each against its formula, the property it is for (a key ahead by a fixed margin
keeps its weight as the row grows; the temperature is never raised), the
length a row counts, and the errors. The normalizer contract is checked in
test_normalizer_contract.py.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

import softmaxbook as sb
from random_inputs import scores


def margin_row(n, margin=5.0):
    """n - 1 scores of -2 and one of -2 + margin (the paper's Figure 1 row)."""
    row = torch.full((n,), -2.0, dtype=torch.float64)
    row[-1] = -2.0 + margin
    return row


# ---------------------------------------------------------------------- SSMax


@pytest.mark.parametrize("s", [0.43, 1.0, 2.5])
def test_scalable_softmax_is_softmax_of_scores_times_s_log_n(s):
    x = scores((4, 11))
    expected = torch.softmax(s * math.log(11) * x, -1)
    torch.testing.assert_close(sb.scalable_softmax(x, s=s), expected)
    # n^(s x_i) / sum_j n^(s x_j), the paper's form.
    power = 11.0 ** (s * x)
    torch.testing.assert_close(
        sb.scalable_softmax(x, s=s), power / power.sum(-1, keepdim=True)
    )


def test_scalable_softmax_keeps_a_margin_sharp_where_softmax_fades():
    # The weight of the leading key: softmax e^d / (e^d + n - 1) fades to 0;
    # SSMax n^(s d) / (n^(s d) + n - 1) tends to 1 when s d > 1.
    lengths = [10, 100, 1_000, 10_000, 100_000]
    soft = [float(torch.softmax(margin_row(n), -1)[-1]) for n in lengths]
    ssmax = [float(sb.scalable_softmax(margin_row(n), s=0.43)[-1]) for n in lengths]
    for n, p in zip(lengths, soft):
        assert math.isclose(p, math.exp(5) / (math.exp(5) + n - 1), rel_tol=1e-12)
    for n, p in zip(lengths, ssmax):
        assert math.isclose(p, n**2.15 / (n**2.15 + n - 1), rel_tol=1e-12)
    assert soft[0] > 0.9 and soft[-1] < 0.002
    assert all(a > b for a, b in itertools.pairwise(soft))
    assert min(ssmax) > 0.9 and all(a < b for a, b in itertools.pairwise(ssmax))


def test_scalable_softmax_counts_the_keys_each_row_sees():
    L = 7
    x = scores((L, L)).masked_fill(~sb.causal_mask(L), float("-inf"))
    p = sb.scalable_softmax(x, s=0.8)
    for i in range(L):
        expected = torch.softmax(0.8 * math.log(i + 1) * x[i, : i + 1], -1)
        torch.testing.assert_close(p[i, : i + 1], expected)
    # An explicit n (the training length, say) replaces the count.
    torch.testing.assert_close(
        sb.scalable_softmax(x, s=0.8, n=64)[3, :4],
        torch.softmax(0.8 * math.log(64) * x[3, :4], -1),
    )


def test_scalable_softmax_learned_s_gets_a_finite_gradient_with_removed_keys():
    x = scores((3, 6)).masked_fill(~sb.causal_mask(3, 6), float("-inf"))
    s = torch.tensor([[0.5], [1.0], [2.0]], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: sb.scalable_softmax(x, s=t), (s,))
    sb.scalable_softmax(x, s=s).pow(2).sum().backward()
    assert torch.isfinite(s.grad).all() and s.grad[0] == 0  # one key: nothing to learn


def test_scalable_softmax_errors():
    x = scores((2, 3))
    with pytest.raises(ValueError, match="n must be"):
        sb.scalable_softmax(x, n=0)
    with pytest.raises(ValueError, match="finite"):
        sb.scalable_softmax(x, s=float("nan"))
    with pytest.raises(TypeError, match="s must be"):
        sb.scalable_softmax(x, s=torch.tensor(1))


# ---------------------------------------------------------------------- YaRN


def test_yarn_logit_scale_is_the_square_of_the_rope_magnitude_scale():
    # jquesnelle/yarn and openai/gpt-oss multiply cos and sin by 0.1 ln s + 1.
    for factor in (2, 4, 8, 16, 32, 64):
        mscale = 0.1 * math.log(factor) + 1.0
        assert sb.yarn_logit_scale(factor) == mscale**2
    assert sb.yarn_logit_scale(1) == 1.0 and sb.yarn_logit_scale(0.5) == 1.0
    assert math.isclose(sb.yarn_logit_scale(32), 1.8133, abs_tol=1e-4)


def test_yarn_scale_is_what_rotating_scaled_queries_and_keys_gives():
    # Scaling the rotary tables by m multiplies every rotated q and k by m.
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 8, generator=g, dtype=torch.float64)
    angle = torch.linspace(0.1, 1.3, 4, dtype=torch.float64)
    cos, sin = torch.cos(angle), torch.sin(angle)

    def rotate(x, m):
        x1, x2 = x[:4], x[4:]
        return torch.cat([x1 * cos * m - x2 * sin * m, x2 * cos * m + x1 * sin * m])

    m = 0.1 * math.log(16) + 1
    ratio = (rotate(q, m) @ rotate(k, m)) / (rotate(q, 1) @ rotate(k, 1))
    assert math.isclose(float(ratio), sb.yarn_logit_scale(16), rel_tol=1e-12)


def test_yarn_scale_on_part_of_the_dimensions_is_not_the_whole_logit_scale():
    # With RoPE on 2 of 6 dimensions, scaled tables scale only the rotated share
    # of the logit; DeepSeek-V3 (inference/model.py, MLA) scales the whole logit.
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 6, generator=g, dtype=torch.float64)
    factor = sb.yarn_logit_scale(40)
    assert factor == (0.1 * math.log(40) + 1.0) ** 2  # DeepSeek's mscale**2
    nope, rope = float(q[:4] @ k[:4]), float(q[4:] @ k[4:])
    through_tables = nope + factor * rope
    whole = factor * (nope + rope)
    assert abs(through_tables - whole) > 1e-3 * abs(whole)
    assert math.isclose(whole - through_tables, (factor - 1) * nope, rel_tol=1e-12)


def test_yarn_logit_scale_errors():
    with pytest.raises(ValueError, match="> 0"):
        sb.yarn_logit_scale(0)
    with pytest.raises(TypeError, match="real number"):
        sb.yarn_logit_scale("32")


# ------------------------------------------------------------- adaptive temperature


def _adaptive_published(logits):
    """The paper's JAX listing, in NumPy."""
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    poly_fit = np.array([-0.037, 0.481, -2.3, 4.917, -1.791])
    entropy = np.sum(-p * np.log(p + 1e-9), axis=-1, keepdims=True)
    beta = np.where(entropy > 0.5, np.maximum(np.polyval(poly_fit, entropy), 1.0), 1.0)
    z = logits * beta
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_adaptive_temperature_matches_the_published_listing():
    x = scores((8, 16), scale=1.0)
    expected = torch.from_numpy(_adaptive_published(x.numpy()))
    # The listing adds 1e-9 inside the log: equal to ~1e-8.
    torch.testing.assert_close(
        sb.adaptive_temperature_softmax(x), expected, atol=1e-7, rtol=0
    )


def test_adaptive_temperature_never_raises_the_entropy_and_leaves_sharp_rows():
    x = scores((50, 64), scale=0.7, seed=3)
    p = torch.softmax(x, -1)
    a = sb.adaptive_temperature_softmax(x)
    entropy = lambda w: -(w * w.log()).sum(-1)  # noqa: E731
    assert (entropy(a) <= entropy(p) + 1e-12).all()
    assert (entropy(a) < entropy(p) - 0.1).any()
    sharp = torch.tensor([[8.0, 0.0, -1.0, 0.5]], dtype=torch.float64)
    assert float(entropy(torch.softmax(sharp, -1))) <= 0.5
    torch.testing.assert_close(
        sb.adaptive_temperature_softmax(sharp), torch.softmax(sharp, -1)
    )


def test_adaptive_temperature_sharpens_only_entropies_between_the_polynomial_roots():
    # poly(H) = 1 has two real roots, about 0.85 and 5.94 nats: beta > 1 only
    # between them. Rows above the 0.5 threshold but below 0.85, and rows spread
    # wider than 5.94 nats, come back as plain softmax (the docstring says so).
    from softmaxbook.normalizers import length

    poly = np.array(length._ENTROPY_POLYNOMIAL) - np.array([0, 0, 0, 0, 1.0])
    real = sorted(r.real for r in np.roots(poly) if abs(r.imag) < 1e-9)
    assert len(real) == 2
    assert abs(real[0] - 0.8486) < 1e-3 and abs(real[1] - 5.9445) < 1e-3

    def entropy(w):
        return -(w * w.log()).sum(-1)

    wide = torch.linspace(0.0, 1.0, 1024, dtype=torch.float64)  # H = 6.9, not flat
    rows = [torch.tensor([gap, 0.0, 0.0, 0.0], dtype=torch.float64) for gap in (3, 1)]
    for row, expect_sharper in zip(rows + [wide], (False, True, False), strict=True):
        # one score ahead by 3 or by 1 among 4 keys (H = 0.53, 1.24); 1024 spread
        p, a = torch.softmax(row, -1), sb.adaptive_temperature_softmax(row)
        h = float(entropy(p))
        inside = real[0] < h < real[1]
        assert inside == expect_sharper, h
        if inside:
            assert float(entropy(a)) < h - 1e-3
        else:
            torch.testing.assert_close(a, p)
    assert 0.5 < float(entropy(torch.softmax(torch.tensor([3.0, 0, 0, 0]), -1))) < 0.85
    doc = " ".join(sb.adaptive_temperature_softmax.__doc__.split())
    assert "0.85" in doc and "5.94" in doc


def test_the_upper_root_lies_between_uniform_rows_of_381_and_382_keys():
    # The docstring places the polynomial's upper root between log 381 and log 382.
    roots = np.roots([-0.037, 0.481, -2.3, 4.917, -1.791 - 1.0])
    upper = max(r.real for r in roots if abs(r.imag) < 1e-12)
    assert np.log(381) < upper < np.log(382)
    doc = sb.adaptive_temperature_softmax.__doc__
    assert "381 and 382 keys" in " ".join(doc.split())
