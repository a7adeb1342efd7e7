"""The checker of a student's softmax backward pass (vector-Jacobian product)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ._hints import rows_sum_hint
from ._inputs import F64, INF, generator, randn, softmax64, softmax_vjp
from ._report import CheckReport, dtype_name, fmt
from ._session import Candidate, Session

__all__ = ["check_softmax_backward"]


def _backward_candidates(s: Tensor, g: Tensor) -> list[Candidate]:
    found = [
        (
            "no sum",
            s * g,
            "That is s * g: it misses the term -s_i * sum_j s_j g_j, which "
            "comes from the denominator that couples every entry of the row. Return "
            "s * (g - (s * g).sum(dim=-1, keepdim=True)).",
        ),
        (
            "sign",
            -softmax_vjp(s, g),
            "The sign is flipped: the gradient is s * (g - s . g), "
            "not s * (s . g - g).",
        ),
        (
            "unweighted",
            s * (g - g.sum(-1, keepdim=True)),
            "The sum must be weighted by s: s . g = sum_j s_j g_j, not sum_j g_j.",
        ),
        (
            "no s",
            g - (s * g).sum(-1, keepdim=True),
            "Multiply by s: the gradient is "
            "s * (g - s . g), and it is 0 wherever s is 0.",
        ),
        (
            "scores",
            softmax_vjp(torch.softmax(s, -1), g),
            "Your function seems to apply the "
            "softmax to its first argument. s is already the softmax output (as in "
            "sb.softmax_backward(s, grad_output)): use it as it is.",
        ),
    ]
    for d in range(s.dim() - 1):
        found.append(
            (
                f"dim {d}",
                softmax_vjp(s, g, dim=d),
                f"You summed s * g along dim={d}; "
                f"the sum runs over the row, the last dimension (dim=-1).",
            )
        )
    return found


def _backward_explain(got: Tensor, want: Tensor) -> str:
    if bool(got.isnan().any()):
        return (
            "nan appeared: the gradient needs no division and no log; it is 0 "
            "wherever s is 0, including a row of zeros (a fully masked query)."
        )
    return rows_sum_hint(got, 0.0, "rows") or (
        "Compare with s * (g - (s * g).sum(dim=-1, keepdim=True))."
    )


def _backward_case(session: Session, label: str, s: Tensor, grad: Tensor) -> bool:
    s64, grad64 = s.to(F64), grad.to(F64)
    return session.run(
        label,
        [("s", s), ("grad_output", grad)],
        want=softmax_vjp(s64, grad64),
        dtype=s.dtype,
        candidates=lambda: _backward_candidates(s64, grad64),
        explain=_backward_explain,
    )


def check_softmax_backward(
    fn: Callable[..., Any],
    *,
    numpy: bool = False,
    device: torch.device | str | None = None,
) -> CheckReport:
    r"""Check a student's softmax backward pass, ``fn(s, grad_output)``.

    ``s`` is the softmax **output** (not the scores) and ``grad_output`` the
    gradient :math:`g` of a loss with respect to ``s``, both ``(..., N)``;
    ``fn`` returns the gradient with respect to the scores, the
    vector-Jacobian product

    .. math:: \bar x = J^\top g = s \odot (g - \textstyle\sum_j s_j g_j),

    of the same shape and dtype, as :func:`softmaxbook.softmax_backward` does.
    Checked: values against autograd of ``torch.softmax`` in float64 on
    several shapes, with a diagnosis of the usual mistakes (the missing sum
    term, the sign, an unweighted sum, a sum along the wrong dimension, a
    function that expects the scores instead of ``s``, a full Jacobian);
    zeros in ``s`` (masked keys) and a row of zeros (a fully masked query)
    give zero gradients; dtype and device kept; neither input modified.

    Parameters
    ----------
    fn : callable
        The student's function, ``fn(s, grad_output) -> grad_scores``.
    numpy : bool
        ``fn`` takes and returns NumPy arrays (no device check).
    device : torch.device or str, optional
        Where to run the device check; default :func:`softmaxbook.get_device`.

    Returns
    -------
    CheckReport

    Examples
    --------
    >>> import torch, softmaxbook as sb
    >>> report = sb.checks.check_softmax_backward(lambda s, g: s * g)
    >>> print(report.problems[0])  # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
    With s = softmax([1, 0.5, 2.5, -0.1]) and grad_output [0.3, -1, 0.5, 2]
    (float64), your softmax backward returned [...]; expected [...]. That is s * g:
    it misses the term -s_i * sum_j s_j g_j, ...
    >>> sb.checks.check_softmax_backward(sb.softmax_backward).ok
    True
    """
    session = Session(fn, "your softmax backward", numpy=numpy, device=device)
    s = torch.softmax(torch.tensor([1.0, 0.5, 2.5, -0.1], dtype=F64), -1)
    grad = torch.tensor([0.3, -1.0, 0.5, 2.0], dtype=F64)
    if not _backward_case(
        session,
        f"s = softmax([1, 0.5, 2.5, -0.1]) and grad_output {fmt(grad)} (float64)",
        s,
        grad,
    ):
        session.stopped = True  # the rest runs for the score, unreported
    g = generator(6)
    inputs = []
    for shape in [(3, 7), (2, 3, 4, 5)]:
        s = torch.softmax(randn(g, *shape, scale=2.0), -1)
        grad = randn(g, *shape)
        inputs.append((s, grad))
        _backward_case(
            session,
            f"s = softmax of random scores of shape {shape} and a "
            f"random grad_output (float64)",
            s,
            grad,
        )
    s = softmax64(torch.tensor([[1.0, 0.5, -INF, -INF], [-INF] * 4], dtype=F64))
    grad = torch.tensor([[0.3, -1.0, 0.5, 2.0], [1.0, 2.0, 3.0, 4.0]], dtype=F64)
    _backward_case(
        session,
        "s [[0.6225, 0.3775, 0, 0], [0, 0, 0, 0]] (masked keys and "
        "a fully masked row) and grad_output [[0.3, -1, 0.5, 2], [1, 2, 3, 4]]",
        s,
        grad,
    )
    s, grad = inputs[0]
    for dtype in session.dtypes():
        _backward_case(
            session,
            f"s = softmax of random scores of shape (3, 7) and a "
            f"random grad_output ({dtype_name(dtype)})",
            s.to(dtype),
            grad.to(dtype),
        )
    session.on_device(
        "float32 s and grad_output on the accelerator",
        [("s", s.float()), ("grad_output", grad.float())],
        shapes=[s.shape],
        want=softmax_vjp(s, grad),
    )
    checked = [
        "values against autograd on shapes (4,), (3, 7), (2, 3, 4, 5)",
        "zero weights and a fully masked row give zero gradients",
        f"the dtype kept ({session.dtype_words()})",
        "the device kept",
        "the inputs not modified",
    ]
    return session.report("check_softmax_backward", checked, "the device")
