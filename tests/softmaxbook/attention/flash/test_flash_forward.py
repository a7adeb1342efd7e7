"""flash_attention's forward pass: its error against float64 attention, masks,
the logsumexp, extreme and empty inputs, any tiling, the teaching steps and the
errors for bad input."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import softmaxbook as sb
from random_inputs import qkv as _qkv
from random_inputs import sdpa64 as _sdpa64

# torch's SDPA takes enable_gqa from torch 2.5; the oldest torch this library supports
# is 2.2 (make test-oldest), where only the comparisons with torch are skipped: the
# comparisons with repeated heads run on every version.
TORCH_HAS_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")
needs_torch_gqa = pytest.mark.skipif(
    not TORCH_HAS_GQA, reason="torch's SDPA has enable_gqa from torch 2.5"
)


# ---------------------------------------------------------------- the forward pass


def _errors(q, k, v, out, **kw):
    """FlashAttention's rule: (error of ours, error of torch's float32 SDPA), both vs
    float64."""
    exact = _sdpa64(q, k, v, **kw)
    baseline = F.scaled_dot_product_attention(q, k, v, **kw)
    return (out.double() - exact).abs().max().item(), (
        baseline.double() - exact
    ).abs().max().item()


@pytest.mark.parametrize("L,S", [(1, 1), (7, 13), (33, 5), (64, 64), (129, 257)])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("block_size", [(4, 8), 16, (256, 512)])
def test_flash_attention_error_at_most_twice_torch_float32(L, S, is_causal, block_size):
    q, k, v = _qkv(L, S)
    out = sb.flash_attention(q, k, v, is_causal=is_causal, block_size=block_size)
    ours, torch_err = _errors(q, k, v, out, is_causal=is_causal)
    assert ours <= 2 * torch_err + 1e-7, (
        ours,
        torch_err,
    )  # + an ulp for exact-zero baselines


def test_flash_attention_sharp_scores_within_float32_tolerance():
    q, k, v = _qkv(
        65, 130, scale=3.0
    )  # scores of standard deviation 9: nearly one-hot rows
    out = sb.flash_attention(q, k, v, is_causal=True, block_size=(16, 32))
    torch.testing.assert_close(
        out.double(), _sdpa64(q, k, v, is_causal=True), rtol=1e-5, atol=2e-5
    )


def test_flash_attention_benchmark_shape_meets_flash_rule():
    q, k, v = _qkv(1024, 1024, D=64, batch=(1, 8))
    ours, torch_err = _errors(q, k, v, sb.flash_attention(q, k, v))
    assert ours <= 2 * torch_err


def test_flash_attention_matches_library_attention_with_mask():
    q, k, v = _qkv(9, 11)
    g = torch.Generator().manual_seed(1)
    mask = torch.rand((2, 1, 9, 11), generator=g) > 0.4
    mask[0, 0, 3] = False  # a query with nothing to attend
    expected = sb.scaled_dot_product_attention(q, k, v, mask=mask)
    for block in [(2, 3), (4, 4), 64]:
        out = sb.flash_attention(q, k, v, mask=mask, block_size=block)
        torch.testing.assert_close(out, expected)
        assert torch.equal(out[0, :, 3], torch.zeros(3, 16))
    ours, torch_err = _errors(
        q[1:],
        k[1:],
        v[1:],
        sb.flash_attention(q[1:], k[1:], v[1:], mask=mask[1:]),
        attn_mask=mask[1:],
    )
    assert ours <= 2 * torch_err + 1e-7


def test_flash_attention_mask_equal_to_causal_and_is_causal_top_left():
    q, k, v = _qkv(6, 10)
    mask = sb.causal_mask(6, 10)
    torch.testing.assert_close(
        sb.flash_attention(q, k, v, mask=mask, block_size=3),
        sb.flash_attention(q, k, v, is_causal=True, block_size=3),
    )
    torch.testing.assert_close(
        sb.flash_attention(q, k, v, is_causal=True, block_size=4),
        F.scaled_dot_product_attention(q, k, v, is_causal=True),
    )


def test_flash_attention_fully_masked_rows_are_zero_forward_and_backward():
    q, k, v = _qkv(4, 5, dtype=torch.float64)
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[2] = False
    q.requires_grad_(True)
    k.requires_grad_(True)
    out, lse = sb.flash_attention(q, k, v, mask=mask, block_size=2, return_lse=True)
    assert torch.equal(out[..., 2, :], torch.zeros_like(out[..., 2, :]))
    assert (
        torch.isneginf(lse[..., 2]).all() and torch.isfinite(lse[..., [0, 1, 3]]).all()
    )
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()
    assert torch.equal(q.grad[..., 2, :], torch.zeros_like(q.grad[..., 2, :]))


def test_flash_attention_lse_is_logsumexp_of_scaled_scores():
    q, k, v = _qkv(7, 9, dtype=torch.float64)
    _, lse = sb.flash_attention(q, k, v, block_size=(3, 4), return_lse=True)
    scores = q @ k.transpose(-2, -1) / math.sqrt(16)
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1))
    _, lse_scaled = sb.flash_attention(
        q, k, v, scale=0.5, block_size=4, return_lse=True
    )
    torch.testing.assert_close(
        lse_scaled, torch.logsumexp(0.5 * (q @ k.transpose(-2, -1)), -1)
    )


def test_flash_attention_with_and_without_autograd_agree():
    # One forward for both: a gradient only changes what is saved.
    q, k, v = _qkv(50, 70)
    fast, lse_fast = sb.flash_attention(q, k, v, block_size=(8, 16), return_lse=True)
    slow, lse_slow = sb.flash_attention(
        q.requires_grad_(True), k, v, block_size=(8, 16), return_lse=True
    )
    assert torch.equal(fast, slow.detach()) and torch.equal(lse_fast, lse_slow.detach())


def test_flash_attention_gradcheck():
    q, k, v = (
        t.requires_grad_(True) for t in _qkv(5, 7, D=4, batch=(2,), dtype=torch.float64)
    )
    assert torch.autograd.gradcheck(
        lambda a, b, c: sb.flash_attention(a, b, c, block_size=(2, 3)), (q, k, v)
    )
    mask = torch.tensor(
        [[True, False, True, True, False, False, True]] * 4 + [[False] * 7]
    )
    assert torch.autograd.gradcheck(
        lambda a, b, c: sb.flash_attention(
            a, b, c, mask=mask, block_size=(2, 3), return_lse=True
        )[0],
        (q, k, v),
    )


def test_flash_attention_broadcasting_batch_and_value_dim():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 6, 8, generator=g)
    k = torch.randn(2, 1, 9, 8, generator=g)  # one key head shared by four query heads
    v = torch.randn(1, 1, 9, 5, generator=g)
    out = sb.flash_attention(q, k, v, block_size=4)
    assert out.shape == (2, 4, 6, 5)
    torch.testing.assert_close(
        out,
        F.scaled_dot_product_attention(q, k.expand(2, 4, 9, 8), v.expand(2, 4, 9, 5)),
    )
    q2, k2, v2 = _qkv(3, 4, batch=())
    torch.testing.assert_close(
        sb.flash_attention(q2, k2, v2), F.scaled_dot_product_attention(q2, k2, v2)
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_flash_attention_half_precision(dtype):
    q, k, v = _qkv(20, 30)
    out = sb.flash_attention(q.to(dtype), k.to(dtype), v.to(dtype), block_size=8)
    assert out.dtype == dtype
    exact = _sdpa64(q.to(dtype), k.to(dtype), v.to(dtype))
    baseline = F.scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype))
    # accumulating in float32: at least as close as torch's half-precision kernel
    assert (out.double() - exact).abs().max() <= 2 * (
        baseline.double() - exact
    ).abs().max()


def test_flash_attention_extreme_inputs():
    q, k, v = _qkv(5, 6, D=8)
    big = sb.flash_attention(q * 1e4, k, v, block_size=2)
    assert torch.isfinite(big).all()
    torch.testing.assert_close(
        big, sb.scaled_dot_product_attention(q * 1e4, k, v), atol=1e-4, rtol=1e-4
    )
    q_nan = q.clone()
    q_nan[0, 0, 1, 0] = float("nan")
    out = sb.flash_attention(q_nan, k, v, block_size=2)
    assert torch.isnan(out[0, 0, 1]).all() and not torch.isnan(out[0, 0, 0]).any()


def test_flash_attention_empty_dims():
    q, k, v = _qkv(0, 4)
    assert sb.flash_attention(q, k, v).shape == (2, 3, 0, 16)
    q, k, v = _qkv(3, 0)
    out, lse = sb.flash_attention(q, k, v, return_lse=True)
    assert torch.equal(out, torch.zeros(2, 3, 3, 16)) and torch.isneginf(lse).all()


@settings(max_examples=50, deadline=None)
@given(
    L=st.integers(1, 20),
    S=st.integers(1, 20),
    bq=st.integers(1, 9),
    bk=st.integers(1, 9),
    causal=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_flash_attention_any_tiling_gives_attention(L, S, bq, bk, causal, seed):
    q, k, v = _qkv(L, S, D=4, batch=(2,), dtype=torch.float64, seed=seed)
    torch.testing.assert_close(
        sb.flash_attention(q, k, v, is_causal=causal, block_size=(bq, bk)),
        _sdpa64(q, k, v, is_causal=causal),
    )


@settings(max_examples=50, deadline=None)
@given(
    L=st.integers(1, 20),
    S=st.integers(1, 20),
    bq=st.integers(1, 9),
    bk=st.integers(1, 9),
    heads=st.sampled_from([(4, 4), (4, 2), (4, 1)]),  # (Hq, Hkv): MHA, GQA, MQA
    seed=st.integers(0, 2**16),
)
def test_any_tiling_with_bottom_right_alignment_and_grouped_heads(
    L, S, bq, bk, heads, seed
):
    # Grouped heads are stacked as rows, so a tile of rows spans several query
    # positions and wraps around: the causal rule must hold row by row.
    g = torch.Generator().manual_seed(seed)
    hq, hkv = heads
    q = torch.randn(1, hq, L, 4, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, hkv, S, 4, generator=g, dtype=torch.float64) for _ in "kv")
    mask = sb.aligned_causal_mask(L, S, align="bottom_right")
    kr, vr = sb.repeat_kv_heads(k, hq // hkv), sb.repeat_kv_heads(v, hq // hkv)
    torch.testing.assert_close(
        sb.flash_attention(
            q, k, v, is_causal="bottom_right", enable_gqa=True, block_size=(bq, bk)
        ),
        sb.scaled_dot_product_attention(q, kr, vr, mask=mask),
    )


def test_flash_attention_steps_trace_the_running_state():
    q, k, v = _qkv(8, 8, D=4, batch=(), dtype=torch.float64)
    steps = list(sb.flash_attention_steps(q, k, v, block_size=4))
    assert [(s.q_start, s.k_start) for s in steps] == [(0, 0), (0, 4), (4, 0), (4, 4)]
    assert [s.last for s in steps] == [False, True, False, True]
    scores = q @ k.T / 2
    torch.testing.assert_close(steps[0].max, scores[:4, :4].amax(-1))
    torch.testing.assert_close(
        steps[1].max, scores[:4].amax(-1)
    )  # running max over both tiles
    torch.testing.assert_close(
        steps[1].sum, torch.exp(scores[:4] - scores[:4].amax(-1, keepdim=True)).sum(-1)
    )
    out = torch.cat([s.acc / s.sum[:, None] for s in steps if s.last])
    torch.testing.assert_close(out, sb.flash_attention(q, k, v))
    causal = list(sb.flash_attention_steps(q, k, v, is_causal=True, block_size=4))
    assert [(s.q_start, s.k_start) for s in causal] == [
        (0, 0),
        (4, 0),
        (4, 4),
    ]  # one tile skipped


def test_flash_attention_bad_input():
    q, k, v = _qkv(3, 4)
    with pytest.raises(TypeError, match="q must be a floating-point tensor"):
        sb.flash_attention(q.long(), k, v)
    with pytest.raises(TypeError, match="share a dtype"):
        sb.flash_attention(q, k.double(), v)
    with pytest.raises(ValueError, match="same last dimension"):
        sb.flash_attention(q, k[..., :3], v)
    with pytest.raises(ValueError, match="same length S"):
        sb.flash_attention(q, k, v[..., :2, :])
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        sb.flash_attention(q[0, 0, 0], k, v)
    with pytest.raises(ValueError, match="not both"):
        sb.flash_attention(
            q, k, v, mask=torch.ones(3, 4, dtype=torch.bool), is_causal=True
        )
    with pytest.raises(TypeError, match="boolean"):  # an integer mask: neither kind
        sb.flash_attention(q, k, v, mask=torch.ones(3, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="boolean"):  # a float mask of another dtype
        sb.flash_attention(q, k, v, mask=torch.ones(3, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="does not broadcast"):
        sb.flash_attention(q, k, v, mask=torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="scale must be a finite number > 0"):
        sb.flash_attention(q, k, v, scale=0.0)
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        sb.flash_attention(q, k, v, block_size=0)
    with pytest.raises(ValueError, match="block_size must be an int or a pair"):
        sb.flash_attention(q, k, v, block_size=(1, 2, 3))
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        sb.flash_attention(q, k, v, is_causal=1)
