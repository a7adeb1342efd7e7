"""The likely mistakes of a FlashAttention submission, and their hints.

Computed in the grader's process from the inputs a submission was given: the tiled
forward pass with one mistake switched on (no rescale, a base-2 or max-less
logsumexp, top-left alignment, a skipped partial block), and the backward pass
without the rowsum(dO * O) term. A judge names the mistake whose result a
submission's matches. Imports torch only; ``_refs`` is imported where it is used.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from .._common import BF16, F32, F64, Candidate

ALIGN = "bottom_right"
LOG2E = 1 / math.log(2)

RESCALE_HINT = (
    "That is the tiled sum without the rescale: when a new tile raises the running "
    "maximum from m to m_new, what was accumulated so far (the output and the sum l) "
    "was computed against the old maximum and must be multiplied by exp(m - m_new) "
    "before the new tile's terms are added."
)
LSE_BASE2_HINT = (
    "That logsumexp is in base 2 (log2 of the sum, e.g. from exp2 with scores scaled "
    "by log2(e)): return the natural log, lse = m + log(l), or divide by log2(e)."
)
LSE_NO_MAX_HINT = (
    "That is log(l) alone: l sums exp(s - m), so the logsumexp is m + log(l); "
    "add the running maximum back."
)
LSE_MAX_HINT = "That is the row maximum m; the logsumexp is m + log(l)."
LSE_UNSCALED_HINT = (
    "That is the logsumexp of the unscaled scores q k^T; take it of the scores the "
    "softmax sees, q k^T / sqrt(D)."
)
NORMALIZE_HINT = "Divide the accumulated output by the running sum l at the end."
ALIGN_HINT = (
    "That is the top-left alignment (key j for query i when j <= i). This assignment "
    "aligns the causal mask at the bottom right, as FlashAttention does: key j for "
    "query i when j <= i + S - L."
)
PARTIAL_HINT = (
    "The last, partial block of keys was skipped: when S is not a multiple of "
    "block_k, the last tile is k[..., j:S, :] (range(0, S, block_k) with "
    "min(j + block_k, S))."
)
EMPTY_HINT = (
    "A query that may see no key (causal with L > S) has every score at -inf: its "
    "running maximum stays -inf and exp(-inf - (-inf)) is nan. Such a row has "
    "output 0 and lse -inf: use 0 in place of an -inf maximum, and divide by l only "
    "where l > 0."
)
ROWSUM_HINT = (
    "dS = P * (dP - Delta) with Delta = rowsum(dO * O), one number per query: "
    "without that term dS = P * dP, as if the softmax's normalizer did not depend on "
    "the scores."
)
BACKWARD_NAN_HINT = (
    "nan appeared: for a query that sees no key, lse is -inf and s - lse is "
    "-inf - (-inf); replace that lse by 0 (its weights are then exp(-inf) = 0)."
)


def options(case: dict[str, Any]) -> tuple[bool, int, int]:
    kw = case["kwargs"]
    causal = bool(kw.get("is_causal", False))
    return causal, int(kw.get("block_q", 16)), int(kw.get("block_k", 16))


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    return F32 if dtype in (torch.float16, BF16) else dtype


def tiled(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    causal: bool,
    bq: int,
    bk: int,
    rescale_acc: bool = True,
    rescale_l: bool = True,
    align: str = ALIGN,
    last_block: bool = True,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The tiled forward pass in float64, with a mistake switched on or off:
    (out, lse, m, l)."""
    from .. import _refs

    q, k, v = q.to(F64), k.to(F64), v.to(F64)
    L, S = q.shape[-2], k.shape[-2]
    stop = S if last_block else S // bk * bk
    s_all = _refs.scores(q, k)
    if causal:
        s_all = s_all.masked_fill(~_refs.causal_keep(L, S, align), -math.inf)
    m = torch.full(q.shape[:-1] + (1,), -math.inf, dtype=F64)
    l = torch.zeros_like(m)  # noqa: E741
    acc = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=F64)
    for j0 in range(0, stop, bk):
        s = s_all[..., j0 : j0 + bk]
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        m_safe = m_new.nan_to_num(neginf=0.0)
        p = torch.exp(s - m_safe)
        alpha = torch.exp(m - m_safe)
        l = (l * alpha if rescale_l else l) + p.sum(-1, keepdim=True)  # noqa: E741
        acc = (acc * alpha if rescale_acc else acc) + p @ v[..., j0 : j0 + bk, :]
        m = m_new
    with torch.no_grad():
        out = torch.where(l > 0, acc / l, 0.0)
        lse = (m.nan_to_num(neginf=0.0) + torch.log(l)).squeeze(-1)
    return out, lse, m.squeeze(-1), l.squeeze(-1)


