"""The Triton kernels and their launchers. Imported only on first use (it imports
Triton).

Every kernel here follows the same plan: one *program* (a block of GPU
threads) owns a piece of the output, loads what it needs from global memory once,
computes in registers and writes its piece once. Triton compiles each
``@triton.jit`` function for the GPU, or, with ``TRITON_INTERPRET=1``, runs it
program by program in NumPy on the CPU.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_kernel(x_ptr, y_ptr, n_cols, stride_x, stride_y, BLOCK: tl.constexpr):
    # One program per row: the row is loaded once, normalized on chip, stored once.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    # Padding lanes read -inf, so they add exp(-inf) = 0 to the sum.
    x = tl.load(x_ptr + row * stride_x + cols, mask=inside, other=float("-inf")).to(
        tl.float32
    )
    x = x - tl.max(x, axis=0)  # the stable shift: every exponent is <= 0
    e = tl.exp(x)
    y = e / tl.sum(e, axis=0)
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _flash_attention_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, out_ptr, lse_ptr,
    sq_b, sq_r, sq_d, sk_b, sk_s, sk_d, sv_b, sv_s, sv_d, sm_b, sm_r, sm_s,
    so_b, so_r, so_d,
    R, S, D, DV, scale_log2, period, offset,
    HAS_MASK: tl.constexpr, IS_CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    # Program (i, b) owns query rows [i * BLOCK_M, (i + 1) * BLOCK_M) of problem b.
    b = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    in_rows = rows < R

    # The query block is loaded once and stays in registers for the whole loop.
    q = tl.load(
        q_ptr + b * sq_b + rows[:, None] * sq_r + offs_d[None, :] * sq_d,
        mask=in_rows[:, None] & (offs_d[None, :] < D),
        other=0.0,
    )
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running maximum, base 2
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of 2^(s - m)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)  # unnormalized output

    hi = S
    if IS_CAUSAL:  # row r sees keys j <= r % period + offset: later tiles are masked
        last = rows % period + offset
        hi = tl.minimum(S, tl.max(tl.where(in_rows, last, -1)) + 1)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        kt = tl.load(
            k_ptr + b * sk_b + cols[None, :] * sk_s + offs_d[:, None] * sk_d,
            mask=(cols[None, :] < S) & (offs_d[:, None] < D),
            other=0.0,
        )  # (D, N): K^T
        # Scores in base 2: log2(e) is folded into the scale, and exp2 replaces exp.
        s = tl.dot(q, kt, input_precision=PRECISION) * scale_log2  # (M, N), on chip
        keep = cols[None, :] < S
        if IS_CAUSAL:
            keep = keep & (cols[None, :] <= last[:, None])
        if HAS_MASK:
            allowed = tl.load(
                mask_ptr + b * sm_b + rows[:, None] * sm_r + cols[None, :] * sm_s,
                mask=in_rows[:, None] & (cols[None, :] < S),
                other=0,
            )
            keep = keep & (allowed != 0)
        s = tl.where(keep, s, float("-inf"))

        # The online softmax update: new maximum, rescale the old state, add this tile.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key yet: no nan
        p = tl.exp2(s - shift[:, None])
        alpha = tl.exp2(m_i - shift)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            v_ptr + b * sv_b + cols[:, None] * sv_s + offs_dv[None, :] * sv_d,
            mask=(cols[:, None] < S) & (offs_dv[None, :] < DV),
            other=0.0,
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    nonzero = l_i > 0  # false only for rows with nothing to attend: they give zeros
    l_safe = tl.where(nonzero, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(nonzero, (m_i + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    tl.store(
        out_ptr + b * so_b + rows[:, None] * so_r + offs_dv[None, :] * so_d,
        out.to(out_ptr.dtype.element_ty),
        mask=in_rows[:, None] & (offs_dv[None, :] < DV),
    )
    tl.store(lse_ptr + b * R + rows, lse, mask=in_rows)


@triton.jit
def _flash_attention_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, do_ptr, lse2_ptr, delta_ptr, dk_ptr, dv_ptr,
    sq_b, sq_r, sq_d, sk_b, sk_s, sk_d, sv_b, sv_s, sv_d, sm_b, sm_r, sm_s,
    sdo_b, sdo_r, sdo_d,
    R, S, D, DV, scale, scale_log2, period, offset,
    HAS_MASK: tl.constexpr, IS_CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    # Program (j, b) owns key rows [j * BLOCK_N, (j + 1) * BLOCK_N) of problem b: it
    # keeps their dK and dV in registers while every query block streams past.
    b = tl.program_id(1).to(tl.int64)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    in_cols = cols < S
    k = tl.load(
        k_ptr + b * sk_b + cols[:, None] * sk_s + offs_d[None, :] * sk_d,
        mask=in_cols[:, None] & (offs_d[None, :] < D),
        other=0.0,
    )  # (N, D)
    v = tl.load(
        v_ptr + b * sv_b + cols[:, None] * sv_s + offs_dv[None, :] * sv_d,
        mask=in_cols[:, None] & (offs_dv[None, :] < DV),
        other=0.0,
    )  # (N, DV)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    for start_m in range(0, R, BLOCK_M):
        rows = start_m + offs_m
        in_rows = rows < R
        q = tl.load(
            q_ptr + b * sq_b + rows[:, None] * sq_r + offs_d[None, :] * sq_d,
            mask=in_rows[:, None] & (offs_d[None, :] < D),
            other=0.0,
        )
        do = tl.load(
            do_ptr + b * sdo_b + rows[:, None] * sdo_r + offs_dv[None, :] * sdo_d,
            mask=in_rows[:, None] & (offs_dv[None, :] < DV),
            other=0.0,
        )
        lse2 = tl.load(lse2_ptr + b * R + rows, mask=in_rows, other=0.0)
        delta = tl.load(delta_ptr + b * R + rows, mask=in_rows, other=0.0)
        # Recompute this tile of weights from the logsumexp: P = 2^(s - lse2).
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2  # (M, N)
        keep = in_rows[:, None] & in_cols[None, :]
        if IS_CAUSAL:
            keep = keep & (cols[None, :] <= (rows % period + offset)[:, None])
        if HAS_MASK:
            allowed = tl.load(
                mask_ptr + b * sm_b + rows[:, None] * sm_r + cols[None, :] * sm_s,
                mask=in_rows[:, None] & in_cols[None, :],
                other=0,
            )
            keep = keep & (allowed != 0)
        p = tl.where(keep, tl.exp2(s - lse2[:, None]), 0.0)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PRECISION)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)  # (M, N)
        ds = p * (dp - delta[:, None])  # P o (dP - delta): the scores' gradient
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
    tl.store(
        dk_ptr + b * S * D + cols[:, None] * D + offs_d[None, :],
        dk * scale,
        mask=in_cols[:, None] & (offs_d[None, :] < D),
    )
    tl.store(
        dv_ptr + b * S * DV + cols[:, None] * DV + offs_dv[None, :],
        dv,
        mask=in_cols[:, None] & (offs_dv[None, :] < DV),
    )


@triton.jit
def _flash_attention_dq_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, do_ptr, lse2_ptr, delta_ptr, dq_ptr,
    sq_b, sq_r, sq_d, sk_b, sk_s, sk_d, sv_b, sv_s, sv_d, sm_b, sm_r, sm_s,
    sdo_b, sdo_r, sdo_d,
    R, S, D, DV, scale, scale_log2, period, offset,
    HAS_MASK: tl.constexpr, IS_CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    # Program (i, b) owns query rows [i * BLOCK_M, (i + 1) * BLOCK_M): it keeps their
    # dQ in registers while the key and value tiles stream past (no atomics needed).
    b = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    in_rows = rows < R
    q = tl.load(
        q_ptr + b * sq_b + rows[:, None] * sq_r + offs_d[None, :] * sq_d,
        mask=in_rows[:, None] & (offs_d[None, :] < D),
        other=0.0,
    )
    do = tl.load(
        do_ptr + b * sdo_b + rows[:, None] * sdo_r + offs_dv[None, :] * sdo_d,
        mask=in_rows[:, None] & (offs_dv[None, :] < DV),
        other=0.0,
    )
    lse2 = tl.load(lse2_ptr + b * R + rows, mask=in_rows, other=0.0)
    delta = tl.load(delta_ptr + b * R + rows, mask=in_rows, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    hi = S
    if IS_CAUSAL:
        last = rows % period + offset
        hi = tl.minimum(S, tl.max(tl.where(in_rows, last, -1)) + 1)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        in_cols = cols < S
        k = tl.load(
            k_ptr + b * sk_b + cols[:, None] * sk_s + offs_d[None, :] * sk_d,
            mask=in_cols[:, None] & (offs_d[None, :] < D),
            other=0.0,
        )
        v = tl.load(
            v_ptr + b * sv_b + cols[:, None] * sv_s + offs_dv[None, :] * sv_d,
            mask=in_cols[:, None] & (offs_dv[None, :] < DV),
            other=0.0,
        )
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
        keep = in_rows[:, None] & in_cols[None, :]
        if IS_CAUSAL:
            keep = keep & (cols[None, :] <= last[:, None])
        if HAS_MASK:
            allowed = tl.load(
                mask_ptr + b * sm_b + rows[:, None] * sm_r + cols[None, :] * sm_s,
                mask=in_rows[:, None] & in_cols[None, :],
                other=0,
            )
            keep = keep & (allowed != 0)
        p = tl.where(keep, tl.exp2(s - lse2[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    tl.store(
        dq_ptr + b * R * D + rows[:, None] * D + offs_d[None, :],
        dq * scale,
        mask=in_rows[:, None] & (offs_d[None, :] < D),
    )


def softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Launch :func:`_softmax_kernel` over every row of ``x`` along ``dim`` (checked by
    the caller)."""
    if x.dim() == 0:
        return softmax(x.reshape(1), 0).reshape(())
    xt = x.movedim(dim, -1)
    shape = xt.shape
    n_cols = shape[-1] if xt.dim() else 1
    x2 = xt.reshape(-1, n_cols)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y2 = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.numel():
        block = triton.next_power_of_2(n_cols)
        warps = 4 if block <= 2048 else 8 if block <= 8192 else 16
        _softmax_kernel[(x2.shape[0],)](
            x2, y2, n_cols, x2.stride(0), y2.stride(0), BLOCK=block, num_warps=warps
        )
    return y2.reshape(shape).movedim(-1, dim)


