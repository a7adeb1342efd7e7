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
``torch.nn.functional.scaled_dot_product_attention``: the ``fused`` path, as
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

from . import normalizers
from ._validate import (
    check_attention_args,
    check_causal,
    check_gqa_heads,
    zero_empty_rows,
)
from .decode import aligned_causal_mask, repeat_kv_heads
from .kernels.dispatch import SDPA_OP, register_explainer, sdpa_decision
from .masking import masked_softmax
from .normalizers import sink_softmax

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
    *,
    mask: Tensor | None = None,
    is_causal: bool | str = False,
    scale: float | None = None,
    normalizer: str | Normalizer = "softmax",
    sinks: Tensor | None = None,
    return_weights: bool = False,
    enable_gqa: bool = False,
    explicit: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    r"""Attention:
    :math:`\mathrm{normalize}(Q K^\top \cdot \text{scale},\ \text{mask})\, V`.

    The scores :math:`Q K^\top` are multiplied by ``scale`` (default
    :math:`1/\sqrt{D}`), masked, normalized along the keys and used to
    average the values. Masked scores become ``-inf`` before the normalizer
    sees them, and a query with nothing to attend to gets all-zero weights
    and a zero output, with zero (never ``nan``) gradients. With the softmax
    normalizer this is :func:`~softmaxbook.masking.masked_softmax`; any other
    normalizer (a name or a callable) gets the same treatment around it.

    Where torch's fused kernel computes the same thing (the softmax
    normalizer, no ``sinks``, no ``return_weights``, ``(B, H, L, D)`` tensors
    on the CPU, scores that are all finite), the call is handed to
    ``torch.nn.functional.scaled_dot_product_attention`` after the same
    argument checks: the *fused* path, which runs a training step as fast as
    torch does. Everything else takes the *explicit* path above, and
    ``explicit=True`` forces it; ``sb.explain_dispatch(
    "scaled_dot_product_attention", q, k, v, **options)`` says which path a
    call takes, and why. Both give zeros for fully masked rows, forward and
    backward. The fused kernel's backward pass is not differentiable: for
    second derivatives (``create_graph=True``), pass ``explicit=True``
    (``torch.func`` transforms take the explicit path by themselves).

    Shapes: ``q`` is ``(..., L, D)``, ``k`` is ``(..., S, D)``, ``v`` is
    ``(..., S, Dv)``, the batch dimensions ``...`` broadcast; ``mask``
    broadcasts to ``(..., L, S)``; the output is ``(..., L, Dv)`` and the
    weights ``(..., L, S)``. With ``enable_gqa``, ``k`` and ``v`` may have
    fewer heads than ``q`` (dimension -3), a divisor of its count.

    Equivalent, for softmax, to
    ``torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
    is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)`` (same boolean
    convention, same top-left causal alignment for ``is_causal=True``; torch
    2.5 and later also give zeros for fully masked rows).

    Parameters
    ----------
    q, k, v : Tensor
        Queries, keys and values, one floating dtype and one device.
    mask : Tensor, optional
        Boolean, broadcastable to ``(..., L, S)``; True = the query may attend
        to the key (torch's convention for ``attn_mask``).
    is_causal : bool or str
        Apply a causal mask ``(L, S)``: ``True`` or ``"top_left"`` aligns it
        at the top-left corner, like torch (:func:`~softmaxbook.causal_mask`),
        ``"bottom_right"`` at the bottom-right, like flash-attn (the last query
        sees the last key: the KV-cache case); see
        :func:`~softmaxbook.aligned_causal_mask`. Cannot be combined with
        ``mask``: pass ``mask & aligned_causal_mask(L, S, align=...)``.
    scale : float, optional
        Multiplies the scores; defaults to :math:`1/\sqrt{D}`. Must be > 0.
    normalizer : str or callable
        ``"softmax"`` or another name in
        :data:`~softmaxbook.attention.NORMALIZERS`, or a callable
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
        Also return the weights (without the sink's).
    enable_gqa : bool
        Grouped-query attention: query head :math:`h` uses key and value head
        :math:`\lfloor h / (H_q / H_{kv}) \rfloor`, as torch's ``enable_gqa``
        (:func:`~softmaxbook.repeat_kv_heads`).
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
        ``mask`` is not boolean, or ``normalizer`` is neither a name nor a
        callable.
    ValueError
        If the shapes do not match (``D`` of ``q`` and ``k``, ``S`` of ``k``
        and ``v``, batch dimensions, the mask), if ``mask`` is given together
        with ``is_causal``, if ``is_causal`` is an unknown name, if
        ``enable_gqa`` is set and the head counts do not divide, if
        ``scale <= 0``, or if ``normalizer`` is an unknown name or returns the
        wrong shape; if ``sinks`` does not broadcast to the batch dimensions,
        or comes with another normalizer than softmax.
    """
    call = _resolve(
        q, k, v, mask, is_causal, scale, normalizer, sinks, return_weights,
        enable_gqa, explicit,
    )  # fmt: skip
    if call.path == "fused":
        out = _fused(q, k, v, call, enable_gqa)
        if _finite(out):
            return out
        # A nan or infinity: the explicit path keeps those of masked keys out of the
        # output (the fused kernel adds the mask to them), and agrees elsewhere.
    if enable_gqa:  # each key and value head serves G query heads
        k, v = repeat_kv_heads(k, call.groups), repeat_kv_heads(v, call.groups)
    return _explicit(q, k, v, call, return_weights)