def forward_candidates(case: dict[str, Any]) -> list[Candidate]:
    q, k, v = case["args"]
    causal, bq, bk = options(case)
    found: list[Candidate] = []
    for acc, l_ in ((False, True), (False, False), (True, False)):
        out, lse, _, _ = tiled(q, k, v, causal, bq, bk, acc, l_)
        found += [("out", out, RESCALE_HINT), ("lse", lse, RESCALE_HINT)]
    out, lse, m, l = tiled(q, k, v, causal, bq, bk)  # noqa: E741
    scale = math.sqrt(q.shape[-1])
    unscaled, unscaled_lse, _, _ = tiled(q * scale, k, v, causal, bq, bk)
    found += [
        ("lse", lse * LOG2E, LSE_BASE2_HINT),
        ("lse", torch.log(l), LSE_NO_MAX_HINT),
        ("lse", m, LSE_MAX_HINT),
        ("lse", unscaled_lse, LSE_UNSCALED_HINT),
        ("out", out * l.unsqueeze(-1), NORMALIZE_HINT),
        ("out", unscaled, "Scale the scores by 1 / sqrt(D), D = q.shape[-1]."),
    ]
    if causal and q.shape[-2] != k.shape[-2]:
        top, top_lse, _, _ = tiled(q, k, v, causal, bq, bk, align="top_left")
        found += [("out", top, ALIGN_HINT), ("lse", top_lse, ALIGN_HINT)]
    if k.shape[-2] % bk:
        cut, cut_lse, _, _ = tiled(q, k, v, causal, bq, bk, last_block=False)
        found += [("out", cut, PARTIAL_HINT), ("lse", cut_lse, PARTIAL_HINT)]
    return found


def backward_candidates(case: dict[str, Any]) -> list[Candidate]:
    from .. import _refs

    q, k, v, _, _, grad = case["args"]
    out, _, p = _refs.attention(q, k, v, None, options(case)[0], ALIGN)
    v64, g64 = v.to(F64), grad.to(F64)
    no_rowsum = _refs.grads_from(q, k, p, _refs.ds_of(p, out, v64, g64, False), g64)
    unscaled = _refs.grads_from(q, k, p, _refs.ds_of(p, out, v64, g64), g64, False)
    hint = "The scores are q k^T / sqrt(D): dq and dk carry the factor 1 / sqrt(D)."
    return [
        ("dq", no_rowsum[0], ROWSUM_HINT),
        ("dk", no_rowsum[1], ROWSUM_HINT),
        ("dq", unscaled[0], hint),
        ("dk", unscaled[1], hint),
    ]


def apply_candidates(case: dict[str, Any]) -> list[Candidate]:
    """The forward pass's likely mistakes, as FlashAttention.apply would show them."""
    q, k, v = case["args"][:3]
    causal = bool(case["args"][3]) if len(case["args"]) > 3 else False
    causal = causal or bool(case["kwargs"].get("is_causal", False))
    forward = {"args": [q, k, v], "kwargs": {"is_causal": causal}}
    return [
        ("", t, hint) for part, t, hint in forward_candidates(forward) if part == "out"
    ]
