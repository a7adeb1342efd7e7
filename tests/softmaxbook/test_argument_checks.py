"""Tests of softmaxbook._validate: the argument checks and the empty-row guard every
module shares."""

from __future__ import annotations

import pytest
import torch

from softmaxbook._validate import (
    check_attention_args,
    check_installed,
    check_mask,
    check_nonnegative,
    check_nonnegative_int,
    check_positive,
    check_qkv,
    check_real,
    zero_empty_rows,
)


def test_check_mask_device_mismatch():
    scores = torch.empty(2, 3, device="meta")
    with pytest.raises(ValueError, match="mask is on cpu but the scores are on meta"):
        check_mask(torch.ones(3, dtype=torch.bool), scores)


def test_check_mask_returns_expanded_view():
    mask = torch.tensor([True, False, True])
    out = check_mask(mask, torch.zeros(2, 3))
    assert out.shape == (2, 3) and out.data_ptr() == mask.data_ptr()


# --------------------------------------------------------------- numbers and shapes


def test_number_checks_name_the_argument_and_refuse_nan():
    assert check_positive(2, "scale") == 2.0 and check_nonnegative(0, "decay") == 0.0
    for check in (check_positive, check_nonnegative, check_real):
        with pytest.raises(TypeError, match="x must be a real number"):
            check(True, "x")  # a bool is not a number here
        with pytest.raises(TypeError, match="x must be a real number"):
            check("1", "x")
        with pytest.raises(ValueError, match="x must be"):
            check(float("nan"), "x")
    with pytest.raises(ValueError, match=">= 0"):
        check_nonnegative(-1e-9, "decay")
    assert check_nonnegative_int(0, "warmup") == 0
    with pytest.raises(TypeError, match="warmup must be an int"):
        check_nonnegative_int(1.0, "warmup")
    with pytest.raises(ValueError, match="warmup must be >= 0"):
        check_nonnegative_int(-1, "warmup")


def test_check_qkv_returns_the_broadcast_batch_shape():
    q, k, v = torch.zeros(2, 1, 5, 4), torch.zeros(1, 3, 6, 4), torch.zeros(6, 7)
    assert check_qkv(q, k, v) == (2, 3)
    with pytest.raises(ValueError, match="same last dimension D"):
        check_qkv(q, torch.zeros(6, 5), v)
    with pytest.raises(ValueError, match="same length S"):
        check_qkv(q, k, torch.zeros(5, 7))
    with pytest.raises(TypeError, match="share a dtype"):
        check_qkv(q, k, v.double())


def test_check_qkv_counts_the_query_heads_of_grouped_keys():
    q, kv = torch.zeros(2, 6, 5, 4), torch.zeros(2, 2, 7, 4)
    assert tuple(check_qkv(q, kv, kv, groups=3)) == (2, 6)
    with pytest.raises(ValueError, match="do not broadcast"):
        check_qkv(q, kv, kv)


def test_check_attention_args_defaults_and_the_mask():
    q, k, v = torch.zeros(2, 5, 16), torch.zeros(2, 6, 16), torch.zeros(2, 6, 3)
    batch, scale, keep = check_attention_args(q, k, v, None, False, None)
    assert batch == (2,) and scale == 0.25 and keep is None
    mask = torch.ones(6, dtype=torch.bool)
    _, scale, keep = check_attention_args(q, k, v, mask, False, 2.0)
    assert scale == 2.0 and keep.shape == (2, 5, 6)
    assert keep.data_ptr() == mask.data_ptr()  # a view: no (L, S) copy per batch
    with pytest.raises(ValueError, match="not both"):
        check_attention_args(q, k, v, mask, True, None)
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        check_attention_args(q, k, v, None, 1, None)
    with pytest.raises(ValueError, match="does not broadcast"):
        check_attention_args(q, k, v, torch.ones(7, dtype=torch.bool), False, None)


def test_zero_empty_rows_gives_zeros_forward_and_backward():
    scores = torch.tensor([[0.5, float("-inf"), 1.0], [float("-inf")] * 3])
    scores.requires_grad_(True)
    weights = zero_empty_rows(lambda s: torch.softmax(s, -1), scores, dim=-1)
    assert torch.equal(weights[1], torch.zeros(3))
    torch.testing.assert_close(weights[0].sum(), torch.tensor(1.0))
    weights.sum().backward()
    assert (
        torch.equal(scores.grad[1], torch.zeros(3))
        and torch.isfinite(scores.grad).all()
    )


def test_check_installed():
    check_installed(("torch", "numpy"), "this")  # installed: nothing happens
    with pytest.raises(ImportError, match="pip install no_such_package_here"):
        check_installed("no_such_package_here", "this")
