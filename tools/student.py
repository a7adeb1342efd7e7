"""Write student versions of the chapters: solutions removed, exercise outputs cleared.

Usage::

    python tools/student.py [--out DIR] [NOTEBOOK ...]

writes each notebook (by default every ``chapters/*.ipynb``) to ``DIR`` (by
default ``_build/student/``) under the same file name. ``make student`` runs it.
Everything that is not a solution stays as it is: text, code, figures, the
stored outputs of ordinary cells. The student version runs top to bottom.

The convention (cell tags are set in JupyterLab's property inspector, or in
the cell's ``metadata.tags`` list):

- In Markdown, every ``{solution}`` directive block of sphinx-exercise is
  removed, whatever its fence (``:::``, ``::::``, ```` ``` ````), and so is
  everything between the gated directives ``{solution-start}`` and
  ``{solution-end}``, across cells, except the code cells tagged ``solution``
  or ``exercise`` (below). The ``{exercise}`` blocks stay.
- A Markdown cell tagged ``solution`` is removed.
- A code cell tagged ``solution`` holds the reference answer of an
  "implement it yourself" exercise: imports and function definitions. The
  student version keeps the imports and each function's signature and
  docstring, replaces its body with ``raise NotImplementedError``, clears the
  outputs, and tags the cell ``answer`` (the cell the student edits) instead
  of ``solution`` (tags that hide the cell on the website, such as
  ``hide-input``, are dropped). A cell may give its own stub instead, as text
  in ``metadata.softmaxbook.stub``.
- A code cell tagged ``exercise`` (typically the call of a checker,
  ``sb.checks.check_softmax(my_softmax)``) keeps its code and loses its
  outputs: the student runs it to see the feedback. Since a checker reports a
  stub's ``NotImplementedError`` as a problem and never raises, the student
  version still runs top to bottom.

Only the standard library and ``nbformat`` (to validate the result) are used.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOLUTION_TAG, EXERCISE_TAG, ANSWER_TAG = "solution", "exercise", "answer"
HIDING_TAGS = ("hide-input", "hide-cell", "remove-input", "remove-cell")

# The opening fence of a MyST directive, ``:::{name}`` or ```` ```{name} ````.
_OPEN = re.compile(r"^[ \t]*(?P<fence>:{3,}|`{3,})\{(?P<name>[\w-]+)\}")


def _closes(line: str, fence: str) -> bool:
    """A line closing a fence: the same character, at least as many, nothing else."""
    stripped = line.strip()
    return len(stripped) >= len(fence) and set(stripped) == {fence[0]}


def _end_of_block(lines: list[str], start: int, fence: str) -> int:
    """Index of the line closing the block opened at ``start`` (or the last line).

    A nested block uses a shorter fence (``:::`` inside ``::::``), so its closing
    line is too short to close the outer one.
    """
    for i in range(start + 1, len(lines)):
        if _closes(lines[i], fence):
            return i
    return len(lines) - 1  # unclosed: MyST ends the block with the cell


def strip_solutions(text: str, gated: bool = False) -> tuple[str, int, bool]:
    """Remove ``{solution}`` blocks and gated solutions from Markdown text.

    ``gated`` says whether the text starts inside a ``{solution-start}`` ...
    ``{solution-end}`` region opened in an earlier cell. Returns the text, the
    number of solutions removed, and whether a gated region is still open.
    """
    lines = text.split("\n")
    kept, removed, i = [], 0, 0
    while i < len(lines):
        opened = _OPEN.match(lines[i])
        name = opened["name"] if opened else None
        if gated:
            if name == "solution-end":
                gated = False
                i = _end_of_block(lines, i, opened["fence"]) + 1
            else:
                i += 1
            continue
        if name == "solution":
            removed += 1
            i = _end_of_block(lines, i, opened["fence"]) + 1
        elif name == "solution-start":
            removed += 1
            gated = True
            i = _end_of_block(lines, i, opened["fence"]) + 1
        else:
            kept.append(lines[i])
            i += 1
    out = re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).strip("\n")
    return out, removed, gated


def stub(source: str) -> str:
    """The student's version of a solution cell: imports and signatures, no bodies.

    Each top-level function keeps its decorators, signature and docstring; its
    body becomes ``raise NotImplementedError``. Imports stay; every other
    statement is part of the answer and goes.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return "# Your code here\n"
    lines = source.split("\n")
    parts = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            parts.append(ast.get_source_segment(source, node))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            parts.append(_function_stub(node, lines))
    if not parts:
        return "# Your code here\n"
    return "\n\n\n".join(parts) + "\n"


