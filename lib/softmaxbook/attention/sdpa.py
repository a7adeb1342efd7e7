r"""Scaled dot-product attention with a pluggable normalizer.

.. math::

    \mathrm{Attention}(Q, K, V)
    = \mathrm{normalize}\!\left(\frac{Q K^\top}{\sqrt{D}} + M\right) V

The normalizer is softmax by default; the alternatives chapter plugs in
sparsemax, entmax and others by name, and any callable
``f(scores, dim=-1) -> weights`` works too.

Two paths compute it. Where torch's fused kernel computes exactly the same
thing (softmax, no sinks, no returned weights, ``(B, H, L, D)`` CPU tensors,
finite scores), the call is handed to
``torch.nn.functional.scaled_dot_product_attention``: the ``torch-fused`` path, as
fast as torch in a training loop. Everywhere else, and always with
``explicit=True``, the scores, the weights and their average are computed in
the open: the ``explicit`` path, the one the chapters read and test.
:func:`~softmaxbook.explain_dispatch` says which path a call takes, and why.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import normalizers
from .._numerics import functorch_active
from .._validate import zero_empty_rows
from ..kernels.dispatch import SDPA_OP, register_explainer, sdpa_decision
from ..masking import masked_softmax
from ..normalizers import sink_softmax
from ._args import AttentionArgs, resolve_attention
from .decode import repeat_kv_heads

__all__ = ["scaled_dot_product_attention", "NORMALIZERS"]

#: A normalizer maps scores to weights along a dimension: ``f(scores, dim=-1)``.
Normalizer = Callable[..., Tensor]

#: Every name ``normalizer=`` accepts -> its normalizer: the registry
#: :data:`softmaxbook.normalizers.NORMALIZERS` itself, under this module's name.
#:
#: :meta hide-value:
NORMALIZERS = normalizers.NORMALIZERS


def resolve_normalizer(normalizer: str | Normalizer) -> tuple[str, Normalizer]:
    """Return ``(name, function)`` for a name in :data:`NORMALIZERS` or a callable.

    The names are those of the registry of normalizers,
    :data:`softmaxbook.normalizers.NORMALIZERS` (``"relu"`` and ``"sigmoid"``
    included); its entry is callable as ``f(scores, dim=-1)``. Raises
    ``ValueError`` for an unknown name and ``TypeError`` for anything else, so
    that a model can reject a bad normalizer when it is built.
    """
    if isinstance(normalizer, str):
        if normalizer not in NORMALIZERS:
            raise ValueError(
                f"normalizer={normalizer!r} is unknown; expected one of "
                f"{sorted(NORMALIZERS)} or a callable f(scores, dim=-1)"
            )
        return normalizer, NORMALIZERS[normalizer]
    if callable(normalizer):
        return getattr(normalizer, "__name__", "callable"), normalizer
    raise TypeError(
        f"normalizer must be a name or a callable, got {type(normalizer).__name__}"
    )


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool | str = False,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
    mask: Tensor | None = None,
    normalizer: str | Normalizer = "softmax",
    sinks: Tensor | None = None,
    return_weights: bool = False,
    explicit: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    r"""Attention:
    :math:`\mathrm{normalize}(Q K^\top \cdot \text{scale} + M)\, V`.

    The scores :math:`Q K^\top` are multiplied by ``scale`` (default
    :math:`1/\sqrt{D}`), masked, normalized along the keys and used to
    average the values. A boolean mask sets the scores of removed keys to
    ``-inf`` before the normalizer sees them; a float mask :math:`M` is added
    to the scores (``-inf`` removes a key), as torch does. A query with
    nothing to attend to gets all-zero weights and a zero output, with zero
    (never ``nan``) gradients. With the softmax normalizer this is
    :func:`~softmaxbook.masking.masked_softmax`; any other normalizer (a name
    or a callable) gets the same treatment around it. With ``dropout_p > 0``
    the weights go through ``torch.dropout`` (each zeroed with probability
    ``dropout_p``, the others divided by ``1 - dropout_p``) before they
    average the values, as in torch's function: always, there is no
    ``training`` flag.

    Where torch's fused kernel computes the same thing (the softmax
    normalizer, no ``sinks``, no ``return_weights``, ``(B, H, L, D)`` tensors
    on the CPU, an output that is all finite), the call is handed to
    ``torch.nn.functional.scaled_dot_product_attention`` after the same
    argument checks: the *torch-fused* path, which runs a training step as fast as
    torch does, float masks and dropout included. Everything else takes the
    *explicit* path above, and ``explicit=True`` forces it;
    ``sb.explain_dispatch("scaled_dot_product_attention", q, k, v,
    **options)`` says which path a call takes, and why. Both give zeros for
    fully masked rows, forward and backward. The fused kernel's backward pass
    is not differentiable: for second derivatives (``create_graph=True``),
    pass ``explicit=True`` (``torch.func`` transforms take the explicit path
    by themselves).

    Shapes: ``q`` is ``(..., L, D)``, ``k`` is ``(..., S, D)``, ``v`` is
    ``(..., S, Dv)``, the batch dimensions ``...`` broadcast; the mask
    broadcasts to ``(..., L, S)``; the output is ``(..., L, Dv)`` and the
    weights ``(..., L, S)``. With ``enable_gqa``, ``k`` and ``v`` may have
    fewer heads than ``q`` (dimension -3), a divisor of its count.

    Equivalent, for softmax, to
    ``torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask,
    dropout_p, is_causal, scale, enable_gqa=enable_gqa)``: the same
    positional and keyword names, the same boolean and float masks, the same
    top-left causal alignment for ``is_causal=True``, and the same dropout
    (with the same random state, the same weights are dropped); torch 2.5 and
    later also give zeros for fully masked rows.

    Parameters
    ----------
    q, k, v : Tensor
        Queries, keys and values, one floating dtype and one device.
    attn_mask, mask : Tensor, optional
        The mask (``attn_mask`` is torch's name; pass one of the two),
        broadcastable to ``(..., L, S)``: boolean, True = the query may attend
        to the key, or floating point of ``q``'s dtype, added to the scores.
    dropout_p : float
        Probability of dropping a weight, in :math:`[0, 1)`; 0 by default.
    is_causal : bool or str
        Apply a causal mask ``(L, S)``: ``True`` or ``"top_left"`` aligns it
        at the top-left corner, like torch (:func:`~softmaxbook.causal_mask`),
        ``"bottom_right"`` at the bottom-right, like flash-attn (the last query
        sees the last key: the KV-cache case); see
        :func:`~softmaxbook.aligned_causal_mask`. Cannot be combined with a
        mask: pass ``mask & aligned_causal_mask(L, S, align=...)``.
    scale : float, optional
        Multiplies the scores; defaults to :math:`1/\sqrt{D}`. Must be > 0.
    enable_gqa : bool
        Grouped-query attention: query head :math:`h` uses key and value head
        :math:`\lfloor h / (H_q / H_{kv}) \rfloor`, as torch's ``enable_gqa``
        (:func:`~softmaxbook.repeat_kv_heads`).
    normalizer : str or callable
        ``"softmax"`` or another name in
        ``softmaxbook.NORMALIZERS``, or a callable
        ``f(scores, dim=-1)`` that maps scores (``-inf`` at masked entries) to
        weights of the same shape.
    sinks : Tensor, optional
        Learned sink logits (as in gpt-oss), one per row of the batch
        dimensions: a floating-point tensor that broadcasts to ``...`` (e.g.
        ``(H,)`` for ``(B, H, L, D)`` queries: one per head). Each row's
        softmax then runs over its scores and the sink logit :math:`b`, and
        the sink's weight is dropped:
        :math:`w_j = e^{s_j} / (e^{b} + \sum_k e^{s_k})`
        (:func:`~softmaxbook.sink_softmax`); the weights sum to less than 1,
        and ``sinks`` gets a gradient. Softmax normalizer only.
    return_weights : bool
        Also return the weights (without the sink's; after dropout: the
        weights that averaged the values).
    explicit : bool
        Always compute the scores and the weights explicitly, never in torch's
        fused kernel (the result is the same up to rounding; the explicit
        path is the one to read, and it is twice differentiable).

    Returns
    -------
    Tensor or tuple of Tensor
        The output ``(..., L, Dv)``, or ``(out, weights)`` with
        ``return_weights=True``.

    Raises
    ------
    TypeError
        If ``q``, ``k``, ``v`` are not floating point or differ in dtype, if
        the mask is neither boolean nor of ``q``'s dtype, if both ``mask`` and
        ``attn_mask`` are given, or ``normalizer`` is neither a name nor a
        callable.
    ValueError
        If the shapes do not match (``D`` of ``q`` and ``k``, ``S`` of ``k``
        and ``v``, batch dimensions, the mask), if a mask is given together
        with ``is_causal``, if ``is_causal`` is an unknown name, if
        ``enable_gqa`` is set and the head counts do not divide, if
        ``scale <= 0`` or ``dropout_p`` is not in :math:`[0, 1)`, or if
        ``normalizer`` is an unknown name or returns the wrong shape; if
        ``sinks`` does not broadcast to the batch dimensions, or comes with
        another normalizer than softmax.

    Examples
    --------
    >>> import torch, softmaxbook as sb
    >>> q, k, v = torch.randn(3, 2, 4, 5, 8).unbind(0)
    >>> bias = torch.randn(5, 5)  # a float mask is added to the scores
    >>> torch.allclose(
    ...     sb.scaled_dot_product_attention(q, k, v, attn_mask=bias, explicit=True),
    ...     torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias),
    ...     atol=1e-6,
    ... )
    True
    """
    call = _resolve(
        q, k, v, mask, attn_mask, is_causal, scale, normalizer, sinks,
        return_weights, enable_gqa, dropout_p, explicit,
    )  # fmt: skip
    args = call.args
    if call.path == "torch-fused":
        # Dropout draws from the random state: a recomputation draws the same.
        state = torch.get_rng_state() if args.dropout_p else None
        out = _fused(q, k, v, args, enable_gqa)
        # Under torch.compile the output's values are unknown while tracing: torch's
        # kernel's output is returned as it is (the same, unless q, k or v hold a nan
        # or an infinity).
        if torch.compiler.is_compiling() or _finite(out):
            return out
        # A nan or infinity: the explicit path keeps those of masked keys out of the
        # output (the fused kernel adds the mask to them), and agrees elsewhere.
        if state is not None:
            torch.set_rng_state(state)
    if args.groups > 1:  # each key and value head serves G query heads
        k, v = repeat_kv_heads(k, args.groups), repeat_kv_heads(v, args.groups)
    return _explicit(q, k, v, call, return_weights)


def _fused(q: Tensor, k: Tensor, v: Tensor, args: AttentionArgs, gqa: bool) -> Tensor:
    """torch's fused kernel, with the causal alignment in torch's terms."""
    mask, causal = args.mask, args.causal == "top_left"
    if args.causal == "bottom_right":  # torch's is_causal is top-left only
        mask = args.causal_mask(q.device)
    return F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=mask,
        dropout_p=args.dropout_p,
        is_causal=causal,
        scale=args.scale,
        enable_gqa=gqa,
    )


def _finite(out: Tensor) -> bool:
    """Whether every entry of ``out`` is finite: one sum, read once (a sum that
    overflows reads as not finite, and only costs the explicit recomputation)."""
    return math.isfinite(float(out.detach().sum(dtype=torch.float32)))


class _Resolved(NamedTuple):
    """A checked call: its path, its arguments and its normalizer."""

    path: str
    reason: str
    args: AttentionArgs
    name: str
    normalize: Normalizer
    is_softmax: bool


def _resolve(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, attn_mask: Tensor | None,
    is_causal: bool | str, scale: float | None, normalizer: str | Normalizer,
    sinks: Tensor | None, return_weights: bool, enable_gqa: bool, dropout_p: float,
    explicit: bool,
) -> _Resolved:  # fmt: skip
    """Check the arguments of :func:`scaled_dot_product_attention` and choose its
    path (the rule is ``softmaxbook.kernels.dispatch.sdpa_decision``)."""
    if not isinstance(explicit, bool):
        raise TypeError(f"explicit must be a bool, got {type(explicit).__name__}")
    args = resolve_attention(
        q, k, v, mask=mask, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
        sinks=sinks, enable_gqa=enable_gqa, dropout_p=dropout_p,
        caller="scaled_dot_product_attention",
    )  # fmt: skip
    name, normalize = resolve_normalizer(normalizer)
    # softmax by name, as its registry entry, or as the function itself.
    softmax = NORMALIZERS["softmax"]
    is_softmax = normalize is softmax or normalize is softmax.function
    if sinks is not None and not is_softmax:
        raise ValueError(
            "sinks are sink logits of the softmax (as in gpt-oss); with another "
            "normalizer, leave them out"
        )
    path, reason = sdpa_decision(
        explicit=explicit,
        softmax=is_softmax,
        sinks=sinks is not None,
        return_weights=bool(return_weights),
        device_types={q.device.type},
        ndims=(q.dim(), k.dim(), v.dim()),
        empty=q.numel() == 0 or k.numel() == 0 or v.numel() == 0,
        dtype=q.dtype,
        transforms=functorch_active(),
        bounded=lambda: True,  # the call checks the fused output instead
    )
    return _Resolved(path, reason, args, name, normalize, is_softmax)


def _resolve_path(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool | str = False,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
    mask: Tensor | None = None,
    normalizer: str | Normalizer = "softmax",
    sinks: Tensor | None = None,
    return_weights: bool = False,
    explicit: bool = False,
) -> tuple[str, str]:
    """``(path, reason)`` of a call with these arguments (for ``explain_dispatch``).

    Where the rule allows the fused kernel, its output is computed here too (without
    a gradient, and without dropout, so the random state is left alone), as the
    call does: if it holds a nan or an infinity, the call recomputes it on the
    explicit path, and so this says.
    """
    call = _resolve(
        q, k, v, mask, attn_mask, is_causal, scale, normalizer, sinks,
        return_weights, enable_gqa, dropout_p, explicit,
    )  # fmt: skip
    if call.path == "torch-fused":
        with torch.no_grad():
            args = call.args._replace(dropout_p=0.0)
            finite = _finite(_fused(q, k, v, args, enable_gqa))
        return sdpa_decision(
            explicit=False,
            softmax=True,
            sinks=False,
            return_weights=False,
            device_types={"cpu"},
            ndims=(4, 4, 4),
            empty=False,
            dtype=q.dtype,
            transforms=False,
            bounded=lambda: finite,
        )
    return call.path, call.reason


def _explicit(
    q: Tensor, k: Tensor, v: Tensor, call: _Resolved, return_weights: bool
) -> Tensor | tuple[Tensor, Tensor]:
    """The explicit path: scores, masked weights, their average of the values."""
    args = call.args
    scores = (q @ k.transpose(-2, -1)) * args.scale  # (..., L, S)
    # The mask may have batch dimensions that only v has: the scores take them all.
    scores = scores.expand(args.batch + (args.L, args.S))
    filled = args.masked_scores(scores)  # removed keys are -inf
    if args.sinks is not None:  # a row of -inf gives zeros
        weights = sink_softmax(filled, args.sinks[..., None, None], dim=-1)
    elif call.is_softmax:
        weights = masked_softmax(filled, None)
    elif args.mask is None and args.causal is None:
        weights = _checked(call.normalize(scores, dim=-1), scores, call.name)
    else:
        weights = _masked_normalize(call.normalize, filled, call.name)
    if args.dropout_p:  # as torch's math path: torch.dropout on the weights
        weights = torch.dropout(weights, args.dropout_p, True)
    out = weights @ v  # (..., L, Dv)
    return (out, weights) if return_weights else out


def _checked(weights: object, scores: Tensor, name: str) -> Tensor:
    if not isinstance(weights, Tensor) or weights.shape != scores.shape:
        got = (
            tuple(weights.shape)
            if isinstance(weights, Tensor)
            else type(weights).__name__
        )
        raise ValueError(
            f"normalizer {name!r} must return weights of the scores' shape "
            f"{tuple(scores.shape)}, got {got}"
        )
    return weights


def _masked_normalize(normalize: Normalizer, filled: Tensor, name: str) -> Tensor:
    # Removed keys are -inf, which every library normalizer treats as removed; a
    # row with nothing left to attend gives zeros, never nan.
    removed = torch.isneginf(filled)
    weights = zero_empty_rows(
        lambda s: _checked(normalize(s, dim=-1), filled, name), filled, dim=-1
    )
    return weights.masked_fill(removed, 0.0)  # whatever a custom normalizer gave


register_explainer(SDPA_OP, _resolve_path)
