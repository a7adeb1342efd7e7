"""The `sparse-maps` assignment: sparsemax and 1.5-entmax, exactly, by sorting."""

import torch
from torch import Tensor


def _sorted_rows(x: Tensor, dim: int) -> tuple[Tensor, Tensor, Tensor]:
    """(z, z sorted in decreasing order, k = 1..n), with ``dim`` moved last and each
    row shifted by its maximum (both maps are unchanged by adding a constant)."""
    z = x.movedim(dim, -1)
    z = z - z.amax(dim=-1, keepdim=True)
    zs = torch.sort(z, dim=-1, descending=True).values
    k = torch.arange(1, z.shape[-1] + 1, dtype=z.dtype, device=z.device)
    return z, zs, k


def sparsemax(x: Tensor, dim: int = -1) -> Tensor:
    """The Euclidean projection of each slice onto the simplex: max(x - tau, 0)."""
    # With z sorted in decreasing order, the support is the largest k with
    # 1 + k z_k > z_1 + ... + z_k, and tau = (z_1 + ... + z_k - 1) / k.
    z, zs, k = _sorted_rows(x, dim)
    cumsum = zs.cumsum(dim=-1)
    support = (1 + k * zs > cumsum).sum(dim=-1, keepdim=True)  # >= 1
    tau = (cumsum.gather(-1, support - 1) - 1) / support
    return torch.clamp(z - tau, min=0).movedim(-1, dim)


def entmax15(x: Tensor, dim: int = -1) -> Tensor:
    """1.5-entmax: p = max(x / 2 - tau, 0) ** 2 with tau such that sum(p) = 1."""
    # For the k largest entries of z = x / 2, sum_j (z_j - tau)^2 = 1 is a quadratic
    # in tau; its smaller root is mean - sqrt((1 - k * var) / k), with mean and var
    # the mean and variance of those k entries. The support is the largest k whose
    # root lies below z_k.
    z, zs, k = _sorted_rows(x / 2, dim)
    mean = zs.cumsum(dim=-1) / k
    mean_sq = (zs * zs).cumsum(dim=-1) / k
    delta = (1 - k * (mean_sq - mean * mean)) / k
    tau = mean - torch.sqrt(torch.clamp(delta, min=0))
    support = (tau <= zs).sum(dim=-1, keepdim=True)  # >= 1: tau_1 = z_1 - 1
    tau_star = tau.gather(-1, support - 1)
    return (torch.clamp(z - tau_star, min=0) ** 2).movedim(-1, dim)
