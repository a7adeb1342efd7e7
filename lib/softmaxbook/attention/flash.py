r"""FlashAttention: exact attention tile by tile, forward and backward.

The forward pass (Dao et al., 2022), in FlashAttention-2's loop order (Dao,
2024: query blocks outside, key blocks inside), streams key and value tiles
past each block of queries with the online softmax, so the ``(L, S)`` score
matrix is never formed. The backward pass saves only ``q, k, v``, the output
and one logsumexp per row (FlashAttention-2's state; the original kept the
row maximum and sum), and recomputes the tiles: with
:math:`\delta_i = \sum_d dO_{id}\, O_{id}` the weights' gradient needs no
stored weights (see :func:`flash_attention_backward`).

:class:`FlashAttention` is that algorithm as a ``torch.autograd.Function``: its
node is the output's own ``grad_fn`` and saves exactly ``Q, K, V, O`` and the
logsumexp. Three implementations run it, and
``explain_dispatch("flash_attention", q, k, v, **options)`` says which one a
call takes, and why:

- ``"torch"``: the tile loops of ``softmaxbook.attention._tiles``, the algorithm as the
  book teaches it (forced by ``block_size=`` or ``explicit=True``; also every
  case the other two do not cover: sinks, float16/bfloat16, broadcast batches,
  rows with nothing to attend, ``torch.func`` transforms);
- ``"fused"``: on the CPU, torch's own FlashAttention kernel
  (``aten::_scaled_dot_product_flash_attention_for_cpu`` and its backward), the
  same algorithm compiled, where it computes the same thing;
- ``"triton"``: the Triton kernels of :mod:`softmaxbook.kernels` on a CUDA GPU.

Grouped-query attention (``enable_gqa``), learned sink logits (``sinks``) and
both alignments of the causal mask (``is_causal="top_left"`` or
``"bottom_right"``) are handled here, once, by bringing every call to one
layout: queries ``(BH, R, D)`` with ``R`` rows, keys and values ``(BH, S,
.)``. Query heads that share a key head are stacked as rows of one problem,
so a key and value head is read once for its whole group.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .. import kernels as _kernels
from .._api import renamed_keywords
from .._validate import CAUSAL_ALIGNMENTS as _CAUSAL_ALIGNMENTS
from .._validate import check_float, check_positive_int
from ..kernels import dispatch as _dispatch
from . import _tiles
from ._args import AttentionArgs, resolve_attention

__all__ = [
    "FlashAttention",
    "flash_attention",
    "flash_attention_backward",
    "flash_attention_steps",
    "FlashStep",
    "CAUSAL_ALIGNMENTS",
]

#: Default tile sizes ``(block_q, block_k)`` of the torch path: large enough that
#: the per-tile matrix products dwarf Python's per-tile overhead, while one
#: head's (256, 512) float32 tile of scores (512 KiB) stays in a core's L2 cache.
DEFAULT_BLOCK_SIZE = (256, 512)

#: The names ``is_causal`` accepts for the two alignments of a causal mask when
#: ``L != S``: ``"top_left"`` (torch's ``is_causal=True``: query ``i`` sees keys
#: ``j <= i``) and ``"bottom_right"`` (flash-attn's: the last query sees the last
#: key, ``j <= i + S - L``, the KV-cache case).
CAUSAL_ALIGNMENTS = _CAUSAL_ALIGNMENTS


def _aten(name: str) -> Any:
    """The operator ``aten::name``, or None where this torch has none."""
    try:
        return getattr(torch.ops.aten, name).default
    except (AttributeError, RuntimeError):
        return None


#: torch's FlashAttention kernel for the CPU, forward and backward (None where this
#: torch has no such operator: the fused path is then never taken).
_FUSED_FORWARD = _aten("_scaled_dot_product_flash_attention_for_cpu")
_FUSED_BACKWARD = _aten("_scaled_dot_product_flash_attention_for_cpu_backward")

#: The dtypes of the fused path: the tile loops compute float16 and bfloat16 in
#: float32 and round once, which torch's CPU kernel does not promise.
FUSED_DTYPES = (torch.float32, torch.float64)


# --------------------------------------------------------------------------------------
# Arguments and the flat layout
# --------------------------------------------------------------------------------------


def _block_sizes(block_size: object) -> tuple[int, int]:
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


class _Layout:
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


class _Call(NamedTuple):
    problem: _tiles.Problem
    layout: _Layout
    sinks: Tensor | None  # (BH, R), float32+


def _prepare(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    args: AttentionArgs,
    block_size: int | tuple[int, int] | None,
) -> _Call:
    """Bring a call, its arguments resolved, to the flat layout of :mod:`_tiles`."""
    block_q, block_k = _block_sizes(block_size)
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
    layout = _Layout(batch, L, S, fold, groups)
    keep = bias = None
    if args.mask is not None:
        # A view when the mask's batch strides allow it (a shared (L, S) mask, or a
        # full one); otherwise a copy of the mask.
        mask = layout.rows(args.mask.expand(batch + (L, S)), (S,))
        keep, bias = (None, mask) if args.additive else (mask, None)
    causal = None
    if args.causal is not None:
        causal = _tiles.Causal(L, 0 if args.causal == "top_left" else S - L)
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
        acc = torch.promote_types(q.dtype, torch.float32)
        s = args.sinks.to(acc).expand(batch)
        sink_rows = layout.rows(s.unsqueeze(-1), ()).reshape(layout.BH, layout.R)
    return _Call(problem, layout, sink_rows)


# --------------------------------------------------------------------------------------
# Which path a call takes
# --------------------------------------------------------------------------------------

FUSED_REASON = (
    "softmax attention on the CPU that torch's own FlashAttention kernel "
    "(aten::_scaled_dot_product_flash_attention_for_cpu) computes the same way"
)


def _decide(
    q: Tensor, k: Tensor, v: Tensor, args: AttentionArgs, tiled: bool
) -> tuple[str, str]:
    """``(path, reason)``: ``"triton"``, ``"fused"`` or ``"torch"`` (the tile loops).

    The fused kernel is taken only where it gives this library's results: no
    sinks, float32 or float64, one batch shape for q, k and v (no broadcasting;
    grouped heads only without a mask or causality), ``Dv == D``, torch's causal
    alignment, and no row with nothing to attend (the kernel gives such a row a
    logsumexp of 0, not ``-inf``). With a mask, q and k must be finite: the
    kernel adds the mask, so a nan at a masked key would reach the output.
    """
    kernel = _dispatch.kernel_decision("flash_attention", q, k, v)
    if kernel.path == "triton":
        if args.additive:
            return "torch", "the Triton kernel takes a boolean mask, not a float one"
        return kernel.path, kernel.reason
    if tiled:
        return "torch", "block_size= or explicit=True forces the library's tile loops"
    reason = _not_fused(q, k, v, args)
    if reason is not None:
        return "torch", reason
    return "fused", FUSED_REASON


def _not_fused(q: Tensor, k: Tensor, v: Tensor, args: AttentionArgs) -> str | None:
    """Why torch's CPU kernel cannot take this call, or None when it can."""
    if _FUSED_FORWARD is None or _FUSED_BACKWARD is None:
        return "this torch has no CPU FlashAttention operator"
    if q.device.type != "cpu" or k.device.type != "cpu" or v.device.type != "cpu":
        return _dispatch.kernel_decision("flash_attention", q, k, v).reason
    if _functorch_active():
        return "a torch.func transform is active: the tile loops batch under vmap"
    if args.sinks is not None:
        return "sink logits are merged into the tile loops' state"
    if q.dtype not in FUSED_DTYPES:
        return (
            f"{q.dtype}: the tile loops compute in float32 and round once to "
            "the input's dtype"
        )
    if not 2 <= q.dim() <= 4 or not q.dim() == k.dim() == v.dim():
        return "the fused kernel takes tensors of 2 to 4 dimensions, all alike"
    if q.shape[-1] != v.shape[-1]:
        return "the value head size differs from the query head size"
    if args.groups > 1 and (args.mask is not None or args.causal is not None):
        return "grouped query heads with a mask or causality fold into the tiles' rows"
    kv_batch = q.shape[:-3] + (q.shape[-3] // args.groups,) if args.groups > 1 else None
    want = q.shape[:-2] if kv_batch is None else kv_batch
    if k.shape[:-2] != want or v.shape[:-2] != want:
        return "the batch shapes of q, k and v differ (broadcasting)"
    if q.numel() == 0 or k.numel() == 0:
        return "an empty dimension: nothing for a kernel to do"
    if args.causal == "bottom_right":
        return "the fused kernel aligns a causal mask top-left only"
    if args.mask is not None:
        if args.mask.dim() > q.dim():
            return "the mask has more dimensions than q"
        if _has_empty_row(args.mask, args.additive):
            return "a row has nothing to attend: the tile loops give it zeros"
        if not (torch.isfinite(q).all() and torch.isfinite(k).all()):
            return "q or k holds a nan or infinity, which a masked key must not pass on"
    return None


def _has_empty_row(mask: Tensor, additive: bool) -> bool:
    keep = mask != float("-inf") if additive else mask
    return not bool(keep.any(dim=-1).all())


def _functorch_active() -> bool:
    active = getattr(torch._C, "_are_functorch_transforms_active", None)
    return bool(active and active())


def _explain(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    attn_mask: Tensor | None = None,
    is_causal: bool | str = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    block_size: int | tuple[int, int] | None = None,
    enable_gqa: bool = False,
    sinks: Tensor | None = None,
    explicit: bool = False,
    return_lse: bool = False,
) -> tuple[str, str]:
    """``(path, reason)`` of a :func:`flash_attention` call (``explain_dispatch``)."""
    args = resolve_attention(
        q, k, v, mask=mask, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
        sinks=sinks, enable_gqa=enable_gqa, dropout_p=dropout_p,
        caller="flash_attention",
    )  # fmt: skip
    if args.dropout_p > 0.0:
        return "dropout", DROPOUT_REASON
    _block_sizes(block_size)
    return _decide(q, k, v, args, explicit or block_size is not None)


DROPOUT_REASON = (
    "dropout_p > 0 drops weights, which the tiles never store: the weights are "
    "formed, dropped as torch does (torch.dropout) and averaged, as in "
    "torch.nn.functional.scaled_dot_product_attention"
)


# --------------------------------------------------------------------------------------
# The autograd Function
# --------------------------------------------------------------------------------------


class _Options(NamedTuple):
    """The non-tensor arguments of one :class:`FlashAttention` call, resolved."""

    is_causal: bool | str
    scale: float
    enable_gqa: bool
    block_size: int | tuple[int, int] | None
    path: str  # "fused", "torch" or "triton"


def _with_sink(out: Tensor, lse: Tensor, sinks: Tensor) -> tuple[Tensor, Tensor]:
    """Merge a sink into a finished row: a state with logsumexp ``sink`` and output 0.

    ``lse' = log(e^lse + e^sink)`` and the output shrinks by the share of the
    mass on the keys, ``e^(lse - lse')``.
    """
    total = torch.logaddexp(lse, sinks)
    share = torch.exp(lse - total).masked_fill(torch.isneginf(total), 0.0)
    return out * share.unsqueeze(-1), total


def _as_4d(x: Tensor) -> Tensor:
    """``(L, D)`` or ``(B, L, D)`` as the ``(B, H, L, D)`` torch's kernel takes."""
    while x.dim() < 4:
        x = x.unsqueeze(0 if x.dim() == 2 else 1)
    return x


def _fused_mask(mask: Tensor | None, additive: bool, q: Tensor) -> Tensor | None:
    """The mask as torch's kernel takes it: additive, q's dtype, 4 dimensions that
    broadcast against ``_as_4d(q)``."""
    if mask is None:
        return None
    if not additive:  # (FlashAttention.apply converts a boolean mask first)
        mask = _as_additive(mask, q.dtype)
    if q.dim() == 3 and mask.dim() == 3:  # (B, L, S) -> (B, 1, L, S)
        mask = mask.unsqueeze(1)
    while mask.dim() < 4:  # the kernel takes 2 or 4 dimensions: (S,), (H, L, S) ...
        mask = mask.unsqueeze(0)
    return mask


def _fold_groups(q: Tensor, k: Tensor) -> Tensor:
    """Grouped query heads ``(..., Hq, L, D)`` as rows ``(..., Hkv, G * L, D)``: the
    G query heads of one key head attend to it as one longer block of queries
    (without a mask or causality, rows do not know their position)."""
    hk = k.shape[-3]
    return q.reshape(q.shape[:-3] + (hk, -1, q.shape[-1]))


def _fused_forward(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, additive: bool, o: _Options
) -> tuple[Tensor, Tensor]:
    assert _FUSED_FORWARD is not None
    shape = q.shape
    if o.enable_gqa:
        q = _fold_groups(q, k)
    out, lse = _FUSED_FORWARD(
        _as_4d(q),
        _as_4d(k),
        _as_4d(v),
        0.0,
        bool(o.is_causal),
        attn_mask=_fused_mask(mask, additive, q),
        scale=o.scale,
    )
    if q.dim() < 4 or o.enable_gqa:
        out, lse = out.reshape(shape[:-1] + v.shape[-1:]), lse.reshape(shape[:-1])
    return out, lse


def _fused_backward(
    ctx: Any,
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    assert _FUSED_BACKWARD is not None
    o: _Options = ctx.options
    mask = ctx.saved_tensors[5] if ctx.has_mask else None
    shapes = q.shape, k.shape, v.shape
    if o.enable_gqa:
        q, out, grad_out = (_fold_groups(t, k) for t in (q, out, grad_out))
    if q.dim() < 4 or o.enable_gqa:
        lse = lse.reshape(_as_4d(q).shape[:-1])
    grads = _FUSED_BACKWARD(
        _as_4d(grad_out),
        _as_4d(q),
        _as_4d(k),
        _as_4d(v),
        _as_4d(out),
        lse,
        0.0,
        bool(o.is_causal),
        attn_mask=_fused_mask(mask, ctx.additive, q),
        scale=o.scale,
    )
    dq, dk, dv = (
        g if g.shape == s else g.reshape(s) for g, s in zip(grads, shapes, strict=True)
    )
    return dq, dk, dv


class FlashAttention(torch.autograd.Function):
    r"""FlashAttention as an autograd Function: the forward pass saves ``Q, K, V``,
    the output ``O`` and one logsumexp per query row, and the backward pass
    recomputes the weights from them.

    ``FlashAttention.apply(q, k, v, is_causal=False, *, mask=None, scale=None,
    sinks=None, enable_gqa=False, block_size=None, explicit=False,
    return_lse=False)`` returns the output ``(..., L, Dv)`` (and the logsumexp
    ``(..., L)`` with ``return_lse=True``), as :func:`flash_attention`, which
    calls it. The output's ``grad_fn`` is this Function's node, and its
    ``saved_tensors`` are exactly ``(q, k, v, out, lse)`` (the inputs as given,
    the output and the logsumexp, in the output's batch shape and in float32,
    float64 for float64 input); a mask is saved as a sixth (no gradient): as
    given on the tile loops, and on the fused path as the float additive mask
    torch's kernel reads (a boolean one converted once, as torch's own SDPA
    saves it); sinks are saved last. No tensor of the ``(L, S)`` scores is
    kept beyond the mask.

    The backward pass is first-order (``once_differentiable``); ``torch.func``
    transforms (``vmap``, ``jacrev``, ``grad``) work through a vmap rule that
    folds the vmapped dimension into the batch. Rows with nothing to attend
    give zeros, forward and backward. A mask gets no gradient.

    Equivalent to ``torch.nn.functional.scaled_dot_product_attention(q, k, v,
    attn_mask=mask, is_causal=is_causal, scale=scale)`` (with zeros for fully
    masked rows).

    Examples
    --------
    >>> import torch, softmaxbook as sb
    >>> q, k, v = (torch.randn(2, 8, 4, requires_grad=True) for _ in range(3))
    >>> out = sb.FlashAttention.apply(q, k, v, True)
    >>> type(out.grad_fn).__name__
    'FlashAttentionBackward'
    >>> [tuple(t.shape) for t in out.grad_fn.saved_tensors]
    [(2, 8, 4), (2, 8, 4), (2, 8, 4), (2, 8, 4), (2, 8)]
    >>> want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    >>> torch.allclose(out, want, atol=1e-6)
    True
    """

    @staticmethod
    def forward(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        sinks: Tensor | None,
        options: _Options,
    ) -> tuple[Tensor, Tensor]:
        if options.path == "fused":
            out, lse = _fused_forward(q, k, v, mask, _additive(mask), options)
            return _own(out), _own(lse)
        args = _resolve(q, k, v, mask, sinks, options)
        call = _prepare(q, k, v, args, options.block_size)
        p = call.problem
        if options.path == "triton":
            out, lse = _kernels.triton_flash_forward(
                p.q, p.k, p.v, mask=p.keep, causal=p.causal, scale=p.scale
            )
        else:
            out, lse = _tiles.forward(p)
        if call.sinks is not None:
            out, lse = _with_sink(out, lse, call.sinks)
        out = call.layout.unrows(out).to(q.dtype)
        return _own(out), _own(call.layout.unrows(lse.unsqueeze(-1)).squeeze(-1))

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
        q, k, v, mask, sinks, options = inputs
        out, lse = output
        extra = [t for t in (mask, sinks) if t is not None]
        ctx.save_for_backward(q, k, v, out, lse, *extra)
        ctx.options, ctx.has_mask, ctx.additive = options, mask is not None, False
        if mask is not None:
            ctx.additive = _additive(mask)
        ctx.set_materialize_grads(False)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor | None, grad_lse: Tensor | None) -> tuple:
        q, k, v, out, lse, *extra = ctx.saved_tensors
        mask = extra.pop(0) if ctx.has_mask else None
        sinks = extra[0] if extra else None
        nones = (None, None, None)
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        if ctx.options.path == "fused" and grad_lse is None and not _functorch_active():
            return *_fused_backward(ctx, grad_out, q, k, v, out, lse), *nones
        args = _resolve(q, k, v, mask, sinks, ctx.options)
        call = _prepare(q, k, v, args, ctx.options.block_size)
        rows = call.layout.rows
        Dv = v.shape[-1]
        do3, out3 = rows(grad_out, (Dv,)), rows(out, (Dv,))
        lse3 = rows(lse.unsqueeze(-1), (1,)).squeeze(-1)
        dlse3 = None if grad_lse is None else rows(grad_lse.unsqueeze(-1), (1,))
        delta = _delta(out3, do3, None if dlse3 is None else dlse3.squeeze(-1))
        p = call.problem
        dq, dk, dv = _FlashBackward.apply(
            p.q, p.k, p.v, p.keep, p.bias, do3, lse3, delta, p.causal, p.scale,
            p.block_q, p.block_k, ctx.options.path,
        )  # fmt: skip
        dq = call.layout.unrows(dq).sum_to_size(q.shape).to(q.dtype)
        dk = call.layout.unkeys(dk, k.shape).to(k.dtype)
        dv = call.layout.unkeys(dv, v.shape).to(v.dtype)
        d_sinks = None
        if sinks is not None and call.sinks is not None and ctx.needs_input_grad[4]:
            # The sink is one more score with value 0: its gradient is its weight
            # times (dlse - delta_0), with delta_0 = rowsum(dO o O).
            weight = torch.exp(call.sinks - lse3).masked_fill(torch.isneginf(lse3), 0.0)
            d_rows = call.layout.unrows((-weight * delta).unsqueeze(-1)).squeeze(-1)
            d_sinks = d_rows.sum(-1).sum_to_size(sinks.shape).to(sinks.dtype)
        return dq, dk, dv, None, d_sinks, None

    @staticmethod
    def vmap(
        info: Any,
        in_dims: tuple,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        sinks: Tensor | None,
        options: _Options,
    ) -> tuple[tuple[Tensor, Tensor], tuple[int, int]]:
        tensors = _vmapped_first(info, in_dims[:5], (q, k, v, mask, sinks))
        q, k, v, mask, sinks = tensors
        return FlashAttention._call(q, k, v, mask, sinks, options), (0, 0)

    @classmethod
    def _call(
        cls,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        sinks: Tensor | None,
        options: _Options,
    ) -> tuple[Tensor, Tensor]:
        return super().apply(q, k, v, mask, sinks, options)

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Any:
        """``apply(q, k, v, is_causal=False, *, mask=None, attn_mask=None,
        scale=None, sinks=None, enable_gqa=False, block_size=None,
        explicit=False, return_lse=False)``: the output, or ``(out, lse)`` with
        ``return_lse=True``."""
        if len(args) == 6 and not kwargs and isinstance(args[5], _Options):
            # torch.func calls apply again with forward's own arguments
            return super().apply(*args)
        return _apply(*args, **kwargs)


def _apply(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    is_causal: bool | str = False,
    *,
    mask: Tensor | None = None,
    attn_mask: Tensor | None = None,
    scale: float | None = None,
    sinks: Tensor | None = None,
    enable_gqa: bool = False,
    block_size: int | tuple[int, int] | None = None,
    explicit: bool = False,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """:meth:`FlashAttention.apply` with its arguments named: resolve them, decide
    the path and run the Function."""
    args = resolve_attention(
        q, k, v, mask=mask, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
        sinks=sinks, enable_gqa=enable_gqa, caller="FlashAttention.apply",
    )  # fmt: skip
    out, lse = _run(q, k, v, args, block_size, explicit)
    return (out, lse) if return_lse else out


def _own(x: Tensor) -> Tensor:
    """``x``, copied if it is a view: an output of the Function that is a view of a
    tensor made inside it could not be modified in place by the caller."""
    return x if x._base is None else x.clone()


def _additive(mask: Tensor | None) -> bool:
    return mask is not None and mask.dtype != torch.bool


def _resolve(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    sinks: Tensor | None,
    o: _Options,
) -> AttentionArgs:
    return resolve_attention(
        q, k, v, mask=mask, is_causal=o.is_causal, scale=o.scale, sinks=sinks,
        enable_gqa=o.enable_gqa, caller="flash_attention",
    )  # fmt: skip


def _run(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    args: AttentionArgs,
    block_size: int | tuple[int, int] | None,
    explicit: bool,
) -> tuple[Tensor, Tensor]:
    """Decide the path of a resolved call and run :class:`FlashAttention` on it."""
    _block_sizes(block_size)  # checked even where the fused path ignores it
    path, _ = _decide(q, k, v, args, explicit or block_size is not None)
    options = _Options(
        args.causal or False, args.scale, args.groups > 1, block_size, path
    )
    mask = args.mask
    if path == "fused" and mask is not None and not args.additive:
        # torch's kernel adds a float mask: converted once, here, the node saves it
        # and its backward pass reads it as it is (as torch's own SDPA does)
        mask = _as_additive(mask, q.dtype)
    return FlashAttention._call(q, k, v, mask, args.sinks, options)


def _as_additive(keep: Tensor, dtype: torch.dtype) -> Tensor:
    """A boolean mask as an additive one: True (may attend) -> 0, False -> -inf."""
    zeros = torch.zeros(keep.shape, dtype=dtype, device=keep.device)
    return zeros.masked_fill_(~keep, float("-inf"))


def _vmapped_first(info: Any, in_dims: tuple, tensors: tuple) -> list:
    """Make the vmapped dimension the first batch dimension of every tensor that
    has it: q, k and v get it (expanded where they are not vmapped); a vmapped
    mask or sinks get it first, padded with 1s to the per-sample batch rank."""
    trailing = (2, 2, 2, 2, 0)  # non-batch dims of q, k, v, mask, sinks
    ranks = [
        x.dim() - (d is not None) - t
        for x, d, t in zip(tensors, in_dims, trailing, strict=True)
        if x is not None
    ]
    rank = max(ranks)
    out = []
    for i, (x, d, t) in enumerate(zip(tensors, in_dims, trailing, strict=True)):
        if x is not None and (d is not None or i < 3):
            x = (
                x.movedim(d, 0)
                if d is not None
                else x.expand(info.batch_size, *x.shape)
            )
            pad = rank - (x.dim() - 1 - t)
            x = x.reshape(x.shape[:1] + (1,) * pad + x.shape[1:])
        out.append(x)
    return out


def _fold_vmapped(info: Any, in_dims: tuple, tensors: tuple) -> list:
    """A vmapped dimension is one more batch of heads: move it first and fold it into
    the ``BH`` dimension of each tensor (None stays None)."""
    folded = []
    for x, dim in zip(tensors, in_dims, strict=True):
        if x is not None:
            x = (
                x.expand((info.batch_size, *x.shape))
                if dim is None
                else x.movedim(dim, 0)
            )
            x = x.reshape((-1, *x.shape[2:]))
        folded.append(x)
    return folded


def _unfold_vmapped(info: Any, tensors: tuple) -> tuple:
    return tuple(x.reshape((info.batch_size, -1, *x.shape[1:])) for x in tensors)


class _FlashBackward(torch.autograd.Function):
    """The tile loops of the backward pass as a Function of their own, so that
    ``torch.func.vmap`` can batch them too (per-sample gradients): its vmap rule
    folds the vmapped dimension into the heads."""

    @staticmethod
    def forward(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        keep: Tensor | None,
        bias: Tensor | None,
        grad_out: Tensor,
        lse: Tensor,
        delta: Tensor,
        causal: _tiles.Causal | None,
        scale: float,
        bq: int,
        bk: int,
        path: str,
    ) -> tuple[Tensor, Tensor, Tensor]:
        if path == "triton" and bias is None:
            return _kernels.triton_flash_backward(
                q, k, v, grad_out, lse, delta, mask=keep, causal=causal, scale=scale
            )
        p = _tiles.Problem(q, k, v, keep, causal, scale, bq, bk, bias)
        return _tiles.backward(p, grad_out, lse, delta)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        pass  # first-order gradients only: nothing to save

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple:
        raise RuntimeError(
            "flash_attention supports first-order gradients only (its backward pass "
            "is not differentiable)"
        )

    @staticmethod
    def vmap(
        info: Any,
        in_dims: tuple,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        keep: Tensor | None,
        bias: Tensor | None,
        grad_out: Tensor,
        lse: Tensor,
        delta: Tensor,
        *args: Any,
    ) -> tuple[tuple, tuple[int, int, int]]:
        tensors = _fold_vmapped(
            info, in_dims[:8], (q, k, v, keep, bias, grad_out, lse, delta)
        )
        return _unfold_vmapped(info, _FlashBackward.apply(*tensors, *args)), (0, 0, 0)


# Function.apply binds its arguments with inspect.signature on every call (a
# tenth of a millisecond); a signature computed once makes that a lookup.
for _function in (FlashAttention, _FlashBackward):
    _function.forward.__signature__ = inspect.signature(_function.forward)  # type: ignore[union-attr]


def _delta(out: Tensor, grad_out: Tensor, grad_lse: Tensor | None) -> Tensor:
    r""":math:`\delta_i = \sum_d dO_{id} O_{id} - d\mathrm{lse}_i`, in float32+."""
    acc = torch.promote_types(out.dtype, torch.float32)
    # A batched dot product: dO o O is never formed as a tensor of its own.
    delta = torch.einsum("...d,...d->...", grad_out.to(acc), out.to(acc))
    return delta if grad_lse is None else delta - grad_lse.to(acc)


def _dropout_attention(
    q: Tensor, k: Tensor, v: Tensor, args: AttentionArgs
) -> tuple[Tensor, Tensor]:
    """Attention with dropout on the weights, as torch's math path computes it:
    the weights are formed (the tiles never store them), dropped with
    ``torch.dropout`` and averaged. Differentiable by autograd."""
    if args.groups > 1:
        k, v = (t.repeat_interleave(args.groups, dim=-3) for t in (k, v))
    acc = torch.promote_types(q.dtype, torch.float32)
    scores = args.masked_scores((q.to(acc) @ k.to(acc).transpose(-2, -1)) * args.scale)
    if args.sinks is not None:
        sink = args.sinks.to(acc)[..., None, None].expand(scores.shape[:-1] + (1,))
        scores = torch.cat([scores, sink], dim=-1)
    lse = torch.logsumexp(scores, dim=-1)
    empty = torch.isneginf(lse).unsqueeze(-1)
    weights = torch.exp(scores - lse.unsqueeze(-1).masked_fill(empty, 0.0))
    if args.sinks is not None:
        weights = weights[..., :-1]
    weights = torch.dropout(weights, args.dropout_p, True)
    return (weights @ v.to(acc)).to(q.dtype), lse


# --------------------------------------------------------------------------------------
# The public functions
# --------------------------------------------------------------------------------------


def flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    attn_mask: Tensor | None = None,
    is_causal: bool | str = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    block_size: int | tuple[int, int] | None = None,
    return_lse: bool = False,
    enable_gqa: bool = False,
    sinks: Tensor | None = None,
    explicit: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    r"""Exact attention computed tile by tile:
    :math:`\mathrm{softmax}(QK^\top \cdot \text{scale} + M)\,V`.

    The algorithm of FlashAttention (Dao et al., 2022), in the loop order of
    FlashAttention-2 (Dao, 2024). Queries are cut into blocks of ``block_q``
    rows, keys and values into blocks of ``block_k``. For each query row the
    loop over key blocks keeps a running maximum
    :math:`m`, a running sum :math:`\ell` and an unnormalized output
    :math:`o`; a new tile of scores :math:`s` updates them as

    .. math::

        m' &= \max(m, \max_j s_j), \\
        \ell' &= e^{m - m'}\,\ell + \textstyle\sum_j e^{s_j - m'}, \\
        o' &= e^{m - m'}\,o + \textstyle\sum_j e^{s_j - m'}\, v_j

    and the result is :math:`o / \ell`. Each worker holds one ``(block_q,
    block_k)`` tile of scores at a time, so the extra memory grows linearly
    with the sequence length; the ``(L, S)`` score matrix is never formed.
    With a causal mask the tiles entirely above the diagonal are skipped.
    Rows with nothing to attend give zeros (and a logsumexp of ``-inf``),
    forward and backward.

    The autograd node is :class:`FlashAttention`: it saves only ``q, k, v``,
    the output and the logsumexp, and its backward pass recomputes each tile
    of weights from them (see :func:`flash_attention_backward`).

    Three implementations run this algorithm (``sb.explain_dispatch(
    "flash_attention", q, k, v, **options)`` says which, and why): the
    library's tile loops in torch (``"torch"``, computed in float32, float64
    for float64 input, and rounded once to the dtype of ``q``), forced by
    ``block_size=`` or ``explicit=True``; on the CPU, where it computes the
    same thing, torch's own compiled FlashAttention kernel (``"fused"``); on
    CUDA tensors with Triton installed, the Triton kernels of
    :mod:`softmaxbook.kernels` (``"triton"``). With ``dropout_p > 0`` the
    weights are formed and dropped as torch does (``"dropout"``).

    Shapes: ``q`` is ``(..., L, D)``, ``k`` is ``(..., S, D)``, ``v`` is
    ``(..., S, Dv)``, batch dimensions broadcast; with ``enable_gqa``, ``q``
    is ``(..., Hq, L, D)`` and ``k``, ``v`` have ``Hkv`` heads, ``Hq`` a
    multiple of ``Hkv``. The result is ``(..., L, Dv)`` in the dtype of
    ``q``, the logsumexp ``(..., L)`` in float32 (float64 for float64 input).

    Equivalent to ``torch.nn.functional.scaled_dot_product_attention(q, k, v,
    attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
    enable_gqa=enable_gqa)`` for ``is_causal`` ``True`` or ``False`` (torch has
    no bottom-right alignment). Fully masked rows give zeros, as torch's math
    path and CPU kernels do since torch 2.5.

    Parameters
    ----------
    q, k, v : Tensor
        Queries, keys and values, one floating dtype.
    mask, attn_mask : Tensor, optional
        Broadcastable to ``(..., L, S)`` (``attn_mask`` is torch's name; pass
        one of them): boolean, True = the query may attend to the key, or a
        float additive mask of ``q``'s dtype added to the scores (``-inf``
        removes a key). It gets no gradient.
    is_causal : bool or str
        ``True`` or ``"top_left"``: query :math:`i` attends to keys
        :math:`j \le i` (torch's alignment). ``"bottom_right"``: to keys
        :math:`j \le i + S - L`, so that the last query sees the last key
        (flash-attn's alignment, right for queries appended to a KV cache).
        The two agree when ``L == S``. Cannot be combined with ``mask``.
    scale : float, optional
        Multiplies the scores; defaults to :math:`1/\sqrt{D}`.
    dropout_p : float
        Dropout probability of the weights, applied as torch's
        ``scaled_dot_product_attention`` applies it (always, not only in
        training). The weights are then formed: no tiles, no
        :class:`FlashAttention` node.
    block_size : int or (int, int), optional
        Tile sizes ``(block_q, block_k)`` of the library's tile loops (one int
        sets both; default ``DEFAULT_BLOCK_SIZE``). Passing it forces the tile
        loops. They change the speed and memory, not the result beyond
        rounding.
    return_lse : bool
        Also return the logsumexp of each row of scaled, masked scores,
        :math:`\log \sum_j e^{s_{ij}}` (including the sink, if any): the
        state that :func:`~softmaxbook.merge_attention_states` needs.
    enable_gqa : bool
        Grouped-query attention: query head :math:`h` uses key and value head
        :math:`\lfloor h / (H_q / H_{kv}) \rfloor`, as torch's ``enable_gqa``
        (``k.repeat_interleave(Hq // Hkv, dim=-3)``). Each key head is read
        once for its whole group of query heads.
    sinks : Tensor, optional
        Learned sink logits, broadcastable to the heads (the batch shape of
        the scores, e.g. ``(H,)`` for ``q`` ``(B, H, L, D)``): each row's
        softmax runs over its scores and the sink, whose weight is dropped,
        :math:`w_j = e^{s_j} / (e^{\text{sink}} + \sum_k e^{s_k})`. A row
        may then give less than all its weight to the keys. Differentiable.
    explicit : bool
        Force the library's tile loops (as ``block_size=`` does, with the
        default tiles).

    Returns
    -------
    Tensor ``(..., L, Dv)``, or ``(out, lse)`` with ``return_lse=True``.

    Raises
    ------
    TypeError
        If an input is not a floating tensor, the dtypes differ, or the mask
        is neither boolean nor of ``q``'s dtype.
    ValueError
        If the shapes do not fit together, the mask or the sinks do not
        broadcast, ``scale <= 0``, ``is_causal`` is an unknown name, both
        ``mask`` and ``is_causal`` are given, or ``dropout_p`` is not in
        ``[0, 1)``.

    Examples
    --------
    >>> import torch, softmaxbook as sb
    >>> q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    >>> want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    >>> torch.allclose(sb.flash_attention(q, k, v, is_causal=True), want, atol=1e-6)
    True
    >>> tiles = sb.flash_attention(q, k, v, is_causal=True, block_size=4)
    >>> torch.allclose(tiles, want, atol=1e-6)
    True
    >>> sb.explain_dispatch("flash_attention", q, k, v, block_size=4).path
    'torch'
    """
    args = resolve_attention(
        q, k, v, mask=mask, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
        sinks=sinks, enable_gqa=enable_gqa, dropout_p=dropout_p,
        caller="flash_attention",
    )  # fmt: skip
    if args.dropout_p > 0.0:
        out, lse = _dropout_attention(q, k, v, args)
    else:
        out, lse = _run(q, k, v, args, block_size, explicit)
    return (out, lse) if return_lse else out


@renamed_keywords(grad_out="grad_output")
def flash_attention_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    grad_output: Tensor,
    *,
    mask: Tensor | None = None,
    attn_mask: Tensor | None = None,
    is_causal: bool | str = False,
    scale: float | None = None,
    block_size: int | tuple[int, int] | None = None,
    enable_gqa: bool = False,
    grad_lse: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    r"""The gradients of attention, recomputed tile by tile from the logsumexp.

    With the scores :math:`S = QK^\top \cdot \text{scale}`, the weights
    :math:`P = e^{S - \mathrm{lse}}` (row by row) and the output
    :math:`O = PV`, the gradients for an upstream :math:`dO` are

    .. math::

        dV = P^\top dO, \quad dP = dO\, V^\top, \quad
        dS = P \circ (dP - \delta), \quad
        dQ = dS\, K \cdot \text{scale}, \quad dK = dS^\top Q \cdot \text{scale}

    with :math:`\delta_i = \sum_j P_{ij}\, dP_{ij} = \sum_d dO_{id}\, O_{id}`.
    The second form of :math:`\delta` needs only ``out`` and ``grad_output``,
    so :math:`P` is never stored: each tile of it is recomputed from ``q``,
    ``k`` and ``lse`` when it is needed. This is what
    :func:`flash_attention`'s backward pass runs on the tile loops.

    ``lse`` and ``out`` may come from a larger computation than this call's
    keys (ring attention passes the merged ones): the result is then this
    key block's share of the gradients. A gradient ``grad_lse`` for the
    logsumexp adds :math:`P_{ij}\, d\mathrm{lse}_i` to :math:`dS`.

    Shapes: as :func:`flash_attention`; ``out`` and ``grad_output`` are
    ``(..., L, Dv)``, ``lse`` and ``grad_lse`` ``(..., L)``. Returns ``(dq,
    dk, dv)`` with the shapes and dtypes of ``q``, ``k``, ``v``. (The keyword
    ``grad_out`` is a deprecated spelling of ``grad_output``.)

    Equivalent to ``torch.autograd.grad(flash_attention(q, k, v), (q, k, v),
    grad_output)`` when ``out`` and ``lse`` are that call's:

    >>> import torch
    >>> import softmaxbook as sb
    >>> q, k, v = torch.randn(3, 2, 5, 8, dtype=torch.float64).unbind(0)
    >>> g = torch.randn(2, 5, 8, dtype=torch.float64)
    >>> out, lse = sb.flash_attention(q, k, v, return_lse=True)
    >>> grads = sb.flash_attention_backward(q, k, v, out, lse, g)
    >>> leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    >>> expected = torch.autograd.grad(sb.flash_attention(*leaves), leaves, g)
    >>> all(torch.allclose(a, b) for a, b in zip(grads, expected))
    True

    Raises
    ------
    TypeError, ValueError
        For bad input, as :func:`flash_attention`, or if ``out``, ``lse``,
        ``grad_output`` do not have the shapes above.

    Examples
    --------
    >>> import torch, softmaxbook as sb
    >>> q, k, v = (torch.randn(3, 5, 4, dtype=torch.float64) for _ in range(3))
    >>> out, lse = sb.flash_attention(q, k, v, return_lse=True)
    >>> do = torch.ones_like(out)
    >>> dq, dk, dv = sb.flash_attention_backward(q, k, v, out, lse, do)
    >>> leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    >>> want = torch.autograd.grad(sb.flash_attention(*leaves).sum(), leaves)
    >>> all(torch.allclose(a, b) for a, b in zip((dq, dk, dv), want))
    True
    """
    args = resolve_attention(
        q, k, v, mask=mask, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
        enable_gqa=enable_gqa, caller="flash_attention_backward",
    )  # fmt: skip
    call = _prepare(q, k, v, args, block_size)
    Dv = v.shape[-1]
    rows_shape = torch.Size(q.shape[:-1])  # (..., L) of the queries
    for name, t, shape in (
        ("out", out, rows_shape + (Dv,)),
        ("grad_output", grad_output, rows_shape + (Dv,)),
        ("lse", lse, rows_shape),
        ("grad_lse", grad_lse, rows_shape),
    ):
        if t is None:  # grad_lse is optional
            continue
        check_float(t, name)
        if t.shape != shape:
            raise ValueError(
                f"{name} must have shape {tuple(shape)} (from q and v), got "
                f"{tuple(t.shape)}"
            )
    rows = call.layout.rows
    out3, do3 = rows(out, (Dv,)), rows(grad_output, (Dv,))
    lse3 = rows(lse.unsqueeze(-1), (1,)).squeeze(-1)
    dlse3 = None if grad_lse is None else rows(grad_lse.unsqueeze(-1), (1,)).squeeze(-1)
    p = call.problem
    path = _dispatch.kernel_decision("flash_attention", q, k, v).path
    with torch.no_grad():
        dq, dk, dv = _FlashBackward.forward(
            p.q, p.k, p.v, p.keep, p.bias, do3, lse3, _delta(out3, do3, dlse3),
            p.causal, p.scale, p.block_q, p.block_k, path,
        )  # fmt: skip
    dq = call.layout.unrows(dq).sum_to_size(q.shape)
    dk = call.layout.unkeys(dk, k.shape)
    dv = call.layout.unkeys(dv, v.shape)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


# --------------------------------------------------------------------------------------
# The loop, step by step
# --------------------------------------------------------------------------------------


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
    block_q, block_k = _block_sizes(block_size)
    L, S, align = args.L, args.S, args.causal
    causal = (
        None if align is None else _tiles.Causal(L, 0 if align == "top_left" else S - L)
    )
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
    acc_dtype = torch.promote_types(q.dtype, torch.float32)
    q, k, v = (t.expand(batch + t.shape[-2:]).to(acc_dtype) for t in (q, k, v))
    for q0 in range(0, L, block_q):
        q1 = min(q0 + block_q, L)
        qb = q[..., q0:q1, :] * scale  # (..., bq, D)
        m = torch.full(qb.shape[:-1], float("-inf"), dtype=acc_dtype, device=q.device)
        ell = torch.zeros_like(m)  # (..., bq)
        o = torch.zeros(qb.shape[:-1] + v.shape[-1:], dtype=acc_dtype, device=q.device)
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
            m_new = torch.maximum(m, s.amax(dim=-1))
            # A row with no key so far has m = -inf: shift by 0, so that
            # exp(-inf - (-inf)) = nan never happens.
            shift = m_new.masked_fill(torch.isneginf(m_new), 0.0)
            alpha = torch.exp(m - shift)  # rescales the old state to the new maximum
            p = torch.exp(s - shift.unsqueeze(-1))
            ell = ell * alpha + p.sum(dim=-1)
            o = o * alpha.unsqueeze(-1) + p @ v[..., k0:k1, :]
            m = m_new
            yield FlashStep(q0, q1, k0, k1, s, m, ell, o, k0 + block_k >= k_end)


_dispatch.register_explainer("flash_attention", _explain)
