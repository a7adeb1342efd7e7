"""Export an assignment as an otter-grader master notebook (Otter Assign, v1 format).

:func:`export` writes ``DIR/<id>.ipynb``, the notebook an instructor gives to ``otter
assign``::

    otter assign DIR/<id>.ipynb DIR/dist

which writes ``dist/student/<id>.ipynb`` (solutions and hidden tests removed),
``dist/autograder/<id>.ipynb`` and the autograder zip, and grades the solution with
every test before it returns (``run_tests``).

The notebook follows otter's v1 format: a raw ``# ASSIGNMENT CONFIG`` cell, then one
question per function (or class) the submission defines, each delimited by raw ``#
BEGIN QUESTION`` / ``# END QUESTION`` cells. A question holds its prompt, its code
between raw ``# BEGIN SOLUTION`` / ``# END SOLUTION`` cells, and its tests between raw
``# BEGIN TESTS`` / ``# END TESTS`` cells. In the code, each function body sits
between ``# BEGIN SOLUTION NO PROMPT`` and ``# END SOLUTION`` lines and is followed by
a triple-quoted ``# BEGIN PROMPT`` string holding ``raise NotImplementedError``: otter
drops the body and shows the student the prompt, while the signature and docstring,
classes and module constants stay as written. Each test cell opens with otter's
``# BEGIN TEST CONFIG`` string (its points, whether it is hidden, its name in the
failure message) and calls :func:`coursekit.incheck.run_test`, which raises
``AssertionError`` with the test's message when the test fails; otter's OK-format
tests turn the call into a doctest that expects no output.

A test sits in the question of the last cell its functions need (the functions it calls
and the module-level names they use), so each question's check runs after everything it
calls is defined.

This module never imports otter: it writes the notebook as JSON, and the tests run the
real ``otter assign`` and ``otter run`` on it.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from coursekit import _cells as cells_
from coursekit._model import Assignment, TestCase
from coursekit.nbgrader import Chunk, body_spans, mark_solutions, source_chunks

__all__ = ["default_requirements", "export", "master_notebook"]

#: otter drops (or rewrites) source lines that end in these comments or contain
#: ``# SOLUTION``; a reference solution that holds one cannot be exported faithfully.
_OTTER_MARKERS = re.compile(
    r"#\s?SOLUTION|#\s*(BEGIN|END)\s*(SOLUTION|PROMPT|IGNORE|QUESTION|TESTS)"
    r"|#\s*(SEED|IGNORE)\s*$",
    re.IGNORECASE,
)

_BEGIN = "# BEGIN SOLUTION NO PROMPT"
_END = '# END SOLUTION\n""" # BEGIN PROMPT\nraise NotImplementedError\n""" # END PROMPT'

#: The CPU wheels of torch (the CUDA ones weigh about 5 GB).
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
REPOSITORY = "https://github.com/softmaxbook/softmax-in-attention"


def default_requirements() -> list[str]:
    """What the grading image installs beyond otter: CPU torch and this package.

    Returns
    -------
    list[str]
        pip requirement lines: the CPU index of torch, then ``softmaxbook[course]``
        at the installed version, from the book's repository.
    """
    from softmaxbook import __version__

    return [
        f"--extra-index-url {TORCH_CPU_INDEX}",
        f"softmaxbook[course] @ git+{REPOSITORY}@v{__version__}",
    ]


def export(
    assignment: Assignment,
    out_dir: str | Path,
    *,
    requirements: Sequence[str] | None = None,
) -> Path:
    """Write ``assignment`` as an Otter Assign master notebook, ``out_dir/<id>.ipynb``.

    Parameters
    ----------
    assignment
        The assignment; its reference solution is the notebook's solution.
    out_dir
        The folder (created when missing).
    requirements
        pip requirement lines for the grading image (otter adds itself); the default
        is :func:`default_requirements`.

    Returns
    -------
    Path
        The master notebook's path. Then ``otter assign <path> <dist>`` writes the
        student and autograder notebooks and the autograder zip.
    """
    if not isinstance(assignment, Assignment):
        raise TypeError(
            "assignment must be a coursekit Assignment, "
            f"got {type(assignment).__name__}"
        )
    reqs = default_requirements() if requirements is None else list(requirements)
    if not all(isinstance(r, str) for r in reqs):
        raise TypeError(f"requirements must be strings, got {reqs!r}")
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{assignment.id}.ipynb"
    notebook = master_notebook(assignment, requirements=reqs)
    path.write_text(json.dumps(notebook, indent=1) + "\n", encoding="utf-8")
    return path


