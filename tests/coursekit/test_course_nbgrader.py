"""The nbgrader export: its structure, then the real nbgrader on it.

The fast tests read the exported notebook as JSON (no nbgrader needed). The slow test
runs the real tool in a scratch course directory, as an instructor would:
``nbgrader generate_assignment gradients``, then the reference solution and the
release left untouched as two students' submissions, ``nbgrader autograde
gradients``, and the scores read back from nbgrader's gradebook.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from coursekit import nbgrader
from coursekit._model import Assignment, TestCase
from coursekit.assignments import ASSIGNMENTS, get_assignment

IDS = sorted(ASSIGNMENTS)
# The real tool runs on one assignment: each run starts the tool and a kernel per
# notebook, and "gradients" costs the least CPU of the five (its two tools together
# about 50 s of CPU, "softmax" about 60 s). The export is the same code for all five,
# whose structure the fast tests check one by one.
TOOL_ASSIGNMENT = "gradients"


def _cells(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _source(cell: dict[str, Any]) -> str:
    src = cell["source"]
    return src if isinstance(src, str) else "".join(src)


def body_lines(reference: str) -> set[str]:
    """The stripped lines of the reference's function bodies that say something.

    Lines that also appear outside the bodies (signatures, docstrings, constants)
    and lines too short to carry an answer (``)``, ``else:``) are left out.
    """
    lines = reference.splitlines()
    inside: set[int] = set()
    for first, last, _ in nbgrader.body_spans(reference):
        inside.update(range(first, last + 1))
    body = {lines[k - 1].strip() for k in inside}
    outside = {line.strip() for k, line in enumerate(lines, 1) if k not in inside}
    return {
        line
        for line in body - outside
        if len(line) >= 6 and any(ch.isalnum() for ch in line)
    }


def leaked(reference: str, cells: list[dict[str, Any]]) -> list[str]:
    """The reference's body lines that appear as a line of some cell."""
    shown = {line.strip() for c in cells for line in _source(c).splitlines()}
    return sorted(body_lines(reference) & shown)


# --- the exported notebook, read as JSON -------------------------------------------


@pytest.mark.parametrize("aid", IDS)
def test_export_writes_source_notebook_and_config(aid: str, tmp_path: Path) -> None:
    assignment = get_assignment(aid)
    path = nbgrader.export(assignment, tmp_path / "course")
    assert path == tmp_path / "course" / "source" / aid / f"{aid}.ipynb"
    config = (tmp_path / "course" / "nbgrader_config.py").read_text()
    assert f"c.CourseDirectory.course_id = 'softmaxbook-{aid}'" in config
    compile(config, "nbgrader_config.py", "exec")  # valid Python

    cells = _cells(path)
    meta = [c["metadata"]["nbgrader"] for c in cells if "nbgrader" in c["metadata"]]
    ids = [m["grade_id"] for m in meta]
    assert len(ids) == len(set(ids)), "grade ids must be unique"
    assert all(m["schema_version"] == 3 for m in meta)

    # One autograded, read-only test cell per test, with its points.
    graded = [c for c in cells if c["metadata"].get("nbgrader", {}).get("grade")]
    assert [c["metadata"]["nbgrader"]["grade_id"] for c in graded] == [
        f"test_{t.name}" for t in assignment.tests
    ]
    for cell, test in zip(graded, assignment.tests):
        m = cell["metadata"]["nbgrader"]
        assert (m["points"], m["locked"], m["solution"]) == (test.points, True, False)
        src = _source(cell)
        assert f"incheck.run_test({aid!r}, {test.name!r}, globals())" in src
        hidden = nbgrader.BEGIN_HIDDEN in src and nbgrader.END_HIDDEN in src
        assert hidden == (test.visibility == "hidden"), test.name
    assert sum(c["metadata"]["nbgrader"]["points"] for c in graded) == pytest.approx(
        assignment.max_score()
    )


@pytest.mark.parametrize("aid", IDS)
def test_solution_cells_are_the_reference_with_marked_bodies(
    aid: str, tmp_path: Path
) -> None:
    assignment = get_assignment(aid)
    cells = _cells(nbgrader.export(assignment, tmp_path))
    code = [
        c
        for c in cells
        if c["cell_type"] == "code"
        and not c["metadata"].get("nbgrader", {}).get("grade")
    ]
    markers = (nbgrader.BEGIN_SOLUTION, nbgrader.END_SOLUTION)
    for cell in code:
        has_region = nbgrader.BEGIN_SOLUTION in _source(cell)
        assert cell["metadata"]["nbgrader"]["solution"] == has_region
        assert cell["metadata"]["nbgrader"]["locked"] == (not has_region)
    # Without the marker lines, the cells are the reference solution, statement for
    # statement (so the source notebook is the solution, and its grading is honest).
    joined = "\n\n".join(
        "\n".join(
            line for line in _source(c).splitlines() if line.strip() not in markers
        )
        for c in code
    )
    reference = assignment.reference_source()
    assert ast.dump(ast.parse(joined)) == ast.dump(ast.parse(reference))
    # Every body is marked: the regions together hold every body line.
    regions = {line.strip() for c in code for line in _regions(_source(c))}
    assert body_lines(reference) <= regions
    # Signatures stay outside the regions: each function the submission defines
    # is still defined once its regions are emptied.
    outside = "\n".join(
        line
        for c in code
        for line in _source(c).splitlines()
        if line.strip() not in _regions(_source(c))
    )
    for name in assignment.functions:
        assert f"def {name}(" in outside or f"class {name}" in outside, name


