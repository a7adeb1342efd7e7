"""Tests for softmaxbook.attention.sdpa: scaled_dot_product_attention against torch and
NumPy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import softmaxbook as sb
from softmaxbook import reference
from softmaxbook.attention import NORMALIZERS

TORCH_ZEROS_EMPTY_ROWS = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (
    2,
    5,
)


def _qkv(seed, q_shape, k_shape, v_shape, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(s, generator=g, dtype=dtype) for s in (q_shape, k_shape, v_shape)
    )


def _numpy_attention(q, k, v, mask=None, scale=None):
    q, k, v = (t.double().numpy() for t in (q, k, v))
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ np.swapaxes(k, -1, -2) * scale
    if mask is not None:
        scores = np.where(mask.numpy(), scores, -np.inf)
    weights = reference.softmax(scores)
    return weights @ v, weights


# --- agreement with torch -------------------------------------------------------------

SHAPES = [  # (batch, L, S, D, Dv)
    ((), 4, 4, 8, 8),
    ((2,), 3, 5, 4, 6),
    ((2, 3), 5, 3, 8, 2),
    ((1, 2), 1, 7, 16, 4),
    ((2, 2), 6, 1, 3, 3),
]


@pytest.mark.parametrize("batch, L, S, D, Dv", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_torch_without_mask(batch, L, S, D, Dv, dtype, causal):
    q, k, v = _qkv(0, (*batch, L, D), (*batch, S, D), (*batch, S, Dv), dtype)
    got = sb.scaled_dot_product_attention(q, k, v, is_causal=causal)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("mask_shape", ["LS", "B11S", "BHLS", "1S", "B1LS"])
@pytest.mark.parametrize("L, S", [(5, 5), (3, 7), (6, 2)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matches_torch_with_boolean_mask(mask_shape, L, S, dtype):
    B, H, D, Dv = 2, 3, 8, 5
    q, k, v = _qkv(1, (B, H, L, D), (B, H, S, D), (B, H, S, Dv), dtype)
    shape = {
        "LS": (L, S),
        "B11S": (B, 1, 1, S),
        "BHLS": (B, H, L, S),
        "1S": (1, S),
        "B1LS": (B, 1, L, S),
    }[mask_shape]
    g = torch.Generator().manual_seed(2)
    mask = torch.rand(shape, generator=g) < 0.7
    mask[..., 0] = True  # one key everywhere; fully masked rows are tested separately
    got = sb.scaled_dot_product_attention(q, k, v, mask=mask)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("scale", [0.05, 1.0, 3.0])
def test_matches_torch_with_scale(scale):
    q, k, v = _qkv(3, (2, 4, 6), (2, 5, 6), (2, 5, 3))
    mask = sb.causal_mask(4, 5)
    got = sb.scaled_dot_product_attention(q, k, v, mask=mask, scale=scale)
    torch.testing.assert_close(
        got, F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    )


def test_batch_dimensions_broadcast_like_matmul():
    q, _, _ = _qkv(4, (2, 3, 4, 8), (1,), (1,))
    _, k, v = _qkv(5, (1,), (3, 6, 8), (3, 6, 5))  # no batch dim: shared by every batch
    got = sb.scaled_dot_product_attention(q, k, v)
    expected = F.scaled_dot_product_attention(
        q, k.expand(2, 3, 6, 8), v.expand(2, 3, 6, 5)
    )
    torch.testing.assert_close(got, expected)
    assert got.shape == (2, 3, 4, 5)


def test_causal_and_padding_batch_matches_torch():
    B, H, L, D = 2, 2, 5, 4
    q, k, v = _qkv(6, (B, H, L, D), (B, H, L, D), (B, H, L, D))
    mask = (
        sb.causal_mask(L) & sb.padding_mask([5, 3], L)[:, None, None, :]
    )  # (B, 1, L, L)
    got = sb.scaled_dot_product_attention(q, k, v, mask=mask)
    torch.testing.assert_close(
        got, F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    )


@pytest.mark.skipif(
    not TORCH_ZEROS_EMPTY_ROWS, reason="torch < 2.5 returns nan for empty rows"
)
def test_fully_masked_rows_agree_with_torch():
    # torch >= 2.5 (math backend, and the default on CPU) gives zeros for a query
    # with nothing to attend, as the library does; checked forward and backward.
    q, k, v = _qkv(7, (2, 2, 4, 8), (2, 2, 6, 8), (2, 2, 6, 3))
    mask = torch.rand(2, 2, 4, 6, generator=torch.Generator().manual_seed(8)) < 0.5
    mask[0, 1, 2] = False
    mask[1, :, 0] = False
    ours = [t.clone().requires_grad_() for t in (q, k, v)]
    theirs = [t.clone().requires_grad_() for t in (q, k, v)]
    out = sb.scaled_dot_product_attention(*ours, mask=mask)
    expected = F.scaled_dot_product_attention(*theirs, attn_mask=mask)
    torch.testing.assert_close(out, expected)
    assert (out[0, 1, 2] == 0).all() and (out[1, :, 0] == 0).all()
    w = torch.randn(
        out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(9)
    )
    (out * w).sum().backward()
    (expected * w).sum().backward()
    for a, b in zip(ours, theirs):
        assert torch.isfinite(a.grad).all()
        torch.testing.assert_close(a.grad, b.grad)


# --- agreement with the NumPy reference -----------------------------------------------


@pytest.mark.parametrize("L, S", [(4, 4), (3, 6), (6, 3)])
def test_matches_numpy_reference_including_empty_rows(L, S):
    q, k, v = _qkv(10, (2, L, 5), (2, S, 5), (2, S, 4))
    mask = torch.rand(2, L, S, generator=torch.Generator().manual_seed(11)) < 0.5
    mask[1, 0] = False
    out, weights = sb.scaled_dot_product_attention(
        q, k, v, mask=mask, return_weights=True
    )
    ref_out, ref_weights = _numpy_attention(q, k, v, mask)
    np.testing.assert_allclose(weights.numpy(), ref_weights, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(out.numpy(), ref_out, rtol=1e-12, atol=1e-14)


def test_return_weights():
    q, k, v = _qkv(12, (3, 4, 8), (3, 5, 8), (3, 5, 2))
    mask = torch.ones(3, 4, 5, dtype=torch.bool)
    mask[2, 1] = False
    out, weights = sb.scaled_dot_product_attention(
        q, k, v, mask=mask, return_weights=True
    )
    assert weights.shape == (3, 4, 5)
    torch.testing.assert_close(out, weights @ v)
    torch.testing.assert_close(out, sb.scaled_dot_product_attention(q, k, v, mask=mask))
    sums = weights.sum(-1)
    assert sums[2, 1] == 0
    torch.testing.assert_close(sums[mask.any(-1)], torch.ones_like(sums[mask.any(-1)]))


# --- properties -----------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    L=st.integers(1, 6),
    S=st.integers(1, 6),
    D=st.integers(1, 5),
    p_keep=st.floats(0.0, 1.0),
)
def test_attention_properties(seed, L, S, D, p_keep):
    q, k, v = _qkv(seed, (2, L, D), (2, S, D), (2, S, 3))
    g = torch.Generator().manual_seed(seed + 1)
    mask = torch.rand(2, L, S, generator=g) < p_keep
    out, weights = sb.scaled_dot_product_attention(
        q, k, v, mask=mask, return_weights=True
    )
    assert torch.isfinite(out).all()
    assert (weights[~mask.expand_as(weights)] == 0).all()
    sums = weights.sum(-1)
    has_key = mask.any(-1)
    torch.testing.assert_close(sums[has_key], torch.ones_like(sums[has_key]))
    assert (sums[~has_key] == 0).all() and (out[~has_key] == 0).all()
    # a key every query ignores may change (even to nan) without changing anything
    ignored = ~mask.any(-2)  # (2, S)
    k2, v2 = k.clone(), v.clone()
    k2[ignored] = float("nan")
    v2[ignored] = 1e6
    out2 = sb.scaled_dot_product_attention(q, k2, v2, mask=mask)
    assert torch.equal(out2, out)


# --- normalizers ----------------------------------------------------------------------


def test_normalizer_by_name_and_callable_agree():
    q, k, v = _qkv(13, (2, 4, 8), (2, 6, 8), (2, 6, 3))
    mask = torch.rand(2, 4, 6, generator=torch.Generator().manual_seed(14)) < 0.5
    mask[0, 0] = False
    named = sb.scaled_dot_product_attention(q, k, v, mask=mask, normalizer="softmax")
    for f in (torch.softmax, lambda s, dim=-1: torch.softmax(s, dim=dim), sb.softmax):
        torch.testing.assert_close(
            sb.scaled_dot_product_attention(q, k, v, mask=mask, normalizer=f), named
        )


def _relu_normalize(s, dim=-1):
    r = torch.relu(s)
    return r / r.sum(dim, keepdim=True).clamp_min(1e-12)


@pytest.mark.parametrize(
    "normalizer", [torch.sigmoid, _relu_normalize, "all-registered"]
)
def test_generic_normalizers_masked_path(normalizer):
    names = sorted(NORMALIZERS) if normalizer == "all-registered" else [normalizer]
    q, k, v = _qkv(15, (2, 4, 6), (2, 5, 6), (2, 5, 3))
    mask = torch.rand(2, 4, 5, generator=torch.Generator().manual_seed(16)) < 0.6
    mask[1, 2] = False
    for norm in names:
        f = (lambda s, dim=-1: torch.sigmoid(s)) if norm is torch.sigmoid else norm
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out, w = sb.scaled_dot_product_attention(
            *leaves, mask=mask, normalizer=f, return_weights=True
        )
        assert (w[~mask] == 0).all(), norm
        assert (w[1, 2] == 0).all() and (out[1, 2] == 0).all(), norm
        out.sum().backward()
        assert all(torch.isfinite(t.grad).all() for t in leaves), norm


def test_generic_normalizer_gradcheck_with_empty_row():
    q, k, v = _qkv(17, (3, 4), (5, 4), (5, 2))
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False
    mask[2, :3] = False

    def f(q, k, v):
        return sb.scaled_dot_product_attention(
            q, k, v, mask=mask, normalizer=lambda s, dim=-1: torch.sigmoid(s)
        )

    assert torch.autograd.gradcheck(f, tuple(t.requires_grad_() for t in (q, k, v)))


def test_generic_normalizer_without_mask():
    q, k, v = _qkv(18, (4, 3), (6, 3), (6, 2))
    _out, w = sb.scaled_dot_product_attention(
        q, k, v, normalizer=_relu_normalize, return_weights=True
    )
    torch.testing.assert_close(w, _relu_normalize(q @ k.T / math.sqrt(3)))


# --- gradients ------------------------------------------------------------------------


@pytest.mark.parametrize("is_causal", [False, True])
def test_gradcheck_with_fully_masked_row(is_causal):
    q, k, v = _qkv(19, (2, 3, 4), (2, 5, 4), (2, 5, 3))
    mask = None
    if not is_causal:
        mask = torch.rand(2, 3, 5, generator=torch.Generator().manual_seed(20)) < 0.6
        mask[0, 1] = False

    def f(q, k, v):
        return sb.scaled_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal)

    inputs = tuple(t.requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(f, inputs)
    assert torch.autograd.gradgradcheck(f, inputs)


# --- dtypes and extreme inputs --------------------------------------------------------


@pytest.mark.parametrize("dtype, atol", [(torch.float16, 5e-3), (torch.bfloat16, 3e-2)])
def test_low_precision_close_to_float32(dtype, atol):
    q, k, v = _qkv(21, (2, 2, 6, 16), (2, 2, 8, 16), (2, 2, 8, 4), torch.float32)
    mask = sb.padding_mask([8, 5], 8)[:, None, None, :] & sb.causal_mask(6, 8)
    mask = mask.expand(2, 2, 6, 8).clone()
    mask[1, 0, 3] = False
    expected = sb.scaled_dot_product_attention(q, k, v, mask=mask)
    got = sb.scaled_dot_product_attention(
        q.to(dtype), k.to(dtype), v.to(dtype), mask=mask
    )
    assert got.dtype == dtype and not torch.isnan(got).any()
    torch.testing.assert_close(got.float(), expected, atol=atol, rtol=0)
    assert (got[1, 0, 3] == 0).all()
    leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    sb.scaled_dot_product_attention(*leaves, mask=mask).sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in leaves)


def test_large_scores_do_not_overflow():
    q = torch.full((1, 2, 4), 100.0)
    k = torch.tensor([[[100.0] * 4, [-100.0] * 4, [0.0] * 4]])
    v = torch.tensor([[[1.0], [2.0], [3.0]]])
    out = sb.scaled_dot_product_attention(q, k, v)  # scores +-2e4
    torch.testing.assert_close(out, torch.ones(1, 2, 1))


def test_nan_propagates_to_its_own_row():
    q, k, v = _qkv(22, (4, 3), (5, 3), (5, 2))
    q[1, 0] = float("nan")
    out = sb.scaled_dot_product_attention(q, k, v)
    assert torch.isnan(out[1]).all()
    assert torch.isfinite(out[[0, 2, 3]]).all()
    # a nan in a key that is masked for every query never reaches the output
    q, k, v = _qkv(22, (4, 3), (5, 3), (5, 2))
    k[4, 0] = float("nan")
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[:, 4] = False
    assert torch.isfinite(sb.scaled_dot_product_attention(q, k, v, mask=mask)).all()


def test_empty_and_size_one_dims():
    q, k, v = _qkv(23, (1, 1), (1, 1), (1, 1))
    torch.testing.assert_close(sb.scaled_dot_product_attention(q, k, v), v)
    q, k, v = _qkv(23, (2, 0, 4), (2, 3, 4), (2, 3, 5))
    assert sb.scaled_dot_product_attention(q, k, v).shape == (2, 0, 5)
    q, k, v = _qkv(23, (2, 3, 4), (2, 0, 4), (2, 0, 5))
    out = sb.scaled_dot_product_attention(q, k, v)  # no keys at all: every row is empty
    assert torch.equal(out, torch.zeros(2, 3, 5, dtype=torch.float64))
    q, k, v = _qkv(23, (0, 3, 4), (0, 2, 4), (0, 2, 5))
    assert sb.scaled_dot_product_attention(q, k, v).shape == (0, 3, 5)


# --- errors ---------------------------------------------------------------------------


def test_errors():
    q, k, v = _qkv(24, (2, 3, 4), (2, 5, 4), (2, 5, 6))
    attn = sb.scaled_dot_product_attention
    with pytest.raises(TypeError, match="q must be a floating-point tensor"):
        attn(q.long(), k, v)
    with pytest.raises(TypeError, match=r"v must be a torch.Tensor"):
        attn(q, k, v.numpy())
    with pytest.raises(TypeError, match="share a dtype"):
        attn(q, k.float(), v)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        attn(q[0, 0], k, v)
    with pytest.raises(ValueError, match="same last dimension D"):
        attn(q, k[..., :3], v)
    with pytest.raises(ValueError, match="same length S"):
        attn(q, k, v[:, :4])
    with pytest.raises(ValueError, match=r"batch dimensions .* do not broadcast"):
        attn(q, torch.cat([k, k, k]), torch.cat([v, v, v]))
    with pytest.raises(ValueError, match="not both"):
        attn(q, k, v, mask=torch.ones(3, 5, dtype=torch.bool), is_causal=True)
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        attn(q, k, v, is_causal=1)
    with pytest.raises(ValueError, match=r"mask of shape \(5, 3\) does not broadcast"):
        attn(q, k, v, mask=torch.ones(5, 3, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask must be a boolean tensor"):
        attn(q, k, v, mask=torch.ones(3, 5))
    with pytest.raises(ValueError, match="scale must be a finite number > 0"):
        attn(q, k, v, scale=0.0)
    with pytest.raises(ValueError, match="scale must be a finite number > 0"):
        attn(q, k, v, scale=float("inf"))
    with pytest.raises(TypeError, match="scale must be a real number"):
        attn(q, k, v, scale="0.5")
    with pytest.raises(ValueError, match=r"normalizer='softmx' is unknown.*'softmax'"):
        attn(q, k, v, normalizer="softmx")
    with pytest.raises(TypeError, match="normalizer must be a name or a callable"):
        attn(q, k, v, normalizer=3)
    with pytest.raises(ValueError, match="must return weights of the scores' shape"):
        attn(q, k, v, normalizer=lambda s, dim=-1: s.sum(dim))
    with pytest.raises(ValueError, match="must return weights of the scores' shape"):
        attn(
            q,
            k,
            v,
            mask=torch.ones(3, 5, dtype=torch.bool),
            normalizer=lambda s, dim=-1: s[..., :1],
        )


# ---------------------------------------------------------------------- sinks (gpt-oss)


def _with_sink_reference(scores, sinks):
    """torch.cat the sink column, softmax, drop it: the definition of the sinks."""
    column = sinks.reshape(sinks.shape + (1, 1)).expand(scores.shape[:-1] + (1,))
    return torch.cat([scores, column], -1).softmax(-1)[..., :-1]


def test_sinks_are_an_extra_logit_whose_weight_is_dropped():
    q, k, v = _qkv(40, (2, 3, 5, 4), (2, 3, 6, 4), (2, 3, 6, 7))
    sinks = torch.tensor([-1.0, 0.5, 3.0], dtype=torch.float64)  # one per head
    out, w = sb.scaled_dot_product_attention(q, k, v, sinks=sinks, return_weights=True)
    expected = _with_sink_reference(q @ k.transpose(-2, -1) / 2.0, sinks)
    torch.testing.assert_close(w, expected)
    torch.testing.assert_close(out, expected @ v)
    assert (w.sum(-1) < 1).all()
    # Heads with a larger sink logit keep more weight back.
    totals = w.sum(-1).mean(dim=(0, 2))
    assert totals[0] > totals[1] > totals[2]


def test_sinks_with_a_causal_mask_and_fully_masked_rows():
    q, k, v = _qkv(41, (2, 2, 4, 3), (2, 2, 4, 3), (2, 2, 4, 2))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    sinks = torch.tensor([0.3, -0.7], dtype=torch.float64, requires_grad=True)
    mask = sb.causal_mask(4).expand(2, 2, 4, 4).clone()
    mask[1, :, 2] = False  # a query with nothing to attend
    out, w = sb.scaled_dot_product_attention(
        *leaves, mask=mask, sinks=sinks, return_weights=True
    )
    scores = (q @ k.transpose(-2, -1) / 3**0.5).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(w, _with_sink_reference(scores, sinks.detach()))
    assert (
        (w[~mask] == 0).all() and (w[1, :, 2] == 0).all() and (out[1, :, 2] == 0).all()
    )
    (out.sum() + w.sum()).backward()
    assert all(torch.isfinite(t.grad).all() for t in (*leaves, sinks))
    assert (leaves[0].grad[1, :, 2] == 0).all()
    causal = sb.scaled_dot_product_attention(q, k, v, is_causal=True, sinks=sinks)
    by_mask = sb.scaled_dot_product_attention(
        q, k, v, mask=sb.causal_mask(4), sinks=sinks
    )
    torch.testing.assert_close(causal, by_mask)


def test_sinks_gradcheck():
    q, k, v = _qkv(42, (1, 2, 3, 2), (1, 2, 4, 2), (1, 2, 4, 2))
    sinks = torch.tensor([0.2, -0.4], dtype=torch.float64)
    inputs = tuple(t.requires_grad_() for t in (q, k, v, sinks))
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[0] = False

    def f(q, k, v, sinks):
        return sb.scaled_dot_product_attention(q, k, v, mask=mask, sinks=sinks)

    assert torch.autograd.gradcheck(f, inputs)


def test_sinks_in_half_precision_and_shapes_that_broadcast():
    q, k, v = _qkv(43, (2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 8))
    sinks = torch.tensor([1.0, 0.0, -1.0])
    exact = sb.scaled_dot_product_attention(q, k, v, sinks=sinks.double())
    for dtype in (torch.float16, torch.bfloat16):
        got = sb.scaled_dot_product_attention(
            q.to(dtype), k.to(dtype), v.to(dtype), sinks=sinks
        )
        assert got.dtype == dtype
        torch.testing.assert_close(got.double(), exact, atol=2e-2, rtol=2e-2)
    per_row = sinks.expand(2, 3)  # one per batch element and head
    torch.testing.assert_close(
        sb.scaled_dot_product_attention(q, k, v, sinks=per_row.double()), exact
    )
    scalar = sb.scaled_dot_product_attention(q, k, v, sinks=torch.tensor(0.0).double())
    torch.testing.assert_close(
        scalar, sb.scaled_dot_product_attention(q, k, v, normalizer="softmax_one")
    )


def test_sinks_errors():
    q, k, v = _qkv(44, (2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 8))
    with pytest.raises(ValueError, match="broadcast to the batch"):
        sb.scaled_dot_product_attention(
            q, k, v, sinks=torch.zeros(4, dtype=torch.float64)
        )
    with pytest.raises(ValueError, match="softmax"):
        sb.scaled_dot_product_attention(
            q, k, v, sinks=torch.zeros(3, dtype=torch.float64), normalizer="sparsemax"
        )
    with pytest.raises(TypeError, match="floating-point"):
        sb.scaled_dot_product_attention(q, k, v, sinks=torch.zeros(3, dtype=torch.long))
    with pytest.raises(TypeError, match="floating-point"):
        sb.scaled_dot_product_attention(q, k, v, sinks=[0.0, 0.0, 0.0])


# ------------------------------------------------ the fused path (torch's kernel)


def _path(*args, **kw):
    return sb.explain_dispatch("scaled_dot_product_attention", *args, **kw).path


def _spy(monkeypatch):
    """Count the calls that reach torch's fused kernel from the library."""
    from softmaxbook.attention import sdpa as attention

    calls = []
    real = attention.F.scaled_dot_product_attention

    def spy(*args, **kw):
        calls.append(kw)
        return real(*args, **kw)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    return calls


