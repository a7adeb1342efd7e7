"""The gradient check: autograd through a student's function, against a reference.

A student's forward pass may be right while its backward pass is not: a part
of the computation outside autograd (``.item()``, ``.detach()``,
``torch.no_grad()``), an input that does not reach the result, or a ``nan``
that ``torch.where`` sends back from the branch it did not take.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import torch
from torch import Tensor

from ._inputs import F64, close
from ._report import fmt
from ._session import Named, Session

_NOT_AUTOGRAD_HINT = (
    "The forward values are right but not their derivatives: did part of "
    "the computation happen outside autograd (.item(), .detach(), "
    "torch.no_grad())?"
)


def compare_gradients(
    session: Session,
    label: str,
    args: Named,
    kwargs: Named = (),
    *,
    wrt: Collection[str],
    shapes: Sequence[Sequence[int]],
    output_grads: Any,
    want: dict[str, Tensor],
    forward: Any,
    outputs: int = 1,
    hint: str = "",
    where: Tensor | None = None,
    project: Callable[[Tensor], Tensor] | None = None,
) -> None:
    """Backpropagate ``output_grads`` through ``session.fn``; compare with ``want``.

    ``want`` maps the name of each input in ``wrt`` to its float64 gradient;
    every gradient must be finite, and equal to ``want`` where ``where`` is
    True (everywhere by default), after ``project`` (a function applied to
    both, for a gradient defined only up to some direction). ``forward``
    holds the expected output(s): when they are wrong (a problem the forward
    checks of the same input report), the gradients are not compared.
    """
    session.section = gradient_check(label)  # a check of its own
    try:
        _compare_gradients(
            session, label, args, kwargs, wrt, shapes, output_grads, want, forward,
            outputs, hint, where, project,
        )  # fmt: skip
    finally:
        session.section = None


def gradient_check(label: str) -> str:
    """The name of the check of the gradient on the input ``label``."""
    return f"{label}: the gradient"


def _compare_gradients(
    session: Session,
    label: str,
    args: Named,
    kwargs: Named,
    wrt: Collection[str],
    shapes: Sequence[Sequence[int]],
    output_grads: Any,
    want: dict[str, Tensor],
    forward: Any,
    outputs: int,
    hint: str,
    where: Tensor | None,
    project: Callable[[Tensor], Tensor] | None,
) -> None:
    leaves: dict[str, Tensor] = {}
    args = [(n, _leaf(n, t, wrt, leaves)) for n, t in args]
    kwargs = [(n, _leaf(n, t, wrt, leaves)) for n, t in kwargs]
    out = session.call(label, args, kwargs, shapes=shapes, outputs=outputs)
    if out is None:
        return
    outs = list(out) if outputs > 1 else [out]
    if not _forward_right(outs, list(forward) if outputs > 1 else [forward]):
        session.fail(
            label,
            f"With {label}, the gradient of {session.noun} was not checked: the "
            f"forward values are wrong (fix them first).",
        )
        return
    if not all(o.requires_grad for o in outs):
        session.problem(
            ("no grad",),
            label,
            f"With {label}, the result of {session.noun} is not connected to "
            f"its inputs in autograd (requires_grad is False), so no "
            f"gradient can flow back. Use torch operations only: no "
            f".numpy(), .item(), .detach(), torch.tensor(...) of results, or "
            f"torch.no_grad().",
        )
        return
    try:
        grads = torch.autograd.grad(
            outs, list(leaves.values()), output_grads, allow_unused=True
        )
    except Exception as error:  # a broken backward: report it, like the forward
        session.raised(label + " (in the backward pass)", error)
        return
    for name, grad in zip(leaves, grads):
        _compare(session, label, name, grad, want[name], hint, where, project)


def _leaf(name: str, t: Any, wrt: Collection[str], leaves: dict[str, Tensor]) -> Any:
    if t is None or name not in wrt:
        return t
    leaves[name] = t.detach().clone().requires_grad_(True)
    return leaves[name]


def _forward_right(outs: list[Tensor], expected: list[Tensor]) -> bool:
    return all(
        o.dtype == w.dtype and bool(close(o.detach().to(F64), w, 1e-10, 1e-10).all())
        for o, w in zip(outs, expected)
    )


def _compare(
    session: Session,
    label: str,
    name: str,
    grad: Tensor | None,
    want: Tensor,
    hint: str,
    where: Tensor | None = None,
    project: Callable[[Tensor], Tensor] | None = None,
) -> None:
    if grad is None:
        session.problem(
            ("unused", name),
            label,
            f"With {label}, the result of {session.noun} does not depend on "
            f"{name} in autograd: its gradient with respect to {name} is "
            f"missing.",
        )
        return
    grad = grad.detach().to("cpu", F64)
    if not bool(torch.isfinite(grad).all()):
        session.problem(
            ("grad nan", name),
            label,
            f"With {label}, the gradient of {session.noun} with respect to "
            f"{name} contains nan or inf: {fmt(grad[~torch.isfinite(grad)][:4])}. "
            + (hint or "Look for 0 * inf, inf - inf or 0 / 0 in the backward pass."),
        )
        return
    if project is not None:
        grad, want = project(grad), project(want)
    if where is not None:  # compare only there (e.g. where the weights are > 0)
        grad, want = grad[where], want[where]
    session.values(
        label,
        grad,
        want,
        F64,
        key=("grad", name),
        what=f"the gradient with respect to {name} (by autograd)",
        explain=lambda g, w: _NOT_AUTOGRAD_HINT,
    )
