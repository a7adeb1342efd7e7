"""The `attention` assignment: masked softmax and scaled dot-product attention."""

import math

import torch
from torch import Tensor


def masked_softmax(scores: Tensor, mask: Tensor, dim: int = -1) -> Tensor:
    """Softmax along ``dim`` over the entries where ``mask`` is True (may attend).

    ``mask`` is boolean and broadcasts against ``scores``. A slice with nothing to
    attend to gives zeros, in the forward and in the backward pass.
    """
    keep = mask.to(torch.bool).expand_as(scores)
    filled = scores.masked_fill(~keep, -math.inf)
    m = filled.amax(dim=dim, keepdim=True)
    empty = torch.isneginf(m)  # nothing to attend to
    # exp(-inf - 0) = 0 for every masked entry; an empty slice sums to 0 and is
    # divided by 1, so neither pass ever meets -inf - (-inf) or 0 / 0.
    e = torch.exp(filled - m.masked_fill(empty, 0.0))
    total = e.sum(dim=dim, keepdim=True).masked_fill(empty, 1.0)
    return e / total


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
) -> Tensor:
    """softmax(q k^T / sqrt(D), masked) v on (..., L, D), (..., S, D), (..., S, Dv).

    ``is_causal`` keeps key j for query i when j <= i (top-left alignment, as
    torch's scaled_dot_product_attention); with a mask too, both must allow it.
    """
    L, S = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., L, S)
    keep = torch.ones(L, S, dtype=torch.bool, device=q.device)
    if is_causal:
        keep = keep.tril()
    if mask is not None:
        keep = keep & mask.to(torch.bool)
    return masked_softmax(scores, keep.expand_as(scores)) @ v
