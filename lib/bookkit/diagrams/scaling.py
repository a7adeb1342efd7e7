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

    # Phone-legible: 6.4 inches wide, the two roads side by side below the sum.
    fig, ax = canvas(16, 14, figsize=(6.4, 5.6))
    ax.set_title(r"Why the scores are divided by $\sqrt{d_k}$", color=INK)

    # The d_k products, left to right, and their sum.
    # the last index written as its value: a script inside a script is too small
    last = f"$q_{{{d_k}}} k_{{{d_k}}}$"
    labels = [r"$q_1 k_1$", r"$q_2 k_2$", r"$q_3 k_3$", r"$\cdots$", last]
    xs, widths = [0.2, 2.4, 4.6, 6.8, 8.0], [2.0, 2.0, 2.0, 1.0, 2.7]
    for x, w, label in zip(xs, widths, labels):
        if label == r"$\cdots$":
            text(ax, x + w / 2, 12.45, label)
            continue
        box(ax, x, 12.0, w, 0.9, label, color=blue)
    text(ax, 5.35, 11.35, f"$d_k$ = {d_k} products, each: mean 0, Var 1")
    arrow(ax, (10.7, 12.45), (11.3, 12.45))
    box(ax, 11.3, 10.9, 4.5, 2.1, "", color=INK, fill=0.08)
    text(ax, 13.55, 12.45, r"$q \cdot k = \sum_i q_i k_i$")
    text(ax, 13.55, 11.4, f"Var = $d_k$ = {d_k}")

    # One shared scale for both bells: +-3 sd of the unscaled score fits 3.4 units.
    per_score = 3.4 / (3 * std)
    roads: list[tuple[float, str, float, np.ndarray, str]] = [
        (4.0, red, std, w_raw, f"unscaled: sd $\\sqrt{{d_k}}$ = {std:.0f}"),
        (12.0, blue, 1.0, w_scaled, "scaled: sd 1, any $d_k$"),
    ]
    arrow(ax, (12.2, 10.9), (4.6, 9.75))
    arrow(ax, (13.55, 10.9), (12.6, 9.75), r"$\div \sqrt{d_k}$", offset=(0.9, -0.45))
    for cx, color, sd, weights, label in roads:
        text(ax, cx, 9.3, label, color=color)
        _bell(ax, cx, 6.5, 3.4, 2.0, sd, per_score, color)
        arrow(ax, (cx, 6.15), (cx, 4.95), "softmax", offset=(1.0, -0.3))
        bar = 0.6
        _weights(
            ax, cx - len(weights) * bar / 2, 2.2, weights, color, height=2.5, bar=bar
        )
        text(ax, cx, 1.6, f"largest weight {weights.max():.2f}", color=color)
    text(
        ax,
        8.0,
        0.6,
        f"same horizontal scale, ticks at $\\pm$1 sd; {n_keys} keys' weights",
    )
    return fig
