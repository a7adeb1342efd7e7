r"""Score and mask modifications as functions: the FlexAttention idea, in plain torch.

Every attention variant of :mod:`softmaxbook.patterns` (and many more) is one
of two small functions of the indices (Dong et al., 2024):

* a ``score_mod(score, b, h, q_idx, kv_idx)`` returns a new score: add a bias
  (ALiBi), cap it (soft-capping), scale it;
* a ``mask_mod(b, h, q_idx, kv_idx)`` returns True where query ``q_idx`` of
  head ``h`` in sequence ``b`` may attend to key ``kv_idx``: causal, sliding
  window, documents, prefix.

:func:`flex_attention` runs attention with them, :func:`mask_from_mod`
materializes a mask, and :func:`block_mask_from_mod` says which tiles of the
score matrix a blockwise kernel must compute at all (block sparsity). PyTorch's
``torch.nn.attention.flex_attention`` takes the same functions and compiles
them into a fused kernel; the functions here are its readable reference: they
materialize the ``(B, H, L, S)`` scores, so their memory is quadratic in the
length, and they support autograd on every device.

The functions are called **once, on whole tensors**: ``b`` is ``(B, 1, 1, 1)``,
``h`` is ``(1, H, 1, 1)``, ``q_idx`` is ``(1, 1, L, 1)`` and ``kv_idx`` is
``(1, 1, 1, S)`` (``torch.long``), and broadcasting does the rest. A mod
written with elementwise torch operations (``q_idx >= kv_idx``,
``doc[q_idx] == doc[kv_idx]``, ``torch.where``), which is what torch's
version requires too, works with both.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from .._validate import check_positive_int
from ..masking import masked_softmax
from ..normalizers import sink_softmax
from ._args import resolve_attention

__all__ = ["mask_from_mod", "block_mask_from_mod", "BlockSparsity", "flex_attention"]

#: Where index tensors are created: a device, its name, or None (the default).
Device = torch.device | str | None


def _sizes(B: int, H: int, L: int, S: int) -> tuple[int, int, int, int]:
    return (
        check_positive_int(B, "B"),
        check_positive_int(H, "H"),
        check_positive_int(L, "L"),
        check_positive_int(S, "S"),
    )


def _indices(
    B: int, H: int, L: int, S: int, device: Device
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The four index tensors, shaped to broadcast to ``(B, H, L, S)``."""
    b = torch.arange(B, device=device).view(B, 1, 1, 1)
    h = torch.arange(H, device=device).view(1, H, 1, 1)
    q_idx = torch.arange(L, device=device).view(1, 1, L, 1)
    kv_idx = torch.arange(S, device=device).view(1, 1, 1, S)
    return b, h, q_idx, kv_idx


def _call_mask_mod(
    mask_mod: object, indices: tuple[Tensor, ...], shape: tuple[int, ...]
) -> Tensor:
    if not callable(mask_mod):
        raise TypeError(f"mask_mod must be callable, got {type(mask_mod).__name__}")
    keep = mask_mod(*indices)
    if not isinstance(keep, Tensor) or keep.dtype != torch.bool:
        got = keep.dtype if isinstance(keep, Tensor) else type(keep).__name__
        raise TypeError(
            "mask_mod(b, h, q_idx, kv_idx) must return a boolean tensor "
            f"(True = may attend), got {got}"
        )
    try:
        return torch.broadcast_to(keep, shape)
    except RuntimeError:
        raise ValueError(
            f"mask_mod returned shape {tuple(keep.shape)}, which does not broadcast "
            f"to (B, H, L, S) = {tuple(shape)}"
        ) from None


