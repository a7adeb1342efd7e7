"""What the backward pass of attention saves and what it recomputes.

:func:`draw_attention_backward` draws the forward pass Q, K, V -> Z -> P -> O,
the tensors the autograd node keeps for the backward pass, and the backward
pass itself. What is drawn as saved is read from the library: a small call
of ``softmaxbook.flash_attention`` is made and its node's saved tensors are
named by their shapes (:func:`saved_for_backward`), and the same is done for
autograd through the textbook formula, which keeps the weights P.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch

import softmaxbook as sb

from ._draw import INK, MUTED, PALETTE, arrow, box, canvas, text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["saved_for_backward", "draw_attention_backward"]

# Distinct sizes, so that every saved tensor is named by its shape alone.
_L, _S, _D, _DV = 6, 10, 4, 3


def _name(shape: tuple[int, ...]) -> str:
    names = {
        (_L, _D): "Q",
        (_S, _D): "K",
        (_D, _S): "K",  # K^T, kept by the product Q K^T
        (_S, _DV): "V",
        (_L, _DV): "O",
        (_L,): "logsumexp",
        (_L, _S): "P",
    }
    while len(shape) > 1 and shape[0] == 1:  # the library's flat (B*H) layout
        shape = shape[1:]
    return names.get(shape, "x".join(map(str, shape)))


def _saved_tensors(grad_fn: Any) -> list[torch.Tensor]:
    """The saved tensors of the first node below ``grad_fn`` that has any."""
    node = grad_fn
    while node is not None and not hasattr(node, "saved_tensors"):
        node = node.next_functions[0][0]
    return [t for t in node.saved_tensors if t is not None]


def saved_for_backward() -> dict[str, list[str]]:
    """What each route keeps for the backward pass, named by shape.

    ``"flash"``: the tensors the node of ``sb.flash_attention`` saves (no mask,
    no sinks). ``"textbook"``: what autograd keeps through
    ``softmax(Q K^T / sqrt(D)) V`` (the softmax node keeps its output P; the
    products keep their operands).
    """
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()
        for shape in [(_L, _D), (_S, _D), (_S, _DV)]
    )
    out = cast(torch.Tensor, sb.flash_attention(q, k, v))  # no return_lse: a tensor
    flash = [_name(tuple(t.shape)) for t in _saved_tensors(out.grad_fn)]

    out_textbook = torch.softmax(q @ k.T / _D**0.5, dim=-1) @ v
    textbook: list[str] = []
    stack = [out_textbook.grad_fn]
    while stack:  # every tensor any node of the graph keeps
        node = stack.pop()
        if node is None:
            continue
        for attr in dir(node):
            if attr.startswith("_saved_") and not attr.endswith(("sizes", "strides")):
                value = getattr(node, attr)
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    textbook.append(_name(tuple(value.shape)))
        stack.extend(fn for fn, _ in node.next_functions)
    return {"flash": flash, "textbook": sorted(set(textbook), key=textbook.index)}


def draw_attention_backward(saved: dict[str, list[str]] | None = None) -> Figure:
    """Forward pass, saved tensors and backward pass of one attention head.

    ``saved`` is :func:`saved_for_backward`'s result (computed when None).
    Top: the forward pass. Middle: what the FlashAttention node keeps (linear
    in the sequence length) against the L x S weights that autograd of the
    textbook formula keeps. Bottom: the backward pass, which rebuilds P from
    Q, K and the logsumexp.
    """
    saved = saved_for_backward() if saved is None else saved
    flash = saved["flash"]
    # 6.4 inches wide, three bands stacked: legible at phone width
    fig, ax = canvas(16, 17.4, figsize=(6.4, 6.96), title="")
    blue, orange, green, red = PALETTE[0], PALETTE[1], PALETTE[2], PALETTE[3]

    # Forward pass, top band.
    text(ax, 0.2, 16.85, "forward", ha="left", color=blue)
    box(ax, 0.3, 15.0, 4.8, 1.2, r"$Z = QK^\top\!/\sqrt{d_k}$", color=blue)
    box(ax, 5.9, 15.0, 4.6, 1.2, r"$P = \mathrm{softmax}(Z)$", color=blue)
    box(ax, 11.3, 15.0, 3.6, 1.2, r"$O = PV$", color=blue)
    arrow(ax, (5.1, 15.6), (5.9, 15.6))
    arrow(ax, (10.5, 15.6), (11.3, 15.6))
    for x, shape in (
        (2.7, r"$L \times S$"),
        (8.2, r"$L \times S$"),
        (13.1, r"$L \times d_v$"),
    ):
        text(ax, x, 14.55, shape)
    ax.plot([0.3, 15.7], [14.05, 14.05], color=MUTED, linewidth=1)

    # Saved for the backward pass, middle band.
    text(ax, 0.2, 13.55, "saved by the FlashAttention node", ha="left", color=green)
    x, centers = 0.3, {}
    for name in flash:
        w = 2.9 if name == "logsumexp" else 1.1
        label = r"$\lambda$ (per row)" if name == "logsumexp" else f"${name}$"
        box(ax, x, 11.6, w, 1.2, label, color=green, fill=0.3)
        centers[name] = x + w / 2
        x += w + 0.3
    text(ax, x + 0.1, 12.55, "grows like $L + S$;", ha="left", color=green)
    text(ax, x + 0.1, 11.85, "all the backward reads", ha="left", color=green)
    kept_p = "P" in saved["textbook"]
    box(
        ax,
        9.0,
        9.8,
        6.7,
        1.5,
        "textbook autograd\n"
        + ("also keeps $P$: " if kept_p else "keeps: ")
        + r"$L \times S$",
        color=red,
        fill=0.12,
        textcolor=red,
    )
    ax.plot([0.3, 15.7], [9.4, 9.4], color=MUTED, linewidth=1)

    # Backward pass, bottom band.
    text(ax, 15.8, 8.9, "backward (given $dO$)", ha="right", color=orange)
    box(ax, 0.3, 7.0, 5.2, 1.2, r"$P = \exp(Z - \lambda)$", color=orange)
    text(ax, 2.9, 6.55, "recomputed, tile by tile", color=orange)
    box(ax, 6.2, 7.0, 4.5, 1.2, r"$dV = P^\top dO$", color=orange)
    box(ax, 11.1, 7.0, 4.6, 1.2, r"$dP = dO\,V^\top$", color=orange)
    box(ax, 0.3, 4.3, 6.0, 1.2, r"$\delta = \mathrm{rowsum}(dO \circ O)$", color=orange)
    box(ax, 7.0, 4.3, 6.0, 1.2, r"$dZ = P \circ (dP - \delta)$", color=orange)
    box(ax, 2.6, 1.6, 5.2, 1.2, r"$dQ = dZ\,K/\sqrt{d_k}$", color=orange)
    box(ax, 8.4, 1.6, 5.6, 1.2, r"$dK = dZ^\top Q/\sqrt{d_k}$", color=orange)
    arrow(ax, (5.5, 7.6), (6.2, 7.6))
    arrow(ax, (5.5, 7.15), (8.6, 5.5))
    arrow(ax, (13.4, 7.0), (11.6, 5.5))
    arrow(ax, (6.3, 4.9), (7.0, 4.9))
    arrow(ax, (9.0, 4.3), (5.6, 2.8))
    arrow(ax, (11.0, 4.3), (11.2, 2.8))

    # P is rebuilt from Q, K and the logsumexp (O and V feed delta and dP).
    for name, end in [("Q", 1.0), ("K", 2.3), ("logsumexp", 4.6)]:
        if name in centers:
            arrow(ax, (centers[name], 11.6), (end, 8.2), color=green, linestyle="--")
    ax.set_title("What the attention backward saves and recomputes", color=INK)
    return fig
