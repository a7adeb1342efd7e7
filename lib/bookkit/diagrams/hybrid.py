"""Hybrid stacks: which layers of a model keep softmax attention.

:func:`draw_hybrid_stacks` draws each model's layers as a grid of cells in
reading order (left to right, then down), one cell per layer, coloured by the
kind of its token mixer: a linear-attention layer (a fixed-size recurrent
state) or a softmax layer (a KV cache that grows with the context). The
layer lists come from the models' configurations, built on the page.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ._draw import PALETTE, canvas, cells, text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["HYBRID_COLORS", "draw_hybrid_stacks"]

#: One colour per layer kind.
HYBRID_COLORS = {"linear": PALETTE[0], "softmax": PALETTE[1]}


def draw_hybrid_stacks(
    stacks: Mapping[str, Sequence[str]],
    *,
    per_row: int = 16,
    title: str = "Linear and softmax layers, in order",
) -> Figure:
    """One grid per model, one cell per layer, ``per_row`` layers a row.

    ``stacks`` maps a model's name to its layer kinds in order, each
    ``"linear"`` or ``"softmax"``. Each grid is titled with the model's name
    and its counts; a legend names the two kinds.
    """
    bad = {k for kinds in stacks.values() for k in kinds} - set(HYBRID_COLORS)
    if bad:
        raise ValueError(
            f"layer kinds must be 'linear' or 'softmax', got {sorted(bad)}"
        )
    left, gap_title, gap_model = 0.4, 1.3, 0.9
    grids = {}
    for model, kinds in stacks.items():
        n = len(kinds)
        rows = int(np.ceil(n / per_row))
        colors = np.full((rows, per_row), "white", dtype=object)
        for i, kind in enumerate(kinds):
            colors[divmod(i, per_row)] = HYBRID_COLORS[kind]
        grids[model] = colors
    height = sum(g.shape[0] + gap_title + gap_model for g in grids.values()) + 1.4
    width = left + per_row + 0.4
    fig, ax = canvas(width, height, figsize=(6.4, 6.4 * height / width), title=title)
    y = height
    for model, grid in grids.items():
        kinds = list(stacks[model])
        n_soft, n_lin = kinds.count("softmax"), kinds.count("linear")
        counts = f"{n_lin} linear + {n_soft} softmax" if n_lin else f"{n_soft} softmax"
        y -= gap_title
        text(ax, left, y + 0.45, f"{model}: {counts}", ha="left", fontsize=12)
        rows = grid.shape[0]
        y -= rows
        cells(ax, grid.tolist(), left, y)
        y -= gap_model
    for m, (kind, color) in enumerate(HYBRID_COLORS.items()):
        lx = left + m * per_row / 2
        cells(ax, [[color]], lx, 0.25, size=0.7)
        label = "linear (fixed state)" if kind == "linear" else "softmax (KV cache)"
        text(ax, lx + 1.0, 0.6, label, ha="left", fontsize=12)
    return fig
