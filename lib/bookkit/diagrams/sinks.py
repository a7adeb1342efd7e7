"""Where attention sinks sit, and which cache entries an eviction policy keeps.

:func:`draw_sinks` draws a schematic attention map with a sink column next to
the weights the book's own sink study measured per head
(``bookkit.studies.sink_study``, stored in ``sink_sweep.json``).
:func:`draw_kv_eviction` draws the full key-value cache and what three eviction
policies keep of it for the next query.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ._draw import INK, MUTED, PALETTE, canvas, cells, text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["draw_sinks", "draw_kv_eviction", "eviction_policies"]


def _blue(value: float) -> str:
    """A shade of the palette's first colour for a weight in [0, 1]."""
    from matplotlib.colors import to_hex, to_rgb

    r, g, b = to_rgb(PALETTE[0])
    t = 0.08 + 0.92 * float(np.clip(value, 0.0, 1.0))
    return to_hex((1 - t * (1 - r), 1 - t * (1 - g), 1 - t * (1 - b)))


def _schematic_map(n: int) -> np.ndarray:
    """Causal attention weights of a head with a sink on key 0 (schematic)."""
    w = np.zeros((n, n))
    for i in range(n):
        if i == 0:
            w[0, 0] = 1.0
            continue
        row = np.full(i + 1, 0.35 / i)
        row[0] = 0.65
        w[i, : i + 1] = row
    return w


def draw_sinks(
    sweep: dict,
    variants: Sequence[str] = ("softmax", "softmax, no <bos>"),
    key: str = "bos_none",
    n_schematic: int = 6,
    threshold: float = 0.3,
) -> Figure:
    """A schematic sink head beside the measured weight on the first token.

    Left: a causal attention map of ``n_schematic`` queries (rows) and keys
    (columns), drawn by hand to show the pattern (marked *schematic*): each
    query puts most of its weight on key 0. Right: for each variant in
    ``variants``, a grid of seeds (rows) by heads (columns) from ``sweep``
    (``bookkit.studies.sink_study.load()``), each cell shaded and labelled
    with the mean weight that head puts on the first token (``key``,
    ``"bos_none"``: at queries with nothing to read); heads above
    ``threshold`` (Gu et al.'s 0.3 for a sink head) are outlined.
    """
    from matplotlib.patches import Rectangle

    runs = {(r["variant"], r["seed"]): r for r in sweep["runs"]}
    seeds = list(sweep["seeds"])
    heads = len(runs[variants[0], seeds[0]][key])
    n = n_schematic
    cs = 0.8  # the schematic's cells: smaller, so the figure fits 6.4 inches
    side = n * cs
    gap = 1.0
    grid_w = len(variants) * heads + (len(variants) - 1) * 0.5
    width = side + gap + 1.6 + grid_w + 0.2
    height = max(side, len(seeds)) + 2.6
    fig, ax = canvas(width, height, figsize=(6.4, 6.4 * height / width))
    top = height - 1.4

    # Left: the schematic map, masked entries grey.
    w = _schematic_map(n)
    colors = np.where(np.tril(np.ones((n, n), bool)), cast(Any, None), MUTED)
    shaded = np.array(
        [[colors[i, j] or _blue(w[i, j]) for j in range(n)] for i in range(n)]
    )
    cells(ax, shaded, 0.0, top - side, size=cs)
    text(ax, side / 2, top + 0.45, "schematic: a sink head")
    text(ax, cs / 2, top - side - 0.3, "key 0\n(sink)", va="top")
    text(ax, side / 2 + 0.9, top - side - 0.3, "keys →", va="top")
    text(ax, -0.35, top - side / 2, "queries ↓", rotation=90)

    # Right: measured weight on the first token, per seed and head.
    x0 = side + gap + 1.6
    text(ax, x0 + grid_w / 2, top + 0.95, "measured: weight on token 0", fontsize=10)
    for v, variant in enumerate(variants):
        xv = x0 + v * (heads + 0.5)
        values = np.array([runs[variant, s][key] for s in seeds])
        shades = np.array([[_blue(x) for x in row] for row in values])
        labels = [f"{x:.2f}" for x in values.ravel()]
        cells(ax, shades, xv, top - len(seeds), labels=labels, fontsize=9)
        for i, row in enumerate(values):
            for h, x in enumerate(row):
                if x > threshold:
                    ax.add_patch(
                        Rectangle(
                            (xv + h + 0.06, top - i - 1 + 0.06),
                            0.88,
                            0.88,
                            facecolor="none",
                            edgecolor=INK,
                            linewidth=1.6,
                        )
                    )
        text(ax, xv + heads / 2, top + 0.4, variant.replace(", ", ",\n"), fontsize=9)
        for h in range(heads):
            text(ax, xv + h + 0.5, top - len(seeds) - 0.35, f"h{h}", fontsize=9)
    text(
        ax,
        x0 + grid_w / 2,
        top - len(seeds) - 1.0,
        f"outlined: above {threshold:g}, a sink head",
        fontsize=9,
    )
    for i, seed in enumerate(seeds):
        text(ax, x0 - 0.15, top - i - 0.5, f"seed {seed}", fontsize=9, ha="right")
    ax.set_title("Attention sinks: where the weight goes", color=INK)
    return fig


