"""The flat layout of the tile loops: every call as ``(BH, R, .)``.

Grouped-query attention (``enable_gqa``), learned sink logits (``sinks``) and
both alignments of the causal mask are handled here, once, by bringing every
call to one layout: queries ``(BH, R, D)`` with ``R`` rows, keys and values
``(BH, S, .)``. Query heads that share a key head are stacked as rows of one
problem, so a key and value head is read once for its whole group.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from ..._numerics import acc_dtype, causal_offset
from ..._validate import check_positive_int
from .._args import AttentionArgs
from . import _tiles

__all__ = ["DEFAULT_BLOCK_SIZE", "Layout", "Call", "block_sizes", "prepare"]

#: Default tile sizes ``(block_q, block_k)`` of the torch path: large enough that
#: the per-tile matrix products dwarf Python's per-tile overhead, while one
#: head's (256, 512) float32 tile of scores (512 KiB) stays in a core's L2 cache.
DEFAULT_BLOCK_SIZE = (256, 512)


def block_sizes(block_size: object) -> tuple[int, int]:
    if block_size is None:
        return DEFAULT_BLOCK_SIZE
    if isinstance(block_size, tuple) and len(block_size) == 2:
        return (
            check_positive_int(block_size[0], "block_size[0]"),
            check_positive_int(block_size[1], "block_size[1]"),
        )
    if isinstance(block_size, tuple):
        raise ValueError(
            f"block_size must be an int or a pair (block_q, block_k), "
            f"got a tuple of length {len(block_size)}"
        )
    block = check_positive_int(block_size, "block_size")
    return block, block


class Layout:
    """How one call maps onto the flat layout ``(BH, R, .)`` of :mod:`_tiles`, and
    back.

    ``rows(x)`` brings a tensor with the queries' rows (``q``, the output, its
    gradient ``(..., L, .)``, the logsumexp ``(..., L)``) to ``(BH, R, .)``;
    ``unrows(x)`` undoes it. All are differentiable torch views and reshapes, so
    autograd carries gradients through them. With ``fold``, the trailing batch
    dimension (query heads that share one key head, or that broadcast against
    it) is stacked into the rows. With ``groups > 1`` (grouped-query attention)
    the query heads ``Hq`` are first split into ``(Hkv, G)``.
    """

    def __init__(self, batch: tuple[int, ...], L: int, S: int, fold: bool, groups: int):
        self.groups = groups
        if groups > 1:  # (..., Hq) -> (..., Hkv, G)
            batch = batch[:-1] + (batch[-1] // groups, groups)
        self.batch, self.L, self.S, self.fold = batch, L, S, fold
        self.outer = batch[:-1] if fold else batch  # batch dims left after folding
        self.BH = math.prod(self.outer)
        self.R = L * (batch[-1] if fold else 1)

    def split_heads(self, x: Tensor, trailing: int) -> Tensor:
        """``(..., Hq, L, *t)`` -> ``(..., Hkv, G, L, *t)`` for grouped heads."""
        if self.groups == 1 or x.dim() < 2 + trailing:
            return x
        return x.unflatten(x.dim() - 2 - trailing, (-1, self.groups))

    def rows(self, x: Tensor, trailing: tuple[int, ...] = ()) -> Tensor:
        """``(..., L, *trailing)`` broadcast to the batch -> ``(BH, R, *trailing)``."""
        x = self.split_heads(x, len(trailing))
        x = x.expand(self.batch + (self.L,) + trailing)
        return x.reshape((self.BH, self.R) + trailing)

    def unrows(self, x: Tensor) -> Tensor:
        """``(BH, R, *trailing)`` -> ``batch + (L, *trailing)`` (query heads merged)."""
        x = x.reshape(self.batch + (self.L,) + tuple(x.shape[2:]))
        if self.groups > 1:
            d = len(self.batch) - 2
            x = x.flatten(d, d + 1)
        return x

    def keys(self, x: Tensor) -> Tensor:
        """k or v ``(..., S, .)`` -> ``(BH, S, .)``."""
        if self.groups > 1:
            x = x.unsqueeze(-3)
        outer = self.outer + ((1,) if self.fold else ())
        x = x.expand(outer + x.shape[-2:])
        if self.fold:
            x = x.squeeze(-3)
        return x.reshape((self.BH,) + x.shape[-2:])

    def unkeys(self, x: Tensor, shape: torch.Size) -> Tensor:
        """A gradient ``(BH, S, .)`` -> summed over broadcast dims to ``shape``."""
        x = x.reshape(self.outer + ((1,) if self.fold else ()) + x.shape[-2:])
        if self.groups > 1:
            return x.sum_to_size(shape[:-2] + (1,) + shape[-2:]).reshape(shape)
        return x.sum_to_size(shape)


class Call(NamedTuple):
    problem: _tiles.Problem
    layout: Layout
    sinks: Tensor | None  # (BH, R), float32+


def prepare(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    args: AttentionArgs,
    block_size: int | tuple[int, int] | None,
) -> Call:
    """Bring a call, its arguments resolved, to the flat layout of :mod:`_tiles`."""
    block_q, block_k = block_sizes(block_size)
    batch, L, S, groups = args.batch, args.L, args.S, args.groups
    grouped = groups > 1
    # Fold the trailing batch dimension into the rows when the keys broadcast along
    # it: always without a mask, and with one for grouped query heads, whose mask
    # rows fold with them, so that shared key heads are read, never repeated.
    kv_heads = [t.shape[-3] if t.dim() >= 3 else 1 for t in (k, v)]
    fold = (
        (args.mask is None or grouped)
        and len(batch) > 0
        and (batch[-1] > 1 or grouped)
        and q.dim() >= 3
        and (grouped or (q.shape[-3] == batch[-1] and max(kv_heads) == 1))
    )
    layout = Layout(batch, L, S, fold, groups)
    keep = bias = None
    if args.mask is not None:
        # A view when the mask's batch strides allow it (a shared (L, S) mask, or a
        # full one); otherwise a copy of the mask.
        mask = layout.rows(args.mask.expand(batch + (L, S)), (S,))
        keep, bias = (None, mask) if args.additive else (mask, None)
    causal = None
    if args.causal is not None:
        causal = _tiles.Causal(L, causal_offset(args.causal, L, S))
    problem = _tiles.Problem(
        layout.rows(q, q.shape[-1:]),
        layout.keys(k),
        layout.keys(v),
        keep,
        causal,
        args.scale,
        block_q,
        block_k,
        bias,
    )
    sink_rows = None
    if args.sinks is not None:
        acc = acc_dtype(q.dtype)
        s = args.sinks.to(acc).expand(batch)
        sink_rows = layout.rows(s.unsqueeze(-1), ()).reshape(layout.BH, layout.R)
    return Call(problem, layout, sink_rows)
