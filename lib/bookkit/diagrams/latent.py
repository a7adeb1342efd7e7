"""Multi-head Latent Attention's dataflow: what is cached, and two ways to read it.

:func:`draw_mla_dataflow` draws, with a model's own sizes (DeepSeek-V3's
``inference/configs/config_671B.json`` on the page), the down-projection of a
token to the cached latent and rotary key, then the two orders of decoding
that :func:`softmaxbook.latent_attention` computes: the naive one, which
rebuilds every head's keys and values from the cache, and the absorbed one,
which moves the query into the latent space and maps the averaged latent out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ._draw import INK, PALETTE, arrow, box, canvas, text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["draw_mla_dataflow"]


def draw_mla_dataflow(config: Mapping[str, int]) -> Figure:
    """MLA's cache and its naive and absorbed decoding, with the sizes of ``config``.

    ``config`` holds ``dim``, ``n_heads``, ``kv_lora_rank``,
    ``qk_nope_head_dim``, ``qk_rope_head_dim`` and ``v_head_dim`` (the names
    of DeepSeek-V3's inference configs). Top: a token's hidden state goes down
    to the latent :math:`c^{KV}` and the shared rotary key :math:`k^R`, the
    only numbers cached per token and layer. Middle: the naive path up-projects
    the cache into every head's keys and values. Bottom: the absorbed path
    scores and averages the latents themselves.
    """
    d, h = config["dim"], config["n_heads"]
    dc, dr = config["kv_lora_rank"], config["qk_rope_head_dim"]
    dn, dv = config["qk_nope_head_dim"], config["v_head_dim"]
    width, height = 17.0, 12.4
    fig, ax = canvas(width, height, figsize=(6.4, 6.4 * height / width))
    blue, orange, green = PALETTE[0], PALETTE[1], PALETTE[2]

    # Top: token -> latent + rotary key, cached.
    y = 9.9
    box(ax, 0.0, y, 3.0, 1.6, f"$h_t$\n{d}")
    arrow(ax, (3.0, y + 0.8), (5.6, y + 0.8), "$W^{DKV}$")
    box(ax, 5.6, y, 11.2, 1.6, color=orange, fill=0.3)
    text(ax, 11.2, y + 1.15, "cached per token and layer")
    text(ax, 11.2, y + 0.45, f"$c^{{KV}}$: {dc}  +  $k^R$: {dr}  =  {dc + dr}")

    # Middle: the naive path.
    y = 5.6
    text(ax, 5.0, y + 2.55, "naive: rebuild every head", ha="left", color=blue)
    arrow(ax, (6.5, 9.9), (2.3, y + 1.7))
    box(ax, 0.0, y, 4.6, 1.7, f"$W^{{UK}}_h, W^{{UV}}_h$\n× {h} heads", color=blue)
    arrow(ax, (4.6, y + 0.85), (6.0, y + 0.85))
    box(ax, 6.0, y, 5.6, 1.7, f"keys {h}×{dn + dr}\nvalues {h}×{dv}", color=blue)
    arrow(ax, (11.6, y + 0.85), (13.0, y + 0.85))
    box(ax, 13.0, y, 3.8, 1.7, "softmax\n$p$ · values", color=blue)

    # Bottom: the absorbed path.
    y = 1.2
    text(ax, 0.0, y + 2.55, "absorbed: attend to the latents", ha="left", color=green)
    box(ax, 0.0, y, 2.6, 1.7, f"$q^N_h$\n{dn}", color=green)
    arrow(ax, (2.6, y + 0.85), (4.6, y + 0.85), r"$W^{UK\top}_h$")
    box(ax, 4.6, y, 2.6, 1.7, f"$\\tilde q_h$\n{dc}", color=green)
    arrow(ax, (7.2, y + 0.85), (8.4, y + 0.85))
    box(ax, 8.4, y, 3.6, 1.7, "softmax\n$p \\cdot c^{KV}$", color=green)
    arrow(ax, (12.0, y + 0.85), (14.2, y + 0.85), "$W^{UV}_h$")
    box(ax, 14.2, y, 2.6, 1.7, f"$o_h$\n{dv}", color=green)
    arrow(ax, (13.5, 9.9), (10.2, y + 1.7), color=INK, linestyle="--")
    return fig
