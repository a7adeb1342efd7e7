"""What a grading run produces: one result per test, a score, and Gradescope's JSON.

A test is all-or-nothing: it scores its points when it passed and 0 otherwise, so a
grade is the sum of the points of the tests passed, and a stub scores 0.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = ["GradeResult", "Status", "TestResult"]

#: ``passed``: the output was right. ``failed``: it came back wrong (the message says
#: how). ``error``: the code raised, crashed or ended the process. ``timeout``: it ran
#: past the time limit (or called a function that did before). ``forbidden``: it
#: called something the test forbids. ``skipped``: not run (the grading run's total
#: time was spent).
Status = Literal["passed", "failed", "error", "timeout", "forbidden", "skipped"]
STATUSES: tuple[str, ...] = (
    "passed",
    "failed",
    "error",
    "timeout",
    "forbidden",
    "skipped",
)

#: Gradescope's visibility for a test: a hidden test is shown after the due date.
_GRADESCOPE_VISIBILITY = {"visible": "visible", "hidden": "after_due_date"}


@dataclass
class TestResult:
    """The result of one test.

    Attributes
    ----------
    name, description
        The test's name and its one-line description.
    score, max_score
        ``max_score`` when passed, else 0.
    visibility
        ``"visible"`` or ``"hidden"`` (the test's own visibility).
    output
        What a student reads: empty when passed, else what went wrong in words.
    status
        One of :data:`Status`.
    seconds
        Wall time of the test in the student's process (0 when it did not run).
    """

    __test__ = False  # not a pytest test class

    name: str
    score: float
    max_score: float
    visibility: str
    output: str
    status: Status
    description: str = ""
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")
        if self.visibility not in _GRADESCOPE_VISIBILITY:
            raise ValueError(
                f"visibility must be 'visible' or 'hidden', got {self.visibility!r}"
            )

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@dataclass
class GradeResult:
    """The result of grading one submission.

    Attributes
    ----------
    assignment
        The assignment's id.
    tests
        One :class:`TestResult` per test, in the assignment's order.
    score, max_score
        The sum of the tests' scores and of their points.
    error
        Why the submission could not be graded at all (it did not import, it was
        not found), in words; None otherwise.
    notes
        What a student should know beyond single tests: a notebook cell that raised,
        output printed at import.
    seconds
        Wall time of the whole grading run.
    """

    assignment: str
    tests: list[TestResult]
    score: float
    max_score: float
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @classmethod
    def collect(
        cls,
        assignment: str,
        tests: list[TestResult],
        *,
        error: str | None = None,
        notes: list[str] | None = None,
        seconds: float = 0.0,
    ) -> GradeResult:
        """A result whose score and max score are the sums over ``tests``."""
        return cls(
            assignment=assignment,
            tests=tests,
            score=float(sum(t.score for t in tests)),
            max_score=float(sum(t.max_score for t in tests)),
            error=error,
            notes=list(notes or []),
            seconds=seconds,
        )

    def summary(self) -> str:
        """A paragraph for the top of the results: the score, then what to know."""
        passed = sum(t.passed for t in self.tests)
        lines = [
            f"{self.assignment}: {_num(self.score)} / {_num(self.max_score)} points "
            f"({passed} of {len(self.tests)} tests passed)."
        ]
        if self.error:
            lines.append(self.error)
        lines.extend(self.notes)
        return "\n".join(lines)

    def to_gradescope(self) -> dict[str, Any]:
        """Gradescope's ``results.json``: the score and one entry per test.

        Each test has ``name``, ``score``, ``max_score``, ``status`` (``"passed"``
        or ``"failed"``), ``output`` and ``visibility``: ``"visible"`` for a
        visible test, ``"after_due_date"`` for a hidden one.
        """
        tests = []
        for number, t in enumerate(self.tests, start=1):
            output = t.output if t.output else "Passed."
            if t.description:
                output = f"{t.description}\n\n{output}"
            tests.append(
                {
                    "name": t.name,
                    "number": str(number),
                    "score": t.score,
                    "max_score": t.max_score,
                    "status": "passed" if t.passed else "failed",
                    "output": output,
                    "visibility": _GRADESCOPE_VISIBILITY[t.visibility],
                }
            )
        return {
            "score": self.score,
            "execution_time": round(self.seconds, 1),
            "output": self.summary(),
            "tests": tests,
        }

    def write_gradescope(self, path: str | Path) -> Path:
        """Write :meth:`to_gradescope` as JSON to ``path`` (folders are created)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.to_gradescope(), indent=2, ensure_ascii=False)
        path.write_text(text + "\n", encoding="utf-8")
        return path

    def to_dict(self) -> dict[str, Any]:
        """Everything, as plain data (for logs and tests)."""
        return asdict(self)

    def table(self, width: int = 100) -> str:
        """A plain-text table: one row per test, its status, points and message."""
        name_width = max([4, *(len(t.name) + 2 for t in self.tests)])
        header = f"{'test':<{name_width}}  {'status':<9}  {'points':>11}  message"
        rows = [header, "-" * min(width, len(header) + 20)]
        indent = name_width + 2 + 9 + 2 + 11 + 2
        room = max(30, width - indent)
        for t in self.tests:
            points = f"{_num(t.score)} / {_num(t.max_score)}"
            message = " ".join(t.output.split()) if t.output else ""
            wrapped = textwrap.wrap(message, room) or [""]
            name = t.name + (" *" if t.visibility == "hidden" else "")
            row = f"{name:<{name_width}}  {t.status:<9}  {points:>11}  {wrapped[0]}"
            rows.append(row.rstrip())
            rows.extend(" " * indent + more for more in wrapped[1:6])
            if len(wrapped) > 6:
                rows.append(" " * indent + "...")
        rows.append("-" * min(width, len(header) + 20))
        if any(t.visibility == "hidden" for t in self.tests):
            rows.append("* hidden test: students see it after the due date")
        rows.append(self.summary())
        return "\n".join(rows)


def _num(value: float) -> str:
    return f"{value:g}"
