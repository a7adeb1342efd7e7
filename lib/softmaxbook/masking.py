r"""Masks for attention, and a softmax that respects them.

Convention (the one of ``torch.nn.functional.scaled_dot_product_attention``):
a boolean mask is **True where a query may attend** to a key. A row with
nothing to attend (every key masked) gets all-zero weights, never ``nan``, in
the forward and in the backward pass.

Beware: ``torch.nn.MultiheadAttention``'s ``key_padding_mask`` and
``attn_mask`` use the *opposite* convention for boolean masks (True = ignore).
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral

import torch
from torch import Tensor

from ._validate import (
    check_dim,
    check_float,
    check_mask,
    check_positive_int,
    check_tensor,
    zero_empty_rows,
)

__all__ = [
    "causal_mask",
    "padding_mask",
    "masked_softmax",
    "additive_mask",
    "mask_fill_value",
]


def causal_mask(
    L: int, S: int | None = None, *, device: torch.device | str | None = None
) -> Tensor:
    r"""Boolean causal mask: query :math:`i` may attend to key :math:`j` iff
    :math:`j \le i`.

    Aligned at the top-left corner, exactly like ``is_causal=True`` in
    ``torch.nn.functional.scaled_dot_product_attention``: with ``L < S`` the
    last query still sees only the first ``L`` keys, and with ``L > S`` the
    queries past ``S`` see every key. (A query block appended to a cache of
    past keys needs the bottom-right alignment instead: shift by ``S - L``.)
    Every row keeps at least key 0, so a causal mask alone never empties a row.

    Shapes: returns ``(L, S)`` (``S`` defaults to ``L``), dtype ``bool``.

    Equivalent to ``torch.ones(L, S, dtype=torch.bool).tril()``:

    >>> import torch
    >>> import softmaxbook as sb
    >>> torch.equal(sb.causal_mask(3, 5), torch.ones(3, 5, dtype=torch.bool).tril())
    True

    Parameters
    ----------
    L : int
        Number of queries, :math:`\ge 1`.
    S : int, optional
        Number of keys, :math:`\ge 1`; defaults to ``L``.
    device : torch.device or str, optional
        Where to create the mask.

    Returns
    -------
    Tensor
        ``(L, S)`` boolean, True = may attend.

    Raises
    ------
    TypeError
        If ``L`` or ``S`` is not an int.
    ValueError
        If ``L`` or ``S`` is smaller than 1.
    """
    L = check_positive_int(L, "L")
    S = L if S is None else check_positive_int(S, "S")
    rows = torch.arange(L, device=device).unsqueeze(-1)  # (L, 1)
    cols = torch.arange(S, device=device)  # (S,)
    return cols <= rows  # (L, S)


def padding_mask(
    lengths: Tensor | Sequence[int],
    max_len: int | None = None,
    *,
    device: torch.device | str | None = None,
) -> Tensor:
    r"""Boolean padding mask: position :math:`j` of sequence :math:`b` is real iff
    :math:`j < \ell_b`.

    Padding is assumed at the end of each sequence (right padding).

    Shapes: ``lengths`` is ``(B,)``; returns ``(B, max_len)``, dtype ``bool``,
    True on real tokens. Use ``mask[:, None, None, :]`` to broadcast it over
    the heads and queries of ``(B, H, L, S)`` scores.

    Equivalent to ``torch.arange(max_len) < lengths[:, None]``:

    >>> import torch
    >>> import softmaxbook as sb
    >>> lengths = torch.tensor([2, 4])
    >>> torch.equal(sb.padding_mask(lengths, 5), torch.arange(5) < lengths[:, None])
    True

    Parameters
    ----------
    lengths : Tensor or sequence of int
        The true length of each sequence in the batch, shape ``(B,)``.
    max_len : int, optional
        The padded length; defaults to ``max(lengths)``.
    device : torch.device or str, optional
        Where to create the mask; defaults to the device of ``lengths``.

    Returns
    -------
    Tensor
        ``(B, max_len)`` boolean, True = a real token (may be attended).

    Raises
    ------
    TypeError
        If ``lengths`` is not a 1-D integer tensor or a sequence of ints, or
        ``max_len`` is not an int.
    ValueError
        If a length is negative or ``max_len < max(lengths)``.
    """
    if isinstance(lengths, Tensor):
        if (
            lengths.is_floating_point()
            or lengths.is_complex()
            or lengths.dtype == torch.bool
            or lengths.dim() != 1
        ):
            raise TypeError(
                f"lengths must be a 1-D integer tensor, got dtype {lengths.dtype} "
                f"and shape {tuple(lengths.shape)}"
            )
        lengths = lengths.to(device) if device is not None else lengths
    elif isinstance(lengths, Sequence) and all(
        isinstance(n, Integral) and not isinstance(n, bool) for n in lengths
    ):
        lengths = torch.tensor(
            [int(n) for n in lengths], dtype=torch.long, device=device
        )
    else:
        raise TypeError(
            "lengths must be a 1-D integer tensor or a sequence of ints, "
            f"got {type(lengths).__name__}"
        )
    if lengths.numel() and int(lengths.min()) < 0:
        raise ValueError(f"lengths must be >= 0, got {lengths.tolist()}")
    longest = int(lengths.max()) if lengths.numel() else 0
    if max_len is None:
        max_len = longest
    elif isinstance(max_len, bool) or not isinstance(max_len, Integral):
        raise TypeError(f"max_len must be an int, got {type(max_len).__name__}")
    elif max_len < longest:
        raise ValueError(f"max_len must be >= max(lengths) = {longest}, got {max_len}")
    positions = torch.arange(int(max_len), device=lengths.device)  # (max_len,)
    return positions < lengths.unsqueeze(-1)  # (B, max_len)


def masked_softmax(scores: Tensor, mask: Tensor | None, dim: int = -1) -> Tensor:
    r"""Softmax over the entries where ``mask`` is True; zeros elsewhere.

    .. math:: p_i = \frac{m_i\, e^{x_i}}{\sum_j m_j\, e^{x_j}}, \qquad
              p = 0 \ \text{if}\ \textstyle\sum_j m_j = 0

    Masked entries are set to ``-inf`` (representable in float16, bfloat16,
    float32 and float64, the dtypes torch computes a softmax in, unlike
    ``-1e9`` in float16), so no fill value has to be chosen. A row with
    nothing left to attend to is replaced by zeros *before* the softmax and
    its output zeroed *after*, so neither the forward nor the backward pass
    ever computes ``-inf - (-inf)``: the weights are 0 and the gradient is 0,
    not ``nan``. Entries of ``scores`` that are already ``-inf`` count as
    masked (also with ``mask=None``), and the values at masked positions,
    ``nan`` included, never reach the result. A ``nan`` at an unmasked
    position makes its row ``nan``.

    Shapes: ``scores`` is ``(..., N)`` (normalized along ``dim``), ``mask``
    broadcasts to it; the result has the shape and dtype of ``scores``.

    Equivalent to ``torch.softmax(scores.masked_fill(~mask, -inf), dim)``
    except that fully masked rows give zeros instead of ``nan``:

    >>> import torch
    >>> import softmaxbook as sb
    >>> scores = torch.randn(3, 4)
    >>> mask = torch.tensor([[1, 1, 0, 1], [1, 0, 0, 0], [0, 0, 0, 0]]).bool()
    >>> p = sb.masked_softmax(scores, mask)
    >>> naive = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)
    >>> torch.allclose(p[:2], naive[:2]), naive[2].isnan().all().item(), p[2].tolist()
    (True, True, [0.0, 0.0, 0.0, 0.0])

    Parameters
    ----------
    scores : Tensor
        Floating-point scores (logits), any dtype and device.
    mask : Tensor or None
        Boolean, broadcastable to ``scores``; True = may attend (keep).
        ``None`` keeps every entry that is not ``-inf``.
    dim : int
        The dimension to normalize; negative values count from the end.

    Returns
    -------
    Tensor
        Weights that sum to 1 along ``dim`` in every row with at least one
        kept entry, and are 0 in rows with none.

    Raises
    ------
    TypeError
        If ``scores`` is not floating point or ``mask`` is not boolean.
    ValueError
        If ``mask`` does not broadcast to ``scores``.
    IndexError
        If ``dim`` is out of range.
    """
    check_float(scores, "scores")
    dim = check_dim(scores, dim)
    if mask is not None:
        keep = check_mask(mask, scores)
        scores = scores.masked_fill(~keep, float("-inf"))
    # A row with nothing left to attend gives zeros, never nan (in _validate: the same
    # guard serves attention's other normalizers and the custom-backward softmax).
    return zero_empty_rows(lambda s: torch.softmax(s, dim=dim), scores, dim)


def mask_fill_value(dtype: torch.dtype) -> float:
    r"""The most negative finite value of ``dtype``: :math:`-\max_{\text{finite}}`.

    A finite fill avoids ``nan`` in a plain softmax of a fully masked row, but
    makes that row uniform over the masked keys instead of zero; and a fixed
    constant such as ``-1e9`` overflows to ``-inf`` in float16. Prefer
    :func:`~softmaxbook.masking.masked_softmax`, which needs no fill value at all.

    Equivalent to ``torch.finfo(dtype).min``:

    >>> import torch
    >>> import softmaxbook as sb
    >>> sb.mask_fill_value(torch.float16), torch.finfo(torch.float16).min
    (-65504.0, -65504.0)

    Parameters
    ----------
    dtype : torch.dtype
        A floating-point dtype.

    Returns
    -------
    float
        For example ``-65504.0`` for ``torch.float16``.

    Raises
    ------
    TypeError
        If ``dtype`` is not a floating-point ``torch.dtype``.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    return torch.finfo(dtype).min