FUSED_CASES = [  # (name, q shape, k/v heads, options)
    ("plain", (2, 3, 5, 8), 3, {}),
    ("causal", (2, 3, 6, 8), 3, {"is_causal": True}),
    ("top_left L<S", (1, 2, 3, 8), 2, {"is_causal": "top_left", "S": 7}),
    ("bottom_right L<S", (1, 2, 3, 8), 2, {"is_causal": "bottom_right", "S": 7}),
    ("bottom_right L>S", (1, 2, 7, 8), 2, {"is_causal": "bottom_right", "S": 3}),
    ("mask", (2, 3, 5, 8), 3, {"mask": "B1LS"}),
    ("gqa", (2, 4, 5, 8), 2, {"enable_gqa": True}),
    ("gqa mask", (2, 4, 5, 8), 2, {"enable_gqa": True, "mask": "B1LS"}),
    ("scale", (2, 3, 5, 8), 3, {"scale": 0.3}),
]


@pytest.mark.parametrize("name, q_shape, hkv, options", FUSED_CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fused_path_matches_explicit_forward_and_backward(
    name, q_shape, hkv, options, dtype, monkeypatch
):
    B, H, L, D = q_shape
    options = dict(options)
    S = options.pop("S", L)
    q, k, v = _qkv(50, (B, H, L, D), (B, hkv, S, D), (B, hkv, S, 4), dtype)
    if options.get("mask") == "B1LS":
        g = torch.Generator().manual_seed(51)
        mask = torch.rand(B, 1, L, S, generator=g) < 0.6
        mask[0, 0, 1] = False  # a query with nothing to attend
        options["mask"] = mask
    assert _path(q, k, v, **options) == "torch-fused", name
    calls = _spy(monkeypatch)
    fused = [t.clone().requires_grad_() for t in (q, k, v)]
    explicit = [t.clone().requires_grad_() for t in (q, k, v)]
    out = sb.scaled_dot_product_attention(*fused, **options)
    assert len(calls) == 1  # torch's kernel computed it
    expected = sb.scaled_dot_product_attention(*explicit, explicit=True, **options)
    assert len(calls) == 1  # and explicit=True did not call it
    torch.testing.assert_close(out, expected)
    w = torch.randn(out.shape, dtype=dtype, generator=torch.Generator().manual_seed(52))
    (out * w).sum().backward()
    (expected * w).sum().backward()
    for a, b in zip(fused, explicit):
        torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16]
)
def test_fused_path_gives_zeros_for_fully_masked_rows(dtype):
    # torch 2.13's fused CPU kernel gives zeros, and zero gradients, to a query with
    # nothing to attend, as the explicit path does; bottom-right causal too.
    q, k, v = _qkv(53, (2, 2, 5, 8), (2, 2, 6, 8), (2, 2, 6, 3), dtype)
    mask = torch.rand(2, 2, 5, 6, generator=torch.Generator().manual_seed(54)) < 0.5
    mask[0, 1, 2] = False
    mask[1, :, 0] = False
    for options in ({"mask": mask}, {"is_causal": "bottom_right"}):
        qq = q[..., :, :] if "mask" in options else torch.cat([q, q], -2)[..., :8, :]
        empty = (
            ~mask.any(-1) if "mask" in options else torch.arange(8)[:, None] < 2
        )  # (.., L, 1): rows 0 and 1 see no key when L = 8 > S = 6 bottom-right
        assert _path(qq, k, v, **options) == "torch-fused"
        leaves = [t.clone().requires_grad_() for t in (qq, k, v)]
        out = sb.scaled_dot_product_attention(*leaves, **options)
        rows = empty.expand(out.shape[:-1]) if "mask" in options else None
        if rows is None:
            assert (out[..., :2, :] == 0).all()
        else:
            assert (out[rows] == 0).all()
        out.float().sum().backward()
        assert all(torch.isfinite(t.grad).all() for t in leaves)
        if rows is None:
            assert (leaves[0].grad[..., :2, :] == 0).all()
        else:
            assert (leaves[0].grad[rows] == 0).all()
        expected = sb.scaled_dot_product_attention(qq, k, v, explicit=True, **options)
        tol = (
            {"atol": 2e-2, "rtol": 2e-2}
            if dtype in (torch.float16, torch.bfloat16)
            else {}
        )
        torch.testing.assert_close(out.detach(), expected, **tol)


