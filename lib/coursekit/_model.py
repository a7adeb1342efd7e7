"""The data model of the course kit: an assignment and its tests.

A :class:`TestCase` is graded in two processes. The **grader's** process builds the
inputs (:attr:`TestCase.make_inputs`, seeded and deterministic) and judges what came
back (:attr:`TestCase.judge`, against float64 references it computes itself); the
**student's** process only calls the submission (:attr:`TestCase.run`) and returns
plain data (tensors, numbers, strings, booleans, and tuples, lists and dicts of them),
which crosses the process boundary through ``torch.save``/``torch.load(weights_only=
True)``. So a submission that patches torch cannot change what it is compared with.

Every test is all-or-nothing with its own points, so a score is monotone in
correctness: a stub (every body ``raise NotImplementedError``) scores 0.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

from coursekit import _cells as cells_

__all__ = ["Assignment", "TestCase", "Visibility", "make_stub_source"]

Visibility = Literal["visible", "hidden"]

#: ``run(functions, inputs) -> outputs``: called in the student's process.
RunFn = Callable[[Mapping[str, Callable[..., Any]], dict[str, Any]], dict[str, Any]]
#: ``judge(inputs, outputs) -> None | message``: called in the grader's process.
JudgeFn = Callable[[dict[str, Any], dict[str, Any]], "str | None"]


@dataclass(frozen=True)
class TestCase:
    """One all-or-nothing test of an assignment.

    Attributes
    ----------
    name
        Unique in its assignment, e.g. ``"softmax_rows_sum_to_one"``.
    points
        What passing it is worth (> 0).
    visibility
        ``"visible"`` (students see it and its message at once) or ``"hidden"``
        (shown after the due date).
    functions
        The submission's module-level names this test calls.
    description
        One line saying what it checks (shown to students).
    make_inputs
        Grader's process: returns the inputs (seeded, deterministic).
    run
        Student's process: ``run(functions, inputs)`` calls the submission's functions
        by name and returns plain data only.
    judge
        Grader's process: ``judge(inputs, outputs)`` returns None when passed, else a
        message a student can act on (what was given, expected, what came back, a
        hint).
    forbidden
        Names of the forbidden-call groups (see ``coursekit.forbidden``) enforced while
        ``run`` executes, e.g. ``("softmax", "sdpa", "softmaxbook", "entmax")``.
    """

    __test__ = False  # not a pytest test class, despite its name

    name: str
    points: float
    visibility: Visibility
    functions: tuple[str, ...]
    description: str
    make_inputs: Callable[[], dict[str, Any]]
    run: RunFn
    judge: JudgeFn
    forbidden: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"name must be an identifier, got {self.name!r}")
        if not self.points > 0:
            raise ValueError(f"points must be > 0, got {self.points!r} ({self.name})")
        if self.visibility not in ("visible", "hidden"):
            raise ValueError(
                f"visibility must be 'visible' or 'hidden', got {self.visibility!r}"
            )
        if not self.functions:
            raise ValueError(f"functions must name at least one function ({self.name})")


@dataclass(frozen=True)
class Assignment:
    """An assignment: what a submission defines, its tests and its spec.

    Attributes
    ----------
    id
        ``"softmax"``, ``"attention"``, ``"gradients"``, ``"flash-attention"`` or
        ``"sparse-maps"``.
    title
        One line.
    functions
        The module-level names a submission defines (functions, or a class such as
        ``FlashAttention``).
    tests
        The tests, in the order they are graded and shown.
    spec
        Markdown: what to implement, conventions, shapes, what is forbidden, points.
    package
        The data folder under ``coursekit/assignments/``, e.g. ``"flash_attention"``.
    """

    id: str
    title: str
    functions: tuple[str, ...]
    tests: tuple[TestCase, ...]
    spec: str
    package: str

    def __post_init__(self) -> None:
        names = [t.name for t in self.tests]
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            raise ValueError(f"test names must be unique in {self.id!r}: {duplicated}")
        for t in self.tests:
            unknown = [f for f in t.functions if f not in self.functions]
            if unknown:
                raise ValueError(f"test {t.name!r} calls unknown functions {unknown}")

    def max_score(self) -> float:
        """The sum of every test's points (visible and hidden)."""
        return float(sum(t.points for t in self.tests))

    def test(self, name: str) -> TestCase:
        """The test called ``name``; ``ValueError`` naming the known tests otherwise."""
        for t in self.tests:
            if t.name == name:
                return t
        known = ", ".join(t.name for t in self.tests)
        raise ValueError(f"{self.id!r} has no test {name!r}; its tests: {known}")

    def reference_source(self) -> str:
        """The reference solution: the text of ``<package>/solution.py``."""
        files = resources.files("coursekit.assignments").joinpath(self.package)
        return files.joinpath("solution.py").read_text(encoding="utf-8")

    def stub_source(self) -> str:
        """The reference module with every function body ``raise NotImplementedError``.

        Imports, module constants and classes are kept (methods are stubbed too), so a
        stub imports and defines every name a submission must define.
        """
        return make_stub_source(self.reference_source())

    def student_notebook(self) -> dict[str, Any]:
        """An nbformat-4 notebook (a dict): the spec, the stub, one check per test.

        Only the visible tests get a cell; each calls
        ``coursekit.incheck.run_test(id, name, globals())``, and a last cell prints the
        table of :func:`coursekit.incheck.check_notebook`.
        """
        cells: list[dict[str, Any]] = [cells_.markdown(self.spec)]
        cells.append(cells_.code(self.stub_source()))
        cells.append(
            cells_.markdown(
                "## Check your work\n\n"
                "Each cell below runs one of the visible tests on the functions you "
                "defined above. It prints nothing when the test passes and explains "
                "what went wrong otherwise. Hidden tests are run when you submit."
            )
        )
        cells.append(cells_.code("from coursekit import incheck"))
        for t in self.tests:
            if t.visibility != "visible":
                continue
            cells.append(
                cells_.code(
                    f"# {t.name} ({_pts(t.points)}): {t.description}\n"
                    f"incheck.run_test({self.id!r}, {t.name!r}, globals())"
                )
            )
        cells.append(cells_.code(f"incheck.check_notebook({self.id!r}, globals())"))
        return cells_.notebook(cells, id_prefix=self.package)


