"""Primitives the diagrams share: a blank canvas, boxes, arrows, grids of cells.

Coordinates are data units on an axes with equal aspect and no ticks, so a
diagram is laid out like a drawing on squared paper. Colours come from the
book's palette (``bookkit.PALETTE``) on an opaque white
background, which reads the same in the website's light and dark modes.
Text is at least :data:`bookkit.plotting.MIN_FONT_PT` (12.5) points and a
diagram at most 6.4 inches wide, so that shown 342 px wide on a 390 px phone
every label is at least 9 CSS px; math is written in mathtext (``r"$z_j$"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..plotting import MIN_FONT_PT, PALETTE, use_style

if TYPE_CHECKING:  # matplotlib is imported when a figure is made
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
    from matplotlib.text import Text

__all__ = ["PALETTE", "INK", "MUTED", "canvas", "box", "arrow", "text", "cells"]

#: Dark grey for outlines and text (pure black vanishes on a dark page edge).
INK = "#222222"
#: Light grey for what is off, masked or not computed.
MUTED = "#d9d9d9"
#: No text in a diagram is smaller (points).
MIN_FONTSIZE = MIN_FONT_PT


def canvas(
    width: float,
    height: float,
    *,
    figsize: tuple[float, float] = (6.4, 3.2),
    title: str = "",
) -> tuple[Figure, Axes]:
    """A figure with one blank axes spanning ``[0, width] x [0, height]``.

    The y axis points up; the aspect is equal, so a unit square looks square.
    """
    import matplotlib.pyplot as plt

    use_style()
    fig, ax = plt.subplots(figsize=figsize)
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.set_aspect("equal")
    ax.axis("off")
    if title:
        ax.set_title(title)
    return fig, ax


def box(
    ax: Axes,
    x: float,
    y: float,
    w: float,
    h: float,
    label: str = "",
    *,
    color: str = PALETTE[0],
    fill: float = 0.18,
    fontsize: float = 13,
    textcolor: str = INK,
    rounded: bool = True,
) -> FancyBboxPatch:
    """A labelled box with its lower-left corner at ``(x, y)``; returns the patch."""
    from matplotlib.patches import FancyBboxPatch

    style = "round,pad=0,rounding_size=0.12" if rounded else "square,pad=0"
    patch = FancyBboxPatch(
        (x, y),
        w,
        h,
        boxstyle=style,
        linewidth=1.4,
        edgecolor=color,
        facecolor=_tint(color, fill),
    )
    ax.add_patch(patch)
    if label:
        ax.text(
            x + w / 2,
            y + h / 2,
            label,
            ha="center",
            va="center",
            fontsize=max(fontsize, MIN_FONTSIZE),
            color=textcolor,
        )
    return patch


def arrow(
    ax: Axes,
    start: tuple[float, float],
    end: tuple[float, float],
    label: str = "",
    *,
    color: str = INK,
    fontsize: float = 12.5,
    offset: tuple[float, float] = (0, 0.15),
    style: str = "-|>",
    linestyle: str = "-",
) -> FancyArrowPatch:
    """An arrow from ``start`` to ``end``, with ``label`` at its middle (shifted by
    ``offset``)."""
    from matplotlib.patches import FancyArrowPatch

    patch = FancyArrowPatch(
        start,
        end,
        arrowstyle=style,
        mutation_scale=12,
        linewidth=1.3,
        color=color,
        linestyle=linestyle,
        shrinkA=2,
        shrinkB=2,
    )
    ax.add_patch(patch)
    if label:
        mx, my = (start[0] + end[0]) / 2, (start[1] + end[1]) / 2
        ax.text(
            mx + offset[0],
            my + offset[1],
            label,
            ha="center",
            va="bottom",
            fontsize=max(fontsize, MIN_FONTSIZE),
            color=color,
        )
    return patch


def text(
    ax: Axes,
    x: float,
    y: float,
    s: str,
    *,
    fontsize: float = 13,
    color: str = INK,
    **kwargs: Any,
) -> Text:
    """Text at ``(x, y)``, centred unless ``ha``/``va`` say otherwise."""
    kwargs.setdefault("ha", "center")
    kwargs.setdefault("va", "center")
    return ax.text(x, y, s, fontsize=max(fontsize, MIN_FONTSIZE), color=color, **kwargs)


def cells(
    ax: Axes,
    values: Any,
    x: float = 0.0,
    y: float = 0.0,
    *,
    size: float = 1.0,
    on: str = PALETTE[0],
    off: str = MUTED,
    labels: Sequence[str] | None = None,
    fontsize: float = 12.5,
) -> tuple[int, ...]:
    """A grid of square cells, row 0 at the top, lower-left corner at ``(x, y)``.

    ``values`` is a 2-D boolean array (a mask: True drawn in ``on``, False in
    ``off``) or a 2-D array of colour strings. ``labels``, if given, is one
    string per cell in row-major order, written in the cell.
    """
    from matplotlib.patches import Rectangle

    grid = np.asarray(values)
    rows, cols = grid.shape
    for i in range(rows):
        for j in range(cols):
            v = grid[i, j]
            color = v if isinstance(v, str) else (on if bool(v) else off)
            ax.add_patch(
                Rectangle(
                    (x + j * size, y + (rows - 1 - i) * size),
                    size,
                    size,
                    facecolor=color,
                    edgecolor="white",
                    linewidth=1.0,
                )
            )
            if labels is not None:
                ax.text(
                    x + (j + 0.5) * size,
                    y + (rows - 1 - i + 0.5) * size,
                    labels[i * cols + j],
                    ha="center",
                    va="center",
                    fontsize=max(fontsize, MIN_FONTSIZE),
                    color=INK,
                )
    return grid.shape


def _tint(color: str, amount: float) -> tuple[float, float, float]:
    """``color`` mixed with white: ``amount`` 1 is the colour, 0 is white."""
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(color)
    return (1 - amount * (1 - r), 1 - amount * (1 - g), 1 - amount * (1 - b))