def test_non_finite_scores_take_the_explicit_path(monkeypatch):
    # torch's kernel adds the mask to the scores, so a nan key that every query masks
    # would reach the output; the call sees the nan and recomputes explicitly, which
    # removes it. The same for infinities.
    q, k, v = _qkv(55, (1, 2, 4, 8), (1, 2, 5, 8), (1, 2, 5, 3))
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[:, 4] = False
    clean = sb.scaled_dot_product_attention(q, k, v, mask=mask)
    for bad in (float("nan"), float("inf"), -float("inf")):
        k2 = k.clone()
        k2[0, 1, 4, 0] = bad
        decision = sb.explain_dispatch(
            "scaled_dot_product_attention", q, k2, v, mask=mask
        )
        assert decision.path == "explicit" and "nan or infinity" in decision.reason
        calls = _spy(monkeypatch)
        out = sb.scaled_dot_product_attention(q, k2, v, mask=mask)
        # the fused kernel ran, gave nan, and the explicit path recomputed the call
        assert len(calls) == 1 and torch.isfinite(out).all()
        torch.testing.assert_close(out, clean)
        monkeypatch.undo()
    # scores that overflow the dtype: finite inputs, infinite products
    big = torch.full((1, 1, 2, 4), 1e20)
    assert _path(big, big, big) == "explicit"
    assert _path(big / 1e20, big / 1e20, big) == "torch-fused"


