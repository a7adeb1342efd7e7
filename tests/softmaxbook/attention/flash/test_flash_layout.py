"""The flat layout of flash_attention: grouped-query heads folded into rows,
learned sinks, the two causal alignments, and the memory a masked GQA call
takes."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import softmaxbook as sb
from random_inputs import qkv as _qkv
from softmaxbook.attention._args import resolve_attention
from softmaxbook.attention.flash import _layout, _tiles

# torch's SDPA takes enable_gqa from torch 2.5; the oldest torch this library supports
# is 2.2 (make test-oldest), where only the comparisons with torch are skipped: the
# comparisons with repeated heads run on every version.
TORCH_HAS_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")
needs_torch_gqa = pytest.mark.skipif(
    not TORCH_HAS_GQA, reason="torch's SDPA has enable_gqa from torch 2.5"
)


def _grads(fn, q, k, v, grad_out, **kw):
    """(dq, dk, dv) of ``sum(fn(q, k, v) * grad_out)``, in the inputs' dtype."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves, **kw)
    return torch.autograd.grad(out, leaves, grad_out.to(out.dtype))


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
    return _layout.prepare(q, k, v, args, block_size)


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
