"""The notebook helpers: one-line setup, and glued numbers rounded to what they can
support."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import torch

import bookkit as bk
import softmaxbook as sb
from bookkit.notebook import MAX_GLUE_DIGITS, _rounded, require


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
    assert bk.glue("x", 0.123456789) is None


def test_glue_records_the_rounded_value(monkeypatch):
    recorded = {}
    # myst-nb comes with the book (requirements.txt), not with the library.
    myst_nb = pytest.importorskip("myst_nb")

    monkeypatch.setattr(
        myst_nb, "glue", lambda name, value, display: recorded.update({name: value})
    )
    bk.glue("ratio", 316.22776601683796)
    bk.glue("fine", 316.22776601683796, digits=6)
    bk.glue("count", 26800)
    assert recorded == {"ratio": 316.2, "fine": 316.228, "count": 26800}


def test_setup_notebook_seeds_and_returns_a_device():
    device = bk.setup_notebook(seed=3)
    a = torch.rand(3)
    bk.setup_notebook(seed=3)
    assert torch.equal(a, torch.rand(3)) and isinstance(device, torch.device)


# ---------------------------------------------------------------- optional packages


def _without(monkeypatch, *names):
    """Pretend that the packages ``names`` are not installed."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name in names else find_spec(name, *args),
    )


def test_setup_notebook_names_a_missing_package_why_and_the_install_line(monkeypatch):
    _without(monkeypatch, "entmax")
    with pytest.raises(ImportError) as error:
        bk.setup_notebook(seed=0, requires=("entmax", "torch"))
    message = str(error.value)
    assert message.startswith(
        "This notebook needs the package entmax, which is not installed"
    )
    # why chapter 6 needs it, and the lines that install it, in a cell and a terminal
    assert "Why entmax: chapter 6 checks softmaxbook's sparsemax and entmax" in message
    assert "%pip install entmax\n" in message
    assert 'pip install "softmaxbook[book]"' in message
    assert "torch" not in message.split("\n")[0]  # only what is missing
    assert error.value.name == "entmax"


def test_require_lists_every_missing_package(monkeypatch):
    _without(monkeypatch, "entmax", "tqdm", "no_such_package")
    with pytest.raises(ImportError, match="entmax and tqdm and no_such_package") as e:
        bk.setup_notebook(requires=["entmax", "tqdm", "no_such_package"])
    message = str(e.value)
    assert "%pip install entmax tqdm no_such_package" in message
    assert "Why tqdm: the case study" in message
    assert "Why no_such_package" not in message
    with pytest.raises(ImportError, match="train needs the package tqdm"):
        require("tqdm", needed_by="train")


def test_require_without_a_known_package_gives_only_the_install_line(monkeypatch):
    _without(monkeypatch, "no_such_package")
    with pytest.raises(ImportError) as e:
        require("no_such_package")
    assert "%pip install no_such_package" in str(e.value)
    assert "softmaxbook[book]" not in str(e.value)


def test_setup_notebook_with_installed_requirements_returns_the_device():
    assert bk.setup_notebook(seed=0, requires=("numpy", "torch")) == sb.get_device()
    assert bk.setup_notebook(seed=0, requires="numpy") == sb.get_device()  # one name
    with pytest.raises(TypeError, match="names of packages"):
        bk.setup_notebook(requires=(1,))


def test_train_with_a_progress_bar_says_how_to_get_tqdm(monkeypatch):
    _without(monkeypatch, "tqdm")
    data = sb.make_associative_recall(8, n_pairs=2, n_keys=2, n_values=2)
    model = sb.TinyTransformer(4, 5, d_model=8, n_heads=2, n_layers=1)
    hint = r"(?s)train\(progress=True\) needs the package tqdm.*softmaxbook\[book\]"
    with pytest.raises(ImportError, match=hint):
        bk.train(model, data, steps=1, progress=True, track_attention=False)
