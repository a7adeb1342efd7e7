r"""Masks for attention, and a softmax that respects them.

Convention (the one of ``torch.nn.functional.scaled_dot_product_attention``):
a boolean mask is **True where a query may attend** to a key. A row with
nothing to attend (every key masked) gets all-zero weights, never ``nan``, in
the forward and in the backward pass.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from ._checks import check_dim, check_float, check_positive_int, check_tensor

__all__ = ["causal_mask", "padding_mask", "masked_softmax", "additive_mask", "mask_fill_value"]


def causal_mask(L: int, S: int | None = None, *, device=None) -> Tensor:
    r"""Boolean causal mask: query :math:`i` may attend to key :math:`j` iff :math:`j \le i`.

    Aligned at the top-left corner, exactly like ``is_causal=True`` in
    ``torch.nn.functional.scaled_dot_product_attention``.

    Shapes: returns ``(L, S)`` (``S`` defaults to ``L``), dtype ``bool``.

    Equivalent to ``torch.ones(L, S, dtype=torch.bool).tril()``.
    """
    L = check_positive_int(L, "L")
    S = L if S is None else check_positive_int(S, "S")
    rows = torch.arange(L, device=device).unsqueeze(-1)  # (L, 1)
    cols = torch.arange(S, device=device)  # (S,)
    return cols <= rows  # (L, S)


def padding_mask(lengths, max_len: int | None = None, *, device=None) -> Tensor:
    r"""Boolean padding mask: position :math:`j` of sequence :math:`b` is real iff :math:`j < \ell_b`.

    Shapes: returns ``(B, max_len)``, dtype ``bool``, True on real tokens. Use
    ``mask[:, None, None, :]`` to broadcast it over heads and queries of
    ``(B, H, L, S)`` scores.

    Parameters
    ----------
    lengths : Tensor or sequence of int, shape (B,)
        The true length of each sequence in the batch.
    max_len : int, optional
        The padded length; defaults to ``max(lengths)``.

    """
    if isinstance(lengths, Tensor):
        if lengths.is_floating_point() or lengths.dtype == torch.bool or lengths.dim() != 1:
            raise TypeError(f"lengths must be a 1-D integer tensor, got dtype {lengths.dtype} "
                            f"and shape {tuple(lengths.shape)}")
        lengths = lengths.to(device) if device is not None else lengths
    elif isinstance(lengths, Sequence) and all(isinstance(n, int) and not isinstance(n, bool)
                                               for n in lengths):
        lengths = torch.tensor(list(lengths), dtype=torch.long, device=device)
    else:
        raise TypeError("lengths must be a 1-D integer tensor or a sequence of ints")
    if lengths.numel() and int(lengths.min()) < 0:
        raise ValueError(f"lengths must be >= 0, got {lengths.tolist()}")
    longest = int(lengths.max()) if lengths.numel() else 0
    if max_len is None:
        max_len = longest
    elif isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < longest:
        raise ValueError(f"max_len must be an int >= max(lengths) = {longest}, got {max_len}")
    positions = torch.arange(max_len, device=lengths.device)  # (max_len,)
    return positions < lengths.unsqueeze(-1)  # (B, max_len)


def check_mask(mask, scores: Tensor, name: str = "mask") -> Tensor:
    """Check that ``mask`` is boolean and broadcasts to ``scores``; return it broadcast."""
    check_tensor(mask, name)
    if mask.dtype != torch.bool:
        raise TypeError(
            f"{name} must be a boolean tensor (True = may attend), got dtype {mask.dtype}; "
            "for an additive float mask, add it to the scores instead"
        )
    try:
        shape = torch.broadcast_shapes(mask.shape, scores.shape)
    except RuntimeError:
        shape = None
    if shape != scores.shape:
        raise ValueError(
            f"{name} of shape {tuple(mask.shape)} does not broadcast to the scores' "
            f"shape {tuple(scores.shape)}"
        )
    return mask.expand(scores.shape)


def masked_softmax(scores: Tensor, mask: Tensor | None, dim: int = -1) -> Tensor:
    r"""Softmax over the entries where ``mask`` is True; zeros elsewhere.

    .. math:: p_i = \frac{m_i\, e^{x_i}}{\sum_j m_j\, e^{x_j}}, \qquad
              p = 0 \ \text{if}\ \textstyle\sum_j m_j = 0

    Masked entries are set to ``-inf`` (representable in every float dtype,
    unlike ``-1e9`` in float16). A row with nothing left to attend to is
    replaced by zeros *before* the softmax and its output zeroed after, so
    neither the forward nor the backward pass ever sees ``-inf - (-inf)``:
    the weights are 0 and the gradient is 0, not ``nan``. Entries of
    ``scores`` that are already ``-inf`` count as masked.

    Shapes: the result has the shape and dtype of ``scores``.

    Parameters
    ----------
    scores : Tensor of shape (..., N)
    mask : bool Tensor broadcastable to ``scores``, or None
        True = may attend.
    dim : int
        The dimension to normalize.

    """
    check_float(scores, "scores")
    dim = check_dim(scores, dim)
    if mask is None:
        return torch.softmax(scores, dim=dim)
    keep = check_mask(mask, scores)
    filled = scores.masked_fill(~keep, float("-inf"))
    empty = torch.isneginf(filled).all(dim=dim, keepdim=True)  # rows with nothing to attend
    filled = filled.masked_fill(empty, 0.0)
    return torch.softmax(filled, dim=dim).masked_fill(empty, 0.0)


def mask_fill_value(dtype: torch.dtype) -> float:
    """The most negative finite value of ``dtype``: ``torch.finfo(dtype).min``.

    A finite fill avoids ``nan`` in a plain softmax of a fully masked row, but
    makes that row uniform over the masked keys instead of zero; and a fixed
    constant such as ``-1e9`` overflows to ``-inf`` in float16. Prefer
    :func:`masked_softmax`, which needs no fill value at all.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    return torch.finfo(dtype).min


def additive_mask(mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    r"""Convert a boolean mask (True = may attend) to an additive one: 0 or ``-inf``.

    Adding the result to scores before a softmax masks them; this is the
    float ``attn_mask`` form that torch also accepts.

    Shapes: same as ``mask``; dtype ``dtype``.
    """
    check_tensor(mask, "mask")
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a boolean tensor (True = may attend), got dtype {mask.dtype}")
    zeros = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return zeros.masked_fill(~mask, float("-inf"))
