"""The book's figure style and figure helpers.

One look for every figure: an opaque white background (so figures stay
readable on the website's dark theme too), the colour-blind-safe Okabe-Ito
palette, and labels large enough to read on a phone. Every helper returns the
matplotlib ``Axes`` it drew on, so a caller can add to it.

Call :func:`use_style` once at the top of a notebook. matplotlib is imported
only when a figure is made or the style applied, so ``import bookkit``
costs a training script nothing for figures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # matplotlib is imported when a figure is made, not before
    import numpy.typing as npt
    import torch
    from matplotlib.axes import Axes

    #: What the helpers plot: a tensor of any dtype and device, or array-like data.
    Values = torch.Tensor | npt.ArrayLike

__all__ = [
    "PALETTE",
    "MIN_FONT_PT",
    "use_style",
    "plot_distribution",
    "plot_curves",
    "plot_heatmap",
]

#: Okabe and Ito's colour-blind-safe palette, without black (it vanishes in dark mode).
PALETTE = [
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#D55E00",
    "#CC79A7",
    "#56B4E9",
    "#F0E442",
    "#666666",
]

#: The smallest font size of any text in a figure, in points. The website shows
#: a figure at most 342 CSS px wide on a 390 px phone (measured, see
#: tests/book/_site_geometry.py), so text of ``pt`` points in a figure ``w``
#: points wide is ``pt * 342 / w`` CSS px: at the default 6-inch (432 pt) width
#: 12.5 pt is 9.9 px, and a 6.4-inch figure keeps 9.3 px, above the 9 px floor
#: the book holds every label to (tests/book/test_figures.py).
MIN_FONT_PT = 12.5

_STYLE: dict[str, Any] = {
    "figure.figsize": (6.0, 3.6),
    "figure.dpi": 100,
    "savefig.dpi": 100,
    "figure.facecolor": "white",
    "savefig.facecolor": "white",
    "axes.facecolor": "white",
    "axes.edgecolor": "#333333",
    "axes.labelcolor": "#222222",
    # Phone-legible sizes (see MIN_FONT_PT); "small" and friends scale from font.size.
    "font.size": 13.5,
    "axes.titlesize": 14,
    "axes.titleweight": "bold",
    "axes.labelsize": 13.5,
    "figure.titlesize": 14,
    "figure.labelsize": 13.5,
    "xtick.labelsize": MIN_FONT_PT + 0.5,
    "ytick.labelsize": MIN_FONT_PT + 0.5,
    "legend.fontsize": MIN_FONT_PT + 0.5,
    "legend.title_fontsize": MIN_FONT_PT + 0.5,
    "axes.grid": True,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "grid.color": "#dddddd",
    "grid.linewidth": 0.8,
    "legend.frameon": False,
    "xtick.color": "#333333",
    "ytick.color": "#333333",
    "lines.linewidth": 2.0,
    "image.cmap": "viridis",
    "figure.constrained_layout.use": True,
    # Math in labels is typeset by mathtext in the text's sans-serif look.
    "mathtext.fontset": "dejavusans",
    # SVG figures: text as glyph paths (the same on every screen, no font needed),
    # and the same bytes on every run (fixed ids; no date, see _SVG_METADATA).
    "svg.fonttype": "path",
    "svg.hashsalt": "softmaxbook",
}

#: What a notebook's SVG figures carry: no creation date, so their bytes are stable.
_SVG_METADATA = {"Date": None}


def use_style() -> None:
    """Apply the book's figure style to matplotlib (global, idempotent).

    In a notebook (IPython), figures are also shown as SVG: sharp at any
    screen resolution, with text at least :data:`MIN_FONT_PT` points.
    """
    import matplotlib as mpl
    import matplotlib.style
    from cycler import cycler  # matplotlib's own dependency

    matplotlib.style.use(_STYLE)  # typed to take a dict, where rcParams wants each key
    mpl.rcParams["axes.prop_cycle"] = cycler(color=PALETTE)
    _show_svg_in_notebooks()


def _show_svg_in_notebooks() -> None:
    """Make IPython's inline backend emit SVG (only when running under IPython)."""
    import sys

    if "IPython" not in sys.modules:  # a script or a test: nothing to configure
        return
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:  # IPython imported, but no shell running
        return
    from matplotlib_inline.backend_inline import set_matplotlib_formats

    set_matplotlib_formats("svg", metadata=_SVG_METADATA)


