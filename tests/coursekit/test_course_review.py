"""The course kit under an outside review: what a confused or hostile student tried.

Each test is a case the review found mishandled, kept so that it stays fixed: a
process the student's code forks must not answer the grader nor outlive it, a
notebook with IPython's help syntax, a magic's value or ``display`` keeps the
functions its cells define, a bfloat16 lse gets a hint that fits, and
run_autograder cannot be rewritten under bash's feet.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from coursekit._model import Assignment, TestCase
from coursekit.sandbox import grade
from coursekit.submission import strip_ipython

HERE = Path(__file__).resolve().parent
LOCATOR = ("test_course_review", "REVIEW", None)


def _inputs_of(n: int) -> Callable[[], dict[str, Any]]:
    def make() -> dict[str, Any]:
        return {"x": torch.arange(n, dtype=torch.float64)}

    return make


def _run(functions: Mapping[str, Callable[..., Any]], inputs: dict) -> dict:
    return {"y": functions["double"](inputs["x"])}


def _judge(inputs: dict, outputs: dict) -> str | None:
    y, want = outputs.get("y"), 2 * inputs["x"]
    if not isinstance(y, torch.Tensor) or y.shape != want.shape:
        return f"expected shape {tuple(want.shape)}, got {getattr(y, 'shape', y)}"
    return None if torch.equal(y, want) else f"expected {want.tolist()}"


REVIEW = Assignment(
    id="review",
    title="Doubling, on inputs of different lengths",
    functions=("double",),
    tests=tuple(
        TestCase(
            name=f"double_{n}",
            points=1.0,
            visibility="visible",
            functions=("double",),
            description=f"double on {n} numbers",
            make_inputs=_inputs_of(n),
            run=_run,
            judge=_judge,
        )
        for n in (3, 4, 5, 6)
    ),
    spec="Review.",
    package="review",
)


def _grade(path: Path) -> Any:
    return grade(REVIEW, path, locator=LOCATOR, extra_paths=[str(HERE)], timeout=5.0)


FORKS = """
import os, sys

def double(x):
    if os.fork() == 0:
        {child}
    return 2 * x
"""


def test_a_forked_child_that_returns_never_answers_the_grader(write_py):
    # Before the fix the child went back into the worker's loop, and both
    # processes answered: a test got the previous test's outputs ("expected shape
    # (4,), got (3,)") or a SystemExit that the parent never raised.
    for child in ("sys.exit(0)", "pass  # returns into the grader's loop"):
        result = _grade(write_py("forks.py", FORKS.format(child=child)))
        outputs = {t.name: t.output for t in result.tests}
        assert result.score == REVIEW.max_score(), (child, outputs)


def test_help_syntax_and_magic_values_keep_the_cell(write_ipynb):
    cells = [
        "import torch\n\ndef double(x):\n    return 2 * x\n\ndouble?\n",
        "??double\nfiles = !ls\nt = %timeit -o double(torch.ones(2))\n",
        "display(double(torch.ones(2)))\n\ndef unused():\n    pass\n",
    ]
    result = _grade(write_ipynb("magics.ipynb", cells))
    assert result.score == REVIEW.max_score(), [t.output for t in result.tests]
    assert not [n for n in result.notes if "cell" in n.lower()], result.notes


def test_the_rewrite_leaves_valid_python_alone():
    source = 'def f(x):\n    """Why?\n    ok"""\n    return x\nf?\ny = !ls\n'
    out = strip_ipython(source).splitlines()
    assert out[1] == '    """Why?'
    assert out[4] == "pass"
    assert out[5] == "y = None"
    assert strip_ipython("a ? b\n") == "a ? b\n"  # not IPython: left to fail


def test_a_half_precision_lse_is_not_told_to_keep_the_inputs_dtype():
    # flash_forward's lse is float32 for bfloat16 inputs: a bfloat16 lse was told
    # "Keep the input's dtype", which is what it did.
    from coursekit.assignments import _common as c

    want = torch.zeros(3, dtype=torch.float64)
    message = c.compare(
        torch.zeros(3, dtype=torch.bfloat16),
        want,
        where="random q (bfloat16)",
        noun="your flash_forward",
        part="lse",
        dtype=torch.float32,
    )
    assert message is not None and "expected float32" in message
    assert "Keep the input's dtype" not in message
    assert ".to(torch.float32)" in message
    # A float64 result where float32 is expected keeps the general hint.
    other = c.compare(
        torch.zeros(3, dtype=torch.float64),
        want,
        where="random x (float32)",
        noun="your softmax",
        dtype=torch.float32,
    )
    assert other is not None and "Keep the input's dtype" in other


