"""Float64 references, computed in the grader's process only.

Softmax, log-softmax and sparsemax come from :mod:`softmaxbook.reference` (NumPy, the
library's own specification); entmax-1.5 and attention are written here in NumPy.
Inputs are the tensors the submission was given (already rounded to their dtype), so
a result is compared with the exact answer for the numbers it saw. Never import this
module from a test's ``run``: the student's process must not load ``softmaxbook``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

F64 = torch.float64


def np64(t: Tensor) -> np.ndarray:
    return t.detach().to("cpu", F64).numpy()


def t64(a: np.ndarray) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """Softmax along ``dim``; a row of all ``-inf`` gives zeros."""
    from softmaxbook import reference

    return t64(reference.softmax(np64(x), axis=dim))


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    from softmaxbook import reference

    return t64(reference.log_softmax(np64(x), axis=dim))


def logsumexp(x: Tensor, dim: int = -1) -> Tensor:
    from softmaxbook import reference

    return t64(reference.logsumexp(np64(x), axis=dim))


def sparsemax(x: Tensor, dim: int = -1) -> Tensor:
    from softmaxbook import reference

    return t64(reference.sparsemax(np64(x), axis=dim))


def entmax15(x: Tensor, dim: int = -1) -> Tensor:
    r"""Exact 1.5-entmax by sorting: :math:`p = [x/2 - \tau]_+^2`, :math:`\sum p = 1`.

    With :math:`z = x/2` sorted in decreasing order, for each support size :math:`k`
    the threshold solving :math:`\sum_{j \le k} (z_j - \tau)^2 = 1` is
    :math:`\tau_k = \bar z_k - \sqrt{\max(0, (1 - k (\overline{z^2}_k - \bar z_k^2))
    / k)}`; the support is the largest :math:`k` with :math:`\tau_k \le z_k`.
    """
    z = np.moveaxis(np64(x), dim, -1) / 2
    z = z - z.max(axis=-1, keepdims=True)  # entmax is unchanged by a shift
    zs = -np.sort(-z, axis=-1)
    k = np.arange(1, z.shape[-1] + 1)
    with np.errstate(invalid="ignore"):  # -inf scores: inf - inf past the support
        mean = np.cumsum(zs, axis=-1) / k
        mean_sq = np.cumsum(zs**2, axis=-1) / k
        delta = (1 - k * (mean_sq - mean**2)) / k
        tau = mean - np.sqrt(np.clip(delta, 0, None))
        support = (tau <= zs).sum(axis=-1, keepdims=True)
    tau_star = np.take_along_axis(tau, support - 1, axis=-1)
    p = np.clip(z - tau_star, 0, None) ** 2
    return t64(np.moveaxis(p, -1, dim))


def causal_keep(L: int, S: int, align: str) -> Tensor:
    """The causal mask, True = may attend: query i sees key j when
    ``j <= i`` (``"top_left"``) or ``j <= i + S - L`` (``"bottom_right"``)."""
    offset = 0 if align == "top_left" else S - L
    i = torch.arange(L)[:, None]
    j = torch.arange(S)[None, :]
    return j <= i + offset


def scores(q: Tensor, k: Tensor, scale: float | None = None) -> Tensor:
    d = q.shape[-1]
    s = 1 / math.sqrt(d) if scale is None else scale
    return t64(np.matmul(np64(q), np.swapaxes(np64(k), -1, -2)) * s)


def keep_of(
    L: int, S: int, mask: Tensor | None, is_causal: bool, align: str
) -> Tensor | None:
    keep = None if mask is None else mask.to(torch.bool)
    if is_causal:
        c = causal_keep(L, S, align)
        keep = c if keep is None else keep & c
    return keep


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    align: str = "top_left",
) -> tuple[Tensor, Tensor, Tensor]:
    """``(out, lse, weights)`` of scaled dot-product attention in float64.

    ``lse`` is the natural-log logsumexp of each query's allowed scores (``-inf`` for a
    query with nothing to attend, whose weights and output are zeros).
    """
    s = scores(q, k)
    keep = keep_of(q.shape[-2], k.shape[-2], mask, is_causal, align)
    if keep is not None:
        s = s.masked_fill(~keep.expand_as(s), -math.inf)
    p = softmax(s)
    lse = logsumexp(s)
    out = t64(np.matmul(np64(p), np64(v)))
    return out, lse, p


def attention_grads(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    grad_out: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    align: str = "top_left",
) -> tuple[Tensor, Tensor, Tensor]:
    r"""``(dq, dk, dv)`` of attention in float64, by the formulas

    :math:`dV = P^\top dO`, :math:`dP = dO V^\top`,
    :math:`dS = P \odot (dP - \mathrm{rowsum}(dO \odot O))`,
    :math:`dQ = dS K / \sqrt{D}`, :math:`dK = dS^\top Q / \sqrt{D}`.
    """
    out, _, p = attention(q, k, v, mask, is_causal, align)
    ds = ds_of(p, out, v, grad_out)
    return grads_from(q, k, p, ds, grad_out)


def ds_of(
    p: Tensor, out: Tensor, v: Tensor, grad_out: Tensor, rowsum: bool = True
) -> Tensor:
    dp = grad_out.to(F64) @ v.to(F64).transpose(-1, -2)
    if not rowsum:
        return p * dp
    d = (grad_out.to(F64) * out).sum(-1, keepdim=True)
    return p * (dp - d)


def grads_from(
    q: Tensor, k: Tensor, p: Tensor, ds: Tensor, grad_out: Tensor, scaled: bool = True
) -> tuple[Tensor, Tensor, Tensor]:
    c = 1 / math.sqrt(q.shape[-1]) if scaled else 1.0
    dv = p.transpose(-1, -2) @ grad_out.to(F64)
    dq = ds @ k.to(F64) * c
    dk = ds.transpose(-1, -2) @ q.to(F64) * c
    return dq, dk, dv
