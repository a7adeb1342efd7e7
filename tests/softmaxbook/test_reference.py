"""The NumPy float64 references: the specification the torch code is tested against."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from softmaxbook import reference as ref

finite_rows = arrays(
    np.float64,
    st.tuples(st.integers(1, 6), st.integers(1, 12)),
    elements=st.floats(-50, 50),
)


def softmax_by_hand(x):
    """softmax of the running example, computed term by term."""
    e = [np.exp(v) for v in x]
    return np.array([v / sum(e) for v in e])


def test_worked_example():
    x = [1.0, 0.5, 2.5, -0.1]
    np.testing.assert_allclose(ref.softmax(x), softmax_by_hand(x), rtol=1e-15)
    np.testing.assert_allclose(ref.naive_softmax(x), softmax_by_hand(x), rtol=1e-15)
    np.testing.assert_allclose(
        ref.softmax(x).round(4), [0.1557, 0.0945, 0.6980, 0.0518]
    )


@settings(max_examples=60, deadline=None)
@given(finite_rows)
def test_softmax_is_a_distribution(x):
    s = ref.softmax(x)
    assert (s >= 0).all()
    np.testing.assert_allclose(s.sum(-1), 1.0, rtol=1e-12)


@settings(max_examples=60, deadline=None)
@given(finite_rows, st.floats(-1e3, 1e3))
def test_shift_invariance(x, c):
    np.testing.assert_allclose(ref.softmax(x + c), ref.softmax(x), atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(finite_rows)
def test_order_preserved(x):
    s = ref.softmax(x)
    greater = x[:, :, None] > x[:, None, :]
    assert (s[:, :, None] >= s[:, None, :])[greater].all()


def test_naive_overflows_where_stable_does_not():
    x = np.array([1000.0, 999.0, 0.0])
    assert np.isnan(ref.naive_softmax(x)).any()
    s = ref.softmax(x)
    assert np.isfinite(s).all()
    np.testing.assert_allclose(s, softmax_by_hand(x - 1000.0))


def test_extremes_and_infinities():
    np.testing.assert_allclose(ref.softmax([1e4, -1e4]), [1.0, 0.0])
    np.testing.assert_allclose(ref.softmax([0.0, -np.inf, 0.0]), [0.5, 0.0, 0.5])
    np.testing.assert_array_equal(ref.softmax([-np.inf, -np.inf]), [0.0, 0.0])
    assert np.isnan(ref.softmax([0.0, np.nan])).all()  # nan propagates, never hidden
    assert ref.logsumexp([-np.inf, -np.inf]) == -np.inf
    assert ref.logsumexp([0.0, np.inf]) == np.inf


@settings(max_examples=60, deadline=None)
@given(finite_rows)
def test_logsumexp_and_log_softmax(x):
    lse = ref.logsumexp(x)
    m = x.max(-1)
    assert (m <= lse + 1e-12).all() and (lse <= m + np.log(x.shape[-1]) + 1e-12).all()
    np.testing.assert_allclose(ref.log_softmax(x), np.log(ref.softmax(x)), atol=1e-9)
    np.testing.assert_allclose(
        ref.logsumexp(x, keepdims=True).shape, x.shape[:-1] + (1,)
    )


def test_log_softmax_stays_finite_where_log_of_softmax_does_not():
    x = np.array([0.0, -800.0])
    with np.errstate(divide="ignore"):
        assert np.isneginf(np.log(ref.softmax(x))[1])
    np.testing.assert_allclose(ref.log_softmax(x), [0.0, -800.0], atol=1e-12)


@pytest.mark.parametrize("block_size", [1, 3, 4, 100])
def test_online_softmax_matches_softmax(block_size):
    rng = np.random.default_rng(0)
    x = rng.normal(scale=20, size=(5, 11))
    np.testing.assert_allclose(
        ref.online_softmax(x, block_size=block_size), ref.softmax(x), rtol=1e-12
    )
    np.testing.assert_allclose(
        ref.online_softmax(x.T, axis=0, block_size=block_size),
        ref.softmax(x.T, axis=0),
        rtol=1e-12,
    )


def test_online_softmax_infinities_and_errors():
    np.testing.assert_array_equal(
        ref.online_softmax([-np.inf, -np.inf, -np.inf]), [0, 0, 0]
    )
    np.testing.assert_allclose(
        ref.online_softmax([-np.inf, 0.0, -np.inf, 0.0], block_size=1), [0, 0.5, 0, 0.5]
    )
    with pytest.raises(ValueError, match="block_size"):
        ref.online_softmax([1.0], block_size=0)


def test_sparsemax_projection():
    np.testing.assert_allclose(ref.sparsemax([1.0, 0.5, 2.5, -0.1]), [0, 0, 1, 0])
    np.testing.assert_allclose(
        ref.sparsemax([1.0, 0.5, -1.0]), [0.75, 0.25, 0.0], atol=1e-12
    )
    rng = np.random.default_rng(1)
    x = rng.normal(size=(20, 7))
    p = ref.sparsemax(x)
    np.testing.assert_allclose(p.sum(-1), 1.0)
    assert (p >= 0).all()
    # The projection is closer to x than any other point of the simplex we try.
    for _ in range(20):
        q = rng.dirichlet(np.ones(7), size=20)
        assert (((p - x) ** 2).sum(-1) <= ((q - x) ** 2).sum(-1) + 1e-12).all()


def test_bad_input():
    with pytest.raises(TypeError, match="real numeric"):
        ref.softmax(np.array(["a", "b"]))
