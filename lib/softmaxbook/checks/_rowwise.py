"""The checks that the row-wise functions share (softmax, log-softmax, sparsemax)."""

from __future__ import annotations

import torch
from torch import Tensor

from ._gradient import compare_gradients
from ._inputs import F32, F64, generator, input_label, numpy64, randn, tensor64
from ._session import Candidate, Session


def wrong_dim_candidates(x: Tensor, function) -> list[Candidate]:
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


def _rowwise(
    session: Session,
    label: str,
    x: Tensor,
    want: Tensor,
    *,
    candidates=None,
    explain=None,
    magnitude: bool = False,
    first=None,
) -> bool:
    """Check ``fn(x)`` against ``want``; False when the result is unusable."""
    out = session.call(label, [("x", x)], shapes=[x.shape])
    if out is None:
        return False
    size = x.abs().nan_to_num(posinf=0.0).max().clamp(min=1.0) if magnitude else 1.0
    if session.dtype(label, out, x.dtype):
        session.values(
            label,
            out,
            want,
            x.dtype,
            candidates=candidates,
            explain=explain,
            magnitude=float(size),
            first=first and (lambda: first(x)),
        )
    return True


def rowwise_checks(
    session: Session,
    *,
    seed: int,
    reference_fn,
    derivative,
    extremes,
    basic,
    candidates,
    explain,
    shapes,
    scale: float,
    gradient: bool,
    checked_extremes: str,
    magnitude: bool = False,
    first=None,
) -> list[str]:
    """The checks shared by the row-wise functions (softmax, log-softmax, sparsemax)."""
    x = torch.tensor(basic, dtype=F64)
    if not _rowwise(
        session,
        input_label("scores", x),
        x,
        tensor64(reference_fn(numpy64(x))),
        candidates=lambda: candidates(x),
        explain=lambda got, want: explain(got, want, x),
        first=first,
        magnitude=magnitude,
    ):
        session.stopped = True
        return []
    g = generator(seed)
    inputs = [randn(g, *shape, scale=scale) for shape in shapes]
    for x in inputs:
        _rowwise(
            session,
            input_label("scores", x),
            x,
            tensor64(reference_fn(numpy64(x))),
            candidates=lambda x=x: candidates(x),
            explain=lambda got, want, x=x: explain(got, want, x),
            first=first,
            magnitude=magnitude,
        )
    for _, values, note in extremes:
        for dtype in (F64, F32):
            x = torch.tensor(values, dtype=dtype)
            _rowwise(
                session,
                input_label("scores", x, note),
                x,
                tensor64(reference_fn(numpy64(x))),
                candidates=lambda x=x: candidates(x),
                explain=lambda got, want, x=x: explain(got, want, x),
                first=first,
                magnitude=magnitude,
            )
    for dtype in session.dtypes():
        x = inputs[1].to(dtype)
        _rowwise(
            session,
            input_label("scores", x),
            x,
            tensor64(reference_fn(numpy64(x))),
            candidates=lambda x=x: candidates(x),
            explain=lambda got, want, x=x: explain(got, want, x),
            first=first,
            magnitude=magnitude,
        )
    x = inputs[1].to(F32)
    session.on_device(
        input_label("scores", x, "on the accelerator"),
        [("x", x)],
        shapes=[x.shape],
        want=tensor64(reference_fn(numpy64(x))),
    )
    if gradient and not session.numpy:
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
        + "".join(f", {tuple(s)}" for s in shapes),
        checked_extremes,
        f"the dtype kept ({session.dtype_words()})",
        "the device kept",
        "the input not modified",
    ] + (
        ["the gradient, by autograd through your function"]
        if gradient and not session.numpy
        else []
    )
