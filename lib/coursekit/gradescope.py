"""Gradescope: the autograder zip, and what runs inside it.

:func:`build_autograder` writes a zip with, at its root:

* ``setup.sh``: run once by Gradescope when it builds the image. It makes a Python
  3.11+ virtual environment in ``/autograder/venv`` (Gradescope's Ubuntu 22.04 image
  has 3.10: it installs 3.11 with apt, or a standalone one with uv), installs the
  CPU-only torch wheel (754 MB, where the default CUDA wheel pulls gigabytes) at the
  version the zip was built with, then this package from the wheel inside the zip:
  nothing is fetched from this project's repository;
* ``run_autograder``: run for every submission; it grades the ``.py`` or ``.ipynb``
  in ``$AUTOGRADER_ROOT/submission`` (default ``/autograder``) and writes
  ``$AUTOGRADER_ROOT/results/results.json``, even when something goes wrong;
* ``softmaxbook-<version>-py3-none-any.whl``: the packages as installed here
  (``softmaxbook``, ``bookkit``, ``coursekit`` with its assignments), so the
  autograder grades with exactly the code the instructor tested; the reference
  solutions are left out (grading never reads them, and a submission runs in that
  image and could read any file there).

``python -m coursekit.gradescope run --assignment ID --root DIR`` is what
``run_autograder`` calls; it can be run anywhere to check a zip outside Gradescope.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.metadata
import importlib.util
import json
import re
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path

from ._model import Assignment
from .results import GradeResult, TestResult
from .submission import SubmissionError

__all__ = ["build_autograder", "build_wheel", "find_submission", "run_autograder"]

#: The packages the wheel carries (the whole ``softmaxbook`` distribution).
PACKAGES = ("softmaxbook", "bookkit", "coursekit")
#: Fixed timestamps: the same code gives the same zip, byte for byte.
_EPOCH = (2020, 1, 1, 0, 0, 0)
_SKIPPED_PARTS = ("__MACOSX", ".ipynb_checkpoints", "__pycache__")


def _version() -> str:
    from softmaxbook import __version__

    return str(__version__)


def _requirements() -> list[str]:
    try:
        found = importlib.metadata.requires("softmaxbook")
    except importlib.metadata.PackageNotFoundError:
        found = None
    return list(found or ["torch>=2.5", "numpy>=1.24"])


def _is_solution(name: str) -> bool:
    parts = name.split("/")
    return parts[:2] == ["coursekit", "assignments"] and parts[-1] == "solution.py"


def _package_files(package: str) -> list[tuple[str, bytes]]:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {package!r} is not installed")
    root = Path(next(iter(spec.submodule_search_locations)))
    files = []
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if (
            path.is_file()
            and path.suffix != ".pyc"
            and not any(
                p.startswith(".") or p in _SKIPPED_PARTS for p in relative.parts
            )
        ):
            files.append((f"{package}/{relative.as_posix()}", path.read_bytes()))
    return files


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"{name},sha256={digest.decode()},{len(data)}"


def build_wheel(out_dir: str | Path, *, solutions: bool = True) -> Path:
    """A pure-Python wheel of the installed ``softmaxbook`` distribution.

    Built from the package folders as Python imports them (a working tree or an
    installed copy), with the installed distribution's name, version and
    requirements, so ``pip install`` of it gives back the same code without
    network access to this project. With ``solutions=False`` the assignments'
    reference solutions (``coursekit/assignments/*/solution.py``, which grading
    never reads) are left out. Returns the wheel's path.
    """
    version = _version()
    dist_info = f"softmaxbook-{version}.dist-info"
    requirements = _requirements()
    extras = sorted(
        {m for r in requirements for m in re.findall(r'extra == "([^"]+)"', r)}
    )
    metadata = "\n".join(
        [
            "Metadata-Version: 2.1",
            "Name: softmaxbook",
            f"Version: {version}",
            "Summary: The library of 'Softmax in Attention', with its course kit.",
            "Requires-Python: >=3.11",
            *(f"Requires-Dist: {r}" for r in requirements),
            *(f"Provides-Extra: {e}" for e in extras),
            "",
        ]
    )
    wheel = "Wheel-Version: 1.0\nGenerator: coursekit\nRoot-Is-Purelib: true\n"
    wheel += "Tag: py3-none-any\n"
    entry_points = "[console_scripts]\nsoftmaxbook-course = coursekit.cli:main\n"
    files = [
        (name, data)
        for package in PACKAGES
        for name, data in _package_files(package)
        if solutions or not _is_solution(name)
    ]
    files += [
        (f"{dist_info}/METADATA", metadata.encode()),
        (f"{dist_info}/WHEEL", wheel.encode()),
        (f"{dist_info}/entry_points.txt", entry_points.encode()),
        (f"{dist_info}/top_level.txt", "\n".join(PACKAGES).encode() + b"\n"),
    ]
    record = [_record_line(name, data) for name, data in files]
    record.append(f"{dist_info}/RECORD,,")
    files.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode()))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"softmaxbook-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files:
            archive.writestr(zipfile.ZipInfo(name, _EPOCH), data)
    return path


def _torch_requirement() -> str:
    import torch

    release = torch.__version__.split("+")[0]
    if re.fullmatch(r"\d+\.\d+\.\d+", release):
        return f"torch=={release}"
    return "torch>=2.5"  # a nightly or a local build: the floor this package needs


SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image.
set -euo pipefail
SOURCE="$(cd "$(dirname "$0")" && pwd)"
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
VENV="$ROOT/venv"

# softmaxbook needs Python >= 3.11 (Gradescope's Ubuntu 22.04 image has 3.10).
PY=""
for candidate in python3.13 python3.12 python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
        "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
        PY="$(command -v "$candidate")"
        break
    fi
done
if [ -z "$PY" ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -y && apt-get install -y python3.11 python3.11-venv &&
        PY="$(command -v python3.11)" || PY=""
fi
if [ -n "$PY" ]; then
    "$PY" -m venv "$VENV"
else  # no Python 3.11 from apt: a standalone CPython, through uv
    python3 -m pip install --quiet uv
    python3 -m uv venv --seed --python 3.11 "$VENV"
fi

"$VENV/bin/python" -m pip install --quiet --upgrade pip
# CPU-only torch: the default wheel brings the CUDA libraries (gigabytes).
"$VENV/bin/python" -m pip install --quiet "{torch}" \\
    --index-url https://download.pytorch.org/whl/cpu
# This package at the version the zip was built with, from the wheel beside this
# script (its other requirements, such as numpy, come from PyPI).
"$VENV/bin/python" -m pip install --quiet "$SOURCE/{wheel}"
"$VENV/bin/python" -c "import coursekit, softmaxbook, torch; \\
print('softmaxbook', softmaxbook.__version__, 'torch', torch.__version__)"
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for every submission: it grades $ROOT/submission (a .py file
# or a notebook) on the assignment {assignment!r} and writes
# $ROOT/results/results.json. AUTOGRADER_ROOT moves the root (default /autograder),
# for a trial run outside Gradescope; COURSEKIT_PYTHON picks the Python.
# Everything is in one function, called on the last line: bash reads a script as it
# runs it, and the student's code (root on Gradescope) could rewrite this file.
main() {{
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
if [ -n "${{COURSEKIT_PYTHON:-}}" ]; then
    PY="$COURSEKIT_PYTHON"
elif [ -x "$ROOT/venv/bin/python" ]; then
    PY="$ROOT/venv/bin/python"
else
    PY="python3"
fi
"$PY" -m coursekit.gradescope run --assignment {assignment} --root "$ROOT" \\
    --timeout {timeout} --memory-mb {memory_mb} --total-timeout {total_timeout}
status=$?
if [ ! -s "$ROOT/results/results.json" ]; then
    # Gradescope needs a results file whatever happened.
    mkdir -p "$ROOT/results"
    why="The autograder could not run (exit status $status); your instructor"
    why="$why can read why in its output."
    printf '{{"score": 0, "output": "%s", "tests": []}}\\n' "$why" \\
        > "$ROOT/results/results.json"
fi
}}
main "$@"; exit 0
"""


def build_autograder(
    assignment: Assignment,
    out: str | Path,
    *,
    timeout: float = 10.0,
    memory_mb: int = 4096,
    total_timeout: float = 300.0,
) -> Path:
    """Write Gradescope's autograder zip for ``assignment`` to ``out``.

    ``timeout`` (seconds per test), ``memory_mb`` and ``total_timeout`` are the
    limits ``run_autograder`` grades with. Returns ``out``. Gradescope's own limit
    on a run (10 minutes by default) should exceed ``total_timeout``.
    """
    if not isinstance(assignment, Assignment):
        raise TypeError(
            "assignment must be a coursekit Assignment, got "
            f"{type(assignment).__name__}"
        )
    out = Path(out)
    if out.suffix != ".zip":
        raise ValueError(f"out must name a .zip file, got {str(out)!r}")
    out.parent.mkdir(parents=True, exist_ok=True)
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        # No reference solution in the image: student code there can read files.
        wheel = build_wheel(scratch, solutions=False)
        scripts = {
            "setup.sh": SETUP_SH.format(torch=_torch_requirement(), wheel=wheel.name),
            "run_autograder": RUN_AUTOGRADER.format(
                assignment=assignment.id,
                timeout=f"{timeout:g}",
                memory_mb=memory_mb,
                total_timeout=f"{total_timeout:g}",
            ),
        }
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, text in scripts.items():
                info = zipfile.ZipInfo(name, _EPOCH)
                info.external_attr = (0o100755 & 0xFFFF) << 16  # executable
                archive.writestr(info, text)
            archive.writestr(zipfile.ZipInfo(wheel.name, _EPOCH), wheel.read_bytes())
    return out


def find_submission(folder: str | Path, assignment: Assignment) -> Path:
    """The one ``.py`` or ``.ipynb`` file to grade in ``folder``.

    With several, the one named after the assignment (``softmax.py``,
    ``flash_attention.ipynb``, ``flash-attention.py``) or ``submission.*`` wins;
    otherwise :class:`~coursekit.submission.SubmissionError` lists the files.
    """
    folder = Path(folder)
    found = sorted(
        p
        for p in folder.rglob("*")
        if p.is_file()
        and p.suffix.lower() in (".py", ".ipynb")
        and not any(
            part.startswith(".") or part in _SKIPPED_PARTS
            for part in p.relative_to(folder).parts
        )
    )
    if len(found) == 1:
        return found[0]
    if not found:
        others = sorted(p.name for p in folder.rglob("*") if p.is_file())[:10]
        listed = f" (found: {', '.join(others)})" if others else ""
        raise SubmissionError(
            f"No .py or .ipynb file was submitted{listed}. Submit one file that "
            f"defines {', '.join(assignment.functions)}."
        )
    for stem in (assignment.package, assignment.id, "submission"):
        for p in found:
            if p.stem == stem:
                return p
    names = ", ".join(p.relative_to(folder).as_posix() for p in found)
    raise SubmissionError(
        f"Several files were submitted ({names}); submit one, or name the one to "
        f"grade {assignment.package}.py or {assignment.package}.ipynb."
    )


def run_autograder(
    assignment_id: str,
    root: str | Path,
    *,
    timeout: float = 10.0,
    memory_mb: int = 4096,
    total_timeout: float = 300.0,
) -> GradeResult:
    """Grade ``root/submission`` and write ``root/results/results.json``."""
    from .assignments import get_assignment
    from .sandbox import grade

    root = Path(root)
    assignment = get_assignment(assignment_id)
    try:
        path = find_submission(root / "submission", assignment)
    except SubmissionError as error:
        message = str(error)
        tests = [
            TestResult(
                t.name, 0.0, t.points, t.visibility, message, "error", t.description
            )
            for t in assignment.tests
        ]
        result = GradeResult.collect(assignment.id, tests, error=message)
    else:
        result = grade(
            assignment.id,
            path,
            timeout=timeout,
            memory_mb=memory_mb,
            total_timeout=total_timeout,
        )
    result.write_gradescope(root / "results" / "results.json")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m coursekit.gradescope run --assignment ID --root DIR [limits]``."""
    parser = argparse.ArgumentParser(
        prog="python -m coursekit.gradescope",
        description="Grade a Gradescope submission folder (what run_autograder calls).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="grade ROOT/submission into ROOT/results")
    run.add_argument("--assignment", required=True)
    run.add_argument("--root", default="/autograder")
    run.add_argument("--timeout", type=float, default=10.0)
    run.add_argument("--memory-mb", type=int, default=4096)
    run.add_argument("--total-timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    from ._process import prestart

    prestart()  # the student processes' torch loads while this one loads its own
    from softmaxbook import __version__

    print(f"softmaxbook {__version__}, coursekit from {Path(__file__).parent}")
    result = run_autograder(
        args.assignment,
        args.root,
        timeout=args.timeout,
        memory_mb=args.memory_mb,
        total_timeout=args.total_timeout,
    )
    print(result.table())
    print(json.dumps({"score": result.score, "max_score": result.max_score}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