def additive_mask(mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    r"""Convert a boolean mask (True = may attend) to an additive one: :math:`0` or
    :math:`-\infty`.

    Adding the result to the scores before a softmax masks them; this is the
    float ``attn_mask`` form that torch and
    :func:`~softmaxbook.scaled_dot_product_attention` also accept. A row
    that is all ``-inf`` gives ``nan`` in ``torch.softmax`` (and
    :func:`~softmaxbook.softmax`); :func:`~softmaxbook.masking.masked_softmax`
    and the library's attention give it zeros.

    Shapes: same as ``mask``; dtype ``dtype``, device of ``mask``.

    Equivalent to ``torch.zeros(mask.shape).masked_fill(~mask, -inf)``:

    >>> import torch
    >>> import softmaxbook as sb
    >>> sb.additive_mask(sb.causal_mask(2))
    tensor([[0., -inf],
            [0., 0.]])

    Parameters
    ----------
    mask : Tensor
        Boolean, True = may attend.
    dtype : torch.dtype
        A floating-point dtype for the result.

    Returns
    -------
    Tensor
        0 where ``mask`` is True, ``-inf`` where it is False.

    Raises
    ------
    TypeError
        If ``mask`` is not boolean or ``dtype`` is not floating point.
    """
    check_tensor(mask, "mask")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"mask must be a boolean tensor (True = may attend), got dtype {mask.dtype}"
        )
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    zeros = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return zeros.masked_fill(~mask, float("-inf"))
