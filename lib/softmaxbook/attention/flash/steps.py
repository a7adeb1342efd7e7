"""The teaching loop: :func:`flash_attention_steps` yields FlashAttention's state
tile by tile, the algorithm as the book reads it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import Tensor

from ..._numerics import acc_dtype, causal_offset
from .._args import resolve_attention
from ..online import online_step
from . import _tiles
from ._layout import DEFAULT_BLOCK_SIZE, block_sizes

__all__ = ["FlashStep", "flash_attention_steps"]


class FlashStep(NamedTuple):
    """The state of :func:`flash_attention_steps` after one tile (all tensors
    float32+)."""

    #: Query rows ``[q_start, q_stop)`` and key columns ``[k_start, k_stop)``.
    q_start: int
    q_stop: int
    k_start: int
    k_stop: int
    #: The tile's scaled, masked scores ``(..., bq, bk)``.
    scores: Tensor
    #: Running maximum ``(..., bq)`` after this tile.
    max: Tensor
    #: Running sum of :math:`e^{s - m}` ``(..., bq)`` after this tile.
    sum: Tensor
    #: Unnormalized output ``(..., bq, Dv)`` after this tile; divide by ``sum``.
    acc: Tensor
    #: Whether this is the last tile of the query block (``acc / sum`` is then final).
    last: bool


def flash_attention_steps(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    attn_mask: Tensor | None = None,
    is_causal: bool | str = False,
    scale: float | None = None,
    block_size: int | tuple[int, int] = DEFAULT_BLOCK_SIZE,
) -> Iterator[FlashStep]:
    r"""Step through :func:`flash_attention` tile by tile: yields the running state
    after each tile.

    The plain algorithm, written for reading: for each block of query rows,
    for each block of keys, compute the tile of scores, update the running
    maximum :math:`m`, the running sum :math:`\ell` and the unnormalized
    output :math:`o`, and yield them. After the last tile of a query block,
    ``acc / sum`` is that block of the attention output. (The fast path of
    :func:`flash_attention` does the same arithmetic with in-place updates,
    in base 2.)

    Shapes: as :func:`flash_attention` (``mask`` boolean or float additive, as
    there); each :class:`FlashStep` holds
    ``(..., bq)`` and ``(..., bq, Dv)`` tensors for its query block.

    Equivalent to iterating the loop nest of FlashAttention-2 (Dao, 2024,
    Algorithm 1: query blocks outside, key blocks inside; the original
    FlashAttention ran the key blocks outside); the last step of each query
    block holds its output:

    >>> import torch
    >>> import softmaxbook as sb
    >>> q, k, v = torch.randn(4, 8), torch.randn(10, 8), torch.randn(10, 3)
    >>> steps = list(sb.flash_attention_steps(q, k, v, block_size=(4, 4)))
    >>> len(steps)  # one query block, three key blocks (4 + 4 + 2 keys)
    3
    >>> last = steps[-1]
    >>> out = last.acc / last.sum[..., None]
    >>> torch.allclose(out, sb.flash_attention(q, k, v), atol=1e-6)
    True

    Raises
    ------
    TypeError, ValueError
        For bad input, as :func:`flash_attention`.
    """
    args = resolve_attention(
        q, k, v, mask=mask, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
        caller="flash_attention_steps",
    )  # fmt: skip
    block_q, block_k = block_sizes(block_size)
    L, S, align = args.L, args.S, args.causal
    causal = None if align is None else _tiles.Causal(L, causal_offset(align, L, S))
    mask = None if args.mask is None else args.mask.expand(args.batch + (L, S))
    return _steps(
        q, k, v, args.batch, mask, args.additive, causal, args.scale, block_q, block_k
    )


def _steps(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    batch: tuple[int, ...],
    mask: Tensor | None,
    additive: bool,
    causal: _tiles.Causal | None,
    scale: float,
    block_q: int,
    block_k: int,
) -> Iterator[FlashStep]:
    L, S = q.shape[-2], k.shape[-2]
    acc = acc_dtype(q.dtype)
    q, k, v = (t.expand(batch + t.shape[-2:]).to(acc) for t in (q, k, v))
    for q0 in range(0, L, block_q):
        q1 = min(q0 + block_q, L)
        qb = q[..., q0:q1, :] * scale  # (..., bq, D)
        m = torch.full(qb.shape[:-1], float("-inf"), dtype=acc, device=q.device)
        ell = torch.zeros_like(m)  # (..., bq)
        o = torch.zeros(qb.shape[:-1] + v.shape[-1:], dtype=acc, device=q.device)
        # causal: later key blocks are masked for every row of this block
        k_end = S if causal is None else max(0, min(S, causal.last_key(q0, q1)[1] + 1))
        if k_end == 0:
            yield FlashStep(q0, q1, 0, 0, qb[..., :0], m, ell, o, True)
        for k0 in range(0, k_end, block_k):
            k1 = min(k0 + block_k, S)
            s = qb @ k[..., k0:k1, :].transpose(-2, -1)  # (..., bq, bk): one tile
            if causal is not None:
                s = s.masked_fill(~causal.keep(q0, q1, k0, k1, q.device), float("-inf"))
            elif additive and mask is not None:  # a float mask adds to the scores
                s = s + mask[..., q0:q1, k0:k1]
            elif mask is not None:
                s = s.masked_fill(~mask[..., q0:q1, k0:k1], float("-inf"))
            # the running maximum, the factor that rescales the state, the weights
            m1, alpha, p = online_step(m.unsqueeze(-1), s)
            m = m1.squeeze(-1)
            ell = ell * alpha.squeeze(-1) + p.sum(dim=-1)
            o = o * alpha + p @ v[..., k0:k1, :]
            yield FlashStep(q0, q1, k0, k1, s, m, ell, o, k0 + block_k >= k_end)
