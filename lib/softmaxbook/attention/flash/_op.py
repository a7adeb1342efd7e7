"""FlashAttention's computation, and its autograd Functions for eager calls.

:func:`forward` and :func:`backward` compute one planned call on the path its
plan names: torch's CPU kernel (``_fused``), the tile loops (``_tiles``) or the
Triton kernels. Outside a compiled region they run as the autograd Function
:class:`FlashAttentionFunction`, whose ``vmap`` rules make ``torch.func``
transforms (``vmap``, ``grad``, ``jacrev``) work; under ``torch.compile`` they
run inside the operator pair of :mod:`._operator`.

A call reaches this module resolved and planned (:class:`Plan`: the causal
alignment, the scale, the group size, the tiles and the path): nothing here
checks or decides again.
"""

from __future__ import annotations

import inspect
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ... import kernels as _kernels
from ..._numerics import acc_dtype, functorch_active
from .._args import rebuild_attention
from . import _fused, _tiles
from ._layout import prepare

__all__ = [
    "Plan",
    "FlashAttentionFunction",
    "forward",
    "backward",
    "delta",
    "tile_backward",
]


class Plan(NamedTuple):
    """The resolved non-tensor arguments of one call, and its path."""

    causal: str  # "" (none), "top_left" or "bottom_right"
    scale: float
    groups: int  # query heads per key head (1 without GQA)
    block_q: int
    block_k: int
    path: str  # "torch-fused", "tiles" or "triton"


def _unview(x: Tensor) -> Tensor:
    """``x``, no longer recorded as a view: autograd forbids modifying in place a
    view made inside a custom Function, so the caller could not modify an output
    that is one (torch's kernel returns its outputs as views of the buffers it
    allocates). A tensor on the same memory, with the same strides: no copy."""
    if x._base is None:
        return x
    if functorch_active():  # wrapped tensors have no storage of their own to share
        return x.clone()
    return x.new_empty(0).set_(x.untyped_storage(), x.storage_offset(), x.shape,
                               x.stride())  # fmt: skip


def _with_sink(out: Tensor, lse: Tensor, sinks: Tensor) -> tuple[Tensor, Tensor]:
    """Merge a sink into a finished row: a state with logsumexp ``sink`` and output 0.

    ``lse' = log(e^lse + e^sink)`` and the output shrinks by the share of the
    mass on the keys, ``e^(lse - lse')``.
    """
    total = torch.logaddexp(lse, sinks)
    share = torch.exp(lse - total).masked_fill(torch.isneginf(total), 0.0)
    return out * share.unsqueeze(-1), total


def _call(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, sinks: Tensor | None,
          plan: Plan) -> Any:  # fmt: skip
    args = rebuild_attention(q, k, v, mask, sinks, plan.causal or None, plan.scale,
                             plan.groups)  # fmt: skip
    return prepare(q, k, v, args, (plan.block_q, plan.block_k))


