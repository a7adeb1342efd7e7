"""Masks drawn as grids of cells, and a stack of local and global layers.

Every grid is computed by the library's own mask functions
(``softmaxbook.causal_mask``, ``padding_mask``, ``sliding_window_mask``,
``document_mask``), so the picture is the mask the code applies: a blue cell
is a query-key pair that may attend, a grey cell one that may not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import softmaxbook as sb

from ._draw import INK, MUTED, PALETTE, box, canvas, cells, text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "gallery_masks",
    "draw_mask_gallery",
    "draw_interleaved_layers",
    "draw_mask_representations",
]


def gallery_masks(
    n: int = 8,
    *,
    length: int = 6,
    window: int = 3,
    documents: Sequence[int] = (3, 3, 2),
) -> dict[str, Any]:
    """The four ``(n, n)`` boolean masks of the gallery, titled, from the library."""
    key_mask = sb.padding_mask([length], n)[0]  # (n,): True on real tokens
    return {
        "causal": sb.causal_mask(n),
        f"padding (length {length} of {n})": key_mask.expand(n, n),
        f"sliding window ($w$ = {window})": sb.sliding_window_mask(n, window=window),
        "documents " + " + ".join(map(str, documents)): sb.document_mask(
            sb.document_ids(list(documents), n), causal=True
        ),
    }


def draw_mask_gallery(
    n: int = 8,
    *,
    length: int = 6,
    window: int = 3,
    documents: Sequence[int] = (3, 3, 2),
    title: str = "Four attention masks",
) -> Figure:
    """Causal, padding, sliding-window and document masks in a 2 x 2 grid.

    Rows are queries ``i`` (top to bottom), columns keys ``j`` (left to
    right); blue cells may attend.
    """
    masks = gallery_masks(n, length=length, window=window, documents=documents)
    gap, top, side = 3.0, 1.6, 1.4
    width = side + 2 * n + gap + 0.4
    height = 2 * (n + top) + 1.6
    fig, ax = canvas(width, height, figsize=(6.4, 6.4 * height / width), title=title)
    for k, (name, mask) in enumerate(masks.items()):
        row, col = divmod(k, 2)
        x = side + col * (n + gap)
        y = 1.0 + (1 - row) * (n + top)
        cells(ax, mask.numpy(), x, y, on=PALETTE[0], off=MUTED)
        text(ax, x + n / 2, y + n + 0.6, name)
        if col == 0:
            text(ax, x - 0.6, y + n / 2, "query $i$", rotation=90)
        if row == 1:
            text(ax, x + n / 2, y - 0.6, "key $j$")
    return fig


def draw_interleaved_layers(
    layer_types: Sequence[str],
    *,
    window: int,
    context: int,
    title: str = "Local and global layers",
) -> Figure:
    """A stack of attention layers, left to right, and each one's KV cache.

    ``layer_types`` holds ``"local"`` (sliding window of ``window`` keys) or
    ``"global"`` (all earlier keys) per layer. Under each layer a bar shows
    the keys and values it must keep at ``context`` tokens: ``min(context,
    window)`` for a local layer, ``context`` for a global one.
    """
    n = len(layer_types)
    step, w_box, bar_h = 1.1, 0.9, 3.6
    left = 0.3
    width = left + n * step + 0.2
    height = 9.4
    fig, ax = canvas(width, height, figsize=(6.4, 6.4 * height / width), title=title)
    local_c, global_c = PALETTE[0], PALETTE[1]
    for k, kind in enumerate(layer_types):
        x = left + k * step
        color = local_c if kind == "local" else global_c
        box(
            ax,
            x,
            6.4,
            w_box,
            1.2,
            "L" if kind == "local" else "G",
            color=color,
            fill=0.35,
            fontsize=11,
        )
        text(ax, x + w_box / 2, 6.05, str(k + 1), fontsize=9)
        cached = min(context, window) if kind == "local" else context
        h = max(bar_h * cached / context, 0.06)
        box(ax, x + 0.15, 1.3, w_box - 0.3, h, color=color, fill=0.8, rounded=False)
        label = f"{cached // 1024}K"
        text(ax, x + w_box / 2, 1.3 + h + 0.3, label, fontsize=9)
    text(
        ax,
        width / 2,
        0.8,
        f"keys and values cached per layer at {context:,} tokens",
        fontsize=10,
    )
    text(ax, width / 2, 5.55, "layer", fontsize=10)
    # legend
    box(ax, left, 8.25, 0.5, 0.5, color=local_c, fill=0.35, rounded=False)
    text(
        ax,
        left + 0.7,
        8.5,
        f"L: local, the last {window:,} keys",
        ha="left",
        fontsize=10,
    )
    gx = left + n * step / 2 + 0.6
    box(ax, gx, 8.25, 0.5, 0.5, color=global_c, fill=0.35, rounded=False)
    text(
        ax,
        gx + 0.7,
        8.5,
        "G: global, all earlier keys",
        ha="left",
        fontsize=10,
        color=INK,
    )
    return fig


def draw_mask_representations(
    mask: Any,
    lts: Any,
    lte: Any,
    computed: Any,
    full: Any,
    *,
    block: int,
    title: str = "One mask, two compact forms",
) -> Figure:
    """A causal mask as FlashMask's column intervals and as a block mask's tiles.

    Left: the ``(n, n)`` boolean ``mask``; cells on or below the diagonal that
    it hides are orange, and under each column ``j`` are ``LTS_j`` and
    ``LTE_j``, the hidden rows ``[LTS_j, LTE_j)``. Right: the tiles of
    ``block x block`` pairs, from the block mask's ``computed`` and ``full``
    maps: skipped, partial (the mask is evaluated inside) or full.
    """
    import numpy as np

    grid = np.asarray(mask, dtype=bool)
    n = grid.shape[0]
    below = np.tril(np.ones((n, n), dtype=bool))
    colors = np.where(grid, PALETTE[0], np.where(below, PALETTE[1], MUTED))
    # the tiles are drawn at 0.6 scale, so that the left grid's cells are wide
    # enough for the two-digit LTS and LTE at a phone-legible size
    side, gap, bottom = 1.9, 2.0, 2.6
    tiles = n // block
    tile = 0.6 * block
    width = side + n + gap + tiles * tile + 0.3
    height = n + bottom + 1.4
    fig, ax = canvas(width, height, figsize=(6.4, 6.4 * height / width), title=title)
    cells(ax, colors, side, bottom)
    text(
        ax,
        side + n / 2,
        bottom + n + 0.6,
        "FlashMask: hidden rows per column",
        fontsize=10,
    )
    text(ax, side - 0.9, bottom + n / 2, "query $i$", rotation=90)
    for name, values, y in (("LTS", lts, bottom - 0.6), ("LTE", lte, bottom - 1.5)):
        values = values.tolist() if hasattr(values, "tolist") else list(values)
        text(ax, side - 0.25, y, name, ha="right")
        if len(set(values)) == 1:  # one number for every column: say it once
            text(ax, side + n / 2, y, f"{values[0]} in every column")
            continue
        for j, v in enumerate(values):
            text(ax, side + j + 0.5, y, str(v))
    text(ax, side + n / 2, bottom - 2.3, "key $j$")
    comp = np.asarray(computed, dtype=bool).reshape(n // block, n // block)
    ful = np.asarray(full, dtype=bool).reshape(n // block, n // block)
    x0 = side + n + gap
    tile_colors = np.where(ful, PALETTE[0], np.where(comp, "#9ecae1", MUTED))
    yb = bottom + n - tiles * tile  # the tiles' top aligned with the grid's
    cells(ax, tile_colors, x0, yb, size=tile)
    for r in range(comp.shape[0]):
        for c in range(comp.shape[1]):
            label = "full" if ful[r, c] else ("partial" if comp[r, c] else "skip")
            text(
                ax,
                x0 + (c + 0.5) * tile,
                yb + (comp.shape[0] - r - 0.5) * tile,
                label,
                fontsize=10,
            )
    text(
        ax,
        x0 + tiles * tile / 2,
        bottom + n + 0.6,
        f"block mask: {block} $\\times$ {block} tiles",
    )
    text(ax, x0 + tiles * tile / 2, yb - 0.6, "key block")
    text(ax, x0 - 0.6, yb + tiles * tile / 2, "query block", rotation=90)
    return fig
