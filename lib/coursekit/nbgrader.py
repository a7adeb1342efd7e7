"""Export an assignment as an nbgrader source notebook.

:func:`export` writes an nbgrader course directory::

    COURSE_DIR/
        nbgrader_config.py
        source/<id>/<id>.ipynb

The source notebook holds the spec (a read-only Markdown cell), the reference
solution split into one cell per function or class, each function's body between ``###
BEGIN SOLUTION`` and ``### END SOLUTION`` (its signature and docstring outside, so the
released notebook keeps them; classes and module constants are kept as written), and one
autograded test cell per :class:`~coursekit._model.TestCase` carrying its points. A
hidden test's call sits between ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN
TESTS``: ``nbgrader generate_assignment`` removes it from the release and ``nbgrader
autograde`` puts it back. Each test cell calls :func:`coursekit.incheck.run_test`, which
raises ``AssertionError`` with the test's message when the test fails, so nbgrader
awards the cell's points exactly when the test passes.

This module never imports nbgrader: it writes JSON in nbgrader's cell-metadata format
(schema version 3), and the tests run the real ``nbgrader`` on it.

The helpers :func:`source_chunks` and :func:`body_spans` are shared with
:mod:`coursekit.otter`, which marks the same regions in otter-grader's syntax.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coursekit import _cells as cells_
from coursekit._model import Assignment, TestCase

__all__ = [
    "BEGIN_HIDDEN",
    "BEGIN_SOLUTION",
    "END_HIDDEN",
    "END_SOLUTION",
    "Chunk",
    "body_spans",
    "export",
    "mark_solutions",
    "source_chunks",
]

BEGIN_SOLUTION = "### BEGIN SOLUTION"
END_SOLUTION = "### END SOLUTION"
BEGIN_HIDDEN = "### BEGIN HIDDEN TESTS"
END_HIDDEN = "### END HIDDEN TESTS"

#: nbgrader's cell-metadata format (nbgrader 0.6 and later write version 3).
SCHEMA_VERSION = 3

#: Seconds nbgrader gives one cell when it autogrades (its default is 30, too little
#: for the FlashAttention tests on a busy CPU).
CELL_TIMEOUT = 600


@dataclass(frozen=True)
class Chunk:
    """A run of top-level statements of a module, shown as one notebook cell.

    Attributes
    ----------
    name
        The function's or class's name; ``""`` for a run of other statements
        (imports, constants, the module docstring).
    first, last
        The chunk's first and last line, 1-based and inclusive, in the module.
    text
        Those lines, without trailing blank lines.
    """

    name: str
    first: int
    last: int
    text: str


def source_chunks(source: str) -> list[Chunk]:
    """Split a module into cells: one per top-level function or class, others grouped.

    A function's or class's chunk starts at its first decorator, or at the comment
    lines directly above it, and runs up to the next chunk; consecutive other
    statements (imports, constants) form one chunk. Joining the chunks' lines gives
    the module back, up to blank lines between chunks.

    Parameters
    ----------
    source
        A Python module's text.

    Returns
    -------
    list[Chunk]
        The chunks in source order.
    """
    tree = ast.parse(source)
    lines = source.splitlines()
    starts: list[tuple[int, str]] = []  # (first line, name or "") of each chunk
    previous_was_def = True
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            while first > 1 and lines[first - 2].lstrip().startswith("#"):
                first -= 1
            starts.append((first, node.name))
            previous_was_def = True
        elif previous_was_def:  # a run of other statements starts here
            starts.append((node.lineno, ""))
            previous_was_def = False
    if not starts:
        return [Chunk("", 1, len(lines), source.rstrip())] if source.strip() else []
    starts[0] = (1, starts[0][1]) if starts[0][1] == "" else starts[0]
    if starts[0][0] > 1:  # a docstring or comments before the first def: own chunk
        starts.insert(0, (1, ""))
    chunks: list[Chunk] = []
    for k, (first, name) in enumerate(starts):
        end = starts[k + 1][0] - 1 if k + 1 < len(starts) else len(lines)
        body = lines[first - 1 : end]
        while body and not body[-1].strip():
            body.pop()
        if body:
            chunks.append(Chunk(name, first, first + len(body) - 1, "\n".join(body)))
    return chunks


def body_spans(source: str) -> list[tuple[int, int, int]]:
    """The line span of every function body that a student must write.

    A body runs from the first statement after the docstring (with the comment
    lines just above it) to the function's last line, plus the comment lines right
    after it that are indented as the body. Methods of classes count; functions
    nested in a body are part of that body. A function whose body is only its
    docstring has nothing to hide and no span.

    Parameters
    ----------
    source
        A Python module's text.

    Returns
    -------
    list[tuple[int, int, int]]
        ``(first, last, indent)`` per body, 1-based inclusive lines and the body's
        indentation in columns, in source order.

    Raises
    ------
    ValueError
        When a function's body starts on its ``def`` line (``def f(x): return x``):
        such a body cannot be marked line by line.
    """
    tree = ast.parse(source)
    lines = source.splitlines()
    spans: list[tuple[int, int, int]] = []
    for node in cells_.functions(tree.body):
        body = list(node.body)
        if body[0].lineno == node.lineno:
            raise ValueError(
                f"source: the body of {node.name}() starts on its def line "
                f"(line {node.lineno}); put it on its own lines"
            )
        if _is_docstring(body[0]):
            body = body[1:]
            if not body:
                continue
        indent = body[0].col_offset
        first = body[0].lineno
        while first - 1 > node.lineno and _is_comment_at(lines[first - 2], indent):
            first -= 1
        last = node.end_lineno or body[-1].lineno
        while last < len(lines) and _is_comment_at(lines[last], indent):
            last += 1
        spans.append((first, last, indent))
    return sorted(spans)


def mark_solutions(source: str, begin: str, end: str) -> str:
    """``source`` with every function body (see :func:`body_spans`) between markers.

    Parameters
    ----------
    source
        A Python module's text.
    begin, end
        The markers, e.g. ``"### BEGIN SOLUTION"`` and ``"### END SOLUTION"``; each
        of their lines is written on its own line at the body's indentation.

    Returns
    -------
    str
        The marked module; removing the markers' lines gives ``source`` back.
    """
    lines = source.splitlines()
    for first, last, indent in reversed(body_spans(source)):
        pad = " " * indent
        lines[last:last] = [pad + line for line in end.splitlines()]
        lines[first - 1 : first - 1] = [pad + line for line in begin.splitlines()]
    return "\n".join(lines) + ("\n" if source.endswith("\n") else "")


def export(assignment: Assignment, out_dir: str | Path) -> Path:
    """Write ``assignment`` as an nbgrader course directory.

    Parameters
    ----------
    assignment
        The assignment; its reference solution is the solution of the source
        notebook.
    out_dir
        The course directory (created when missing). ``nbgrader_config.py`` and
        ``source/<id>/<id>.ipynb`` are written into it; other files are left alone.

    Returns
    -------
    Path
        The source notebook's path.

    Examples
    --------
    Then, in ``out_dir``: ``nbgrader generate_assignment <id>`` writes the release
    (solutions and hidden tests removed) and, once submissions are collected in
    ``submitted/<student>/<id>/``, ``nbgrader autograde <id>`` grades them.
    """
    if not isinstance(assignment, Assignment):
        raise TypeError(
            "assignment must be a coursekit Assignment, "
            f"got {type(assignment).__name__}"
        )
    root = Path(out_dir)
    notebook = source_notebook(assignment)
    folder = root / "source" / assignment.id
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{assignment.id}.ipynb"
    path.write_text(json.dumps(notebook, indent=1) + "\n", encoding="utf-8")
    (root / "nbgrader_config.py").write_text(_config(assignment), encoding="utf-8")
    return path


def source_notebook(assignment: Assignment) -> dict[str, Any]:
    """The nbgrader source notebook of ``assignment``, as an nbformat-4 dict."""
    reference = assignment.reference_source()
    for marker in (BEGIN_SOLUTION, END_SOLUTION, BEGIN_HIDDEN, END_HIDDEN):
        # nbgrader finds a marker anywhere in a line, so the text must not hold one.
        if marker.lstrip("# ") in reference:
            raise ValueError(
                f"assignment {assignment.id!r}: the reference solution contains "
                f"{marker.lstrip('# ')!r}, which nbgrader would read as a marker"
            )
    marked_chunks = source_chunks(
        mark_solutions(reference, BEGIN_SOLUTION, END_SOLUTION)
    )
    cells: list[dict[str, Any]] = [
        _cell("markdown", assignment.spec, grade_id="spec", locked=True),
        _cell(
            "markdown",
            "## Your implementation\n\n"
            "Write the body of each function below (the lines `raise "
            "NotImplementedError()` mark where), keeping its name and signature. "
            "Cells that are not yours to edit are read-only.",
        ),
    ]
    for k, chunk in enumerate(marked_chunks):
        if BEGIN_SOLUTION in chunk.text:
            cells.append(
                _cell(
                    "code",
                    chunk.text,
                    grade_id=f"solution_{chunk.name or k}",
                    solution=True,
                )
            )
        else:
            cells.append(
                _cell(
                    "code", chunk.text, grade_id=f"given_{chunk.name or k}", locked=True
                )
            )
    cells.append(
        _cell(
            "markdown",
            "## Tests\n\n"
            "Each cell below runs one test on your functions and is worth the points "
            "it names. It prints nothing when the test passes and explains what went "
            "wrong otherwise. Hidden tests run only when your work is graded.",
        )
    )
    for test in assignment.tests:
        cells.append(
            _cell(
                "code",
                _test_source(assignment.id, test),
                grade_id=f"test_{test.name}",
                grade=True,
                locked=True,
                points=test.points,
            )
        )
    return cells_.notebook(cells, id_prefix="cell")


def _test_source(assignment_id: str, test: TestCase) -> str:
    points = f"{test.points:g} point" + ("" if test.points == 1 else "s")
    call = (
        "from coursekit import incheck\n\n"
        f"incheck.run_test({assignment_id!r}, {test.name!r}, globals())"
    )
    if test.visibility == "visible":
        return f"# {test.name} ({points}): {test.description}\n{call}"
    return (
        f"# Hidden test {test.name} ({points}): {test.description}\n"
        "# It runs when your work is graded.\n"
        f"{BEGIN_HIDDEN}\n{call}\n{END_HIDDEN}"
    )


def _cell(
    cell_type: str,
    source: str,
    *,
    grade_id: str | None = None,
    grade: bool = False,
    solution: bool = False,
    locked: bool = False,
    points: float | None = None,
) -> dict[str, Any]:
    cell: dict[str, Any] = {"cell_type": cell_type, "metadata": {}, "source": source}
    if cell_type == "code":
        cell["execution_count"] = None
        cell["outputs"] = []
    if grade_id is not None:
        meta: dict[str, Any] = {
            "grade": grade,
            "grade_id": grade_id,
            "locked": locked,
            "schema_version": SCHEMA_VERSION,
            "solution": solution,
            "task": False,
        }
        if grade:
            meta["points"] = points
        cell["metadata"]["nbgrader"] = meta
    return cell


def _config(assignment: Assignment) -> str:
    return (
        f"# nbgrader's configuration for the softmaxbook assignment {assignment.id!r}\n"
        "# (written by `softmaxbook-course nbgrader`). The course kit's test cells\n"
        "# import coursekit, so the kernel that grades needs softmaxbook[course].\n"
        "c = get_config()  # noqa: F821 (nbgrader defines it)\n"
        f"c.CourseDirectory.course_id = {'softmaxbook-' + assignment.id!r}\n"
        "# One test may run a few seconds on a busy CPU; nbgrader's default is 30 s.\n"
        f"c.Execute.timeout = {CELL_TIMEOUT}\n"
    )


def _is_docstring(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def _is_comment_at(line: str, indent: int) -> bool:
    stripped = line.lstrip()
    return stripped.startswith("#") and len(line) - len(stripped) >= indent
