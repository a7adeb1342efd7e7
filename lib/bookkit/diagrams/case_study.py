"""The case study of chapter 9 as a schematic: the task and the model.

An associative-recall sequence enters at the top, is embedded, passes the
Transformer blocks (pre-LayerNorm attention and MLP, each added to the
residual stream) and is read out at its last position. The normalizer of the
attention, the one thing the chapter varies, is drawn in its own colour with
the variants of the seed sweep. Every size is read from the chapter's recipe
(``bookkit.studies.case_study``) and from a model it builds, so the drawing
cannot drift from the code it explains.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._draw import INK, PALETTE, arrow, box, canvas, cells, text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["draw_model", "model_sizes"]

# How the sweep's variants are written in the drawing.
_NORMALIZER_NAMES = {
    "softmax": "softmax",
    "softmax_one": "softmax-off-by-one",
    "entmax15": "entmax-1.5",
    "sparsemax": "sparsemax",
    "sigmoid": "sigmoid",
}


def model_sizes() -> dict:
    """The sizes the diagram shows, read from the recipe and a model built by it.

    Returns a dict with ``vocab``, ``length``, ``n_pairs``, ``d_model``,
    ``n_heads``, ``d_head``, ``n_layers``, ``d_ff``, ``n_params`` and
    ``normalizers`` (the normalizers the seed sweep trains).
    """
    from bookkit.studies import case_study as cs

    model = cs.new_model(seed=1)
    block: Any = model.blocks[0]  # an nn.ModuleList item: its fields are untyped
    normalizers = ["softmax"] + [
        v["normalizer"] for v in cs.VARIANTS.values() if "normalizer" in v
    ]
    return {
        "vocab": model.vocab_size,
        "length": model.max_len,
        "n_pairs": cs.N_PAIRS,
        "d_model": block.attn.qkv.in_features,
        "n_heads": block.attn.n_heads,
        "d_head": block.attn.d_head,
        "n_layers": model.n_layers,
        "d_ff": block.mlp[0].out_features,
        "n_params": sum(p.numel() for p in model.parameters()),
        "normalizers": list(dict.fromkeys(normalizers)),
    }


def _example_tokens() -> tuple[list[int], int]:
    """The first held-out sequence of the recipe (the chapter's example), and its
    answer."""
    from bookkit.studies import case_study as cs

    _, (tokens, targets) = cs.make_data()
    return tokens[0].tolist(), int(targets[0])


def _name(token: int) -> str:
    from bookkit.studies import case_study as cs

    return f"k{token}" if token < cs.N_KEYS else f"v{token - cs.N_KEYS}"


def draw_model(
    title: str = "The case study: associative recall, tiny Transformer",
) -> Figure:
    """The task and the model of chapter 9, with the recipe's real sizes.

    From the top: one associative-recall sequence (keys, values, the query),
    the token and position embeddings, one Transformer block drawn in full
    (repeated ``n_layers`` times), in which the attention's normalizer is the
    part the chapter varies, and the read-out of the answer at the last
    position.
    """
    s = model_sizes()
    tokens, answer = _example_tokens()
    names = [_name(t) for t in tokens]
    width, height = 12.0, 13.2
    fig, ax = canvas(width, height, figsize=(6.4, 7.1), title=title)
    blue, orange, green, grey = PALETTE[0], PALETTE[1], PALETTE[2], PALETTE[7]
    # The query in vermillion: orange is kept for the one part the chapter varies.
    vermillion = PALETTE[3]

    # The input sequence: pairs k v, then the query key.
    n = len(names)
    size = 0.95
    x0 = (width - n * size) / 2
    y_seq = 11.6
    colours = [[blue if i % 2 == 0 else green for i in range(n - 1)] + [vermillion]]
    cells(ax, colours, x0, y_seq, size=size)
    for i, name in enumerate(names):
        label = name + "?" if i == n - 1 else name
        text(
            ax,
            x0 + (i + 0.5) * size,
            y_seq + size / 2,
            label,
            fontsize=10,
            color="white",
        )
    text(
        ax,
        width / 2,
        y_seq + size + 0.3,
        f"{s['n_pairs']} key-value pairs, then a key: answer its value "
        f"($L$ = {s['length']}, $|\\mathcal{{V}}|$ = {s['vocab']})",
        fontsize=9,
    )

    # Embeddings.
    y = 9.7
    arrow(ax, (width / 2, y_seq), (width / 2, y + 1.25))
    box(
        ax,
        1.0,
        y,
        width - 2.0,
        1.25,
        f"token + position embedding\n{s['vocab']} tokens, "
        f"{s['length']} positions → width {s['d_model']}",
        color=grey,
    )

    # One block, drawn in full, repeated n_layers times.
    top, bottom = 9.4, 3.2
    box(ax, 0.4, bottom, width - 0.8, top - bottom, "", color=grey, fill=0.04)
    text(
        ax,
        width - 0.6,
        top - 0.3,
        f"× {s['n_layers']} blocks",
        fontsize=10,
        ha="right",
        fontweight="bold",
    )
    arrow(ax, (3.2, y), (3.2, 8.75))
    box(ax, 1.0, 8.0, 4.4, 0.75, "LayerNorm", color=grey, fontsize=9)
    text(
        ax,
        7.7,
        8.38,
        f"{s['n_heads']} heads, $d_k$ = {s['d_head']}, causal",
        fontsize=9,
    )
    arrow(ax, (3.2, 8.0), (3.2, 7.45))
    # The attention, with the part the chapter varies in its own colour.
    box(ax, 1.0, 4.7, width - 2.0, 2.8, "", color=blue, fill=0.10)
    text(ax, 3.2, 7.05, "attention", fontsize=10, fontweight="bold")
    text(ax, 3.2, 6.45, r"scores $c\,QK^\top\!/T$", fontsize=10)
    text(ax, 3.2, 5.75, r"$c = 1/\sqrt{d_k}$ or 1", fontsize=9)
    text(ax, 3.2, 5.25, r"$T$ = 1 or 0.1", fontsize=9)
    arrow(ax, (4.8, 6.2), (5.5, 6.2))
    box(ax, 5.5, 4.8, 5.4, 2.6, "", color=orange, fill=0.25)
    text(ax, 8.2, 7.05, "normalizer (varied)", fontweight="bold")
    variants = [_NORMALIZER_NAMES.get(v, v) for v in s["normalizers"]]
    chunks = [variants[i : i + 2] for i in range(0, len(variants), 2)]
    for row, chunk in enumerate(chunks):  # two names a line: phone-legible
        last = row == len(chunks) - 1
        text(ax, 8.2, 6.55 - 0.45 * row, ", ".join(chunk) + ("" if last else ","))
    text(ax, 8.2, 6.55 - 0.45 * len(chunks) - 0.05, "weights → mix the values")
    box(ax, 1.0, 3.5, 4.4, 0.75, "LayerNorm → MLP", color=grey, fontsize=9)
    text(
        ax,
        7.9,
        3.88,
        f"width {s['d_model']} → {s['d_ff']} → {s['d_model']}",
        fontsize=9,
    )
    arrow(ax, (3.2, 4.7), (3.2, 4.25), "+ residual", offset=(1.0, -0.1))

    # Read-out at the last position.
    arrow(ax, (3.2, 3.5), (3.2, 2.35), "+ residual", offset=(1.0, -0.05))
    box(
        ax,
        1.0,
        1.45,
        width - 2.0,
        0.9,
        f"LayerNorm → linear {s['d_model']} → {s['vocab']} logits",
        color=grey,
        fontsize=9,
    )
    arrow(ax, (width / 2, 1.45), (width / 2, 0.75))
    text(
        ax,
        width / 2,
        0.45,
        f"read at the last position: {_name(answer)}   "
        f"({s['n_params']:,} parameters in all)",
        fontsize=10,
        color=INK,
    )
    return fig
