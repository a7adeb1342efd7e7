"""Which layers of each 2024-2026 model run a softmax over the whole prefix.

:func:`layer_kinds` turns a row of the what-ships table
(:mod:`bookkit.models_table`) into one kind per layer: ``"full"`` (softmax over
the whole causal prefix), ``"window"`` (a sliding or banded window),
``"chunk"`` (a fixed chunk) or ``"linear"`` (a linear-attention layer with no
softmax). :func:`draw_layer_kinds` draws one strip per model, one thin bar per
layer, coloured by kind, from the data file's own counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..models_table import ModelRow
from ._draw import INK, PALETTE, box, canvas, text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["KIND_COLORS", "layer_kinds", "draw_layer_kinds"]

#: One colour per layer kind.
KIND_COLORS = {
    "full": PALETTE[1],
    "window": PALETTE[0],
    "chunk": PALETTE[2],
    "linear": PALETTE[3],
}


def layer_kinds(row: ModelRow) -> list[str]:
    """One kind per layer of ``row``: its ``full_layers`` spread with a fixed period.

    The full layers come every ``round(layers / full_layers)`` layers, last in
    each period (gpt-oss: every 2nd; Gemma 3: every 6th; Llama 4, Qwen3-Next,
    Kimi Linear: every 4th; MiniMax-Text-01: every 8th), as their configs place
    them; the other layers are ``"linear"`` in a linear hybrid, ``"chunk"`` where
    the window cell names chunks, ``"window"`` otherwise.

    Raises
    ------
    ValueError
        If ``layers`` or ``full_layers`` is "not found", or the period does not
        reproduce ``full_layers``.
    """
    if not (row.known("layers") and row.known("full_layers")):
        raise ValueError(f"row: {row.model} lacks layers or full_layers")
    n, full = int(row.values["layers"]), int(row.values["full_layers"])
    if full == n:
        return ["full"] * n
    if row.values["attention"] == "linear hybrid":
        other = "linear"
    elif "chunk" in str(row.values["window"]):
        other = "chunk"
    else:
        other = "window"
    period = round(n / full)
    kinds = ["full" if i % period == period - 1 else other for i in range(n)]
    if kinds.count("full") != full:
        raise ValueError(
            f"row: {row.model}'s {full} full layers do not repeat every {period}"
        )
    return kinds


def draw_layer_kinds(rows: Sequence[ModelRow]) -> Figure:
    """One strip per model, one bar per layer, coloured by :func:`layer_kinds`."""
    rows = [r for r in rows if r.known("layers") and r.known("full_layers")]
    if not rows:
        raise ValueError("rows: no row has both layers and full_layers")
    deepest = max(int(r.values["layers"]) for r in rows)
    label_w, gap = 26.0, 1.0
    width = label_w + deepest + 2
    pitch = 5.6
    legend_h = 11.0
    height = pitch * len(rows) + legend_h
    fig, ax = canvas(width, height, figsize=(6.4, 6.4 * height / width))
    for j, row in enumerate(rows):
        y = height - legend_h - (j + 1) * pitch + 0.6
        text(ax, label_w - gap, y + 1.5, row.model, ha="right")
        for i, kind in enumerate(layer_kinds(row)):
            box(
                ax,
                label_w + i,
                y,
                0.8,
                3.0,
                color=KIND_COLORS[kind],
                fill=1.0 if kind == "full" else 0.45,
                rounded=False,
            )
    # legend: two rows of two
    names = {
        "full": "full causal softmax",
        "window": "sliding window",
        "chunk": "chunked",
        "linear": "linear (no softmax)",
    }
    for k, kind in enumerate(KIND_COLORS):
        x = 2 + (k % 2) * (width / 2)
        y = height - 3.0 - (k // 2) * 4.6
        box(
            ax,
            x,
            y - 1.2,
            2.4,
            2.4,
            color=KIND_COLORS[kind],
            fill=1.0 if kind == "full" else 0.45,
        )
        text(ax, x + 3.6, y, names[kind], ha="left", color=INK)
    return fig
