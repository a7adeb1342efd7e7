"""The output layer of a language model, from hidden state to sampled token.

Pictures for chapter 7. The output layer: a hidden state ``h`` goes through the LM head
``W`` to logits ``z``, is divided by a temperature, filtered (top-k, top-p,
min-p), turned into probabilities by the softmax and sampled. Every number in
the picture is computed by the library (``softmaxbook.top_k_filter``,
``top_p_filter``, ``min_p_filter``, ``softmax``, ``sample``), so the diagram
shows what the code does, not a drawing of it. The softmax bottleneck
(:func:`draw_softmax_bottleneck`): the log-probabilities of ``n`` contexts,
``X W^T`` less a column of logsumexps, have rank at most ``d + 1``. A draft
tree and its tree-attention mask (:func:`draw_draft_tree`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from bookkit.diagrams._draw import INK, MUTED, PALETTE, arrow, box, canvas, cells, text

if TYPE_CHECKING:
    import torch
    from matplotlib.figure import Figure

__all__ = [
    "output_layer_stages",
    "draw_output_layer",
    "tree_attention_mask",
    "draw_draft_tree",
    "draw_softmax_bottleneck",
]


def output_layer_stages(
    h: torch.Tensor,
    W: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    generator: torch.Generator | None = None,
) -> dict[str, torch.Tensor]:
    """The values at each stage of the output layer, computed by the library.

    Returns the logits ``z = W h``, the tempered logits ``z / T``, the filtered
    logits (top-k, then top-p, then min-p, as ``softmaxbook.sample`` applies
    them), the probabilities and the sampled token (drawn by
    ``softmaxbook.sample`` with ``generator``).
    """
    import softmaxbook as sb

    z = W @ h
    tempered = z / temperature
    filtered = tempered
    if top_k is not None:
        filtered = sb.top_k_filter(filtered, top_k)
    if top_p is not None:
        filtered = sb.top_p_filter(filtered, top_p)
    if min_p is not None:
        filtered = sb.min_p_filter(filtered, min_p)
    token = sb.sample(
        z,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        generator=generator,
    )
    return {
        "logits": z,
        "tempered": tempered,
        "filtered": filtered,
        "probs": sb.softmax(filtered),
        "token": token,
    }


def _fmt(v: float) -> str:
    if math.isinf(v):
        return r"$-\infty$" if v < 0 else r"$\infty$"
    return f"{v:.2f}".replace("-", "\u2212")  # a true minus: a hyphen gets lost


def draw_output_layer(
    h: torch.Tensor,
    W: torch.Tensor,
    words: Sequence[str],
    *,
    temperature: float = 0.7,
    top_k: int | None = 4,
    top_p: float | None = 0.9,
    min_p: float | None = None,
    generator: torch.Generator | None = None,
    figsize: tuple[float, float] | None = None,
) -> Figure:
    """The output layer as a column of stages, each with its values per token.

    ``h`` is a hidden state ``(D,)``, ``W`` the LM head ``(V, D)`` and
    ``words`` the ``V`` tokens' names. The left column names each stage, the
    right shows the stage's ``V`` values: removed tokens grey, the sampled
    token outlined.
    """
    from matplotlib.patches import Rectangle

    V, D = W.shape
    if len(words) != V or h.shape != (D,):
        raise ValueError(f"expected h ({D},) and {V} words")
    st = output_layer_stages(
        h,
        W,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        generator=generator,
    )
    token = int(st["token"])
    size, x0, label_w = 1.3, 5.0, 4.4
    width = x0 + V * size + 0.2
    filters = [
        f"top-$k$ = {top_k}" if top_k is not None else "",
        f"top-$p$ = {top_p}" if top_p is not None else "",
        f"min-$p$ = {min_p}" if min_p is not None else "",
    ]
    rows = [
        (f"hidden state $h$\n({D} numbers)", None, PALETTE[4]),
        (f"LM head: $z = Wh$\n$W$ is {V} $\\times$ {D}", st["logits"], PALETTE[0]),
        (
            f"divide by the\ntemperature $T$ = {temperature:g}",
            st["tempered"],
            PALETTE[0],
        ),
        (
            "filter: " + _two_a_line([f for f in filters if f]),
            st["filtered"],
            PALETTE[1],
        ),
        ("softmax:\nprobabilities", st["probs"], PALETTE[2]),
        ("sample one token", None, PALETTE[3]),
    ]
    step = 1.75
    height = len(rows) * step + 1.4
    if figsize is None:  # 6.4 inches wide, as tall as the drawing needs
        figsize = (6.4, 6.4 * height / width + 0.4)
    fig, ax = canvas(
        width,
        height,
        figsize=figsize,
        title="The output layer, from hidden state to token",
    )
    top = height - 0.2
    for i, (label, values, color) in enumerate(rows):
        y = top - (i + 1) * step + 0.3
        box(ax, 0.1, y, label_w, size, label, color=color, fontsize=10)
        if i > 0:
            arrow(
                ax,
                (0.1 + label_w / 2, y + size + step - size),
                (0.1 + label_w / 2, y + size),
            )
        if i == 0:  # the hidden state: D values, not one per token
            w = size * V / D
            for j, v in enumerate(h.tolist()):
                ax.add_patch(
                    Rectangle(
                        (x0 + j * w, y),
                        w,
                        size,
                        facecolor=_light(PALETTE[4]),
                        edgecolor="white",
                        linewidth=1.0,
                    )
                )
                text(ax, x0 + (j + 0.5) * w, y + size / 2, _fmt(v), fontsize=10)
            for j, word in enumerate(words):  # the vocabulary, over its columns
                text(
                    ax,
                    x0 + (j + 0.5) * size,
                    y - (step - size) / 2,
                    word,
                    fontsize=10,
                    fontweight="bold",
                )
            continue
        if values is None:  # the sampled token
            text(
                ax,
                x0 + (token + 0.5) * size,
                y + size / 2,
                f"'{words[token]}'",
                fontsize=11,
                fontweight="bold",
            )
            arrow(
                ax,
                (x0 + (token + 0.5) * size, y + size + step - size),
                (x0 + (token + 0.5) * size, y + size * 0.8),
                color=PALETTE[3],
            )
            continue
        vals = values.tolist()
        alive = [[not math.isinf(v) and not (i == 4 and v == 0) for v in vals]]
        cells(
            ax,
            alive,
            x0,
            y,
            size=size,
            on=_light(color),
            off=MUTED,
            labels=[_fmt(v) for v in vals],
            fontsize=10,
        )
        if i >= 3:  # outline the token that is drawn
            ax.add_patch(
                Rectangle(
                    (x0 + token * size, y),
                    size,
                    size,
                    fill=False,
                    edgecolor=PALETTE[3],
                    linewidth=2.2,
                )
            )
    text(
        ax,
        width / 2,
        0.7,
        "grey: removed by the filter (logit $-\\infty$, probability 0);\n"
        "outlined: the sampled token",
        fontsize=9,
        color=INK,
    )
    return fig


def _two_a_line(items: Sequence[str]) -> str:
    """``items`` joined by commas, two to a line (a label that fits its box)."""
    lines = [", ".join(items[i : i + 2]) for i in range(0, len(items), 2)]
    return ",\n".join(lines)


def _light(color: str) -> str:
    """``color`` mixed halfway with white, as a hex string."""
    from matplotlib.colors import to_hex, to_rgb

    r, g, b = to_rgb(color)
    return to_hex((0.6 + 0.4 * r, 0.6 + 0.4 * g, 0.6 + 0.4 * b))


def tree_attention_mask(parents: Sequence[int], prefix: int) -> torch.Tensor:
    """The tree-attention mask of a draft tree laid out after a prefix.

    ``parents[i]`` is the index of node ``i``'s parent among the nodes, or -1
    for a child of the last prefix token; parents come before their children.
    Row ``i`` of the ``(N, prefix + N)`` boolean mask is True at every prefix
    position, at node ``i`` and at its ancestors: what the node may attend to.
    """
    import torch

    n = len(parents)
    mask = torch.zeros(n, prefix + n, dtype=torch.bool)
    mask[:, :prefix] = True
    for i, parent in enumerate(parents):
        if parent >= i:
            raise ValueError("a parent must come before its children")
        mask[i, prefix + i] = True
        if parent >= 0:
            mask[i, prefix:] |= mask[parent, prefix:]
    return mask


def draw_draft_tree(
    parents: Sequence[int],
    words: Sequence[str],
    *,
    prefix_words: Sequence[str],
    figsize: tuple[float, float] = (6.4, 3.9),
) -> Figure:
    """A draft tree (left) and its tree-attention mask (right).

    The tree's nodes are drafted tokens ``words``, each below its parent
    (``parents``, -1 for the last prefix token); the mask is
    :func:`tree_attention_mask`, one row per node, one column per prefix token
    and node.
    """
    import matplotlib.pyplot as plt

    from bookkit.plotting import use_style

    n, prefix = len(parents), len(prefix_words)
    mask = tree_attention_mask(parents, prefix)
    depth: list[int] = []
    for parent in parents:
        depth.append(0 if parent < 0 else depth[parent] + 1)
    use_style()
    fig, (ax1, ax2) = plt.subplots(
        1, 2, figsize=figsize, gridspec_kw={"width_ratios": [1, 1.25]}
    )
    # left: the tree, the last prefix token at the top, one level per depth
    levels = max(depth) + 1
    ax1.set_xlim(0, 4)
    ax1.set_ylim(-0.3, levels + 1.2)
    ax1.axis("off")
    ax1.set_title("A draft tree")
    # each node straight above its children: the leaves take equal slots in
    # depth-first order, and a parent sits at the mean of its children
    children: list[list[int]] = [[] for _ in range(n)]
    for i, parent in enumerate(parents):
        if parent >= 0:
            children[parent].append(i)
    order: list[int] = []

    def visit(i: int) -> None:
        order.append(i)
        for c in children[i]:
            visit(c)

    for i in range(n):
        if parents[i] < 0:
            visit(i)
    leaves = [i for i in order if not children[i]]
    xs = [0.0] * n
    for j, i in enumerate(leaves):
        xs[i] = 4 * (j + 0.5) / len(leaves)
    for i in reversed(order):  # children before their parents
        if children[i]:
            xs[i] = sum(xs[c] for c in children[i]) / len(children[i])
    firsts = [xs[i] for i in range(n) if parents[i] < 0]  # the root's children
    root = (sum(firsts) / len(firsts), levels + 0.5)
    box(
        ax1,
        root[0] - 0.7,
        root[1] - 0.25,
        1.4,
        0.5,
        prefix_words[-1],
        color=PALETTE[7],
        fontsize=10,
    )
    for i in range(n):
        y = levels - 0.5 - depth[i]
        px, py = (
            root
            if parents[i] < 0
            else (xs[parents[i]], levels - 0.5 - depth[parents[i]])
        )
        arrow(ax1, (px, py - 0.25), (xs[i], y + 0.25))
        box(
            ax1,
            xs[i] - 0.6,
            y - 0.25,
            1.2,
            0.5,
            f"{i}: {words[i]}",
            color=PALETTE[0],
        )
    # right: the mask
    ax2.set_xlim(-2.0, prefix + n + 0.2)
    ax2.set_ylim(-1.2, n + 2.0)
    ax2.set_aspect("equal")
    ax2.axis("off")
    ax2.set_title("Its tree-attention mask")
    cells(ax2, mask.numpy(), 0, 0, on=PALETTE[0], off=MUTED)
    names = [f"{i}: {w}" for i, w in enumerate(words)]
    for j, w in enumerate(list(prefix_words) + names):
        text(ax2, j + 0.5, n + 0.15, w, rotation=90, va="bottom")
    for i in range(n):
        text(ax2, -0.1, n - 0.5 - i, names[i], ha="right")
    text(ax2, (prefix + n) / 2, -0.6, "row $i$: what node $i$ attends to")
    return fig


def draw_softmax_bottleneck(
    n: int,
    d: int,
    v: int,
    *,
    rank_softmax: int | None = None,
    rank_mixture: int | None = None,
    k: int | None = None,
    figsize: tuple[float, float] = (6.4, 4.4),
) -> Figure:
    """The softmax bottleneck: ``log Pi = X W^T - lambda 1^T`` has rank <= d + 1.

    ``n`` contexts with hidden states ``X`` ``(n, d)`` and an output layer ``W``
    ``(v, d)``; the boxes are drawn to the shapes' proportions (``d`` against
    ``n`` and ``v``). ``rank_softmax`` and ``rank_mixture`` are ranks measured
    by the caller (of one softmax's log-probabilities and of a mixture of ``k``
    softmaxes'), written under the picture when given.
    """
    if not 0 < d <= min(n, v):
        raise ValueError(f"expected 0 < d <= min(n, v), got d={d}, n={n}, v={v}")
    unit = 4.6 / max(n, v)  # the longer of n and v is 4.6 units
    hn, wv, wd = n * unit, v * unit, max(d * unit, 0.55)
    gap = 0.55
    width = wd + wv + 0.5 + wv + 4 * gap + 0.4
    height = 2.3 + hn + 0.8
    fig, ax = canvas(width, height, figsize=figsize, title="The softmax bottleneck")
    y0 = 2.3  # bottom of the row of matrices
    x = 0.2
    # H: n x d
    box(ax, x, y0, wd, hn, "", color=PALETTE[4], rounded=False)
    text(ax, x + wd / 2, y0 + hn + 0.35, "$X$")
    text(ax, x + wd / 2, y0 - 0.4, f"{n}$\\times${d}")
    x += wd + gap
    # W^T: d x v, aligned with the top of H
    box(ax, x, y0 + hn - wd, wv, wd, "", color=PALETTE[0], rounded=False)
    text(ax, x + wv / 2, y0 + hn + 0.35, "$W^{\\top}$")
    text(ax, x + wv / 2, y0 + hn - wd - 0.4, f"{d}$\\times${v}")
    text(
        ax,
        x + wv / 2,
        y0 + hn / 2 - 0.9,
        "logits $XW^{\\top}$:\nrank $\\leq$ " + str(d),
    )
    text(ax, x - gap / 2, y0 + hn / 2, "$\\times$")
    x += wv + gap
    # the column of normalizers, log Z: n x 1
    text(ax, x - gap / 2, y0 + hn / 2, "$-$")
    box(ax, x, y0, 0.5, hn, "", color=PALETTE[1], rounded=False)
    text(ax, x + 0.25, y0 + hn + 0.35, "$\\lambda$")
    x += 0.5 + gap
    text(ax, x - gap / 2, y0 + hn / 2, "$=$")
    # log P: n x v
    box(ax, x, y0, wv, hn, "", color=PALETTE[2], rounded=False)
    text(ax, x + wv / 2, y0 + hn + 0.35, "$\\log \\Pi$")
    text(ax, x + wv / 2, y0 + hn / 2, f"rank\n$\\leq$ {d} + 1")
    text(ax, x + wv / 2, y0 - 0.4, f"{n}$\\times${v}")
    lines = [
        f"contexts $n$ = {n}, hidden size {d}, vocabulary {v}",
    ]
    if rank_softmax is not None:
        lines.append(f"measured rank of one softmax's $\\log \\Pi$: {rank_softmax}")
    if rank_mixture is not None:
        of = f" of {k}" if k is not None else ""
        lines.append(f"measured rank of a mixture{of} softmaxes: {rank_mixture}")
    for i, line in enumerate(lines):
        text(ax, width / 2, 1.35 - 0.5 * i, line, fontsize=12.5)
    return fig