_LOG2E = math.log2(math.e)
#: Software-pipeline depth of the forward kernel: while one tile of keys and values
#: is used, the next is already loading into shared memory. ``tools/gpu_report.py``
#: compiles with what the launchers use.
FORWARD_STAGES = 2
#: The backward kernels' depth: Triton's default for CUDA, passed explicitly so that
#: ``flash_launch_config(backward=True)`` and the GPU report state what they launch.
BACKWARD_STAGES = 3


class Flat(NamedTuple):
    """One attention call on the flat layout: ``q`` ``(BH, R, D)``, ``k`` ``(BH, S,
    D)``, ``v`` ``(BH, S, Dv)``, ``keep`` ``(BH, R, S)`` bool or None, ``causal``
    ``(period, offset)`` (row ``r`` sees keys ``j <= r % period + offset``) or None."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    keep: torch.Tensor | None
    causal: tuple[int, int] | None
    scale: float


def _launch_args(
    p: Flat, *, backward: bool = False
) -> tuple[
    torch.Tensor,
    tuple[int, ...],
    tuple[int, int, int, int],
    tuple[int, int],
    dict[str, Any],
]:
    """What the three attention kernels share: the strides and the constants.

    The tiles are sized for the smallest GPU targeted, the A100 (sm_80: 163 KiB of
    shared memory per block, 255 registers per thread), as ``make gpu-report`` checks
    for sm_80, sm_90 and sm_100: 64-row tiles while a row of the widest tile takes at
    most 256 bytes (head dimension 128 in 16-bit types, 64 in float32), 32-row tiles
    beyond; 8 warps for the backward kernels at that width, whose two float32
    accumulators would otherwise spill registers on sm_80. float32 inputs take exact
    products on the FMA units, which need the most registers: 16-row tiles and 8 warps
    for their backward, 16 warps for their forward, so that none spills on sm_80,
    sm_90 or sm_100."""
    R, S, D, DV = p.q.shape[1], p.k.shape[1], p.q.shape[2], p.v.shape[2]
    if p.keep is not None:
        mask = p.keep.view(torch.uint8)  # bool as bytes: a view, no copy
    else:
        mask = torch.ones((1, 1, 1), dtype=torch.uint8, device=p.q.device)  # unread
    period, offset = (1, 0) if p.causal is None else p.causal
    block_d = max(16, triton.next_power_of_2(D))
    block_dv = max(16, triton.next_power_of_2(DV))
    row_bytes = max(block_d, block_dv) * p.q.element_size()
    exact = p.q.dtype == torch.float32  # "ieee" products: FMAs, no tensor cores
    block = 16 if exact and backward else 64 if row_bytes <= 256 else 32
    strides = (*p.q.stride(), *p.k.stride(), *p.v.stride(), *mask.stride())
    if exact:
        warps = 8 if backward else 16
    else:
        warps = 8 if backward and row_bytes >= 256 else 4
    consts: dict[str, Any] = {
        "HAS_MASK": p.keep is not None,
        "IS_CAUSAL": p.causal is not None,
        "PRECISION": "ieee" if p.q.dtype == torch.float32 else "tf32",
        "BLOCK_M": block,
        "BLOCK_N": block,
        "BLOCK_D": block_d,
        "BLOCK_DV": block_dv,
        "num_warps": warps,
    }
    return mask, strides, (R, S, D, DV), (period, offset), consts


def flash_forward(p: Flat) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch :func:`_flash_attention_kernel` on a :class:`Flat` problem (checked by
    the caller); returns ``(out, lse)``, ``out`` in the dtype of ``q``."""
    BH, R, _ = p.q.shape
    S, DV = p.k.shape[1], p.v.shape[2]
    out = torch.zeros((BH, R, DV), dtype=p.q.dtype, device=p.q.device)
    lse = torch.full((BH, R), float("-inf"), dtype=torch.float32, device=p.q.device)
    if BH and R and S:
        mask, strides, sizes, causal, consts = _launch_args(p)
        grid = (triton.cdiv(R, consts["BLOCK_M"]), BH)
        _flash_attention_kernel[grid](
            p.q, p.k, p.v, mask, out, lse, *strides, *out.stride(),
            *sizes, float(p.scale * _LOG2E), *causal, num_stages=FORWARD_STAGES,
            **consts,
        )  # fmt: skip
    return out, lse


