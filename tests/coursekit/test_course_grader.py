"""The sandboxed grader: student code that hangs, exits, crashes, allocates without
bound, lies or patches torch costs only the tests it touches, in bounded time, and
the result is always a valid Gradescope results.json with the reason in words.

A small private assignment (``TOY`` below, imported by the student's process from
this file) exercises the sandbox; the five real assignments are graded at the end.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from coursekit._model import Assignment, TestCase
from coursekit.sandbox import grade

HERE = Path(__file__).resolve().parent
LOCATOR = ("test_course_grader", "TOY", None)


def _inputs() -> dict[str, Any]:
    return {"x": torch.arange(6, dtype=torch.float64).reshape(2, 3) / 3}


def _caller(name: str) -> Callable[[Mapping[str, Callable[..., Any]], dict], dict]:
    def run(functions: Mapping[str, Callable[..., Any]], inputs: dict) -> dict:
        return {"y": functions[name](inputs["x"])}  # no try: errors reach the grader

    return run


def _judge_is(expected: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    def judge(inputs: dict, outputs: dict) -> str | None:
        y, want = outputs.get("y"), expected(inputs["x"])
        if not isinstance(y, torch.Tensor) or y.shape != want.shape:
            return f"expected a tensor of shape {tuple(want.shape)}, got {y!r}"
        if not torch.allclose(y, want):
            return f"expected {want.tolist()}, got {y.tolist()}"
        return None

    return judge


def _test(name: str, fn: str, expected: Callable, **kw: Any) -> TestCase:
    return TestCase(
        name=name,
        points=kw.pop("points", 1.0),
        visibility=kw.pop("visibility", "visible"),
        functions=(fn,),
        description=f"{fn} on a small tensor",
        make_inputs=_inputs,
        run=_caller(fn),
        judge=_judge_is(expected),
        **kw,
    )


def _same(x: torch.Tensor) -> torch.Tensor:
    return x


TOY = Assignment(
    id="toy",
    title="A toy assignment for the grader's tests",
    functions=(
        "add_one",
        "softmax_rows",
        "hang",
        "crash",
        "leave",
        "exit_call",
        "hog",
        "lie",
    ),
    tests=(
        _test("add_one_first", "add_one", lambda x: x + 1),
        _test(
            "softmax_from_scratch",
            "softmax_rows",
            lambda x: torch.softmax(x, -1),  # the grader's process may use it
            points=2.0,
            forbidden=("softmax", "sdpa", "softmaxbook"),
        ),
        _test("hang_first", "hang", _same, visibility="hidden"),
        _test("hang_again", "hang", _same, visibility="hidden"),
        _test("crash_segfault", "crash", _same),
        _test("leave_os_exit", "leave", _same),
        _test("exit_call_sys_exit", "exit_call", _same),
        _test("hog_memory", "hog", _same),
        _test("lie_subclass", "lie", _same),
        _test("add_one_last", "add_one", lambda x: x + 1, visibility="hidden"),
    ),
    spec="Toy.",
    package="toy",
)

CORRECT = """
import torch

def add_one(x):
    return x + 1

def softmax_rows(x):
    e = (x - x.max(dim=-1, keepdim=True).values).exp()
    return e / e.sum(dim=-1, keepdim=True)

def hang(x):
    return x

crash = leave = exit_call = hog = lie = hang
"""

HOSTILE = """
import ctypes, os, sys
import torch

def add_one(x):
    print("chatty " * 20_000)  # far more than the grader keeps
    return x + 1

def softmax_rows(x):
    return torch.softmax(x, dim=-1)

def hang(x):
    while True:
        pass

def crash(x):
    return ctypes.string_at(0)  # reads address 0: SIGSEGV

def leave(x):
    os.write(1, b"bye " * 2_000_000)  # 8 MB on the process's own stdout
    os._exit(3)

def exit_call(x):
    sys.exit(2)

