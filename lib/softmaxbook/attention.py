r"""Scaled dot-product attention with a pluggable normalizer.

.. math:: \mathrm{Attention}(Q, K, V) = \mathrm{normalize}\!\left(\frac{Q K^\top}{\sqrt{D}} + M\right) V

The normalizer is softmax by default; the alternatives chapter plugs in
sparsemax, entmax and others by name, and any callable
``f(scores, dim=-1) -> weights`` works too.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ._checks import check_float, check_positive
from .masking import causal_mask, check_mask, masked_softmax

__all__ = ["scaled_dot_product_attention", "NORMALIZERS"]

Normalizer = Callable[..., Tensor]


def _softmax(scores: Tensor, dim: int = -1) -> Tensor:
    return torch.softmax(scores, dim=dim)


#: Normalizers usable by name as ``normalizer=`` (name -> ``f(scores, dim=-1)``).
NORMALIZERS: dict[str, Normalizer] = {"softmax": _softmax}

from .alternatives import (  # noqa: E402  (the alternatives chapter's normalizers)
    entmax15,
    relu_normalize,
    sigmoid_normalize,
    softmax_one,
    sparsemax,
)

NORMALIZERS.update(
    {
        "sparsemax": sparsemax,
        "entmax15": entmax15,
        "softmax_one": softmax_one,
        "relu": relu_normalize,
        "sigmoid": sigmoid_normalize,
    }
)


def _resolve_normalizer(normalizer: str | Normalizer) -> tuple[str, Normalizer]:
    if isinstance(normalizer, str):
        if normalizer not in NORMALIZERS:
            raise ValueError(
                f"normalizer={normalizer!r} is unknown; expected one of {sorted(NORMALIZERS)} "
                "or a callable f(scores, dim=-1)"
            )
        return normalizer, NORMALIZERS[normalizer]
    if callable(normalizer):
        return getattr(normalizer, "__name__", "callable"), normalizer
    raise TypeError(
        f"normalizer must be a name or a callable, got {type(normalizer).__name__}"
    )


def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float(t, name)
        if t.dim() < 2:
            raise ValueError(
                f"{name} must have at least 2 dimensions (..., length, dim), "
                f"got shape {tuple(t.shape)}"
            )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(
            f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    if not (q.device == k.device == v.device):
        raise ValueError(
            f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same last dimension D, got q {tuple(q.shape)} "
            f"and k {tuple(k.shape)}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same length S (dimension -2), got k "
            f"{tuple(k.shape)} and v {tuple(v.shape)}"
        )
    try:
        torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"the batch dimensions of q {tuple(q.shape)}, k {tuple(k.shape)} and "
            f"v {tuple(v.shape)} do not broadcast"
        ) from None


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    normalizer: str | Normalizer = "softmax",
    return_weights: bool = False,
):
    r"""Attention: :math:`\mathrm{normalize}(Q K^\top \cdot \text{scale},\ \text{mask})\, V`.

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
    weights ``(..., L, S)``.

    Equivalent, for softmax, to
    ``torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
    is_causal=is_causal, scale=scale)`` (same boolean convention, same
    top-left causal alignment; torch 2.5 and later also give zeros for fully
    masked rows).

    Parameters
    ----------
    q, k, v : Tensor
        Queries, keys and values, one floating dtype and one device.
    mask : Tensor, optional
        Boolean, broadcastable to ``(..., L, S)``; True = the query may attend
        to the key (torch's convention for ``attn_mask``).
    is_causal : bool
        Apply :func:`~softmaxbook.masking.causal_mask` ``(L, S)``, aligned top-left.
        Cannot be combined with ``mask``: pass ``mask & causal_mask(L, S)``.
    scale : float, optional
        Multiplies the scores; defaults to :math:`1/\sqrt{D}`. Must be > 0.
    normalizer : str or callable
        ``"softmax"`` or another name in
        :data:`~softmaxbook.attention.NORMALIZERS`, or a callable
        ``f(scores, dim=-1)`` that maps scores (``-inf`` at masked entries) to
        weights of the same shape.
    return_weights : bool
        Also return the weights.

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
        with ``is_causal=True``, if ``scale <= 0``, or if ``normalizer`` is an
        unknown name or returns the wrong shape.
    """
    _check_qkv(q, k, v)
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    if mask is not None and is_causal:
        raise ValueError(
            "pass either mask or is_causal=True, not both "
            "(combine them yourself: mask & causal_mask(L, S))"
        )
    name, normalize = _resolve_normalizer(normalizer)
    scale = (
        1.0 / math.sqrt(q.shape[-1])
        if scale is None
        else check_positive(scale, "scale")
    )
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., L, S)
    if is_causal:
        mask = causal_mask(q.shape[-2], k.shape[-2], device=q.device)  # (L, S)
    if name == "softmax" and normalize is NORMALIZERS.get("softmax"):
        weights = masked_softmax(scores, mask)
    elif mask is None:
        weights = _checked(normalize(scores, dim=-1), scores, name)
    else:
        weights = _masked_normalize(normalize, scores, check_mask(mask, scores), name)
    out = weights @ v  # (..., L, Dv)
    return (out, weights) if return_weights else out


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
    # Masked keys become -inf, which every library normalizer treats as removed.
    filled = scores.masked_fill(~keep, float("-inf"))  # (..., L, S)
    # Rows with nothing to attend get a harmless finite row (no inf - inf in the
    # normalizer's forward or backward), and zeros after.
    empty = torch.isneginf(filled).all(dim=-1, keepdim=True)  # (..., L, 1)
    weights = _checked(normalize(filled.masked_fill(empty, 0.0), dim=-1), scores, name)
    return weights.masked_fill(~keep | empty, 0.0)