def _fused(q: Tensor, k: Tensor, v: Tensor, call: _Resolved, enable_gqa: bool):
    return F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=call.mask,
        is_causal=call.torch_causal,
        scale=call.scale,
        enable_gqa=enable_gqa,
    )


def _finite(out: Tensor) -> bool:
    """Whether every entry of ``out`` is finite: one sum, read once (a sum that
    overflows reads as not finite, and only costs the explicit recomputation)."""
    return math.isfinite(float(out.detach().sum(dtype=torch.float32)))


class _Resolved(NamedTuple):
    """A checked call: its path, and what either path needs."""

    path: str
    reason: str
    batch: tuple[int, ...]
    scale: float
    align: str | None
    mask: Tensor | None  # the user's mask, or the bottom-right causal mask (fused)
    torch_causal: bool  # torch's top-left is_causal (fused path)
    name: str
    normalize: Normalizer
    is_softmax: bool
    sinks: Tensor | None
    groups: int


def _resolve(
    q, k, v, mask, is_causal, scale, normalizer, sinks, return_weights, enable_gqa,
    explicit,
) -> _Resolved:  # fmt: skip
    """Check the arguments of :func:`scaled_dot_product_attention` and choose its
    path (the rule is ``softmaxbook.kernels.dispatch.sdpa_decision``)."""
    align = check_causal(is_causal)
    if not isinstance(enable_gqa, bool):
        raise TypeError(f"enable_gqa must be a bool, got {type(enable_gqa).__name__}")
    if not isinstance(explicit, bool):
        raise TypeError(f"explicit must be a bool, got {type(explicit).__name__}")
    groups, kc, vc = 1, k, v
    if enable_gqa:  # each key and value head serves G query heads
        groups = check_gqa_heads(q, k, v)
        # Stand-ins of the repeated heads' shape for the checks: no copy is made.
        kc, vc = (
            t.new_empty(()).expand(
                t.shape[:-3] + (t.shape[-3] * groups,) + t.shape[-2:]
            )
            for t in (k, v)
        )
    batch, scale, _ = check_attention_args(q, kc, vc, mask, align is not None, scale)
    name, normalize = resolve_normalizer(normalizer)
    is_softmax = name == "softmax" and normalize is NORMALIZERS.get("softmax")
    if sinks is not None:
        sinks = _check_sinks(sinks, batch, q, is_softmax)
    L, S = q.shape[-2], k.shape[-2]
    path, reason = sdpa_decision(
        explicit=explicit,
        softmax=is_softmax,
        sinks=sinks is not None,
        return_weights=bool(return_weights),
        device_types={q.device.type},
        ndims=(q.dim(), k.dim(), v.dim()),
        empty=q.numel() == 0 or k.numel() == 0 or v.numel() == 0,
        dtype=q.dtype,
        transforms=_functorch_active(),
        bounded=lambda: True,  # the call checks the fused output instead
    )
    torch_causal = False
    if path == "fused" and align is not None:
        if align == "top_left" or L == S:
            torch_causal = True
        else:
            mask = aligned_causal_mask(L, S, align=align, device=q.device)
    return _Resolved(
        path, reason, batch, scale, align, mask, torch_causal, name, normalize,
        is_softmax, sinks, groups,
    )  # fmt: skip