DETACHES = """
import os, time

if os.fork() == 0:
    os.setsid()  # out of the student process's group, which the grader kills
    if os.fork() == 0:
        with open({pid_file!r}, "w") as out:
            out.write(str(os.getpid()))
        time.sleep(30)  # then, e.g., rewrite the results file
        with open({late_file!r}, "w") as out:
            out.write("score: 1000")
    os._exit(0)

def double(x):
    return 2 * x
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(sys.platform != "linux", reason="the zygote runs on Linux only")
def test_a_process_detached_by_the_submission_ends_with_the_grading(
    write_py, tmp_path, monkeypatch
):
    # Before the fix it outlived the grader (it rewrote results.json from 0 to
    # 1000 points after `softmaxbook-course grade` had written it).
    monkeypatch.delenv("COURSEKIT_SPAWN", raising=False)
    pid_file, late_file = tmp_path / "pid", tmp_path / "late"
    source = DETACHES.format(pid_file=str(pid_file), late_file=str(late_file))
    result = _grade(write_py("detaches.py", source))
    assert result.score == REVIEW.max_score(), [t.output for t in result.tests]
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    still = _alive(pid)
    if still:
        os.kill(pid, signal.SIGKILL)  # do not leave it behind
    assert not still, "the detached process outlived the grading"


def test_run_autograder_runs_what_it_read_before_the_student_code(tmp_path):
    # bash reads a script while it runs it: a submission (root on Gradescope)
    # that inserted a line after the grading command in run_autograder had it
    # run, and wrote {"score": 1000}. A stand-in Python does the rewriting here.
    from coursekit.assignments import get_assignment
    from coursekit.gradescope import build_autograder

    zip_path = build_autograder(get_assignment("softmax"), tmp_path / "ag.zip")
    root = tmp_path / "autograder"
    with zipfile.ZipFile(zip_path) as archive:
        archive.extractall(root / "source")
    script = root / "source" / "run_autograder"
    student = tmp_path / "python"
    student.write_text(
        f"#!{sys.executable}\n"
        "import os\n"
        f"path = {str(script)!r}\n"
        "text = open(path).read()\n"
        "cut = text.index('\\n', text.index('--total-timeout')) + 1\n"
        "evil = 'echo {\"score\": 1000} > $ROOT/results/results.json; exit 0\\n'\n"
        "with open(path, 'w') as out:  # the same file, rewritten in place\n"
        "    out.write(text[:cut] + evil + text[cut:])\n"
        "root = os.environ['AUTOGRADER_ROOT'] + '/results'\n"
        "os.makedirs(root, exist_ok=True)\n"
        "open(root + '/results.json', 'w').write('{\"score\": 0}')\n",
        encoding="utf-8",
    )
    student.chmod(0o755)
    env = dict(os.environ, AUTOGRADER_ROOT=str(root), COURSEKIT_PYTHON=str(student))
    subprocess.run(["bash", str(script)], env=env, timeout=60, check=True)
    assert "1000" in script.read_text(encoding="utf-8")  # the rewrite happened
    data = json.loads((root / "results" / "results.json").read_text())
    assert data["score"] == 0


def test_the_instructors_page_says_which_list_names_every_test(capsys):
    # The page said plain `list` prints every test; it prints counts, and
    # `list --json` names each test with its points and visibility.
    from coursekit.assignments import get_assignment
    from coursekit.cli import main

    page = (HERE.parents[1] / "chapters" / "instructors.md").read_text("utf-8")
    assert "`softmaxbook-course list --json` every test" in page
    main(["list", "--json"])
    listed = {a["id"]: a for a in json.loads(capsys.readouterr().out)}
    for assignment_id, entry in listed.items():
        names = [t.name for t in get_assignment(assignment_id).tests]
        assert [t["name"] for t in entry["tests"]] == names
        assert all(set(t) >= {"points", "visibility"} for t in entry["tests"])
