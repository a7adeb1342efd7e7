"""Decoding-time schematics: how split-K cuts a key-value cache, and which
policy updates raise or lower a softmax policy's entropy.

:func:`draw_split_kv` draws the cache of one request cut into chunks by several
split policies (a number of splits chosen from the batch size, or a fixed split
size), one row per policy. :func:`draw_entropy_quadrants` draws the sign rule of
the first-order entropy change of a softmax policy, :math:`\\Delta H \\approx
-\\mathrm{Cov}_{a \\sim \\pi}(\\log \\pi_a, \\Delta z_a)`: raising a probable
action or lowering a rare one lowers the entropy.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import TYPE_CHECKING

import numpy as np

from ._draw import INK, PALETTE, _tint, box, canvas, cells, text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["split_bounds", "draw_split_kv", "draw_entropy_quadrants"]


def split_bounds(S: int, splits: int) -> list[tuple[int, int]]:
    """The ``(start, stop)`` key ranges of ``splits`` contiguous chunks of ``S`` keys,
    lengths differing by at most one (``round(i * S / n)`` edges, ``n = min(splits,
    S)``), the rule :func:`softmaxbook.split_k_attention` documents."""
    if S < 1 or splits < 1:
        raise ValueError(f"S and splits must be >= 1, got S={S}, splits={splits}")
    n = min(splits, S)
    edges = [round(i * S / n) for i in range(n + 1)]
    return list(pairwise(edges))


def draw_split_kv(
    S: int,
    rows: Sequence[tuple[str, int]],
    *,
    cell: float = 0.5,
) -> Figure:
    """One request's cache of ``S`` keys, cut into chunks by each row's policy.

    ``rows`` is a sequence of ``(label, splits)``: the row's label (the policy
    and the batch it served) and the number of chunks it cut the keys into.
    Each chunk is shaded in its own colour and numbered; a chunk is one partial
    attention result :math:`(o_c, \\lambda_c)`, and the chunks are merged in a
    tree. Rows with the same chunks compute the same sums in the same order.
    """
    label_w = 0.0  # labels sit above each row, so the keys use the full width
    gap = 1.15
    height = len(rows) * (cell + gap) + 0.9
    width = label_w + S * cell
    fig, ax = canvas(width, height, figsize=(6.4, 6.4 * height / width))
    shades = [PALETTE[0], PALETTE[1], PALETTE[2], PALETTE[4 % len(PALETTE)]]
    for r, (label, splits) in enumerate(rows):
        y = height - (r + 1) * (cell + gap) + 0.1
        bounds = split_bounds(S, splits)
        colors = np.empty((1, S), dtype=object)
        for c, (lo, hi) in enumerate(bounds):
            colors[0, lo:hi] = _hex(_tint(shades[c % len(shades)], 0.75))
        cells(ax, colors, x=label_w, y=y, size=cell)
        for c, (lo, hi) in enumerate(bounds):
            text(ax, label_w + (lo + hi) / 2 * cell, y + cell / 2, str(c + 1))
            if lo > 0:  # a chunk edge
                ax.plot([label_w + lo * cell] * 2, [y - 0.08, y + cell + 0.08],
                        color=INK, linewidth=1.6)  # fmt: skip
        text(ax, label_w, y + cell + 0.3, label, ha="left")
    text(ax, label_w, 0.25, f"keys 1 to {S} of one request's cache", ha="left")
    return fig


def _hex(rgb: tuple[float, float, float]) -> str:
    from matplotlib.colors import to_hex

    return to_hex(rgb)


def draw_entropy_quadrants() -> Figure:
    """The sign of the first-order entropy change, by where the update pushes.

    Columns: a probable action (:math:`\\log \\pi_a` above its mean under
    :math:`\\pi`) or a rare one; rows: its logit raised (positive advantage)
    or lowered. The entropy change is minus the covariance of the two, so it
    falls where both deviations have the same sign.
    """
    width, height = 10.0, 5.9
    fig, ax = canvas(width, height, figsize=(6.4, 6.4 * height / width))
    x0, y0, w, h = 2.6, 0.4, 3.6, 2.2
    cols = ["probable action", "rare action"]
    rows_ = ["logit raised\n(advantage > 0)", "logit lowered\n(advantage < 0)"]
    verdict = [["entropy falls", "entropy rises"], ["entropy rises", "entropy falls"]]
    for i, row in enumerate(rows_):
        y = y0 + (1 - i) * (h + 0.2)
        text(ax, 1.3, y + h / 2, row)
        for j in range(2):
            falls = verdict[i][j] == "entropy falls"
            box(ax, x0 + j * (w + 0.2), y, w, h, verdict[i][j],
                color=PALETTE[1] if falls else PALETTE[0],
                fill=0.35 if falls else 0.15)  # fmt: skip
    for j, col in enumerate(cols):
        text(ax, x0 + j * (w + 0.2) + w / 2, y0 + 2 * h + 0.2 + 0.45, col)
    return fig
