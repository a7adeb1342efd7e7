"""Tests of softmaxbook.attention.decode: grouped-query heads, the causal alignment and
split-K decoding (and scaled_dot_product_attention's enable_gqa and is_causal names)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import softmaxbook as sb

# torch's SDPA takes enable_gqa from torch 2.5; the oldest torch this library supports
# is 2.2 (make test-oldest), where only the comparisons with torch are skipped: the
# comparisons with repeated heads run on every version.
TORCH_HAS_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")
needs_torch_gqa = pytest.mark.skipif(
    not TORCH_HAS_GQA, reason="torch's SDPA has enable_gqa from torch 2.5"
)


def _cache(B=2, hq=8, hkv=2, L=1, S=300, D=16, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, hq, L, D, generator=g, dtype=dtype)
    k = torch.randn(B, hkv, S, D, generator=g, dtype=dtype)
    v = torch.randn(B, hkv, S, D, generator=g, dtype=dtype)
    return q, k, v


# ---------------------------------------------------------------- grouped-query heads


def test_repeat_kv_heads_is_repeat_interleave():
    k = torch.arange(2 * 3 * 4.0).reshape(1, 2, 3, 4)
    out = sb.repeat_kv_heads(k, 3)
    assert out.shape == (1, 6, 3, 4)
    assert torch.equal(out[0, :3], k[0, :1].expand(3, 3, 4))  # heads 0-2 use head 0
    assert torch.equal(out, k.repeat_interleave(3, dim=-3))
    with pytest.raises(ValueError, match=r"x must be \(..., heads, length, dim\)"):
        sb.repeat_kv_heads(k[0, 0], 2)
    with pytest.raises(ValueError, match="groups must be >= 1"):
        sb.repeat_kv_heads(k, 0)


@needs_torch_gqa
@pytest.mark.parametrize("hkv", [1, 2, 8])
def test_sdpa_enable_gqa_matches_torch(hkv):
    q, k, v = _cache(hkv=hkv, L=5, S=9)
    mask = torch.rand(2, 8, 5, 9, generator=torch.Generator().manual_seed(1)) > 0.3
    for kw in ({}, {"is_causal": True}, {"mask": mask}):
        torch_kw = {"attn_mask": kw["mask"]} if "mask" in kw else kw
        torch.testing.assert_close(
            sb.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw),
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **torch_kw),
        )


def test_sdpa_gqa_bad_input():
    q, k, v = _cache(hq=6, hkv=4)
    with pytest.raises(ValueError, match="dividing the number of query heads"):
        sb.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    with pytest.raises(TypeError, match="enable_gqa must be a bool"):
        sb.scaled_dot_product_attention(q, k, v, enable_gqa="yes")
    with pytest.raises(ValueError, match="do not broadcast"):  # heads differ without it
        sb.scaled_dot_product_attention(q, k, v)


# ---------------------------------------------------------------- the causal alignment


@pytest.mark.filterwarnings("ignore:Lower right causal bias will produce NaNs")
@pytest.mark.parametrize("L,S", [(3, 5), (5, 3), (4, 4), (1, 7)])
def test_aligned_masks_match_torchs_causal_biases(L, S):
    # Imported here: torch.nn.attention.bias imports Triton, which must not happen
    # before tests/conftest.py chooses Triton's interpreter at collection.
    pytest.importorskip("torch.nn.attention.bias", reason="torch >= 2.3")
    from torch.nn.attention.bias import causal_lower_right, causal_upper_left

    top = sb.aligned_causal_mask(L, S, align="top_left")
    bottom = sb.aligned_causal_mask(L, S, align="bottom_right")
    assert torch.equal(top, causal_upper_left(L, S)._materialize())
    assert torch.equal(bottom, causal_lower_right(L, S)._materialize())
    assert torch.equal(top, sb.causal_mask(L, S))
    assert torch.equal(top, bottom) == (L == S)


def test_sdpa_bottom_right_is_causal_lower_right():
    pytest.importorskip("torch.nn.attention.bias", reason="torch >= 2.3")
    from torch.nn.attention.bias import causal_lower_right  # see above

    q, k, v = _cache(hkv=8, L=3, S=7)
    torch.testing.assert_close(
        sb.scaled_dot_product_attention(q, k, v, is_causal="bottom_right"),
        F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(3, 7)),
    )
    torch.testing.assert_close(
        sb.scaled_dot_product_attention(q, k, v, is_causal="top_left"),
        F.scaled_dot_product_attention(q, k, v, is_causal=True),
    )


def test_aligned_causal_mask_bad_input():
    with pytest.raises(ValueError, match="is_causal='diagonal' is unknown"):
        sb.aligned_causal_mask(2, 3, align="diagonal")
    with pytest.raises(TypeError, match="align must be a str"):
        sb.aligned_causal_mask(2, 3, align=True)
    with pytest.raises(ValueError, match="L must be >= 1"):
        sb.aligned_causal_mask(0, 3)
    with pytest.raises(ValueError, match="is_causal='lower_right' is unknown"):
        sb.scaled_dot_product_attention(*_cache(hkv=8), is_causal="lower_right")


# ---------------------------------------------------------------- split-K decoding


@pytest.mark.parametrize("splits", [1, 2, 7, 64, 1000])
def test_split_k_equals_attention_over_the_whole_cache(splits):
    q, k, v = _cache()
    out, lse = sb.split_k_attention(
        q, k, v, splits=splits, enable_gqa=True, return_lse=True
    )
    full, lse_full = sb.flash_attention(q, k, v, enable_gqa=True, return_lse=True)
    torch.testing.assert_close(out, full)
    torch.testing.assert_close(lse, lse_full)


def test_split_k_with_a_causal_block_of_new_queries_and_its_gradients():
    # Four new tokens appended to a cache of 296: bottom-right alignment, and each
    # chunk sees its keys' true positions.
    q, k, v = (t.requires_grad_() for t in _cache(L=4, S=300))
    out = sb.split_k_attention(
        q, k, v, splits=9, is_causal="bottom_right", enable_gqa=True
    )
    full = sb.flash_attention(q, k, v, is_causal="bottom_right", enable_gqa=True)
    torch.testing.assert_close(out, full)
    grad_out = torch.randn_like(out)
    ours = torch.autograd.grad(out, (q, k, v), grad_out)
    expected = torch.autograd.grad(full, (q, k, v), grad_out)
    for a, b in zip(ours, expected, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b)


def test_split_k_mask_float32_and_one_thread():
    q, k, v = _cache(L=2, S=100, dtype=torch.float32)
    mask = torch.rand(2, 1, 2, 100, generator=torch.Generator().manual_seed(0)) > 0.5
    mask[0, 0, 1] = False  # a query with nothing to attend
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the chunks then run one after another
    try:
        out = sb.split_k_attention(q, k, v, splits=5, mask=mask, enable_gqa=True)
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(
        out, sb.flash_attention(q, k, v, mask=mask, enable_gqa=True)
    )
    assert out.dtype == torch.float32 and torch.equal(out[0, :, 1], torch.zeros(8, 16))


def test_split_k_bad_input():
    q, k, v = _cache()
    with pytest.raises(ValueError, match="splits must be >= 1"):
        sb.split_k_attention(q, k, v, splits=0, enable_gqa=True)
    with pytest.raises(ValueError, match="not both"):
        sb.split_k_attention(
            q, k, v, splits=2, is_causal=True, enable_gqa=True,
            mask=torch.ones(1, 300, dtype=torch.bool),
        )  # fmt: skip
    with pytest.raises(ValueError, match="split_k_attention does not support dropout"):
        sb.split_k_attention(q, k, v, splits=2, enable_gqa=True, dropout_p=0.1)
    with pytest.raises(ValueError, match="dividing the number of query heads"):
        sb.split_k_attention(
            q, k[:, :1].expand(2, 3, 300, 16), v, splits=2, enable_gqa=True
        )


def test_split_k_bfloat16_error_is_flat_in_the_number_of_splits():
    # The partial outputs stay in float32 through the merges and are rounded to
    # bfloat16 once, at the end (as Flash-Decoding does): the error against exact
    # attention is one rounding of the output, whatever the number of splits.
    q, k, v = (
        t.bfloat16() for t in _cache(B=1, L=1, S=4096, D=64, dtype=torch.float32)
    )
    exact = sb.flash_attention(*(t.double() for t in (q, k, v)), enable_gqa=True)
    one_rounding = (exact.bfloat16().double() - exact).abs().max().item()
    errors = {}
    for splits in (1, 2, 512):
        out = sb.split_k_attention(q, k, v, splits=splits, enable_gqa=True)
        assert out.dtype == torch.bfloat16
        errors[splits] = (out.double() - exact).abs().max().item()
    assert errors[512] <= 1.5 * min(errors[1], errors[2]), errors
    assert max(errors.values()) <= 1.5 * one_rounding, (errors, one_rounding)
