"""The hints of the FlashAttention checkers: the forward's diagnosis when no known
mistake matches, the backward's mistakes, and the memory and saved-tensor
messages."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ._flash import Largest, attention64, scores64
from ._hints import wrong_shape_hint
from ._inputs import F64

_IS_CAUSAL = "unexpected keyword argument 'is_causal'"
FORWARD_HINTS = [
    (
        _IS_CAUSAL,
        "Accept is_causal as a keyword argument: "
        "def flash_forward(q, k, v, is_causal=False, ...).",
    )
]
BACKWARD_HINTS = [
    (
        _IS_CAUSAL,
        "Accept is_causal as a keyword argument: "
        "def flash_backward(q, k, v, out, lse, grad_output, is_causal=False).",
    )
]
FUNCTION_HINTS = [
    (
        _IS_CAUSAL,
        "Accept is_causal as a keyword argument: def attention(q, k, v, "
        "is_causal=False), or check the autograd Function class itself.",
    ),
    (
        "positional arguments but",
        "The Function is called as apply(q, k, v, is_causal): give its forward "
        "the parameter, def forward(ctx, q, k, v, is_causal=False), and return "
        "one more None from backward.",
    ),
]

EMPTY_HINT = (
    "A query with nothing to attend has every score at -inf: its running maximum "
    "stays -inf, and exp(-inf - (-inf)) = nan. Shift by 0 where the running maximum "
    "is -inf, and give such a row a zero output (divide by l only where l > 0) and "
    "lse = -inf."
)
NAN_HINT = (
    "Subtract the running maximum before exp in every tile, P = exp(S - m_new) "
    "with m_new = max(m, rowmax(S)): exp of a score of 1000 overflows, and "
    "inf / inf = nan. (Where the running maximum is still -inf, shift by 0.)"
)
D_HINT = (
    "That is the backward without the rowsum term: dS = P * (dP - D), with "
    "D_i = rowsum(dO * O)_i = sum_d dO_id O_id, one number per query row (it equals "
    "sum_j P_ij dP_ij, the softmax's own term). Compute D once from grad_output "
    "and out, before the loop over tiles."
)
D_NO_O_HINT = (
    "D_i is rowsum(dO * O)_i: the product of grad_output and the output, summed over "
    "the last dimension, not the sum of grad_output alone."
)
SCALE_HINT = (
    "dq and dk miss the scale: the scores are q @ k^T * scale, so dq = dS @ k * scale "
    "and dk = dS^T @ q * scale (scale = 1/sqrt(D))."
)
P_SCALE_HINT = (
    "Recompute P = exp(q @ k^T * scale - lse): scale the scores before subtracting "
    "the logsumexp, as the forward pass did."
)
CAUSAL_BACKWARD_HINT = (
    "Your backward ignores the causal mask: recompute P with the scores above the "
    "diagonal at -inf (P = 0 there), as in the forward pass."
)


def lse_shape_hint(got: tuple[int, ...], want: tuple[int, ...]) -> str:
    if got == want + (1,):
        return (
            " Return the logsumexp with one number per query row, shape (..., L): "
            "lse.squeeze(-1)."
        )
    return wrong_shape_hint(got, want)


def output_explain(mask: Tensor | None, s: Tensor) -> Callable[[Tensor, Tensor], str]:
    """The diagnosis of a forward output that no known mistake explains."""
    empty = bool(torch.isneginf(s).all(dim=-1).any())

    def explain(got: Tensor, want: Tensor) -> str:
        if bool(got.isnan().any()):
            return EMPTY_HINT if empty else NAN_HINT
        return (
            "Compare with softmax(q @ k^T / sqrt(D)) @ v computed whole: each tile "
            "adds P @ V with P = exp(S - m_new), and after the last tile out = o / l."
        )

    return explain


def lse_explain(got: Tensor, want: Tensor) -> str:
    """The diagnosis of a logsumexp that no known mistake explains."""
    if bool(got.isnan().any()) or bool((torch.isinf(got) & torch.isfinite(want)).any()):
        return (
            "lse = m + log(l) cannot overflow (m is the row maximum and l >= 1), "
            "while log(sum(exp(s))) does for scores of 1000. A row with nothing to "
            "attend has lse = -inf."
        )
    return (
        "lse_i = log sum_j exp(s_ij) over the keys query i attends to, in natural "
        "log, s = q @ k^T / sqrt(D): after the last tile, lse = m + log(l)."
    )


def memory_message(label: str, noun: str, mode: Largest, L: int, S: int) -> str:
    return (
        f"With {label}, {noun} created a tensor of shape {mode.shape} (by "
        f"torch's {mode.op}): {mode.numel} entries, as many as the whole score "
        f"matrix, L x S = {L} x {S}, or more. FlashAttention holds one tile of "
        f"scores at a time, (block_q, block_k): loop over the key blocks inside "
        f"the loop over the query blocks, with a running maximum, sum and output "
        f"per query row."
    )


# -- the backward's mistakes ----------------------------------------------------------

Grads = tuple[Tensor, Tensor, Tensor]


def _grads(
    p: Tensor, q: Tensor, k: Tensor, v: Tensor, do: Tensor, delta: Tensor, scale: float
) -> Grads:
    ds = p * (do @ v.transpose(-2, -1) - delta[..., None])
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, p.transpose(-2, -1) @ do


def backward_candidates(
    q: Tensor, k: Tensor, v: Tensor, grad: Tensor, causal: bool
) -> list[tuple[str, Grads, str]]:
    """``(key, (dq, dk, dv), hint)``: what the usual mistakes of a backward return."""
    q, k, v, do = (t.to(F64) for t in (q, k, v, grad))
    scale = 1 / math.sqrt(q.shape[-1])
    s = scores64(q, k, causal)
    out, lse = attention64(s, v)
    p = torch.exp(s - lse[..., None])
    delta = (do * out).sum(dim=-1)
    right = _grads(p, q, k, v, do, delta, scale)
    found = [
        ("no D", _grads(p, q, k, v, do, torch.zeros_like(delta), scale), D_HINT),
        ("D of dO", _grads(p, q, k, v, do, do.sum(dim=-1), scale), D_NO_O_HINT),
        ("no scale", (right[0] / scale, right[1] / scale, right[2]), SCALE_HINT),
    ]
    unscaled = scores64(q, k, causal, scale=False)
    p_unscaled = torch.exp(unscaled - lse[..., None])
    delta_unscaled = (do * (p_unscaled @ v)).sum(dim=-1)
    found.append(
        ("P unscaled", _grads(p_unscaled, q, k, v, do, delta_unscaled, scale),
         P_SCALE_HINT)
    )  # fmt: skip
    if causal:
        p_all = torch.exp(scores64(q, k, False) - lse[..., None])
        found.append(
            ("causal ignored", _grads(p_all, q, k, v, do, delta, scale),
             CAUSAL_BACKWARD_HINT)
        )  # fmt: skip
    return found


def grad_explain(name: str) -> Callable[[Tensor, Tensor], str]:
    def explain(got: Tensor, want: Tensor) -> str:
        if bool(got.isnan().any()):
            return (
                f"{name} holds nan: P = exp(s - lse) is finite for every score a "
                "query attends to; look for exp(-inf - (-inf)) or 0 / 0."
            )
        return (
            "Compare with dV = P^T dO, dP = dO V^T, dS = P * (dP - D), "
            "dQ = dS K * scale, dK = dS^T Q * scale, with P = exp(q k^T * scale - "
            "lse) recomputed tile by tile and D = rowsum(dO * O)."
        )

    return explain