def flash_backward(
    p: Flat, grad_out: torch.Tensor, lse: torch.Tensor, delta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the two backward kernels; returns ``(dq, dk, dv)`` in float32."""
    BH, R, D = p.q.shape
    S, DV = p.k.shape[1], p.v.shape[2]
    dev = p.q.device
    dq = torch.zeros((BH, R, D), dtype=torch.float32, device=dev)
    dk = torch.zeros((BH, S, D), dtype=torch.float32, device=dev)
    dv = torch.zeros((BH, S, DV), dtype=torch.float32, device=dev)
    if not (BH and R and S):
        return dq, dk, dv
    # Rows with nothing to attend have lse = -inf: any finite stand-in gives them
    # weights 2^(-inf) = 0 (their scores are all masked).
    lse2 = (lse.float() * _LOG2E).masked_fill(torch.isneginf(lse), 0.0).contiguous()
    delta = delta.float().contiguous()
    grad_out = grad_out.to(p.q.dtype)
    mask, strides, sizes, causal, consts = _launch_args(p, backward=True)
    common = (*strides, *grad_out.stride(), *sizes, float(p.scale))
    common += (float(p.scale * _LOG2E), *causal)
    _flash_attention_dkdv_kernel[(triton.cdiv(S, consts["BLOCK_N"]), BH)](
        p.q, p.k, p.v, mask, grad_out, lse2, delta, dk, dv, *common,
        num_stages=BACKWARD_STAGES, **consts,
    )  # fmt: skip
    _flash_attention_dq_kernel[(triton.cdiv(R, consts["BLOCK_M"]), BH)](
        p.q, p.k, p.v, mask, grad_out, lse2, delta, dq, *common,
        num_stages=BACKWARD_STAGES, **consts,
    )  # fmt: skip
    return dq, dk, dv