def mask_from_mod(
    mask_mod: Callable[..., Tensor],
    B: int,
    H: int,
    L: int,
    S: int,
    *,
    device: Device = None,
) -> Tensor:
    r"""Materialize a ``mask_mod`` as a boolean mask :math:`m_{bhij} =
    \mathrm{mask\_mod}(b, h, i, j)`.

    The counterpart of ``torch.nn.attention.flex_attention.create_mask``:
    the result is the ``mask`` argument of
    :func:`~softmaxbook.scaled_dot_product_attention` (True = may attend).
    The indices are broadcasting ``torch.long`` tensors (see the module
    docstring); the mod is called once.

    Shapes: returns ``(B, H, L, S)``, dtype ``bool``, a new tensor.

    Parameters
    ----------
    mask_mod : callable
        ``mask_mod(b, h, q_idx, kv_idx)`` returning a boolean tensor that
        broadcasts to ``(B, H, L, S)``.
    B, H, L, S : int
        Batch size, heads, queries and keys, each ``>= 1``.
    device : torch.device or str, optional
        Where the indices (and so the mask) are created.

    Returns
    -------
    Tensor
        ``(B, H, L, S)`` boolean.

    Raises
    ------
    TypeError
        If ``mask_mod`` is not callable or does not return a boolean tensor,
        or a size is not an int.
    ValueError
        If a size is smaller than 1 or the result does not broadcast.
    """
    B, H, L, S = _sizes(B, H, L, S)
    indices = _indices(B, H, L, S, device)
    return _call_mask_mod(mask_mod, indices, (B, H, L, S)).clone()


class BlockSparsity(NamedTuple):
    r"""Which ``(block_q, block_k)`` tiles of the scores a blockwise kernel visits.

    ``computed[b, h, r, c]`` is True when tile ``(r, c)`` holds at least one
    allowed query-key pair: it must be computed. ``full`` is True when every
    pair of the tile is allowed: the kernel can skip evaluating the mask
    there. The rest are skipped entirely. These are the two block maps of a
    ``torch.nn.attention.flex_attention.BlockMask`` (its partial plus full
    blocks, and its full blocks), as dense booleans.
    """

    #: True where a tile must be computed, shape
    #: ``(B, H, ceil(L / block_q), ceil(S / block_k))``.
    computed: Tensor
    #: True where every pair of a tile may attend (no mask needed), same shape.
    full: Tensor
    #: The tile size ``(block_q, block_k)``.
    block_size: tuple[int, int]

    def fraction_skipped(self) -> float:
        """The fraction of tiles that are never computed, in ``[0, 1]``."""
        return 1.0 - float(self.computed.double().mean())


def block_mask_from_mod(
    mask_mod: Callable[..., Tensor],
    B: int,
    H: int,
    L: int,
    S: int,
    *,
    block_size: int | tuple[int, int] = 128,
    device: Device = None,
) -> BlockSparsity:
    r"""The block sparsity of a ``mask_mod``: which score tiles need any work.

    Cut the ``(L, S)`` score matrix of every batch entry and head into tiles
    of ``block_q x block_k``; a tile is *computed* when it contains an
    allowed pair and *full* when all its pairs are allowed. A causal mask
    skips about half the tiles, a sliding window of :math:`w` keys all but
    about :math:`(w / \text{block} + 1)` per row of tiles, and packed
    documents all the tiles across documents: this is where blockwise
    kernels such as FlashAttention and FlexAttention save their work.
    The last row and column of tiles may be partial: their positions past
    ``L`` or ``S`` count as neither allowed nor forbidden.

    This reference materializes the ``(B, H, L, S)`` mask first (as
    ``torch``'s ``create_block_mask`` does unless compiled), so it is for
    understanding and testing, not for long sequences.

    Shapes: returns a :class:`BlockSparsity` with ``(B, H, ceil(L / block_q),
    ceil(S / block_k))`` block maps.

    Parameters
    ----------
    mask_mod : callable
        ``mask_mod(b, h, q_idx, kv_idx)`` returning a boolean tensor.
    B, H, L, S : int
        Batch size, heads, queries and keys, each ``>= 1``.
    block_size : int or (int, int)
        Tile size ``(block_q, block_k)``; one int sets both.
    device : torch.device or str, optional
        Where to evaluate the mask.

    Returns
    -------
    BlockSparsity
        The two block maps and the tile size.

    Raises
    ------
    TypeError
        As :func:`mask_from_mod`, or if ``block_size`` is not an int or a
        pair of ints.
    ValueError
        As :func:`mask_from_mod`, or if a block size is smaller than 1.
    """
    if isinstance(block_size, tuple) and len(block_size) == 2:
        bq = check_positive_int(block_size[0], "block_size[0]")
        bk = check_positive_int(block_size[1], "block_size[1]")
    elif isinstance(block_size, tuple):
        raise TypeError(f"block_size must be an int or a pair, got {block_size!r}")
    else:
        bq = bk = check_positive_int(block_size, "block_size")
    keep = mask_from_mod(mask_mod, B, H, L, S, device=device)  # (B, H, L, S)
    nq, nk = math.ceil(L / bq), math.ceil(S / bk)
    pad = (0, nk * bk - S, 0, nq * bq - L)  # (S: left, right, L: top, bottom)

    def tiles(fill: bool) -> Tensor:  # (B, H, nq, bq, nk, bk)
        padded = torch.nn.functional.pad(keep, pad, value=fill)
        return padded.view(B, H, nq, bq, nk, bk)

    computed = tiles(False).any(dim=5).any(dim=3)  # (B, H, nq, nk)
    full = tiles(True).all(dim=5).all(dim=3)
    return BlockSparsity(computed, full, (bq, bk))


