"""The checker of a student's sparsemax."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .. import reference
from ._hints import rows_sum_hint
from ._inputs import F64, TOL, close, generator, input_label, numpy64, randn, tensor64
from ._report import CheckReport, fmt
from ._rowwise import rowwise_checks, wrong_dim_candidates
from ._session import Candidate, Session

__all__ = ["check_sparsemax"]

# (scores, what they test)
_EXTREMES = [
    ([1.0, 1.0, 1.0, 1.0], "ties"),
    ([3.0, 0.0, 0.0], "a one-hot result"),
    ([1000.0, 999.5, 0.0], "large scores"),
    ([100.6, 100.3, 100.8, 99.9], "the basic scores + 100"),
]
_INDEX_HINT = (
    "out of bounds",
    "An index went out of range: the support size k counts from 1 "
    "(it is at least 1), and the k-th largest score sits at index k - 1.",
)

_SUPPORT_HINT = (
    "Check the support: sort the scores in decreasing order, z_1 >= z_2 >= "
    "..., keep the largest k (counting from 1) with 1 + k z_k > z_1 + ... + "
    "z_k, and use tau = (z_1 + ... + z_k - 1) / k."
)


def _sparsemax_k(x: np.ndarray, shift: int) -> np.ndarray:
    """Sparsemax with a support off by ``shift``: a usual mistake, to diagnose."""
    z = -np.sort(-x, axis=-1)
    cumsum = np.cumsum(z, axis=-1)
    k = np.arange(1, x.shape[-1] + 1)
    k_max = (1 + k * z > cumsum).sum(axis=-1, keepdims=True)
    k_max = np.clip(k_max + shift, 1, x.shape[-1])
    tau = (np.take_along_axis(cumsum, k_max - 1, axis=-1) - 1) / k_max
    return np.maximum(x - tau, 0.0)


def _sparsemax_candidates(x: Tensor) -> list[Candidate]:
    xs = numpy64(x)
    found = wrong_dim_candidates(x, reference.sparsemax)
    for shift in (-1, 1):
        found.append(
            (
                f"k{shift:+d}",
                tensor64(_sparsemax_k(xs, shift)),
                f"Your support has one key {'too few' if shift < 0 else 'too many'}"
                f". " + _SUPPORT_HINT,
            )
        )
    found.append(
        (
            "softmax",
            tensor64(reference.softmax(xs)),
            "That is the softmax: sparsemax is max(x - tau, 0) with the threshold "
            "tau, which gives exact zeros.",
        )
    )
    return found


def _sparsemax_explain(got: Tensor, want: Tensor, x: Tensor) -> str:
    if bool((got < 0).any()):
        return "Weights are never negative: clip at zero, max(x - tau, 0)."
    return _support_hint(got, want)


def _sorted_hint(session: Session, x: Tensor) -> str:
    """When unsorted scores fail, try sorted ones: the threshold comes from a sort."""
    xs = torch.sort(x, dim=-1, descending=True).values
    if torch.equal(xs, x):
        return ""
    quiet = Session(session.fn, session.noun, numpy=session.numpy, device="cpu")
    out = quiet.call("", [("x", xs)], shapes=[xs.shape])
    if out is None or not bool(
        close(
            out.to(F64), tensor64(reference.sparsemax(numpy64(xs))), *TOL[x.dtype]
        ).all()
    ):
        return ""
    return (
        "Your sparsemax is right when the scores come already sorted, but not "
        "otherwise: compute the threshold from the scores sorted in decreasing order "
        "(torch.sort(x, dim=-1, descending=True)), then apply it to the scores in "
        "their original order."
    )


def _support_hint(got: Tensor, want: Tensor) -> str:
    support_got, support_want = (got > 0).sum(-1), (want > 0).sum(-1)
    if not torch.equal(support_got, support_want):
        return (
            f"Your result has {fmt(support_got.reshape(-1), 4)} nonzero entries per "
            f"row where sparsemax has {fmt(support_want.reshape(-1), 4)}. "
            + _SUPPORT_HINT
        )
    return rows_sum_hint(got) or _SUPPORT_HINT


def _sparsemax_grad(x: Tensor, g: Tensor) -> Tensor:
    """The sparsemax VJP: on the support, g minus its mean there; 0 elsewhere."""
    support = (tensor64(reference.sparsemax(numpy64(x))) > 0).to(F64)
    mean = (g * support).sum(-1, keepdim=True) / support.sum(-1, keepdim=True)
    return support * (g - mean)


def check_sparsemax(
    fn: Callable[..., Any],
    *,
    numpy: bool = False,
    gradient: bool = True,
    device: torch.device | str | None = None,
) -> CheckReport:
    r"""Check a student's sparsemax, :math:`\max(x - \tau, 0)`.

    The threshold :math:`\tau` is the number with
    :math:`\sum_i \max(x_i - \tau, 0) = 1`.

    ``fn(x)`` takes scores ``(..., N)`` and returns weights of the same shape
    and dtype, normalized along the last dimension. Checked: values against
    :func:`softmaxbook.reference.sparsemax` on dense, medium and sparse
    inputs of several shapes (with a diagnosis of a support off by one, and
    of a threshold taken from unsorted scores); exact zeros outside the
    support; ties; a one-hot result; large scores and a shift by 100 (which
    changes nothing); dtype and device kept; the input not modified; the
    gradient by autograd (on the support, :math:`g - \bar g`; 0 elsewhere).

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

    Examples
    --------
    >>> import torch, softmaxbook as sb
    >>> sb.checks.check_sparsemax(sb.sparsemax).ok
    True
    >>> report = sb.checks.check_sparsemax(lambda x: torch.softmax(x, -1))
    >>> print(report.problems[0])  # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
    With scores [0.6, 0.3, 0.8, -0.1] (float64), your sparsemax returned [...];
    expected [0.3667, 0.06667, 0.5667, 0]. That is the softmax: ...
    """
    session = Session(
        fn,
        "your sparsemax",
        numpy=numpy,
        gradient=gradient,
        device=device,
        hints=[_INDEX_HINT],
    )
    checked = rowwise_checks(
        session,
        seed=3,
        reference_fn=reference.sparsemax,
        derivative=_sparsemax_grad,
        basic=[0.6, 0.3, 0.8, -0.1],
        extremes=_EXTREMES,
        candidates=_sparsemax_candidates,
        explain=_sparsemax_explain,
        scale=1.0,
        first=lambda x: _sorted_hint(session, x),
        checked_extremes="ties; a one-hot result; large scores; a shift by 100",
    )
    _check_supports(session)
    checked.insert(1, "dense and sparse supports; exact zeros outside the support")
    return session.report("check_sparsemax", checked)


def _check_supports(session: Session) -> None:
    """Dense and sparse supports, and exact zeros outside the support."""
    g = generator(33)
    for scale, words in ((0.05, "dense support"), (4.0, "sparse support")):
        x = randn(g, 4, 9, scale=scale)
        label = input_label("scores", x, words)
        want = tensor64(reference.sparsemax(numpy64(x)))
        out = session.call(label, [("x", x)], shapes=[x.shape])
        if out is None or not session.values(
            label,
            out,
            want,
            F64,
            candidates=partial(_sparsemax_candidates, x),
            explain=partial(_sparsemax_explain, x=x),
            first=partial(_sorted_hint, session, x),
        ):
            continue
        leaked = (want == 0) & (out != 0)
        if bool(leaked.any()):
            session.problem(
                ("zeros",),
                label,
                f"With {label}, your sparsemax returned "
                f"{fmt(out[leaked][:4])} where the weights are exactly 0. "
                f"Sparsemax gives exact zeros: clip with "
                f"torch.clamp(x - tau, min=0), do not add an epsilon.",
            )
