"""The otter-grader export: its structure, then the real otter on it.

The fast tests read the master notebook as JSON (no otter needed). The slow test runs
the real tool in a scratch folder, as an instructor would, with no Docker and no
network: ``otter assign`` (which writes the student and autograder notebooks and the
autograder zip, then grades the solution notebook with that zip and fails unless it
gets full marks), and ``otter run`` (otter's local grading, without Docker) on the
student notebook as released, which must score 0.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from coursekit import nbgrader, otter
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


def _body_lines(reference: str) -> set[str]:
    # The same selection as the nbgrader test's: the bodies' informative lines.
    lines = reference.splitlines()
    inside = {k for a, b, _ in nbgrader.body_spans(reference) for k in range(a, b + 1)}
    body = {lines[k - 1].strip() for k in inside}
    outside = {line.strip() for k, line in enumerate(lines, 1) if k not in inside}
    return {
        line
        for line in body - outside
        if len(line) >= 6 and any(ch.isalnum() for ch in line)
    }


def _blocks(cells: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """(question name, its cells) for each ``# BEGIN QUESTION`` block."""
    blocks: list[tuple[str, list[dict[str, Any]]]] = []
    for cell in cells:
        src = _source(cell)
        if cell["cell_type"] == "raw" and src.startswith("# BEGIN QUESTION"):
            blocks.append((json.loads(src.split("name: ")[1].splitlines()[0]), []))
        elif blocks and cell["cell_type"] == "raw" and src == "# END QUESTION":
            blocks[-1][1].append(cell)
            blocks.append(("", []))  # outside any question until the next one
        elif blocks:
            blocks[-1][1].append(cell)
    return [b for b in blocks if b[0]]


def _test_config(src: str) -> dict[str, Any]:
    match = re.match(
        r'""" # BEGIN TEST CONFIG\n(.*?)\n""" # END TEST CONFIG\n', src, re.S
    )
    assert match, src
    return {
        k: json.loads(v)
        for k, v in (line.split(": ", 1) for line in match[1].splitlines())
    }


# --- the master notebook, read as JSON -------------------------------------------


@pytest.mark.parametrize("aid", IDS)
def test_master_notebook_has_otters_blocks_and_every_test(
    aid: str, tmp_path: Path
) -> None:
    assignment = get_assignment(aid)
    path = otter.export(assignment, tmp_path, requirements=["torch"])
    assert path == tmp_path / f"{aid}.ipynb"
    cells = _cells(path)
    config = _source(cells[0])
    assert cells[0]["cell_type"] == "raw" and config.startswith("# ASSIGNMENT CONFIG")
    assert f'name: "{aid}"' in config and '  - "torch"' in config

    # Blocks nest properly: question > solution | tests.
    depth: list[str] = []
    for cell in cells[1:]:
        src = _source(cell)
        if cell["cell_type"] != "raw":
            continue
        kind = src.split("\n")[0].split()[2].lower()
        if src.startswith("# BEGIN"):
            assert (depth, kind) in (
                ([], "question"),
                (["question"], "solution"),
                (["question"], "tests"),
            ), (depth, src)
            depth.append(kind)
        else:
            assert depth and depth.pop() == kind, src
    assert depth == []

    # Every test once, in a question defined after the functions it calls, with its
    # points and visibility.
    blocks = _blocks(cells)
    defined: set[str] = set()
    seen = {}
    for name, block in blocks:
        for cell in block:
            if cell["cell_type"] == "code" and "BEGIN TEST CONFIG" not in _source(cell):
                tree = ast.parse(_source(cell))
                defined |= {n.name for n in tree.body if hasattr(n, "name")}
            elif cell["cell_type"] == "code":
                src = _source(cell)
                call = re.search(r"run_test\('([^']+)', '([^']+)', globals\(\)\)", src)
                assert call and call[1] == aid, src
                test = assignment.test(call[2])
                assert set(test.functions) <= defined, (test.name, name)
                config = _test_config(src)
                assert config["points"] == test.points
                assert config["hidden"] == (test.visibility == "hidden")
                seen[test.name] = name
    assert sorted(seen) == sorted(t.name for t in assignment.tests)
    # One question per function (or class) the submission defines.
    chunks = nbgrader.source_chunks(assignment.reference_source())
    assert [name for name, _ in blocks] == [
        c.name for c in chunks if c.name in assignment.functions
    ]