def flex_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    score_mod: Callable[..., Tensor] | None = None,
    mask_mod: Callable[..., Tensor] | None = None,
    scale: float | None = None,
    mask: Tensor | None = None,
    is_causal: bool | str = False,
    sinks: Tensor | None = None,
    enable_gqa: bool = False,
    dropout_p: float = 0.0,
) -> Tensor:
    r"""Attention with a score modification and a mask given as functions:
    :math:`\mathrm{softmax}_{j : m_{bhij}}\bigl(f(s_{bhij}, b, h, i, j)\bigr)\, V`.

    The scores :math:`s = QK^\top \cdot \text{scale}` go through
    ``score_mod`` first, then the mask is applied: a float ``mask`` is added,
    and the entries where ``mask_mod``, a boolean ``mask`` or the causal mask
    is False are removed; then a softmax over the rest weights the values.
    The mask comes *after* the score modification, so a ``score_mod`` can
    never bring a masked key back (a soft cap of :math:`-\infty` would be
    finite). Rows with nothing to attend give zeros, forward and backward, as
    in :func:`~softmaxbook.masked_softmax`.

    This is the semantics of ``torch.nn.attention.flex_attention.flex_attention``
    (Dong et al., 2024), computed on the materialized ``(B, H, L, S)``
    scores: memory is quadratic in the length, any device works, and
    autograd differentiates through the mods (torch's version runs on a CPU
    only without gradients, and fuses everything when compiled). The masks,
    ``is_causal``, ``sinks`` and ``enable_gqa`` are those of
    :func:`~softmaxbook.scaled_dot_product_attention`, so that every
    attention function takes the same arguments; dropout is not supported.

    Shapes: ``q`` is ``(B, H, L, D)``, ``k`` is ``(B, H, S, D)``, ``v`` is
    ``(B, H, S, Dv)`` (with ``enable_gqa``, ``k`` and ``v`` may have
    ``Hkv`` heads, a divisor of ``H``); ``mask`` broadcasts to
    ``(B, H, L, S)``; the result is ``(B, H, L, Dv)``, in the dtype of ``q``.

    Equivalent to ``scaled_dot_product_attention`` on
    ``score_mod(q @ k.mT * scale, b, h, i, j)`` with
    ``mask=mask_from_mod(mask_mod, B, H, L, S)``:

    >>> import torch
    >>> import softmaxbook as sb
    >>> q, k, v = torch.randn(3, 2, 4, 6, 8).unbind(0)  # (B, H, L, D) each
    >>> def causal(b, h, q_idx, kv_idx):
    ...     return kv_idx <= q_idx
    >>> out = sb.flex_attention(q, k, v, mask_mod=causal)
    >>> torch.allclose(out, sb.scaled_dot_product_attention(q, k, v, is_causal=True))
    True

    Parameters
    ----------
    q, k, v : Tensor
        Queries, keys and values, one floating dtype, four dimensions.
    score_mod : callable, optional
        ``score_mod(score, b, h, q_idx, kv_idx)`` returning new scores that
        broadcast to ``(B, H, L, S)``; the identity by default.
    mask_mod : callable, optional
        ``mask_mod(b, h, q_idx, kv_idx)`` returning a boolean tensor; every
        pair may attend by default.
    scale : float, optional
        Multiplies :math:`QK^\top`; defaults to :math:`1/\sqrt{D}`.
    mask, is_causal, sinks, enable_gqa :
        As in :func:`~softmaxbook.scaled_dot_product_attention` (a boolean or
        float mask, ``True``/``"top_left"``/``"bottom_right"``, one sink
        logit per head, grouped-query heads).
    dropout_p : float
        Must be 0: dropout is not supported here.

    Returns
    -------
    Tensor
        ``(B, H, L, Dv)``.

    Raises
    ------
    TypeError
        If an input is not a floating tensor, the dtypes differ, a mod is not
        callable, or a mod returns the wrong kind of tensor.
    ValueError
        If the inputs are not 4-D with matching ``B``, ``H``, ``S`` and ``D``,
        ``scale <= 0``, a mod's result does not broadcast, ``dropout_p`` is
        not 0, or as :func:`~softmaxbook.scaled_dot_product_attention`.

    Examples
    --------
    >>> import torch, softmaxbook as sb
    >>> q, k, v = torch.randn(3, 1, 2, 4, 8).unbind(0)
    >>> causal = lambda b, h, q_idx, kv_idx: q_idx >= kv_idx
    >>> torch.allclose(
    ...     sb.flex_attention(q, k, v, mask_mod=causal),
    ...     sb.scaled_dot_product_attention(q, k, v, is_causal=True),
    ...     atol=1e-6,
    ... )
    True
    """
    args = resolve_attention(
        q, k, v, mask=mask, is_causal=is_causal, scale=scale, sinks=sinks,
        enable_gqa=enable_gqa, dropout_p=dropout_p, caller="flex_attention",
        unsupported=("dropout_p",),
    )  # fmt: skip
    G = args.groups
    if not (q.dim() == k.dim() == v.dim() == 4):
        raise ValueError(
            "flex_attention needs 4-D q, k, v of shape (B, H, length, dim), got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if not (q.shape[0] == k.shape[0] == v.shape[0]) or not (
        q.shape[1] == k.shape[1] * G == v.shape[1] * G
    ):
        raise ValueError(
            "q, k and v must share B and H (dimensions 0 and 1), got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if G > 1:  # each key and value head serves G query heads
        k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    B, H, L, _ = q.shape
    S = k.shape[-2]
    scores = (q @ k.transpose(-2, -1)) * args.scale  # (B, H, L, S)
    if L == 0 or S == 0:
        return torch.zeros(B, H, L, v.shape[-1], dtype=q.dtype, device=q.device)
    indices = _indices(B, H, L, S, q.device)
    if score_mod is not None:
        scores = _call_score_mod(score_mod, scores, indices)
    scores = args.masked_scores(scores)  # after the score_mod: it cannot undo them
    keep = None
    if mask_mod is not None:
        keep = _call_mask_mod(mask_mod, indices, scores.shape)
    if args.sinks is not None:
        if keep is not None:
            scores = scores.masked_fill(~keep, float("-inf"))
        return sink_softmax(scores, args.sinks[..., None, None], dim=-1) @ v
    return masked_softmax(scores, keep) @ v  # (B, H, L, Dv)


def _call_score_mod(
    score_mod: object, scores: Tensor, indices: tuple[Tensor, ...]
) -> Tensor:
    if not callable(score_mod):
        raise TypeError(f"score_mod must be callable, got {type(score_mod).__name__}")
    new = score_mod(scores, *indices)
    if not isinstance(new, Tensor) or not new.is_floating_point():
        got = new.dtype if isinstance(new, Tensor) else type(new).__name__
        raise TypeError(
            "score_mod(score, b, h, q_idx, kv_idx) must return a floating-point "
            f"tensor, got {got}"
        )
    try:
        return torch.broadcast_to(new, scores.shape).to(scores.dtype)
    except RuntimeError:
        raise ValueError(
            f"score_mod returned shape {tuple(new.shape)}, which does not broadcast "
            f"to the scores' shape {tuple(scores.shape)}"
        ) from None