def _pts(points: float) -> str:
    return f"{points:g} point" + ("" if points == 1 else "s")


def make_stub_source(source: str) -> str:
    """``source`` with every function and method body replaced by a stub.

    Each public function and method keeps its signature and docstring, then ``raise
    NotImplementedError``; private module-level helpers (``_name``) are left out, since
    a submission need not have them. Everything else (imports, comments, module
    constants, classes and their attributes) stays as written, line for line.
    """
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, list[str]]] = []  # (first line, last line, new lines)
    for node in cells_.functions(tree.body):
        if node in tree.body and node.name.startswith("_"):
            start = min([d.lineno for d in node.decorator_list] + [node.lineno])
            end = node.end_lineno or node.lineno
            while end < len(lines) and not lines[end].strip():
                end += 1  # and the blank lines after it
            edits.append((start, end, []))
            continue
        body = node.body
        first = body[0]
        if body[0].lineno == node.lineno:  # a one-line def: use the syntax tree
            return _unparse_stub(tree)
        indent = " " * first.col_offset
        raise_line = [f"{indent}raise NotImplementedError\n"]
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            after = first.end_lineno or first.lineno
            if len(body) == 1:  # docstring only: add the raise after it
                edits.append((after + 1, after, raise_line))
                continue
            start = after + 1
        else:
            start = body[0].lineno
            while start - 1 > node.lineno and lines[start - 2].strip().startswith("#"):
                start -= 1  # comments above the first statement go too
        edits.append((start, node.end_lineno or body[-1].lineno, raise_line))
    for start, end, new in sorted(edits, reverse=True):
        lines[start - 1 : end] = new
    return "".join(lines)


def _unparse_stub(tree: ast.Module) -> str:
    tree.body = [
        n
        for n in tree.body
        if not (
            isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name[0] == "_"
        )
    ]
    for node in cells_.functions(tree.body):
        first = node.body[0]
        keep = (
            [first]
            if isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
            else []
        )
        node.body = [
            *keep,
            ast.Raise(
                exc=ast.Name(id="NotImplementedError", ctx=ast.Load()), cause=None
            ),
        ]
    ast.fix_missing_locations(tree)
    return ast.unparse(tree) + "\n"
