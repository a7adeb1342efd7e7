"""Tests for softmaxbook.masking: masks, masked_softmax and fill values."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import softmaxbook as sb
from softmaxbook import reference


def _random_case(seed, shape, p_keep=0.6, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(shape, generator=g, dtype=dtype) * 3
    mask = torch.rand(shape, generator=g) < p_keep
    return scores, mask


def _reference_masked(scores, mask, axis=-1):
    x = np.where(mask.numpy(), scores.double().numpy(), -np.inf)
    return reference.softmax(x, axis=axis)


# --- causal_mask ----------------------------------------------------------------------


@pytest.mark.parametrize("L, S", [(1, 1), (4, 4), (3, 5), (5, 3), (1, 7), (7, 1)])
def test_causal_mask_is_lower_triangular(L, S):
    m = sb.causal_mask(L, S)
    assert m.dtype == torch.bool and m.shape == (L, S)
    assert torch.equal(m, torch.ones(L, S, dtype=torch.bool).tril())
    assert m.any(dim=-1).all()  # top-left alignment never empties a row


def test_causal_mask_default_square():
    assert torch.equal(sb.causal_mask(6), sb.causal_mask(6, 6))
    assert sb.causal_mask(3, device="cpu").device.type == "cpu"


@pytest.mark.parametrize("L, S", [(3, 5), (5, 3), (4, 4)])
def test_causal_mask_aligned_like_torch_is_causal(L, S):
    g = torch.Generator().manual_seed(1)
    q, k, v = (
        torch.randn(2, n, 8, generator=g, dtype=torch.float64) for n in (L, S, S)
    )
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    got = F.scaled_dot_product_attention(q, k, v, attn_mask=sb.causal_mask(L, S))
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize(
    "bad, exc, match",
    [
        (0, ValueError, ">= 1"),
        (-2, ValueError, ">= 1"),
        (2.0, TypeError, "int"),
        (True, TypeError, "int"),
        ("3", TypeError, "int"),
    ],
)
def test_causal_mask_errors(bad, exc, match):
    with pytest.raises(exc, match=match):
        sb.causal_mask(bad)
    with pytest.raises(exc, match=match):
        sb.causal_mask(3, bad)


# --- padding_mask ---------------------------------------------------------------------


def test_padding_mask_values():
    m = sb.padding_mask([5, 3], 6)
    expected = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    assert torch.equal(m, expected)


def test_padding_mask_inputs_and_defaults():
    from_list = sb.padding_mask([2, 0, 4])
    assert from_list.shape == (3, 4)
    assert torch.equal(from_list, sb.padding_mask(torch.tensor([2, 0, 4])))
    assert torch.equal(
        from_list, sb.padding_mask(torch.tensor([2, 0, 4], dtype=torch.int32))
    )
    assert torch.equal(
        from_list, sb.padding_mask([np.int64(2), np.int64(0), np.int64(4)])
    )
    assert torch.equal(from_list.sum(-1), torch.tensor([2, 0, 4]))
    assert sb.padding_mask([], 3).shape == (0, 3)
    assert sb.padding_mask([0, 0]).shape == (2, 0)


def test_padding_mask_matches_arange_formula():
    lengths = torch.tensor([7, 1, 4, 7])
    expected = torch.arange(9)[None, :] < lengths[:, None]
    assert torch.equal(sb.padding_mask(lengths, 9), expected)


@pytest.mark.parametrize(
    "lengths, max_len, exc, match",
    [
        (torch.tensor([1.0, 2.0]), None, TypeError, "integer tensor"),
        (torch.tensor([[1, 2]]), None, TypeError, "1-D"),
        (torch.tensor([True, False]), None, TypeError, "integer"),
        ([1.5, 2], None, TypeError, "sequence of ints"),
        ("12", None, TypeError, "sequence of ints"),
        ([True, 2], None, TypeError, "sequence of ints"),
        ([3, -1], None, ValueError, ">= 0"),
        ([3, 5], 4, ValueError, r"max_len must be >= max\(lengths\) = 5"),
        ([3, 5], 6.0, TypeError, "max_len must be an int"),
        ([3, 5], True, TypeError, "max_len must be an int"),
    ],
)
def test_padding_mask_errors(lengths, max_len, exc, match):
    with pytest.raises(exc, match=match):
        sb.padding_mask(lengths, max_len)


# --- masked_softmax: agreement --------------------------------------------------------


@pytest.mark.parametrize(
    "shape, dim",
    [((6, 9), -1), ((2, 3, 5, 7), -1), ((5, 4), 0), ((3, 6, 4), 1), ((3, 6, 4), -2)],
)
def test_masked_softmax_matches_reference(shape, dim):
    scores, mask = _random_case(0, shape, p_keep=0.5)
    # force one fully masked slice along dim
    index = [0] * len(shape)
    index[dim] = slice(None)
    mask[tuple(index)] = False
    got = sb.masked_softmax(scores, mask, dim=dim)
    np.testing.assert_allclose(
        got.numpy(), _reference_masked(scores, mask, axis=dim), rtol=1e-12, atol=1e-15
    )


def test_masked_softmax_matches_torch_on_rows_with_a_key():
    scores, mask = _random_case(1, (4, 3, 8, 8))
    mask[..., 0] = True  # every row keeps a key, so torch has no nan
    expected = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    torch.testing.assert_close(sb.masked_softmax(scores, mask), expected)


def test_masked_softmax_with_none_is_softmax():
    scores, _ = _random_case(2, (5, 6))
    torch.testing.assert_close(
        sb.masked_softmax(scores, None), torch.softmax(scores, -1)
    )
    torch.testing.assert_close(
        sb.masked_softmax(scores, None, dim=0), torch.softmax(scores, 0)
    )


def test_masked_softmax_neg_inf_scores_count_as_masked():
    scores = torch.tensor([[0.0, float("-inf"), 1.0], [float("-inf")] * 3])
    for mask in (None, torch.ones(3, dtype=torch.bool)):
        p = sb.masked_softmax(scores, mask)
        np.testing.assert_allclose(
            p.numpy(), reference.softmax(scores.numpy()), atol=1e-7
        )
        assert torch.equal(p[1], torch.zeros(3))


@pytest.mark.parametrize(
    "mask_shape", [(8,), (1, 8), (6, 1), (6, 8), (2, 1, 1, 8), (2, 3, 6, 8)]
)
def test_masked_softmax_broadcasts_masks(mask_shape):
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(2, 3, 6, 8, generator=g, dtype=torch.float64)
    mask = torch.rand(mask_shape, generator=g) < 0.6
    expected = _reference_masked(scores, mask.expand(scores.shape))
    np.testing.assert_allclose(
        sb.masked_softmax(scores, mask).numpy(), expected, atol=1e-15
    )


# --- masked_softmax: properties -------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    rows=st.integers(1, 6),
    n=st.integers(1, 10),
    p_keep=st.floats(0.0, 1.0),
    spread=st.floats(1e-3, 50.0),
)
def test_masked_softmax_properties(seed, rows, n, p_keep, spread):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(rows, n, generator=g, dtype=torch.float64) * spread
    mask = torch.rand(rows, n, generator=g) < p_keep
    p = sb.masked_softmax(scores, mask)
    assert torch.isfinite(p).all()
    assert (p[~mask] == 0).all()  # masked entries are exactly zero
    assert (p >= 0).all()
    sums = p.sum(-1)
    has_key = mask.any(-1)
    torch.testing.assert_close(sums[has_key], torch.ones_like(sums[has_key]))
    assert (sums[~has_key] == 0).all()
    # invariance: whatever sits at masked positions (huge, inf, nan) never matters
    junk = torch.randn(rows, n, generator=g, dtype=torch.float64) * 1e6
    junk[0, 0] = float("nan")
    if n > 1:
        junk[0, 1] = float("inf")
    other = torch.where(mask, scores, junk)
    assert torch.equal(sb.masked_softmax(other, mask), p)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 8), shift=st.floats(-1e3, 1e3))
def test_masked_softmax_shift_invariant(seed, n, shift):
    scores, mask = _random_case(seed, (3, n))
    torch.testing.assert_close(
        sb.masked_softmax(scores + shift, mask),
        sb.masked_softmax(scores, mask),
        rtol=1e-9,
        atol=1e-12,
    )


# --- masked_softmax: gradients --------------------------------------------------------


def test_masked_softmax_gradcheck_with_fully_masked_row():
    scores, mask = _random_case(4, (4, 5))
    mask[1] = False
    mask[2] = torch.tensor([False, True, False, False, False])  # a single key
    x = scores.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda s: sb.masked_softmax(s, mask), (x,))
    assert torch.autograd.gradgradcheck(lambda s: sb.masked_softmax(s, mask), (x,))


def test_masked_softmax_gradcheck_other_dim():
    scores, mask = _random_case(5, (5, 3, 2))
    mask[:, 0, 0] = False
    x = scores.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda s: sb.masked_softmax(s, mask, dim=0), (x,))


def test_fully_masked_row_zero_forward_and_backward():
    scores = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 1], [0, 0, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    p = sb.masked_softmax(scores, mask)
    assert torch.equal(p[1].detach(), torch.zeros(4, dtype=torch.float64))
    (p * torch.randn(3, 4, dtype=torch.float64)).sum().backward()
    assert torch.isfinite(scores.grad).all()
    assert torch.equal(scores.grad[1], torch.zeros(4, dtype=torch.float64))
    assert (scores.grad[~mask] == 0).all()  # no gradient reaches masked scores


def test_loss_on_valid_rows_only_has_finite_gradients():
    # With the -inf-then-softmax recipe the empty row is nan, and slicing it away
    # before the loss does not help: the backward of ``weights @ v`` multiplies
    # the nan weights by a zero gradient (nan * 0 = nan), and an additive mask
    # lets softmax's own nan gradient through to the scores. masked_softmax has
    # no nan to leak.
    g = torch.Generator().manual_seed(7)
    scores0 = torch.randn(3, 4, generator=g)
    v = torch.randn(4, 5, generator=g, requires_grad=True)
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[2] = False

    scores = scores0.clone().requires_grad_()
    (sb.masked_softmax(scores, mask) @ v)[:2].sum().backward()
    assert torch.isfinite(scores.grad).all() and torch.isfinite(v.grad).all()

    v.grad = None
    (torch.softmax(scores0.masked_fill(~mask, float("-inf")), -1) @ v)[
        :2
    ].sum().backward()
    assert torch.isnan(v.grad).any()  # the bug the library avoids

    additive = sb.additive_mask(mask)
    scores = scores0.clone().requires_grad_()
    torch.softmax(scores + additive, -1)[:2].pow(2).sum().backward()
    assert torch.isnan(scores.grad[2]).all() and torch.isfinite(scores.grad[:2]).all()


# --- masked_softmax: dtypes and extreme inputs ----------------------------------------


@pytest.mark.parametrize("dtype, atol", [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
def test_masked_softmax_low_precision(dtype, atol):
    scores, mask = _random_case(6, (8, 16), dtype=torch.float32)
    mask[3] = False
    p = sb.masked_softmax(scores.to(dtype), mask)
    assert p.dtype == dtype
    assert not torch.isnan(p).any()
    assert torch.equal(p[3], torch.zeros(16, dtype=dtype))
    assert (p[~mask] == 0).all()
    torch.testing.assert_close(
        p.float(), sb.masked_softmax(scores, mask), atol=atol, rtol=0
    )
    # gradients stay finite too
    x = scores.to(dtype).requires_grad_()
    sb.masked_softmax(x, mask).sum().backward()
    assert torch.isfinite(x.grad).all() and (x.grad[3] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_masked_softmax_extreme_scores(dtype):
    scores = torch.tensor(
        [[1e4, -1e4, 0.0, 1e4], [-1e4, -1e4, -1e4, -1e4]], dtype=dtype
    )
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    p = sb.masked_softmax(scores, mask)
    expected = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]], dtype=dtype)
    assert torch.equal(p, expected)


def test_masked_softmax_nan_propagates_only_from_kept_positions():
    scores = torch.zeros(3, 4)
    scores[0, 1] = float("nan")  # kept: row 0 becomes nan
    scores[1, 2] = float("nan")  # masked: ignored
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 1], [1, 1, 1, 1]], dtype=torch.bool)
    p = sb.masked_softmax(scores, mask)
    assert torch.isnan(p[0]).all()
    torch.testing.assert_close(p[1], torch.tensor([1 / 3, 1 / 3, 0.0, 1 / 3]))
    torch.testing.assert_close(p[2], torch.full((4,), 0.25))


def test_masked_softmax_empty_and_size_one_dims():
    assert sb.masked_softmax(
        torch.zeros(3, 0), torch.zeros(3, 0, dtype=torch.bool)
    ).shape == (3, 0)
    assert sb.masked_softmax(
        torch.zeros(0, 4), torch.ones(4, dtype=torch.bool)
    ).shape == (0, 4)
    one = torch.tensor([[2.5], [-1.0]])
    p = sb.masked_softmax(one, torch.tensor([[True], [False]]))
    assert torch.equal(p, torch.tensor([[1.0], [0.0]]))
    assert torch.equal(
        sb.masked_softmax(torch.tensor(3.0), torch.tensor(True)), torch.tensor(1.0)
    )


# --- masked_softmax: errors -----------------------------------------------------------


def test_masked_softmax_errors():
    scores = torch.randn(2, 3, 4)
    with pytest.raises(TypeError, match=r"mask must be a boolean tensor.*\.bool\(\)"):
        sb.masked_softmax(scores, torch.ones(4, dtype=torch.long))
    with pytest.raises(TypeError, match=r"additive == 0"):
        sb.masked_softmax(scores, torch.zeros(4))
    with pytest.raises(TypeError, match=r"mask must be a torch.Tensor"):
        sb.masked_softmax(scores, [True, False, True, True])
    with pytest.raises(ValueError, match=r"mask of shape \(3,\) does not broadcast"):
        sb.masked_softmax(scores, torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="does not broadcast"):  # would grow the scores
        sb.masked_softmax(scores, torch.ones(5, 2, 3, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="scores must be a floating-point tensor"):
        sb.masked_softmax(torch.ones(2, 3, dtype=torch.long), None)
    with pytest.raises(IndexError, match="dim=3 is out of range"):
        sb.masked_softmax(scores, None, dim=3)
    with pytest.raises(TypeError, match="dim must be an int"):
        sb.masked_softmax(scores, None, dim=1.0)


# --- additive_mask and mask_fill_value ------------------------------------------------


def test_additive_mask_values_and_use():
    mask = torch.tensor([[True, False, True], [True, True, True]])
    add = sb.additive_mask(mask, torch.float64)
    assert add.dtype == torch.float64
    assert torch.equal(
        add,
        torch.tensor([[0.0, float("-inf"), 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64),
    )
    scores = torch.randn(2, 3, dtype=torch.float64)
    torch.testing.assert_close(
        torch.softmax(scores + add, -1), sb.masked_softmax(scores, mask)
    )


def test_additive_mask_errors():
    with pytest.raises(TypeError, match="mask must be a boolean tensor"):
        sb.additive_mask(torch.ones(3))
    with pytest.raises(TypeError, match="dtype must be a floating"):
        sb.additive_mask(torch.ones(3, dtype=torch.bool), torch.int32)


@pytest.mark.parametrize(
    "dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64]
)
def test_mask_fill_value(dtype):
    fill = sb.mask_fill_value(dtype)
    assert fill == torch.finfo(dtype).min and np.isfinite(fill)
    # A finite fill gives a *uniform* row over masked keys when nothing is kept,
    # unlike masked_softmax's zeros: the reason the library avoids fill values.
    row = torch.zeros(1, 4, dtype=dtype).masked_fill(
        torch.ones(1, 4, dtype=torch.bool), fill
    )
    torch.testing.assert_close(torch.softmax(row, -1).float(), torch.full((1, 4), 0.25))


def test_minus_1e9_is_not_representable_in_float16():
    assert torch.isneginf(torch.tensor(-1e9, dtype=torch.float16))
    assert torch.isfinite(torch.tensor(-1e9, dtype=torch.bfloat16))


@pytest.mark.parametrize("bad", [torch.int64, torch.bool, "float32", np.float32])
def test_mask_fill_value_errors(bad):
    with pytest.raises(TypeError, match=r"dtype must be a floating torch.dtype"):
        sb.mask_fill_value(bad)


def test_an_all_minus_inf_row_what_each_function_gives():
    # additive_mask's docstring: such a row is nan in torch.softmax and sb.softmax,
    # zeros in masked_softmax and in the library's attention, on both of its paths.
    bias = sb.additive_mask(torch.zeros(3, 3, dtype=torch.bool))  # nothing allowed
    scores = torch.randn(3, 3) + bias
    assert torch.isnan(torch.softmax(scores, -1)).all()
    assert torch.isnan(sb.softmax(scores)).all()
    assert (sb.masked_softmax(scores, None) == 0).all()
    q = torch.randn(1, 1, 3, 4)
    for explicit in (False, True):
        out = sb.scaled_dot_product_attention(
            q, q, q, attn_mask=bias, explicit=explicit
        )
        assert (out == 0).all()


def test_minus_inf_exists_in_the_dtypes_masked_softmax_states():
    # "representable in float16, bfloat16, float32 and float64": not in float8 e4m3fn.
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        assert torch.isneginf(torch.tensor(float("-inf"), dtype=dtype))
        p = sb.masked_softmax(torch.zeros(2, 3, dtype=dtype), torch.eye(2, 3).bool())
        assert p.dtype == dtype and torch.equal(p.float(), torch.eye(2, 3))
    e4m3 = torch.tensor(float("-inf")).to(torch.float8_e4m3fn).float()
    assert not torch.isinf(e4m3)
