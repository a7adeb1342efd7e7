"""The `flash-attention` assignment: the tiled forward and backward passes."""

import math
from typing import Any

import torch
from torch import Tensor

#: The tiles of the backward pass (the forward pass takes its own as arguments).
BLOCK_Q = 16
BLOCK_K = 16


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # float16 and bfloat16 tiles are accumulated in float32, as FlashAttention does.
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _causal_tile(i0: int, i1: int, j0: int, j1: int, offset: int) -> Tensor:
    """True where key j may be seen by query i: j <= i + offset (bottom-right)."""
    i = torch.arange(i0, i1)[:, None]
    j = torch.arange(j0, j1)[None, :]
    return j <= i + offset


def flash_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    is_causal: bool = False,
    block_q: int = 16,
    block_k: int = 16,
) -> tuple[Tensor, Tensor]:
    """Tiled attention: (out (..., L, Dv), lse (..., L)), lse in natural log.

    ``lse[i] = log sum_j exp(q_i . k_j / sqrt(D))`` over the keys query i may see;
    a query that sees none gets out 0 and lse -inf.
    """
    # Per block of queries: a running maximum m, a running sum l of exp(s - m) and
    # an unnormalized output, both rescaled by exp(m - m_new) when m grows.
    L, S = q.shape[-2], k.shape[-2]
    dtype = _compute_dtype(q.dtype)
    scale = 1 / math.sqrt(q.shape[-1])
    offset = S - L  # bottom-right alignment
    outs, lses = [], []
    for i0 in range(0, L, block_q):
        i1 = min(i0 + block_q, L)
        qi = q[..., i0:i1, :].to(dtype) * scale
        m = qi.new_full(qi.shape[:-1] + (1,), -math.inf)
        l = qi.new_zeros(qi.shape[:-1] + (1,))  # noqa: E741
        acc = qi.new_zeros(qi.shape[:-1] + (v.shape[-1],))
        for j0 in range(0, S, block_k):
            j1 = min(j0 + block_k, S)
            if is_causal and j0 > i1 - 1 + offset:
                break  # this tile and every later one is above the diagonal
            s = qi @ k[..., j0:j1, :].to(dtype).transpose(-2, -1)  # (..., bq, bk)
            if is_causal:
                s = s.masked_fill(~_causal_tile(i0, i1, j0, j1, offset), -math.inf)
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            m_safe = m_new.masked_fill(torch.isneginf(m_new), 0.0)
            p = torch.exp(s - m_safe)
            alpha = torch.exp(m - m_safe)  # rescales what was summed so far
            l = l * alpha + p.sum(dim=-1, keepdim=True)  # noqa: E741
            acc = acc * alpha + p @ v[..., j0:j1, :].to(dtype)
            m = m_new
        empty = l == 0  # nothing to attend to
        outs.append(acc / l.masked_fill(empty, 1.0))
        m_safe = m.masked_fill(empty, 0.0)
        lse = (m_safe + torch.log(l.masked_fill(empty, 1.0))).masked_fill(
            empty, -math.inf
        )
        lses.append(lse.squeeze(-1))
    return torch.cat(outs, dim=-2).to(q.dtype), torch.cat(lses, dim=-1)


def flash_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    grad_output: Tensor,
    is_causal: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) from the forward pass's q, k, v, out, lse and dL/d out."""
    # Each tile's weights are recomputed as P = exp(s - lse); with
    # Delta = rowsum(dO * O): dV += P^T dO, dS = P * (dO V^T - Delta),
    # dQ += dS K / sqrt(D), dK += dS^T Q / sqrt(D).
    L, S = q.shape[-2], k.shape[-2]
    dtype = _compute_dtype(q.dtype)
    scale = 1 / math.sqrt(q.shape[-1])
    offset = S - L
    qs, ks, vs = q.to(dtype), k.to(dtype), v.to(dtype)
    do = grad_output.to(dtype)
    delta = (do * out.to(dtype)).sum(dim=-1, keepdim=True)  # (..., L, 1)
    lse_safe = lse.to(dtype).masked_fill(torch.isneginf(lse), 0.0).unsqueeze(-1)
    dq_blocks = [
        torch.zeros_like(qs[..., i0 : i0 + BLOCK_Q, :]) for i0 in range(0, L, BLOCK_Q)
    ]
    dk_blocks, dv_blocks = [], []
    for j0 in range(0, S, BLOCK_K):
        j1 = min(j0 + BLOCK_K, S)
        kj, vj = ks[..., j0:j1, :], vs[..., j0:j1, :]
        dk = torch.zeros_like(kj)
        dv = torch.zeros_like(vj)
        for n, i0 in enumerate(range(0, L, BLOCK_Q)):
            i1 = min(i0 + BLOCK_Q, L)
            if is_causal and j0 > i1 - 1 + offset:
                continue
            s = qs[..., i0:i1, :] @ kj.transpose(-2, -1) * scale
            if is_causal:
                s = s.masked_fill(~_causal_tile(i0, i1, j0, j1, offset), -math.inf)
            p = torch.exp(s - lse_safe[..., i0:i1, :])  # a row that sees nothing: 0
            doi = do[..., i0:i1, :]
            dv = dv + p.transpose(-2, -1) @ doi
            ds = p * (doi @ vj.transpose(-2, -1) - delta[..., i0:i1, :])
            dq_blocks[n] = dq_blocks[n] + ds @ kj * scale
            dk = dk + ds.transpose(-2, -1) @ qs[..., i0:i1, :] * scale
        dk_blocks.append(dk)
        dv_blocks.append(dv)
    return (
        torch.cat(dq_blocks, dim=-2).to(q.dtype),
        torch.cat(dk_blocks, dim=-2).to(k.dtype),
        torch.cat(dv_blocks, dim=-2).to(v.dtype),
    )


class FlashAttention(torch.autograd.Function):
    """Attention whose backward pass saves q, k, v, out and lse, never the weights."""

    @staticmethod
    def forward(
        ctx: Any, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False
    ) -> Tensor:
        out, lse = flash_forward(q, k, v, is_causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal = is_causal
        return out

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = flash_backward(q, k, v, out, lse, grad_output, ctx.is_causal)
        return dq, dk, dv, None
