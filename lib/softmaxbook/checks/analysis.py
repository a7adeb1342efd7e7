"""The checker of a student's mean attention entropy."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ._gradient import compare_gradients
from ._inputs import F64, generator, numpy64, randn, softmax64, tensor64
from ._report import CheckReport
from ._session import Candidate, Session

__all__ = ["check_attention_entropy"]

_XLOGX_HINT = (
    "0 * log(0) is 0 * (-inf) = nan in floating point, but the entropy uses "
    "the limit 0 log 0 = 0: compute p * log(p) only where p > 0, e.g. "
    "torch.where(p > 0, p * torch.log(torch.where(p > 0, p, 1)), 0)."
)


def _entropy_np(w: Tensor) -> Tensor:
    p = numpy64(w)
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    rows = -plogp.sum(axis=-1)  # (..., L)
    live = p.sum(axis=-1) > 0
    return tensor64(
        np.where(live, rows, 0.0).sum(axis=-1) / np.maximum(live.sum(axis=-1), 1)
    )


def _entropy_t(w: Tensor) -> Tensor:
    positive = w > 0
    plogp = torch.where(positive, w * torch.log(torch.where(positive, w, 1.0)), 0.0)
    live = w.sum(-1) > 0
    rows = torch.where(live, -plogp.sum(-1), 0.0)
    return rows.sum(-1) / live.sum(-1).clamp(min=1)


def _entropy_candidates(w: Tensor) -> list[Candidate]:
    want = _entropy_np(w)
    p = numpy64(w)
    with np.errstate(divide="ignore", invalid="ignore"):
        rows = -np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0).sum(axis=-1)
    return [
        (
            "bits",
            want / math.log(2),
            "That is the entropy in bits (log2): the book "
            "measures entropy in nats, with the natural log torch.log.",
        ),
        ("sign", -want, "The sign is flipped: H(p) = -sum_i p_i log p_i is >= 0."),
        (
            "all rows",
            tensor64(rows.mean(axis=-1)),
            "You averaged over every row, including rows of zeros (queries with "
            "nothing to attend to), which count as entropy 0: leave them out of the "
            "mean (divide by the number of rows with any weight).",
        ),
        (
            "sum",
            tensor64(rows.sum(axis=-1)),
            "You summed the rows' entropies: return their mean over the live rows.",
        ),
    ]


def _entropy_explain(w: Tensor) -> Callable[[Tensor, Tensor], str]:
    def explain(got: Tensor, want: Tensor) -> str:
        if bool(got.isnan().any()):
            if not bool((w > 0).any()):
                return (
                    "A map whose rows are all zeros has no live row: return 0 for it "
                    "(clamp the count of live rows at 1, and use 0 log 0 = 0)."
                )
            return _XLOGX_HINT
        return (
            "Compare with the mean, over the rows with any weight, of "
            "-sum_j w_ij log w_ij."
        )

    return explain


def _centered(grad: Tensor, support: Tensor) -> Tensor:
    """The gradient within the rows' simplex: minus its mean over each row's support.

    The entropy is defined on rows that sum to one, so a gradient is only
    determined up to a constant per row (formulas that divide by the row's sum
    and formulas that do not differ by exactly that).
    """
    count = support.sum(-1, keepdim=True).clamp(min=1)
    mean = (grad * support).sum(-1, keepdim=True) / count
    return (grad - mean) * support


def _entropy_shape_hint(got: tuple, w: Tensor) -> str:
    if got == tuple(w.shape[:-1]):
        return (
            " That is one entropy per row (per query): return one number per map, "
            "the mean over the rows that have any weight."
        )
    return ""


def _entropy_run(session: Session, label: str, w: Tensor) -> bool:
    return session.run(
        label,
        [("weights", w)],
        want=_entropy_np(w),
        dtype=w.dtype,
        shape=w.shape[:-2],  # one number per map
        shape_hint=lambda got, want: _entropy_shape_hint(got, w),
        candidates=lambda: _entropy_candidates(w),
        explain=_entropy_explain(w),
    )


def check_attention_entropy(
    fn: Callable[..., Any],
    *,
    numpy: bool = False,
    gradient: bool = True,
    device: torch.device | str | None = None,
) -> CheckReport:
    r"""Check a student's mean attention entropy, ``fn(weights)``, one number per map.

    .. math:: \bar H = \frac{1}{|R|} \sum_{i \in R} -\sum_j w_{ij} \log w_{ij},
              \qquad 0 \log 0 = 0,

    in nats, with :math:`R` the rows that have any weight (a fully masked
    query, a row of zeros, is left out; a map with no such row gives 0), as
    :func:`softmaxbook.attention_entropy` computes for rows that sum to one.
    ``weights`` is ``(..., L, S)``; the result is ``(...)``. Checked: softmax
    maps of several shapes; a causal map (exact zeros: ``0 log 0`` must not
    give ``nan``); one-hot and uniform rows (0 and :math:`\log S`); a map with
    a row of zeros, and one with only zeros; nats, not bits; dtype and device
    kept; the input not modified; a finite gradient (exact zeros included)
    that matches the reference on each row's support, up to a constant per
    row (the entropy is defined on rows that sum to one).

    Parameters
    ----------
    fn : callable
        The student's function, ``fn(weights) -> mean_entropy``.
    numpy : bool
        ``fn`` takes and returns NumPy arrays (no gradient or device check).
    gradient : bool
        Also check the gradient by autograd through ``fn``.
    device : torch.device or str, optional
        Where to run the device check; default :func:`softmaxbook.get_device`.

    Returns
    -------
    CheckReport

    Examples
    --------
    >>> import torch, softmaxbook as sb
    >>> def per_row_nan(w):
    ...     return -(w * torch.log(w)).sum(-1).mean(-1)
    >>> report = sb.checks.check_attention_entropy(per_row_nan)
    >>> print(report.problems[0])  # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
    With a causal map of shape (5, 5) (float64), your entropy function returned
    nan; expected 0.7416. 0 * log(0) is 0 * (-inf) = nan in floating point, ...
    >>> sb.checks.check_attention_entropy(sb.attention_entropy).ok
    True
    """
    session = Session(
        fn, "your entropy function", numpy=numpy, gradient=gradient, device=device
    )
    w = torch.softmax(
        torch.tensor(
            [[1.0, 0.5, 2.5, -0.1], [0.0, 0.0, 1.0, 2.0], [3.0, -1.0, 0.0, 0.5]],
            dtype=F64,
        ),
        -1,
    )
    if not _entropy_run(session, "a softmax map of shape (3, 4) (float64)", w):
        session.stopped = True  # the rest runs for the score, unreported
    g = generator(9)
    maps = torch.softmax(randn(g, 2, 3, 5, 6, scale=2.0), -1)
    _entropy_run(session, "random softmax maps of shape (2, 3, 5, 6) (float64)", maps)
    causal = softmax64(randn(g, 5, 5), torch.ones(5, 5, dtype=torch.bool).tril())
    _entropy_run(session, "a causal map of shape (5, 5) (float64)", causal)
    extremes = torch.stack(
        [torch.eye(4, dtype=F64), torch.full((4, 4), 0.25, dtype=F64)]
    )
    _entropy_run(
        session, "a one-hot map and a uniform map, shape (2, 4, 4) (float64)", extremes
    )
    padded = causal.clone()
    padded[2] = 0.0
    _entropy_run(
        session, "a causal map (5, 5) whose row 2 is all zeros (float64)", padded
    )
    _entropy_run(
        session,
        "a map of zeros, shape (1, 3, 4) (float64)",
        torch.zeros(1, 3, 4, dtype=F64),
    )
    _entropy_run(
        session, "random softmax maps of shape (2, 3, 5, 6) (float32)", maps.float()
    )
    session.on_device(
        "a float32 map on the accelerator",
        [("weights", maps.float())],
        shapes=[(2, 3)],
        want=_entropy_np(maps),
    )
    if session.check_gradient:
        _check_gradient(session, padded)
    checked = [
        "softmax maps of shapes (3, 4) and (2, 3, 5, 6)",
        "exact zeros (0 log 0 = 0)",
        "one-hot and uniform rows",
        "rows of zeros left out of the mean",
        "nats, not bits",
        "the dtype kept (float64, float32)",
        "the device kept",
        "the input not modified",
    ] + (
        [
            "a finite gradient, equal to the reference on each row's support (up to a "
            "constant per row)"
        ]
        if session.check_gradient
        else []
    )
    return session.report("check_attention_entropy", checked)


def _check_gradient(session: Session, padded: Tensor) -> None:
    """A finite gradient, equal to the reference on each row's support (up to a
    constant per row), on a map with a row of zeros."""
    grad_out = torch.tensor(1.0, dtype=F64)
    want = torch.autograd.functional.vjp(_entropy_t, padded, grad_out)[1]
    compare_gradients(
        session,
        "a causal map (5, 5) whose row 2 is all zeros (float64)",
        [("weights", padded)],
        wrt={"weights"},
        shapes=[()],
        output_grads=[grad_out],
        want={"weights": want},
        hint=_XLOGX_HINT,
        where=padded > 0,
        project=lambda grad: _centered(grad, padded > 0),
        forward=_entropy_np(padded),
    )
