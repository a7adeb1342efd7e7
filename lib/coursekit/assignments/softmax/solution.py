"""The `softmax` assignment: softmax, log-softmax and cross-entropy in torch."""

import torch
from torch import Tensor


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """Softmax of ``x`` along ``dim``: same shape and dtype, each slice sums to 1."""
    # exp(x_i - m) / sum_j exp(x_j - m), m the slice's maximum: the same weights.
    m = x.amax(dim=dim, keepdim=True)
    e = torch.exp(x - m)  # every exponent <= 0: nothing overflows
    return e / e.sum(dim=dim, keepdim=True)


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    """log(softmax(x)) along ``dim``, finite wherever x is finite."""
    # (x_i - m) - log(sum_j exp(x_j - m)), m the slice's maximum.
    shifted = x - x.amax(dim=dim, keepdim=True)
    # The sum is >= 1 (its largest term is exp(0)), so its log is finite.
    return shifted - torch.log(torch.exp(shifted).sum(dim=dim, keepdim=True))


def cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean over rows of -log softmax(logits)[n, targets[n]]; logits (N, C)."""
    log_p = log_softmax(logits, dim=-1)
    picked = log_p.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)  # (N,)
    return -picked.mean()