@pytest.mark.parametrize("aid", IDS)
def test_master_notebook_code_is_the_reference_with_marked_bodies(
    aid: str, tmp_path: Path
) -> None:
    assignment = get_assignment(aid)
    cells = _cells(otter.export(assignment, tmp_path, requirements=[]))
    code = [
        _source(c)
        for c in cells
        if c["cell_type"] == "code" and "BEGIN TEST CONFIG" not in _source(c)
    ]
    # Without the markers and the prompt strings, the code is the reference.
    prompt = re.compile(r'\n\s*""" # BEGIN PROMPT\n.*?""" # END PROMPT', re.S)
    stripped = [
        "\n".join(
            line
            for line in prompt.sub("", src).splitlines()
            if line.strip() not in ("# BEGIN SOLUTION NO PROMPT", "# END SOLUTION")
        )
        for src in code
    ]
    reference = assignment.reference_source()
    assert ast.dump(ast.parse("\n\n".join(stripped))) == ast.dump(ast.parse(reference))
    # What a student gets: otter's rule (drop the regions, keep the prompts' insides).
    student = "\n\n".join(_as_student(src) for src in code)
    assert (
        _body_lines(reference) & {line.strip() for line in student.splitlines()}
        == set()
    )
    ast.parse(student)  # still Python
    assert student.count("raise NotImplementedError") == len(
        nbgrader.body_spans(reference)
    )


def _as_student(src: str) -> str:
    out, inside = [], False
    for line in src.splitlines():
        if line.strip() == "# BEGIN SOLUTION NO PROMPT":
            inside = True
        elif line.strip() == "# END SOLUTION":
            inside = False
        elif not inside and not line.rstrip().endswith(
            ("# BEGIN PROMPT", "# END PROMPT")
        ):
            out.append(line)
    return "\n".join(out)


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
        otter.export(None, tmp_path)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="requirements must be strings"):
        otter.export(_Fake("def f(x):\n    return x\n"), tmp_path, requirements=[1])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="holds a comment otter reads as a marker"):
        otter.export(_Fake("def f(x):\n    return x  # SOLUTION\n"), tmp_path)
    with pytest.raises(ValueError, match=r"line 2 .* marker"):
        otter.export(_Fake("def f(x):\n    y = 1  # SEED\n    return x\n"), tmp_path)


def test_default_requirements_name_cpu_torch_and_this_version() -> None:
    import softmaxbook

    reqs = otter.default_requirements()
    assert reqs[0] == "--extra-index-url https://download.pytorch.org/whl/cpu"
    assert reqs[1].endswith(f"@v{softmaxbook.__version__}")
    assert reqs[1].startswith("softmaxbook[course] @ git+https://")


# --- the real otter ----------------------------------------------------------------


def _otter(
    cwd: Path, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(Path(sys.executable).parent / "otter"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"otter {' '.join(args)}:\n{output[-3000:]}"
    return done


@pytest.mark.slow
def test_real_otter_assign_finds_the_tests_and_strips_the_solutions(
    tmp_path: Path, tool_env: dict[str, str]
) -> None:
    aid = TOOL_ASSIGNMENT
    assignment = get_assignment(aid)
    master = otter.export(assignment, tmp_path / "master")

    # otter assign grades the solution notebook with the zip it built (run_tests)
    # and exits non-zero unless every test passes.
    done = _otter(tmp_path, tool_env, "assign", "-v", str(master), "dist")
    log = done.stdout + done.stderr
    assert "Running tests against the solutions notebook" in log
    assert "All autograder tests passed" in log
    assert "No autograded tests were found" not in log

    # The zip holds one test file per question with every test, hidden ones too.
    (zip_path,) = (tmp_path / "dist" / "autograder").glob(f"{aid}-autograder_*.zip")
    with zipfile.ZipFile(zip_path) as zf:
        names = zf.namelist()
        assert {"run_autograder", "setup.sh", "environment.yml"} <= set(names)
        tests = {n: zf.read(n).decode() for n in names if n.startswith("tests/")}
    found = {}
    for name, text in tests.items():
        for call in re.finditer(rf"run_test\('{aid}', '(\w+)', globals\(\)\)", text):
            found[call[1]] = name
    assert sorted(found) == sorted(t.name for t in assignment.tests)

    # The student notebook: no solution line, no hidden test, a stub per body.
    student = tmp_path / "dist" / "student" / f"{aid}.ipynb"
    cells = _cells(student)
    shown = {line.strip() for c in cells for line in _source(c).splitlines()}
    assert _body_lines(assignment.reference_source()) & shown == set()
    public = json.dumps(json.loads(student.read_text())["metadata"]["otter"]["tests"])
    for test in assignment.tests:
        assert (f"'{test.name}'" in public) == (test.visibility == "visible"), test.name
    assert any("raise NotImplementedError" in _source(c) for c in cells)

    # otter run (local grading, no Docker) on the release as is: 0 points.
    (tmp_path / "graded").mkdir()
    _otter(
        tmp_path,
        tool_env,
        "run",
        "-a",
        str(zip_path),
        "-o",
        "graded",
        "--no-logo",
        str(student),
    )
    results = json.loads((tmp_path / "graded" / "results.json").read_text())
    scored = [t for t in results["tests"] if t.get("max_score") is not None]
    assert sum(t["max_score"] for t in scored) == pytest.approx(assignment.max_score())
    assert [t["score"] for t in scored] == [0] * len(scored)
