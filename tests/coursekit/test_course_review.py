"""The course kit under an outside review: what a confused or hostile student tried.

Each test is a case the review found mishandled, kept so that it stays fixed: a
process the student's code forks must not answer the grader, and a notebook with
IPython's help syntax, a magic's value or ``display`` keeps the functions its cells
define.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from coursekit._model import Assignment, TestCase
from coursekit.sandbox import grade
from coursekit.submission import strip_ipython

HERE = Path(__file__).resolve().parent
LOCATOR = ("test_course_review", "REVIEW", None)


def _inputs_of(n: int) -> Callable[[], dict[str, Any]]:
    def make() -> dict[str, Any]:
        return {"x": torch.arange(n, dtype=torch.float64)}

    return make


def _run(functions: Mapping[str, Callable[..., Any]], inputs: dict) -> dict:
    return {"y": functions["double"](inputs["x"])}


def _judge(inputs: dict, outputs: dict) -> str | None:
    y, want = outputs.get("y"), 2 * inputs["x"]
    if not isinstance(y, torch.Tensor) or y.shape != want.shape:
        return f"expected shape {tuple(want.shape)}, got {getattr(y, 'shape', y)}"
    return None if torch.equal(y, want) else f"expected {want.tolist()}"


REVIEW = Assignment(
    id="review",
    title="Doubling, on inputs of different lengths",
    functions=("double",),
    tests=tuple(
        TestCase(
            name=f"double_{n}",
            points=1.0,
            visibility="visible",
            functions=("double",),
            description=f"double on {n} numbers",
            make_inputs=_inputs_of(n),
            run=_run,
            judge=_judge,
        )
        for n in (3, 4, 5, 6)
    ),
    spec="Review.",
    package="review",
)


def _grade(path: Path) -> Any:
    return grade(REVIEW, path, locator=LOCATOR, extra_paths=[str(HERE)], timeout=5.0)


FORKS = """
import os, sys

def double(x):
    if os.fork() == 0:
        {child}
    return 2 * x
"""


def test_a_forked_child_that_returns_never_answers_the_grader(write_py):
    # Before the fix the child went back into the worker's loop, and both
    # processes answered: a test got the previous test's outputs ("expected shape
    # (4,), got (3,)") or a SystemExit that the parent never raised.
    for child in ("sys.exit(0)", "pass  # returns into the grader's loop"):
        result = _grade(write_py("forks.py", FORKS.format(child=child)))
        outputs = {t.name: t.output for t in result.tests}
        assert result.score == REVIEW.max_score(), (child, outputs)


def test_help_syntax_and_magic_values_keep_the_cell(write_ipynb):
    cells = [
        "import torch\n\ndef double(x):\n    return 2 * x\n\ndouble?\n",
        "??double\nfiles = !ls\nt = %timeit -o double(torch.ones(2))\n",
        "display(double(torch.ones(2)))\n\ndef unused():\n    pass\n",
    ]
    result = _grade(write_ipynb("magics.ipynb", cells))
    assert result.score == REVIEW.max_score(), [t.output for t in result.tests]
    assert not [n for n in result.notes if "cell" in n.lower()], result.notes


def test_the_rewrite_leaves_valid_python_alone():
    source = 'def f(x):\n    """Why?\n    ok"""\n    return x\nf?\ny = !ls\n'
    out = strip_ipython(source).splitlines()
    assert out[1] == '    """Why?'
    assert out[4] == "pass"
    assert out[5] == "y = None"
    assert strip_ipython("a ? b\n") == "a ? b\n"  # not IPython: left to fail
