"""Diagrams of softmax at scale: the online softmax's running state, the tiles
of FlashAttention and what travels between memories, and ring attention.

Each ``draw_*`` function returns a matplotlib Figure built from the primitives
of :mod:`bookkit.diagrams._draw`. Where the library has the values (the running
state of :func:`softmaxbook.flash_attention_steps`, the tile sizes of
:mod:`softmaxbook.attention.flash` and of its Triton kernel, the ring's rule for who
holds which block), the diagram takes them from there instead of typing them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ._draw import INK, MUTED, PALETTE, arrow, box, canvas, cells, text

if TYPE_CHECKING:
    import torch
    from matplotlib.figure import Figure

__all__ = [
    "online_softmax_states",
    "draw_online_softmax_state",
    "gpu_block_size",
    "draw_flash_tiles",
    "ring_schedule",
    "draw_ring_attention",
]


def online_softmax_states(
    scores: Sequence[float] | torch.Tensor, block: int
) -> list[dict[str, float]]:
    r"""The running state after each tile of keys, for one row of ``scores``.

    Runs :func:`softmaxbook.flash_attention_steps` on a query whose scores
    against one-hot keys are ``scores`` (scale 1), so the state drawn is the
    library's own. Returns a list of dicts with keys ``start``, ``stop``,
    ``m``, ``l`` and ``alpha``: the factor :math:`e^{m_{old} - m_{new}}` that
    rescaled what was accumulated before the tile, as the library's
    :func:`~softmaxbook.attention.online.online_step` computes it, so 0 on the
    first tile, where :math:`m_{old} = -\infty` and nothing has been
    accumulated yet.
    """
    import torch

    import softmaxbook as sb

    s = torch.as_tensor(scores, dtype=torch.float64).flatten()
    n = s.numel()
    # q . k_j = s_j with one-hot keys; scale 1 keeps the scores as given
    q = s.view(1, n)
    k = torch.eye(n, dtype=torch.float64)
    v = torch.zeros(n, 1, dtype=torch.float64)
    states, m_old = [], -math.inf
    for step in sb.flash_attention_steps(q, k, v, block_size=(1, block), scale=1.0):
        m_new = float(step.max.flatten()[0])
        alpha = math.exp(m_old - m_new)  # exp(-inf) = 0 on the first tile
        states.append(
            {
                "start": step.k_start,
                "stop": step.k_stop,
                "m": m_new,
                "l": float(step.sum.flatten()[0]),
                "alpha": alpha,
            }
        )
        m_old = m_new
    return states


def _num(v: float, digits: int = 2) -> str:
    """A number as the diagrams print it, with a true minus sign (a hyphen is
    easily lost at phone size)."""
    return f"{v:.{digits}f}".replace("-", "\u2212")


def draw_online_softmax_state(
    scores: Sequence[float] | None = None, *, block: int = 4
) -> Figure:
    """One row of scores in tiles of ``block`` keys, and the running state
    :math:`(m, \\ell)` after each tile with its rescale factor
    :math:`\\alpha = e^{m_{old} - m_{new}}` (0 on the first tile, where
    :math:`m_{old} = -\\infty`): the values of :func:`online_softmax_states`."""
    if scores is None:
        scores = [0.3, 1.2, -0.4, 0.8, 2.1, 0.5, -1.0, 1.6, 0.9, 2.6, 0.1, -0.7]
    scores = [float(x) for x in scores]
    states = online_softmax_states(scores, block)
    n, tiles = len(scores), len(states)
    width = max(n, 3.6 * tiles)
    cell = width / n
    fig, ax = canvas(
        width,
        9.4,
        figsize=(6.4, 5.0),
        title="Online softmax: the running state, tile by tile",
    )
    colors = [PALETTE[t % len(PALETTE)] for t in range(tiles)]
    top = 7.5
    row = [[_light(colors[j // block]) for j in range(n)]]
    cells(ax, row, x=0, y=top, size=cell, labels=[_num(x, 1) for x in scores])
    text(
        ax,
        width / 2,
        top + cell + 0.4,
        r"scores $z_j$ of one query row, keys left to right",
    )
    box_w, box_h, y_box = 3.3, 2.5, 3.3
    slot = width / tiles
    centers = []
    for t, st in enumerate(states):
        x_mid = (st["start"] + st["stop"]) / 2 * cell
        cx = slot * (t + 0.5)
        arrow(ax, (x_mid, top - 0.05), (cx, y_box + box_h + 0.05), color=colors[t])
        label = (
            f"tile {t + 1}\n"
            f"$m$ = {_num(st['m'])}\n"
            f"$\\ell$ = {_num(st['l'])}\n"
            f"$\\alpha$ = {_num(st['alpha'])}"
        )
        box(ax, cx - box_w / 2, y_box, box_w, box_h, label, color=colors[t])
        centers.append(cx)
    for t in range(1, tiles):
        arrow(
            ax,
            (centers[t - 1] + box_w / 2, y_box + box_h / 2),
            (centers[t] - box_w / 2, y_box + box_h / 2),
        )
    # exp(...) rather than e^{...}: a script inside a superscript is too small to read
    new = r"m_{\mathrm{new}}"
    lines = [
        rf"$\alpha = \exp(m_{{\mathrm{{old}}}} - {new})$ rescales $\ell$ and $o$;"
        r" first tile: $m_{\mathrm{old}} = -\infty$, $\alpha = 0$",
        rf"$\ell \leftarrow \alpha\,\ell + \sum_j \exp(z_j - {new})$",
        rf"$o \leftarrow \alpha\,o + \sum_j \exp(z_j - {new})\,v_j$;"
        r"  after the last tile, output $o\,/\,\ell$",
    ]
    for k, line in enumerate(lines):
        text(ax, width / 2, 2.45 - 0.95 * k, line)
    return fig


def gpu_block_size(head_dim: int = 64) -> tuple[int, int]:
    """The (query, key) tile of the library's Triton FlashAttention kernel.

    Read from the kernel's launch rule (``softmaxbook.kernels.flash_launch_config``) for
    a problem of this head dimension, so the diagram shows the tiles the GPU
    kernel really uses; they are far smaller than the torch loop's
    :data:`softmaxbook.attention.flash.DEFAULT_BLOCK_SIZE`, because a GPU keeps them in
    registers and shared memory. Reads the rule where Triton is installed (no
    GPU needed); where it is not (macOS), returns the value that rule gives.
    """
    from softmaxbook import kernels

    try:
        config = kernels.flash_launch_config(head_dim)
    except ImportError:  # no Triton: the launch rule's tiles, 64 up to D = 128
        return (64, 64) if head_dim <= 128 else (32, 32)
    return config["BLOCK_M"], config["BLOCK_N"]


def draw_flash_tiles(
    block_size: tuple[int, int] | None = None, *, seq_len: int = 2048
) -> Figure:
    """FlashAttention's traffic: a block of queries loaded once, blocks of keys
    and values streamed through fast memory, the output block and its
    logsumexp written once.

    ``block_size`` defaults to the library's own
    :data:`softmaxbook.attention.flash.DEFAULT_BLOCK_SIZE` (the torch loop's tiles);
    pass :func:`gpu_block_size` to draw the GPU kernel's.
    """
    from softmaxbook.attention import flash

    bq, bk = flash.DEFAULT_BLOCK_SIZE if block_size is None else block_size
    n_q, n_k = max(1, math.ceil(seq_len / bq)), max(1, math.ceil(seq_len / bk))
    fig, ax = canvas(
        12,
        9.6,
        figsize=(6.4, 5.2),
        title="FlashAttention: what travels between memories",
    )
    # main memory, left
    box(ax, 0.1, 0.1, 5.3, 8.6, "", color=MUTED, fill=0.25)
    text(ax, 2.75, 8.35, "main memory (HBM)", fontsize=10)
    h = 6.15
    names = [
        ("Q", n_q, 1, PALETTE[0]),
        ("K", n_k, 0, PALETTE[1]),
        ("V", n_k, 0, PALETTE[1]),
        ("O", n_q, 1, PALETTE[2]),
    ]
    col_w, gap, x0, y0 = 0.8, 0.35, 0.45, 1.75
    centers = {}
    for c, (name, nb, hi, color) in enumerate(names):
        x = x0 + c * (col_w + gap)
        bh = h / nb
        for b in range(nb):
            on = b == hi
            box(
                ax,
                x,
                y0 + h - (b + 1) * bh,
                col_w,
                bh,
                "",
                color=color,
                fill=0.7 if on else 0.12,
                rounded=False,
            )
        text(ax, x + col_w / 2, y0 - 0.35, name, fontsize=10)
        centers[name] = (x + col_w, y0 + h - (hi + 0.5) * bh)
    x_lse = x0 + 4 * (col_w + gap)
    box(ax, x_lse, y0, 0.3, h, "", color=PALETTE[2], fill=0.12, rounded=False)
    box(
        ax,
        x_lse,
        y0 + h - 2 * h / n_q,
        0.3,
        h / n_q,
        "",
        color=PALETTE[2],
        fill=0.7,
        rounded=False,
    )
    text(ax, x_lse + 0.15, y0 - 0.35, r"$\lambda$")
    # on chip, right
    box(ax, 7.0, 0.1, 4.9, 8.6, "", color=PALETTE[3], fill=0.10)
    text(ax, 9.45, 8.35, "on chip (fast memory)", fontsize=10)
    bx, bw = 7.3, 4.4
    box(
        ax,
        bx,
        6.4,
        bw,
        1.25,
        f"Q block, {bq} rows:\nloaded once",
        color=PALETTE[0],
        fontsize=9,
    )
    box(
        ax,
        bx,
        4.7,
        bw,
        1.25,
        f"K, V blocks, {bk} keys:\nstreamed, one per step",
        color=PALETTE[1],
        fontsize=9,
    )
    box(
        ax,
        bx,
        3.0,
        bw,
        1.25,
        f"scores tile {bq} \u00d7 {bk}:\nnever leaves the chip",
        color=PALETTE[4],
        fontsize=9,
    )
    box(
        ax,
        bx,
        1.0,
        bw,
        1.5,
        "$m$, $\\ell$, $o$ per row;\n$O$ block and $\\lambda$\nwritten once",
        color=PALETTE[2],
        fontsize=9,
    )
    arrow(ax, (5.45, 7.0), (bx, 7.0), "$Q_i$", color=PALETTE[0])
    arrow(ax, (5.45, 5.3), (bx, 5.3), "$K_j$, $V_j$", color=PALETTE[1])
    arrow(ax, (bx, 1.75), (5.45, 1.75), r"$O_i$, $\lambda_i$", color=PALETTE[2])
    text(ax, 2.75, 0.6, f"$L = S$ = {seq_len}:\n{n_q} $Q$ blocks, {n_k} $K, V$ blocks")
    return fig


def ring_schedule(world_size: int) -> list[list[int]]:
    """Which key/value block rank ``r`` holds at step ``t``, ``(r - t) % W``,
    read from :mod:`softmaxbook.attention.ring`'s own rule
    (:func:`~softmaxbook.attention.ring.block_owner`; rank ``r`` sends to ``r + 1``
    and receives from ``r - 1``). Returns ``[rank][step]``."""
    from softmaxbook.attention.ring import block_owner

    return [
        [block_owner(r, t, world_size) for t in range(world_size)]
        for r in range(world_size)
    ]


def draw_ring_attention(world_size: int = 4) -> Figure:
    """Ring attention: each process keeps its query block while the key/value
    blocks rotate around the ring; each merges its partial results by
    logsumexp."""
    W = world_size
    sched = ring_schedule(W)
    fig, ax = canvas(
        12, 8.6, figsize=(6.4, 4.8), title=f"Ring attention, {W} processes"
    )
    cx, cy, rad = 3.1, 4.3, 2.2
    pos = []
    for r in range(W):
        ang = math.pi / 2 - 2 * math.pi * r / W
        pos.append((cx + rad * math.cos(ang), cy + rad * math.sin(ang)))
    for r, (x, y) in enumerate(pos):
        box(
            ax,
            x - 0.85,
            y - 0.55,
            1.7,
            1.1,
            f"P{r}: Q{r}\nholds KV{sched[r][0]}",
            color=PALETTE[r % len(PALETTE)],
            fontsize=9,
        )
    for r in range(W):
        (x0, y0), (x1, y1) = pos[r], pos[(r + 1) % W]
        mx, my = (x0 + x1) / 2, (y0 + y1) / 2
        # shorten along the chord so the arrow runs between the boxes
        dx, dy = x1 - x0, y1 - y0
        d = math.hypot(dx, dy)
        s = 0.9 / d
        arrow(ax, (x0 + dx * s, y0 + dy * s), (x1 - dx * s, y1 - dy * s))
        if r == 0:
            text(ax, mx + 0.55, my + 0.45, "send KV", fontsize=9)
    # the schedule: which block each process holds at each step
    gx, gy, size = 6.9, 2.6, 0.95
    colors = [[PALETTE[b % len(PALETTE)] for b in row] for row in sched]
    labels = [f"KV{b}" for row in sched for b in row]
    tint = [[_light(c) for c in row] for row in colors]
    cells(ax, tint, x=gx, y=gy, size=size, labels=labels, fontsize=9)
    for t in range(W):
        text(ax, gx + (t + 0.5) * size, gy + W * size + 0.3, f"{t}", fontsize=9)
    text(ax, gx + W * size / 2, gy + W * size + 0.85, "step", fontsize=9)
    for r in range(W):
        text(ax, gx - 0.4, gy + (W - r - 0.5) * size, f"P{r}", fontsize=9)
    text(
        ax,
        gx + W * size / 2,
        gy - 0.5,
        f"{W - 1} passes: every Q meets every KV",
        fontsize=9,
    )
    text(ax, 6.0, 0.9, r"each step: attend $Q_r$ to the block held, then merge")
    text(
        ax,
        6.0,
        0.3,
        r"$\lambda = \log(\exp\lambda_a + \exp\lambda_b)$,  "
        r"$o = \exp(\lambda_a - \lambda)\,o_a + \exp(\lambda_b - \lambda)\,o_b$",
        fontsize=9,
        color=INK,
    )
    return fig


def _light(color: str) -> str:
    from matplotlib.colors import to_hex, to_rgb

    r, g, b = to_rgb(color)
    return to_hex((1 - 0.35 * (1 - r), 1 - 0.35 * (1 - g), 1 - 0.35 * (1 - b)))
