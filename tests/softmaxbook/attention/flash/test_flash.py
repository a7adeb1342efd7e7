"""Tests of softmaxbook.attention.flash: flash_attention forward and backward, its
layout (grouped-query heads, learned sinks, the two causal alignments), and
flash_attention_backward and flash_attention_steps."""

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
from softmaxbook.attention import _tiles
from softmaxbook.attention._args import resolve_attention

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


# ---------------------------------------------------------------- the backward pass


def _grads(fn, q, k, v, grad_out, **kw):
    """(dq, dk, dv) of ``sum(fn(q, k, v) * grad_out)``, in the inputs' dtype."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves, **kw)
    return torch.autograd.grad(out, leaves, grad_out.to(out.dtype))


def _grad_errors(q, k, v, grad_out, block_size=(16, 32), **kw):
    """The forward's accuracy rule applied to the gradients: max error of ours and of
    torch's SDPA in the same dtype, both against torch's SDPA in float64."""
    exact = _grads(
        F.scaled_dot_product_attention,
        q.double(),
        k.double(),
        v.double(),
        grad_out,
        **kw,
    )
    ours = _grads(sb.flash_attention, q, k, v, grad_out, block_size=block_size, **kw)
    theirs = _grads(F.scaled_dot_product_attention, q, k, v, grad_out, **kw)
    return [
        ((a.double() - e).abs().max().item(), (b.double() - e).abs().max().item())
        for a, b, e in zip(ours, theirs, exact, strict=True)
    ]


@pytest.mark.parametrize("L,S", [(1, 1), (7, 13), (33, 5), (64, 64), (129, 257)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_gradients_error_at_most_twice_torch_float32(L, S, is_causal):
    q, k, v = _qkv(L, S)
    grad_out = torch.randn(
        q.shape[:-1] + (16,), generator=torch.Generator().manual_seed(1)
    )
    for ours, theirs in _grad_errors(q, k, v, grad_out, is_causal=is_causal):
        assert ours <= 2 * theirs + 1e-6, (ours, theirs)


def test_gradients_benchmark_shape_meet_the_rule():
    q, k, v = _qkv(512, 512, D=64, batch=(1, 4))
    grad_out = torch.randn_like(q)
    for ours, theirs in _grad_errors(q, k, v, grad_out, block_size=(128, 256)):
        assert ours <= 2 * theirs, (ours, theirs)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_gradients_accumulate_in_float32(dtype):
    q, k, v = (t.to(dtype) for t in _qkv(40, 56))
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(2)).to(
        dtype
    )
    ours = _grads(sb.flash_attention, q, k, v, grad_out, block_size=(16, 32))
    assert all(g.dtype == dtype for g in ours)
    for ours_err, theirs_err in _grad_errors(q, k, v, grad_out):
        assert ours_err <= 2 * theirs_err + 1e-6, (ours_err, theirs_err)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"is_causal": True},
        {"is_causal": "bottom_right"},
        {"scale": 0.7, "block_size": (2, 3)},
    ],
)
def test_gradcheck_float64(kw):
    q, k, v = (
        t.requires_grad_() for t in _qkv(5, 7, D=4, batch=(2,), dtype=torch.float64)
    )
    kw = {"block_size": (2, 3), **kw}
    assert torch.autograd.gradcheck(
        lambda a, b, c: sb.flash_attention(a, b, c, **kw), (q, k, v)
    )


def test_gradcheck_through_the_logsumexp_and_a_mask_with_an_empty_row():
    q, k, v = (
        t.requires_grad_() for t in _qkv(5, 7, D=4, batch=(2,), dtype=torch.float64)
    )
    mask = torch.tensor(
        [[True, False, True, True, False, False, True]] * 4 + [[False] * 7]
    )

    def both(a, b, c):
        out, lse = sb.flash_attention(
            a, b, c, mask=mask, block_size=(2, 3), return_lse=True
        )
        return out, lse.masked_fill(torch.isneginf(lse), 0.0)  # the empty row's lse

    assert torch.autograd.gradcheck(both, (q, k, v))


def test_fully_masked_rows_get_zero_gradients_without_nan():
    q, k, v = (t.requires_grad_() for t in _qkv(6, 9, dtype=torch.float64))
    mask = torch.rand(2, 1, 6, 9, generator=torch.Generator().manual_seed(0)) > 0.3
    mask[:, :, 2] = False  # query 2 sees nothing
    mask[1, :, :, 4] = False  # key 4 is seen by no query of batch 1
    out = sb.flash_attention(q, k, v, mask=mask, block_size=(4, 4))
    out.backward(torch.randn_like(out))
    for g in (q.grad, k.grad, v.grad):
        assert torch.isfinite(g).all()
    assert torch.equal(q.grad[:, :, 2], torch.zeros_like(q.grad[:, :, 2]))
    assert torch.equal(k.grad[1, :, 4], torch.zeros_like(k.grad[1, :, 4]))
    assert torch.equal(v.grad[1, :, 4], torch.zeros_like(v.grad[1, :, 4]))


def test_the_backward_saves_no_weights():
    # Saved for the backward pass: q, k, v, the output and the logsumexp, nothing of
    # size L x S. Autograd through the tile loop would save every tile.
    q, k, v = (t.requires_grad_() for t in _qkv(300, 400, D=8, batch=(1, 2)))
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = sb.flash_attention(q, k, v, is_causal=True, block_size=(64, 64))
    inputs = sum(t.numel() for t in (q, k, v, out)) + out.shape[:-1].numel()  # + lse
    assert max(saved) < 300 * 400 and sum(saved) <= inputs, saved


def test_few_heads_split_the_keys_between_workers():
    # One head and two threads: the workers share the key blocks and sum their dq.
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        q, k, v = _qkv(64, 200, batch=(1,), dtype=torch.float64)
        grad_out = torch.randn(1, 64, 16, dtype=torch.float64)
        ours = _grads(sb.flash_attention, q, k, v, grad_out, block_size=(16, 32))
    finally:
        torch.set_num_threads(threads)
    exact = _grads(F.scaled_dot_product_attention, q, k, v, grad_out)
    for a, b in zip(ours, exact, strict=True):
        torch.testing.assert_close(a, b)


def test_flash_attention_backward_is_what_autograd_runs():
    q, k, v = _qkv(20, 30, Dv=8, dtype=torch.float64)
    gen = torch.Generator().manual_seed(3)
    grad_out = torch.randn(2, 3, 20, 8, generator=gen, dtype=torch.float64)
    grad_lse = torch.randn(2, 3, 20, generator=gen, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = sb.flash_attention(*leaves, is_causal="bottom_right", return_lse=True)
    expected = torch.autograd.grad(
        (out * grad_out).sum() + (lse * grad_lse).sum(), leaves
    )
    got = sb.flash_attention_backward(
        q,
        k,
        v,
        out.detach(),
        lse.detach(),
        grad_out,
        is_causal="bottom_right",
        grad_lse=grad_lse,
        block_size=(8, 8),
    )
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b)


def test_flash_attention_backward_of_one_key_block_is_its_share():
    # With the merged lse and output, each key block's call gives its own dk, dv and
    # its share of dq: ring attention's backward relies on this.
    q, k, v = _qkv(10, 24, dtype=torch.float64)
    grad_out = torch.randn(2, 3, 10, 16, dtype=torch.float64)
    out, lse = sb.flash_attention(q, k, v, return_lse=True)
    full = sb.flash_attention_backward(q, k, v, out, lse, grad_out)
    parts = [
        sb.flash_attention_backward(
            q, k[..., a:b, :], v[..., a:b, :], out, lse, grad_out
        )
        for a, b in [(0, 5), (5, 24)]
    ]
    torch.testing.assert_close(parts[0][0] + parts[1][0], full[0])
    torch.testing.assert_close(torch.cat([parts[0][1], parts[1][1]], -2), full[1])
    torch.testing.assert_close(torch.cat([parts[0][2], parts[1][2]], -2), full[2])


def test_flash_attention_backward_bad_input():
    q, k, v = _qkv(4, 5)
    out, lse = sb.flash_attention(q, k, v, return_lse=True)
    with pytest.raises(
        ValueError, match=r"grad_output must have shape \(2, 3, 4, 16\)"
    ):
        sb.flash_attention_backward(q, k, v, out, lse, out[..., :3, :])
    with pytest.raises(ValueError, match=r"lse must have shape \(2, 3, 4\)"):
        sb.flash_attention_backward(q, k, v, out, lse[..., 0], out)
    with pytest.raises(TypeError, match="out must be a floating-point tensor"):
        sb.flash_attention_backward(q, k, v, out.long(), lse, out)


def test_vmap_over_the_function_and_its_gradient():
    q, k, v = _qkv(6, 8, batch=(4, 2), dtype=torch.float64)
    batched = torch.func.vmap(lambda a, b, c: sb.flash_attention(a, b, c, block_size=4))
    torch.testing.assert_close(batched(q, k, v), sb.flash_attention(q, k, v))
    shared_k = torch.func.vmap(
        lambda a: sb.flash_attention(a, k[0], v[0], is_causal=True), in_dims=0
    )
    torch.testing.assert_close(
        shared_k(q), sb.flash_attention(q, k[0], v[0], is_causal=True)
    )

    def loss(a):
        return sb.flash_attention(a, k[0], v[0]).square().sum()

    per_sample = torch.func.vmap(torch.func.grad(loss))(q)
    expected = torch.stack([torch.autograd.functional.jacobian(loss, qi) for qi in q])
    torch.testing.assert_close(per_sample, expected)


# ---------------------------------------------------------------- grouped-query heads


@pytest.mark.parametrize("hkv", [1, 2, 4])
@pytest.mark.parametrize("is_causal", [False, "bottom_right"])
def test_gqa_equals_attention_on_repeated_heads(hkv, is_causal):
    g = torch.Generator().manual_seed(hkv)
    q = torch.randn(2, 4, 9, 8, generator=g, dtype=torch.float64)
    k, v = (
        torch.randn(2, hkv, 13, 8, generator=g, dtype=torch.float64) for _ in range(2)
    )
    grad_out = torch.randn(2, 4, 9, 8, generator=g, dtype=torch.float64)
    kr, vr = sb.repeat_kv_heads(k, 4 // hkv), sb.repeat_kv_heads(v, 4 // hkv)
    kw = {"is_causal": is_causal, "block_size": (4, 5)}
    torch.testing.assert_close(
        sb.flash_attention(q, k, v, enable_gqa=True, **kw),
        sb.flash_attention(q, kr, vr, **kw),
    )
    ours = _grads(
        lambda *a, **kw: sb.flash_attention(*a, enable_gqa=True, **kw),
        q,
        k,
        v,
        grad_out,
        **kw,
    )
    expanded = [t.clone().requires_grad_() for t in (q, kr, vr)]
    plain = torch.autograd.grad(sb.flash_attention(*expanded, **kw), expanded, grad_out)
    torch.testing.assert_close(ours[0], plain[0])
    # a shared head's gradient is the sum over the query heads that use it
    torch.testing.assert_close(ours[1], plain[1].unflatten(1, (hkv, -1)).sum(2))
    torch.testing.assert_close(ours[2], plain[2].unflatten(1, (hkv, -1)).sum(2))


@needs_torch_gqa
def test_gqa_matches_torch_enable_gqa_with_a_mask():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 6, 7, 8, generator=g)
    k, v = (torch.randn(2, 3, 11, 8, generator=g) for _ in range(2))
    mask = torch.rand(2, 6, 7, 11, generator=g) > 0.4
    torch.testing.assert_close(
        sb.flash_attention(q, k, v, mask=mask, enable_gqa=True),
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True),
    )


def test_gqa_bad_input():
    q, k, v = torch.randn(1, 6, 4, 8), torch.randn(1, 4, 5, 8), torch.randn(1, 4, 5, 8)
    with pytest.raises(ValueError, match="dividing the number of query heads"):
        sb.flash_attention(q, k, v, enable_gqa=True)
    with pytest.raises(ValueError, match="needs k with a head dimension"):
        sb.flash_attention(q, k[0, 0], v, enable_gqa=True)
    with pytest.raises(TypeError, match="enable_gqa must be a bool"):
        sb.flash_attention(q, k, v, enable_gqa=1)
    with pytest.raises(ValueError, match="does not broadcast"):
        mask = torch.ones(4, 4, dtype=torch.bool)
        sb.flash_attention(q, k[:, :3], v[:, :3], mask=mask, enable_gqa=True)


def _prepared(q, k, v, block_size=64, **options):
    """The flat layout of the tile loops for a call with these options."""
    args = resolve_attention(q, k, v, **options)
    return sb.attention.flash._prepare(q, k, v, args, block_size)


def test_shared_key_heads_are_folded_into_rows():
    # Heads that share a key head are stacked as rows of one problem: the keys are
    # not copied once per query head.
    q = torch.randn(2, 8, 5, 4)
    k = v = torch.randn(2, 2, 7, 4)
    call = _prepared(q, k, v, is_causal=True, enable_gqa=True)
    assert call.layout.fold and call.problem.q.shape == (4, 20, 4)
    assert call.problem.k.shape == (4, 7, 4)
    assert call.problem.k.data_ptr() == k.data_ptr()  # a view of the cache
    assert call.problem.causal == _tiles.Causal(5, 0)


# ---------------------------------------------------------------- learned sinks


def _sink_reference(q, k, v, sinks, mask=None):
    """The sink as one more score, its weight dropped (the semantics in the brief of
    ``sinks``): ``cat([scores, sink]).softmax(-1)[..., :-1] @ v``."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    sink = sinks.expand(scores.shape[:-2])[..., None, None].expand(
        scores.shape[:-1] + (1,)
    )
    return torch.cat([scores, sink], -1).softmax(-1)[..., :-1] @ v


