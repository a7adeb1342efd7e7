r"""FlashAttention: exact attention tile by tile, forward and backward.

The forward pass (Dao et al., 2022), in FlashAttention-2's loop order (Dao,
2024: query blocks outside, key blocks inside), streams key and value tiles
past each block of queries with the online softmax, so the ``(L, S)`` score
matrix is never formed. The backward pass saves only ``q, k, v``, the output
and one logsumexp per row (FlashAttention-2's state; the original kept the
row maximum and sum), and recomputes the tiles: with
:math:`\delta_i = \sum_d dO_{id}\, O_{id}` the weights' gradient needs no
stored weights (see :func:`flash_attention_backward`).

It is one operator, ``torch.ops.softmaxbook.flash_attention`` (``torch.compile``
sees it whole, and its backward pass as a second one), and outside compiled
code an autograd Function whose node is the output's own ``grad_fn`` and saves
exactly ``Q, K, V, O`` and the logsumexp (:data:`FlashAttention`). Three
implementations run it, and ``explain_dispatch("flash_attention", q, k, v,
**options)`` says which one a call takes, and why:

- ``"tiles"``: the library's tile loops (``_tiles``), the algorithm as the
  book teaches it (forced by ``block_size=`` or ``explicit=True``; also every
  case the other two do not cover: sinks, float16/bfloat16, broadcast batches,
  rows with nothing to attend, ``torch.func`` transforms);
- ``"torch-fused"``: on the CPU, torch's own FlashAttention kernel
  (``aten::_scaled_dot_product_flash_attention_for_cpu`` and its backward), the
  same algorithm compiled, where it computes the same thing;
- ``"triton"``: the Triton kernels of :mod:`softmaxbook.kernels` on a CUDA GPU.

The package holds one job per module: ``_layout`` (every call as one flat
layout, grouped query heads stacked as rows), ``_path`` (which implementation
runs), ``_fused`` (the adaptor to torch's CPU kernel), ``_op`` (the
computation and its autograd Functions for eager calls), ``_operator`` (the
operator pair torch.compile sees, and the choice between it and the eager
Function), ``_tiles`` (the tile loops) and ``steps`` (the loop written for
reading, :func:`flash_attention_steps`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..._numerics import acc_dtype
from ..._validate import CAUSAL_ALIGNMENTS as _CAUSAL_ALIGNMENTS
from ..._validate import check_float
from ...kernels import dispatch as _dispatch
from .._args import AttentionArgs, resolve_attention
from ._layout import DEFAULT_BLOCK_SIZE as DEFAULT_BLOCK_SIZE  # the tile loop's tiles
from ._layout import block_sizes, prepare
from ._op import FlashAttentionFunction, Plan, delta, tile_backward
from ._operator import flash_attention_op, run
from ._path import decide, explain
from .steps import FlashStep, flash_attention_steps

__all__ = [
    "FlashAttention",
    "flash_attention",
    "flash_attention_backward",
    "flash_attention_steps",
    "FlashStep",
    "CAUSAL_ALIGNMENTS",
]

#: The names ``is_causal`` accepts for the two alignments of a causal mask when
#: ``L != S``: ``"top_left"`` (torch's ``is_causal=True``: query ``i`` sees keys
#: ``j <= i``) and ``"bottom_right"`` (flash-attn's: the last query sees the last
#: key, ``j <= i + S - L``, the KV-cache case).
CAUSAL_ALIGNMENTS = _CAUSAL_ALIGNMENTS


def _run(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    args: AttentionArgs,
    block_size: int | tuple[int, int] | None,
    explicit: bool,
    return_lse: bool,
) -> tuple[Tensor, Tensor]:
    """Plan a resolved call (its tiles and its path) and run the operator."""
    block_q, block_k = block_sizes(block_size)  # checked where torch's kernel runs too
    path, _ = decide(q, k, v, args, explicit or block_size is not None)
    plan = Plan(args.causal or "", args.scale, args.groups, block_q, block_k, path)
    return run(q, k, v, args.mask, args.sinks, plan, lse_grad=return_lse)


class _FlashAttention:
    r"""FlashAttention as one op: the forward pass saves ``Q, K, V``, the output
    ``O`` and one logsumexp per query row, and the backward pass recomputes the
    weights from them.

    ``FlashAttention.apply(q, k, v, is_causal=False, *, mask=None, scale=None,
    sinks=None, enable_gqa=False, block_size=None, explicit=False,
    return_lse=False)`` returns the output ``(..., L, Dv)`` (and the logsumexp
    ``(..., L)`` with ``return_lse=True``), as :func:`flash_attention`, which
    shares its code. Outside torch.compile the output's ``grad_fn`` is the node
    of the autograd Function ``FlashAttention.Function``, and its
    ``saved_tensors`` are exactly ``(q, k, v, out, lse)`` (the inputs as given,
    the output and the logsumexp, in the output's batch shape and in float32,
    float64 for float64 input); a mask is saved as a sixth (no gradient): as
    given on the tile loops, and on the torch-fused path as the float additive mask
    torch's kernel reads (a boolean one converted once, as torch's own SDPA
    saves it); sinks are saved last. No tensor of the ``(L, S)`` scores is
    kept beyond the mask.

    Under ``torch.compile`` the call is the operator ``FlashAttention.op``
    (``torch.ops.softmaxbook.flash_attention``, registered with
    ``torch.library``, with its fake), one node of the graph, and its backward
    pass the operator ``torch.ops.softmaxbook.flash_attention_backward``: an
    autograd Function joins the two, and the compiler traces it. The backward
    pass is first-order; ``torch.func`` transforms (``vmap``, ``jacrev``,
    ``grad``) work outside torch.compile, through a vmap rule that folds the
    vmapped dimension into the batch; forward-mode transforms (``jvp``,
    ``jacfwd``) are not supported. Inside torch.compile one ``vmap`` works
    without gradients through it; ``grad``, ``jacrev`` and nested transforms raise
    an error with ``fullgraph=True`` and run eagerly without. Rows with nothing to
    attend give zeros, forward and backward. A mask gets no gradient.

    Equivalent to ``torch.nn.functional.scaled_dot_product_attention(q, k, v,
    attn_mask=mask, is_causal=is_causal, scale=scale)`` (with zeros for fully
    masked rows).

    Examples
    --------
    >>> import torch, softmaxbook as sb
    >>> q, k, v = (torch.randn(2, 8, 4, requires_grad=True) for _ in range(3))
    >>> out = sb.FlashAttention.apply(q, k, v, True)
    >>> type(out.grad_fn).__name__
    'FlashAttentionFunctionBackward'
    >>> [tuple(t.shape) for t in out.grad_fn.saved_tensors]
    [(2, 8, 4), (2, 8, 4), (2, 8, 4), (2, 8, 4), (2, 8)]
    >>> want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    >>> torch.allclose(out, want, atol=1e-6)
    True
    """

    __name__ = "FlashAttention"
    #: The autograd Function of eager calls (``out.grad_fn`` is its node).
    Function = FlashAttentionFunction
    #: The operator torch.compile sees: ``torch.ops.softmaxbook.flash_attention``.
    op = flash_attention_op

    @staticmethod
    def apply(
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
    ) -> Any:
        """The output, or ``(out, lse)`` with ``return_lse=True``."""
        args = resolve_attention(
            q, k, v, mask=mask, attn_mask=attn_mask, is_causal=is_causal,
            scale=scale, sinks=sinks, enable_gqa=enable_gqa,
            caller="FlashAttention.apply",
        )  # fmt: skip
        out, lse = _run(q, k, v, args, block_size, explicit, return_lse)
        return (out, lse) if return_lse else out

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.apply(*args, **kwargs)

    def __repr__(self) -> str:
        return "softmaxbook.FlashAttention"


#: FlashAttention as one op, called as a course's own autograd Function is called,
#: ``FlashAttention.apply(q, k, v, is_causal)``; the class docstring says more.
FlashAttention = _FlashAttention()
FlashAttention.__doc__ = _FlashAttention.__doc__


def _dropout_attention(
    q: Tensor, k: Tensor, v: Tensor, args: AttentionArgs
) -> tuple[Tensor, Tensor]:
    """Attention with dropout on the weights, as torch's math path computes it:
    the weights are formed (the tiles never store them), dropped with
    ``torch.dropout`` and averaged. Differentiable by autograd."""
    if args.groups > 1:
        k, v = (t.repeat_interleave(args.groups, dim=-3) for t in (k, v))
    acc = acc_dtype(q.dtype)
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

    The autograd node is :data:`FlashAttention`'s: it saves only ``q, k, v``,
    the output and the logsumexp, and its backward pass recomputes each tile
    of weights from them (see :func:`flash_attention_backward`).

    Three implementations run this algorithm (``sb.explain_dispatch(
    "flash_attention", q, k, v, **options)`` says which, and why): the
    library's tile loops in torch (``"tiles"``, computed in float32, float64
    for float64 input, and rounded once to the dtype of ``q``), forced by
    ``block_size=`` or ``explicit=True``; on the CPU, where it computes the
    same thing, torch's own compiled FlashAttention kernel (``"torch-fused"``);
    on CUDA tensors with Triton installed, the Triton kernels of
    :mod:`softmaxbook.kernels` (``"triton"``). With ``dropout_p > 0`` the
    weights are formed and dropped as torch does (``"explicit"``).

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
        :data:`FlashAttention` node.
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
    'tiles'
    """
    args = resolve_attention(
        q, k, v, mask=mask, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
        sinks=sinks, enable_gqa=enable_gqa, dropout_p=dropout_p,
        caller="flash_attention",
    )  # fmt: skip
    if args.dropout_p > 0.0:
        out, lse = _dropout_attention(q, k, v, args)
    else:
        out, lse = _run(q, k, v, args, block_size, explicit, return_lse)
    return (out, lse) if return_lse else out


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

        dV &= P^\top dO, \qquad dP = dO\, V^\top, \\
        dZ &= P \circ (dP - \delta), \\
        dQ &= dZ\, K \cdot \text{scale}, \qquad dK = dZ^\top Q \cdot \text{scale}

    with :math:`\delta_i = \sum_j P_{ij}\, dP_{ij} = \sum_d dO_{id}\, O_{id}`.
    The second form of :math:`\delta` needs only ``out`` and ``grad_output``,
    so :math:`P` is never stored: each tile of it is recomputed from ``q``,
    ``k`` and ``lse`` when it is needed. This is what
    :func:`flash_attention`'s backward pass runs on the tile loops.

    ``lse`` and ``out`` may come from a larger computation than this call's
    keys (ring attention passes the merged ones): the result is then this
    key block's share of the gradients. A gradient ``grad_lse`` for the
    logsumexp adds :math:`P_{ij}\, d\mathrm{lse}_i` to :math:`dZ`.

    Shapes: as :func:`flash_attention`; ``out`` and ``grad_output`` are
    ``(..., L, Dv)``, ``lse`` and ``grad_lse`` ``(..., L)``. Returns ``(dq,
    dk, dv)`` with the shapes and dtypes of ``q``, ``k``, ``v``.

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
    call = prepare(q, k, v, args, block_size)
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
    kernel = _dispatch.kernel_decision("flash_attention", q, k, v).path
    path = "triton" if kernel == "triton" else "tiles"
    with torch.no_grad():
        dq, dk, dv = tile_backward(
            call.problem, do3, lse3, delta(out3, do3, dlse3), path
        )
    dq = call.layout.unrows(dq).sum_to_size(q.shape)
    dk = call.layout.unkeys(dk, k.shape)
    dv = call.layout.unkeys(dv, v.shape)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


_dispatch.register_explainer("flash_attention", explain)
