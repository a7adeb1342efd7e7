"""Normalizers as maps onto the simplex: where softmax and sparsemax send scores.

With three keys, every weight vector ``p = (p1, p2, p3)`` lies on the 2-simplex,
a triangle whose corners are the one-hot vectors and whose edges are the
vectors with one zero. A grid of score vectors ``(x1, x2, 0)`` (the third
score fixed at 0: both maps ignore a common shift, so nothing is lost) is sent
through each normalizer and every image is drawn at its barycentric position.
Softmax's images fill the *open* triangle and never touch an edge; sparsemax's
images pile up on the edges and in the corners, the exact zeros. The maps are
the library's own (``softmaxbook.softmax`` and ``softmaxbook.sparsemax`` by
default), so the picture cannot drift from the code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from bookkit.diagrams._draw import INK, MUTED, PALETTE, text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["CORNERS", "simplex_images", "to_triangle", "draw_simplex_maps"]

#: Where the one-hot vectors e1, e2, e3 are drawn: an equilateral triangle.
CORNERS = np.array([[0.0, 0.0], [1.0, 0.0], [0.5, np.sqrt(3) / 2]])


def to_triangle(p: np.ndarray) -> np.ndarray:
    """Barycentric weights ``(..., 3)`` to points ``(..., 2)`` of the drawn triangle."""
    return np.asarray(p, dtype=float) @ CORNERS


def simplex_images(
    normalize: Callable, *, lim: float = 3.0, n: int = 25
) -> tuple[np.ndarray, np.ndarray]:
    """The weights that ``normalize`` gives an ``n x n`` grid of scores ``(x1, x2, 0)``.

    Returns ``(scores, weights)``, both of shape ``(n * n, 3)``, float64, with
    ``x1`` and ``x2`` on ``n`` evenly spaced values in ``[-lim, lim]``.
    """
    import torch

    axis = torch.linspace(-lim, lim, n, dtype=torch.float64)
    x1, x2 = torch.meshgrid(axis, axis, indexing="ij")
    scores = torch.stack([x1, x2, torch.zeros_like(x1)], dim=-1).reshape(-1, 3)
    weights = normalize(scores)
    return scores.numpy(), weights.detach().numpy()


def draw_simplex_maps(
    maps: dict[str, Callable] | None = None,
    *,
    lim: float = 3.0,
    n: int = 25,
    title: str = "Three scores mapped onto the simplex",
    colors: Sequence[str] = (PALETTE[0], PALETTE[3]),
) -> Figure:
    """Draw where each normalizer sends a grid of scores, one triangle per map.

    Parameters
    ----------
    maps : dict of name -> callable, optional
        At most two normalizers ``f(scores) -> weights`` along the last
        dimension; defaults to ``softmaxbook.softmax`` and
        ``softmaxbook.sparsemax``.
    lim, n : float, int
        The grid: ``n`` values of ``x1`` and of ``x2`` in ``[-lim, lim]``.
    title : str
        The figure's title.
    colors : sequence of str
        One colour per map.

    Returns
    -------
    matplotlib.figure.Figure
        Two triangles side by side, 6.4 x 3.9 inches, text at 12.5 points or more.
        Each panel says how many of the ``n * n`` images have a zero weight
        (lie on an edge) and how many are one-hot (lie on a corner).
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Polygon

    from bookkit.plotting import use_style

    if maps is None:
        import softmaxbook as sb

        maps = {"softmax": sb.softmax, "sparsemax": sb.sparsemax}
    if not 1 <= len(maps) <= 2:
        raise ValueError(f"maps must hold one or two normalizers, got {len(maps)}")
    use_style()
    fig, axes = plt.subplots(
        1, len(maps), figsize=(3.2 * len(maps), 3.9), squeeze=False
    )
    fig.patch.set_facecolor("white")
    fig.suptitle(title)
    for ax, (name, f), color in zip(axes[0], maps.items(), colors):
        _, weights = simplex_images(f, lim=lim, n=n)
        ax.add_patch(
            Polygon(
                CORNERS, closed=True, facecolor="#f7f7f7", edgecolor="none", zorder=0
            )
        )
        # The edges on top of the grid lines that run along them.
        ax.add_patch(
            Polygon(
                CORNERS,
                closed=True,
                facecolor="none",
                edgecolor=INK,
                linewidth=1.4,
                zorder=2.5,
            )
        )
        # The images of the grid lines x1 = const and x2 = const.
        grid = to_triangle(weights).reshape(n, n, 2)
        for k in range(n):
            ax.plot(grid[k, :, 0], grid[k, :, 1], color=MUTED, linewidth=0.6, zorder=1)
            ax.plot(grid[:, k, 0], grid[:, k, 1], color=MUTED, linewidth=0.6, zorder=1)
        zeros = (weights == 0).any(axis=-1)
        corner = (weights == 1).any(axis=-1)
        inside = ~zeros
        pts = to_triangle(weights)
        ax.scatter(
            pts[inside, 0],
            pts[inside, 1],
            s=9,
            color=color,
            alpha=0.55,
            linewidths=0,
            zorder=2,
        )
        ax.scatter(
            pts[zeros, 0],
            pts[zeros, 1],
            s=22,
            facecolor="white",
            edgecolor=color,
            linewidths=1.1,
            zorder=3,
        )
        for label, (x, y), (dx, dy) in zip(
            ("$e_1$", "$e_2$", "$e_3$"),
            CORNERS,
            ((-0.06, -0.07), (0.06, -0.07), (0.0, 0.08)),
        ):
            text(ax, x + dx, y + dy, label, fontsize=14)
        ax.set_title(name, color=color)
        text(
            ax,
            0.5,
            -0.2,
            f"{int(zeros.sum())} of {n * n} on an edge,\n"
            f"{int(corner.sum())} on a corner",
            fontsize=13,
        )
        ax.set_xlim(-0.12, 1.12)
        ax.set_ylim(-0.32, 0.98)
        ax.set_aspect("equal")
        ax.axis("off")

    return fig