def _regions(source: str) -> list[str]:
    """The lines between solution markers, markers included."""
    found, inside = [], False
    for line in source.splitlines():
        if line.strip() == nbgrader.BEGIN_SOLUTION:
            inside = True
        if inside:
            found.append(line)
        if line.strip() == nbgrader.END_SOLUTION:
            inside = False
    return found


SAMPLE = '''"""A module."""

import math

LIMIT = 3  # kept


# about f
@staticmethod
def f(x):
    """Doc of f."""
    # a hint
    y = x + 1
    return y
    # trailing note


class K:
    """Doc of K."""

    SIZE = 2

    def g(self):
        return self.SIZE * math.pi

    def h(self):
        """Only a docstring."""


TAIL = 1
'''


def test_chunks_and_body_spans_of_a_small_module() -> None:
    chunks = nbgrader.source_chunks(SAMPLE)
    assert [(c.name, c.first, c.last) for c in chunks] == [
        ("", 1, 5),
        ("f", 8, 15),
        ("K", 18, 27),
        ("", 30, 30),
    ]
    assert chunks[1].text.startswith("# about f\n@staticmethod\ndef f(x):")
    # f: the comment above its first statement and the one after its last are in;
    # K.g's body is one line; K.h has only a docstring and nothing to hide.
    assert nbgrader.body_spans(SAMPLE) == [(12, 15, 4), (24, 24, 8)]
    marked = nbgrader.mark_solutions(SAMPLE, "### B", "### E")
    assert "    ### B\n    # a hint\n" in marked
    assert "    # trailing note\n    ### E\n" in marked
    assert (
        "        ### B\n        return self.SIZE * math.pi\n        ### E\n" in marked
    )


class _Fake(Assignment):
    """An assignment whose reference solution is given as text."""

    def __init__(self, source: str) -> None:
        test = TestCase(
            "t",
            1.0,
            "visible",
            ("f",),
            "f works",
            dict,
            lambda f, i: {},
            lambda i, o: None,
        )
        super().__init__("fake", "Fake", ("f",), (test,), "# Fake", "fake")
        object.__setattr__(self, "_source", source)

    def reference_source(self) -> str:
        return str(object.__getattribute__(self, "_source"))


def test_bad_input_is_refused_with_a_reason(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="assignment must be a coursekit Assignment"):
        nbgrader.export("softmax", tmp_path)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"body of f\(\) starts on its def line"):
        nbgrader.export(_Fake("def f(x): return x\n"), tmp_path)
    with pytest.raises(ValueError, match="'BEGIN SOLUTION', which nbgrader would"):
        nbgrader.export(
            _Fake("def f(x):\n    # BEGIN SOLUTION\n    return x\n"), tmp_path
        )


# --- the real nbgrader ----------------------------------------------------------


def _nbgrader(
    course: Path, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    # nbgrader runs `alembic` (its database migrations) by name: `env` has the
    # environment's bin folder on PATH, as it is in an activated environment.
    done = subprocess.run(
        [str(Path(sys.executable).parent / "nbgrader"), *args],
        cwd=course,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"nbgrader {' '.join(args)}:\n{done.stderr[-3000:]}"
    return done


@pytest.mark.slow
def test_real_nbgrader_gives_the_solution_full_marks_and_the_release_zero(
    tmp_path: Path, tool_env: dict[str, str]
) -> None:
    from nbgrader.api import Gradebook

    aid = TOOL_ASSIGNMENT
    assignment = get_assignment(aid)
    course = tmp_path / "course"
    source = nbgrader.export(assignment, course)

    _nbgrader(course, tool_env, "generate_assignment", aid)
    release = course / "release" / aid / f"{aid}.ipynb"
    released = _cells(release)
    assert leaked(assignment.reference_source(), released) == []
    assert not any(nbgrader.BEGIN_HIDDEN.strip("# ") in _source(c) for c in released)
    hidden = [t.name for t in assignment.tests if t.visibility == "hidden"]
    assert hidden, f"the {aid} assignment has hidden tests"
    assert not any(f"{name!r}" in _source(c) for c in released for name in hidden)
    assert any("raise NotImplementedError()" in _source(c) for c in released)

    for student, notebook in (("reference", source), ("untouched", release)):
        folder = course / "submitted" / student / aid
        folder.mkdir(parents=True)
        shutil.copy(notebook, folder / f"{aid}.ipynb")
    _nbgrader(course, tool_env, "autograde", aid)

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        scores = {}
        for student in ("reference", "untouched"):
            submission = gradebook.find_submission(aid, student)
            grades = {
                g.name: (g.score, g.max_score)
                for nb in submission.notebooks
                for g in nb.grades
            }
            scores[student] = (submission.score, submission.max_score, grades)
    expected = {f"test_{t.name}": t.points for t in assignment.tests}
    total = assignment.max_score()
    score, max_score, grades = scores["reference"]
    assert (score, max_score) == (pytest.approx(total), pytest.approx(total))
    assert grades == {name: (pts, pts) for name, pts in expected.items()}
    score, max_score, grades = scores["untouched"]
    assert (score, max_score) == (0.0, pytest.approx(total))
    assert grades == {name: (0.0, pts) for name, pts in expected.items()}