def _resolve_path(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    is_causal: bool | str = False,
    scale: float | None = None,
    normalizer: str | Normalizer = "softmax",
    sinks: Tensor | None = None,
    return_weights: bool = False,
    enable_gqa: bool = False,
    explicit: bool = False,
) -> tuple[str, str]:
    """``(path, reason)`` of a call with these arguments (for ``explain_dispatch``).

    Where the rule allows the fused kernel, its output is computed here too (without
    a gradient), as the call does: if it holds a nan or an infinity, the call
    recomputes it on the explicit path, and so this says.
    """
    call = _resolve(
        q, k, v, mask, is_causal, scale, normalizer, sinks, return_weights,
        enable_gqa, explicit,
    )  # fmt: skip
    if call.path == "fused":
        with torch.no_grad():
            finite = _finite(_fused(q, k, v, call, enable_gqa))
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


def _functorch_active() -> bool:
    active = getattr(torch._C, "_are_functorch_transforms_active", None)
    return bool(active and active())


def _explicit(q: Tensor, k: Tensor, v: Tensor, call: _Resolved, return_weights):
    """The explicit path: scores, masked weights, their average of the values."""
    mask, sinks, scale, align = call.mask, call.sinks, call.scale, call.align
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., L, S)
    if align is not None:
        mask = aligned_causal_mask(
            q.shape[-2], k.shape[-2], align=align, device=q.device
        )  # (L, S)
    if mask is not None:  # a mask may have batch dimensions that only v has
        scores = scores.expand(torch.broadcast_shapes(scores.shape, mask.shape))
    if sinks is not None:  # removed keys are -inf; a row of them gives zeros
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = sink_softmax(scores, sinks[..., None, None], dim=-1)
    elif call.is_softmax:
        weights = masked_softmax(scores, mask)
    elif mask is None:
        weights = _checked(call.normalize(scores, dim=-1), scores, call.name)
    else:
        weights = _masked_normalize(
            call.normalize, scores, mask.expand(scores.shape), call.name
        )
    out = weights @ v  # (..., L, Dv)
    return (out, weights) if return_weights else out


def _check_sinks(sinks, batch: tuple[int, ...], q: Tensor, is_softmax: bool) -> Tensor:
    """Sink logits that broadcast to the batch dimensions, for softmax only."""
    if not is_softmax:
        raise ValueError(
            "sinks are sink logits of the softmax (as in gpt-oss); with another "
            "normalizer, leave them out"
        )
    if not isinstance(sinks, Tensor) or not sinks.is_floating_point():
        got = sinks.dtype if isinstance(sinks, Tensor) else type(sinks).__name__
        raise TypeError(f"sinks must be a floating-point tensor, got {got}")
    if sinks.device != q.device:
        raise ValueError(
            f"sinks is on {sinks.device} but q is on {q.device}; "
            "move it with sinks.to(q.device)"
        )
    try:
        fits = torch.broadcast_shapes(sinks.shape, batch) == batch
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(
            f"sinks of shape {tuple(sinks.shape)} must broadcast to the batch "
            f"dimensions {batch} of the scores: one sink logit per head, e.g. "
            "(H,) for q of shape (B, H, L, D)"
        )
    return sinks


def _checked(weights, scores: Tensor, name: str) -> Tensor:
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


def _masked_normalize(
    normalize: Normalizer, scores: Tensor, keep: Tensor, name: str
) -> Tensor:
    # Masked keys become -inf, which every library normalizer treats as removed;
    # a row with nothing left to attend gives zeros, never nan.
    filled = scores.masked_fill(~keep, float("-inf"))  # (..., L, S)
    weights = zero_empty_rows(
        lambda s: _checked(normalize(s, dim=-1), scores, name), filled, dim=-1
    )
    return weights.masked_fill(~keep, 0.0)  # whatever a custom normalizer gave them


register_explainer(SDPA_OP, _resolve_path)
