"""Why attention divides its scores by sqrt(d_k).

:func:`draw_dot_product_variance` draws a score q.k as the sum of d_k
products of variance 1, so of variance d_k, and the two roads it can take to
the softmax: unscaled, with a spread of sqrt(d_k), or divided by sqrt(d_k),
with a spread of 1. The weights drawn at the end of each road are
``softmaxbook.softmax`` of one seeded draw of scores, so the picture shows
what the library computes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch

import softmaxbook as sb

from ._draw import INK, PALETTE, arrow, box, canvas, text

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["draw_dot_product_variance"]


def _bell(
    ax: Axes,
    x0: float,
    y0: float,
    half_width: float,
    height: float,
    std: float,
    units_per_score: float,
    color: str,
) -> None:
    """A normal density of standard deviation ``std`` (in score units), drawn
    centred at ``x0`` on a baseline at ``y0``; ``units_per_score`` maps score
    units to drawing units, the same for every bell, so widths compare."""
    xs = np.linspace(-half_width, half_width, 200)
    scores = xs / units_per_score
    ys = np.exp(-0.5 * (scores / std) ** 2)
    ax.plot(x0 + xs, y0 + height * ys, color=color, linewidth=1.6)
    ax.fill_between(x0 + xs, y0, y0 + height * ys, color=color, alpha=0.18, linewidth=0)
    ax.plot([x0 - half_width, x0 + half_width], [y0, y0], color=INK, linewidth=0.8)
    for sign in (-1, 1):
        xt = x0 + sign * std * units_per_score
        ax.plot([xt, xt], [y0 - 0.15, y0 + 0.15], color=INK, linewidth=0.8)


def _weights(
    ax: Axes,
    x0: float,
    y0: float,
    w: np.ndarray,
    color: str,
    height: float = 1.8,
    bar: float = 0.42,
) -> None:
    """Bars of the weights ``w`` (they sum to 1), left edge at ``x0``."""
    from matplotlib.patches import Rectangle

    for j, wj in enumerate(w):
        ax.add_patch(
            Rectangle(
                (x0 + j * bar, y0),
                bar * 0.8,
                max(height * wj, 0.02),
                facecolor=color,
                edgecolor="none",
            )
        )
    ax.plot([x0 - 0.1, x0 + len(w) * bar], [y0, y0], color=INK, linewidth=0.8)


def draw_dot_product_variance(d_k: int = 64, n_keys: int = 8, seed: int = 1) -> Figure:
    """q.k as a sum of d_k unit-variance products, and what 1/sqrt(d_k) does.

    Left: the d_k products q_i k_i, each of variance 1, add up to a score of
    variance d_k. Top road: unscaled, the scores spread over about
    +-sqrt(d_k) and the softmax of ``n_keys`` of them (one seeded draw of q
    and the keys, standard normal components) is nearly one-hot. Bottom
    road: divided by sqrt(d_k), the spread is 1 and the weights stay spread
    out. The two bells share one horizontal scale; ticks mark +-1 standard
    deviation.
    """
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(d_k, generator=g, dtype=torch.float64)
    k = torch.randn(n_keys, d_k, generator=g, dtype=torch.float64)
    raw = k @ q  # (n_keys,) unscaled scores of one query
    w_raw = sb.softmax(raw).numpy()
    w_scaled = sb.softmax(raw / math.sqrt(d_k)).numpy()
    std = math.sqrt(d_k)
    blue, red = PALETTE[0], PALETTE[3]

    fig, ax = canvas(20, 11, figsize=(7.2, 4.0))
    ax.set_title(r"Why the scores are divided by $\sqrt{d_k}$", color=INK)

    # The d_k products and their sum.
    text(ax, 1.6, 10.4, f"$d_k$ = {d_k} products", fontsize=10)
    labels = [
        r"$q_1 k_1$",
        r"$q_2 k_2$",
        r"$q_3 k_3$",
        r"$\vdots$",
        r"$q_{d_k} k_{d_k}$",
    ]
    ys = [8.6, 7.2, 5.8, 4.6, 3.0]
    for y, label in zip(ys, labels):
        if label == r"$\vdots$":
            text(ax, 1.6, y + 0.4, label, fontsize=11)
            continue
        box(ax, 0.2, y, 2.8, 1.0, label, color=blue)
        arrow(ax, (3.0, y + 0.5), (4.4, 5.9))
    text(ax, 1.6, 2.2, "each: mean 0, Var 1", fontsize=9)
    box(ax, 4.4, 4.8, 3.6, 2.2, "", color=INK, fill=0.08)
    text(ax, 6.2, 6.35, r"$q \cdot k = \sum_i q_i k_i$", fontsize=10)
    text(ax, 6.2, 5.3, f"Var = $d_k$ = {d_k}", fontsize=10)

    # One shared scale for both bells: +-3 sd of the unscaled score fits 2.6 units.
    per_score = 2.6 / (3 * std)

    # Top road: unscaled.
    arrow(ax, (8.0, 6.4), (9.6, 8.0))
    _bell(ax, 11.6, 7.2, 2.6, 1.6, std, per_score, red)
    text(
        ax,
        11.6,
        9.5,
        f"unscaled: sd $\\sqrt{{d_k}}$ = {std:.0f}",
        fontsize=9,
        color=red,
    )
    arrow(ax, (14.3, 7.8), (15.2, 7.8), "softmax", offset=(0, 0.2))
    _weights(ax, 15.6, 7.2, w_raw, red)
    text(ax, 17.3, 9.5, f"largest weight {w_raw.max():.2f}", fontsize=9, color=red)

    # Bottom road: scaled.
    arrow(ax, (8.0, 5.4), (9.6, 3.6), r"$\div \sqrt{d_k}$", offset=(-0.9, -0.5))
    _bell(ax, 11.6, 2.2, 2.6, 1.6, 1.0, per_score, blue)
    text(ax, 11.6, 4.5, "scaled: sd 1, any $d_k$", fontsize=9, color=blue)
    arrow(ax, (14.3, 2.8), (15.2, 2.8), "softmax", offset=(0, 0.2))
    _weights(ax, 15.6, 2.2, w_scaled, blue)
    text(ax, 17.3, 4.5, f"largest weight {w_scaled.max():.2f}", fontsize=9, color=blue)
    text(ax, 11.6, 1.3, "same horizontal scale; ticks at $\\pm$1 sd", fontsize=9)
    text(ax, 17.3, 1.3, f"weights of {n_keys} keys", fontsize=9)
    return fig
