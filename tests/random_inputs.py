"""Random inputs shared by the tests: scores for the normalizers, q, k, v for
attention, and the float64 references they are compared with."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def qkv(L, S, D=16, Dv=None, batch=(2, 3), dtype=torch.float32, seed=0, scale=1.0):
    """q ``(*batch, L, D)``, k ``(*batch, S, D)``, v ``(*batch, S, Dv)``, drawn in
    float64 and rounded once to ``dtype``, so every dtype sees the same numbers."""
    g = torch.Generator().manual_seed(seed)
    Dv = D if Dv is None else Dv
    q = torch.randn(batch + (L, D), generator=g, dtype=torch.float64) * scale
    k = torch.randn(batch + (S, D), generator=g, dtype=torch.float64) * scale
    v = torch.randn(batch + (S, Dv), generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def sdpa64(q, k, v, **kw):
    """torch's attention in float64: the reference the error rules compare with."""
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), **kw)


def scores(shape=(6, 9), scale=2.0, seed=0, dtype=torch.float64):
    """Seeded N(0, scale^2) scores, drawn in float64 and rounded once to ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)


def vjp(f, x, seed=1):
    """``f(x)`` and the gradient of a random linear function of it w.r.t. ``x``."""
    x = x.detach().clone().requires_grad_(True)
    out = f(x)
    w = scores(out.shape, scale=1.0, seed=seed)
    (grad,) = torch.autograd.grad((out * w).sum(), x)
    return out.detach(), grad
