r"""Scaled dot-product attention with a pluggable normalizer.

.. math::

    \mathrm{Attention}(Q, K, V)
    = \mathrm{normalize}\!\left(\frac{Q K^\top}{\sqrt{D}} + M\right) V

The normalizer is softmax by default; the alternatives chapter plugs in
sparsemax, entmax and others by name, and any callable
``f(scores, dim=-1) -> weights`` works too.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ._checks import (
    check_attention_args,
    check_causal,
    check_gqa_heads,
    zero_empty_rows,
)
from .alternatives import (
    entmax15,
    relu_normalize,
    sigmoid_normalize,
    softmax_one,
    sparsemax,
)
from .decode import aligned_causal_mask, repeat_kv_heads
from .length import scalable_softmax
from .masking import masked_softmax
from .sinks import clipped_softmax, relu_attention, sink_softmax, softpick
from .stickbreaking import stick_breaking

__all__ = ["scaled_dot_product_attention", "NORMALIZERS"]

#: A normalizer maps scores to weights along a dimension: ``f(scores, dim=-1)``.
Normalizer = Callable[..., Tensor]


def _softmax(scores: Tensor, dim: int = -1) -> Tensor:
    return torch.softmax(scores, dim=dim)


#: Normalizers usable by name as ``normalizer=`` (name -> ``f(scores, dim=-1)``).
NORMALIZERS: dict[str, Normalizer] = {
    "softmax": _softmax,
    "sparsemax": sparsemax,
    "entmax15": entmax15,
    "softmax_one": softmax_one,
    "relu": relu_normalize,
    "sigmoid": sigmoid_normalize,
    "softpick": softpick,
    "clipped_softmax": clipped_softmax,
    "relu_attention": relu_attention,
    "scalable_softmax": scalable_softmax,
    "stick_breaking": stick_breaking,
}


def resolve_normalizer(normalizer: str | Normalizer) -> tuple[str, Normalizer]:
    """Return ``(name, function)`` for a name in :data:`NORMALIZERS` or a callable.

    Raises ``ValueError`` for an unknown name and ``TypeError`` for anything
    else, so that a model can reject a bad normalizer when it is built.
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
    align = check_causal(is_causal)
    if not isinstance(enable_gqa, bool):
        raise TypeError(f"enable_gqa must be a bool, got {type(enable_gqa).__name__}")
    if enable_gqa:  # each key and value head serves G query heads
        groups = check_gqa_heads(q, k, v)
        k, v = repeat_kv_heads(k, groups), repeat_kv_heads(v, groups)
    batch, scale, _ = check_attention_args(q, k, v, mask, align is not None, scale)
    name, normalize = resolve_normalizer(normalizer)
    is_softmax = name == "softmax" and normalize is NORMALIZERS.get("softmax")
    if sinks is not None:
        sinks = _check_sinks(sinks, batch, q, is_softmax)
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
    elif is_softmax:
        weights = masked_softmax(scores, mask)
    elif mask is None:
        weights = _checked(normalize(scores, dim=-1), scores, name)
    else:
        weights = _masked_normalize(normalize, scores, mask.expand(scores.shape), name)
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
