"""Tests of softmaxbook.attention.online: online_softmax and merge_attention_states."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import softmaxbook as sb
from random_inputs import qkv as _qkv
from softmaxbook import reference

# ---------------------------------------------------------------- online_softmax


@pytest.mark.parametrize("block_size", [1, 3, 128])
def test_online_softmax_matches_reference_and_torch(block_size):
    x = torch.randn(4, 37, dtype=torch.float64)
    out = sb.online_softmax(x, block_size=block_size)
    np.testing.assert_allclose(
        out.numpy(), reference.softmax(x.numpy()), rtol=1e-12, atol=1e-15
    )
    torch.testing.assert_close(out, torch.softmax(x, -1))


def test_online_softmax_dim_and_fully_masked_rows():
    x = torch.randn(5, 6, 7)
    torch.testing.assert_close(
        sb.online_softmax(x, dim=1, block_size=2), torch.softmax(x, 1)
    )
    x = torch.full((2, 5), float("-inf"))
    x[1, 2] = 0.0
    out = sb.online_softmax(x, block_size=2)
    assert torch.equal(out[0], torch.zeros(5)) and out[1, 2] == 1


# ----------------------------------------------------------------
# merge_attention_states


@pytest.mark.parametrize("split", [1, 5, 8])
def test_merge_of_two_key_halves_is_attention_over_all_keys(split):
    q, k, v = _qkv(6, 9, dtype=torch.float64)
    out_a, lse_a = sb.flash_attention(
        q, k[..., :split, :], v[..., :split, :], return_lse=True
    )
    out_b, lse_b = sb.flash_attention(
        q, k[..., split:, :], v[..., split:, :], return_lse=True
    )
    out, lse = sb.merge_attention_states(out_a, lse_a, out_b, lse_b)
    full, lse_full = sb.flash_attention(q, k, v, return_lse=True)
    torch.testing.assert_close(out, full)
    torch.testing.assert_close(lse, lse_full)
    # symmetric
    out2, _lse2 = sb.merge_attention_states(out_b, lse_b, out_a, lse_a)
    torch.testing.assert_close(out2, out)


def test_merge_with_empty_parts():
    q, k, v = _qkv(4, 5)
    mask = torch.zeros(4, 5, dtype=torch.bool)
    empty, lse_empty = sb.flash_attention(q, k, v, mask=mask, return_lse=True)
    out, lse = sb.flash_attention(q, k, v, return_lse=True)
    merged, lse_m = sb.merge_attention_states(empty, lse_empty, out, lse)
    torch.testing.assert_close(merged, out)
    torch.testing.assert_close(lse_m, lse)
    both, lse_both = sb.merge_attention_states(empty, lse_empty, empty, lse_empty)
    assert torch.equal(both, torch.zeros_like(both)) and torch.isneginf(lse_both).all()


def test_merge_is_stable_for_large_lse():
    out_a, out_b = torch.ones(1, 2, 3), torch.zeros(1, 2, 3)
    lse_a, lse_b = torch.tensor([[1e4, -1e4]]), torch.tensor([[1e4, 0.0]])
    out, lse = sb.merge_attention_states(out_a, lse_a, out_b, lse_b)
    torch.testing.assert_close(out[0, 0], torch.full((3,), 0.5))
    torch.testing.assert_close(out[0, 1], torch.zeros(3))
    torch.testing.assert_close(lse, torch.tensor([[1e4 + math.log(2), 0.0]]))


def test_merge_bad_input():
    out, lse = torch.zeros(2, 3, 4), torch.zeros(2, 3)
    with pytest.raises(ValueError, match="lse_a must have the shape of out_a"):
        sb.merge_attention_states(out, lse[..., :2], out, lse)
    with pytest.raises(TypeError, match="lse_b must be a floating-point tensor"):
        sb.merge_attention_states(out, lse, out, lse.long())
    with pytest.raises(ValueError, match="do not broadcast"):
        sb.merge_attention_states(out, lse, torch.zeros(3, 3, 4), torch.zeros(3, 3))


def test_online_softmax_of_a_scalar_is_one_like_softmax():
    # A 0-d tensor is one row of one entry, as for sb.softmax and torch.softmax.
    for value in (0.3, -1e4):
        x = torch.tensor(value, dtype=torch.float64)
        out = sb.online_softmax(x)
        assert out.shape == () and out.dtype == x.dtype
        assert torch.equal(out, sb.softmax(x))
    assert torch.equal(sb.online_softmax(torch.tensor(2.0), dim=-1), torch.tensor(1.0))
    with pytest.raises(IndexError, match="out of range"):
        sb.online_softmax(torch.tensor(2.0), dim=1)


def test_merge_gradients_are_finite_when_both_parts_are_empty():
    # Split-K with a chunk that a query cannot see merges two empty parts; the
    # backward pass must give zeros there, not inf * 0 = nan.
    out = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    lse = torch.tensor([float("-inf"), 0.5], dtype=torch.float64, requires_grad=True)
    merged, lse_m = sb.merge_attention_states(out, lse, out, lse)
    (merged.sum() + lse_m.masked_fill(torch.isneginf(lse_m), 0).sum()).backward()
    assert torch.isfinite(out.grad).all() and torch.isfinite(lse.grad).all()
    assert lse.grad[0] == 0 and torch.isneginf(lse_m[0])


def test_merge_gradcheck():
    g = torch.Generator().manual_seed(0)
    args = [
        torch.randn(3, 4, generator=g, dtype=torch.float64),
        torch.randn(3, generator=g, dtype=torch.float64),
    ] * 2
    args = [a.clone().requires_grad_() for a in args]
    assert torch.autograd.gradcheck(sb.merge_attention_states, tuple(args))


def test_merge_keeps_float32_states_when_asked():
    # Partial states of bfloat16 attention merge in float32; with out_dtype the
    # merged output stays in float32, so a chain of merges rounds only once.
    g = torch.Generator().manual_seed(3)
    out_a, out_b = (torch.randn(2, 5, 8, generator=g).bfloat16() for _ in range(2))
    lse_a, lse_b = (torch.randn(2, 5, generator=g) for _ in range(2))
    out, lse = sb.merge_attention_states(
        out_a, lse_a, out_b, lse_b, out_dtype=torch.float32
    )
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    out32, _ = sb.merge_attention_states(out_a.float(), lse_a, out_b.float(), lse_b)
    torch.testing.assert_close(out, out32, rtol=0, atol=0)
    rounded, _ = sb.merge_attention_states(out_a, lse_a, out_b, lse_b)
    assert rounded.dtype == torch.bfloat16  # the default: the dtype of out_a
    torch.testing.assert_close(rounded, out32.bfloat16(), rtol=0, atol=0)
    with pytest.raises(TypeError, match="out_dtype must be a floating"):
        sb.merge_attention_states(out_a, lse_a, out_b, lse_b, out_dtype=torch.int32)


def test_reference_online_softmax_of_a_scalar_and_a_bad_axis():
    # The NumPy reference treats a 0-d array as one row of one entry, as its
    # softmax and sb.online_softmax do; it failed inside np.moveaxis with
    # "source: axis -1 is out of bounds", naming no argument of its own.
    import numpy as np

    for value in (0.3, -1e4):
        out = sb.reference.online_softmax(np.array(value))
        assert out.shape == () and out == sb.reference.softmax(np.array(value)) == 1.0
    with pytest.raises(ValueError, match=r"axis=1 is out of range for x with 0"):
        sb.reference.online_softmax(np.array(2.0), axis=1)
    with pytest.raises(ValueError, match=r"axis=-3 is out of range for x with 2"):
        sb.reference.online_softmax(np.zeros((2, 3)), axis=-3)
