"""Numbers that several pages of the book use, computed in one place.

A number quoted on two pages must not be computed twice: two copies of an
experiment drift apart (another seed, another size), and the pages then
disagree. Each function here runs one experiment and returns its raw
per-seed results; every page that quotes the number calls the function and
glues from what it returns.

- :func:`scaling_gradients`: unscaled against scaled attention as the head
  dimension grows (chapter 3, "Scaling by sqrt(d_k)", and chapter 5,
  "Gradients of softmax"): the largest weight, the entropy and the gradient
  reaching the scores and the queries, over 10 seeds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import torch

import softmaxbook as sb

__all__ = ["HEAD_DIMS", "attention_probe", "ScalingGradients", "scaling_gradients"]

#: The head dimensions of the experiment, from 4 to 1024.
HEAD_DIMS = (4, 8, 16, 32, 64, 128, 256, 512, 1024)
#: The metrics :func:`attention_probe` returns, one number per call.
METRICS = ("max weight", "entropy", "grad norm", "q grad norm", "one-hot")


def attention_probe(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, G: torch.Tensor, scale: float
) -> tuple[dict[str, float], dict[str, float]]:
    """Weights, entropy, and the gradients reaching the scores and q.

    ``q`` is (L, D), ``k`` (S, D), ``v`` (S, Dv), ``G`` the upstream gradient
    (L, Dv) of the loss ``sum(out * G)``. Returns one number per metric,
    summarized over the L queries, and the largest deviation of the three
    cross-checks: the output against ``sb.scaled_dot_product_attention``'s explicit
    path (``explicit=True``: the library's own computation, not torch's kernel), the
    autograd gradient at the scores against the softmax VJP written out by
    hand, and the gradient at q against ``scale * VJP @ k``.
    """
    # explicit=True: the library's own scores and weights, never torch's fused kernel
    ref = cast(
        torch.Tensor,
        sb.scaled_dot_product_attention(q, k, v, scale=scale, explicit=True),
    )
    q = q.clone().requires_grad_(True)
    scores = (q @ k.transpose(-2, -1)) * scale  # (L, S)
    w = sb.softmax(scores)
    out = w @ v  # (L, Dv)
    grad, grad_q = torch.autograd.grad((out * G).sum(), [scores, q])
    g_w = G @ v.transpose(-2, -1)  # dl/dw, (L, S)
    by_hand = w * (g_w - (w * g_w).sum(dim=-1, keepdim=True))  # the softmax VJP
    w = w.detach()
    metrics = {
        "max weight": w.amax(dim=-1).mean().item(),
        "entropy": sb.entropy(w).mean().item(),
        "grad norm": grad.norm(dim=-1).median().item(),
        "q grad norm": grad_q.norm(dim=-1).median().item(),
        "one-hot": (w.amax(dim=-1) > 0.99).double().mean().item(),
    }
    errors = {
        "output vs sdpa": (out.detach() - ref).abs().max().item(),
        "autograd vs VJP": (grad - by_hand).abs().max().item(),
        "q gradient vs scale * VJP @ k": (grad_q - scale * by_hand @ k)
        .abs()
        .max()
        .item(),
    }
    return metrics, errors


def _draw(seed: int, d: int, L: int, S: int, Dv: int) -> list[torch.Tensor]:
    """Queries (L, d), keys (S, d), values (S, Dv), upstream grad (L, Dv)."""
    g = torch.Generator().manual_seed(1000 * seed + d)
    return [
        torch.randn(*shape, generator=g, dtype=torch.float64)
        for shape in [(L, d), (S, d), (S, Dv), (L, Dv)]
    ]


@dataclass
class ScalingGradients:
    """Results of :func:`scaling_gradients`.

    ``per_seed[kind, metric]`` is an array (seed, head dimension), ``kind``
    "scaled" or "unscaled"; ``ratio`` and ``ratio_q`` are the scaled over the
    unscaled gradient norm at the scores and at the queries, per seed and
    head dimension. ``errors`` holds the largest deviation of each
    cross-check of :func:`attention_probe` over all calls.
    """

    dims: tuple[int, ...]
    seeds: tuple[int, ...]
    L: int
    S: int
    Dv: int
    per_seed: dict = field(repr=False)
    errors: dict

    def median(self, kind: str, metric: str) -> np.ndarray:
        """The median over the seeds, one value per head dimension."""
        return np.median(self.per_seed[kind, metric], axis=0)

    @property
    def ratio(self) -> np.ndarray:
        """Scaled over unscaled gradient norm at the scores, (seed, dimension)."""
        return (
            self.per_seed["scaled", "grad norm"]
            / self.per_seed["unscaled", "grad norm"]
        )

    @property
    def ratio_q(self) -> np.ndarray:
        """Scaled over unscaled gradient norm at the queries, (seed, dimension)."""
        return (
            self.per_seed["scaled", "q grad norm"]
            / self.per_seed["unscaled", "q grad norm"]
        )

    def at(self, d: int) -> int:
        """The column of head dimension ``d``."""
        return self.dims.index(d)


def scaling_gradients(
    dims: Sequence[int] = HEAD_DIMS,
    seeds: Sequence[int] = range(10),
    *,
    L: int = 256,
    S: int = 64,
    Dv: int = 16,
) -> ScalingGradients:
    """Unscaled against scaled attention over random queries and keys.

    For each seed and head dimension d: L queries and S keys with standard
    normal components in dimension d, values of dimension Dv, a standard
    normal upstream gradient, all float64 from a generator seeded with
    ``1000 * seed + d`` (so a subset of ``dims`` gives the same numbers).
    Each draw goes through :func:`attention_probe` twice, with scale 1
    ("unscaled") and 1/sqrt(d) ("scaled").
    """
    dims, seeds = tuple(dims), tuple(seeds)
    per_seed = {
        (kind, m): np.zeros((len(seeds), len(dims)))
        for kind in ("unscaled", "scaled")
        for m in METRICS
    }
    errors: dict[str, float] = {}
    for a, seed in enumerate(seeds):
        for b, d in enumerate(dims):
            q, k, v, G = _draw(seed, d, L, S, Dv)
            for kind, scale in [("unscaled", 1.0), ("scaled", 1 / math.sqrt(d))]:
                metrics, errs = attention_probe(q, k, v, G, scale)
                for m, value in metrics.items():
                    per_seed[kind, m][a, b] = value
                for name, e in errs.items():
                    errors[name] = max(errors.get(name, 0.0), e)
    return ScalingGradients(dims, seeds, L, S, Dv, per_seed, errors)
