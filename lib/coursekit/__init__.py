"""The course kit of 'Softmax in Attention': assignments, a sandboxed grader, exports.

>>> import coursekit
>>> sorted(coursekit.ASSIGNMENTS)
['attention', 'flash-attention', 'gradients', 'softmax', 'sparse-maps']

``coursekit.grade(id, "submission.py")`` grades a file in a separate process and
returns a :class:`GradeResult`; ``softmaxbook-course --help`` is the command line.
The names load on first use: the student's process imports this package too, and
must not pay for (or see) more than it needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "ASSIGNMENTS",
    "Assignment",
    "GradeResult",
    "TestCase",
    "TestResult",
    "get_assignment",
    "grade",
]

_WHERE = {
    "ASSIGNMENTS": "coursekit.assignments",
    "get_assignment": "coursekit.assignments",
    "Assignment": "coursekit._model",
    "TestCase": "coursekit._model",
    "GradeResult": "coursekit.results",
    "TestResult": "coursekit.results",
    "grade": "coursekit.sandbox",
}

if TYPE_CHECKING:
    from ._model import Assignment, TestCase
    from .assignments import ASSIGNMENTS, get_assignment
    from .results import GradeResult, TestResult
    from .sandbox import grade


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'coursekit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
