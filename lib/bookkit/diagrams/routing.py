"""The router of a mixture-of-experts layer: logits, scores, top-k, weights.

:func:`draw_router` draws, for one token, the two routers of
``softmaxbook.route_topk`` side by side: a softmax over all experts, top-k,
then normalization (Mixtral's), and a sigmoid per expert, a selection bias,
top-k, normalization and a scale (DeepSeek-V3's). Every number in the cells
is computed by ``route_topk`` from the logits given.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

import softmaxbook as sb

from ._draw import MUTED, PALETTE, _tint, arrow, canvas, cells, text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["draw_router"]


def _hex(color: str, amount: float) -> str:
    from matplotlib.colors import to_hex

    return to_hex(_tint(color, amount))


def draw_router(
    logits: Sequence[float] = (1.2, 0.4, 2.0, -0.3, 1.6, 0.1),
    k: int = 2,
    bias: Sequence[float] = (0.0, 0.0, 0.0, 0.0, -0.4, 0.3),
    scale: float = 2.5,
) -> Figure:
    """One token's logits through a softmax router and a sigmoid router.

    Left, ``score="softmax"``: the scores over all experts, the ``k``
    chosen (coloured), their weights after normalization. Right,
    ``score="sigmoid"`` with the selection ``bias`` and ``scale``: the
    scores, the bias added for the choice only, the ``k`` chosen, their
    normalized weights times ``scale``. Unchosen experts are grey.
    """
    z = torch.tensor([list(logits)], dtype=torch.float64)
    b = torch.tensor(list(bias), dtype=torch.float64)
    n = z.shape[-1]
    size, gap, left = 0.9, 1.3, 0.2
    panel = n * size
    width = left + 2 * panel + gap + 0.2
    rows_y = [8.4, 6.4, 3.4, 1.0]  # logits, scores, chosen, weights (cell bottoms)
    height = 10.4
    fig, ax = canvas(width, height, figsize=(6.4, 6.4 * height / width))

    paths: tuple[tuple[str, dict[str, Any], torch.Tensor, str], ...] = (
        ("softmax", {"score": "softmax"}, torch.softmax(z, -1)[0], "Mixtral: softmax"),
        (
            "sigmoid",
            {"score": "sigmoid", "bias": b, "scale": scale},
            torch.sigmoid(z)[0],
            "DeepSeek-V3: sigmoid",
        ),
    )
    for p, (_name, kwargs, scores, title) in enumerate(paths):
        x0 = left + p * (panel + gap)
        color = PALETTE[p]
        weights, idx = sb.route_topk(z, k, **kwargs)
        chosen = set(idx[0].tolist())
        wmap = dict(zip(idx[0].tolist(), weights[0].tolist(), strict=True))
        text(ax, x0 + panel / 2, 9.95, title, fontsize=13)
        fmt = [f"{v:.1f}" for v in z[0].tolist()]
        cells(ax, [[_hex(color, 0.25)] * n], x0, rows_y[0], size=size, labels=fmt)
        cells(
            ax,
            [[_hex(color, 0.25)] * n],
            x0,
            rows_y[1],
            size=size,
            labels=[f"{v:.2f}" for v in scores.tolist()],
        )
        pick = [_hex(color, 0.7) if e in chosen else MUTED for e in range(n)]
        cells(
            ax,
            [pick],
            x0,
            rows_y[2],
            size=size,
            labels=[
                f"{v:.2f}" if e in chosen else "" for e, v in enumerate(scores.tolist())
            ],
        )
        out = [_hex(color, 0.7) if e in chosen else MUTED for e in range(n)]
        cells(
            ax,
            [out],
            x0,
            rows_y[3],
            size=size,
            labels=[f"{wmap[e]:.2f}" if e in chosen else "" for e in range(n)],
        )
        mid = x0 + panel / 2
        score_label = r"softmax over all $E$" if p == 0 else r"$\sigma(z_e)$ each"
        pick_label = f"top-{k}" if p == 0 else f"top-{k} of $s + b$"
        norm_label = r"$\div$ sum" if p == 0 else rf"$\div$ sum, $\times${scale:g}"
        tops = (rows_y[0], rows_y[1] - (0.75 if p == 1 else 0.0), rows_y[2])
        for y_from, y_to, label in zip(
            tops, rows_y[1:], (score_label, pick_label, norm_label), strict=True
        ):
            arrow(ax, (mid - 1.3, y_from - 0.05), (mid - 1.3, y_to + size + 0.05))
            text(
                ax,
                mid - 1.05,
                (y_from + y_to + size) / 2,
                label,
                ha="left",
                fontsize=12.5,
            )
        if p == 1:  # the selection bias, under the scores it is added to
            for e, v in enumerate(b.tolist()):
                label = f"{v:+.1f}" if v else "0"
                text(ax, x0 + (e + 0.5) * size, rows_y[1] - 0.35, label, fontsize=12.5)
            text(ax, x0 - 0.35, rows_y[1] - 0.35, "$b$", fontsize=14)
    for y, name in zip(rows_y, ("z", "s", "T", "w"), strict=True):
        text(ax, left + panel + gap / 2, y + size / 2, f"${name}$", fontsize=14)
    return fig
