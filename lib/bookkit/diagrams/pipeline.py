r"""The attention pipeline: from queries and keys to the output, with shapes.

One vertical column of steps, so that it stays legible at phone width:
``Q`` and ``K`` make the scores ``Q K^T``, which are scaled by :math:`1/\sqrt{d_k}`,
masked, normalized row by row by the softmax, and multiply ``V``. Every arrow
carries the shape of the tensor that flows along it, in the book's naming
(batch ``B``, heads ``H``, queries ``L``, keys ``S``; the shapes' head
dimension is the code letter ``D`` (:math:`d_k` in the math), the value
dimension ``Dv``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from bookkit.diagrams._draw import INK, PALETTE, arrow, box, canvas, cells, text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["draw_attention_pipeline"]


def draw_attention_pipeline(
    mask: Any = None,
    *,
    normalizer: str = "softmax",
    title: str = "Scaled dot-product attention",
) -> Figure:
    """Draw the attention pipeline as a column of steps, with tensor shapes.

    Parameters
    ----------
    mask : array-like of bool, shape (L, S), optional
        A small boolean mask (True: the query may attend to the key), e.g.
        ``softmaxbook.causal_mask(4)``, drawn beside the masking step as a grid
        of cells, one row per query and one column per key (False: grey, the
        score becomes ``-inf``). Without it the step is drawn without an example.
    normalizer : str
        The name written in the normalization step ("softmax" by default; the
        chapters on alternatives swap it).
    title : str
        The figure's title.

    Returns
    -------
    matplotlib.figure.Figure
        A 5.0 x 7.4 inch figure, text at 12.5 points or more.
    """
    width, height = 9.6, 14.0
    fig, ax = canvas(width, height, figsize=(5.0, 7.4), title=title)
    blue, orange, green, red, purple = PALETTE[:5]
    fs = 11
    bw, bh = 5.2, 1.05  # the column's boxes
    x0 = 0.6  # the column, left of centre: room for V and the mask
    cx = x0 + bw / 2

    # Inputs: Q and K side by side at the top.
    y_in = 12.4
    box(ax, x0 - 0.4, y_in, 2.6, bh, "Q\n(B, H, L, D)", color=blue, fontsize=fs)
    box(ax, x0 + bw - 2.2, y_in, 2.6, bh, "K\n(B, H, S, D)", color=blue, fontsize=fs)

    steps = [
        ("scores  $Q K^\\top$", "(B, H, L, S)", blue),
        ("scale  $\\times\\, 1/\\sqrt{d_k}$", "(B, H, L, S)", blue),
        ("mask  $+\\,0$ or $-\\infty$", "(B, H, L, S)", red),
        (f"normalize: {normalizer}\nover the S keys", "weights (B, H, L, S)", orange),
        ("weights $\\times$ V", "", green),
    ]
    ys = [10.35, 8.45, 6.55, 4.55, 2.35]
    # Arrows from Q and K into the scores box.
    arrow(ax, (x0 + 0.9, y_in), (cx - 0.6, ys[0] + bh))
    arrow(ax, (x0 + bw - 0.9, y_in), (cx + 0.6, ys[0] + bh))
    for i, ((label, shape, color), y) in enumerate(zip(steps, ys)):
        h = bh * (1.25 if "\n" in label else 1.0)
        box(ax, x0, y, bw, h, label, color=color, fontsize=fs)
        if i + 1 < len(steps):
            y_next_top = ys[i + 1] + bh * (1.25 if "\n" in steps[i + 1][0] else 1.0)
            arrow(ax, (cx, y), (cx, y_next_top))
            text(
                ax,
                cx + 0.25,
                (y + y_next_top) / 2,
                shape,
                ha="left",
                fontsize=10,
                color=INK,
            )
    # V joins the last step from the right.
    vx = x0 + bw + 0.9
    box(ax, vx, ys[4] + 1.35, 2.6, bh, "V\n(B, H, S, Dv)", color=blue, fontsize=fs)
    arrow(ax, (vx + 1.3, ys[4] + 1.35), (x0 + bw, ys[4] + bh / 2))
    # The output.
    y_out = 0.3
    box(ax, x0, y_out, bw, bh, "output", color=purple, fontsize=fs)
    arrow(ax, (cx, ys[4]), (cx, y_out + bh))
    text(
        ax, cx + 0.25, (ys[4] + y_out + bh) / 2, "(B, H, L, Dv)", ha="left", fontsize=10
    )

    if mask is not None:
        m = np.asarray(mask, dtype=bool)
        size = min(0.42, 1.7 / max(m.shape))
        gx = x0 + bw + 0.9
        gy = ys[2] + bh - m.shape[0] * size + 0.55
        cells(ax, m, gx, gy, size=size, on=red)
        # Which axis is which, and what each colour adds to the scores.
        text(
            ax,
            gx + m.shape[1] * size / 2,
            gy - 0.15,
            "rows: queries\ncolumns: keys\ngrey: $-\\infty$",
            va="top",
            fontsize=9,
            linespacing=1.3,
        )
    return fig