def master_notebook(
    assignment: Assignment, *, requirements: Sequence[str] = ()
) -> dict[str, Any]:
    """The Otter Assign master notebook of ``assignment``, as an nbformat-4 dict."""
    reference = assignment.reference_source()
    for number, line in enumerate(reference.splitlines(), 1):
        if _OTTER_MARKERS.search(line):
            raise ValueError(
                f"assignment {assignment.id!r}: line {number} of the reference "
                f"solution ({line.strip()!r}) holds a comment otter reads as a marker"
            )
    chunks = source_chunks(reference)
    has_body = [bool(body_spans(c.text)) for c in chunks]
    owner = _owners(assignment, chunks, has_body)
    placement = _test_placement(assignment, chunks, owner)

    cells: list[dict[str, Any]] = [
        cells_.raw(_assignment_config(assignment, requirements)),
        cells_.markdown(assignment.spec),
    ]
    question: int | None = None
    for k, chunk in enumerate(chunks):
        head = owner[k]
        if head is not None and head != question:
            question = head
            cells += _question_start(assignment, chunks[head])
        text = chunk.text
        if has_body[k]:
            text = mark_solutions(text, _BEGIN, _END)
            cells += [
                cells_.raw("# BEGIN SOLUTION"),
                cells_.code(text),
                cells_.raw("# END SOLUTION"),
            ]
        else:
            cells.append(cells_.code(text))
        last_of_question = k + 1 == len(chunks) or owner[k + 1] != question
        if question is not None and last_of_question:
            tests = [t for t in assignment.tests if placement[t.name] == question]
            if tests:
                cells.append(cells_.raw("# BEGIN TESTS"))
                cells += [cells_.code(_test_source(assignment.id, t)) for t in tests]
                cells.append(cells_.raw("# END TESTS"))
            cells.append(cells_.raw("# END QUESTION"))
    return cells_.notebook(cells, id_prefix="cell")


def _owners(
    assignment: Assignment, chunks: list[Chunk], has_body: list[bool]
) -> list[int | None]:
    """The question (a chunk index) each chunk belongs to, None before the first.

    A question is a chunk that defines one of the assignment's functions (every chunk
    with a body when none does). Other chunks join the next question, or the last one
    after it; the chunks before the first body (imports, constants) stay outside
    questions.
    """
    heads = [k for k, c in enumerate(chunks) if c.name in assignment.functions]
    if not heads:
        heads = [k for k, body in enumerate(has_body) if body]
    if not heads:
        raise ValueError(
            f"assignment {assignment.id!r}: the reference solution defines no function"
        )
    start = min([heads[0], *(k for k, body in enumerate(has_body) if body)])
    owners: list[int | None] = []
    for k in range(len(chunks)):
        following = [h for h in heads if h >= k]
        owners.append(None if k < start else following[0] if following else heads[-1])
    return owners


def _test_placement(
    assignment: Assignment, chunks: list[Chunk], owner: list[int | None]
) -> dict[str, int]:
    """The question of each test: that of the last chunk the test's functions need."""
    defines: dict[str, int] = {}
    uses: list[set[str]] = []
    for k, chunk in enumerate(chunks):
        tree = ast.parse(chunk.text)
        for node in tree.body:
            for name in _bound_names(node):
                defines.setdefault(name, k)
        uses.append(
            {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
            | {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        )
    first_question = next(o for o in owner if o is not None)
    placement: dict[str, int] = {}
    for test in assignment.tests:
        needed = {defines[f] for f in test.functions if f in defines}
        todo = list(needed)
        while todo:
            k = todo.pop()
            for name in uses[k]:
                j = defines.get(name)
                if j is not None and j not in needed:
                    needed.add(j)
                    todo.append(j)
        last = max(needed, default=0)
        question = owner[last]
        placement[test.name] = first_question if question is None else question
    return placement


def _bound_names(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.Import | ast.ImportFrom):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, ast.AnnAssign | ast.AugAssign):
        targets = [node.target]
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def _assignment_config(assignment: Assignment, requirements: Sequence[str]) -> str:
    lines = [
        "# ASSIGNMENT CONFIG",
        f"name: {json.dumps(assignment.id)}",
        "# Students submit the notebook itself: no PDF, no export zip.",
        "init_cell: true",
        "check_all_cell: true",
        "export_cell: false",
        "# The Gradescope zip; otter assign also grades the solution with it.",
        "generate:",
        "  pdf: false",
        "  show_stdout: true",
        "run_tests: true",
        'python_version: "3.11"',
        "tests:",
        "  files: false",
        "  ok_format: true",
    ]
    if requirements:
        lines.append("requirements:")
        lines += [f"  - {json.dumps(r)}" for r in requirements]
    return "\n".join(lines)


def _question_start(assignment: Assignment, head: Chunk) -> list[dict[str, Any]]:
    tests = [t for t in assignment.tests if head.name in t.functions]
    points = sum(t.points for t in tests)
    kind = "class" if head.text.lstrip().startswith(("class ", "@")) else "function"
    prompt = f"### `{head.name}`\n\nWrite the body of the {kind} `{head.name}` below"
    prompt += " (the line `raise NotImplementedError` marks where)."
    if tests:
        prompt += f" Tests that call it are worth {points:g} points in all."
    return [
        cells_.raw(f"# BEGIN QUESTION\nname: {json.dumps(head.name)}"),
        cells_.markdown(prompt),
    ]


def _test_source(assignment_id: str, test: TestCase) -> str:
    config = {
        "points": test.points,
        "hidden": test.visibility == "hidden",
        "failure_message": f"{test.name}: {test.description}",
    }
    body = "\n".join(f"{key}: {json.dumps(value)}" for key, value in config.items())
    return (
        f'""" # BEGIN TEST CONFIG\n{body}\n""" # END TEST CONFIG\n'
        "from coursekit import incheck\n"
        f"incheck.run_test({assignment_id!r}, {test.name!r}, globals())"
    )