def _function_stub(node, lines: list[str]) -> str:
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    body = node.body
    has_doc = (
        isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    )
    indent = " " * (body[0].col_offset if body[0].lineno > node.lineno else 4)
    if body[0].lineno > node.lineno:
        last = body[0].end_lineno if has_doc else body[0].lineno - 1
        header = "\n".join(lines[first - 1 : last])
    else:  # a one-line def: rebuild its signature
        bare = copy.copy(node)
        bare.body = [ast.Pass()]
        header = ast.unparse(bare).rsplit("\n", 1)[0]
    return (
        f"{header}\n{indent}# Your code here: replace the next line.\n"
        f"{indent}raise NotImplementedError({('write ' + node.name)!r})"
    )


def student_version(nb: dict) -> tuple[dict, dict]:
    """The student version of a notebook (a dict from ``json.load``), and counts."""
    nb = copy.deepcopy(nb)
    counts = {"solutions": 0, "stubs": 0, "cleared": 0}
    cells, gated = [], False
    for cell in nb["cells"]:
        tags = cell.get("metadata", {}).get("tags", [])
        source = (
            "".join(cell["source"])
            if isinstance(cell["source"], list)
            else cell["source"]
        )
        if cell["cell_type"] == "markdown":
            if SOLUTION_TAG in tags:
                counts["solutions"] += 1
                continue
            text, removed, gated = strip_solutions(source, gated)
            counts["solutions"] += removed
            if text.strip():
                cell["source"] = _as_lines(text)
                cells.append(cell)
            continue
        # A code cell between {solution-start} and {solution-end} goes, unless it is
        # the answer of an implement-it-yourself exercise (it becomes the stub the
        # student fills in) or the checker that grades it.
        if gated and not set(tags) & {SOLUTION_TAG, EXERCISE_TAG}:
            continue
        if cell["cell_type"] == "code" and SOLUTION_TAG in tags:
            custom = cell.get("metadata", {}).get("softmaxbook", {}).get("stub")
            cell["source"] = _as_lines(custom if custom is not None else stub(source))
            # The student edits this cell: it is no longer hidden on a page.
            cell["metadata"]["tags"] = [
                ANSWER_TAG if t == SOLUTION_TAG else t
                for t in tags
                if t not in HIDING_TAGS
            ]
            cell["metadata"].pop("softmaxbook", None)
            _clear(cell)
            counts["stubs"] += 1
        elif cell["cell_type"] == "code" and EXERCISE_TAG in tags:
            _clear(cell)
            counts["cleared"] += 1
        cells.append(cell)
    nb["cells"] = cells
    nb["metadata"].setdefault("softmaxbook", {})["student_version"] = True
    return nb, counts


def _as_lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _clear(cell: dict) -> None:
    cell["outputs"] = []
    cell["execution_count"] = None


def write_student_notebook(path: Path, out_dir: Path) -> tuple[Path, dict]:
    """Write the student version of ``path`` to ``out_dir``; return its path, counts."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    student, counts = student_version(nb)
    _validate(student, path)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / path.name
    target.write_text(
        json.dumps(student, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    return target, counts


def _validate(nb: dict, path: Path) -> None:
    import nbformat  # Jupyter's own schema check

    nbformat.validate(nbformat.from_dict(nb))
    for index, cell in enumerate(nb["cells"]):
        text = "".join(cell["source"])
        if re.search(r"\{solution(-start|-end)?\}", text) or SOLUTION_TAG in cell.get(
            "metadata", {}
        ).get("tags", []):
            raise ValueError(
                f"{path}: cell {index} of the student version still holds a solution"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "notebooks",
        nargs="*",
        type=Path,
        help="notebooks to convert (default: chapters/*.ipynb)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "_build" / "student",
        help="where to write them (default: _build/student)",
    )
    args = parser.parse_args(argv)
    notebooks = args.notebooks or sorted((ROOT / "chapters").glob("*.ipynb"))
    if not notebooks:
        parser.error("no notebooks found")
    for path in notebooks:
        target, counts = write_student_notebook(path, args.out)
        print(
            f"{path.name} -> {target}: {counts['solutions']} solution(s) removed, "
            f"{counts['stubs']} answer cell(s), {counts['cleared']} exercise "
            f"output(s) cleared"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
