"""What a head keeps in its cache, and how a stack of heads pulls tokens together.

:func:`draw_head_cache` draws the key-value cache of a few heads of one layer
under a DuoAttention-style policy: a retrieval head keeps every token, a
streaming head keeps the sink tokens and a recent window. :func:`draw_token_collapse`
draws the tokens of a stack of attention layers as points, layer by layer, from
the hidden states the page computed, so the picture is the measurement.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ._draw import INK, MUTED, PALETTE, box, canvas, cells, text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["head_cache_policy", "draw_head_cache", "token_cloud", "draw_token_collapse"]


def head_cache_policy(role: str, n: int, sinks: int, window: int) -> np.ndarray:
    """Labels of the ``n`` cached tokens one head keeps, oldest first.

    ``role`` is ``"retrieval"`` (every token kept, label ``"kept"``) or
    ``"streaming"`` (the first ``sinks`` tokens, label ``"sink"``, and the last
    ``window``, label ``"recent"``; the others ``""``, evicted).
    """
    if role not in ("retrieval", "streaming"):
        raise ValueError(f"role must be 'retrieval' or 'streaming', got {role!r}")
    if role == "retrieval":
        return np.array(["kept"] * n, dtype=object)
    out = np.array([""] * n, dtype=object)
    out[n - window :] = "recent"
    out[:sinks] = "sink"
    return out


def draw_head_cache(
    roles: Sequence[str], n: int = 20, sinks: int = 2, window: int = 5
) -> Figure:
    """One row of ``n`` cache cells per head: full for retrieval, sinks + window else.

    ``roles`` is one role per head, as a classification on the page found
    them; the cells are schematic (``n`` tokens stand for a long context).
    """
    color = {"kept": PALETTE[2], "sink": PALETTE[3], "recent": PALETTE[0], "": MUTED}
    label_w = 5.6
    rows = len(roles)
    height = rows * 1.2 + 3.0
    width = label_w + n + 0.3
    fig, ax = canvas(width, height, figsize=(6.4, 6.4 * height / width))
    top = height - 1.6
    for r, role in enumerate(roles):
        y = top - (r + 1) * 1.2
        kept = head_cache_policy(role, n, sinks, window)
        cells(ax, np.array([[color[k] for k in kept]]), label_w, y, size=1.0)
        text(ax, label_w - 0.3, y + 0.5, f"head {r}: {role}", ha="right")
    text(ax, label_w, top + 0.3, "oldest token", ha="left")
    text(ax, label_w + n, top + 0.3, "newest", ha="right")
    legend = [
        ("all kept", PALETTE[2]),
        ("sink", PALETTE[3]),
        ("recent", PALETTE[0]),
        ("evicted", MUTED),
    ]
    x = 0.2
    for name, c in legend:
        cells(ax, np.array([[c]]), x, 0.15, size=0.8)
        text(ax, x + 1.0, 0.55, name, ha="left")
        x += 1.6 + 0.55 * len(name)
    ax.set_title("One layer's cache, head by head", color=INK)
    return fig


def token_cloud(X: np.ndarray) -> np.ndarray:
    """The tokens (rows of ``X``, shape ``(N, D)``) as ``N`` points in the plane.

    Each row minus the mean row, divided by the root-mean-square norm of the
    rows, projected on the two leading right singular vectors of the centred
    matrix: the points' mean squared distance from the origin is at most
    ``N`` times :math:`r(X)^2`, and a collapsed layer is a single point at the
    origin.
    """
    X = np.asarray(X, dtype=float)
    centred = X - X.mean(axis=0, keepdims=True)
    scale = float(np.linalg.norm(X)) / np.sqrt(X.shape[0])
    if scale == 0.0:
        return np.zeros((X.shape[0], 2))
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    return (centred @ vt[:2].T) / scale


def draw_token_collapse(
    clouds: Mapping[str, Sequence[np.ndarray]],
    layers: Sequence[int],
    reach: float = 1.25,
) -> Figure:
    """Rows: stacks; columns: layers; in each box the tokens, as :func:`token_cloud`.

    ``clouds[name][i]`` is the ``(N, 2)`` cloud of that stack after
    ``layers[i]`` layers. Every box has the same scale (half-width ``reach``;
    points beyond it are drawn on its edge), so a cloud that shrinks to a dot
    is a stack whose tokens became identical.
    """
    cols = len(layers)
    label_w = 4.6
    side = 2.4
    gap = 0.3
    rows = len(clouds)
    width = label_w + cols * (side + gap)
    height = rows * (side + gap) + 1.4
    fig, ax = canvas(width, height, figsize=(6.4, 6.4 * height / width))
    for c, layer in enumerate(layers):
        x = label_w + c * (side + gap)
        text(ax, x + side / 2, height - 0.45, f"layer {layer}")
    for r, (name, snapshots) in enumerate(clouds.items()):
        y = height - 1.0 - (r + 1) * (side + gap) + gap
        text(ax, label_w - 0.2, y + side / 2, name, ha="right")
        for c, cloud in enumerate(snapshots):
            x = label_w + c * (side + gap)
            box(ax, x, y, side, side, color=PALETTE[r % len(PALETTE)], fill=0.06)
            pts = np.clip(np.asarray(cloud, dtype=float), -reach, reach)
            half = side / 2
            ax.scatter(
                x + half + pts[:, 0] / reach * half * 0.9,
                y + half + pts[:, 1] / reach * half * 0.9,
                s=10,
                color=PALETTE[r % len(PALETTE)],
                zorder=3,
            )
    ax.set_title("Tokens through the layers", color=INK)
    return fig
