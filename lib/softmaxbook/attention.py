r"""Scaled dot-product attention with a pluggable normalizer.

.. math:: \mathrm{Attention}(Q, K, V) = \mathrm{normalize}\!\left(\frac{Q K^\top}{\sqrt{D}} + M\right) V

The normalizer is softmax by default; the alternatives chapter plugs in
sparsemax, entmax and others by name, and any callable
``f(scores, dim=-1) -> weights`` works too.
"""
from __future__ import annotations

import math
from typing import Callable, Union

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


def _resolve_normalizer(normalizer: Union[str, Normalizer]) -> tuple[str, Normalizer]:
    if isinstance(normalizer, str):
        if normalizer not in NORMALIZERS:
            raise ValueError(
                f"normalizer={normalizer!r} is unknown; expected one of {sorted(NORMALIZERS)} "
                "or a callable f(scores, dim=-1)"
            )
        return normalizer, NORMALIZERS[normalizer]
    if callable(normalizer):
        return getattr(normalizer, "__name__", "callable"), normalizer
    raise TypeError(f"normalizer must be a name or a callable, got {type(normalizer).__name__}")


def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float(t, name)
        if t.dim() < 2:
            raise ValueError(f"{name} must have at least 2 dimensions (..., length, dim), "
                             f"got shape {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same last dimension D, got q {tuple(q.shape)} "
                         f"and k {tuple(k.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same length S (dimension -2), got k "
                         f"{tuple(k.shape)} and v {tuple(v.shape)}")
    try:
        torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(f"the batch dimensions of q {tuple(q.shape)}, k {tuple(k.shape)} and "
                         f"v {tuple(v.shape)} do not broadcast") from None


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    normalizer: Union[str, Normalizer] = "softmax",
    return_weights: bool = False,
):
    r"""Attention: :math:`\mathrm{normalize}(Q K^\top \cdot \text{scale},\ \text{mask})\, V`.

    Equivalent, for softmax, to
    ``torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
    is_causal=is_causal, scale=scale)``, except that fully masked rows give zeros.

    Parameters
    ----------
    q, k, v : Tensor
        Queries ``(..., L, D)``, keys ``(..., S, D)``, values ``(..., S, Dv)``;
        the batch dimensions ``...`` broadcast.
    mask : bool Tensor broadcastable to ``(..., L, S)``, optional
        True = the query may attend to the key (torch's convention). A query
        with nothing to attend to gets zero weights and a zero output.
    is_causal : bool
        Apply :func:`~softmaxbook.causal_mask` (cannot be combined with ``mask``).
    scale : float, optional
        Multiplies the scores; defaults to :math:`1/\sqrt{D}`.
    normalizer : str or callable
        ``"softmax"`` or another name in :data:`NORMALIZERS`, or a callable
        ``f(scores, dim=-1)`` that maps scores (with ``-inf`` at masked
        entries) to weights.
    return_weights : bool
        Also return the ``(..., L, S)`` weights.

    Returns
    -------
    Tensor ``(..., L, Dv)``, or ``(out, weights)`` with ``return_weights=True``.
    """
    _check_qkv(q, k, v)
    if mask is not None and is_causal:
        raise ValueError("pass either mask or is_causal=True, not both "
                         "(combine them yourself: mask & causal_mask(L, S))")
    name, normalize = _resolve_normalizer(normalizer)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else check_positive(scale, "scale")
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., L, S)
    if is_causal:
        mask = causal_mask(q.shape[-2], k.shape[-2], device=q.device)
    if name == "softmax":
        weights = masked_softmax(scores, mask)
    elif mask is None:
        weights = normalize(scores, dim=-1)
    else:
        weights = _masked_normalize(normalize, scores, check_mask(mask, scores))
    out = weights @ v  # (..., L, Dv)
    return (out, weights) if return_weights else out


def _masked_normalize(normalize: Normalizer, scores: Tensor, keep: Tensor) -> Tensor:
    # Masked keys become -inf, which every library normalizer treats as removed.
    # Rows with nothing to attend get a harmless finite row, and zeros after.
    filled = scores.masked_fill(~keep, float("-inf"))
    empty = ~keep.any(dim=-1, keepdim=True)
    weights = normalize(filled.masked_fill(empty, 0.0), dim=-1)
    return weights.masked_fill(~keep, 0.0)