def forward(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, sinks: Tensor | None,
    plan: Plan,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """The output ``(..., L, Dv)`` in q's dtype and the logsumexp ``(..., L)``."""
    if plan.path == "torch-fused":
        # as the kernel returns them (views of its buffers: see _unview)
        return _fused.forward(
            q, k, v, mask, bool(plan.causal), plan.scale, plan.groups > 1
        )
    call = _call(q, k, v, mask, sinks, plan)
    p = call.problem
    if plan.path == "triton":
        out, lse = _kernels.triton_flash_forward(
            p.q, p.k, p.v, mask=p.keep, causal=p.causal, scale=p.scale
        )
    else:
        out, lse = _tiles.forward(p)
    if call.sinks is not None:
        out, lse = _with_sink(out, lse, call.sinks)
    out = call.layout.unrows(out).to(q.dtype)
    return _unview(out), _unview(call.layout.unrows(lse.unsqueeze(-1)).squeeze(-1))


def delta(out: Tensor, grad_out: Tensor, grad_lse: Tensor | None) -> Tensor:
    r""":math:`\delta_i = \sum_d dO_{id} O_{id} - d\mathrm{lse}_i`, in float32+."""
    acc = acc_dtype(out.dtype)
    # A batched dot product: dO o O is never formed as a tensor of its own.
    d = torch.einsum("...d,...d->...", grad_out.to(acc), out.to(acc))
    return d if grad_lse is None else d - grad_lse.to(acc)


def backward(
    grad_out: Tensor | None,
    grad_lse: Tensor | None,
    saved: tuple[Tensor, ...],
    mask: Tensor | None,
    sinks: Tensor | None,
    plan: Plan,
    sinks_grad: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """``(dq, dk, dv, d_sinks)`` from the saved ``(q, k, v, out, lse)``."""
    q, k, v, out, lse = saved
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    if plan.path == "torch-fused" and grad_lse is None and not functorch_active():
        dq, dk, dv = _fused.backward(
            grad_out, q, k, v, out, lse, mask, bool(plan.causal), plan.scale,
            plan.groups > 1,
        )  # fmt: skip
        return dq, dk, dv, None
    call = _call(q, k, v, mask, sinks, plan)
    rows = call.layout.rows
    Dv = v.shape[-1]
    do3, out3 = rows(grad_out, (Dv,)), rows(out, (Dv,))
    lse3 = rows(lse.unsqueeze(-1), (1,)).squeeze(-1)
    dlse3 = None if grad_lse is None else rows(grad_lse.unsqueeze(-1), (1,))
    delta3 = delta(out3, do3, None if dlse3 is None else dlse3.squeeze(-1))
    p = call.problem
    tile_path = "triton" if plan.path == "triton" else "tiles"
    dq, dk, dv = tile_backward(p, do3, lse3, delta3, tile_path)
    dq = call.layout.unrows(dq).sum_to_size(q.shape).to(q.dtype)
    dk = call.layout.unkeys(dk, k.shape).to(k.dtype)
    dv = call.layout.unkeys(dv, v.shape).to(v.dtype)
    d_sinks = None
    if sinks is not None and call.sinks is not None and sinks_grad:
        # The sink is one more score with value 0: its gradient is its weight
        # times (dlse - delta_0), with delta_0 = rowsum(dO o O).
        weight = torch.exp(call.sinks - lse3).masked_fill(torch.isneginf(lse3), 0.0)
        d_rows = call.layout.unrows((-weight * delta3).unsqueeze(-1)).squeeze(-1)
        d_sinks = d_rows.sum(-1).sum_to_size(sinks.shape).to(sinks.dtype)
    return dq, dk, dv, d_sinks


def tile_backward(
    p: _tiles.Problem, do3: Tensor, lse3: Tensor, delta3: Tensor, path: str
) -> tuple[Tensor, Tensor, Tensor]:
    """The backward tile loops on the flat layout (batched by ``torch.func``)."""
    args = (p.q, p.k, p.v, p.keep, p.bias, do3, lse3, delta3, p.causal, p.scale,
            p.block_q, p.block_k, path)  # fmt: skip
    if functorch_active():
        return _FlashBackward.apply(*args)
    return _FlashBackward.forward(*args)


# --------------------------------------------------------------------------------------
# The autograd Function, for eager mode and torch.func
# --------------------------------------------------------------------------------------


class FlashAttentionFunction(torch.autograd.Function):
    """The autograd node of :func:`~softmaxbook.flash_attention` outside
    torch.compile: saves ``(q, k, v, out, lse)`` (and the mask, then the sinks,
    when given); first-order backward; ``vmap`` rules for ``torch.func``."""

    @staticmethod
    def forward(
        q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, sinks: Tensor | None,
        plan: Plan,
    ) -> tuple[Tensor, Tensor]:  # fmt: skip
        out, lse = forward(q, k, v, mask, sinks, plan)
        return _unview(out), _unview(lse)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
        q, k, v, mask, sinks, plan = inputs
        extra = [t for t in (mask, sinks) if t is not None]
        ctx.save_for_backward(q, k, v, *output, *extra)
        ctx.plan, ctx.has_mask = plan, mask is not None
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor | None, grad_lse: Tensor | None) -> tuple:
        q, k, v, out, lse, *extra = ctx.saved_tensors
        mask = extra.pop(0) if ctx.has_mask else None
        sinks = extra[0] if extra else None
        if grad_out is None and grad_lse is None:
            return None, None, None, None, None, None
        dq, dk, dv, d_sinks = backward(
            grad_out, grad_lse, (q, k, v, out, lse), mask, sinks, ctx.plan,
            ctx.needs_input_grad[4],
        )  # fmt: skip
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
        plan: Plan,
    ) -> tuple[tuple[Tensor, Tensor], tuple[int, int]]:
        tensors = _vmapped_first(info, in_dims[:5], (q, k, v, mask, sinks))
        q, k, v, mask, sinks = tensors
        return FlashAttentionFunction.apply(q, k, v, mask, sinks, plan), (0, 0)


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
for _function in (FlashAttentionFunction, _FlashBackward):
    _function.forward.__signature__ = inspect.signature(_function.forward)  # type: ignore[union-attr]
