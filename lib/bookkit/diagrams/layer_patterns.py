"""Which keys each kind of layer sees in the models of 2025, and how they stack.

:func:`draw_layer_masks` draws the masks of four kinds of attention layer,
each computed by the library's own mask functions
(``softmaxbook.sliding_window_mask``, ``chunked_mask``, ``causal_mask``,
``document_mask``): a banded layer with a sink logit (gpt-oss), a chunked
layer (Llama 4's RoPE layers), a full causal layer (gpt-oss's dense layers,
Llama 4's NoPE layers) and packed documents. :func:`draw_layer_stacks`
draws the first layers of a few models as a row of coloured boxes, one per
layer kind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

import softmaxbook as sb

from ._draw import INK, MUTED, PALETTE, box, canvas, cells, text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["layer_masks", "draw_layer_masks", "LAYER_COLORS", "draw_layer_stacks"]

#: One colour per layer kind, shared by both diagrams.
LAYER_COLORS = {
    "banded": PALETTE[0],
    "chunked": PALETTE[2],
    "full": PALETTE[1],
    "NoPE": PALETTE[3],
}


def layer_masks(
    n: int = 12,
    *,
    window: int = 4,
    chunk: int = 4,
    documents: Sequence[int] = (5, 3, 4),
) -> dict[str, Any]:
    """The four ``(n, n)`` boolean masks of :func:`draw_layer_masks`, titled."""
    ids = sb.document_ids(list(documents), n)
    return {
        f"banded ($w$ = {window}) + sink": sb.sliding_window_mask(n, window=window),
        f"chunked ($c$ = {chunk})": sb.chunked_mask(n, chunk=chunk),
        "full causal": sb.causal_mask(n),
        "packed " + " + ".join(map(str, documents)): sb.document_mask(ids, causal=True),
    }


def draw_layer_masks(
    n: int = 12,
    *,
    window: int = 4,
    chunk: int = 4,
    documents: Sequence[int] = (5, 3, 4),
    title: str = "Which keys each query sees",
) -> Figure:
    """Banded (with a sink column), chunked, full and packed masks, 2 x 2.

    Rows are queries ``i`` (top to bottom), columns keys ``j``; a coloured
    cell may attend, a grey one may not. The banded panel has one more
    column, the sink logit ``b``, which every query of a gpt-oss head sees
    and whose weight is dropped (drawn hatched, apart from the keys).
    """
    from matplotlib.patches import Rectangle

    masks = layer_masks(n, window=window, chunk=chunk, documents=documents)
    colors = [LAYER_COLORS["banded"], LAYER_COLORS["chunked"], LAYER_COLORS["full"]]
    colors.append(LAYER_COLORS["full"])
    gap, top, side = 3.2, 2.2, 1.4
    width = side + 2 * n + gap + 1.8
    height = 2 * (n + top) + 1.6
    fig, ax = canvas(width, height, figsize=(6.4, 6.4 * height / width), title=title)
    for k, (name, mask) in enumerate(masks.items()):
        row, col = divmod(k, 2)
        x = side + col * (n + gap)
        y = 1.0 + (1 - row) * (n + top)
        cells(ax, mask.numpy(), x, y, on=colors[k], off=MUTED)
        text(ax, x + n / 2, y + n + 0.6, name)
        if k == 0:  # the sink column: one more logit per row, no value
            sx = x + n + 0.4
            for i in range(n):
                ax.add_patch(
                    Rectangle(
                        (sx, y + i),
                        1,
                        1,
                        facecolor="white",
                        edgecolor=INK,
                        hatch="///",
                        linewidth=0.8,
                    )
                )
            text(ax, sx + 0.5, y - 0.6, "$b$")
        if col == 0:
            text(ax, x - 0.6, y + n / 2, "query $i$", rotation=90)
        if row == 1:
            text(ax, x + n / 2, y - 0.6, "key $j$")
    return fig


def draw_layer_stacks(
    stacks: Mapping[str, Sequence[str]],
    *,
    title: str = "The first layers of three models",
) -> Figure:
    """One row of boxes per model, one box per layer, coloured by its kind.

    ``stacks`` maps a model's name to its layer kinds in order (keys of
    :data:`LAYER_COLORS`, e.g. ``"banded"``, ``"full"``, ``"chunked"``,
    ``"NoPE"``); each box is labelled with the
    kind's first letter, and a legend names the kinds used.
    """
    n = max(len(kinds) for kinds in stacks.values())
    step, w_box, h_box = 1.0, 0.86, 0.9
    left = 3.6
    width = left + n * step + 0.2
    rows = len(stacks)
    used = list(dict.fromkeys(k for kinds in stacks.values() for k in kinds))
    legend_rows = int(np.ceil(len(used) / 3))
    height = rows * 1.5 + 1.4 + legend_rows * 0.9
    fig, ax = canvas(width, height, figsize=(6.4, 6.4 * height / width), title=title)
    y0 = height - 1.6
    for r, (model, kinds) in enumerate(stacks.items()):
        y = y0 - r * 1.5
        text(ax, left - 0.3, y + h_box / 2, model, ha="right", fontsize=12.5)
        for k, kind in enumerate(kinds):
            box(
                ax,
                left + k * step,
                y,
                w_box,
                h_box,
                kind[0].upper() if kind != "NoPE" else "N",
                color=LAYER_COLORS[kind],
                fill=0.45,
                fontsize=12.5,
            )
    text(ax, left + n * step / 2, y0 - rows * 1.5 + 1.0, "layer 1, 2, 3, ...")
    for m, kind in enumerate(used):
        lr, lc = divmod(m, 3)
        lx = 0.3 + lc * (width - 0.3) / 3
        ly = 0.35 + (legend_rows - 1 - lr) * 0.9
        box(ax, lx, ly, 0.5, 0.5, color=LAYER_COLORS[kind], fill=0.45, rounded=False)
        text(ax, lx + 0.7, ly + 0.25, kind, ha="left", fontsize=12.5)
    return fig
