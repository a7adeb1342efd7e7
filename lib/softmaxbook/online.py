r"""Online (streaming) softmax: the normalizer in one pass over the data.

Milakov & Gimelshein (2018) observed that the maximum and the sum of
exponentials of a row can be accumulated together, block by block, if the
running sum is rescaled whenever the running maximum grows. This is the idea
that lets FlashAttention compute attention without ever holding a whole row
of scores.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_dim, check_float, check_positive_int

__all__ = ["online_softmax"]


def online_softmax(x: Tensor, dim: int = -1, *, block_size: int = 128) -> Tensor:
    r"""Softmax computed block by block with a running maximum and a rescaled running sum.

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
    acc = torch.promote_types(x.dtype, torch.float32)
    xt = x.movedim(dim, -1).to(acc)  # (..., N)
    m = torch.full(xt.shape[:-1] + (1,), float("-inf"), dtype=acc, device=x.device)
    d = torch.zeros_like(m)
    for start in range(0, xt.shape[-1], block_size):
        block = xt[..., start:start + block_size]
        m_new = torch.maximum(m, block.amax(dim=-1, keepdim=True))
        # An all -inf prefix has m_new = -inf: shift by 0 instead, to keep exp(-inf - -inf) out.
        shift = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
        d = d * torch.exp(m - shift) + torch.exp(block - shift).sum(dim=-1, keepdim=True)
        m = m_new
    shift = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    p = torch.exp(xt - shift) / torch.where(d > 0, d, torch.ones_like(d))
    return p.to(x.dtype).movedim(-1, dim)
