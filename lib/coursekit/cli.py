"""``softmaxbook-course``: the course kit's command line.

Run ``softmaxbook-course --help``, or ``softmaxbook-course COMMAND --help``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["main"]

DESCRIPTION = """\
The course kit of 'Softmax in Attention': five graded assignments, a grader that
student code cannot break, and exports to Gradescope, nbgrader and otter-grader.

A typical course:
  softmaxbook-course list                                  # the assignments
  softmaxbook-course student softmax --out softmax.ipynb   # what students get
  softmaxbook-course solution softmax --out solution.py    # the reference
  softmaxbook-course grade softmax solution.py             # full marks
  softmaxbook-course gradescope softmax --out autograder.zip
"""

LIMITS = """\
Each test runs in a separate process, under a time limit per test (--timeout), a
memory limit (--memory-mb, beyond what torch itself maps) and a limit on the whole
run (--total-timeout). An endless loop, sys.exit, os._exit, a crash or an import
error costs only the tests it touches, and a function that timed out is not called
again. In from-scratch tests, torch's softmax, log_softmax, cross_entropy and
scaled_dot_product_attention, softmaxbook and entmax are forbidden calls: a test that
reaches one fails and its message names the call and the line that made it.
"""


def _assignment(assignment_id: str) -> Any:
    from .assignments import get_assignment

    try:
        return get_assignment(assignment_id)
    except ValueError as error:
        raise SystemExit(f"softmaxbook-course: {error}") from None


def _out_path(value: str, suffix: str) -> Path:
    path = Path(value)
    if path.suffix.lower() != suffix:
        raise SystemExit(
            f"softmaxbook-course: --out must end in {suffix}, got {value!r}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def cmd_list(args: argparse.Namespace) -> int:
    from .assignments import ASSIGNMENTS

    if args.json:
        print(
            json.dumps(
                [
                    {
                        "id": a.id,
                        "title": a.title,
                        "functions": list(a.functions),
                        "points": a.max_score(),
                        "tests": [
                            {
                                "name": t.name,
                                "points": t.points,
                                "visibility": t.visibility,
                            }
                            for t in a.tests
                        ],
                    }
                    for a in ASSIGNMENTS.values()
                ],
                indent=2,
            )
        )
        return 0
    for a in ASSIGNMENTS.values():
        visible = [t for t in a.tests if t.visibility == "visible"]
        hidden = [t for t in a.tests if t.visibility == "hidden"]
        print(f"{a.id}: {a.title}")
        print(f"  functions: {', '.join(a.functions)}")
        print(
            f"  {a.max_score():g} points: {len(visible)} visible tests "
            f"({sum(t.points for t in visible):g} points), {len(hidden)} hidden "
            f"({sum(t.points for t in hidden):g} points)"
        )
    return 0


def cmd_solution(args: argparse.Namespace) -> int:
    assignment = _assignment(args.id)
    out = _out_path(args.out, ".py")
    out.write_text(assignment.reference_source(), encoding="utf-8")
    print(f"wrote {out}: the reference solution of {assignment.id!r}")
    return 0


def cmd_stub(args: argparse.Namespace) -> int:
    assignment = _assignment(args.id)
    out = _out_path(args.out, ".py")
    out.write_text(assignment.stub_source(), encoding="utf-8")
    print(f"wrote {out}: the stub of {assignment.id!r} (scores 0)")
    return 0


def cmd_student(args: argparse.Namespace) -> int:
    assignment = _assignment(args.id)
    out = _out_path(args.out, ".ipynb")
    notebook = assignment.student_notebook()
    out.write_text(json.dumps(notebook, indent=1) + "\n", encoding="utf-8")
    _validate(out)
    print(f"wrote {out}: the student notebook of {assignment.id!r} (no solutions)")
    return 0


def cmd_grade(args: argparse.Namespace) -> int:
    from ._process import prestart

    prestart()  # the student processes' torch loads while this one loads its own
    from .sandbox import grade

    assignment = _assignment(args.id)
    result = grade(
        assignment.id,
        args.submission,
        timeout=args.timeout,
        memory_mb=args.memory_mb,
        total_timeout=args.total_timeout,
    )
    print(result.table())
    if args.results:
        path = result.write_gradescope(args.results)
        print(f"wrote {path}")
    return 0


def cmd_gradescope(args: argparse.Namespace) -> int:
    from .gradescope import build_autograder

    assignment = _assignment(args.id)
    out = _out_path(args.out, ".zip")
    build_autograder(
        assignment,
        out,
        timeout=args.timeout,
        memory_mb=args.memory_mb,
        total_timeout=args.total_timeout,
    )
    print(
        f"wrote {out}: upload it as the autograder of a Gradescope programming "
        f"assignment worth {assignment.max_score():g} points (students submit one "
        f"{assignment.package}.py or .ipynb)"
    )
    return 0


def _export(tool: str, args: argparse.Namespace) -> int:
    assignment = _assignment(args.id)
    try:
        module = importlib.import_module(f"coursekit.{tool}")
    except ImportError as error:
        raise SystemExit(
            f"softmaxbook-course: the {tool} export is unavailable: {error}"
        ) from None
    path = Path(module.export(assignment, args.out))
    if path.suffix == ".ipynb":
        _validate(path)
    print(f"wrote {path}")
    return 0


def _validate(path: Path) -> None:
    """Check ``path`` against the notebook schema when nbformat (``[course]``) is
    installed; without it the file is written all the same."""
    try:
        import nbformat
    except ImportError:
        return
    nbformat.validate(nbformat.read(path, as_version=4))


def cmd_nbgrader(args: argparse.Namespace) -> int:
    return _export("nbgrader", args)


def cmd_otter(args: argparse.Namespace) -> int:
    return _export("otter", args)


def _limits(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds each test may run (default: 10)",
    )
    parser.add_argument(
        "--memory-mb",
        type=int,
        default=4096,
        metavar="MB",
        help="MiB the student's code may allocate beyond torch's own (default: 4096)",
    )
    parser.add_argument(
        "--total-timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="seconds for a whole grading run; later tests are skipped (default: 300)",
    )


def _version() -> str:
    """This package's version, without importing torch (``--help`` stays quick)."""
    try:
        return importlib.metadata.version("softmaxbook")
    except importlib.metadata.PackageNotFoundError:
        from softmaxbook import __version__

        return str(__version__)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``softmaxbook-course``."""
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="softmaxbook-course",
        description=DESCRIPTION,
        epilog=LIMITS,
        formatter_class=formatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"softmaxbook {_version()}"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help: str, description: str) -> argparse.ArgumentParser:
        return commands.add_parser(
            name,
            help=help,
            description=textwrap.dedent(description),
            formatter_class=formatter,
        )

    p = add(
        "list",
        "the assignments: their functions, tests and points",
        "List the five assignments: the functions a submission defines at module "
        "level, and the points of the visible and hidden tests.",
    )
    p.add_argument("--json", action="store_true", help="print JSON, one entry per test")
    p.set_defaults(run=cmd_list)

    for name, help, run in (
        ("solution", "write the reference solution (for instructors)", cmd_solution),
        ("stub", "write the stub a student starts from (scores 0)", cmd_stub),
    ):
        p = add(
            name,
            help,
            f"Write the {help.split('(')[0].strip().removeprefix('write ')} of "
            "assignment ID as a Python module.",
        )
        p.add_argument("id", metavar="ID", help="an assignment id (see `list`)")
        p.add_argument(
            "--out", required=True, metavar="FILE.py", help="where to write it"
        )
        p.set_defaults(run=run)

    p = add(
        "student",
        "write the student notebook (spec, stubs, visible checks)",
        "Write the notebook students work in: the spec, the functions to implement "
        "(stubs), and a cell per visible test that checks their work in place.",
    )
    p.add_argument("id", metavar="ID", help="an assignment id (see `list`)")
    p.add_argument(
        "--out", required=True, metavar="FILE.ipynb", help="where to write it"
    )
    p.set_defaults(run=cmd_student)

    p = add(
        "grade",
        "grade a submission (.py or .ipynb), print a table, write results.json",
        textwrap.dedent(
            """\
            Grade SUBMISSION (a .py module or a notebook whose code cells define the
            functions) in a separate process, print one row per test and, with
            --results, write Gradescope's results.json. Exit status 0 whenever a
            result was produced, whatever the score.

            """
        )
        + LIMITS,
    )
    p.add_argument("id", metavar="ID", help="an assignment id (see `list`)")
    p.add_argument(
        "submission", metavar="SUBMISSION", help="the student's .py or .ipynb"
    )
    p.add_argument(
        "--results", metavar="results.json", help="write Gradescope's results.json here"
    )
    _limits(p)
    p.set_defaults(run=cmd_grade)

    p = add(
        "gradescope",
        "write Gradescope's autograder zip",
        """\
        Write the autograder zip of a Gradescope programming assignment: setup.sh
        (Python 3.11+, CPU-only torch, then this package at this version, from a
        wheel inside the zip) and run_autograder (grades the .py or .ipynb the
        student submitted and writes /autograder/results/results.json). Try it
        outside Gradescope: unzip it, put a submission in ROOT/submission/ and run
        AUTOGRADER_ROOT=ROOT ./run_autograder with this package installed.
        """,
    )
    p.add_argument("id", metavar="ID", help="an assignment id (see `list`)")
    p.add_argument(
        "--out", required=True, metavar="autograder.zip", help="the zip to write"
    )
    _limits(p)
    p.set_defaults(run=cmd_gradescope)

    for name, tool, run, what in (
        (
            "nbgrader",
            "nbgrader",
            cmd_nbgrader,
            "a course directory: source/ID/ID.ipynb with nbgrader's cell metadata, "
            "solution regions and hidden tests, and nbgrader_config.py. Then, in "
            "DIR: `nbgrader generate_assignment ID` and, after collecting, "
            "`nbgrader autograde ID`.",
        ),
        (
            "otter",
            "otter-grader",
            cmd_otter,
            "an otter-grader master notebook, DIR/ID.ipynb. Then `otter assign "
            "DIR/ID.ipynb dist` writes the student notebook and the autograder zip.",
        ),
    ):
        p = add(name, f"export for {tool}", f"Write, for {tool}, {what}")
        p.add_argument("id", metavar="ID", help="an assignment id (see `list`)")
        p.add_argument(
            "--out", required=True, metavar="DIR", help="the folder to write"
        )
        p.set_defaults(run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``softmaxbook-course`` with ``argv`` (default: ``sys.argv[1:]``)."""
    args = build_parser().parse_args(argv)
    status: int = args.run(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
