"""What the API page says about softmaxbook.reference, .gradients, .analysis and
.normalizers.exponential, checked against what the code does.

Each test pins a sentence of a docstring that a review found wrong (issue 27): it
fails on the old sentence, or on code that stops doing what the new one says.
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch

import softmaxbook as sb
from softmaxbook import analysis, gradients, reference
from softmaxbook.normalizers import exponential


def _doc(obj) -> str:
    return " ".join(inspect.getdoc(obj).split())


# --- normalizers.exponential ----------------------------------------------------


def test_only_softmax_and_log_softmax_take_a_temperature():
    # The module said "softmax, log-softmax and logsumexp ..., each with a temperature".
    assert "temperature" in inspect.signature(sb.softmax).parameters
    assert "temperature" in inspect.signature(sb.log_softmax).parameters
    assert "temperature" not in inspect.signature(sb.logsumexp).parameters
    assert "each with a temperature" not in _doc(exponential)


# --- reference ----------------------------------------------------------------

# The torch functions the module docstring says are compared with the references.
_COMPARED = [
    (sb.softmax, reference.softmax),
    (sb.log_softmax, reference.log_softmax),
    (sb.logsumexp, reference.logsumexp),
    (sb.online_softmax, reference.softmax),
    (sb.sparsemax, reference.sparsemax),
]


@pytest.mark.parametrize("torch_fn, ref_fn", _COMPARED, ids=lambda f: f.__name__)
def test_the_functions_the_reference_docstring_names_agree_with_it(torch_fn, ref_fn):
    x = torch.randn(
        6, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(0)
    )
    expected = torch.from_numpy(np.asarray(ref_fn(x.numpy())))
    torch.testing.assert_close(torch_fn(x), expected, rtol=1e-12, atol=1e-12)


def test_the_reference_docstring_names_what_is_compared_not_every_function():
    # It said "every torch function in softmaxbook is tested against them"; most
    # (flash attention, entmax, the sampling filters, ...) have no reference here.
    doc = _doc(reference)
    assert "every torch function" not in doc
    for torch_fn, _ in _COMPARED:
        assert f"softmaxbook.{torch_fn.__name__}" in doc, torch_fn.__name__


# --- gradients ----------------------------------------------------------------


def test_softmax_jacobian_documents_its_value_error():
    with pytest.raises(ValueError, match="0-d"):
        sb.softmax_jacobian(torch.tensor(0.5))
    raises = inspect.getdoc(gradients.softmax_jacobian).split("Raises")[1]
    assert "ValueError" in raises


def test_zero_weights_get_zero_gradient_only_for_a_finite_upstream_gradient():
    s = torch.tensor([[1.0, 0.0], [0.5, 0.5]], dtype=torch.float64)
    finite = sb.softmax_backward(s, torch.tensor([[0.3, -2.0], [1.0, 4.0]]).double())
    assert finite[0, 1] == 0  # s_i = 0: exactly 0
    infinite = sb.softmax_backward(
        s, torch.tensor([[0.0, math.inf], [1.0, 0.0]]).double()
    )
    assert torch.isnan(infinite[0]).all()  # 0 * inf: the whole row is nan
    for fn in (gradients.softmax_backward, gradients.SoftmaxFunction):
        assert "finite" in _doc(fn), fn


# --- analysis -----------------------------------------------------------------


def test_a_map_of_zero_rows_gives_zero():
    assert "with no such row at all" not in _doc(analysis)
    zeros = torch.zeros(2, 3, 4)
    assert (sb.attention_entropy(zeros) == 0).all()
    assert (sb.attention_distance(zeros) == 0).all()


def test_halving_eps_costs_about_log_2_not_exactly():
    # The docstring said every halving of eps costs "another log 2 of score"; for
    # softmax with a sink key the step is log 2 + log((1 - eps/2) / (1 - eps)).
    for eps in (0.5, 0.1, 1e-3):
        step = sb.ignore_gap(torch.softmax, 100, eps / 2) - sb.ignore_gap(
            torch.softmax, 100, eps
        )
        exact = math.log(2) + math.log((1 - eps / 2) / (1 - eps))
        assert math.isclose(step, exact, abs_tol=1e-12)
    assert sb.ignore_gap(torch.softmax, 100, 0.25) - sb.ignore_gap(
        torch.softmax, 100, 0.5
    ) > 1.5 * math.log(2)
    assert "another :math:`\\log 2`" not in inspect.getdoc(analysis.ignore_gap)


def test_ignore_gap_is_good_to_the_precision_the_docstring_states():
    # The search brackets the gap to 1.4e-13; the float64 weights add their rounding.
    for n, eps in [(1, 0.5), (100, 1e-3), (10_000, 1e-6), (100_000, 1e-9)]:
        gap = sb.ignore_gap(torch.softmax, n, eps)
        assert abs(gap - math.log(n * (1 - eps) / eps)) <= 1e-12
    assert "good to about :math:`10^{-12}`" in inspect.getdoc(analysis.ignore_gap)


def test_naive_softmax_is_nan_only_where_exp_overflowed():
    # The docstring said "the result becomes nan"; only the overflowed entries do.
    with np.errstate(over="ignore"):
        out = reference.naive_softmax([1000.0, 0.0, 710.0, 1.0])
    assert np.isnan(out[[0, 2]]).all() and (out[[1, 3]] == 0).all()
    assert np.isnan(reference.naive_softmax([-1000.0, -1001.0])).all()  # 0 / 0
    assert "and the result becomes" not in _doc(reference.naive_softmax)