def test_sinks_match_the_concatenated_softmax_forward_and_backward():
    q, k, v = (t.requires_grad_() for t in _qkv(9, 14, dtype=torch.float64))
    sinks = torch.tensor([0.5, -1.0, 3.0], dtype=torch.float64, requires_grad=True)
    mask = torch.rand(2, 1, 9, 14, generator=torch.Generator().manual_seed(0)) > 0.3
    mask[0, 0, 4] = False
    out = sb.flash_attention(q, k, v, mask=mask, sinks=sinks, block_size=(4, 4))
    expected = _sink_reference(q, k, v, sinks, mask)
    torch.testing.assert_close(out, expected)
    assert torch.equal(out[0, :, 4], torch.zeros_like(out[0, :, 4]))  # empty row: zeros
    grad_out = torch.randn_like(out)
    ours = torch.autograd.grad(out, (q, k, v, sinks), grad_out)
    theirs = torch.autograd.grad(expected, (q, k, v, sinks), grad_out)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b)


def test_sinks_gradcheck_with_gqa_and_causal():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (
        torch.randn(1, 2, 6, 3, generator=g, dtype=torch.float64).requires_grad_()
        for _ in range(2)
    )
    sinks = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b, c, s: sb.flash_attention(
            a, b, c, sinks=s, enable_gqa=True, is_causal=True, block_size=(3, 2)
        ),
        (q, k, v, sinks),
    )


