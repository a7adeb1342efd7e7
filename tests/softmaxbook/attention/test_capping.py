"""Tests for softmaxbook.attention.capping: soft-capping, max attention logits,
QK-clip."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import softmaxbook as sb

NEG_INF, POS_INF, NAN = float("-inf"), float("inf"), float("nan")


# --- soft_cap -----------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=20), st.floats(0.01, 100.0))
def test_soft_cap_is_bounded_odd_and_order_preserving(values, cap):
    x = torch.tensor(values, dtype=torch.float64)
    y = sb.soft_cap(x, cap)
    assert (y.abs() <= cap).all()
    torch.testing.assert_close(sb.soft_cap(-x, cap), -y)
    order = torch.argsort(x)
    assert (y[order].diff() >= 0).all()  # never reverses an order


def test_soft_cap_values_and_near_identity():
    x = torch.tensor([0.0, 1.0, 30.0, 300.0], dtype=torch.float64)
    y = sb.soft_cap(x, 30.0)
    expected = [0.0, 30 * math.tanh(1 / 30), 30 * math.tanh(1.0), 30 * math.tanh(10)]
    torch.testing.assert_close(y, torch.tensor(expected, dtype=torch.float64))
    small = torch.linspace(-0.5, 0.5, 11, dtype=torch.float64)
    # tanh(u) = u - u^3/3 + ...: relative error below (x/c)^2 / 3
    assert float((sb.soft_cap(small, 50.0) - small).abs().max()) < 0.5**3 / (3 * 50**2)


def test_soft_cap_infinities_nan_and_gradient():
    x = torch.tensor([NEG_INF, -2.0, 0.5, POS_INF, NAN], dtype=torch.float64)
    y = sb.soft_cap(x, 3.0)
    assert y[0] == NEG_INF  # removed stays removed
    assert y[3] == 3.0 and math.isnan(float(y[4]))
    leaf = x[:4].clone().requires_grad_()
    sb.soft_cap(leaf, 3.0).sum().backward()
    assert torch.isfinite(leaf.grad).all()
    torch.testing.assert_close(
        leaf.grad[1:3], 1 - torch.tanh(leaf.detach()[1:3] / 3.0) ** 2
    )
    z = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: sb.soft_cap(t, 1.5), (z,))


def test_soft_cap_in_softmax_keeps_masked_entries_masked():
    scores = torch.tensor([[2.0, NEG_INF, 100.0]])
    weights = sb.softmax(sb.soft_cap(scores, 5.0))
    assert weights[0, 1] == 0
    # the cap bounds the logit gap by 2c: the smallest kept weight is at least
    # e^{-2c} / n of the largest
    assert float(weights[0, 0] / weights[0, 2]) > math.exp(-10)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_soft_cap_dtypes_and_vmap(dtype):
    x = (torch.randn(3, 7) * 40).to(dtype)
    y = sb.soft_cap(x, 30.0)
    assert y.dtype == dtype and y.shape == x.shape
    ref = sb.soft_cap(x.double(), 30.0)
    assert float((y.double() - ref).abs().max()) <= 30 * torch.finfo(dtype).eps
    rows = torch.func.vmap(lambda r: sb.soft_cap(r, 30.0))(x)
    assert torch.equal(rows, y)


def test_soft_cap_errors():
    with pytest.raises(ValueError, match="cap must be a finite number > 0"):
        sb.soft_cap(torch.ones(2), 0.0)
    with pytest.raises(TypeError, match="cap must be a real number"):
        sb.soft_cap(torch.ones(2), "30")
    with pytest.raises(TypeError, match="x must be a floating-point"):
        sb.soft_cap(torch.ones(2, dtype=torch.long), 1.0)


# --- max_attention_logits and qk_clip_ ----------------------------------------------


def _heads(B=2, H=3, L=5, D=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, L, D, generator=g, dtype=torch.float64) for _ in "qk")


def test_max_attention_logits_by_definition():
    q, k = _heads()
    scores = q @ k.transpose(-2, -1) / 2.0  # D = 4
    expected = scores.transpose(0, 1).reshape(3, -1).amax(-1)
    torch.testing.assert_close(sb.max_attention_logits(q, k), expected)
    causal = scores.masked_fill(~sb.causal_mask(5), NEG_INF)
    torch.testing.assert_close(
        sb.max_attention_logits(q, k, is_causal=True),
        causal.transpose(0, 1).reshape(3, -1).amax(-1),
    )
    nothing = torch.zeros(5, 5, dtype=torch.bool)
    assert (sb.max_attention_logits(q, k, mask=nothing) == NEG_INF).all()
    assert not sb.max_attention_logits(q.requires_grad_(), k).requires_grad


def test_qk_clip_brings_each_clipped_head_back_to_the_threshold():
    torch.manual_seed(0)
    E, H, D = 12, 3, 4
    w_q = torch.randn(H * D, E, dtype=torch.float64) * 3
    w_k = torch.randn(H * D, E, dtype=torch.float64) * 3
    b_q = torch.randn(H * D, dtype=torch.float64)
    b_k = torch.randn(H * D, dtype=torch.float64)
    x = torch.randn(2, 7, E, dtype=torch.float64)

    def heads(w, b):  # (B, L, E) -> (B, H, L, D)
        return (x @ w.T + b).view(2, 7, H, D).transpose(1, 2)

    def logits():
        return heads(w_q, b_q) @ heads(w_k, b_k).transpose(-2, -1) / math.sqrt(D)

    scores_before = logits()
    before = sb.max_attention_logits(heads(w_q, b_q), heads(w_k, b_k))
    tau = float(before.sort().values[1])  # one head above tau, one at it, one below
    gamma = sb.qk_clip_(w_q, w_k, before, tau, b_q=b_q, b_k=b_k)
    after = sb.max_attention_logits(heads(w_q, b_q), heads(w_k, b_k))
    over = before > tau
    assert int(over.sum()) == 1
    torch.testing.assert_close(gamma, torch.where(over, tau / before, 1.0))
    torch.testing.assert_close(after[over], torch.full_like(after[over], tau))
    torch.testing.assert_close(after[~over], before[~over])  # the other heads: same
    # every logit of every head is scaled by its gamma, exactly (bilinearity)
    torch.testing.assert_close(logits(), gamma[:, None, None] * scores_before)


def test_qk_clip_on_a_model_parameter_and_errors():
    attn = sb.MultiHeadAttention(8, 2)
    d = 8
    w = attn.qkv.weight  # rows: q (heads 0, 1), then k, then v
    w_q, w_k = w[:d], w[d : 2 * d]
    v_before = w[2 * d :].detach().clone()
    gamma = sb.qk_clip_(w_q, w_k, torch.tensor([10.0, 1.0]), 2.5)
    torch.testing.assert_close(gamma, torch.tensor([0.25, 1.0]))
    assert torch.equal(w[2 * d :], v_before)  # values untouched, in place on a view
    assert w.grad is None and w.requires_grad
    with pytest.raises(ValueError, match="threshold"):
        sb.qk_clip_(w_q, w_k, torch.tensor([1.0, 1.0]), 0.0)
    with pytest.raises(ValueError, match=r"\(H \* D, E\) with H = 3"):
        sb.qk_clip_(w_q, w_k, torch.ones(3), 1.0)
    with pytest.raises(ValueError, match=r"max_logits must be \(H,\)"):
        sb.qk_clip_(w_q, w_k, torch.ones(2, 1), 1.0)
    with pytest.raises(ValueError, match="b_q must have shape"):
        sb.qk_clip_(w_q, w_k, torch.ones(2), 1.0, b_q=torch.ones(3))
    with pytest.raises(ValueError, match="head dimension"):
        sb.max_attention_logits(torch.ones(3, 4), torch.ones(3, 4))


def test_soft_cap_reaches_the_cap_in_floating_point_as_documented():
    # c tanh(x / c) < c in exact arithmetic, but tanh rounds to 1 far beyond the cap:
    # the closed interval [-c, c] is what the function returns, as its docstring says.
    y = sb.soft_cap(torch.tensor([1000.0, float("inf"), -1000.0]), 50.0)
    assert y.tolist() == [50.0, 50.0, -50.0]
    doc = " ".join(sb.soft_cap.__doc__.split())
    assert "Values in :math:`[-c, c]`" in doc
    # Its summary, the module's list and the glossary give the same closed interval.
    import softmaxbook.attention.capping as capping

    assert "a smooth clamp to :math:`[-c, c]`" in doc
    assert "every logit into :math:`[-c, c]`" in " ".join(capping.__doc__.split())
    glossary = (Path(__file__).parents[3] / "chapters" / "glossary.md").read_text()
    assert "Squashing logits into $[-c, c]$" in glossary
