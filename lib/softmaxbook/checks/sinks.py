"""The checker of a student's softmax with a sink logit (the attention of gpt-oss)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ._gradient import compare_gradients
from ._hints import wrong_shape_hint
from ._inputs import F32, F64, generator, randn, softmax64
from ._report import CheckReport, dtype_name
from ._session import Candidate, Session

__all__ = ["check_sink_softmax"]

_IGNORED_HINT = (
    "Every row sums to 1, as plain softmax's do: the sink is missing. Its "
    "e^b belongs in the denominator, p_i = e^(x_i) / (e^b + sum_j e^(x_j)), "
    "so that the weights can sum to less than 1."
)
_ONE_HINT = (
    "These are softmax-off-by-one's weights, as if every sink were 0: put "
    "e^b, the exponential of the row's own sink, in the denominator, not 1."
)
_NEGATED_HINT = (
    "These are the weights of the sink -b: a larger sink must take more "
    "weight from the scores, so the denominator holds e^(+b)."
)
_KEPT_HINT = (
    " The extra entry in each row is the sink's weight: drop it. The sink "
    "has no value to return; its weight goes nowhere."
)
_SHIFT_HINT = (
    "Shift the row by one number that is at least the sink and every score, "
    "m = max(b, max_j x_j): then e^(x_j - m) and e^(b - m) are at most 1, and "
    "the denominator is at least 1. Shifting by the largest score alone "
    "overflows when the sink is far above the scores, and a row whose scores "
    "are all -inf (every key removed) gives -inf - (-inf) = nan; with the "
    "sink in m, that row gets zeros, as it should."
)
_REMOVED_HINT = (
    "Keys with score -inf are removed: they must get weight exactly 0, and a "
    "row with every key removed gives zeros (the sink takes everything)."
)


def _with_sink(scores: Tensor, sink: Tensor) -> Tensor:
    """The float64 reference: the softmax of ``[scores, sink]``, sink dropped."""
    s, b = scores.to(F64), sink.to(F64)
    b = b.expand(*torch.broadcast_shapes(s.shape[:-1] + (1,), b.shape)[:-1], 1)
    s = s.expand(*b.shape[:-1], s.shape[-1])
    return torch.softmax(torch.cat([s, b], dim=-1), dim=-1)[..., :-1]


def _candidates(scores: Tensor, sink: Tensor) -> list[Candidate]:
    s = scores.detach().to(F64)
    b = sink.detach().to(F64)
    return [
        ("ignored", softmax64(s), _IGNORED_HINT),
        ("one", _with_sink(s, torch.zeros_like(b)), _ONE_HINT),
        ("negated", _with_sink(s, -b), _NEGATED_HINT),
    ]


def _explain(scores: Tensor) -> Callable[[Tensor, Tensor], str]:
    def explain(got: Tensor, want: Tensor) -> str:
        if not bool(torch.isfinite(got).all()):
            return _SHIFT_HINT
        removed = torch.isneginf(scores.to(F64)).expand(want.shape)
        if bool((got[removed] != 0).any()):
            return _REMOVED_HINT
        return ""

    return explain


def _shape_hint(got: tuple, want: tuple) -> str:
    if got[:-1] == want[:-1] and got[-1:] == (want[-1] + 1,):
        return _KEPT_HINT
    return wrong_shape_hint(got, want)


def _case(session: Session, label: str, scores: Tensor, sink: Tensor) -> bool:
    return session.run(
        label,
        [("scores", scores), ("sink", sink)],
        want=_with_sink(scores, sink),
        dtype=scores.dtype,
        shape_hint=_shape_hint,
        candidates=lambda: _candidates(scores, sink),
        explain=_explain(scores),
    )


def check_sink_softmax(
    fn: Callable[..., Any],
    *,
    numpy: bool = False,
    gradient: bool = True,
    device: torch.device | str | None = None,
) -> CheckReport:
    r"""Check a student's softmax with a sink logit, ``fn(scores, sink)``.

    .. math:: p_i = \frac{e^{x_i}}{e^{b} + \sum_j e^{x_j}}

    The softmax of the row with one more entry, the sink logit :math:`b`,
    whose weight is dropped (gpt-oss learns one :math:`b` per head), as
    :func:`softmaxbook.sink_softmax` computes it. ``scores`` is
    ``(..., N)``; ``sink`` has the dtype of ``scores`` and broadcasts against
    ``scores[..., :1]``: ``(..., 1)`` for one sink per row, ``(H, 1, 1)`` for
    one per head of ``(B, H, L, N)`` scores; the result has the shape and
    dtype of ``scores``. Checked: values on several shapes, with one sink
    per row, per head and for all; known mistakes diagnosed (the sink left
    out, taken as 0, with the wrong sign, or its weight returned); overflow
    (a score of 1000, a sink of 1000); removed keys (``-inf``) get 0 and a
    row of them gives zeros; a sink of ``-inf`` gives plain softmax; dtype
    (float16 and bfloat16 included) and device kept; neither argument
    modified; the gradients with respect to the scores and the sink, by
    autograd.

    Parameters
    ----------
    fn : callable
        The student's function, ``fn(scores, sink) -> weights``.
    numpy : bool
        ``fn`` takes and returns NumPy arrays (no gradient or device check).
    gradient : bool
        Also check the gradients by autograd through ``fn``.
    device : torch.device or str, optional
        Where to run the device check; default :func:`softmaxbook.get_device`.

    Returns
    -------
    CheckReport

    Examples
    --------
    >>> import torch, softmaxbook as sb
    >>> def without_the_sink(scores, sink):
    ...     return torch.softmax(scores, dim=-1)
    >>> report = sb.checks.check_sink_softmax(without_the_sink)
    >>> any("the sink is missing" in p for p in report.problems)
    True
    >>> sb.checks.check_sink_softmax(sb.sink_softmax).ok
    True
    """
    session = Session(
        fn, "your sink softmax", numpy=numpy, gradient=gradient, device=device
    )
    scores = torch.tensor([[1.0, 0.5, 2.5, -0.1]] * 3, dtype=F64)
    sinks = torch.tensor([[0.0], [2.0], [-1.0]], dtype=F64)
    if not _case(
        session,
        "scores of shape (3, 4) (float64) and sinks [0, 2, -1] of shape (3, 1)",
        scores,
        sinks,
    ):
        session.stopped = True  # the rest runs for the score, unreported
    g = generator(10)
    _check_shapes(session, g)
    _check_extremes(session, g)
    _check_dtypes_device_gradient(session, g)
    checked = [
        "values on shapes (3, 4) and (2, 3, 5, 6) with one sink per row, per "
        "head (3, 1, 1) and for all (1,)",
        "overflow: a score of 1000, a sink of 1000",
        "removed keys (-inf) and a row of them",
        "a sink of -inf",
        f"the dtype kept ({session.dtype_words()})",
        "the device kept",
        "the inputs not modified",
    ] + (
        ["the gradients with respect to the scores and the sink, by autograd"]
        if session.check_gradient
        else []
    )
    return session.report("check_sink_softmax", checked)


def _check_shapes(session: Session, g: torch.Generator) -> None:
    """Batched scores with one sink per head and one sink for all."""
    x = randn(g, 2, 3, 5, 6, scale=3.0)
    batched = "random scores of shape (2, 3, 5, 6) (float64) with "
    for words, sink in [
        ("one sink per head, of shape (3, 1, 1)", randn(g, 3, 1, 1, scale=2.0)),
        ("one sink for all, of shape (1,)", torch.tensor([1.5], dtype=F64)),
    ]:
        _case(session, batched + words, x, sink)


def _check_extremes(session: Session, g: torch.Generator) -> None:
    """Overflow, removed keys, a row with every key removed, a sink of -inf."""
    big = torch.tensor([[1000.0, 0.0, 3.0], [0.0, 1.0, 2.0]], dtype=F64)
    _case(
        session,
        "scores [[1000, 0, 3], [0, 1, 2]] (float64) and sinks [[0], [1000]] (overflow)",
        big,
        torch.tensor([[0.0], [1000.0]], dtype=F64),
    )
    removed = randn(g, 3, 5, scale=2.0)
    removed[0, [1, 3]] = -math.inf
    removed[1] = -math.inf
    _case(
        session,
        "random scores of shape (3, 5) (float64) with removed keys (-inf), "
        "row 1 all removed, and sinks [0.5, 0.5, -2] of shape (3, 1)",
        removed,
        torch.tensor([[0.5], [0.5], [-2.0]], dtype=F64),
    )
    _case(
        session,
        "random scores of shape (4, 6) (float64) and a sink of -inf (plain softmax)",
        randn(g, 4, 6, scale=3.0),
        torch.tensor([-math.inf], dtype=F64),
    )


def _check_dtypes_device_gradient(session: Session, g: torch.Generator) -> None:
    """Every dtype, the accelerator and the gradients, with a removed key."""
    low = randn(g, 4, 6, scale=3.0)
    low[2, 0] = -math.inf
    sinks = randn(g, 4, 1, scale=2.0)
    for dtype in [F64] + session.dtypes():
        _case(
            session,
            f"random scores of shape (4, 6) ({dtype_name(dtype)}) with a removed "
            f"key, and sinks of shape (4, 1)",
            low.to(dtype),
            sinks.to(dtype),
        )
    s, b = low.to(F32), sinks.to(F32)
    session.on_device(
        "float32 scores and sinks on the accelerator",
        [("scores", s), ("sink", b)],
        shapes=[s.shape],
        want=_with_sink(s, b),
    )
    if not session.check_gradient:
        return
    grad_out = randn(g, 4, 6)
    _, (want_s, want_b) = torch.autograd.functional.vjp(
        _with_sink, (low, sinks), grad_out
    )
    compare_gradients(
        session,
        "random scores of shape (4, 6) (float64) with a removed key, and "
        "sinks of shape (4, 1)",
        [("scores", low), ("sink", sinks)],
        wrt={"scores", "sink"},
        shapes=[low.shape],
        output_grads=[grad_out],
        want={"scores": want_s, "sink": want_b},
        forward=_with_sink(low, sinks),
    )
