r"""Attention patterns as they are used now: documents, windows, prefixes, ALiBi.

The masks of :mod:`softmaxbook.masking` say *causal* and *padding*. Current
models combine a few more patterns, all built here from position indices:

* :func:`document_mask`: several documents packed into one row (or a
  variable-length batch) must not attend across document boundaries;
  :func:`document_ids` builds the ids from the documents' lengths.
  :func:`document_positions` restarts the position ids at every document.
* :func:`sliding_window_mask`: each query sees only its ``window`` most
  recent keys, itself included (local attention), or, two-sided, the keys
  less than ``window`` positions away on either side.
* :func:`chunked_mask`: the row is cut into chunks of ``chunk`` positions
  and each query sees only the keys of its own chunk (Llama 4's chunked
  attention).
* :func:`prefix_lm_mask`: a prefix that attends bidirectionally, followed
  by causal attention.
* :func:`alibi_slopes` and :func:`alibi_bias`: ALiBi's additive distance
  penalty, one slope per head.

The masks follow the library's convention (boolean, **True = may attend**)
and combine with ``&``; a row that a combination empties gets zeros from
:func:`~softmaxbook.masked_softmax`. The same patterns written as functions of
the indices (``mask_mod``) are the subject of :mod:`softmaxbook.attention.flex`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Integral

import torch
from torch import Tensor

from ._validate import check_float, check_positive_int, check_tensor
from .masking import causal_mask

__all__ = [
    "document_ids",
    "document_mask",
    "document_positions",
    "sliding_window_mask",
    "chunked_mask",
    "prefix_lm_mask",
    "alibi_slopes",
    "alibi_bias",
]


def _int_vector(
    values: object, name: str, device: torch.device | str | None = None
) -> Tensor:
    """``values`` as a 1-D ``torch.long`` tensor; a ``TypeError`` for anything else."""
    if isinstance(values, Tensor):
        if (
            values.is_floating_point()
            or values.is_complex()
            or values.dtype == torch.bool
            or values.dim() != 1
        ):
            raise TypeError(
                f"{name} must be a 1-D integer tensor, got dtype {values.dtype} "
                f"and shape {tuple(values.shape)}"
            )
        return values.to(device=device, dtype=torch.long)
    if isinstance(values, Sequence) and all(
        isinstance(n, Integral) and not isinstance(n, bool) for n in values
    ):
        return torch.tensor([int(n) for n in values], dtype=torch.long, device=device)
    raise TypeError(
        f"{name} must be a 1-D integer tensor or a sequence of ints, "
        f"got {type(values).__name__}"
    )


def _check_ids(ids: Tensor, name: str) -> Tensor:
    check_tensor(ids, name)
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got dtype {ids.dtype}")
    if ids.dim() == 0:
        raise ValueError(f"{name} must have at least one dimension (..., L)")
    return ids


def document_ids(
    lengths: Tensor | Sequence[int],
    total: int | None = None,
    *,
    device: torch.device | str | None = None,
) -> Tensor:
    r"""The document id of every position of a packed row: ``[0]*n_0 + [1]*n_1 + ...``.

    Positions after the last document (padding up to ``total``) get the id
    ``-1``, which :func:`document_mask` treats as padding.

    Shapes: ``lengths`` is ``(N,)`` (one length per document); returns
    ``(total,)`` with dtype ``torch.long``. For a batch of packed rows, stack
    one result per row.

    Equivalent to ``torch.repeat_interleave(torch.arange(N), lengths)``,
    padded with ``-1``:

    >>> import torch
    >>> import softmaxbook as sb
    >>> sb.document_ids([2, 1, 3], total=8)
    tensor([ 0,  0,  1,  2,  2,  2, -1, -1])
    >>> torch.repeat_interleave(torch.arange(3), torch.tensor([2, 1, 3]))
    tensor([0, 0, 1, 2, 2, 2])

    Parameters
    ----------
    lengths : Tensor or sequence of int
        The length of each document, in order, each ``>= 0``.
    total : int, optional
        The length of the row; defaults to ``sum(lengths)``.
    device : torch.device or str, optional
        Where to create the ids.

    Returns
    -------
    Tensor
        ``(total,)``: ``ids[j]`` is the document of position ``j``, or ``-1``.

    Raises
    ------
    TypeError
        If ``lengths`` is not a 1-D integer tensor or sequence of ints, or
        ``total`` is not an int.
    ValueError
        If a length is negative or ``total < sum(lengths)``.
    """
    lengths = _int_vector(lengths, "lengths", device)
    if lengths.numel() and int(lengths.min()) < 0:
        raise ValueError(f"lengths must be >= 0, got {lengths.tolist()}")
    used = int(lengths.sum())
    if total is None:
        total = used
    elif isinstance(total, bool) or not isinstance(total, Integral):
        raise TypeError(f"total must be an int, got {type(total).__name__}")
    elif total < used:
        raise ValueError(f"total must be >= sum(lengths) = {used}, got {total}")
    docs = torch.arange(lengths.numel(), device=lengths.device)
    ids = torch.repeat_interleave(docs, lengths)  # (used,)
    padding = torch.full((int(total) - used,), -1, dtype=torch.long, device=ids.device)
    return torch.cat([ids, padding])


def document_mask(
    q_ids: Tensor, kv_ids: Tensor | None = None, *, causal: bool = False
) -> Tensor:
    r"""Block-diagonal mask of packed documents: query :math:`i` may attend to key
    :math:`j` iff :math:`d_i = d_j \ge 0` (and :math:`j \le i` if ``causal``).

    ``q_ids`` holds the document of every query position, ``kv_ids`` that of
    every key position (the same ids by default, for self-attention). A
    negative id marks padding: a padding key is never attended and a padding
    query attends to nothing, so its row is empty and
    :func:`~softmaxbook.masked_softmax` gives it zeros. A variable-length
    batch is the special case of one document per row, padded with ``-1``.

    With ``causal=True`` the causal mask is combined in (top-left aligned, as
    :func:`~softmaxbook.causal_mask`): packed causal language modelling.

    Shapes: ``q_ids`` is ``(..., L)``, ``kv_ids`` is ``(..., S)`` with batch
    dimensions that broadcast; returns ``(..., L, S)``, dtype ``bool``. Add a
    head dimension with ``mask[:, None]`` for ``(B, H, L, S)`` scores.

    Equivalent to ``(q_ids[..., :, None] == kv_ids[..., None, :]) &
    (q_ids[..., :, None] >= 0)``:

    >>> import torch
    >>> import softmaxbook as sb
    >>> ids = sb.document_ids([2, 1], total=4)  # tensor([ 0,  0,  1, -1])
    >>> mask = sb.document_mask(ids)
    >>> torch.equal(mask, (ids[:, None] == ids[None, :]) & (ids[:, None] >= 0))
    True
    >>> mask.int()
    tensor([[1, 1, 0, 0],
            [1, 1, 0, 0],
            [0, 0, 1, 0],
            [0, 0, 0, 0]], dtype=torch.int32)

    Parameters
    ----------
    q_ids : Tensor
        Integer document ids of the queries.
    kv_ids : Tensor, optional
        Integer document ids of the keys; defaults to ``q_ids``.
    causal : bool
        Also forbid keys after the query.

    Returns
    -------
    Tensor
        ``(..., L, S)`` boolean, True = may attend.

    Raises
    ------
    TypeError
        If an id tensor is not an integer tensor, or ``causal`` not a bool.
    ValueError
        If an id tensor is 0-dimensional, or the batch dimensions do not
        broadcast.
    """
    _check_ids(q_ids, "q_ids")
    kv_ids = q_ids if kv_ids is None else _check_ids(kv_ids, "kv_ids")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    try:
        torch.broadcast_shapes(q_ids.shape[:-1], kv_ids.shape[:-1])
    except RuntimeError:
        raise ValueError(
            f"the batch dimensions of q_ids {tuple(q_ids.shape)} and kv_ids "
            f"{tuple(kv_ids.shape)} do not broadcast"
        ) from None
    q = q_ids.unsqueeze(-1)  # (..., L, 1)
    same = (q == kv_ids.unsqueeze(-2)) & (q >= 0)  # (..., L, S)
    if causal:
        L, S = q_ids.shape[-1], kv_ids.shape[-1]
        if L and S:
            same = same & causal_mask(L, S, device=q_ids.device)
    return same


def document_positions(ids: Tensor) -> Tensor:
    r"""Position ids that restart at 0 at every document of a packed row.

    A document is a maximal run of equal ids (as :func:`document_ids` writes
    them); position :math:`j` gets :math:`j - s(j)`, with :math:`s(j)` the
    first position of its run. These are the position ids of sequence
    packing: each document is numbered as if it stood alone, and Hugging Face
    ``transformers`` reads the document boundaries back from the restarts
    (where the position ids equal their minimum) for FlashAttention's
    variable-length kernel. A run of padding (``-1``) is numbered like a document.

    Shapes: ``ids`` is ``(..., L)``; returns ``(..., L)``, dtype
    ``torch.long``, on the device of ``ids``.

    Equivalent to concatenating ``arange(n)`` over the documents' lengths:

    >>> import torch
    >>> import softmaxbook as sb
    >>> ids = sb.document_ids([3, 2, 4])
    >>> sb.document_positions(ids)
    tensor([0, 1, 2, 0, 1, 0, 1, 2, 3])
    >>> torch.cat([torch.arange(n) for n in (3, 2, 4)])
    tensor([0, 1, 2, 0, 1, 0, 1, 2, 3])

    Parameters
    ----------
    ids : Tensor
        Integer document ids, ``(..., L)``.

    Returns
    -------
    Tensor
        ``(..., L)``: the position of every token inside its document.

    Raises
    ------
    TypeError
        If ``ids`` is not an integer tensor.
    ValueError
        If ``ids`` is 0-dimensional.
    """
    _check_ids(ids, "ids")
    L = ids.shape[-1]
    j = torch.arange(L, device=ids.device).expand(ids.shape)  # (..., L)
    if L == 0:
        return j.clone()
    starts = torch.ones_like(ids, dtype=torch.bool)  # position 0 opens a run
    starts[..., 1:] = ids[..., 1:] != ids[..., :-1]
    # The start of each position's run: the last start at or before it.
    first = torch.where(starts, j, torch.zeros_like(j)).cummax(dim=-1).values
    return j - first


def sliding_window_mask(
    L: int,
    S: int | None = None,
    *,
    window: int,
    causal: bool = True,
    device: torch.device | str | None = None,
) -> Tensor:
    r"""Local attention: query :math:`i` sees the keys :math:`i - w < j \le i`
    (causal: at most ``window`` keys), or :math:`|i - j| < w` (two-sided: at
    most ``2 * window - 1`` keys, ``window - 1`` on each side and itself).

    ``window`` is the causal window's size, counting the query itself, the
    convention of Hugging Face ``transformers`` (its ``sliding_window``
    overlay keeps ``kv_idx > q_idx - sliding_window``); FlashAttention's
    ``window_size=(left, right)`` counts the keys on each side *besides*
    the query, so a causal window ``w`` there is ``(w - 1, 0)`` and a
    two-sided one ``(w - 1, w - 1)`` (when ``L == S``: flash-attn aligns its
    window at the bottom-right, shifted by ``S - L``). Positions here are
    aligned at the top-left, like :func:`~softmaxbook.causal_mask`, so the
    causal mask's largest distance from a query to a key is ``L - 1``
    (query ``L - 1``, key 0): the causal window is the causal mask exactly
    when ``window >= L``, whatever ``S`` is, and the two-sided window
    allows every pair exactly when ``window >= max(L, S)``.

    Shapes: returns ``(L, S)`` (``S`` defaults to ``L``), dtype ``bool``.

    Equivalent to ``(j <= i) & (j > i - window)`` for ``i = arange(L)[:,
    None]``, ``j = arange(S)``:

    >>> import torch
    >>> import softmaxbook as sb
    >>> i, j = torch.arange(5)[:, None], torch.arange(5)
    >>> mask = sb.sliding_window_mask(5, window=2)
    >>> torch.equal(mask, (j <= i) & (j > i - 2))
    True
    >>> mask.sum(-1)  # the first query has only itself to see
    tensor([1, 2, 2, 2, 2])
    >>> sb.sliding_window_mask(7, window=3, causal=False).sum(-1)  # 2 * 3 - 1
    tensor([3, 4, 5, 5, 5, 4, 3])
    >>> causal = sb.causal_mask(5, 3)  # L = 5 queries, S = 3 keys
    >>> torch.equal(sb.sliding_window_mask(5, 3, window=3), causal)  # window = S
    False
    >>> torch.equal(sb.sliding_window_mask(5, 3, window=5), causal)  # window = L
    True

    Parameters
    ----------
    L, S : int
        Numbers of queries and keys, ``>= 1`` (``S`` defaults to ``L``).
    window : int
        The causal window's size, ``>= 1``: keys per query, the query
        included (two-sided: up to ``2 * window - 1``); 1 keeps only the
        diagonal.
    causal : bool
        Keys after the query are forbidden (``True``) or allowed within the
        window (``False``).
    device : torch.device or str, optional
        Where to create the mask.

    Returns
    -------
    Tensor
        ``(L, S)`` boolean, True = may attend.

    Raises
    ------
    TypeError
        If a size or ``window`` is not an int, or ``causal`` not a bool.
    ValueError
        If a size or ``window`` is smaller than 1.
    """
    L = check_positive_int(L, "L")
    S = L if S is None else check_positive_int(S, "S")
    window = check_positive_int(window, "window")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    i = torch.arange(L, device=device).unsqueeze(-1)  # (L, 1)
    j = torch.arange(S, device=device)  # (S,)
    distance = i - j  # (L, S), > 0 for keys in the past
    if causal:
        return (distance >= 0) & (distance < window)
    return distance.abs() < window


def chunked_mask(
    L: int,
    S: int | None = None,
    *,
    chunk: int,
    causal: bool = True,
    device: torch.device | str | None = None,
) -> Tensor:
    r"""Chunked attention: the row is cut into chunks of ``chunk`` positions and
    query :math:`i` sees key :math:`j` iff :math:`\lfloor i / c \rfloor =
    \lfloor j / c \rfloor` (and :math:`j \le i` if ``causal``).

    Unlike a sliding window, the span depends on where a query falls in its
    chunk: a causal query sees ``i mod c + 1`` keys (``S >= L``), 1 to ``chunk``.
    This is the local attention of Llama 4's RoPE layers (Meta's
    ``create_chunked_attention_mask``, chunk 8192): a causal document mask
    whose documents are the chunks. Positions are aligned at the top-left,
    like :func:`~softmaxbook.causal_mask`; ``chunk >= max(L, S)`` gives the
    causal mask (or, with ``causal=False``, no mask).

    Shapes: returns ``(L, S)`` (``S`` defaults to ``L``), dtype ``bool``.

    Equivalent to ``(i // c == j // c) & (j <= i)`` for ``i = arange(L)[:,
    None]``, ``j = arange(S)``:

    >>> import torch
    >>> import softmaxbook as sb
    >>> i, j = torch.arange(6)[:, None], torch.arange(6)
    >>> mask = sb.chunked_mask(6, chunk=3)
    >>> torch.equal(mask, (i // 3 == j // 3) & (j <= i))
    True
    >>> mask.sum(-1)  # i mod 3 + 1 keys
    tensor([1, 2, 3, 1, 2, 3])
    >>> torch.equal(mask, sb.document_mask(torch.arange(6) // 3, causal=True))
    True

    Parameters
    ----------
    L, S : int
        Numbers of queries and keys, ``>= 1`` (``S`` defaults to ``L``).
    chunk : int
        The chunk size :math:`c \ge 1`; 1 keeps only the diagonal (causal).
    causal : bool
        Keys after the query are forbidden (``True``) or allowed within the
        chunk (``False``: block-diagonal).
    device : torch.device or str, optional
        Where to create the mask.

    Returns
    -------
    Tensor
        ``(L, S)`` boolean, True = may attend.

    Raises
    ------
    TypeError
        If a size or ``chunk`` is not an int, or ``causal`` not a bool.
    ValueError
        If a size or ``chunk`` is smaller than 1.
    """
    L = check_positive_int(L, "L")
    S = L if S is None else check_positive_int(S, "S")
    chunk = check_positive_int(chunk, "chunk")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    i, j = torch.arange(L, device=device).unsqueeze(-1), torch.arange(S, device=device)
    same = (i // chunk) == (j // chunk)  # (L, S)
    return same & (j <= i) if causal else same


def prefix_lm_mask(
    L: int,
    prefix_lengths: int | Tensor | Sequence[int],
    *,
    device: torch.device | str | None = None,
) -> Tensor:
    r"""Prefix-LM mask: the first :math:`p` positions see each other, the rest is
    causal. Query :math:`i` may attend to key :math:`j` iff :math:`j < p` or
    :math:`j \le i`.

    The prefix (an instruction, a source sentence, the image tokens of a
    multimodal model) is encoded bidirectionally, and the continuation is
    generated causally, in one sequence and one attention call. ``p = 0``
    gives the causal mask, ``p = L`` no mask at all.

    Shapes: ``prefix_lengths`` is an int (returns ``(L, L)``) or ``(B,)``, one
    prefix per sequence (returns ``(B, L, L)``); dtype ``bool``.

    Equivalent to ``causal_mask(L) | (arange(L) < p)``:

    >>> import torch
    >>> import softmaxbook as sb
    >>> mask = sb.prefix_lm_mask(4, 2)
    >>> torch.equal(mask, sb.causal_mask(4) | (torch.arange(4) < 2))
    True
    >>> mask.int()
    tensor([[1, 1, 0, 0],
            [1, 1, 0, 0],
            [1, 1, 1, 0],
            [1, 1, 1, 1]], dtype=torch.int32)

    Parameters
    ----------
    L : int
        Sequence length, ``>= 1``.
    prefix_lengths : int, Tensor or sequence of int
        The prefix length :math:`p`, ``0 <= p <= L``, or one per sequence.
    device : torch.device or str, optional
        Where to create the mask.

    Returns
    -------
    Tensor
        ``(L, L)`` or ``(B, L, L)`` boolean, True = may attend.

    Raises
    ------
    TypeError
        If ``L`` is not an int or ``prefix_lengths`` is not an int, a 1-D
        integer tensor or a sequence of ints.
    ValueError
        If ``L < 1`` or a prefix length is outside ``[0, L]``.
    """
    L = check_positive_int(L, "L")
    single = isinstance(prefix_lengths, Integral) and not isinstance(
        prefix_lengths, bool
    )
    p = _int_vector([prefix_lengths] if single else prefix_lengths, "prefix_lengths")
    p = p.to(device) if device is not None else p
    if p.numel() and (int(p.min()) < 0 or int(p.max()) > L):
        raise ValueError(f"prefix_lengths must be in [0, L={L}], got {p.tolist()}")
    keys = torch.arange(L, device=p.device)  # (L,)
    in_prefix = keys < p.unsqueeze(-1)  # (B, L): key j is in sequence b's prefix
    mask = causal_mask(L, device=p.device) | in_prefix.unsqueeze(-2)  # (B, L, L)
    return mask[0] if single else mask


def alibi_slopes(n_heads: int, *, device: torch.device | str | None = None) -> Tensor:
    r"""ALiBi's head slopes: the geometric sequence :math:`m_h = 2^{-8h/H}`,
    :math:`h = 1, \dots, H`.

    For 8 heads: :math:`1/2, 1/4, \dots, 1/256`. When :math:`H` is not a power
    of two, ALiBi's reference implementation takes the slopes of the nearest
    smaller power of two :math:`H'` and fills the remaining heads with every
    other slope of :math:`2H'` heads; this function does the same, so its
    slopes match models trained with ALiBi (Press et al., 2022).

    Shapes: returns ``(H,)``, float32.

    >>> import softmaxbook as sb
    >>> sb.alibi_slopes(4).tolist()  # 2 ** (-8 h / 4)
    [0.25, 0.0625, 0.015625, 0.00390625]

    Parameters
    ----------
    n_heads : int
        The number of heads :math:`H \ge 1`.
    device : torch.device or str, optional
        Where to create the slopes.

    Returns
    -------
    Tensor
        ``(H,)`` slopes in :math:`(0, 1)`, largest first.

    Raises
    ------
    TypeError
        If ``n_heads`` is not an int.
    ValueError
        If ``n_heads < 1``.
    """
    n_heads = check_positive_int(n_heads, "n_heads")
    return torch.tensor(_slopes(n_heads), dtype=torch.float32, device=device)


def _slopes(n: int) -> list[float]:
    if n & (n - 1) == 0:  # a power of two
        start = 2.0 ** (-8.0 / n)
        return [start ** (h + 1) for h in range(n)]
    closest = 2 ** math.floor(math.log2(n))
    return _slopes(closest) + _slopes(2 * closest)[0::2][: n - closest]


def alibi_bias(slopes: Tensor, L: int, S: int | None = None) -> Tensor:
    r"""ALiBi's additive bias: :math:`b_{hij} = -m_h\, |i - j|`, added to the scores.

    A key :math:`k` positions away costs head :math:`h` a score of
    :math:`m_h k`: each head forgets at its own rate, and no position
    embedding is needed. On the causal part (:math:`j \le i`) this is ALiBi's
    :math:`m_h (j - i)`; there the reference implementation adds just
    :math:`m_h\, j`, which differs by :math:`-m_h i`, a constant per row that
    the softmax ignores. Keys after the query get the mirrored penalty,
    which a causal mask then removes (or a bidirectional model keeps).
    Positions are aligned at the top-left, like
    :func:`~softmaxbook.causal_mask`.

    Shapes: ``slopes`` is ``(H,)``; returns ``(H, L, S)`` in the dtype and on
    the device of ``slopes``. Broadcasts against ``(B, H, L, S)`` scores.

    >>> import softmaxbook as sb
    >>> sb.alibi_bias(sb.alibi_slopes(2), 3)[0]  # the first head: slope 1/16
    tensor([[ 0.0000, -0.0625, -0.1250],
            [-0.0625,  0.0000, -0.0625],
            [-0.1250, -0.0625,  0.0000]])

    Parameters
    ----------
    slopes : Tensor
        Floating-point slopes, one per head (:func:`alibi_slopes`).
    L, S : int
        Numbers of queries and keys (``S`` defaults to ``L``).

    Returns
    -------
    Tensor
        ``(H, L, S)``: 0 on the diagonal, more negative with distance.

    Raises
    ------
    TypeError
        If ``slopes`` is not a floating-point tensor or a size is not an int.
    ValueError
        If ``slopes`` is not 1-D or a size is smaller than 1.
    """
    check_float(slopes, "slopes")
    if slopes.dim() != 1:
        raise ValueError(
            f"slopes must be 1-D, one per head, got shape {tuple(slopes.shape)}"
        )
    L = check_positive_int(L, "L")
    S = L if S is None else check_positive_int(S, "S")
    i = torch.arange(L, device=slopes.device).unsqueeze(-1)  # (L, 1)
    j = torch.arange(S, device=slopes.device)  # (S,)
    # Negate the integers, not the product: -m * 0 would be -0.0 on the diagonal.
    minus_distance = (-(i - j).abs()).to(slopes.dtype)  # (L, S)
    return slopes[:, None, None] * minus_distance  # (H, L, S)
