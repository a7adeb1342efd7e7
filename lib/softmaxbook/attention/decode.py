r"""Attention while decoding: grouped-query heads, split-K, and the causal alignment.

A model that generates text runs attention once per new token: a handful of
queries (one per head, ``L = 1``) against a cache of every past key and value
(``S`` large). There is little arithmetic per byte of cache read, so the
time is the time to stream the cache, and what helps is what shrinks it or
reads it in parallel:

* **grouped-query attention** (GQA; multi-query attention, MQA, when there is
  one key head): several query heads share one key and value head, so the
  cache holds ``Hkv < Hq`` heads (:func:`repeat_kv_heads` is the reference
  meaning; :func:`~softmaxbook.flash_attention` reads each shared head once);
* **split-K** ("Flash-Decoding"): the cache is cut into chunks, each worker
  attends to one chunk, and the partial results merge exactly through their
  logsumexps (:func:`split_k_attention`);
* and the **causal alignment**: with fewer queries than keys, the new
  queries are the *last* positions, so a causal mask must be aligned at the
  bottom-right corner (:func:`aligned_causal_mask`), not at the top-left as
  torch's ``is_causal=True`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise

import torch
from torch import Tensor

from .._numerics import acc_dtype, causal_offset
from .._validate import (
    check_causal,
    check_positive_int,
    check_tensor,
)
from ._args import resolve_attention
from .flash import flash_attention
from .online import merge_attention_states

__all__ = ["repeat_kv_heads", "aligned_causal_mask", "split_k_attention"]


def repeat_kv_heads(x: Tensor, groups: int) -> Tensor:
    r"""Repeat each key (or value) head ``groups`` times: grouped-query attention's
    heads, materialized.

    Query head :math:`h` of grouped-query attention uses key head
    :math:`\lfloor h / G \rfloor`. Attention on the repeated keys and values
    is grouped-query attention computed the plain way; it is the reference
    that ``enable_gqa=True`` is tested against (and what it avoids doing).

    Shapes: ``x`` is ``(..., Hkv, S, D)``; the result is ``(..., Hkv * groups,
    S, D)``.

    Equivalent to ``x.repeat_interleave(groups, dim=-3)``:

    >>> import torch
    >>> from softmaxbook import decode
    >>> k = torch.randn(2, 2, 5, 8)  # (B, H_kv, S, D)
    >>> decode.repeat_kv_heads(k, 3).shape
    torch.Size([2, 6, 5, 8])
    >>> torch.equal(decode.repeat_kv_heads(k, 3), k.repeat_interleave(3, dim=-3))
    True

    Raises
    ------
    TypeError
        If ``x`` is not a tensor or ``groups`` not an int.
    ValueError
        If ``x`` has fewer than 3 dimensions or ``groups < 1``.
    """
    check_tensor(x, "x")
    groups = check_positive_int(groups, "groups")
    if x.dim() < 3:
        raise ValueError(
            f"x must be (..., heads, length, dim), got shape {tuple(x.shape)}"
        )
    return x.repeat_interleave(groups, dim=-3)


def aligned_causal_mask(
    L: int,
    S: int | None = None,
    *,
    align: str = "top_left",
    device: torch.device | str | None = None,
) -> Tensor:
    r"""Boolean causal mask aligned at the top-left or the bottom-right corner.

    ``"top_left"`` (torch's ``is_causal=True``, and
    :func:`~softmaxbook.causal_mask`): query :math:`i` may attend to keys
    :math:`j \le i`. ``"bottom_right"`` (flash-attn's convention): to keys
    :math:`j \le i + S - L`, so the last query sees every key. The second is
    right when the ``L`` queries are the newest of ``S`` positions, as in
    decoding against a KV cache; the two agree when ``L == S``. With
    bottom-right alignment and ``L > S`` the first ``L - S`` queries have
    nothing to attend (attention gives them zeros).

    Shapes: returns ``(L, S)`` (``S`` defaults to ``L``), dtype ``bool``.

    Equivalent to ``torch.ones(L, S, dtype=torch.bool).tril(S - L)`` for
    ``"bottom_right"`` and ``.tril()`` for ``"top_left"``:

    >>> import torch
    >>> from softmaxbook import decode
    >>> mask = decode.aligned_causal_mask(2, 5, align="bottom_right")
    >>> torch.equal(mask, torch.ones(2, 5, dtype=torch.bool).tril(5 - 2))
    True
    >>> mask.int()  # two new queries after three cached keys
    tensor([[1, 1, 1, 1, 0],
            [1, 1, 1, 1, 1]], dtype=torch.int32)

    Raises
    ------
    TypeError
        If ``L`` or ``S`` is not an int.
    ValueError
        If ``L`` or ``S`` is smaller than 1, or ``align`` is not one of
        ``"top_left"``, ``"bottom_right"``.
    """
    L = check_positive_int(L, "L")
    S = L if S is None else check_positive_int(S, "S")
    if not isinstance(align, str):
        raise TypeError(f"align must be a str, got {type(align).__name__}")
    # the same names is_causal takes
    offset = causal_offset(check_causal(align) or "bottom_right", L, S)
    rows = torch.arange(L, device=device).unsqueeze(-1)  # (L, 1)
    return torch.arange(S, device=device) <= rows + offset  # (L, S)


_POOL: ThreadPoolExecutor | None = None


def split_k_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    splits: int,
    mask: Tensor | None = None,
    is_causal: bool | str = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    sinks: Tensor | None = None,
    dropout_p: float = 0.0,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    r"""Attention with the keys split into ``splits`` chunks, attended in parallel
    and merged: split-K, or "Flash-Decoding".

    Chunk :math:`c` of the keys gives a partial result
    :math:`(o_c, \lambda_c)`: the attention output over its keys and their
    logsumexp. Because partial results merge exactly and in any order,

    .. math::

        \lambda = \log \textstyle\sum_c e^{\lambda_c}, \qquad
        o = \textstyle\sum_c e^{\lambda_c - \lambda}\, o_c,

    the chunks are independent: each runs on its own worker (a CPU thread
    here, a block of GPU threads in a decoding kernel), and the results are
    merged pairwise in a tree with
    :func:`~softmaxbook.merge_attention_states`. When there are few queries
    (decoding: one per head), this is how all workers get a share of a long
    cache. Differentiable (the merge is torch operations, and
    :func:`~softmaxbook.flash_attention` passes gradients through its
    logsumexp).

    Shapes: as :func:`~softmaxbook.flash_attention`; ``mask`` broadcasts to
    ``(..., L, S)``. Returns ``(..., L, Dv)`` in the dtype of ``q``, and with
    ``return_lse`` also the logsumexp ``(..., L)`` (float32, float64 for
    float64 input).

    Equivalent to ``flash_attention(q, k, v, mask=mask, is_causal=is_causal,
    scale=scale, enable_gqa=enable_gqa, return_lse=return_lse)`` up to
    rounding:

    >>> import torch
    >>> import softmaxbook as sb
    >>> from softmaxbook import decode
    >>> q = torch.randn(2, 4, 1, 16)  # one new query per head
    >>> k, v = torch.randn(2, 4, 300, 16), torch.randn(2, 4, 300, 16)  # the cache
    >>> out = decode.split_k_attention(q, k, v, splits=4)
    >>> torch.allclose(out, sb.flash_attention(q, k, v), atol=1e-6)
    True

    Parameters
    ----------
    splits : int
        Number of chunks, ``>= 1`` (at most ``S`` are used; chunks differ in
        length by at most one key).
    mask : Tensor, optional
        Boolean (True = may attend) or float (added to the scores), as in
        :func:`~softmaxbook.scaled_dot_product_attention`; cut with the keys.
    is_causal : bool or str
        As in :func:`~softmaxbook.flash_attention`; for decoding use
        ``"bottom_right"``. The mask is built once for all ``S`` keys and
        cut with them, so each chunk sees its keys' true positions.
    scale, enable_gqa :
        As in :func:`~softmaxbook.scaled_dot_product_attention`.
    sinks : Tensor, optional
        Sink logits, one per row of the batch dimensions (e.g. ``(H,)``):
        merged once, after the chunks, as one more partial result with
        logsumexp ``sinks`` and output 0.
    dropout_p : float
        Must be 0: dropout is not supported here.
    return_lse : bool
        Also return the logsumexp (including the sink, if any).

    Raises
    ------
    TypeError, ValueError
        For bad input, as :func:`~softmaxbook.flash_attention`, or if
        ``splits`` is not a positive int.
    """
    splits = check_positive_int(splits, "splits")
    args = resolve_attention(
        q, k, v, mask=mask, is_causal=is_causal, scale=scale, sinks=sinks,
        enable_gqa=enable_gqa, dropout_p=dropout_p, caller="split_k_attention",
        unsupported=("dropout_p",),
    )  # fmt: skip
    # The causal mask is built once for all S keys and cut with them.
    causal = args.causal_mask(q.device)
    mask = args.mask if causal is None else causal
    bounds = _chunks(args.S, splits)
    # The partial outputs stay in float32 (float64 for float64 input) through the
    # merges and are rounded to q's dtype once, at the end, as Flash-Decoding does:
    # rounding each one would add a rounding error per level of the merge tree. So
    # each chunk is attended in that dtype (for half-precision input, a float32
    # copy of the chunk's keys and values while it is attended).
    acc = acc_dtype(q.dtype)
    q_acc = q.to(acc)
    if mask is not None and mask.is_floating_point():
        mask = mask.to(acc)  # a float mask is added in the chunks' dtype

    def part(start: int, stop: int) -> tuple[Tensor, Tensor]:
        m = None if mask is None else mask[..., start:stop]
        ks, vs = k[..., start:stop, :].to(acc), v[..., start:stop, :].to(acc)
        out, lse = flash_attention(
            q_acc, ks, vs, mask=m, scale=args.scale, enable_gqa=enable_gqa,
            return_lse=True,
        )  # fmt: skip
        return out, lse

    parts = _in_parallel(part, bounds)
    while len(parts) > 1:  # a tree: pairs, then pairs of pairs
        merged = [
            merge_attention_states(*a, *b)
            for a, b in zip(parts[::2], parts[1::2], strict=False)
        ]
        parts = merged + ([parts[-1]] if len(parts) % 2 else [])
    out, lse = parts[0]
    if args.sinks is not None:  # one more state: logsumexp = the sink, output 0
        total = torch.logaddexp(lse, args.sinks.to(lse.dtype)[..., None])
        out = out * torch.exp(lse - total).unsqueeze(-1)
        lse = total
    return (out.to(q.dtype), lse) if return_lse else out.to(q.dtype)


def _chunks(S: int, splits: int) -> list[tuple[int, int]]:
    """``min(splits, S)`` contiguous ranges covering ``[0, S)`` (one empty one for
    ``S == 0``)."""
    n = max(1, min(splits, S))
    edges = [round(i * S / n) for i in range(n + 1)]
    return list(pairwise(edges))


def _in_parallel(
    fn: Callable[[int, int], tuple[Tensor, Tensor]], bounds: list[tuple[int, int]]
) -> list[tuple[Tensor, Tensor]]:
    if torch.compiler.is_compiling():  # one graph: the compiler schedules the chunks
        return [fn(*b) for b in bounds]
    workers = min(torch.get_num_threads(), len(bounds))
    if workers <= 1:
        return [fn(*b) for b in bounds]
    global _POOL
    if _POOL is None or _POOL._max_workers < workers:
        _POOL = ThreadPoolExecutor(workers, thread_name_prefix="softmaxbook-splitk")
    grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()

    def job(b: tuple[int, int]) -> tuple[Tensor, Tensor]:
        # One thread per chunk, each running its torch operations on one core;
        # autograd's mode is per thread, so the caller's is carried over.
        torch.set_num_threads(1)
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):
            return fn(*b)

    return list(_POOL.map(job, bounds))