def hog(x):
    big = x.new_zeros(3 * 2**30 // 8)  # 3 GiB, beyond the 1 GiB allowed
    return x + big.sum()

class Liar(torch.Tensor):
    def __eq__(self, other):
        return True

def lie(x):
    return (x + 100).as_subclass(Liar)
"""


def grade_toy(path: Path, **kwargs: Any) -> Any:
    kwargs.setdefault("timeout", 2.0)
    return grade(TOY, path, locator=LOCATOR, extra_paths=[str(HERE)], **kwargs)


def by_name(result: Any) -> dict[str, Any]:
    return {t.name: t for t in result.tests}


def check_results_json(result: Any, tmp_path: Path) -> dict[str, Any]:
    """results.json is valid JSON with Gradescope's fields and consistent sums."""
    path = result.write_gradescope(tmp_path / "results" / "results.json")
    data = json.loads(path.read_text(encoding="utf-8"))
    assert set(data) >= {"score", "tests", "output"}
    assert data["score"] == pytest.approx(sum(t["score"] for t in data["tests"]))
    for t in data["tests"]:
        assert set(t) >= {"name", "score", "max_score", "output", "visibility"}
        assert t["visibility"] in ("visible", "after_due_date")
        assert 0 <= t["score"] <= t["max_score"]
        assert t["output"].strip()
    return data


def test_correct_toy_submission_gets_full_marks(write_py, tmp_path):
    result = grade_toy(write_py("correct.py", CORRECT))
    assert result.error is None, result.error
    assert [t.status for t in result.tests] == ["passed"] * len(TOY.tests)
    assert result.score == result.max_score == TOY.max_score()
    data = check_results_json(result, tmp_path)
    hidden = {t["name"]: t["visibility"] for t in data["tests"]}
    assert hidden["hang_first"] == "after_due_date"
    assert hidden["add_one_first"] == "visible"


def test_without_the_zygote_each_process_is_a_fresh_python(write_py, monkeypatch):
    # What runs where fork is not used (macOS, Windows, COURSEKIT_SPAWN=1).
    monkeypatch.setenv("COURSEKIT_SPAWN", "1")
    source = CORRECT + "\nimport os\ndef leave(x):\n    os._exit(6)\n"
    result = grade_toy(write_py("spawned.py", source))
    tests = by_name(result)
    assert "exit code 6" in tests["leave_os_exit"].output
    assert tests["add_one_last"].status == "passed"  # a new Python after the exit
    assert result.score == TOY.max_score() - 1


def test_hostile_submission_costs_only_the_tests_it_touches(write_py, tmp_path):
    start = time.monotonic()
    # A 1 s limit: the endless loop costs 1 s, and a call that returns (printing
    # 140 kB, writing 8 MB) takes a few ms, far inside it on a loaded machine.
    result = grade_toy(write_py("hostile.py", HOSTILE), memory_mb=1024, timeout=1.0)
    wall = time.monotonic() - start
    tests = by_name(result)
    status = {name: t.status for name, t in tests.items()}
    assert status == {
        "add_one_first": "passed",
        "softmax_from_scratch": "forbidden",
        "hang_first": "timeout",
        "hang_again": "timeout",
        "crash_segfault": "error",
        "leave_os_exit": "error",
        "exit_call_sys_exit": "error",
        "hog_memory": "error",
        "lie_subclass": "error",
        "add_one_last": "passed",  # a fresh process after every crash
    }
    assert result.score == 2.0 and result.max_score == 11.0
    out = {name: t.output for name, t in tests.items()}
    assert out["softmax_from_scratch"].startswith(
        "forbidden call: torch.softmax (aten._softmax) at line 10 of hostile.py"
    )
    assert "did not return within 1 s" in out["hang_first"]
    assert "`hang`" in out["hang_first"]
    assert "not called again" in out["hang_again"]
    assert tests["hang_again"].seconds == 0  # not called: no second wait
    assert "segmentation fault (SIGSEGV)" in out["crash_segfault"]
    assert 'File "hostile.py", line 17 in crash' in out["crash_segfault"]
    assert "Your code (in `crash`) crashed" in out["crash_segfault"]
    assert "exit code 3" in out["leave_os_exit"]
    assert len(out["leave_os_exit"]) < 2500  # 8 MB of output, shown bounded
    assert "sys.exit(2)" in out["exit_call_sys_exit"]
    assert "can't allocate memory" in out["hog_memory"]
    assert "1024 MiB" in out["hog_memory"]
    assert "could not be read back" in out["lie_subclass"]
    # Bounded time: 4 processes (one per crash), one 1 s time-out.
    assert tests["hang_first"].seconds < 1.5
    assert wall < 90, f"the hostile grade took {wall:.0f} s"
    check_results_json(result, tmp_path)


def test_the_whole_run_stops_at_its_total_time_limit(write_py, tmp_path):
    source = (
        CORRECT
        + """
def hang(x):
    while True:
        pass

crash = leave = exit_call = hog = lie = hang
"""
    )
    # 1 s time-outs until less than the 0.5 s a test needs is left of 5 s (the
    # import of the submission, this file with pytest, counts: 4 s for it, which a
    # loaded machine needs; with 3 s in all, the first tests were skipped at load 4.6).
    result = grade_toy(write_py("slow.py", source), timeout=1.0, total_timeout=5.0)
    status = [t.status for t in result.tests]
    assert status[:2] == ["passed", "passed"]
    assert "timeout" in status and status[-1] == "skipped"
    skipped = by_name(result)["add_one_last"]
    assert "total limit of 5 s" in skipped.output
    # The clock starts when the first student process is ready (torch imported).
    assert sum(t.seconds for t in result.tests) < 5.0 + 0.5
    check_results_json(result, tmp_path)


def test_a_submission_that_scribbles_on_the_grader_channel_only_fails(write_py):
    source = (
        CORRECT
        + """
import os

def exit_call(x):
    for fd in map(int, os.listdir("/proc/self/fd")):
        if fd > 2:
            try:
                os.write(fd, b"FAKE" + b"\\xff" * 64)
            except OSError:
                pass
    return x
"""
    )
    result = grade_toy(write_py("scribbler.py", source))
    tests = by_name(result)
    assert tests["exit_call_sys_exit"].status == "error"
    assert "other than a reply" in tests["exit_call_sys_exit"].output
    assert tests["add_one_last"].status == "passed"
    assert result.score == TOY.max_score() - 1


@pytest.mark.parametrize(
    ("case", "source", "words"),
    [
        ("sys_exit", "import sys\nsys.exit(1)\n", "sys.exit(1)"),
        ("os_exit", "import os\nos._exit(4)\n", "exit code 4"),
        ("syntax", "def add_one(x)\n    return x + 1\n", "SyntaxError at line 1"),
        ("import", "import not_a_module_anywhere\n", "No module named"),
        ("softmaxbook", "import softmaxbook\n", "forbidden import: softmaxbook"),
        ("loop", "while True:\n    pass\n", "did not finish within 1 s"),
    ],
)
def test_a_module_that_fails_to_import_scores_zero_with_the_reason(
    write_py, tmp_path, case, source, words
):
    start = time.monotonic()
    # The endless loop waits out its limit, 1 s; the others finish: their limit
    # leaves room for a loaded machine (importing this file takes the time).
    limit = 1.0 if case == "loop" else 3.0
    result = grade_toy(write_py(f"{case}.py", CORRECT + source), import_timeout=limit)
    assert time.monotonic() - start < 40
    assert result.score == 0
    assert result.error is not None and words in result.error, result.error
    assert all(t.status == "error" and words in t.output for t in result.tests)
    check_results_json(result, tmp_path)


def test_a_patched_torch_or_checker_in_the_students_process_changes_nothing(
    write_py,
):
    source = """
    import torch

    torch.allclose = lambda *a, **k: True  # what the grader would use to compare
    torch.equal = lambda *a, **k: True
    torch.Tensor.__eq__ = lambda self, other: torch.ones((), dtype=torch.bool)
    try:
        import softmaxbook.checks as checks  # blocked in the student's process
        checks.check_softmax = lambda *a, **k: None
    except ImportError:
        pass

    def add_one(x):
        return x  # wrong

    def softmax_rows(x):
        return x  # wrong
    """
    result = grade_toy(write_py("patcher.py", source))
    tests = by_name(result)
    assert tests["add_one_first"].status == "failed"
    assert tests["softmax_from_scratch"].status == "failed"
    assert "expected" in tests["add_one_first"].output
    assert result.score == 0


def test_a_notebook_runs_cell_by_cell(write_ipynb, tmp_path):
    cells = [
        "%matplotlib inline\nimport torch\n!pip list",
        "def add_one(x):\n    return x + 1",
        "raise ValueError('a stray cell')",
        "def softmax_rows(x)\n    return x",  # a syntax error: this cell only
        "from coursekit import incheck\nincheck.run_test('toy', 'x', globals())",
        "import os\nos._exit(5)",  # ends the process: the cell is skipped
        "%%time\ndef hang(x):\n    return x\n",
        "crash = leave = exit_call = hog = lie = hang",
        "%%bash\nexit 1",  # shell cells are never run
    ]
    result = grade_toy(write_ipynb("work.ipynb", cells))
    tests = by_name(result)
    assert result.error is None
    assert tests["add_one_first"].status == "passed"
    assert tests["crash_segfault"].status == "passed"  # defined after the bad cells
    assert tests["softmax_from_scratch"].status == "error"
    assert "does not define `softmax_rows`" in tests["softmax_from_scratch"].output
    notes = "\n".join(result.notes)
    assert "ValueError: a stray cell" in notes
    assert "SyntaxError" in notes
    assert "exit code 5" in notes and "skipped" in notes
    assert result.score == TOY.max_score() - 2
    check_results_json(result, tmp_path)


def test_a_missing_or_unreadable_submission_gives_a_result(tmp_path):
    for path in (tmp_path / "absent.py", tmp_path / "notes.txt"):
        path.parent.mkdir(exist_ok=True)
        if path.suffix == ".txt":
            path.write_text("hello", encoding="utf-8")
        result = grade_toy(path)
        assert result.score == 0 and result.error
        assert all(t.status == "error" for t in result.tests)
        check_results_json(result, tmp_path)


def _real_ids() -> list[str]:
    from coursekit.assignments import ASSIGNMENTS

    return list(ASSIGNMENTS)


@pytest.mark.parametrize("assignment_id", _real_ids())
def test_a_real_reference_gets_full_marks_and_its_stub_zero(tmp_path, assignment_id):
    from coursekit.assignments import get_assignment

    assignment = get_assignment(assignment_id)
    for kind in ("reference", "stub"):
        source = (
            assignment.reference_source()
            if kind == "reference"
            else assignment.stub_source()
        )
        path = tmp_path / f"{assignment.package}_{kind}.py"
        path.write_text(source, encoding="utf-8")
        result = grade(assignment.id, path)
        wrong = [
            (t.name, t.status, t.output[:200])
            for t in result.tests
            if t.passed != (kind == "reference")
        ]
        assert not wrong, (kind, wrong)
        expected = assignment.max_score() if kind == "reference" else 0
        assert result.score == expected
        assert result.seconds < 60, f"{kind}: {result.seconds:.0f} s"


# --- the forbidden-call guard, in this process -------------------------------------

X = torch.randn(3, 4)


def _forbidden(groups: list[str], fn: Callable[[], Any]) -> str | None:
    from coursekit.forbidden import guard

    with guard(groups) as record:
        try:
            fn()
        except Exception:  # a student who catches the error is still recorded
            pass
    return record.message()


@pytest.mark.parametrize(
    ("groups", "call", "named"),
    [
        (["softmax"], lambda: torch.softmax(X, -1), "torch.softmax (aten._softmax)"),
        (["softmax"], lambda: X.softmax(-1), "Tensor.softmax (aten._softmax)"),
        (["softmax"], lambda: torch.nn.Softmax(-1)(X), "torch.nn.Softmax"),
        (["softmax"], lambda: torch.ops.aten._softmax(X, -1, False), "aten._softmax"),
        (["softmax"], lambda: torch.log_softmax(X, -1), "aten._log_softmax"),
        (
            ["softmax"],
            lambda: torch.nn.functional.cross_entropy(X, torch.tensor([0, 1, 2])),
            "torch.nn.functional.cross_entropy (aten._log_softmax)",
        ),
        (
            ["sdpa"],
            lambda: torch.nn.functional.scaled_dot_product_attention(X, X, X),
            "torch.nn.functional.scaled_dot_product_attention",
        ),
        (["sdpa"], lambda: torch.nn.MultiheadAttention(4, 1)(X, X, X), "Multihead"),
        (["logsumexp"], lambda: torch.logsumexp(X, -1), "aten.logsumexp"),
        (
            ["autograd"],
            lambda: X.clone().requires_grad_().exp().sum().backward(),
            "Tensor.backward",
        ),
        (
            ["autograd"],
            lambda: torch.func.jacfwd(torch.exp)(X[0]),
            "torch.func.jacfwd",
        ),
    ],
)
def test_the_guard_names_a_forbidden_call_however_it_is_reached(groups, call, named):
    message = _forbidden(groups, call)
    assert message is not None and message.startswith("forbidden call: ")
    assert named in message
    assert "test_course_grader.py" in message  # the line that made the call


@pytest.mark.parametrize("package", ["softmaxbook", "entmax"])
def test_the_guard_blocks_importing_a_forbidden_package(monkeypatch, package):
    # As in the student's process, where the worker removes them from sys.modules
    # (a module already imported is found without the import machinery).
    import sys

    for name in [m for m in sys.modules if m.split(".")[0] == package]:
        monkeypatch.delitem(sys.modules, name)
    message = _forbidden([package], lambda: __import__(package))
    assert message is not None and f"import {package}" in message
    assert package not in sys.modules


def test_the_guard_catches_a_library_function_imported_before_it():
    import softmaxbook

    message = _forbidden(["softmaxbook"], lambda: softmaxbook.sparsemax(X))
    assert message is not None and "softmaxbook" in message


def test_legitimate_primitives_are_not_forbidden():
    def from_scratch() -> None:
        m = X.max(dim=-1, keepdim=True).values
        e = (X - m).exp()
        p = e / e.sum(dim=-1, keepdim=True)
        p = torch.where(X > 0, p, 0.0).masked_fill(X < -3, 0.0)
        p.cumsum(-1), p.sort(-1), p.topk(2, -1), p @ p.T, torch.matmul(p, p.T)
        torch.logsumexp(X, -1)  # only the "logsumexp" group forbids it
        torch.nn.functional.relu(X), torch.nn.functional.linear(X, X)

    every = ["softmax", "sdpa", "softmaxbook", "entmax", "autograd"]
    assert _forbidden(every, from_scratch) is None


def test_unknown_group_is_a_value_error():
    from coursekit.forbidden import guard

    with pytest.raises(ValueError, match="unknown forbidden-call group"):
        guard(["softmaxx"])
