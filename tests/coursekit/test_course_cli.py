"""``softmaxbook-course``: every command, as an instructor would run it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from coursekit.cli import build_parser, main

IDS = ["softmax", "attention", "gradients", "flash-attention", "sparse-maps"]


def test_the_console_script_lists_the_five_assignments():
    script = Path(sys.executable).with_name("softmaxbook-course")
    command = [str(script)] if script.exists() else [shutil.which("softmaxbook-course")]
    assert command[0], "softmaxbook-course is not installed: run `make setup`"
    done = subprocess.run(
        [*command, "list"], capture_output=True, text=True, timeout=300, check=True
    )
    for assignment_id in IDS:
        assert f"\n{assignment_id}: " in "\n" + done.stdout
    assert "functions: flash_forward, flash_backward, FlashAttention" in done.stdout


def test_list_json_gives_every_test_and_its_points(capsys):
    assert main(["list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [a["id"] for a in listed] == IDS
    for a in listed:
        assert a["points"] == sum(t["points"] for t in a["tests"]) > 0
        assert {t["visibility"] for t in a["tests"]} == {"visible", "hidden"}


def test_solution_grade_and_stub_through_the_command_line(tmp_path, capsys):
    solution, stub = tmp_path / "solution.py", tmp_path / "stub.py"
    results = tmp_path / "out" / "results.json"
    assert main(["solution", "gradients", "--out", str(solution)]) == 0
    assert main(["stub", "gradients", "--out", str(stub)]) == 0
    assert "raise NotImplementedError" in stub.read_text()
    assert "raise NotImplementedError" not in solution.read_text()
    capsys.readouterr()

    assert main(["grade", "gradients", str(solution), "--results", str(results)]) == 0
    table = capsys.readouterr().out
    assert "gradients: 15 / 15 points (10 of 10 tests passed)." in table
    assert "softmax_backward" in table and "passed" in table
    data = json.loads(results.read_text())
    assert data["score"] == 15 == sum(t["max_score"] for t in data["tests"])

    args = [
        "grade",
        "gradients",
        str(stub),
        "--results",
        str(results),
        "--timeout",
        "5",
    ]
    assert main(args) == 0
    assert "gradients: 0 / 15 points" in capsys.readouterr().out
    assert json.loads(results.read_text())["score"] == 0


def test_the_student_notebook_is_valid_and_scores_zero_as_it_is(tmp_path, capsys):
    import nbformat

    from coursekit.assignments import get_assignment
    from coursekit.sandbox import grade

    out = tmp_path / "softmax.ipynb"
    assert main(["student", "softmax", "--out", str(out)]) == 0
    notebook = nbformat.read(out, as_version=4)
    nbformat.validate(notebook)
    code = "\n".join(c.source for c in notebook.cells if c.cell_type == "code")
    reference = get_assignment("softmax").reference_source()
    bodies = [
        line.strip()
        for line in reference.splitlines()
        if line.strip().startswith("return ") and "NotImplementedError" not in line
    ]
    assert bodies and not any(b in code for b in bodies)  # no solution leaks
    result = grade("softmax", out)  # the notebook itself is a submission
    assert result.score == 0 and result.error is None


def test_nbgrader_and_otter_call_the_exports(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_export(assignment, out_dir):
        calls.append((assignment.id, Path(out_dir)))
        path = Path(out_dir) / "made.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("ok")
        return path

    real_import = __import__("importlib").import_module

    def fake_import(name, *args):
        if name in ("coursekit.nbgrader", "coursekit.otter"):
            return types.SimpleNamespace(export=fake_export)
        return real_import(name, *args)

    monkeypatch.setattr("coursekit.cli.importlib.import_module", fake_import)
    assert main(["nbgrader", "attention", "--out", str(tmp_path / "course")]) == 0
    assert main(["otter", "sparse-maps", "--out", str(tmp_path / "otter")]) == 0
    assert calls == [
        ("attention", tmp_path / "course"),
        ("sparse-maps", tmp_path / "otter"),
    ]
    assert "wrote" in capsys.readouterr().out


def test_an_unknown_id_names_the_known_ones(tmp_path):
    with pytest.raises(SystemExit, match=r"unknown assignment id 'softmx'.*softmax"):
        main(["solution", "softmx", "--out", str(tmp_path / "x.py")])
    with pytest.raises(SystemExit, match=r"--out must end in \.zip"):
        main(["gradescope", "softmax", "--out", str(tmp_path / "x.tar")])


@pytest.mark.parametrize(
    ("command", "words"),
    [
        ([], "A typical course"),
        (["grade"], "--timeout S"),
        (["grade"], "a function that timed out is not called"),
        (["gradescope"], "AUTOGRADER_ROOT=ROOT ./run_autograder"),
        (["nbgrader"], "nbgrader generate_assignment ID"),
        (["otter"], "otter assign"),
        (["student"], "visible test"),
        (["list"], "hidden tests"),
    ],
)
def test_help_texts_tell_an_instructor_what_to_do(capsys, command, words):
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args([*command, "--help"])
    assert done.value.code == 0
    assert words in " ".join(capsys.readouterr().out.split())