@pytest.mark.parametrize(
    "options, reason",
    [
        ({"explicit": True}, "explicit=True"),
        ({"return_weights": True}, "return_weights"),
        ({"normalizer": "sparsemax"}, "normalizer"),
        ({"normalizer": torch.softmax}, "normalizer"),
        ({"sinks": torch.zeros(3, dtype=torch.float64)}, "sink"),
    ],
)
def test_what_keeps_the_explicit_path(options, reason, monkeypatch):
    q, k, v = _qkv(56, (2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 8))
    decision = sb.explain_dispatch("scaled_dot_product_attention", q, k, v, **options)
    assert decision.path == "explicit" and reason in decision.reason
    assert str(decision).startswith("scaled_dot_product_attention -> explicit: ")
    calls = _spy(monkeypatch)
    sb.scaled_dot_product_attention(q, k, v, **options)
    assert not calls


def test_shapes_other_than_bhld_and_transforms_keep_the_explicit_path(monkeypatch):
    q, k, v = _qkv(57, (3, 4, 8), (3, 5, 8), (3, 5, 2))
    decision = sb.explain_dispatch("scaled_dot_product_attention", q, k, v)
    assert decision.path == "explicit" and "(B, H, L, D)" in decision.reason
    q4, k4, v4 = (t.unsqueeze(0) for t in (q, k, v))
    assert _path(q4, k4, v4) == "torch-fused"
    assert _path(q4[:, :, :0], k4, v4) == "explicit"  # no queries
    # Under torch.func transforms (hessian, jacrev of a gradient) the explicit path,
    # which is twice differentiable, runs.
    calls = _spy(monkeypatch)
    hess = torch.func.hessian(
        lambda x: sb.scaled_dot_product_attention(x, k4, v4).sum()
    )(q4[:, :, :2, :])
    assert not calls and torch.isfinite(hess).all()


