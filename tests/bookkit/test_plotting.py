"""bookkit.plotting: the figure helpers draw what they are given, in any dtype."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # no display in tests

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

import bookkit as bk


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16], ids=str
)
def test_plot_distribution_draws_the_values_in_any_dtype(dtype):
    values = torch.tensor([0.25, 0.5, 0.125, 0.125], dtype=dtype)
    ax = bk.plot_distribution(values, title="weights", xlabel="key", ylabel="weight")
    heights = [bar.get_height() for bar in ax.patches]
    np.testing.assert_array_equal(heights, [0.25, 0.5, 0.125, 0.125])  # exact in bf16
    assert ax.get_title() == "weights" and ax.get_xlabel() == "key"
    assert [t.get_text() for t in ax.texts] == ["0.250", "0.500", "0.125", "0.125"]


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16, torch.bool], ids=str
)
def test_plot_heatmap_draws_the_matrix_in_any_dtype(dtype):
    matrix = torch.tensor([[1.0, 0.0, 0.5], [0.25, 1.0, 0.0]]).to(dtype)
    ax = bk.plot_heatmap(matrix, title="map", annotate=True)
    drawn = ax.images[0].get_array()
    np.testing.assert_array_equal(np.asarray(drawn), matrix.float().numpy())
    assert ax.get_title() == "map" and ax.get_ylabel() == "query position"
    assert len(ax.texts) == 6


def test_plot_curves_one_line_per_curve_with_a_legend():
    ax = bk.plot_curves([1, 2, 3], {"a": [1, 2, 3], "b": torch.tensor([3.0, 2.0, 1.0])})
    assert [line.get_label() for line in ax.lines] == ["a", "b"]
    np.testing.assert_array_equal(ax.lines[1].get_ydata(), [3.0, 2.0, 1.0])
    assert ax.get_legend() is not None


def test_use_style_sets_the_palette():
    bk.use_style()
    colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    assert colors == bk.PALETTE
    assert matplotlib.rcParams["figure.facecolor"] == "white"


def test_shape_errors():
    with pytest.raises(ValueError, match="one-dimensional"):
        bk.plot_distribution(torch.zeros(2, 2))
    with pytest.raises(ValueError, match="two-dimensional"):
        bk.plot_heatmap(torch.zeros(3))


def test_use_style_makes_phone_legible_deterministic_svg():
    """Every font size the style sets is at least MIN_FONT_PT, text is drawn as
    paths with mathtext, and two SVG renders of one figure are the same bytes."""
    import io

    from matplotlib.font_manager import FontProperties

    bk.use_style()
    rc = matplotlib.rcParams
    assert rc["svg.fonttype"] == "path" and rc["svg.hashsalt"]
    assert rc["mathtext.fontset"] != "custom"
    keys = [k for k in rc if k.endswith(("size", "labelsize", "fontsize"))]
    keys = [k for k in keys if "font" in k or "label" in k or "title" in k]
    sizes = {k: FontProperties(size=rc[k]).get_size_in_points() for k in keys}
    assert min(sizes.values()) >= bk.plotting.MIN_FONT_PT, sizes
    # 12.5 pt in a 6.4-inch (460.8 pt) figure shown 342 CSS px wide is >= 9 px
    assert bk.plotting.MIN_FONT_PT * 342 / 460.8 >= 9
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, -2], label=r"$\sqrt{d_k}$")
    ax.legend()
    svgs = []
    for _ in range(2):
        buf = io.BytesIO()
        fig.savefig(buf, format="svg", metadata=bk.plotting._SVG_METADATA)
        svgs.append(buf.getvalue())
    assert svgs[0] == svgs[1]
    assert b"<dc:date>" not in svgs[0] and b"<text" not in svgs[0]


def test_use_style_switches_a_notebook_kernel_to_svg(monkeypatch):
    """Under an IPython shell, use_style selects the inline backend's SVG output."""
    import sys

    pytest.importorskip("matplotlib_inline")
    calls = []
    import matplotlib_inline.backend_inline as inline

    monkeypatch.setattr(
        inline, "set_matplotlib_formats", lambda *f, **k: calls.append((f, k))
    )
    ipython = pytest.importorskip("IPython")
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    monkeypatch.setattr(ipython, "get_ipython", lambda: object())
    bk.use_style()
    assert calls == [(("svg",), {"metadata": {"Date": None}})]
    monkeypatch.setattr(ipython, "get_ipython", lambda: None)
    bk.use_style()  # a plain Python process: nothing selected
    assert len(calls) == 1
