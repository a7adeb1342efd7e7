"""The notebook helpers: one-line setup, and glued numbers rounded to what they can support."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import softmaxbook as sb
from softmaxbook.notebook import MAX_GLUE_DIGITS, _rounded


@pytest.mark.parametrize(
    "value, digits, expected",
    [
        (316.22776601683796, 4, 316.2),
        (316.2277660168379, 4, 316.2),  # the same number one bit away: the same text
        (0.9216297956809864, 4, 0.9216),
        (0.9216297956809865, 4, 0.9216),
        (1.5123474597930908, 3, 1.51),
        (-104.0, 4, -104.0),
        (2.5e-7, 2, 2.5e-7),
        (123456.789, 6, 123457.0),
    ],
)
def test_rounded_keeps_significant_digits(value, digits, expected):
    assert _rounded(value, digits) == expected
    assert repr(_rounded(value, digits)) == repr(expected)


def test_rounded_passes_exact_values_through():
    for value in (0, 26800, True, "v5", None, 0.0):
        assert _rounded(value) == value and type(_rounded(value)) is type(value)
    assert math.isnan(_rounded(float("nan"))) and _rounded(float("-inf")) == float(
        "-inf"
    )


def test_rounded_converts_numpy_and_torch_scalars():
    assert _rounded(np.float64(0.15573677884430628)) == 0.1557
    assert _rounded(np.float32(0.1)) == 0.1
    assert _rounded(torch.tensor(2.718281828459045, dtype=torch.float64), 5) == 2.7183
    assert type(_rounded(np.int64(7))) is int


@pytest.mark.parametrize("digits", [0, MAX_GLUE_DIGITS + 1, -3])
def test_rounded_rejects_digits_out_of_range(digits):
    with pytest.raises(ValueError, match="digits"):
        _rounded(1.0, digits)


def test_rounded_rejects_bad_types():
    with pytest.raises(TypeError, match="digits"):
        _rounded(1.0, 2.5)
    with pytest.raises(TypeError, match="scalar"):
        _rounded(torch.ones(3))
    with pytest.raises(TypeError, match="number or a string"):
        _rounded([1.0, 2.0])


def test_glue_returns_none_so_a_cell_ending_in_glue_shows_nothing():
    assert sb.glue("x", 0.123456789) is None


def test_glue_records_the_rounded_value(monkeypatch):
    recorded = {}
    import myst_nb

    monkeypatch.setattr(
        myst_nb, "glue", lambda name, value, display: recorded.update({name: value})
    )
    sb.glue("ratio", 316.22776601683796)
    sb.glue("fine", 316.22776601683796, digits=6)
    sb.glue("count", 26800)
    assert recorded == {"ratio": 316.2, "fine": 316.228, "count": 26800}


def test_setup_notebook_seeds_and_returns_a_device():
    device = sb.setup_notebook(seed=3)
    a = torch.rand(3)
    sb.setup_notebook(seed=3)
    assert torch.equal(a, torch.rand(3)) and isinstance(device, torch.device)
