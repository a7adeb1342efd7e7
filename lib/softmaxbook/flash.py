r"""FlashAttention: exact attention tile by tile, forward and backward.

The forward pass (Dao et al., 2022) streams key and value tiles past each
block of queries with the online softmax, so the ``(L, S)`` score matrix is
never formed. The backward pass saves only ``q, k, v``, the output and the
logsumexp of each row, and recomputes the tiles: with
:math:`\delta_i = \sum_d dO_{id}\, O_{id}` the weights' gradient needs no
stored weights (see :func:`flash_attention_backward`). Both passes run the
tile loops of ``softmaxbook._tiles`` on any device, or the Triton kernels
of :mod:`softmaxbook.kernels` on a CUDA GPU.

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
from typing import NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from . import _tiles
from . import kernels as _kernels
from ._validate import CAUSAL_ALIGNMENTS as _CAUSAL_ALIGNMENTS
from ._validate import (
    check_attention_args,
    check_causal,
    check_float,
    check_gqa_heads,
    check_positive_int,
)
from .kernels import dispatch as _dispatch

__all__ = [
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


# --------------------------------------------------------------------------------------
# Arguments and the flat layout
# --------------------------------------------------------------------------------------


def _block_sizes(block_size) -> tuple[int, int]:
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


def _group_heads(q, k, v, mask):
    """For ``enable_gqa``: view q as ``(..., Hkv, G, L, D)`` and k, v as ``(..., Hkv,
    1, S, .)``; return them, the mask to match, and G."""
    groups = check_gqa_heads(q, k, v)
    hq, hk = q.shape[-3], k.shape[-3]
    if mask is not None and isinstance(mask, Tensor):
        L, S = q.shape[-2], k.shape[-2]
        try:
            shape = torch.broadcast_shapes(mask.shape, (hq, L, S))
        except RuntimeError:
            raise ValueError(
                f"mask of shape {tuple(mask.shape)} does not broadcast to the "
                f"scores' shape (..., {hq}, {L}, {S})"
            ) from None
        mask = mask.expand(shape).unflatten(-3, (hk, groups))
    return (
        q.unflatten(-3, (hk, groups)),
        k.unsqueeze(-3),
        v.unsqueeze(-3),
        mask,
        groups,
    )


class _Layout:
    """How one call maps onto the flat layout ``(BH, R, .)`` of :mod:`_tiles`, and
    back.

    ``rows(x)`` brings a tensor with the queries' rows (``q``, the output, its
    gradient ``(..., L, .)``, the logsumexp ``(..., L)``) to ``(BH, R, .)``;
    ``unrows(x)`` undoes it. All are differentiable torch views and reshapes, so
    autograd carries gradients through them. With ``fold``, the trailing batch
    dimension (query heads that share one key head, or that broadcast against
    it) is stacked into the rows.
    """

    def __init__(self, q, k, v, batch, L, S, fold):
        self.q_shape, self.k_shape, self.v_shape = q.shape, k.shape, v.shape
        self.batch, self.L, self.S, self.fold = batch, L, S, fold
        self.outer = batch[:-1] if fold else batch  # batch dims left after folding
        self.BH = math.prod(self.outer)
        self.R = L * (batch[-1] if fold else 1)

    def rows(self, x: Tensor, trailing: tuple = ()) -> Tensor:
        """``(..., L, *trailing)`` broadcast to the batch -> ``(BH, R, *trailing)``."""
        x = x.expand(self.batch + (self.L,) + trailing)
        return x.reshape((self.BH, self.R) + trailing)

    def unrows(self, x: Tensor) -> Tensor:
        """``(BH, R, *trailing)`` -> ``batch + (L, *trailing)``."""
        return x.reshape(self.batch + (self.L,) + tuple(x.shape[2:]))

    def keys(self, x: Tensor) -> Tensor:
        """k or v ``(..., S, .)`` -> ``(BH, S, .)``."""
        outer = self.outer + ((1,) if self.fold else ())
        x = x.expand(outer + x.shape[-2:])
        if self.fold:
            x = x.squeeze(-3)
        return x.reshape((self.BH,) + x.shape[-2:])

    def unkeys(self, x: Tensor, shape) -> Tensor:
        """A gradient ``(BH, S, .)`` -> summed over broadcast dims to ``shape``."""
        x = x.reshape(self.outer + ((1,) if self.fold else ()) + x.shape[-2:])
        return x.sum_to_size(shape)


class _Call(NamedTuple):
    problem: _tiles.Problem
    layout: _Layout
    sinks: Tensor | None  # (BH, R), float32+
    grouped: int  # G > 1 when enable_gqa grouped the query heads
    q_shape: torch.Size


def _prepare(q, k, v, mask, is_causal, scale, block_size, enable_gqa, sinks) -> _Call:
    """Check the arguments of a call and bring it to the flat layout."""
    align = check_causal(is_causal)
    if not isinstance(enable_gqa, bool):
        raise TypeError(f"enable_gqa must be a bool, got {type(enable_gqa).__name__}")
    q_shape = q.shape if isinstance(q, Tensor) else None
    grouped = 0
    if enable_gqa:
        q, k, v, mask, grouped = _group_heads(q, k, v, mask)
    batch, scale, keep = check_attention_args(q, k, v, mask, align is not None, scale)
    block_q, block_k = _block_sizes(block_size)
    L, S = q.shape[-2], k.shape[-2]
    # Fold the trailing batch dimension into the rows when the keys broadcast along
    # it: always without a mask, and with one for grouped query heads, whose mask
    # rows fold with them, so that shared key heads are read, never repeated.
    fold = (
        (keep is None or grouped > 1)
        and len(batch) > 0
        and batch[-1] > 1
        and q.dim() >= 3
        and q.shape[-3] == batch[-1]
        and all(t.dim() < 3 or t.shape[-3] == 1 for t in (k, v))
    )
    layout = _Layout(q, k, v, batch, L, S, fold)
    if keep is not None:
        # A view when the mask's batch strides allow it (a shared (L, S) mask, or a
        # full one); otherwise a copy of the mask.
        keep = keep.reshape(layout.BH, layout.R, S)
    causal = None
    if align is not None:
        causal = _tiles.Causal(L, 0 if align == "top_left" else S - L)
    problem = _tiles.Problem(
        layout.rows(q, q.shape[-1:]),
        layout.keys(k),
        layout.keys(v),
        keep,
        causal,
        scale,
        block_q,
        block_k,
    )
    sink_rows = None
    if sinks is not None:
        sink_rows = _sink_rows(sinks, q, layout, grouped)
    return _Call(problem, layout, sink_rows, grouped, q_shape)


def _sink_rows(sinks, q, layout: _Layout, grouped: int) -> Tensor:
    """``sinks`` broadcast to the heads, one value per row of the flat layout."""
    check_float(sinks, "sinks")
    heads = layout.batch
    if grouped:  # sinks are given per query head: (..., Hq)
        heads = heads[:-2] + (heads[-2] * heads[-1],)
    try:
        ok = torch.broadcast_shapes(sinks.shape, heads) == heads
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"sinks of shape {tuple(sinks.shape)} does not broadcast to the heads "
            f"{tuple(heads)} (the batch shape of the scores, e.g. (H,) for q "
            "(B, H, L, D))"
        )
    if sinks.device != q.device:
        raise ValueError(f"sinks is on {sinks.device} but q is on {q.device}")
    s = sinks.to(torch.promote_types(q.dtype, torch.float32)).expand(heads)
    if grouped:
        s = s.unflatten(-1, layout.batch[-2:])
    return layout.rows(s.unsqueeze(-1))


# --------------------------------------------------------------------------------------
# The autograd Function
# --------------------------------------------------------------------------------------


def _with_sink(out: Tensor, lse: Tensor, sinks: Tensor) -> tuple[Tensor, Tensor]:
    """Merge a sink into a finished row: a state with logsumexp ``sink`` and output 0.

    ``lse' = log(e^lse + e^sink)`` and the output shrinks by the share of the
    mass on the keys, ``e^(lse - lse')``.
    """
    total = torch.logaddexp(lse, sinks)
    share = torch.exp(lse - total).masked_fill(torch.isneginf(total), 0.0)
    return out * share.unsqueeze(-1), total


def _fold_vmapped(info, in_dims, tensors):
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


def _unfold_vmapped(info, tensors):
    return tuple(x.reshape((info.batch_size, -1, *x.shape[1:])) for x in tensors)


class _FlashAttentionFunction(torch.autograd.Function):
    """FlashAttention on the flat layout, with the recomputing backward.

    Saves ``q, k, v``, the output and the logsumexp (and the sinks); the
    backward pass recomputes the score tiles (:class:`_FlashBackward`).
    """

    @staticmethod
    def forward(q, k, v, sinks, keep, causal, scale, block_q, block_k, path):
        if path == "triton":
            out, lse = _kernels.triton_flash_forward(
                q, k, v, mask=keep, causal=causal, scale=scale
            )
        else:
            p = _tiles.Problem(q, k, v, keep, causal, scale, block_q, block_k)
            out, lse = _tiles.forward(p)
        if sinks is not None:
            out, lse = _with_sink(out, lse, sinks)
        return out.to(q.dtype), lse

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, sinks, keep, causal, scale, block_q, block_k, path = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse, sinks, keep)
        ctx.args = (causal, scale, block_q, block_k, path)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse, sinks, keep = ctx.saved_tensors
        delta = _delta(out, grad_out, grad_lse)
        dq, dk, dv = _FlashBackward.apply(
            q, k, v, keep, grad_out, lse, delta, *ctx.args
        )
        d_sinks = None
        if sinks is not None and ctx.needs_input_grad[3]:
            # The sink is one more score with value 0: its gradient is its weight
            # times (dlse - delta_0), with delta_0 = rowsum(dO o O).
            weight = torch.exp(sinks - lse).masked_fill(torch.isneginf(lse), 0.0)
            d_sinks = -weight * delta
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), d_sinks, *[None] * 6

    @staticmethod
    def vmap(info, in_dims, q, k, v, sinks, keep, causal, scale, bq, bk, path):
        args = _fold_vmapped(info, in_dims[:5], (q, k, v, sinks, keep))
        out = _FlashAttentionFunction.apply(*args, causal, scale, bq, bk, path)
        return _unfold_vmapped(info, out), (0, 0)


class _FlashBackward(torch.autograd.Function):
    """The tile loops of the backward pass as a Function of their own, so that
    ``torch.func.vmap`` can batch them too (per-sample gradients): its vmap rule
    folds the vmapped dimension into the heads, as the forward's does."""

    @staticmethod
    def forward(q, k, v, keep, grad_out, lse, delta, causal, scale, bq, bk, path):
        if path == "triton":
            return _kernels.triton_flash_backward(
                q, k, v, grad_out, lse, delta, mask=keep, causal=causal, scale=scale
            )
        p = _tiles.Problem(q, k, v, keep, causal, scale, bq, bk)
        return _tiles.backward(p, grad_out, lse, delta)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass  # first-order gradients only: nothing to save

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(
            "flash_attention supports first-order gradients only (its backward pass "
            "is not differentiable)"
        )

    @staticmethod
    def vmap(info, in_dims, q, k, v, keep, grad_out, lse, delta, *args):
        tensors = _fold_vmapped(
            info, in_dims[:7], (q, k, v, keep, grad_out, lse, delta)
        )
        return _unfold_vmapped(info, _FlashBackward.apply(*tensors, *args)), (0, 0, 0)


# Function.apply binds its arguments with inspect.signature on every call (a
# tenth of a millisecond); a signature computed once makes that a lookup.
for _function in (_FlashAttentionFunction, _FlashBackward):
    _function.forward.__signature__ = inspect.signature(_function.forward)


def _delta(out: Tensor, grad_out: Tensor, grad_lse: Tensor | None) -> Tensor:
    r""":math:`\delta_i = \sum_d dO_{id} O_{id} - d\mathrm{lse}_i`, in float32+."""
    acc = torch.promote_types(out.dtype, torch.float32)
    # A batched dot product: dO o O is never formed as a tensor of its own.
    delta = torch.einsum("...d,...d->...", grad_out.to(acc), out.to(acc))
    return delta if grad_lse is None else delta - grad_lse.to(acc)


# --------------------------------------------------------------------------------------
# The public functions
# --------------------------------------------------------------------------------------


def flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    is_causal: bool | str = False,
    scale: float | None = None,
    block_size: int | tuple[int, int] = DEFAULT_BLOCK_SIZE,
    return_lse: bool = False,
    enable_gqa: bool = False,
    sinks: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    r"""Exact attention computed tile by tile:
    :math:`\mathrm{softmax}(QK^\top \cdot \text{scale})\,V`.

    The algorithm of FlashAttention (Dao et al., 2022). Queries are cut into
    blocks of ``block_q`` rows, keys and values into blocks of ``block_k``.
    For each query row the loop over key blocks keeps a running maximum
    :math:`m`, a running sum :math:`\ell` and an unnormalized output
    :math:`o`; a new tile of scores :math:`s` updates them as

    .. math::

        m' &= \max(m, \max_j s_j), \\
        \ell' &= e^{m - m'}\,\ell + \textstyle\sum_j e^{s_j - m'}, \\
        o' &= e^{m - m'}\,o + \textstyle\sum_j e^{s_j - m'}\, v_j

    and the result is :math:`o / \ell`. On the CPU the blocks are shared among
    one worker per torch thread, and each worker holds one ``(block_q,
    block_k)`` tile of scores at a time, so the extra memory grows linearly
    with the sequence length (and with the number of threads); the ``(L, S)``
    score matrix is never formed. With a
    causal mask the tiles entirely above the diagonal are skipped. Rows with
    nothing to attend give zeros (and a logsumexp of ``-inf``), forward and
    backward.

    The backward pass saves only ``q, k, v``, the output and the logsumexp,
    and recomputes each tile of weights from them (see
    :func:`flash_attention_backward`): its memory is linear in the sequence
    length too. Everything is computed in float32 (float64 for float64
    input) and rounded once to the dtype of ``q``.

    On CUDA tensors with Triton installed the forward and backward run in the
    Triton kernels of :mod:`softmaxbook.kernels`; everywhere else in torch
    (:func:`~softmaxbook.explain_dispatch` says which and why).

    Shapes: ``q`` is ``(..., L, D)``, ``k`` is ``(..., S, D)``, ``v`` is
    ``(..., S, Dv)``, batch dimensions broadcast; with ``enable_gqa``, ``q``
    is ``(..., Hq, L, D)`` and ``k``, ``v`` have ``Hkv`` heads, ``Hq`` a
    multiple of ``Hkv``. The result is ``(..., L, Dv)`` in the dtype of
    ``q``, the logsumexp ``(..., L)`` in float32 (float64 for float64 input).

    Equivalent to ``torch.nn.functional.scaled_dot_product_attention(q, k, v,
    attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)``,
    except that fully masked rows give zeros instead of ``nan``.

    Parameters
    ----------
    q, k, v : Tensor
        Queries, keys and values, one floating dtype.
    mask : bool Tensor broadcastable to ``(..., L, S)``, optional
        True = the query may attend to the key.
    is_causal : bool or str
        ``True`` or ``"top_left"``: query :math:`i` attends to keys
        :math:`j \le i` (torch's alignment). ``"bottom_right"``: to keys
        :math:`j \le i + S - L`, so that the last query sees the last key
        (flash-attn's alignment, right for queries appended to a KV cache).
        The two agree when ``L == S``. Cannot be combined with ``mask``.
    scale : float, optional
        Multiplies the scores; defaults to :math:`1/\sqrt{D}`.
    block_size : int or (int, int)
        Tile sizes ``(block_q, block_k)`` of the torch path (one int sets
        both). They change the speed and memory, not the result beyond
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

    Returns
    -------
    Tensor ``(..., L, Dv)``, or ``(out, lse)`` with ``return_lse=True``.

    Raises
    ------
    TypeError
        If an input is not a floating tensor, the dtypes differ, or the mask
        is not boolean.
    ValueError
        If the shapes do not fit together, the mask or the sinks do not
        broadcast, ``scale <= 0``, ``is_causal`` is an unknown name, or both
        ``mask`` and ``is_causal`` are given.
    """
    return _attention(
        q, k, v, mask, is_causal, scale, block_size, return_lse, enable_gqa, sinks
    )


def _attention(
    q,
    k,
    v,
    mask,
    is_causal,
    scale,
    block_size,
    return_lse,
    enable_gqa,
    sinks,
    path=None,
):
    """:func:`flash_attention`, with the path forced by ``path`` if given."""
    call = _prepare(q, k, v, mask, is_causal, scale, block_size, enable_gqa, sinks)
    p = call.problem
    if path is None:
        path = _dispatch.explain_dispatch("flash_attention", q, k, v).path
    out, lse = _FlashAttentionFunction.apply(
        p.q,
        p.k,
        p.v,
        call.sinks,
        p.keep,
        p.causal,
        p.scale,
        p.block_q,
        p.block_k,
        path,
    )
    out = _unrows_heads(call.layout.unrows(out), call)
    lse = _unrows_heads(call.layout.unrows(lse.unsqueeze(-1)), call).squeeze(-1)
    return (out, lse) if return_lse else out


def _unrows_heads(x: Tensor, call: _Call) -> Tensor:
    """``batch + (L, .)``: merge the ``(Hkv, G)`` head dimensions of a grouped call
    back into ``Hq``."""
    if not call.grouped:
        return x
    return x.flatten(x.dim() - 4, x.dim() - 3)


def flash_attention_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    grad_out: Tensor,
    *,
    mask: Tensor | None = None,
    is_causal: bool | str = False,
    scale: float | None = None,
    block_size: int | tuple[int, int] = DEFAULT_BLOCK_SIZE,
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
    The second form of :math:`\delta` needs only ``out`` and ``grad_out``, so
    :math:`P` is never stored: each tile of it is recomputed from ``q``,
    ``k`` and ``lse`` when it is needed. This is what
    :func:`flash_attention`'s backward pass runs.

    ``lse`` and ``out`` may come from a larger computation than this call's
    keys (ring attention passes the merged ones): the result is then this
    key block's share of the gradients. A gradient ``grad_lse`` for the
    logsumexp adds :math:`P_{ij}\, d\mathrm{lse}_i` to :math:`dS`.

    Shapes: as :func:`flash_attention`; ``out`` and ``grad_out`` are ``(...,
    L, Dv)``, ``lse`` and ``grad_lse`` ``(..., L)``. Returns ``(dq, dk, dv)``
    with the shapes and dtypes of ``q``, ``k``, ``v``.

    Raises
    ------
    TypeError, ValueError
        For bad input, as :func:`flash_attention`, or if ``out``, ``lse``,
        ``grad_out`` do not have the shapes above.
    """
    call = _prepare(q, k, v, mask, is_causal, scale, block_size, enable_gqa, None)
    Dv = v.shape[-1]
    rows_shape = torch.Size(call.q_shape[:-1])  # (..., L) of the queries
    for name, t, shape in (
        ("out", out, rows_shape + (Dv,)),
        ("grad_out", grad_out, rows_shape + (Dv,)),
        ("lse", lse, rows_shape),
        ("grad_lse", grad_lse, rows_shape),
    ):
        if t is None and name == "grad_lse":
            continue
        check_float(t, name)
        if t.shape != shape:
            raise ValueError(
                f"{name} must have shape {tuple(shape)} (from q and v), got "
                f"{tuple(t.shape)}"
            )

    def rows(x, trailing=()):
        if call.grouped:
            x = x.unflatten(x.dim() - 1 - len(trailing) - 1, (-1, call.grouped))
        return call.layout.rows(x, trailing)

    out3, do3 = rows(out, (Dv,)), rows(grad_out, (Dv,))
    lse3 = rows(lse.unsqueeze(-1), (1,)).squeeze(-1)
    dlse3 = None if grad_lse is None else rows(grad_lse.unsqueeze(-1), (1,)).squeeze(-1)
    p = call.problem
    path = _dispatch.explain_dispatch("flash_attention", q, k, v).path
    with torch.no_grad():
        dq, dk, dv = _FlashBackward.forward(
            p.q,
            p.k,
            p.v,
            p.keep,
            do3,
            lse3,
            _delta(out3, do3, dlse3),
            p.causal,
            p.scale,
            p.block_q,
            p.block_k,
            path,
        )
    dq = _unrows_heads(call.layout.unrows(dq), call).sum_to_size(q.shape)
    k_shape = k.unsqueeze(-3).shape if call.grouped else k.shape
    v_shape = v.unsqueeze(-3).shape if call.grouped else v.shape
    dk = call.layout.unkeys(dk, k_shape).reshape(k.shape)
    dv = call.layout.unkeys(dv, v_shape).reshape(v.shape)
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

    Shapes: as :func:`flash_attention`; each :class:`FlashStep` holds
    ``(..., bq)`` and ``(..., bq, Dv)`` tensors for its query block.

    Equivalent to iterating the loop nest of Dao et al. (2022), Algorithm 1.

    Raises
    ------
    TypeError, ValueError
        For bad input, as :func:`flash_attention`.
    """
    align = check_causal(is_causal)
    batch, scale, keep = check_attention_args(q, k, v, mask, align is not None, scale)
    block_q, block_k = _block_sizes(block_size)
    L, S = q.shape[-2], k.shape[-2]
    causal = (
        None if align is None else _tiles.Causal(L, 0 if align == "top_left" else S - L)
    )
    return _steps(q, k, v, batch, keep, causal, scale, block_q, block_k)


def _steps(q, k, v, batch, keep, causal, scale, block_q, block_k):
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
            elif keep is not None:
                s = s.masked_fill(~keep[..., q0:q1, k0:k1], float("-inf"))
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
