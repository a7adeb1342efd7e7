"""Random attention inputs and a float64 reference, shared by the attention tests."""

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