def test_sinks_lower_the_weight_on_the_keys_and_enter_the_lse():
    q, k, v = _qkv(4, 6, dtype=torch.float64)
    sinks = torch.zeros(3, dtype=torch.float64)
    _, lse = sb.flash_attention(q, k, v, return_lse=True)
    _, lse_s = sb.flash_attention(q, k, v, sinks=sinks, return_lse=True)
    torch.testing.assert_close(lse_s, torch.logaddexp(lse, torch.zeros_like(lse)))
    ones = torch.ones_like(v)  # a row's output is then its total weight on the keys
    mass = sb.flash_attention(q, k, ones, sinks=sinks)[..., 0]
    torch.testing.assert_close(mass, torch.sigmoid(lse))  # e^lse / (e^lse + e^0)


def test_sinks_bad_input():
    q, k, v = _qkv(4, 6)
    with pytest.raises(ValueError, match=r"sinks of shape \(4,\) must broadcast"):
        sb.flash_attention(q, k, v, sinks=torch.zeros(4))
    with pytest.raises(TypeError, match="sinks must be a floating-point tensor"):
        sb.flash_attention(q, k, v, sinks=torch.zeros(3, dtype=torch.long))


# ---------------------------------------------------------------- the causal alignment


def test_bottom_right_alignment_is_flash_attns():
    # Query i of L attends to keys j <= i + S - L: the last query sees every key.
    q, k, v = _qkv(3, 8, dtype=torch.float64)
    mask = torch.ones(3, 8, dtype=torch.bool).tril(8 - 3)
    torch.testing.assert_close(
        sb.flash_attention(q, k, v, is_causal="bottom_right", block_size=2),
        sb.flash_attention(q, k, v, mask=mask),
    )
    torch.testing.assert_close(  # equal lengths: both alignments agree
        sb.flash_attention(q, q, v[..., :3, :], is_causal="bottom_right"),
        sb.flash_attention(q, q, v[..., :3, :], is_causal=True),
    )