def test_explicit_is_twice_differentiable():
    q, k, v = _qkv(58, (1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 3))
    mask = torch.rand(1, 1, 3, 5, generator=torch.Generator().manual_seed(59)) < 0.6
    mask[0, 0, 1] = False

    def f(q, k, v):
        return sb.scaled_dot_product_attention(q, k, v, mask=mask, explicit=True)

    inputs = tuple(t.requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(f, inputs)
    assert torch.autograd.gradgradcheck(f, inputs)


def test_fused_path_keeps_the_argument_errors():
    q, k, v = _qkv(60, (2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 6))
    attn = sb.scaled_dot_product_attention
    assert _path(q, k, v) == "torch-fused"
    with pytest.raises(TypeError, match="q must be a floating-point tensor"):
        attn(q.long(), k, v)
    with pytest.raises(TypeError, match="share a dtype"):
        attn(q, k.float(), v)
    with pytest.raises(ValueError, match="same last dimension D"):
        attn(q, k[..., :3], v)
    with pytest.raises(ValueError, match=r"mask of shape \(5, 3\) does not broadcast"):
        attn(q, k, v, mask=torch.ones(5, 3, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask must be a boolean tensor"):
        attn(q, k, v, mask=torch.ones(4, 5))
    with pytest.raises(ValueError, match="not both"):
        attn(q, k, v, mask=torch.ones(4, 5, dtype=torch.bool), is_causal=True)
    with pytest.raises(ValueError, match="scale must be a finite number > 0"):
        attn(q, k, v, scale=-1.0)
    with pytest.raises(ValueError, match="is_causal='bottom' is unknown"):
        attn(q, k, v, is_causal="bottom")
    with pytest.raises(ValueError, match="enable_gqa=True needs k and v"):
        attn(q, k[:, :2], v, enable_gqa=True)
    with pytest.raises(TypeError, match="enable_gqa must be a bool"):
        attn(q, k, v, enable_gqa=1)
    with pytest.raises(TypeError, match="explicit must be a bool"):
        attn(q, k, v, explicit="yes")


@pytest.mark.parametrize("spelling", ["name", "function", "entry"])
def test_softmax_is_softmax_however_it_is_named(spelling):
    # "softmax", sb.softmax and its registry entry are one normalizer: each takes
    # the fused path and accepts sinks (only softmax has sink logits).
    normalizer = {
        "name": "softmax",
        "function": sb.softmax,
        "entry": sb.NORMALIZERS["softmax"],
    }[spelling]
    q = torch.randn(1, 2, 4, 8)
    decision = sb.explain_dispatch(
        "scaled_dot_product_attention", q, q, q, normalizer=normalizer
    )
    assert decision.path == "torch-fused"
    sinks = torch.zeros(2)
    torch.testing.assert_close(
        sb.scaled_dot_product_attention(q, q, q, normalizer=normalizer, sinks=sinks),
        sb.scaled_dot_product_attention(q, q, q, sinks=sinks),
    )
