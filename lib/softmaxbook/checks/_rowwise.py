"""The checks that the row-wise functions share (softmax, log-softmax, sparsemax)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from torch import Tensor

from ._gradient import compare_gradients
from ._inputs import F32, F64, generator, input_label, numpy64, randn, tensor64
from ._session import Candidate, Session


def wrong_dim_candidates(x: Tensor, function: Callable[..., Any]) -> list[Candidate]:
    """What normalizing along another dimension would give."""
    found = []
    for d in range(x.dim() - 1):
        found.append(
            (
                f"dim {d}",
                tensor64(function(numpy64(x), axis=d)),
                f"That is the result along dim={d}: normalize each row along the "
                f"last dimension (dim=-1), whatever the number of batch "
                f"dimensions.",
            )
        )
    return found


# The random inputs: a vector, a matrix and a (B, H, L, S) batch.
SHAPES = [(6,), (3, 7), (2, 3, 4, 5)]


def rowwise_checks(
    session: Session,
    *,
    seed: int,
    reference_fn: Callable[..., Any],
    derivative: Callable[[Tensor, Tensor], Tensor],
    basic: list[float],
    extremes: Sequence[tuple[Any, str]],
    checked_extremes: str,
    candidates: Callable[[Tensor], list[Candidate]],
    explain: Callable[[Tensor, Tensor, Tensor], str],
    scale: float,
    magnitude: bool = False,
    first: Callable[[Tensor], str] | None = None,
) -> list[str]:
    """The checks of a function normalizing rows (softmax, log-softmax, sparsemax).

    ``fn(x)`` is compared with ``reference_fn`` (NumPy, float64) on ``basic``
    (the first, simplest input: when it fails, nothing else runs), random
    scores of :data:`SHAPES` times ``scale``, each of ``extremes`` (values,
    words) in float64 and float32, the matrix in every dtype and on the
    accelerator; then its gradient with ``derivative(x, grad_out)``.
    ``candidates(x)``, ``explain(got, want, x)`` and ``first(x)`` diagnose a
    mismatch (see :meth:`Session.values`); with ``magnitude``, the tolerance
    grows with the size of the scores. Returns what was checked, in words.
    """

    def check(x: Tensor, note: str = "") -> bool:
        size = x.abs().nan_to_num(posinf=0.0).max().clamp(min=1.0) if magnitude else 1
        return session.run(
            input_label("scores", x, note),
            [("x", x)],
            want=tensor64(reference_fn(numpy64(x))),
            dtype=x.dtype,
            candidates=lambda: candidates(x),
            explain=lambda got, want: explain(got, want, x),
            magnitude=float(size),
            first=None if first is None else partial(first, x),
        )

    if not check(torch.tensor(basic, dtype=F64)):
        session.stopped = True  # the rest runs for the score, unreported
    g = generator(seed)
    inputs = [randn(g, *shape, scale=scale) for shape in SHAPES]
    for x in inputs:
        check(x)
    for values, note in extremes:
        for dtype in (F64, F32):
            check(torch.tensor(values, dtype=dtype), note)
    for dtype in session.dtypes():
        check(inputs[1].to(dtype))
    x = inputs[1].to(F32)
    session.on_device(
        input_label("scores", x, "on the accelerator"),
        [("x", x)],
        shapes=[x.shape],
        want=tensor64(reference_fn(numpy64(x))),
    )
    if session.check_gradient:
        x = inputs[1]
        grad_out = randn(g, *x.shape)
        compare_gradients(
            session,
            input_label("scores", x),
            [("x", x)],
            wrt={"x"},
            shapes=[x.shape],
            output_grads=[grad_out],
            want={"x": derivative(x, grad_out)},
            forward=tensor64(reference_fn(numpy64(x))),
        )
    return [
        f"values against the reference on scores of shapes ({len(basic)},)"
        + "".join(f", {tuple(s)}" for s in SHAPES),
        checked_extremes,
        f"the dtype kept ({session.dtype_words()})",
        "the device kept",
        "the input not modified",
    ] + (
        ["the gradient, by autograd through your function"]
        if session.check_gradient
        else []
    )
