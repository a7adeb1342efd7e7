"""Reading a submission: a ``.py`` module, or a notebook's code cells.

A ``.py`` file is one piece of code, imported as a whole: if it does not compile or
raises while it runs, nothing of it is graded. A notebook (``.ipynb``, read as JSON,
no nbformat needed) becomes one piece per code cell, run in order in one namespace,
as Jupyter runs them: a cell that raises is reported and the next cells still run, so
one stray cell costs only the functions it fails to define. IPython syntax is dropped
(lines starting with ``%``, ``%%`` or ``!``, ``get_ipython()`` calls), as are the
cells the student notebook uses to check itself (they call
``coursekit.incheck``) and cells tagged ``coursekit-skip``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Chunk", "Submission", "SubmissionError", "load_submission"]

#: The largest submission read (a notebook with big stored outputs is still far
#: below this; the outputs are ignored).
MAX_BYTES = 20_000_000

_MAGIC = re.compile(r"^\s*(%|!)")
# IPython's help (``softmax?``, ``??softmax``) and a magic's value assigned
# (``files = !ls``, ``t = %timeit -o f(x)``): only where the line does not compile.
_HELP = re.compile(r"^(\s*)(\?\??\s*[\w.]+|[\w.]+\s*\?\??)\s*$")
_MAGIC_VALUE = re.compile(r"^(\s*[\w.]+(\s*,\s*[\w.]+)*\s*=\s*)(%|!)")
_SKIP_TAG = "coursekit-skip"


class SubmissionError(ValueError):
    """The submission cannot be read (missing, not .py or .ipynb, invalid JSON)."""


@dataclass(frozen=True)
class Chunk:
    """One piece of code: a whole ``.py`` file, or one notebook cell.

    ``filename`` is what tracebacks and messages show, e.g. ``"softmax.py"`` or
    ``"softmax.ipynb, cell 3"``.
    """

    source: str
    filename: str
    label: str


@dataclass(frozen=True)
class Submission:
    """A submission ready to run: its pieces of code, in order.

    ``kind`` is ``"py"`` (one chunk, all or nothing) or ``"ipynb"`` (one chunk per
    code cell, each on its own). ``notes`` says what was left out and why.
    """

    path: str
    kind: str
    chunks: tuple[Chunk, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def all_or_nothing(self) -> bool:
        return self.kind == "py"


def load_submission(path: str | Path) -> Submission:
    """Read ``path`` (``.py`` or ``.ipynb``) into a :class:`Submission`.

    Raises :class:`SubmissionError` (a ``ValueError``) naming the problem when the
    file is missing, too large, of another type, or not a notebook.
    """
    path = Path(path)
    if not path.is_file():
        raise SubmissionError(f"submission: no file at {path}")
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise SubmissionError(
            f"submission: {path.name} is {size / 1e6:.0f} MB; the grader reads "
            f"files up to {MAX_BYTES / 1e6:.0f} MB"
        )
    suffix = path.suffix.lower()
    if suffix == ".py":
        source = _read_text(path)
        return Submission(str(path), "py", (Chunk(source, path.name, path.name),))
    if suffix == ".ipynb":
        return _load_notebook(path)
    raise SubmissionError(
        f"submission: {path.name} is neither a Python file (.py) nor a notebook "
        "(.ipynb)"
    )


def _read_text(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise SubmissionError(
            f"submission: {path.name} is not UTF-8 text ({error.reason} at byte "
            f"{error.start})"
        ) from None


def _load_notebook(path: Path) -> Submission:
    try:
        notebook = json.loads(_read_text(path))
    except json.JSONDecodeError as error:
        raise SubmissionError(
            f"submission: {path.name} is not a notebook: invalid JSON at line "
            f"{error.lineno} ({error.msg})"
        ) from None
    cells = notebook.get("cells") if isinstance(notebook, dict) else None
    if not isinstance(cells, list):
        raise SubmissionError(f"submission: {path.name} is not a notebook (no cells)")
    chunks: list[Chunk] = []
    notes: list[str] = []
    number = 0
    for cell in cells:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        number += 1
        source = cell.get("source", "")
        if isinstance(source, list):
            source = "".join(str(s) for s in source)
        source = str(source)
        label = f"cell {number}"
        tags = (cell.get("metadata") or {}).get("tags") or []
        if _SKIP_TAG in tags or is_check_cell(source):
            continue
        code = strip_ipython(source)
        if not code.strip():
            continue
        chunks.append(Chunk(code, f"{path.name}, {label}", label))
    if not chunks:
        notes.append(f"{path.name} has no code cells to run.")
    return Submission(str(path), "ipynb", tuple(chunks), tuple(notes))


def is_check_cell(source: str) -> bool:
    """True for the student notebook's own check cells (they call ``incheck``)."""
    lines = [
        line.strip()
        for line in source.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    if not lines:
        return False
    return all(
        line.startswith(("incheck.", "coursekit.incheck."))
        or line in ("from coursekit import incheck", "import coursekit.incheck")
        for line in lines
    )


#: Cell magics whose body is Python run in the notebook's namespace.
_PYTHON_CELL_MAGICS = ("time", "timeit", "capture", "prun")


def strip_ipython(source: str) -> str:
    """``source`` without IPython-only lines.

    Each dropped line becomes ``pass`` at its indentation, so line numbers (and an
    ``if`` body made only of a magic) stay valid. A cell magic that runs Python
    (``%%time``, ``%%timeit``, ``%%capture``, ``%%prun``) loses its first line
    only; any other (``%%bash``, ``%%writefile``, ...) drops the cell.
    """
    head = source.lstrip()
    if head.startswith("%%"):
        magic = head[2:].split(maxsplit=1)[0] if head[2:].strip() else ""
        if magic not in _PYTHON_CELL_MAGICS:
            return ""
    out = []
    for line in source.splitlines():
        stripped = line.lstrip()
        if _MAGIC.match(line) or stripped.startswith("get_ipython()"):
            out.append(line[: len(line) - len(stripped)] + "pass")
        else:
            out.append(line)
    _rewrite_ipython_lines(out)
    return "\n".join(out) + ("\n" if source.endswith("\n") else "")


def _rewrite_ipython_lines(lines: list[str]) -> None:
    """Rewrite, in place, the lines that stop ``lines`` compiling and are IPython.

    ``name?`` becomes ``pass`` and ``x = !cmd`` / ``x = %magic`` becomes
    ``x = None``, one line at a time, each only where Python reports its syntax
    error (a docstring line such as ``Why?`` is never touched).
    """
    for _ in range(len(lines)):
        try:
            compile("\n".join(lines), "<cell>", "exec")
            return
        except SyntaxError as error:
            index = (error.lineno or 0) - 1
        except (ValueError, OverflowError):  # null bytes and the like: Python says so
            return
        if not 0 <= index < len(lines):
            return
        line = lines[index]
        help_line = _HELP.match(line)
        value = _MAGIC_VALUE.match(line)
        if help_line:
            lines[index] = help_line.group(1) + "pass"
        elif value:
            lines[index] = value.group(1) + "None"
        else:
            return
