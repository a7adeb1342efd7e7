"""The `gradients` assignment: the backward pass of softmax and attention, by hand."""

import math

import torch
from torch import Tensor


def softmax_backward(s: Tensor, grad_output: Tensor, dim: int = -1) -> Tensor:
    """dL/dx for s = softmax(x, dim), given s and grad_output = dL/ds (same shape)."""
    # ds_i/dx_j = s_i (delta_ij - s_j), so (g^T J)_j = s_j (g_j - sum_i s_i g_i): the
    # sum couples every entry of the slice through the denominator.
    return s * (grad_output - (s * grad_output).sum(dim=dim, keepdim=True))


def _masked_softmax(scores: Tensor, keep: Tensor) -> Tensor:
    filled = scores.masked_fill(~keep, -math.inf)
    m = filled.amax(dim=-1, keepdim=True)
    empty = torch.isneginf(m)
    e = torch.exp(filled - m.masked_fill(empty, 0.0))
    return e / e.sum(dim=-1, keepdim=True).masked_fill(empty, 1.0)


def attention_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    grad_output: Tensor,
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) for out = softmax(q k^T / sqrt(D), masked) v and dL/d out.

    Shapes: q (..., L, D), k (..., S, D), v (..., S, Dv), grad_output (..., L, Dv).
    """
    scale = 1 / math.sqrt(q.shape[-1])
    scores = q @ k.transpose(-2, -1) * scale  # (..., L, S)
    keep = torch.ones_like(scores, dtype=torch.bool)
    if mask is not None:
        keep = keep & mask.to(torch.bool)
    p = _masked_softmax(scores, keep)
    dv = p.transpose(-2, -1) @ grad_output  # (..., S, Dv)
    dp = grad_output @ v.transpose(-2, -1)  # (..., L, S)
    ds = softmax_backward(p, dp)  # masked entries and empty rows: p = 0, so ds = 0
    dq = ds @ k * scale
    dk = ds.transpose(-2, -1) @ q * scale
    return dq, dk, dv
