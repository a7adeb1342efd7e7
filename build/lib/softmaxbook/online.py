r"""Online (streaming) softmax: the normalizer in one pass over the data.

Milakov & Gimelshein (2018) observed that the maximum and the sum of
exponentials of a row can be accumulated together, block by block, if the
running sum is rescaled whenever the running maximum grows. This is the idea
that lets FlashAttention compute attention without ever holding a whole row
of scores.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import torch
from torch import Tensor

from ._checks import (
    check_attention_args,
    check_dim,
    check_float,
    check_positive_int,
)
from .kernels import explain_dispatch, triton_flash_attention

__all__ = [
    "online_softmax",
    "flash_attention",
    "flash_attention_steps",
    "FlashStep",
    "merge_attention_states",
]


def online_softmax(x: Tensor, dim: int = -1, *, block_size: int = 128) -> Tensor:
    r"""Softmax computed block by block with a running maximum and a rescaled running
    sum.

    For each block :math:`B` of ``block_size`` entries,

    .. math:: m' = \max(m, \max_{j \in B} x_j), \qquad
              d' = d\, e^{m - m'} + \sum_{j \in B} e^{x_j - m'}

    and finally :math:`p_i = e^{x_i - m} / d`. Equal to :func:`softmax`
    up to rounding; a row of all ``-inf`` gives zeros.

    Shapes: ``x`` is ``(..., N)``; the result has the same shape and dtype.
    The running state is computed in float32 at least (float64 stays float64).
    """
    check_float(x)
    dim = check_dim(x, dim)
    block_size = check_positive_int(block_size, "block_size")
    if x.dim() == 0:  # one row of one entry, as for softmax
        return online_softmax(x.reshape(1), 0, block_size=block_size).reshape(())
    acc = torch.promote_types(x.dtype, torch.float32)
    xt = x.movedim(dim, -1).to(acc)  # (..., N)
    m = torch.full(xt.shape[:-1] + (1,), float("-inf"), dtype=acc, device=x.device)
    d = torch.zeros_like(m)
    for start in range(0, xt.shape[-1], block_size):
        block = xt[..., start : start + block_size]
        m_new = torch.maximum(m, block.amax(dim=-1, keepdim=True))
        # An all -inf prefix has m_new = -inf: shift by 0 instead, so that
        # exp(-inf - (-inf)) = nan never happens.
        shift = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
        d = d * torch.exp(m - shift) + torch.exp(block - shift).sum(
            dim=-1, keepdim=True
        )
        m = m_new
    shift = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    p = torch.exp(xt - shift) / torch.where(d > 0, d, torch.ones_like(d))
    return p.to(x.dtype).movedim(-1, dim)


# --------------------------------------------------------------------------------------
# FlashAttention: attention tile by tile with the online softmax
# --------------------------------------------------------------------------------------

#: Default tile sizes ``(block_q, block_k)`` of :func:`flash_attention`. Large
#: tiles keep the per-tile matrix products big enough that Python's per-tile
#: overhead is negligible, while one (B·H, 256, 512) float32 tile of scores is
#: still only 0.5 MiB per head.
DEFAULT_BLOCK_SIZE = (256, 512)

_LOG2E = math.log2(math.e)
_LN2 = math.log(2.0)


def _block_sizes(block_size) -> tuple[int, int]:
    if isinstance(block_size, tuple) and len(block_size) == 2:
        return (
            check_positive_int(block_size[0], "block_size[0]"),
            check_positive_int(block_size[1], "block_size[1]"),
        )
    if isinstance(block_size, tuple):
        raise ValueError(
            f"block_size must be an int or a pair (block_q, block_k), "
            f"got a tuple of length {len(block_size)}"
        )
    block = check_positive_int(block_size, "block_size")
    return block, block


def flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    block_size: int | tuple[int, int] = DEFAULT_BLOCK_SIZE,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    r"""Exact attention computed tile by tile:
    :math:`\mathrm{softmax}(QK^\top \cdot \text{scale})\,V`.

    The algorithm of FlashAttention (Dao et al., 2022). Queries are cut into
    blocks of ``block_q`` rows, keys and values into blocks of ``block_k``.
    For each query row the loop over key blocks keeps a running maximum
    :math:`m`, a running sum :math:`\ell` and an unnormalized output
    :math:`o`; a new tile of scores :math:`s` updates them as

    .. math::

        m' &= \max(m, \max_j s_j), \\
        \ell' &= e^{m - m'}\,\ell + \textstyle\sum_j e^{s_j - m'}, \\
        o' &= e^{m - m'}\,o + \textstyle\sum_j e^{s_j - m'}\, v_j

    and the result is :math:`o / \ell`. Only one ``(block_q, block_k)`` tile
    of scores exists at a time, so the extra memory grows linearly with the
    sequence length instead of quadratically; the ``(L, S)`` score matrix is
    never formed. With ``is_causal`` the tiles entirely above the diagonal
    are skipped. Rows with nothing to attend give zeros (and a logsumexp of
    ``-inf``), like :func:`~softmaxbook.scaled_dot_product_attention`.

    On a CUDA tensor with Triton installed (and no gradient required) the
    computation runs in the fused Triton kernel
    :func:`softmaxbook.kernels.triton_flash_attention`; everywhere else in
    torch. :func:`~softmaxbook.explain_dispatch` says which and why.

    Shapes: ``q`` is ``(..., L, D)``, ``k`` is ``(..., S, D)``, ``v`` is
    ``(..., S, Dv)``, batch dimensions broadcast; the result is
    ``(..., L, Dv)`` in the dtype of ``q``, and the logsumexp ``(..., L)``
    in float32 (float64 for float64 input).

    Equivalent to ``torch.nn.functional.scaled_dot_product_attention(q, k, v,
    attn_mask=mask, is_causal=is_causal, scale=scale)``, except that fully
    masked rows give zeros instead of ``nan``.

    Parameters
    ----------
    q, k, v : Tensor
        Queries, keys and values, one floating dtype.
    mask : bool Tensor broadcastable to ``(..., L, S)``, optional
        True = the query may attend to the key.
    is_causal : bool
        Query :math:`i` attends to keys :math:`j \le i` (top-left aligned,
        like torch); cannot be combined with ``mask``.
    scale : float, optional
        Multiplies the scores; defaults to :math:`1/\sqrt{D}`.
    block_size : int or (int, int)
        Tile sizes ``(block_q, block_k)`` of the torch path (one int sets
        both). They change the speed and memory, not the result beyond
        rounding.
    return_lse : bool
        Also return the logsumexp of each row of scaled, masked scores,
        :math:`\log \sum_j e^{s_{ij}}`: the state that
        :func:`merge_attention_states` needs.

    Returns
    -------
    Tensor ``(..., L, Dv)``, or ``(out, lse)`` with ``return_lse=True``.

    Raises
    ------
    TypeError
        If an input is not a floating tensor, the dtypes differ, or the mask
        is not boolean.
    ValueError
        If the shapes do not fit together, the mask does not broadcast,
        ``scale <= 0``, or both ``mask`` and ``is_causal`` are given.
    """
    batch, scale, keep = check_attention_args(q, k, v, mask, is_causal, scale)
    block_q, block_k = _block_sizes(block_size)
    if explain_dispatch("flash_attention", q, k, v).path == "triton":
        return triton_flash_attention(
            q, k, v, mask=mask, is_causal=is_causal, scale=scale, return_lse=return_lse
        )
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    run = _flash_attention_differentiable if needs_grad else _flash_attention_fast
    out, lse = run(q, k, v, batch, keep, is_causal, scale, block_q, block_k)
    return (out, lse) if return_lse else out


class FlashStep(NamedTuple):
    """The state of :func:`flash_attention_steps` after one tile (all tensors
    float32+)."""

    #: Query rows ``[q_start, q_stop)`` and key columns ``[k_start, k_stop)``.
    q_start: int
    q_stop: int
    k_start: int
    k_stop: int
    #: The tile's scaled, masked scores ``(..., bq, bk)``.
    scores: Tensor
    #: Running maximum ``(..., bq)`` after this tile.
    max: Tensor
    #: Running sum of :math:`e^{s - m}` ``(..., bq)`` after this tile.
    sum: Tensor
    #: Unnormalized output ``(..., bq, Dv)`` after this tile; divide by ``sum``.
    acc: Tensor
    #: Whether this is the last tile of the query block (``acc / sum`` is then final).
    last: bool


def flash_attention_steps(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    block_size: int | tuple[int, int] = DEFAULT_BLOCK_SIZE,
) -> Iterator[FlashStep]:
    r"""Step through :func:`flash_attention` tile by tile: yields the running state
    after each tile.

    The plain algorithm, written for reading: for each block of query rows,
    for each block of keys, compute the tile of scores, update the running
    maximum :math:`m`, the running sum :math:`\ell` and the unnormalized
    output :math:`o`, and yield them. After the last tile of a query block,
    ``acc / sum`` is that block of the attention output. (The fast path of
    :func:`flash_attention` does the same arithmetic with in-place updates.)
    Differentiable: :func:`flash_attention` uses it when a gradient is needed.

    Shapes: as :func:`flash_attention`; each :class:`FlashStep` holds
    ``(..., bq)`` and ``(..., bq, Dv)`` tensors for its query block.

    Equivalent to iterating the loop nest of Dao et al. (2022), Algorithm 1.

    Raises
    ------
    TypeError, ValueError
        For bad input, as :func:`flash_attention`.
    """
    batch, scale, keep = check_attention_args(q, k, v, mask, is_causal, scale)
    block_q, block_k = _block_sizes(block_size)
    return _steps(q, k, v, batch, keep, is_causal, scale, block_q, block_k)


def _steps(q, k, v, batch, keep, is_causal, scale, block_q, block_k):
    L, S = q.shape[-2], k.shape[-2]
    acc_dtype = torch.promote_types(q.dtype, torch.float32)
    q, k, v = (t.expand(batch + t.shape[-2:]).to(acc_dtype) for t in (q, k, v))
    for q0 in range(0, L, block_q):
        q1 = min(q0 + block_q, L)
        qb = q[..., q0:q1, :] * scale  # (..., bq, D)
        m = torch.full(
            qb.shape[:-1], float("-inf"), dtype=acc_dtype, device=q.device
        )  # (..., bq)
        ell = torch.zeros_like(m)
        o = torch.zeros(qb.shape[:-1] + v.shape[-1:], dtype=acc_dtype, device=q.device)
        k_end = (
            min(S, q1) if is_causal else S
        )  # causal: later key blocks are all masked
        if k_end == 0:
            yield FlashStep(q0, q1, 0, 0, qb[..., :0], m, ell, o, True)
        for k0 in range(0, k_end, block_k):
            k1 = min(k0 + block_k, S)
            s = qb @ k[..., k0:k1, :].transpose(
                -2, -1
            )  # (..., bq, bk): the only scores that exist
            tile_keep = _tile_mask(keep, is_causal, q0, q1, k0, k1, q.device)
            if tile_keep is not None:
                s = s.masked_fill(~tile_keep, float("-inf"))
            with (
                torch.no_grad()
            ):  # the shift cancels in o / ell, so it needs no gradient
                m_new = torch.maximum(m, s.amax(dim=-1))
                # A row with no key so far has m = -inf: shift by 0, so that
                # exp(-inf - (-inf)) = nan never happens.
                shift = m_new.masked_fill(torch.isneginf(m_new), 0.0)
                alpha = torch.exp(
                    m - shift
                )  # rescales the old state to the new maximum
            p = torch.exp(s - shift.unsqueeze(-1))
            ell = ell * alpha + p.sum(dim=-1)
            o = o * alpha.unsqueeze(-1) + p @ v[..., k0:k1, :]
            m = m_new
            yield FlashStep(q0, q1, k0, k1, s, m, ell, o, k0 + block_k >= k_end)


def _flash_attention_differentiable(
    q, k, v, batch, keep, is_causal, scale, block_q, block_k
):
    outs, lses = [], []
    for step in _steps(q, k, v, batch, keep, is_causal, scale, block_q, block_k):
        if step.last:
            nonzero = step.sum > 0
            l_safe = torch.where(nonzero, step.sum, torch.ones_like(step.sum))
            outs.append(step.acc / l_safe.unsqueeze(-1))
            lses.append(
                torch.where(
                    nonzero,
                    step.max + torch.log(l_safe),
                    torch.full_like(l_safe, float("-inf")),
                )
            )
    L, Dv = q.shape[-2], v.shape[-1]
    acc_dtype = torch.promote_types(q.dtype, torch.float32)
    if not outs:  # L == 0
        return (
            torch.zeros(batch + (L, Dv), dtype=q.dtype, device=q.device),
            torch.zeros(batch + (L,), dtype=acc_dtype, device=q.device),
        )
    return torch.cat(outs, dim=-2).to(q.dtype), torch.cat(lses, dim=-1)


def _flash_attention_fast(q, k, v, batch, keep, is_causal, scale, block_q, block_k):
    """The loop of :func:`_steps` without autograd: in-place updates, query blocks in
    parallel."""
    L, S, Dv = q.shape[-2], k.shape[-2], v.shape[-1]
    acc_dtype = torch.promote_types(q.dtype, torch.float32)
    dev = q.device
    BH = math.prod(batch)
    # Scores in base 2: exp2 is cheaper than exp on CPUs and GPUs alike, and
    # 2^(s log2 e) = e^s, so folding log2(e) into the scale changes nothing else.
    qf = q.expand(batch + q.shape[-2:]).reshape((BH,) + q.shape[-2:]).to(acc_dtype) * (
        scale * _LOG2E
    )
    kt = (
        k.expand(batch + k.shape[-2:])
        .reshape((BH,) + k.shape[-2:])
        .to(acc_dtype)
        .transpose(-2, -1)
    )
    vf = v.expand(batch + v.shape[-2:]).reshape((BH,) + v.shape[-2:]).to(acc_dtype)
    out = torch.zeros((BH, L, Dv), dtype=acc_dtype, device=dev)
    lse = torch.full((BH, L), float("-inf"), dtype=acc_dtype, device=dev)
    if BH == 0 or L == 0 or S == 0:
        return _unflatten(out, lse, batch, q.dtype)
    starts = list(range(0, L, block_q))
    workers = min(torch.get_num_threads(), len(starts)) if dev.type == "cpu" else 1
    args = (qf, kt, vf, out, lse, keep, is_causal, block_q, block_k)
    if workers <= 1:
        _flash_query_blocks(starts, *args)
    else:
        # Query blocks are independent (FlashAttention-2 parallelizes over them too).
        # One single-threaded worker per core beats many short multi-threaded torch ops,
        # whose thread synchronization costs dominate on a busy machine. Worker i takes
        # blocks i, i + workers, ... so that causal attention's growing blocks balance.
        pool = _pool(workers)
        inference = torch.is_inference_mode_enabled()
        jobs = [
            pool.submit(
                _in_worker, inference, _flash_query_blocks, starts[i::workers], *args
            )
            for i in range(workers)
        ]
        for job in jobs:
            job.result()
    return _unflatten(out, lse, batch, q.dtype)


def _flash_query_blocks(
    starts, qf, kt, vf, out, lse, keep, is_causal, block_q, block_k
):
    """Compute the query blocks starting at ``starts`` into ``out`` and ``lse`` (base-2
    scores)."""
    BH, L, _ = qf.shape
    S = vf.shape[1]
    bq_max, bk_max = min(block_q, L), min(block_k, S)
    # One flat buffer for the score tile, viewed contiguously at each tile's shape.
    tile = qf.new_empty(BH * bq_max * bk_max)
    m_buf = qf.new_empty((BH, bq_max, 1))
    l_buf = torch.empty_like(m_buf)
    for q0 in starts:
        q1 = min(q0 + block_q, L)
        bq = q1 - q0
        qb = qf[:, q0:q1]  # (BH, bq, D)
        m = m_buf[:, :bq].fill_(float("-inf"))  # running maximum
        ell = l_buf[:, :bq].zero_()  # running sum
        o = out[:, q0:q1]  # (BH, bq, Dv): the unnormalized output, accumulated in place
        k_end = min(S, q1) if is_causal else S
        for k0 in range(0, k_end, block_k):
            k1 = min(k0 + block_k, S)
            s = torch.bmm(
                qb,
                kt[:, :, k0:k1],
                out=tile[: BH * bq * (k1 - k0)].view(BH, bq, k1 - k0),
            )
            tile_keep = _tile_mask(keep, is_causal, q0, q1, k0, k1, qf.device)
            if tile_keep is not None:
                s.masked_fill_(~tile_keep.reshape((-1, bq, k1 - k0)), float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            # Only a user mask can leave a row without any key so far (m = -inf).
            shift = (
                m_new.masked_fill(torch.isneginf(m_new), 0.0)
                if keep is not None
                else m_new
            )
            alpha = torch.exp2(m - shift)
            p = s.sub_(shift).exp2_()
            ell.mul_(alpha).add_(p.sum(dim=-1, keepdim=True))
            o.mul_(alpha).baddbmm_(p, vf[:, k0:k1])
            m.copy_(m_new)
        nonzero = ell > 0
        l_safe = torch.where(nonzero, ell, torch.ones_like(ell))
        o.div_(l_safe)
        lse[:, q0:q1] = torch.where(
            nonzero, (m + torch.log2(l_safe)) * _LN2, float("-inf")
        ).squeeze(-1)


_POOL: ThreadPoolExecutor | None = None


def _pool(workers: int) -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None or _POOL._max_workers != workers:
        if _POOL is not None:
            _POOL.shutdown(wait=False)
        _POOL = ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="softmaxbook-flash"
        )
    return _POOL


def _in_worker(inference: bool, fn, *args):
    # Grad mode and inference mode are per thread: carry the caller's over.
    torch.set_num_threads(1)  # per thread: this worker's torch ops run inline
    with torch.inference_mode(inference), torch.no_grad():
        return fn(*args)


def _tile_mask(keep, is_causal, q0, q1, k0, k1, device):
    """The boolean ``(..., bq, bk)`` tile of the mask, or None when every entry may
    attend.

    For ``is_causal`` it is ``(bq, bk)``; for a mask, a slice of the expanded
    mask (a view: only the tile is ever copied).
    """
    if is_causal:
        if k1 - 1 <= q0:  # entirely on or below the diagonal
            return None
        rows = torch.arange(q0, q1, device=device).unsqueeze(-1)
        cols = torch.arange(k0, k1, device=device)
        return cols <= rows  # (bq, bk)
    if keep is None:
        return None
    return keep[..., q0:q1, k0:k1]


def _unflatten(out, lse, batch, dtype):
    return (
        out.reshape(batch + out.shape[-2:]).to(dtype),
        lse.reshape(batch + lse.shape[-1:]),
    )


def merge_attention_states(
    out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor
) -> tuple[Tensor, Tensor]:
    r"""Merge two partial attention results over disjoint key sets into one.

    If ``(out_a, lse_a)`` is attention over keys :math:`A` (with
    :math:`\mathrm{lse}_a = \log \sum_{j \in A} e^{s_j}`) and ``(out_b,
    lse_b)`` over keys :math:`B`, then attention over :math:`A \cup B` is

    .. math::

        \mathrm{lse} = \log\left(e^{\mathrm{lse}_a} + e^{\mathrm{lse}_b}\right),
        \qquad
        o = e^{\mathrm{lse}_a - \mathrm{lse}}\, o_a
          + e^{\mathrm{lse}_b - \mathrm{lse}}\, o_b .

    This is the step that lets split-K decoding and ring attention compute
    attention over keys held in different places and combine the pieces
    exactly. Merging with an empty part (``lse = -inf``, output 0) returns
    the other part; two empty parts give zeros and ``-inf``.

    Shapes: ``out_a``, ``out_b`` are ``(..., L, Dv)``; ``lse_a``, ``lse_b``
    are ``(..., L)``, as returned by ``flash_attention(..., return_lse=True)``.
    The result is ``(out, lse)`` with those shapes (batch dimensions
    broadcast); ``out`` has the dtype of ``out_a``.

    Equivalent to ``(w_a * out_a + w_b * out_b, lse)`` with
    ``lse = torch.logaddexp(lse_a, lse_b)`` and ``w = torch.exp(lse_x - lse)[...,
    None]``.

    Raises
    ------
    TypeError
        If an argument is not a floating tensor.
    ValueError
        If the shapes do not fit together.
    """
    for name, t in (
        ("out_a", out_a),
        ("lse_a", lse_a),
        ("out_b", out_b),
        ("lse_b", lse_b),
    ):
        check_float(t, name)
    for o_name, o, l_name, ell in (
        ("out_a", out_a, "lse_a", lse_a),
        ("out_b", out_b, "lse_b", lse_b),
    ):
        if o.dim() < 2 or tuple(ell.shape) != tuple(o.shape[:-1]):
            raise ValueError(
                f"{l_name} must have the shape of {o_name} without its last "
                f"dimension, (..., L); got {o_name} {tuple(o.shape)} and "
                f"{l_name} {tuple(ell.shape)}"
            )
    try:
        torch.broadcast_shapes(out_a.shape, out_b.shape)
    except RuntimeError:
        raise ValueError(
            f"out_a {tuple(out_a.shape)} and out_b {tuple(out_b.shape)} "
            "do not broadcast"
        ) from None
    acc = torch.promote_types(
        torch.promote_types(lse_a.dtype, lse_b.dtype), torch.float32
    )
    la, lb = lse_a.to(acc), lse_b.to(acc)
    m = torch.maximum(la, lb)
    shift = m.masked_fill(
        torch.isneginf(m), 0.0
    )  # both parts empty: keep exp(-inf - -inf) out
    wa, wb = torch.exp(la - shift), torch.exp(lb - shift)
    total = wa + wb
    lse = shift + torch.log(total)  # -inf where both parts are empty
    denom = torch.where(total > 0, total, torch.ones_like(total))
    share_a, share_b = (
        (wa / denom).unsqueeze(-1),
        (wb / denom).unsqueeze(-1),
    )  # sum to 1
    out = out_a.to(acc) * share_a + out_b.to(acc) * share_b
    return out.to(out_a.dtype), lse