def eviction_policies(
    n: int = 16, budget: int = 8, sinks: int = 2, heavy: Sequence[int] = (0, 5, 9)
) -> dict[str, np.ndarray]:
    """Which of ``n`` cached tokens each policy keeps, at most ``budget`` of them.

    Returns ``{policy: labels}`` with one label per token: ``"sink"``,
    ``"recent"``, ``"heavy"`` (kept) or ``""`` (evicted). ``heavy`` are the
    positions with the largest accumulated attention (H2O's heavy hitters).
    """
    out: dict[str, np.ndarray] = {}
    full = np.array(["recent"] * n, dtype=object)
    out["full cache"] = full
    window = np.array([""] * n, dtype=object)
    window[n - budget :] = "recent"
    out["sliding window"] = window
    stream = np.array([""] * n, dtype=object)
    stream[:sinks] = "sink"
    stream[n - (budget - sinks) :] = "recent"
    out["StreamingLLM"] = stream
    h2o = np.array([""] * n, dtype=object)
    hh = list(heavy)[: budget // 2]
    h2o[n - (budget - len(hh)) :] = "recent"
    for p in hh:
        h2o[p] = "sink" if p < sinks else "heavy"
    out["H2O"] = h2o
    return out


def draw_kv_eviction(
    n: int = 16, budget: int = 8, sinks: int = 2, heavy: Sequence[int] = (0, 5, 9)
) -> Figure:
    """The full cache and what three policies keep for the next query (schematic).

    One row per policy (:func:`eviction_policies`), one cell per cached
    token, oldest left: kept sink tokens, kept recent tokens, kept heavy
    hitters, and evicted tokens in grey.
    """
    policies = eviction_policies(n, budget, sinks, heavy)
    color = {"sink": PALETTE[3], "recent": PALETTE[0], "heavy": PALETTE[2], "": MUTED}
    label_w = 4.2
    rows = len(policies)
    height = rows * 1.3 + 2.4
    width = label_w + n + 0.3
    fig, ax = canvas(width, height, figsize=(6.4, 6.4 * height / width))
    for r, (name, kept) in enumerate(policies.items()):
        y = height - 1.4 - (r + 1) * 1.3
        grid = np.array([[color[k] for k in kept]])
        cells(ax, grid, label_w, y, size=1.0)
        text(ax, label_w - 0.2, y + 0.5, name, fontsize=10, ha="right")
    text(ax, label_w, height - 1.2, "oldest token", fontsize=9, ha="left")
    text(ax, label_w + n, height - 1.2, "newest", fontsize=9, ha="right")
    legend = [
        ("sink", PALETTE[3]),
        ("recent", PALETTE[0]),
        ("heavy hitter", PALETTE[2]),
    ]
    legend.append(("evicted", MUTED))
    x = label_w
    for name, c in legend:
        cells(ax, np.array([[c]]), x, 0.15, size=0.7)
        text(ax, x + 0.9, 0.5, name, fontsize=9, ha="left")
        x += 1.4 + 0.3 * len(name)
    ax.set_title(f"KV-cache eviction: {budget} of {n} tokens kept", color=INK)
    return fig
