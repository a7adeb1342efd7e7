"""Checkers of a student's softmax and log-softmax."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .. import reference
from ._hints import MAX_HINT, rows_sum_hint
from ._inputs import INF, close, numpy64, softmax_vjp, tensor64
from ._report import CheckReport, fmt
from ._rowwise import rowwise_checks, wrong_dim_candidates
from ._session import Candidate, Session

__all__ = ["check_softmax", "check_log_softmax"]

_BASIC = [1.0, 0.5, 2.5, -0.1]
# Where the textbook formulas break: (scores, what they test).
_EXTREMES = [
    ([1000.0, 0.0], "overflow"),
    ([-1000.0, -1000.0], "underflow"),
    ([[0.0, 1.0], [1000.0, 1001.0]], "rows on different scales"),
    ([0.0, -INF, 1.0], "a score of -inf"),
]


def _softmax_explain(got: Tensor, want: Tensor, x: Tensor) -> str:
    if bool(got.isnan().any()) and not bool(want.isnan().any()):
        return MAX_HINT
    if bool((got < 0).any()):
        return "Weights are never negative: exp(x_i - m) / sum_j exp(x_j - m) is > 0."
    return rows_sum_hint(got) or (
        "Compare with the formula exp(x_i - m) / sum_j exp(x_j - m), m the row maximum."
    )


def _softmax_candidates(x: Tensor) -> list[Candidate]:
    xs = numpy64(x)
    found = wrong_dim_candidates(x, reference.softmax)
    with np.errstate(all="ignore"):
        if x.dim() > 1 and x.shape[0] > 1:  # the maximum of the whole tensor
            e = np.exp(xs - xs.max())
            found.append(
                (
                    "global max",
                    tensor64(e / e.sum(axis=-1, keepdims=True)),
                    "Subtract each row's own maximum, "
                    "x.max(dim=-1, keepdim=True).values, not the maximum of the "
                    "whole tensor: a row far below it underflows to 0 / 0.",
                )
            )
        mean = np.exp(xs - xs.mean(axis=-1, keepdims=True))
    found.append(
        (
            "mean",
            tensor64(mean / mean.sum(axis=-1, keepdims=True)),
            "Subtract the maximum, not the mean: only the maximum makes every "
            "exponent <= 0, so that exp cannot overflow.",
        )
    )
    found.append(("naive", tensor64(reference.naive_softmax(xs)), MAX_HINT))
    return found


def check_softmax(
    fn: Callable[..., Any],
    *,
    numpy: bool = False,
    gradient: bool = True,
    device: torch.device | str | None = None,
) -> CheckReport:
    r"""Check a student's softmax, :math:`s_i = e^{x_i} / \sum_j e^{x_j}`.

    ``fn(x)`` takes scores of shape ``(..., N)`` and returns weights of the
    same shape and dtype. Checked: the values against
    :func:`softmaxbook.reference.softmax` on several shapes and batch
    dimensions (and which dimension was normalized, if not the last); that
    rows sum to one; overflow (``[1000, 0]``) and underflow
    (``[-1000, -1000]``) in float64 and float32; rows on very different
    scales; a score of ``-inf``; dtype (float64, float32, float16, bfloat16)
    and device kept; the input not modified; the gradient by autograd.

    Parameters
    ----------
    fn : callable
        The student's function, ``fn(x) -> weights``.
    numpy : bool
        ``fn`` takes and returns NumPy arrays (no gradient or device check).
    gradient : bool
        Also check the gradient by autograd through ``fn``.
    device : torch.device or str, optional
        Where to run the device check; default :func:`softmaxbook.get_device`.

    Returns
    -------
    CheckReport
        Truthy when every check passed; ``.problems`` lists what did not.

    Raises
    ------
    TypeError
        If ``fn`` is not callable.

    Examples
    --------
    >>> import torch, softmaxbook as sb
    >>> def naive_softmax(x):
    ...     e = torch.exp(x)
    ...     return e / e.sum(dim=-1, keepdim=True)
    >>> report = sb.checks.check_softmax(naive_softmax)
    >>> print(report.problems[0])  # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
    With scores [1000, 0] (float64, overflow), your softmax returned [nan, 0];
    expected [1, 0]. Subtract the row maximum before exp, ...
    >>> def my_softmax(x):
    ...     e = torch.exp(x - x.max(dim=-1, keepdim=True).values)
    ...     return e / e.sum(dim=-1, keepdim=True)
    >>> sb.checks.check_softmax(my_softmax).ok
    True
    """
    session = Session(fn, "your softmax", numpy=numpy, gradient=gradient, device=device)
    checked = rowwise_checks(
        session,
        seed=1,
        reference_fn=reference.softmax,
        derivative=lambda x, g: softmax_vjp(torch.softmax(x, -1), g),
        basic=_BASIC,
        extremes=_EXTREMES,
        candidates=_softmax_candidates,
        explain=_softmax_explain,
        scale=3.0,
        checked_extremes="rows sum to one; overflow [1000, 0] and underflow "
        "[-1000, -1000] in float64 and float32; rows on different "
        "scales; a score of -inf",
    )
    return session.report("check_softmax", checked)


_LSE_HINT = (
    "Compute x - logsumexp(x), with logsumexp(x) = m + log(sum_j exp(x_j - m)) "
    "and m the row maximum: never take the log of a probability that may have "
    "rounded to 0."
)


def _log_softmax_explain(got: Tensor, want: Tensor, x: Tensor) -> str:
    finite = torch.isfinite(want)
    if bool((torch.isneginf(got) & finite).any()):
        return "-inf is log(0): a probability rounded to 0. " + _LSE_HINT
    if bool(got.isnan().any()):
        return (
            "Subtract the maximum inside the logsumexp: exp(1000) overflows to inf "
            "and exp(-1000) underflows to 0. " + _LSE_HINT
        )
    sums = torch.logsumexp(got, dim=-1)
    if not bool(close(sums, torch.zeros_like(sums), 1e-6, 0).all()):
        return (
            f"The exponentials of each row should sum to one (logsumexp of each "
            f"row = 0); yours give {fmt(sums.reshape(-1), 4)}."
        )
    return "Compare with x_i - logsumexp(x)."


def _log_softmax_candidates(x: Tensor) -> list[Candidate]:
    xs = numpy64(x)
    found = wrong_dim_candidates(x, reference.log_softmax)
    with np.errstate(all="ignore"):
        naive_lse = np.log(np.exp(xs).sum(-1, keepdims=True))
        softmax = reference.softmax(xs)
        log_of_softmax = np.log(softmax)
    return found + [
        (
            "naive lse",
            tensor64(xs - naive_lse),
            "Subtract the maximum inside the logsumexp: exp(1000) overflows to "
            "inf and exp(-1000) underflows to 0. " + _LSE_HINT,
        ),
        (
            "softmax",
            tensor64(softmax),
            "Those are the probabilities: log-softmax returns their "
            "logarithms, x - logsumexp(x).",
        ),
        (
            "log of softmax",
            tensor64(log_of_softmax),
            "That is log(softmax(x)): the softmax rounds tiny probabilities "
            "to 0 and log(0) = -inf. " + _LSE_HINT,
        ),
    ]


def check_log_softmax(
    fn: Callable[..., Any],
    *,
    numpy: bool = False,
    gradient: bool = True,
    device: torch.device | str | None = None,
) -> CheckReport:
    r"""Check a student's log-softmax, :math:`x_i - \log \sum_j e^{x_j}`.

    ``fn(x)`` takes scores ``(..., N)`` and returns log-probabilities of the
    same shape and dtype. Checked: values against
    :func:`softmaxbook.reference.log_softmax` on several shapes; that the
    exponentials of each row sum to one; ``[1000, 0]`` (``log(softmax(x))``
    gives ``-inf`` here, the right answer is ``[0, -1000]``) and
    ``[-1000, -1000]`` in float64 and float32; rows on different scales; a
    score of ``-inf``; dtype and device kept; the input not modified; the
    gradient by autograd.

    Parameters
    ----------
    fn : callable
        The student's function, ``fn(x) -> log_probabilities``.
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
    >>> report = sb.checks.check_log_softmax(lambda x: torch.log(torch.softmax(x, -1)))
    >>> print(report.problems[0])  # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
    With scores [1000, 0] (float64, overflow), your log-softmax returned [0, -inf];
    expected [0, -1000]. That is log(softmax(x)): ...
    >>> def my_log_softmax(x):
    ...     return x - torch.logsumexp(x, dim=-1, keepdim=True)
    >>> sb.checks.check_log_softmax(my_log_softmax).ok
    True
    """
    session = Session(
        fn, "your log-softmax", numpy=numpy, gradient=gradient, device=device
    )
    checked = rowwise_checks(
        session,
        seed=2,
        reference_fn=reference.log_softmax,
        derivative=lambda x, g: g - torch.softmax(x, -1) * g.sum(-1, keepdim=True),
        basic=_BASIC,
        extremes=_EXTREMES,
        candidates=_log_softmax_candidates,
        explain=_log_softmax_explain,
        scale=3.0,
        magnitude=True,
        checked_extremes="exp of each row sums to one; [1000, 0] and [-1000, -1000] in "
        "float64 and float32; rows on different scales; a score of -inf",
    )
    return session.report("check_log_softmax", checked)
