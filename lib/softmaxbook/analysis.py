r"""Diagnostics of attention distributions: how spread out, how far they look.

These read attention weights (rows that sum to one, or to zero for a fully
masked row) and summarize them, for example per head, to detect collapse.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_dim, check_float

__all__ = ["entropy"]


def entropy(p: Tensor, dim: int = -1, *, keepdim: bool = False) -> Tensor:
    r"""Shannon entropy in nats: :math:`H(p) = -\sum_i p_i \log p_i`, with :math:`0 \log 0 = 0`.

    :math:`H = 0` for a one-hot row (all attention on one key, *collapse*) and
    :math:`H = \log N` for the uniform row over :math:`N` keys. The convention
    :math:`0 \log 0 = 0` (the limit) makes exact zeros, from masks or
    sparsemax, contribute nothing, in the value and in the gradient, with no
    ``1e-12`` fudge that would bias the result.

    Shapes: ``p`` is ``(..., N)``; the result is ``(...)``, or ``(..., 1)``
    with ``keepdim=True``.
    """
    check_float(p, "p")
    dim = check_dim(p, dim)
    positive = p > 0
    # where() on both sides keeps the gradient of the zero entries finite (0, not nan).
    plogp = torch.where(positive, p * torch.log(torch.where(positive, p, torch.ones_like(p))),
                        torch.zeros_like(p))
    return -plogp.sum(dim=dim, keepdim=keepdim)
