"""softmaxbook.analysis: entropy and the per-map attention diagnostics, on hand-computed
cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import softmaxbook as sb
from softmaxbook import reference

# --- entropy --------------------------------------------------------------------------


def test_entropy_uniform_and_one_hot():
    for n in (1, 2, 7):
        assert torch.allclose(
            sb.entropy(torch.full((n,), 1.0 / n, dtype=torch.float64)),
            torch.tensor(math.log(n), dtype=torch.float64),
        )
    assert sb.entropy(torch.tensor([0.0, 1.0, 0.0])).item() == 0.0


def test_entropy_matches_numpy_formula():
    rng = np.random.default_rng(0)
    p = reference.softmax(rng.normal(size=(5, 9)) * 3)
    expected = -(p * np.log(p)).sum(-1)
    np.testing.assert_allclose(
        sb.entropy(torch.from_numpy(p)).numpy(), expected, rtol=1e-12
    )


def test_entropy_zero_entries_contribute_nothing_exactly():
    # A "+ 1e-12" inside the log gives a biased, nonzero answer for a one-hot row.
    p = torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64)
    assert sb.entropy(p).item() == pytest.approx(math.log(2), abs=1e-15)
    fudge = -(p * torch.log(p + 1e-12)).sum()
    assert fudge.item() != sb.entropy(p).item()


def test_entropy_dim_and_keepdim():
    p = torch.softmax(torch.randn(3, 4, 5), dim=1)
    assert torch.allclose(sb.entropy(p, dim=1), sb.entropy(p.transpose(1, 2)))
    assert sb.entropy(p, dim=-2, keepdim=True).shape == (3, 1, 5)


def test_entropy_gradient_finite_at_zeros():
    p = torch.tensor([0.0, 0.3, 0.7], dtype=torch.float64, requires_grad=True)
    sb.entropy(p).backward()
    assert torch.isfinite(p.grad).all()
    assert p.grad[0] == 0.0


def test_entropy_gradcheck():
    p = torch.softmax(torch.randn(3, 5, dtype=torch.float64), -1).requires_grad_()
    assert torch.autograd.gradcheck(sb.entropy, (p,))


def test_entropy_low_precision_and_empty():
    p = torch.full((4,), 0.25)
    for dtype in (torch.float16, torch.bfloat16):
        assert sb.entropy(p.to(dtype)).float().item() == pytest.approx(
            math.log(4), rel=1e-2
        )
    assert sb.entropy(torch.empty(3, 0)).tolist() == [0.0, 0.0, 0.0]


def test_entropy_errors():
    with pytest.raises(TypeError, match="floating-point"):
        sb.entropy(torch.tensor([1, 0]))
    with pytest.raises(IndexError, match="dim=2"):
        sb.entropy(torch.ones(2, 2), dim=2)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-30, 30), min_size=1, max_size=12))
def test_entropy_between_zero_and_log_n(scores):
    p = torch.softmax(torch.tensor(scores, dtype=torch.float64), -1)
    h = sb.entropy(p).item()
    assert -1e-12 <= h <= math.log(len(scores)) + 1e-12


# --- attention_entropy ----------------------------------------------------------------


def test_attention_entropy_hand_case_skips_zero_rows():
    w = torch.tensor(
        [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64
    )  # the last query sees nothing
    assert sb.attention_entropy(w).item() == pytest.approx(math.log(2) / 2, abs=1e-15)


def test_attention_entropy_equals_mean_row_entropy_and_batches():
    w = torch.softmax(torch.randn(2, 3, 5, 7, dtype=torch.float64), -1)
    out = sb.attention_entropy(w)
    assert out.shape == (2, 3)
    assert torch.allclose(out, sb.entropy(w).mean(-1))


def test_attention_entropy_renormalizes_rows():
    w = torch.softmax(torch.randn(4, 6, dtype=torch.float64), -1)
    assert torch.allclose(sb.attention_entropy(0.3 * w), sb.attention_entropy(w))


def test_attention_entropy_all_zero_map_is_zero_not_nan():
    out = sb.attention_entropy(torch.zeros(2, 3, 3))
    assert out.tolist() == [0.0, 0.0]


def test_attention_entropy_causal_uniform():
    L = 5
    w = sb.causal_mask(L).double()
    w = w / w.sum(-1, keepdim=True)  # row i uniform over i + 1 keys
    expected = sum(math.log(i + 1) for i in range(L)) / L
    assert sb.attention_entropy(w).item() == pytest.approx(expected, abs=1e-14)


# --- attention_distance ---------------------------------------------------------------


def test_attention_distance_identity_and_previous_token():
    L = 6
    assert sb.attention_distance(torch.eye(L)).item() == 0.0
    previous = torch.zeros(L, L)
    previous[0, 0] = 1.0
    previous[torch.arange(1, L), torch.arange(L - 1)] = 1.0
    assert sb.attention_distance(previous).item() == pytest.approx((L - 1) / L)


def test_attention_distance_matches_square_formula():
    # The common square formula, |positions[:, None] - positions[None, :]|: right for
    # square maps with full rows.
    w = torch.softmax(torch.randn(3, 7, 7, dtype=torch.float64), -1)
    pos = torch.arange(7, dtype=torch.float64)
    expected = (w * (pos[:, None] - pos[None, :]).abs()).sum(-1).mean(-1)
    assert torch.allclose(sb.attention_distance(w), expected)


def test_attention_distance_causal_uniform():
    L = 5
    w = sb.causal_mask(L).double()
    w = w / w.sum(
        -1, keepdim=True
    )  # query i looks uniformly at 0..i: mean distance i / 2
    assert sb.attention_distance(w).item() == pytest.approx(
        sum(i / 2 for i in range(L)) / L
    )


def test_attention_distance_rectangular_with_offset():
    # Two new queries at positions 3 and 4 of a 5-key cache, each on the first key.
    w = torch.tensor([[1.0, 0, 0, 0, 0], [1.0, 0, 0, 0, 0]])
    assert sb.attention_distance(w).item() == pytest.approx(0.5)
    assert sb.attention_distance(w, offset=3).item() == pytest.approx(3.5)


def test_attention_distance_skips_zero_rows():
    w = torch.tensor([[0.0, 0.0], [0.5, 0.5]])
    assert sb.attention_distance(w).item() == pytest.approx(0.5)
    assert sb.attention_distance(torch.zeros(3, 3)).item() == 0.0


# --- attention_sparsity ---------------------------------------------------------------


def test_attention_sparsity_hand_case():
    w = torch.tensor([[1.0, 0.0, 0.0], [0.6, 0.4, 0.0], [0.0, 0.5, 0.5]])
    assert sb.attention_sparsity(w).item() == pytest.approx(4 / 9)
    # Under the causal mask only 6 entries could be nonzero, and 1 of them is zero.
    assert sb.attention_sparsity(w, sb.causal_mask(3)).item() == pytest.approx(1 / 6)
    assert sb.attention_sparsity(w, threshold=0.45).item() == pytest.approx(5 / 9)


def test_attention_sparsity_softmax_dense_and_zero_rows_skipped():
    w = torch.softmax(torch.randn(2, 4, 4), -1)
    assert sb.attention_sparsity(w).tolist() == [0.0, 0.0]
    w = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    assert sb.attention_sparsity(w).item() == pytest.approx(0.5)
    assert sb.attention_sparsity(torch.zeros(2, 2)).item() == 0.0


def test_attention_sparsity_mask_broadcasts_over_batch():
    w = torch.softmax(torch.randn(2, 3, 4, 4), -1) * sb.causal_mask(4)
    out = sb.attention_sparsity(w, sb.causal_mask(4))
    assert out.shape == (2, 3) and (out == 0).all()


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_diagnostics_in_range(L, S, seed):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(L, S, generator=g, dtype=torch.float64) * 5
    keep = torch.rand(L, S, generator=g) > 0.3
    w = sb.masked_softmax(scores, keep)
    h, d, s = (
        sb.attention_entropy(w),
        sb.attention_distance(w),
        sb.attention_sparsity(w, keep),
    )
    assert torch.isfinite(torch.stack([h, d, s])).all()
    assert 0 <= h <= math.log(S) + 1e-12
    assert 0 <= d <= max(L - 1, S - 1)
    assert 0 <= s <= 1


# --- errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fn", [sb.attention_entropy, sb.attention_distance, sb.attention_sparsity]
)
def test_map_functions_reject_bad_weights(fn):
    with pytest.raises(TypeError, match="floating-point"):
        fn(torch.ones(3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        fn(torch.ones(3))
    with pytest.raises(ValueError, match="non-negative"):
        fn(torch.tensor([[0.5, -0.5]]))
    with pytest.raises(TypeError, match=r"torch.Tensor"):
        fn([[1.0]])


def test_distance_and_sparsity_argument_errors():
    w = torch.eye(3)
    with pytest.raises(TypeError, match="offset"):
        sb.attention_distance(w, offset=1.5)
    with pytest.raises(TypeError, match="boolean"):
        sb.attention_sparsity(w, torch.ones(3, 3))
    with pytest.raises(ValueError, match="does not broadcast"):
        sb.attention_sparsity(w, torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="threshold"):
        sb.attention_sparsity(w, threshold=-0.1)
    with pytest.raises(ValueError, match="threshold"):
        sb.attention_sparsity(w, threshold=float("nan"))
    for wrong_type in ("x", None, True):  # a wrong type is a TypeError
        with pytest.raises(TypeError, match="threshold must be a real number"):
            sb.attention_sparsity(w, threshold=wrong_type)
