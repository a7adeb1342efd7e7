"""FlashAttention as the operators ``torch.compile`` sees, and :func:`run`.

``torch.ops.softmaxbook.flash_attention`` and ``flash_attention_backward`` are
one operator each (with fake kernels, which give the shapes without computing),
so a compiled graph holds FlashAttention whole, never the tile loops inside;
the autograd Function :class:`CompiledFlashAttention` joins them as forward and
backward, and torch.compile traces it. Where torch's own CPU kernel computes a
compiled call and nothing is left to decide when it runs (no mask to read, no
logsumexp returned), :func:`run` hands the compiler that kernel itself instead,
as torch's SDPA compiles. Outside a compiled region :func:`run` calls the
autograd Function :class:`~._op.FlashAttentionFunction`; both compute with
:func:`~._op.forward` and :func:`~._op.backward`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torch._C._functorch import TransformType
from torch._functorch.pyfunctorch import retrieve_current_functorch_interpreter

from ..._numerics import acc_dtype, functorch_active
from . import _fused
from ._op import FlashAttentionFunction, Plan, backward, forward
from ._path import mask_fits_fused, rows_keep_a_key

__all__ = [
    "CompiledFlashAttention",
    "flash_attention_op",
    "flash_attention_backward_op",
    "run",
]


def _as_promised(x: Tensor, like: Tensor | None) -> Tensor:
    """``x`` in the layout the fake kernel promised: ``like``'s strides, or
    contiguous where ``like`` is None. A copy only where they differ."""
    if like is None:
        return x if x.is_contiguous() and x._base is None else x.contiguous()
    if x.stride() == like.stride() and x._base is None:
        return x
    return like.copy_(x)


def _when_run(
    plan: Plan, q: Tensor, k: Tensor, mask: Tensor | None, fused: Tensor | None
) -> Plan:
    """The plan of the backward pass as the operator runs it: the forward pass's
    path (``fused``: whether torch's kernel computed it), or where that is not
    given, the eager rule: torch's kernel only where every row keeps a key and q, k
    are finite, else the tile loops. Reading values is allowed here: the compiler
    sees the fake kernel, not this."""
    if plan.path != "torch-fused" or mask is None:
        return plan
    if mask_fits_fused(q, k, mask) if fused is None else bool(fused):
        return plan
    return plan._replace(path="tiles")


def _finite(lse: Tensor) -> bool:
    """Whether every row's logsumexp is finite: a nan or +inf score in torch's kernel
    (from a nan or infinity in q or k, at a masked key too: the kernel adds -inf to
    it) makes its row's logsumexp nan or infinite. A -inf score drops its key, as
    a masked key, in the kernel and in the tile loops alike. A sum that overflows
    only sends the call to the tile loops, which is always correct."""
    return math.isfinite(lse.sum())


# The operators are defined with torch.library.Library, not custom_op: custom_op
# puts layers written in Python in front of every call (its autograd kernel, a
# wrapper that disables dynamo, alias checks), which a compiled graph pays each time
# it runs, with or without gradients:
# with them, a small model's compiled training step with a padding mask took 3 to
# 4 % longer (benchmarks/README.md). The derivative is the autograd Function below,
# which torch.compile traces around them, as in flash-attn's interface; the
# operators' own autograd kernel (_no_derivative) only refuses a call autograd
# would record and passes the rest on.
_LIB = torch.library.Library("softmaxbook", "FRAGMENT")
_PLAN_SCHEMA = (
    "Tensor? mask, Tensor? sinks, str causal, float scale, SymInt groups, "
    "SymInt block_q, SymInt block_k, str path"
)
_LIB.define(
    f"flash_attention(Tensor q, Tensor k, Tensor v, {_PLAN_SCHEMA}, "
    "Tensor? keeps=None, Tensor? kernel_mask=None) -> (Tensor, Tensor, Tensor)"
)
_LIB.define(
    "flash_attention_backward(Tensor grad_out, Tensor? grad_lse, Tensor q, Tensor k, "
    f"Tensor v, Tensor out, Tensor lse, {_PLAN_SCHEMA}, Tensor? fused=None, "
    "Tensor? kernel_mask=None) -> (Tensor, Tensor, Tensor, Tensor)"
)


def _forward_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    sinks: Tensor | None,
    causal: str,
    scale: float,
    groups: int,
    block_q: int,
    block_k: int,
    path: str,
    keeps: Tensor | None = None,
    kernel_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """FlashAttention's forward pass: ``(out, lse, fused)``, ``fused`` a 0-dim
    boolean, whether torch's kernel computed the call (the backward pass takes the
    same path). Where the caller computed them: ``keeps``, whether every row of
    ``mask`` keeps a key (``rows_keep_a_key``), and ``kernel_mask``, the float mask
    that kernel adds (from a boolean ``mask``)."""
    traced = Plan(causal, scale, groups, block_q, block_k, path)
    # A path chosen while torch.compile traced could not read the values: torch's
    # kernel takes a masked call only where every row keeps a key (read here: the
    # compiler sees the fake kernel, not this) and q, k are finite (read from the
    # kernel's logsumexp), as an eager call checks first; else the tile loops.
    check = mask is not None and path == "torch-fused"
    plan = traced
    if mask is not None and check:
        if keeps is None:
            keeps = rows_keep_a_key(mask)  # a direct call: read here
        if not bool(keeps):
            plan = traced._replace(path="tiles")
    out, lse = forward(
        q, k, v, _mask_read(plan, traced, mask, kernel_mask), sinks, plan
    )
    if check and plan is traced and not _finite(lse):
        plan = traced._replace(path="tiles")
        out, lse = forward(q, k, v, mask, sinks, plan)
    fused = q.new_full((), plan.path == "torch-fused", dtype=torch.bool)
    kernel = _kernel_layout(q, traced)
    if kernel and plan is traced:
        return out, lse, fused  # torch's kernel: the layouts its meta function states
    # The layouts the fake kernel promised: the kernel's, or contiguous.
    like = _fused.empty_outputs(q, v) if kernel else (None, None)
    return _as_promised(out, like[0]), _as_promised(lse, like[1]), fused


def _batch(q: Tensor, k: Tensor, v: Tensor, groups: int) -> tuple[int, ...]:
    qb, kb, vb = tuple(q.shape[:-2]), tuple(k.shape[:-2]), tuple(v.shape[:-2])
    if groups > 1:
        kb, vb = kb[:-1] + (kb[-1] * groups,), vb[:-1] + (vb[-1] * groups,)
    return tuple(torch.broadcast_shapes(qb, kb, vb))


def _mask_read(
    plan: Plan, traced: Plan, mask: Tensor | None, kernel_mask: Tensor | None
) -> Tensor | None:
    """The mask a pass reads: the float one given for torch's kernel where the
    traced plan holds (its keys all finite, -inf removes a key as well as False
    does), the boolean one where the tile loops must remove masked keys."""
    return kernel_mask if plan is traced and kernel_mask is not None else mask


def _kernel_layout(q: Tensor, plan: Plan) -> bool:
    """Whether the traced plan promises torch's kernel's layouts (else contiguous)."""
    return plan.path == "torch-fused" and _fused.keeps_layout(q, plan.groups)


def _forward_fake(
    q: Tensor, k: Tensor, v: Tensor, *rest: Any
) -> tuple[Tensor, Tensor, Tensor]:
    plan = Plan(*rest[2 : 2 + len(Plan._fields)])  # after the mask and the sinks
    fused = q.new_empty((), dtype=torch.bool)
    if _kernel_layout(q, plan):
        return (*_fused.empty_outputs(q, v), fused)
    batch, L = _batch(q, k, v, plan.groups), q.shape[-2]
    out = q.new_empty(batch + (L, v.shape[-1]))
    return out, q.new_empty(batch + (L,), dtype=acc_dtype(q.dtype)), fused


def _backward_op(
    grad_out: Tensor,
    grad_lse: Tensor | None,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    mask: Tensor | None,
    sinks: Tensor | None,
    causal: str,
    scale: float,
    groups: int,
    block_q: int,
    block_k: int,
    path: str,
    fused: Tensor | None = None,
    kernel_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """FlashAttention's backward pass: ``(dq, dk, dv, d_sinks)`` (``d_sinks``
    empty without sinks). ``fused``: the forward pass's answer, whether torch's
    kernel computed it (else the eager rule is read, see ``_when_run``);
    ``kernel_mask`` as in the forward pass."""
    traced = Plan(causal, scale, groups, block_q, block_k, path)
    plan = _when_run(traced, q, k, mask, fused)
    mask = _mask_read(plan, traced, mask, kernel_mask)
    saved = (q, k, v, out, lse)
    if grad_lse is not None and not bool(grad_lse.any()):
        # A compiled graph hands the operator zeros for a logsumexp the caller
        # returned but nobody used (an eager Function gets None): without this, the
        # backward pass would leave torch's fused kernel, which takes no logsumexp
        # gradient, for the tile loops. Reading values is allowed here: the compiler
        # sees only the fake kernel.
        grad_lse = None
    as_kernel = plan is traced and grad_lse is None and not functorch_active()
    dq, dk, dv, ds = backward(grad_out, grad_lse, saved, mask, sinks, plan, True)
    if ds is None:
        ds = q.new_empty(0) if sinks is None else torch.zeros_like(sinks)
    kernel = _kernel_layout(q, traced)
    if kernel and as_kernel:  # as torch's kernel returned them
        return dq, dk, dv, ds
    # The layouts the fake kernel promised: the kernel's, or contiguous.
    like = _fused.empty_grads(q, k, v) if kernel else (None, None, None)
    dq, dk, dv = (_as_promised(g, t) for g, t in zip((dq, dk, dv), like, strict=True))
    return dq, dk, dv, _as_promised(ds, None)


def _backward_fake(
    grad_out: Tensor, grad_lse: Tensor | None, q: Tensor, k: Tensor, v: Tensor,
    out: Tensor, lse: Tensor, mask: Tensor | None, sinks: Tensor | None, *rest: Any,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    # torch's kernel's layout where it runs (its meta function's), else contiguous:
    # empty_like would promise q's strides, which the tile loops do not keep.
    ds = q.new_empty(0) if sinks is None else sinks.new_empty(sinks.shape)
    if _kernel_layout(q, Plan(*rest[: len(Plan._fields)])):
        dq, dk, dv = _fused.empty_grads(q, k, v)
        return dq, dk, dv, ds
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), ds


def _no_derivative(name: str) -> Any:
    """The operator's autograd kernel: refuses a call that autograd would record
    (its derivative is the Function around it, which torch.compile traces; the
    autograd fallback would only warn, and ``torch.func.grad`` of a direct call
    would get zeros), and passes every other call on. It runs in Python at every
    call of a compiled graph, about 1 % of a small model's step; a fallthrough
    would cost nothing, but torch.func transforms unwrap the tensors before a
    kernel below autograd could see what they record."""
    op = getattr(torch.ops.softmaxbook, name).default
    below = torch._C._after_autograd_keyset

    def kernel(keyset: Any, *args: Any) -> Any:
        if torch.is_grad_enabled() and torch._C._any_requires_grad(*args):
            raise RuntimeError(
                f"torch.ops.softmaxbook.{name} has no derivative of its own: "
                "differentiate softmaxbook.flash_attention instead (eager, or "
                "compiled outside torch.func transforms)"
            )
        return op.redispatch(keyset & below, *args)

    return kernel


for _name, _impl, _fake in (
    ("flash_attention", _forward_op, _forward_fake),
    ("flash_attention_backward", _backward_op, _backward_fake),
):
    _LIB.impl(_name, _impl, "CompositeExplicitAutograd")
    _LIB.impl(_name, _no_derivative(_name), "Autograd", with_keyset=True)
    torch.library.register_fake(f"softmaxbook::{_name}", _fake, lib=_LIB)

#: ``torch.ops.softmaxbook.flash_attention``: ``(out, lse, fused)``.
flash_attention_op = torch.ops.softmaxbook.flash_attention.default
#: ``torch.ops.softmaxbook.flash_attention_backward``: ``(dq, dk, dv, d_sinks)``.
flash_attention_backward_op = torch.ops.softmaxbook.flash_attention_backward.default


class CompiledFlashAttention(torch.autograd.Function):
    """The autograd node torch.compile traces around the operator pair: forward
    ``softmaxbook::flash_attention``, backward ``flash_attention_backward``, which
    takes the forward pass's path. ``lse_grad=False``: the caller does not return
    the logsumexp, so its gradient (zeros in a compiled graph) is not passed on."""

    @staticmethod
    def forward(
        q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, sinks: Tensor | None,
        plan: Plan, lse_grad: bool, keeps: Tensor | None, kernel_mask: Tensor | None,
    ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        return flash_attention_op(q, k, v, mask, sinks, *plan, keeps, kernel_mask)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        q, k, v, mask, sinks, plan, lse_grad, _, kernel_mask = inputs
        ctx.mark_non_differentiable(output[2])
        ctx.save_for_backward(q, k, v, *output, mask, sinks, kernel_mask)
        ctx.plan, ctx.lse_grad = plan, lse_grad

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor, grad_lse: Tensor, _: Any) -> tuple:
        q, k, v, out, lse, fused, mask, sinks, kernel_mask = ctx.saved_tensors
        dq, dk, dv, ds = flash_attention_backward_op(
            grad_out, grad_lse if ctx.lse_grad else None, q, k, v, out, lse, mask,
            sinks, *ctx.plan, fused, kernel_mask,
        )  # fmt: skip
        d_sinks = ds if sinks is not None else None
        return (dq, dk, dv, None, d_sinks) + (None,) * 4  # plan, lse_grad, masks


def run(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, sinks: Tensor | None,
    plan: Plan, lse_grad: bool = True,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """``(out, lse)``: the operator where torch.compile traces, the autograd
    Function (whose node :data:`~softmaxbook.FlashAttention` documents)
    elsewhere. ``lse_grad=False``: the caller does not return the logsumexp."""
    fused_mask = mask if plan.path == "torch-fused" else None  # read by the kernel
    kernel_mask = None
    if fused_mask is not None and fused_mask.dtype == torch.bool:
        # torch's kernel adds a float mask: converted once, here (as torch's own
        # SDPA does), and saved for the backward pass as it is
        kernel_mask = _fused.as_additive(fused_mask, q.dtype)
    if torch.compiler.is_compiling():
        _refuse_transform()
        if _traced_kernel(mask, sinks, plan, lse_grad):
            # torch's kernel traced as itself (aten's op and its derivative), as
            # torch's own SDPA compiles: the operator would run the same kernel,
            # with nothing to decide when it runs (only a mask is read then) and no
            # gradient for the logsumexp (the kernel's derivative takes none).
            causal, gqa = bool(plan.causal), plan.groups > 1
            return _fused.forward(q, k, v, None, causal, plan.scale, gqa)
        # Whether every row keeps a key reads the mask: computed in the graph,
        # beside its other kernels (an eager reduction in the operator would cost
        # more than the kernel's call), once for all the layers given the mask, on
        # the float mask (compiled beside the mask's conversion, inductor's any()
        # over (8, 1, 256, 256) booleans added 1.0 ms, this max 0.06 ms). The
        # operator gets the boolean mask too: where it leaves torch's kernel when it
        # runs (a row with nothing to attend, a non-finite q or k), the tile loops
        # must remove a masked key (a nan there stays out), not add -inf to it.
        keeps = None
        if fused_mask is not None:
            keeps = rows_keep_a_key(fused_mask if kernel_mask is None else kernel_mask)
        out, lse, _ = CompiledFlashAttention.apply(
            q, k, v, mask, sinks, plan, lse_grad, keeps, kernel_mask
        )
        return out, lse
    # Eager, the path was chosen reading the values: the kernel's mask is the mask.
    mask = mask if kernel_mask is None else kernel_mask
    return FlashAttentionFunction.apply(q, k, v, mask, sinks, plan)


def _refuse_transform() -> None:
    """Refuse, while torch.compile traces, every ``torch.func`` transform but one
    ``vmap`` (the operators carry no derivative of their own, and under a transform
    torch.compile would trace them without the Function around them): a
    clear error while tracing, where ``grad``, ``jacrev`` and nested transforms
    would otherwise fail when the graph runs. Without ``fullgraph`` torch.compile
    runs the call eagerly instead, where the autograd Function supports ``grad``
    and ``vmap``."""
    if not functorch_active():
        return
    top = retrieve_current_functorch_interpreter()
    if top.key() != TransformType.Vmap or top.level() != 1:
        raise RuntimeError(
            "softmaxbook.flash_attention under torch.compile takes no torch.func "
            "transform but a single vmap: apply grad, jacrev, jvp and nested "
            "transforms outside torch.compile (or compile without fullgraph)"
        )


def _traced_kernel(
    mask: Tensor | None, sinks: Tensor | None, plan: Plan, lse_grad: bool
) -> bool:
    """Whether a compiled call is handed torch's kernel itself, not the operator."""
    plain = mask is None and sinks is None and not lse_grad
    return plain and plan.path == "torch-fused"
