"""The quantize/dequantize path of low-bit attention (SageAttention-style).

:func:`draw_lowbit_attention` draws where each operand of one attention tile
is cast and where it is scaled back: Q and K (K smoothed by its mean) to
int8 with one scale per block, the scores dequantized and passed through the
online softmax in float32, the unnormalized weights scaled so their maximum
is float8 e4m3's largest value and cast, V cast to e4m3, and the division by
the row sum last. The format limits written in the boxes are read from
``torch.finfo`` and ``torch.iinfo``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from ._draw import INK, PALETTE, arrow, box, canvas, text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["draw_lowbit_attention"]


def draw_lowbit_attention() -> Figure:
    """Q, K, P and V through their casts: what is quantized, with what scale."""
    e4m3 = torch.finfo(torch.float8_e4m3fn)
    i8 = torch.iinfo(torch.int8).max
    width, height = 12.0, 9.0
    fig, ax = canvas(width, height, figsize=(6.4, 6.4 * height / width))
    low, exact, soft = PALETTE[1], PALETTE[0], PALETTE[2]
    h = 1.0

    # Row 1: Q and K to int8, the scores.
    box(ax, 0.1, 7.6, 1.3, h, "$Q$", color=exact)
    box(ax, 0.1, 6.2, 1.3, h, "$K$", color=exact)
    box(ax, 2.0, 6.2, 3.0, h, r"$K - \bar{k}$", color=exact)
    box(
        ax,
        5.6,
        6.9,
        3.0,
        1.3,
        f"int8, one\nscale a block\n(max {i8})",
        color=low,
        fontsize=12.5,
    )
    box(
        ax,
        9.2,
        6.9,
        2.7,
        1.3,
        "$Z = QK^\\top$\nint32 × scales",
        color=exact,
        fontsize=12.5,
    )
    arrow(ax, (1.4, 8.1), (5.6, 7.85))
    arrow(ax, (1.4, 6.7), (2.0, 6.7))
    arrow(ax, (5.0, 6.7), (5.6, 7.2))
    arrow(ax, (8.6, 7.55), (9.2, 7.55))
    text(ax, 3.5, 5.75, "smooth K", fontsize=12.5)

    # Row 2: the online softmax in float32.
    box(
        ax,
        6.2,
        4.1,
        5.7,
        1.3,
        "online softmax, float32:\n"
        + r"$\tilde P = e^{Z - m}$, $\ell = \sum \tilde P$",
        color=soft,
        fontsize=12.5,
    )
    arrow(ax, (10.55, 6.9), (10.55, 5.4))

    # Row 3: P and V to e4m3, the product, the division.
    box(
        ax,
        0.1,
        1.8,
        3.6,
        1.3,
        f"$\\tilde P \\times {e4m3.max:g}$\nto e4m3",
        color=low,
        fontsize=12.5,
    )
    box(ax, 0.1, 0.1, 3.6, 1.1, "$V$ to e4m3", color=low, fontsize=12.5)
    box(
        ax,
        4.6,
        1.0,
        3.2,
        1.3,
        r"$\tilde P V$" + "\nfloat32 sum",
        color=exact,
        fontsize=12.5,
    )
    box(ax, 8.7, 1.0, 3.2, 1.3, r"$O = \tilde P V / \ell$", color=exact, fontsize=12.5)
    arrow(ax, (6.2, 4.75), (1.9, 3.1))
    arrow(ax, (3.7, 2.45), (4.6, 1.9))
    arrow(ax, (3.7, 0.65), (4.6, 1.35))
    arrow(ax, (7.8, 1.65), (8.7, 1.65))
    tiny_exp = int(math.log2(e4m3.tiny))
    text(
        ax,
        6.4,
        3.25,
        "a sink sets $m$: the other keys'\n"
        f"${e4m3.max:g}\\,\\tilde P$ can fall below $2^{{{tiny_exp}}}$,\n"
        "into e4m3's subnormals",
        fontsize=12.5,
        color=INK,
        ha="left",
    )
    return fig