def test_the_porting_bug_one_new_token_with_top_left_alignment():
    # Decoding one token against 8 cached keys: top-left alignment lets it see only
    # key 0, bottom-right lets it see them all.
    q, k, v = _qkv(1, 8, dtype=torch.float64)
    top_left = sb.flash_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(top_left, v[..., :1, :])  # the weight on key 0 is 1
    torch.testing.assert_close(
        sb.flash_attention(q, k, v, is_causal="bottom_right"),
        sb.flash_attention(q, k, v),
    )


def test_bottom_right_with_more_queries_than_keys_gives_empty_rows():
    q, k, v = (t.requires_grad_() for t in _qkv(6, 4, dtype=torch.float64))
    out, lse = sb.flash_attention(q, k, v, is_causal="bottom_right", return_lse=True)
    assert torch.equal(out[..., :2, :], torch.zeros_like(out[..., :2, :]))
    assert torch.isneginf(lse[..., :2]).all() and torch.isfinite(lse[..., 2:]).all()
    out.sum().backward()
    assert torch.equal(q.grad[..., :2, :], torch.zeros_like(q.grad[..., :2, :]))


def test_unknown_alignment_is_refused():
    q, k, v = _qkv(2, 3)
    with pytest.raises(ValueError, match="is_causal='bottom_left' is unknown"):
        sb.flash_attention(q, k, v, is_causal="bottom_left")