def _as_array(values: Values) -> np.ndarray:
    """A float64 NumPy array of ``values``: a tensor of any dtype, on any device."""
    if hasattr(values, "detach"):  # a torch tensor; NumPy has no bfloat16
        import torch

        return values.detach().to("cpu", torch.float64).numpy()
    return np.asarray(values, dtype=float)


def _axes(ax: Axes | None) -> Axes:
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt  # only when a figure is made

    return plt.subplots()[1]


def plot_distribution(
    values: Values,
    labels: Sequence[str] | None = None,
    *,
    ax: Axes | None = None,
    title: str = "",
    xlabel: str = "index",
    ylabel: str = "value",
    color: str | None = None,
    annotate: bool = True,
    fmt: str = "{:.3f}",
) -> Axes:
    """Bar chart of one vector, e.g. scores or the weights softmax makes of them.

    Parameters
    ----------
    values : array-like of shape (N,)
        The bar heights (a torch tensor is accepted).
    labels : sequence of str, optional
        Tick labels; defaults to ``0 .. N-1``.
    annotate : bool
        Write each value above its bar, formatted with ``fmt``.
    """
    v = _as_array(values)
    if v.ndim != 1:
        raise ValueError(f"values must be one-dimensional, got shape {v.shape}")
    ax = _axes(ax)
    x = np.arange(len(v))
    bars = ax.bar(x, v, color=color or PALETTE[0], width=0.7)
    ax.set_xticks(x, labels if labels is not None else [str(i) for i in x])
    ax.axhline(0, color="#333333", linewidth=0.8)
    if annotate:
        for bar, value in zip(bars, v):
            y = bar.get_height()
            ax.annotate(
                fmt.format(value),
                (bar.get_x() + bar.get_width() / 2, y),
                xytext=(0, 3 if y >= 0 else -12),
                textcoords="offset points",
                ha="center",
                fontsize=MIN_FONT_PT,
            )
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(axis="x", visible=False)
    return ax


def plot_curves(
    x: Values,
    curves: Mapping[str, Values],
    *,
    ax: Axes | None = None,
    title: str = "",
    xlabel: str = "x",
    ylabel: str = "y",
    logx: bool = False,
    logy: bool = False,
    markers: bool = False,
    legend_title: str | None = None,
) -> Axes:
    """Line plot of a family of curves that share one x axis.

    Parameters
    ----------
    x : array-like of shape (N,)
    curves : mapping from label to array-like of shape (N,)
        One line per entry, in the palette's order.
    """
    ax = _axes(ax)
    for label, y in curves.items():
        ax.plot(
            x,
            _as_array(y),
            label=label,
            marker="o" if markers else None,
            markersize=4,
        )
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if len(curves) > 1:
        ax.legend(title=legend_title)
    return ax


def plot_heatmap(
    matrix: Values,
    *,
    ax: Axes | None = None,
    title: str = "",
    xlabel: str = "key position",
    ylabel: str = "query position",
    cmap: str = "viridis",
    vmin: float | None = None,
    vmax: float | None = None,
    annotate: bool = False,
    fmt: str = "{:.2f}",
    colorbar: bool = True,
) -> Axes:
    """Heatmap of a 2-D matrix: attention weights, a mask, a Jacobian.

    Parameters
    ----------
    matrix : array-like of shape (L, S)
        A boolean matrix is drawn as 1 (True) and 0 (False).
    annotate : bool
        Write each value in its cell (for small matrices).
    """
    m = _as_array(matrix)
    if m.ndim != 2:
        raise ValueError(f"matrix must be two-dimensional, got shape {m.shape}")
    ax = _axes(ax)
    image = ax.imshow(
        m, cmap=cmap, vmin=vmin, vmax=vmax, aspect="equal", interpolation="nearest"
    )
    ax.grid(False)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if m.shape[1] <= 16:
        ax.set_xticks(range(m.shape[1]))
    if m.shape[0] <= 16:
        ax.set_yticks(range(m.shape[0]))
    if annotate:
        lo, hi = np.nanmin(m), np.nanmax(m)
        mid = (lo + hi) / 2
        for (i, j), value in np.ndenumerate(m):
            ax.text(
                j,
                i,
                fmt.format(value),
                ha="center",
                va="center",
                fontsize=MIN_FONT_PT,
                color="white" if value < mid else "black",
            )
    if colorbar:
        ax.figure.colorbar(image, ax=ax, shrink=0.8)
    return ax
