"""The Triton kernels and their launchers. Imported only on first use (it imports
Triton).

Both kernels follow the same plan: one *program* (a block of GPU threads)
owns a piece of the output, loads what it needs from global memory once,
computes in registers and writes its piece once. Triton compiles each
``@triton.jit`` function for the GPU, or, with ``TRITON_INTERPRET=1``, runs it
program by program in NumPy on the CPU.
"""

from __future__ import annotations

import math

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
    q_ptr,
    k_ptr,
    v_ptr,
    mask_ptr,
    out_ptr,
    lse_ptr,
    sq_b,
    sq_h,
    sq_l,
    sq_d,
    sk_b,
    sk_h,
    sk_s,
    sk_d,
    sv_b,
    sv_h,
    sv_s,
    sv_d,
    sm_b,
    sm_h,
    sm_l,
    sm_s,
    so_b,
    so_h,
    so_l,
    so_d,
    H,
    L,
    S,
    D,
    DV,
    scale,
    HAS_MASK: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    # Program (i, bh) owns query rows [i * BLOCK_M, (i + 1) * BLOCK_M) of batch-head bh.
    start_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)

    # The query block is loaded once and stays in registers for the whole loop.
    q = tl.load(
        q_ptr + b * sq_b + h * sq_h + rows[:, None] * sq_l + offs_d[None, :] * sq_d,
        mask=(rows[:, None] < L) & (offs_d[None, :] < D),
        other=0.0,
    )
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running maximum
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exponentials
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)  # unnormalized output

    if IS_CAUSAL:
        hi = tl.minimum(
            S, (start_m + 1) * BLOCK_M
        )  # later keys are masked for every row here
    else:
        hi = S
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        kt = tl.load(
            k_ptr + b * sk_b + h * sk_h + cols[None, :] * sk_s + offs_d[:, None] * sk_d,
            mask=(cols[None, :] < S) & (offs_d[:, None] < D),
            other=0.0,
        )  # (D, N): K^T
        s = (
            tl.dot(q, kt, input_precision=PRECISION) * scale
        )  # (M, N) scores, on chip only
        keep = cols[None, :] < S
        if IS_CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None])
        if HAS_MASK:
            m_ptrs = (
                mask_ptr
                + b * sm_b
                + h * sm_h
                + rows[:, None] * sm_l
                + cols[None, :] * sm_s
            )
            allowed = tl.load(
                m_ptrs, mask=(rows[:, None] < L) & (cols[None, :] < S), other=0
            )
            keep = keep & (allowed != 0)
        s = tl.where(keep, s, float("-inf"))

        # The online softmax update: new maximum, rescale the old state, add this tile.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        shift = tl.where(
            m_new == float("-inf"), 0.0, m_new
        )  # no key yet: avoid -inf - -inf
        p = tl.exp(s - shift[:, None])
        alpha = tl.exp(m_i - shift)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            v_ptr
            + b * sv_b
            + h * sv_h
            + cols[:, None] * sv_s
            + offs_dv[None, :] * sv_d,
            mask=(cols[:, None] < S) & (offs_dv[None, :] < DV),
            other=0.0,
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    nonzero = l_i > 0  # false only for rows with nothing to attend: they give zeros
    l_safe = tl.where(nonzero, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(nonzero, m_i + tl.log(l_safe), float("-inf"))
    tl.store(
        out_ptr + b * so_b + h * so_h + rows[:, None] * so_l + offs_dv[None, :] * so_d,
        out.to(out_ptr.dtype.element_ty),
        mask=(rows[:, None] < L) & (offs_dv[None, :] < DV),
    )
    tl.store(lse_ptr + bh * L + rows, lse, mask=rows < L)


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


def _as_bh(t: torch.Tensor, batch: tuple) -> torch.Tensor:
    """View ``t`` (batch dims ``batch``, then two more) as ``(B, H, ., .)``; copies only
    if it must."""
    t = t.expand(batch + t.shape[-2:])
    if len(batch) == 0:
        return t.reshape((1, 1) + t.shape)
    if len(batch) == 1:
        return t.unsqueeze(0)
    return t.reshape((math.prod(batch[:-1]),) + t.shape[-3:])


def flash_attention(q, k, v, batch, keep, is_causal, scale):
    """Launch :func:`_flash_attention_kernel` (arguments checked by the caller)."""
    L, S, D, DV = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    qb, kb, vb = _as_bh(q, batch), _as_bh(k, batch), _as_bh(v, batch)
    B, H = qb.shape[0], qb.shape[1]
    out = torch.zeros((B, H, L, DV), dtype=q.dtype, device=q.device)
    lse = torch.full((B, H, L), float("-inf"), dtype=torch.float32, device=q.device)
    if B * H and L and S:
        if keep is not None:
            mb = _as_bh(keep.view(torch.uint8), batch)  # bool as bytes: a view, no copy
        else:
            mb = torch.ones(
                (1, 1, 1, 1), dtype=torch.uint8, device=q.device
            )  # never read
        block_d = max(16, triton.next_power_of_2(D))
        block_dv = max(16, triton.next_power_of_2(DV))
        block_m = 64 if max(block_d, block_dv) <= 128 else 32
        block_n = block_m
        grid = (triton.cdiv(L, block_m), B * H)
        _flash_attention_kernel[grid](
            qb,
            kb,
            vb,
            mb,
            out,
            lse,
            *qb.stride(),
            *kb.stride(),
            *vb.stride(),
            *mb.stride(),
            *out.stride(),
            H,
            L,
            S,
            D,
            DV,
            float(scale),
            HAS_MASK=keep is not None,
            IS_CAUSAL=bool(is_causal),
            PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            BLOCK_D=block_d,
            BLOCK_DV=block_dv,
            num_warps=4,
            num_stages=2,
        )
    return out.reshape(batch + (L, DV)), lse.reshape(batch + (L,))