def _largest_allocation(fn) -> int:
    """The most bytes one CPU operator allocated while ``fn`` ran (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max(
        (e.self_cpu_memory_usage for e in prof.events() if e.self_cpu_memory_usage > 0),
        default=0,
    )


def test_gqa_with_a_mask_does_not_repeat_the_keys_and_values():
    # Grouped-query attention with a mask: the query heads that share a key head are
    # stacked as rows, with the mask's rows, so each key and value head is read where
    # it lies, never copied once per query head into a (B, Hq, S, D) tensor.
    g = torch.Generator().manual_seed(0)
    B, hq, hkv, L, S, D = 1, 8, 2, 4, 2048, 64
    q = torch.randn(B, hq, L, D, generator=g)
    k, v = (torch.randn(B, hkv, S, D, generator=g) for _ in range(2))
    mask = torch.rand(B, hq, L, S, generator=g) > 0.2
    call = _prepared(q, k, v, mask=mask, enable_gqa=True)
    assert call.problem.k.shape == (B * hkv, S, D)
    assert call.problem.k.data_ptr() == k.data_ptr()  # a view of the cache
    assert call.problem.v.data_ptr() == v.data_ptr()
    repeated = B * hq * S * D * k.element_size()  # one repeated copy of k or v
    flash = _largest_allocation(
        lambda: sb.flash_attention(q, k, v, mask=mask, enable_gqa=True)
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # split-K's chunks then run here, where the profiler is
    try:
        split_k = _largest_allocation(
            lambda: sb.split_k_attention(q, k, v, splits=4, mask=mask, enable_gqa=True)
        )
    finally:
        torch.set_num_threads(threads)
    # A tile of scores or the output is all that may be allocated at once: far less
    # than a repeated copy of the keys (or of a split's quarter of them).
    assert flash < repeated / 16 and split_k < repeated / 16, (flash, split_k)
    torch.testing.assert_close(
        sb.flash_attention(q, k, v, mask=mask, enable_gqa=True),
        sb.flash_attention(
            q, sb.repeat_kv_heads(k, 4), sb.repeat_kv_heads(v, 4), mask=mask
        ),
    )


# ---------------------------------------------------------------- the autograd Function


def _leaves(*shapes, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, dtype=dtype).requires_grad_() for s in shapes]


@pytest.mark.parametrize("explicit", [False, True])
def test_the_output_grad_fn_is_the_flash_attention_node(explicit):
    q, k, v = _leaves((2, 3, 9, 4), (2, 3, 11, 4), (2, 3, 11, 4), dtype=torch.float32)
    out, lse = sb.FlashAttention.apply(
        q, k, v, True, explicit=explicit, return_lse=True
    )
    assert type(out.grad_fn).__name__ == "FlashAttentionBackward"
    assert isinstance(out.grad_fn, sb.FlashAttention._backward_cls)
    assert lse.grad_fn is out.grad_fn  # one node, two outputs
    assert not out._is_view()  # no view or wrapper op between the node and out
    out = sb.flash_attention(q, k, v, is_causal=True, explicit=explicit)
    assert type(out.grad_fn).__name__ == "FlashAttentionBackward"


@pytest.mark.parametrize("explicit", [False, True])
def test_the_node_saves_exactly_q_k_v_out_and_the_logsumexp(explicit):
    q, k, v = _leaves((2, 3, 9, 4), (2, 3, 11, 4), (2, 3, 11, 5), dtype=torch.float32)
    out, lse = sb.FlashAttention.apply(q, k, v, explicit=explicit, return_lse=True)
    saved = out.grad_fn.saved_tensors
    assert len(saved) == 5
    assert saved[0] is q and saved[1] is k and saved[2] is v  # the inputs themselves
    for got, want in zip(saved[3:], (out, lse), strict=True):  # the outputs' storage
        assert got.shape == want.shape and got.data_ptr() == want.data_ptr()
    assert lse.shape == (2, 3, 9) and lse.dtype == torch.float32
    scores = (q @ k.transpose(-2, -1)) / 2.0
    torch.testing.assert_close(lse, scores.logsumexp(-1))
    # A mask is saved as a sixth tensor, the sinks last; nothing of size L x S else.
    mask = torch.rand(9, 11, generator=torch.Generator().manual_seed(1)) > 0.3
    sinks = torch.zeros(3, requires_grad=True)
    out = sb.FlashAttention.apply(q, k, v, mask=mask, sinks=sinks, explicit=explicit)
    saved = out.grad_fn.saved_tensors
    assert len(saved) == 7 and saved[5] is mask and saved[6] is sinks
    # On the fused path (Dv = D) a boolean mask is saved as the float mask torch's
    # kernel adds.
    mask[:, 0] = True
    out = sb.FlashAttention.apply(q, k, v[..., :4], mask=mask, explicit=explicit)
    saved = out.grad_fn.saved_tensors
    assert len(saved) == 6
    if explicit:
        assert saved[5] is mask
    else:
        additive = torch.zeros(9, 11).masked_fill(~mask, float("-inf"))
        assert saved[5].dtype == torch.float32 and torch.equal(saved[5], additive)


def test_a_course_style_flashattention2_check():
    # The check of a course that implements FlashAttention-2 as an autograd Function
    # (q, k, v of shape (batch, n, d)): the node keeps exactly one tensor with one
    # value per query row, the logsumexp, and the gradients match autograd.
    B, Nq, Nk, D = 4, 128, 128, 64
    q, k, v = _leaves((B, Nq, D), (B, Nk, D), (B, Nk, D), dtype=torch.float32)
    do = torch.randn(B, Nq, D, generator=torch.Generator().manual_seed(2))
    for is_causal in (False, True):
        o = sb.FlashAttention.apply(q, k, v, is_causal)
        maybe_ls = [t for t in o.grad_fn.saved_tensors if t.shape == (B, Nq)]
        assert len(maybe_ls) == 1
        scores = q @ k.transpose(-2, -1) / math.sqrt(D)
        if is_causal:
            scores = scores.masked_fill(~sb.causal_mask(Nq, Nk), float("-inf"))
        torch.testing.assert_close(o, torch.softmax(scores, -1) @ v)
        torch.testing.assert_close(maybe_ls[0], scores.logsumexp(-1))
        got = torch.autograd.grad(o, (q, k, v), do)
        want = torch.autograd.grad(torch.softmax(scores, -1) @ v, (q, k, v), do)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"is_causal": True},
        {"is_causal": "bottom_right"},
        {"mask": "bool"},
        {"mask": "float"},
        {"enable_gqa": True},
        {"sinks": True},
    ],
)
@pytest.mark.parametrize("explicit", [False, True])
def test_gradcheck_of_the_function_float64(options, explicit):
    q, k, v = _leaves((1, 4, 5, 3), (1, 2, 7, 3), (1, 2, 7, 3))
    if not options.get("enable_gqa"):
        k, v = (t.detach().repeat_interleave(2, 1).requires_grad_() for t in (k, v))
    inputs = [q, k, v]
    kw = dict(options)
    g = torch.Generator().manual_seed(3)
    if kw.get("mask") == "bool":
        kw["mask"] = torch.rand(5, 7, generator=g) > 0.4
        kw["mask"][:, 0] = True
    elif kw.get("mask") == "float":
        kw["mask"] = torch.randn(5, 7, generator=g, dtype=torch.float64)
        kw["mask"][1, 2:] = float("-inf")
    if kw.pop("sinks", False):
        inputs.append(torch.randn(4, generator=g, dtype=torch.float64))
        inputs[-1].requires_grad_()

    def f(q, k, v, *sinks):
        return sb.FlashAttention.apply(
            q, k, v, explicit=explicit, sinks=sinks[0] if sinks else None, **kw
        )

    assert torch.autograd.gradcheck(f, inputs)


@pytest.mark.parametrize(
    "options",
    [{}, {"is_causal": True}, {"mask": "bool"}, {"mask": "float"}, {"gqa": True}],
)
@pytest.mark.parametrize("shape", [(2, 3, 37), (37,), (3, 37)])
def test_the_fused_path_equals_the_tile_loops(options, shape):
    # torch's CPU kernel (the fused path) and the library's tile loops give the same
    # output, logsumexp and gradients within float32 rounding.
    q, k, v = _leaves(
        (*shape[:-1], 37, 8), (*shape[:-1], 45, 8), (*shape[:-1], 45, 8),
        dtype=torch.float32,
    )  # fmt: skip
    kw = {k_: v_ for k_, v_ in options.items() if k_ != "gqa"}
    g = torch.Generator().manual_seed(4)
    if kw.get("mask") == "bool":
        kw["mask"] = torch.rand(37, 45, generator=g) > 0.5
        kw["mask"][:, -1] = True
    elif kw.get("mask") == "float":
        kw["mask"] = torch.randn(37, 45, generator=g)
    if options.get("gqa"):
        if len(shape) < 3:
            pytest.skip("grouped heads need a heads dimension")
        q = torch.randn(2, 6, 37, 8, generator=g).requires_grad_()
        kw["enable_gqa"] = True
    assert sb.explain_dispatch("flash_attention", q, k, v, **kw).path == "fused"
    do = torch.randn(q.shape[:-1] + (8,), generator=g)
    results = []
    for explicit in (False, True):
        out, lse = sb.flash_attention(q, k, v, explicit=explicit, return_lse=True, **kw)
        results.append((out, lse, *torch.autograd.grad(out, (q, k, v), do)))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


def test_float_masks_and_torchs_keyword_names_give_torchs_result():
    q, k, v = _qkv(6, 9)
    g = torch.Generator().manual_seed(5)
    bias = torch.randn(2, 1, 6, 9, generator=g)
    bias[0, 0, :, 4:] = float("-inf")
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    for kw in ({}, {"explicit": True}, {"block_size": (4, 4)}):
        got = sb.flash_attention(q, k, v, attn_mask=bias, **kw)
        torch.testing.assert_close(got, want)
    keep = torch.rand(6, 9, generator=g) > 0.3
    keep[:, 0] = True
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    torch.testing.assert_close(sb.flash_attention(q, k, v, attn_mask=keep), want)
    # A fully -inf row of a float mask gives zeros, forward and backward.
    bias[1, 0, 2] = float("-inf")
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = sb.flash_attention(*leaves, mask=bias, return_lse=True)
    assert (out[1, :, 2] == 0).all() and torch.isneginf(lse[1, :, 2]).all()
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in leaves)
    assert (leaves[0].grad[1, :, 2] == 0).all()


@pytest.mark.parametrize("options", [{}, {"is_causal": True}, {"mask": True}])
def test_dropout_is_torchs(options):
    q, k, v = _qkv(6, 9)
    kw = dict(options)
    if kw.get("mask"):
        kw = {"attn_mask": torch.rand(6, 9, generator=torch.Generator()) > 0.3}
        kw["attn_mask"][:, 0] = True
    assert sb.explain_dispatch(
        "flash_attention", q, k, v, dropout_p=0.3, **kw
    ).path == ("dropout")
    torch.manual_seed(7)
    want = F.scaled_dot_product_attention(q, k, v, dropout_p=0.3, **kw)
    torch.manual_seed(7)
    got = sb.flash_attention(q, k, v, dropout_p=0.3, **kw)
    torch.testing.assert_close(got, want)
    assert (got != sb.flash_attention(q, k, v, **kw)).any()  # something was dropped


def test_explain_dispatch_says_which_path_a_call_takes():
    q, k, v = _qkv(6, 9)

    def path(*tensors, **kw):
        return sb.explain_dispatch("flash_attention", *tensors, **kw).path

    assert path(q, k, v) == "fused"
    assert path(q, k, v, is_causal=True) == "fused"
    assert path(q, k, v, block_size=4) == "torch"
    assert path(q, k, v, explicit=True) == "torch"
    assert path(q.bfloat16(), k.bfloat16(), v.bfloat16()) == "torch"
    assert path(q, k, v, sinks=torch.zeros(3)) == "torch"
    assert path(q, k, v, is_causal="bottom_right") == "torch"
    assert path(q, k[:1], v[:1]) == "torch"  # a broadcast batch
    assert path(q, k, v[..., :5]) == "torch"  # Dv != D
    empty = torch.ones(6, 9, dtype=torch.bool)
    empty[2] = False
    assert path(q, k, v, mask=empty) == "torch"
    k_nan = k.clone()
    k_nan[0, 0, 3, 0] = float("nan")
    assert path(q, k_nan, v, mask=empty | True) == "torch"
    decision = sb.explain_dispatch("flash_attention", q, k, v, explicit=True)
    assert "forces the library's tile loops" in decision.reason
    with pytest.raises(ValueError, match="not both"):
        path(q, k, v, mask=empty, is_causal=True)
    # the call follows the explanation: the tile loops run only when it says torch
    for kw, tiles in (({}, False), ({"block_size": 4}, True), ({"mask": empty}, True)):
        calls = []
        real = _tiles.forward

        def spy(p, calls=calls, real=real):
            calls.append(1)
            return real(p)

        _tiles.forward = spy
        try:
            sb.flash_attention(q, k, v, **kw)
        finally:
            _tiles.forward = real
        assert bool(calls) == tiles


def test_a_masked_nan_key_never_reaches_the_output():
    # torch's kernel adds the mask, so a nan at a masked key would leak: such a call
    # takes the tile loops, which remove the key.
    q, k, v = _qkv(6, 9)
    k = k.clone()
    k[0, 0, 3, 0] = float("nan")
    keep = torch.ones(6, 9, dtype=torch.bool)
    keep[:, 3] = False
    out = sb.flash_attention(q, k, v, mask=keep)
    assert torch.isfinite(out).all()


def test_vmap_and_jacrev_over_the_function():
    q, k, v = (t.detach() for t in _leaves((3, 5, 4), (3, 7, 4), (3, 7, 4)))

    def f(q, k, v):
        return sb.FlashAttention.apply(q, k, v, True)

    torch.testing.assert_close(torch.func.vmap(f)(q, k, v), f(q, k, v))
    jac = torch.func.jacrev(f)(q[0], k[0], v[0])
    ref = torch.func.jacrev(
        lambda q: F.scaled_dot_product_attention(q, k[0], v[0], is_causal=True)
    )(q[0])
    torch.testing.assert_close(jac, ref)
    # per-sample gradients: vmap of grad
    grads = torch.func.vmap(torch.func.grad(lambda q, k, v: f(q, k, v).sum()))(q, k, v)
    for i in range(3):
        leaf = q[i].clone().requires_grad_()
        (want,) = torch.autograd.grad(f(leaf, k[i], v[i]).sum(), leaf)
        torch.testing.assert_close(grads[i], want)


def test_grad_out_is_a_deprecated_spelling_of_grad_output():
    q, k, v = _qkv(4, 5)
    out, lse = sb.flash_attention(q, k, v, return_lse=True)
    new = sb.flash_attention_backward(q, k, v, out, lse, grad_output=out)
    with pytest.warns(DeprecationWarning, match="grad_output"):
        old = sb.flash_attention_backward(q, k, v, out, lse, grad_out=out)
    for a, b in zip(new, old, strict=True):
        torch.testing.assert_close(a, b)


def test_without_torchs_cpu_operator_every_call_takes_the_tile_loops(monkeypatch):
    # An older or newer torch without aten::_scaled_dot_product_flash_attention_for_cpu
    # loses only the fused path.
    monkeypatch.setattr(sb.attention.flash, "_FUSED_FORWARD", None)
    q, k, v = _qkv(6, 9)
    decision = sb.explain_dispatch("flash_attention", q, k, v)
    assert (
        decision.path == "torch" and "no CPU FlashAttention operator" in decision.reason
    )
    torch.testing.assert_close(
        sb.flash_attention(q, k, v), F.scaled_dot_product_attention(q, k, v)
    )


@pytest.mark.parametrize(
    "shape", [(5, 7), (7,), (1, 5, 7), (3, 5, 7), (3, 1, 7), (2, 1, 1, 7), (2, 3, 5, 7)]
)
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_every_mask_shape_that_broadcasts_gives_torchs_result(shape, kind):
    g = torch.Generator().manual_seed(8)
    q = torch.randn(2, 3, 5, 4, generator=g)
    k, v = (torch.randn(2, 3, 7, 4, generator=g) for _ in range(2))
    mask = torch.rand(*shape, generator=g) > 0.3
    mask[..., 0] = True
    if kind == "float":
        mask = torch.randn(*shape, generator=g)
    assert sb.explain_dispatch("flash_attention", q, k, v, mask=mask).path == "fused"
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ours = sb.flash_attention(*leaves, mask=mask)
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    theirs = mask if mask.dim() >= 2 else mask.expand(5, 7)  # torch wants 2 dims
    want = F.scaled_dot_product_attention(*ref, attn_mask=theirs)
    torch.testing.assert_close(ours, want)
    for a, b in zip(
        torch.autograd.grad(ours.sum(), leaves),
        torch.autograd.grad(want.sum(), ref),
        strict=True,
    ):
        torch.testing.assert_close(a, b)
    q3, k3, v3 = q[0], k[0], v[0]  # 3-D inputs: the mask gains a heads dimension
    if len(shape) <= 3:
        torch.testing.assert_close(
            sb.flash_attention(q3, k3, v3, mask=mask),
            F.scaled_dot_product_attention(q3, k3, v3, attn_mask=theirs),
        )
