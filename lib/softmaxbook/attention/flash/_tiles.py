r"""The tile loops of FlashAttention on the torch path: forward and backward.

:mod:`softmaxbook.attention.flash` (its ``_layout``) reduces every call to one layout:
``q`` ``(BH, R, D)``, ``k`` ``(BH, S, D)``, ``v`` ``(BH, S, Dv)``, an optional
boolean mask ``(BH, R, S)`` (a view) or float additive mask (a bias added to the scores,
``-inf`` removes a key) and an optional causal rule "row ``r`` may attend to
keys ``j <= r % period + offset``". The loops here compute on that layout,
in place, in float32 (float64 for float64 input), with a few single-threaded
workers that share the work by heads and query blocks.

Scores are kept in base 2: ``q`` is multiplied by ``scale * log2(e)`` so that
``exp2`` replaces ``exp`` (cheaper on CPUs and GPUs alike, and
:math:`2^{s \log_2 e} = e^s` changes nothing else); the logsumexp that leaves
this module is in natural units.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..._numerics import acc_dtype, functorch_active
from ..online import online_step

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)

#: Score elements of one tile, all heads of a work unit together: 2^17 float32
#: numbers are 512 KiB, which stay in a core's L2 cache through the half-dozen
#: passes a tile gets. Several heads share a tile only when the tiles are small.
TILE_ELEMENTS = 1 << 17


class Causal(NamedTuple):
    """Row ``r`` may attend to keys ``j <= r % period + offset``.

    ``period`` is the number of queries ``L`` (rows of several query heads of
    one group are stacked, so positions repeat every ``L`` rows); ``offset``
    is 0 for torch's top-left alignment and ``S - L`` for the bottom-right one.
    """

    period: int
    offset: int

    def last_key(self, r0: int, r1: int) -> tuple[int, int]:
        """The smallest and largest last allowed key over rows ``[r0, r1)``."""
        if r1 - r0 >= self.period or r0 // self.period != (r1 - 1) // self.period:
            lo, hi = 0, self.period - 1  # the block wraps: every position occurs
        else:
            lo, hi = r0 % self.period, (r1 - 1) % self.period
        return lo + self.offset, hi + self.offset

    def keep(
        self, r0: int, r1: int, k0: int, k1: int, device: torch.device | str
    ) -> Tensor:
        """The boolean ``(r1 - r0, k1 - k0)`` tile of the causal rule."""
        rows = torch.arange(r0, r1, device=device) % self.period + self.offset
        cols = torch.arange(k0, k1, device=device)
        return cols <= rows.unsqueeze(-1)


class Problem(NamedTuple):
    """One attention call on the flat layout (see the module docstring)."""

    q: Tensor  # (BH, R, D)
    k: Tensor  # (BH, S, D)
    v: Tensor  # (BH, S, Dv)
    keep: Tensor | None  # (BH, R, S) bool, True = may attend
    causal: Causal | None
    scale: float
    block_q: int
    block_k: int
    bias: Tensor | None = None  # (BH, R, S) float, added to the scores

    def add_bias(self, s: Tensor, h0: int, h1: int, r0: int, r1: int, k0: int) -> None:
        """Add the float mask of the tile, in base-2 units, to the tile ``s``."""
        if self.bias is not None:
            k1 = k0 + s.shape[-1]
            s.add_(self.bias[h0:h1, r0:r1, k0:k1], alpha=LOG2E)

    @property
    def acc_dtype(self) -> torch.dtype:
        return acc_dtype(self.q.dtype)

    def tile_keep(
        self, h0: int, h1: int, r0: int, r1: int, k0: int, k1: int
    ) -> Tensor | None:
        """The mask of one tile, ``(bq, bk)`` or ``(heads, bq, bk)``; None if all
        may attend."""
        if self.causal is not None:
            lo, _ = self.causal.last_key(r0, r1)
            if k1 - 1 <= lo:  # every key of the tile is allowed for every row
                return None
            return self.causal.keep(r0, r1, k0, k1, self.q.device)
        if self.keep is None:
            return None
        return self.keep[h0:h1, r0:r1, k0:k1]

    def key_end(self, r0: int, r1: int) -> int:
        """Keys at or past this index are masked for every row in ``[r0, r1)``."""
        S = self.k.shape[1]
        if self.causal is None:
            return S
        return max(0, min(S, self.causal.last_key(r0, r1)[1] + 1))

    def may_be_empty(self) -> bool:
        """Whether a row can meet a tile in which all its keys are masked."""
        if self.keep is not None or self.bias is not None:
            return True
        if self.causal is None:
            return False
        return self.causal.offset < 0  # rows before the first key see nothing


# --------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------


def forward(p: Problem) -> tuple[Tensor, Tensor]:
    """Attention output ``(BH, R, Dv)`` and logsumexp ``(BH, R)``, both float32+.

    Rows with nothing to attend give zeros and a logsumexp of ``-inf``.
    """
    BH, R, _ = p.q.shape
    S, Dv = p.k.shape[1], p.v.shape[-1]
    dev = p.q.device
    out = torch.zeros((BH, R, Dv), dtype=p.acc_dtype, device=dev)
    lse = torch.full((BH, R), float("-inf"), dtype=p.acc_dtype, device=dev)
    if BH == 0 or R == 0 or S == 0:
        return out, lse
    k = p.k.to(p.acc_dtype).transpose(1, 2)  # (BH, D, S): a view for float32 input
    v = p.v.to(p.acc_dtype)
    heads = _heads_per_tile(BH, min(p.block_q, R), min(p.block_k, S))
    units = [
        (h0, min(h0 + heads, BH), r0, min(r0 + p.block_q, R))
        for r0 in range(0, R, p.block_q)
        for h0 in range(0, BH, heads)
    ]
    cost = [(u[1] - u[0]) * p.key_end(u[2], u[3]) for u in units]
    _run(_forward_units, units, cost, p, k, v, out, lse)
    return out, lse


#: A unit of forward work: heads ``[h0, h1)``, rows ``[r0, r1)``.
Unit = tuple[int, int, int, int]


def _forward_units(
    units: Sequence[Unit], p: Problem, kt: Tensor, v: Tensor, out: Tensor, lse: Tensor
) -> None:
    """Compute the work units ``(h0, h1, r0, r1)`` into ``out`` and ``lse``."""
    c = p.scale * LOG2E  # scores in base 2
    bq = max(r1 - r0 for _, _, r0, r1 in units)
    hb = max(h1 - h0 for h0, h1, _, _ in units)
    tile = kt.new_empty(hb * bq * min(p.block_k, kt.shape[-1]))
    check_empty = p.may_be_empty()
    for h0, h1, r0, r1 in units:
        n_h, n_r = h1 - h0, r1 - r0
        k_end = p.key_end(r0, r1)
        if 0 < k_end <= p.block_k:  # one tile of keys: no running state to rescale
            _forward_tile(p, h0, h1, r0, r1, k_end, kt, v, tile, out, lse, check_empty)
            continue
        qb = p.q[h0:h1, r0:r1].to(p.acc_dtype) * c  # (heads, bq, D), base-2 units
        if not check_empty and qb.device.type == "cpu":  # (a GPU would sync per tile)
            _forward_lazy(p, h0, h1, r0, r1, k_end, qb, kt, v, tile, out, lse)
            continue
        m = qb.new_full((n_h, n_r, 1), float("-inf"))  # running maximum
        ell = qb.new_zeros((n_h, n_r, 1))  # running sum of 2^(s - m)
        o = out[h0:h1, r0:r1]  # (heads, bq, Dv): the unnormalized output, in place
        for k0 in range(0, k_end, p.block_k):
            k1 = min(k0 + p.block_k, kt.shape[-1])
            s = tile[: n_h * n_r * (k1 - k0)].view(n_h, n_r, k1 - k0)
            torch.bmm(qb, kt[h0:h1, :, k0:k1], out=s)
            p.add_bias(s, h0, h1, r0, r1, k0)
            keep = p.tile_keep(h0, h1, r0, r1, k0, k1)
            if keep is not None:
                s.masked_fill_(~keep, float("-inf"))
            m, alpha, pt = online_step(m, s, base2=True, inplace=True)
            ell.mul_(alpha).add_(pt.sum(dim=-1, keepdim=True))
            o.mul_(alpha).baddbmm_(pt, v[h0:h1, k0:k1])
        nonzero = ell > 0  # false only for rows with nothing to attend
        o.div_(torch.where(nonzero, ell, torch.ones_like(ell)))
        row_lse = (m + torch.log2(ell)) * LN2  # back to natural units
        lse[h0:h1, r0:r1] = row_lse.masked_fill(~nonzero, float("-inf")).squeeze(-1)


#: The largest sum of one tile's weights (relative to the running shift) that is
#: accumulated as it is: 2^64 leaves float32's range (2^128) room for thousands
#: of such tiles. Beyond it (a row's maximum rose by about 2^64 / block_k), or for
#: a nan, the tile is recomputed with its own maxima and the state rescaled.
TILE_SUM_LIMIT = 2.0**64


def _forward_lazy(
    p: Problem,
    h0: int,
    h1: int,
    r0: int,
    r1: int,
    k_end: int,
    qb: Tensor,
    kt: Tensor,
    v: Tensor,
    tile: Tensor,
    out: Tensor,
    lse: Tensor,
) -> None:
    """The loop over key tiles for rows that all see a key in the first tile (no
    mask): the first tile's row maxima become the shift of the running state, and
    it is moved only when a later tile's weights overflow ``TILE_SUM_LIMIT``, so
    that a tile costs one GEMM that also subtracts the shift, ``exp2`` in place,
    one sum and one GEMM: no maximum, no rescaling."""
    n_h, n_r = h1 - h0, r1 - r0
    o = out[h0:h1, r0:r1]  # (heads, bq, Dv): the unnormalized output, in place
    ell: Tensor | None = None
    shift: Tensor | None = None
    neg: Tensor | None = None
    for k0 in range(0, k_end, p.block_k):
        k1 = min(k0 + p.block_k, kt.shape[-1])
        s = tile[: n_h * n_r * (k1 - k0)].view(n_h, n_r, k1 - k0)
        keep = p.tile_keep(h0, h1, r0, r1, k0, k1)
        if shift is None:  # the first tile sets the shift: its row maxima
            torch.baddbmm(s, qb, kt[h0:h1, :, k0:k1], beta=0.0, out=s)
            if keep is not None:
                s.masked_fill_(~keep, float("-inf"))
            shift = s.amax(dim=-1, keepdim=True)  # (heads, bq, 1)
            neg = shift.neg()
            pt = s.sub_(shift).exp2_()
            ell = pt.sum(dim=-1, keepdim=True)
            o.baddbmm_(pt, v[h0:h1, k0:k1])
            continue
        assert ell is not None and neg is not None  # set by the first tile
        if n_h == 1:  # s = qb k^T - shift in one GEMM (the shift broadcasts)
            torch.baddbmm(neg, qb, kt[h0:h1, :, k0:k1], out=s)
        else:  # (a broadcast start would be copied head by head)
            torch.baddbmm(s, qb, kt[h0:h1, :, k0:k1], beta=0.0, out=s).sub_(shift)
        if keep is not None:
            s.masked_fill_(~keep, float("-inf"))
        pt = s.exp2_()
        total = pt.sum(dim=-1, keepdim=True)
        if not float(total.max()) <= TILE_SUM_LIMIT:  # rare: a large rise, or nan
            torch.baddbmm(neg, qb, kt[h0:h1, :, k0:k1], out=s)
            if keep is not None:
                s.masked_fill_(~keep, float("-inf"))
            up = s.amax(dim=-1, keepdim=True).clamp_min(0)  # rows that rose move up
            alpha = torch.exp2(-up)
            ell.mul_(alpha)
            o.mul_(alpha)
            shift = shift + up
            neg = shift.neg()
            pt = s.sub_(up).exp2_()
            total = pt.sum(dim=-1, keepdim=True)
        ell.add_(total)
        o.baddbmm_(pt, v[h0:h1, k0:k1])
    assert ell is not None and shift is not None  # k_end > 0: one tile at least
    o.div_(ell)
    lse[h0:h1, r0:r1] = ((shift + torch.log2(ell)) * LN2).squeeze(-1)


def _forward_tile(
    p: Problem,
    h0: int,
    h1: int,
    r0: int,
    r1: int,
    k_end: int,
    kt: Tensor,
    v: Tensor,
    tile: Tensor,
    out: Tensor,
    lse: Tensor,
    check_empty: bool,
) -> None:
    """Rows ``[r0, r1)`` of heads ``[h0, h1)`` whose keys fit in one tile: the plain
    softmax of the tile, with no running maximum or sum to rescale."""
    n_h, n_r = h1 - h0, r1 - r0
    s = tile[: n_h * n_r * k_end].view(n_h, n_r, k_end)
    q = p.q[h0:h1, r0:r1].to(p.acc_dtype) * (p.scale * LOG2E)  # base-2 units
    torch.bmm(q, kt[h0:h1, :, :k_end], out=s)
    p.add_bias(s, h0, h1, r0, r1, 0)
    keep = p.tile_keep(h0, h1, r0, r1, 0, k_end)
    if keep is not None:
        s.masked_fill_(~keep, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)  # (heads, bq, 1)
    # A row with nothing to attend has m = -inf: shift it by 0 (no -inf - -inf).
    shift = m.masked_fill(m == float("-inf"), 0.0) if check_empty else m
    pt = s.sub_(shift).exp2_()
    ell = pt.sum(dim=-1, keepdim=True)
    o = out[h0:h1, r0:r1]
    o.baddbmm_(pt, v[h0:h1, :k_end])
    nonzero = ell > 0  # false only for rows with nothing to attend
    o.div_(torch.where(nonzero, ell, torch.ones_like(ell)) if check_empty else ell)
    row_lse = (m + torch.log2(ell)) * LN2  # back to natural units
    if check_empty:
        row_lse = row_lse.masked_fill(~nonzero, float("-inf"))
    lse[h0:h1, r0:r1] = row_lse.squeeze(-1)


# --------------------------------------------------------------------------------------
# Backward
# --------------------------------------------------------------------------------------


def backward(
    p: Problem, grad_out: Tensor, lse: Tensor, delta: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    r"""Gradients ``(dq, dk, dv)`` (float32+, shaped like ``q``, ``k``, ``v``).

    Recomputes each tile of weights from the logsumexp, :math:`P = e^{S -
    \mathrm{lse}}`, and never stores more than one tile:

    .. math::

        dV \mathrel{+}= P^\top dO,\quad dP = dO\, V^\top,\quad
        dS = P \circ (dP - \delta),\quad dQ \mathrel{+}= dS\, K \cdot
        \text{scale},\quad dK \mathrel{+}= dS^\top Q \cdot \text{scale}

    with :math:`\delta` = ``delta`` ``(BH, R)``, which is
    :math:`\mathrm{rowsum}(dO \circ O)` minus the gradient of the logsumexp.
    """
    BH, R, _ = p.q.shape
    S = p.k.shape[1]
    acc = p.acc_dtype
    dq = torch.zeros(p.q.shape, dtype=acc, device=p.q.device)
    dk = torch.zeros(p.k.shape, dtype=acc, device=p.q.device)
    dv = torch.zeros(p.v.shape, dtype=acc, device=p.q.device)
    if BH == 0 or R == 0 or S == 0:
        return dq, dk, dv
    # Rows with nothing to attend have lse = -inf and only -inf scores: any finite
    # stand-in gives them weights 2^(-inf) = 0.
    lse2 = (lse.to(acc) * LOG2E).masked_fill(torch.isneginf(lse), 0.0)
    grads = (dq, dk, dv, grad_out, lse2, delta.to(acc))
    workers = _workers(p.q.device, BH)
    if BH >= workers:  # whole heads per worker: no two workers write one gradient row
        # Heads share a tile while it is small (one (heads, bq, bk) tile of each kind
        # per unit), so that short sequences cost a few batched operations, not a
        # few per head; the units stay at least as many as the workers.
        bq, bk = min(p.block_q, R), min(p.block_k, S)
        heads = min(_heads_per_tile(BH, bq, bk), -(-BH // workers))
        units = [(h0, min(h0 + heads, BH)) for h0 in range(0, BH, heads)]
        _run(_backward_heads, units, [h1 - h0 for h0, h1 in units], p, *grads)
    else:  # few heads: split the keys, each worker sums its own dq, added at the end
        blocks = list(range(0, S, p.block_k))
        shares = [blocks[i::workers] for i in range(workers)]
        dqs = [dq] + [torch.zeros_like(dq) for _ in shares[1:]]
        _parallel(
            [
                (
                    _backward_heads,
                    [(0, BH)],
                    p,
                    dq_i,
                    dk,
                    dv,
                    grad_out,
                    lse2,
                    grads[5],
                    share,
                )
                for dq_i, share in zip(dqs, shares, strict=True)
            ]
        )
        for extra in dqs[1:]:
            dq.add_(extra)
    dq.mul_(p.scale)  # dS is the gradient of the natural-unit scores s = scale q k^T
    dk.mul_(p.scale)
    return dq, dk, dv


def _backward_heads(
    units: Sequence[tuple[int, int]],
    p: Problem,
    dq: Tensor,
    dk: Tensor,
    dv: Tensor,
    grad_out: Tensor,
    lse2: Tensor,
    delta: Tensor,
    blocks: Sequence[int] | None = None,
) -> None:
    """Accumulate the gradients of the heads in ``units`` (key blocks ``blocks``)."""
    acc = p.acc_dtype
    S, R = p.k.shape[1], p.q.shape[1]
    bq, bk = min(p.block_q, R), min(p.block_k, S)
    c = p.scale * LOG2E
    for h0, h1 in units:
        n_h = h1 - h0
        tiles = dq.new_empty((2, n_h * bq * bk))
        qh = p.q[h0:h1].to(acc)  # (heads, R, D): a view for float32
        do = grad_out[h0:h1].to(acc)
        for k0 in range(0, S, p.block_k) if blocks is None else blocks:
            k1 = min(k0 + p.block_k, S)
            kb = p.k[h0:h1, k0:k1].to(acc)  # (heads, bk, D)
            vt = p.v[h0:h1, k0:k1].to(acc).transpose(1, 2)  # (heads, Dv, bk)
            dk_b, dv_b = dk[h0:h1, k0:k1], dv[h0:h1, k0:k1]  # accumulated in place
            for r0 in range(0, R, p.block_q):
                r1 = min(r0 + p.block_q, R)
                if p.key_end(r0, r1) <= k0:  # causal: the whole tile is masked
                    continue
                shape = (n_h, r1 - r0, k1 - k0)
                n = math.prod(shape)
                qb = qh[:, r0:r1]
                s = tiles[0, :n].view(shape)
                # s = c q k^T: the GEMM applies the scale (alpha), so no scaled copy
                # of q is needed (beta=0: the GEMM writes s without reading it)
                torch.baddbmm(s, qb, kb.transpose(1, 2), beta=0.0, alpha=c, out=s)
                p.add_bias(s, h0, h1, r0, r1, k0)
                keep = p.tile_keep(h0, h1, r0, r1, k0, k1)
                if keep is not None:
                    s.masked_fill_(~keep, float("-inf"))
                pt = s.sub_(lse2[h0:h1, r0:r1, None]).exp2_()  # the weights P
                dv_b.baddbmm_(pt.transpose(1, 2), do[:, r0:r1])
                dp = tiles[1, :n].view(shape)
                torch.baddbmm(dp, do[:, r0:r1], vt, beta=0.0, out=dp)
                ds = dp.sub_(delta[h0:h1, r0:r1, None]).mul_(pt)  # P o (dP - delta)
                dq[h0:h1, r0:r1].baddbmm_(ds, kb)
                dk_b.baddbmm_(ds.transpose(1, 2), qb)


# --------------------------------------------------------------------------------------
# Workers
# --------------------------------------------------------------------------------------


def _heads_per_tile(BH: int, bq: int, bk: int) -> int:
    return max(1, min(BH, TILE_ELEMENTS // max(1, bq * bk)))


def _workers(device: torch.device, units: int) -> int:
    if device.type != "cpu":
        return 1  # one stream of GPU kernels; the device parallelizes
    if functorch_active():
        return 1  # torch.func's wrapped tensors live in this thread only
    return max(1, min(torch.get_num_threads(), units))


def _run(
    fn: Callable[..., None],
    units: Sequence[Any],
    cost: Sequence[int],
    p: Problem,
    *args: Any,
) -> None:
    """Share ``units`` among the workers, the costliest first to the least loaded."""
    workers = _workers(p.q.device, len(units))
    shares: list[list[Any]] = [[] for _ in range(workers)]
    load = [0] * workers
    for i in sorted(range(len(units)), key=lambda i: -cost[i]):
        w = load.index(min(load))
        shares[w].append(units[i])
        load[w] += cost[i]
    _parallel([(fn, share, p, *args) for share in shares if share])


_POOL: ThreadPoolExecutor | None = None


def _parallel(jobs: Sequence[Sequence[Any]]) -> None:
    """Run ``fn(*args)`` for each ``(fn, *args)`` in ``jobs``, one per worker thread."""
    if len(jobs) == 1:
        fn, *args = jobs[0]
        with torch.no_grad():
            fn(*args)
        return
    global _POOL
    if _POOL is None or _POOL._max_workers < len(jobs):
        if _POOL is not None:
            _POOL.shutdown(wait=False)
        _POOL = ThreadPoolExecutor(len(jobs), thread_name_prefix="softmaxbook-flash")
    inference = torch.is_inference_mode_enabled()
    futures = [_POOL.submit(_in_worker, inference, *job) for job in jobs]
    for future in futures:
        future.result()


def _in_worker(inference: bool, fn: Callable[..., None], *args: Any) -> None:
    # Each worker runs its torch operations inline, on one thread: one
    # single-threaded worker per core beats many short multi-threaded operations,
    # whose synchronization dominates on a busy machine. Grad mode and inference
    # mode are per thread: the caller's are carried over.
    torch.set_num_threads(1)
    with torch.inference_mode(inference), torch.no_grad():
        return fn(*args)
