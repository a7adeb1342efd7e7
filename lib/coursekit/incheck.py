"""Run an assignment's tests in the current process: notebooks, nbgrader and otter.

:func:`run_test` is what a student notebook's check cell calls, and what the nbgrader
and otter exports put in their test cells (their own tools isolate the process). It
does what the sandboxed grader does, in one process: build the inputs, call the
student's functions under the assignment's forbidden-call guard, carry the results
through ``torch.save``/``torch.load(weights_only=True)`` as the grader does, and judge
them against float64 expectations.
"""

from __future__ import annotations

import contextlib
import io
import textwrap
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from ._model import TestCase

__all__ = ["run_test", "check_notebook"]

WIDTH = 76  # a notebook's output column


def run_test(assignment_id: str, test_name: str, namespace: Mapping[str, Any]) -> None:
    """Run one test of an assignment on the functions defined in ``namespace``.

    Parameters
    ----------
    assignment_id : str
        ``"softmax"``, ``"attention"``, ``"gradients"``, ``"flash-attention"`` or
        ``"sparse-maps"``.
    test_name : str
        A test of that assignment, e.g. ``"softmax_values"``.
    namespace : mapping
        Where the submission's functions are defined, e.g. ``globals()``.

    Returns
    -------
    None
        When the test passed.

    Raises
    ------
    AssertionError
        When it failed, with the message a student can act on (what was given, what
        came back, what was expected, a hint), or naming the forbidden call made.
    ValueError
        If the assignment or the test does not exist.
    """
    from .assignments import get_assignment

    test = get_assignment(assignment_id).test(test_name)
    message = _failure(test, namespace)
    if message is not None:
        raise AssertionError(_wrap(f"{test.name}: {message}"))


def check_notebook(assignment_id: str, namespace: Mapping[str, Any]) -> None:
    """Print a table of the visible tests on ``namespace``'s functions; never raises.

    One line per test (name, points, passed or failed), each failure followed by its
    message, and the total of the visible points.
    """
    try:
        from .assignments import get_assignment

        assignment = get_assignment(assignment_id)
    except Exception as error:
        print(f"check_notebook: {error}")
        return
    visible = [t for t in assignment.tests if t.visibility == "visible"]
    hidden = [t for t in assignment.tests if t.visibility == "hidden"]
    width = max(len(t.name) for t in visible)
    score = 0.0
    lines = []
    for t in visible:
        try:
            message = _failure(t, namespace)
        except Exception as error:  # a broken test must not break the notebook
            message = f"the check itself failed ({type(error).__name__}: {error})"
        status = "passed" if message is None else "failed"
        if message is None:
            score += t.points
        lines.append(f"{t.name:<{width}}  {t.points:>4g}  {status}")
        if message is not None:
            lines += _wrap(message, indent="    ").splitlines()
    total = sum(t.points for t in visible)
    lines.append(f"visible tests: {score:g} / {total:g} points")
    if hidden:
        points = sum(t.points for t in hidden)
        lines.append(
            f"hidden tests: {len(hidden)} more, {points:g} points, run when you submit"
        )
    print("\n".join(lines))


def _failure(test: TestCase, namespace: Mapping[str, Any]) -> str | None:
    """None when ``test`` passes on ``namespace``'s functions, else the message."""
    functions: dict[str, Callable[..., Any]] = {}
    for name in test.functions:
        fn = namespace.get(name)
        if fn is None:
            return (
                f"{name} is not defined: define it at module level (def {name}(...))."
            )
        if not callable(fn):
            return f"{name} is a {type(fn).__name__}, not a function."
        functions[name] = fn
    inputs = test.make_inputs()
    given = _roundtrip(inputs)  # the student's copy: the judge keeps the original
    with _guard(test.forbidden, functions) as calls:
        try:
            outputs = test.run(functions, given)
        except Exception as error:  # run catches the student's errors; this is ours
            return f"the test could not run your code: {type(error).__name__}: {error}"
    if calls:
        return calls[0]
    try:
        outputs = _roundtrip(outputs)
    except Exception as error:
        return f"the results could not be read back ({type(error).__name__}: {error})"
    return test.judge(inputs, outputs)


def _roundtrip(data: Any) -> Any:
    """``data`` through ``torch.save`` and ``torch.load(weights_only=True)``."""
    buffer = io.BytesIO()
    torch.save(data, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@contextlib.contextmanager
def _guard(
    groups: tuple[str, ...], functions: Mapping[str, Any]
) -> Iterator[list[str]]:
    """:func:`coursekit.forbidden.guard` over ``groups``; yields the list that
    receives, after the block, the forbidden calls made (one message, or none)."""
    from . import forbidden

    calls: list[str] = []
    with forbidden.guard(groups, student_files=_files_of(functions)) as record:
        yield calls
    message = record.message()
    if message:
        calls.append(message)


def _files_of(functions: Mapping[str, Any]) -> set[str]:
    """The files the student's functions (and a class's methods) were defined in."""
    files = set()
    for fn in functions.values():
        members = vars(fn).values() if isinstance(fn, type) else [fn]
        for member in members:
            member = getattr(member, "__func__", member)  # staticmethod, classmethod
            code = getattr(member, "__code__", None)
            if code is not None:
                files.add(code.co_filename)
    return files


def _wrap(text: str, indent: str = "") -> str:
    return "\n".join(
        textwrap.wrap(
            text,
            WIDTH,
            initial_indent=indent,
            subsequent_indent=indent + "  ",
            break_on_hyphens=False,
            break_long_words=False,
        )
    )
