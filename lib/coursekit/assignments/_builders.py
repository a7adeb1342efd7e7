"""Test builders shared by the assignments: a test that calls a function on cases,
a test of what autograd finds through a function, a judge that never raises, and the
spec with its table of points.

Like :mod:`._common`, this imports torch and the standard library only (the
student's process imports it to find a test's ``run``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from typing import Any

import torch
from torch import Tensor

from .._model import TestCase, Visibility
from ._common import (
    Candidate,
    attempt,
    compare,
    describe_error,
    parts,
    plain,
    raised_message,
    returned,
)

#: What a call should return: one tensor (of the first argument's dtype), or named
#: parts ``[(part, tensor, dtype), ...]`` of a returned tuple.
Expected = Tensor | list[tuple[str, Tensor, torch.dtype]]


def call_test(
    *,
    name: str,
    points: float,
    visibility: Visibility,
    fn: str,
    description: str,
    noun: str,
    cases: Callable[[], list[dict[str, Any]]],
    expect: Callable[[dict[str, Any]], Expected],
    candidates: Callable[[dict[str, Any]], Sequence[Candidate]] | None = None,
    explain: Callable[[dict[str, Any], Tensor, Tensor], str] | None = None,
    forbidden: tuple[str, ...] = (),
) -> TestCase:
    """A test that calls ``fn(*args, **kwargs)`` on each case and compares the result.

    Each case (built by ``cases`` in the grader's process) is a dict with ``"args"``
    (a list), ``"kwargs"`` (a dict) and ``"where"`` (the inputs in words, for the
    message). The test passes when every case returns what ``expect(case)`` says.
    """

    def make_inputs() -> dict[str, Any]:
        return {"cases": cases()}

    def run(
        functions: Mapping[str, Callable[..., Any]], inputs: dict[str, Any]
    ) -> dict[str, Any]:
        f = functions[fn]
        return {
            "results": [attempt(f, *c["args"], **c["kwargs"]) for c in inputs["cases"]]
        }

    def judge(inputs: dict[str, Any], outputs: dict[str, Any]) -> str | None:
        results = outputs.get("results", [])
        for case, entry in zip(inputs["cases"], results):
            message = judge_call(
                case,
                entry,
                expect(case),
                noun=noun,
                candidates=_bind(candidates, case),
                explain=_bind_explain(explain, case),
            )
            if message:
                return message
        if len(results) != len(inputs["cases"]):
            return f"{noun} was not called on every input."
        return None

    return TestCase(
        name=name,
        points=points,
        visibility=visibility,
        functions=(fn,),
        description=description,
        make_inputs=make_inputs,
        run=run,
        judge=robust(judge),
        forbidden=forbidden,
    )


def judge_call(
    case: dict[str, Any],
    entry: Mapping[str, Any],
    want: Expected,
    *,
    noun: str,
    candidates: Callable[[], Sequence[Candidate]] | None = None,
    explain: Callable[[Tensor, Tensor], str] | None = None,
) -> str | None:
    """The message for one call's ``entry`` (``{"value"}`` or ``{"raised"}``)."""
    where = case["where"]
    raised = raised_message(entry, where, noun)
    if raised:
        return raised
    got = entry.get("value")
    if isinstance(want, Tensor):
        return compare(
            got,
            want,
            where=where,
            noun=noun,
            dtype=case["args"][0].dtype,
            candidates=candidates,
            explain=explain,
        )
    items = parts(got, [p for p, _, _ in want], where, noun)
    if isinstance(items, str):
        return items
    for item, (part, value, dtype) in zip(items, want):
        message = compare(
            item,
            value,
            where=where,
            noun=noun,
            part=part,
            dtype=dtype,
            candidates=candidates,
            explain=explain,
        )
        if message:
            return message
    return None


def _bind(
    candidates: Callable[[dict[str, Any]], Sequence[Candidate]] | None,
    case: dict[str, Any],
) -> Callable[[], Sequence[Candidate]] | None:
    if candidates is None:
        return None
    found = candidates
    return lambda: found(case)


def _bind_explain(
    explain: Callable[[dict[str, Any], Tensor, Tensor], str] | None,
    case: dict[str, Any],
) -> Callable[[Tensor, Tensor], str] | None:
    if explain is None:
        return None
    found = explain
    return lambda got, want: found(case, got, want)


def spec_text(package: str, tests: Sequence[TestCase]) -> str:
    """``<package>/spec.md`` and a table of the points: the visible tests by name,
    the hidden ones counted."""
    text = (
        resources.files("coursekit.assignments")
        .joinpath(package, "spec.md")
        .read_text(encoding="utf-8")
        .rstrip()
    )
    visible = [t for t in tests if t.visibility == "visible"]
    hidden = [t for t in tests if t.visibility == "hidden"]
    total = sum(t.points for t in tests)
    rows = [
        "",
        "",
        "## Tests and points",
        "",
        f"{total:g} points in all. Each test is all or nothing. The visible tests "
        "(you can run them in your notebook):",
        "",
        "| test | points | checks |",
        "| --- | ---: | --- |",
    ]
    rows += [f"| `{t.name}` | {t.points:g} | {t.description} |" for t in visible]
    rows += [
        "",
        f"and {len(hidden)} hidden tests worth {sum(t.points for t in hidden):g} "
        "points, run when you submit, on the conventions above (other shapes, dims "
        "and dtypes, extreme inputs, gradients).",
    ]
    return text + "\n".join(rows) + "\n"


def autograd_test(
    *,
    name: str,
    points: float,
    visibility: Visibility,
    fn: str,
    description: str,
    noun: str,
    case: Callable[[], dict[str, Any]],
    expect: Callable[[dict[str, Any]], Tensor],
    grads: Callable[[dict[str, Any]], list[Tensor]],
    forbidden: tuple[str, ...] = (),
    method: str | None = None,
    candidates: Callable[[dict[str, Any]], Sequence[Candidate]] | None = None,
) -> TestCase:
    """A test of the gradients autograd finds through ``fn``.

    ``case()`` (grader) gives ``"args"``, ``"kwargs"``, ``"where"``, ``"wrt"`` (the
    indices of the arguments to differentiate, with their names in ``"names"``) and
    ``"grad"`` (the output's gradient, or None for a scalar). ``run`` calls
    ``fn(*args, **kwargs)`` (or ``fn.<method>(...)``), then ``backward``; the judge
    compares the value with ``expect(case)`` and the gradients with ``grads(case)``.
    """

    def run(
        functions: Mapping[str, Callable[..., Any]], inputs: dict[str, Any]
    ) -> dict[str, Any]:
        f = functions[fn]
        call = f if method is None else getattr(f, method, None)
        if call is None:
            return {"raised": f"AttributeError: {fn} has no {method}"}
        wrt = set(inputs["wrt"])
        args = [
            a.clone().requires_grad_(True) if i in wrt else a
            for i, a in enumerate(inputs["args"])
        ]
        try:
            y = call(*args, **inputs["kwargs"])
            if not isinstance(y, Tensor) or y.grad_fn is None:
                return {"value": plain(y), "grads": "<no graph>"}
            y.backward(inputs["grad"])
        except Exception as error:
            return {"raised": describe_error(error)}
        found = [plain(args[i].grad) for i in inputs["wrt"]]
        return {"value": plain(y), "grads": found}

    def judge(inputs: dict[str, Any], outputs: dict[str, Any]) -> str | None:
        where = inputs["where"]
        message = judge_call(
            inputs,
            outputs,
            expect(inputs),
            noun=noun,
            candidates=_bind(candidates, inputs),
        )
        if message:
            return message
        got = outputs.get("grads")
        if not isinstance(got, list):
            return (
                f"With {where}, {noun} returned a tensor autograd cannot "
                "differentiate: stay in torch operations (no .item(), .numpy(), "
                ".detach() or torch.no_grad())."
            )
        for g, want, arg, i in zip(got, grads(inputs), inputs["names"], inputs["wrt"]):
            if g is None:
                return (
                    f"With {where}, autograd through {noun} gives no gradient for "
                    f"{arg}: the result does not depend on {arg} through torch "
                    "operations."
                )
            message = compare(
                g,
                want,
                where=where,
                noun=noun,
                part=f"the gradient for {arg} (by autograd)",
                dtype=inputs["args"][i].dtype,
            )
            if message:
                return message
        return None

    return TestCase(
        name=name,
        points=points,
        visibility=visibility,
        functions=(fn,),
        description=description,
        make_inputs=case,
        run=run,
        judge=robust(judge),
        forbidden=forbidden,
    )


JudgeFn = Callable[[dict[str, Any], dict[str, Any]], "str | None"]


def robust(judge: JudgeFn) -> JudgeFn:
    """``judge`` that answers in words when the outputs are not what ``run`` returns
    (none came back, or they are malformed), instead of raising."""

    def checked(inputs: dict[str, Any], outputs: dict[str, Any]) -> str | None:
        if not isinstance(outputs, dict):
            return f"no results came back from your code (got {returned(outputs)})."
        try:
            return judge(inputs, outputs)
        except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as error:
            return f"your results could not be judged ({describe_error(error)})."

    return checked
