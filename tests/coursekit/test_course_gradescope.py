"""Gradescope's flow outside Gradescope: build the zip, unzip it into a scratch
``/autograder``, install its wheel, run ``run_autograder`` and read results.json."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from coursekit.assignments import get_assignment
from coursekit.gradescope import build_autograder, find_submission, run_autograder
from coursekit.submission import SubmissionError

VENV_BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def autograder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The softmax autograder zip, unzipped as Gradescope does (root/source)."""
    folder = tmp_path_factory.mktemp("gradescope")
    zip_path = build_autograder(get_assignment("softmax"), folder / "autograder.zip")
    with zipfile.ZipFile(zip_path) as archive:
        names = archive.namelist()
        assert names[:2] == ["setup.sh", "run_autograder"]
        for name in ("setup.sh", "run_autograder"):
            mode = archive.getinfo(name).external_attr >> 16
            assert mode & stat.S_IXUSR, f"{name} is not executable"
        archive.extractall(folder / "root" / "source")
    for name in ("setup.sh", "run_autograder"):  # extractall drops the modes
        path = folder / "root" / "source" / name
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return folder / "root"


def test_setup_installs_cpu_torch_then_this_package_from_the_zip(autograder):
    import torch

    from softmaxbook import __version__

    setup = (autograder / "source" / "setup.sh").read_text()
    subprocess.run(["bash", "-n", str(autograder / "source" / "setup.sh")], check=True)
    cpu_torch = "--index-url https://download.pytorch.org/whl/cpu"
    torch_pin = f'"torch=={torch.__version__.split("+")[0]}"'
    wheel = f"softmaxbook-{__version__}-py3-none-any.whl"
    assert cpu_torch in setup and torch_pin in setup
    assert setup.index(cpu_torch) < setup.index(wheel)  # torch first: not CUDA's
    assert (autograder / "source" / wheel).is_file()
    with zipfile.ZipFile(autograder / "source" / wheel) as archive:
        names = archive.namelist()
    assert "coursekit/assignments/softmax/tests.py" in names
    assert "coursekit/assignments/softmax/spec.md" in names
    assert not [n for n in names if n.endswith("/solution.py")]  # not in the image
    assert "git+" not in setup and "github" not in setup  # nothing from the repo


def test_run_autograder_grades_the_reference_to_full_marks_with_the_zips_code(
    autograder, tmp_path
):
    # The wheel from the zip, installed without network, is the code that grades.
    wheel = next((autograder / "source").glob("*.whl"))
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
        + ["--target", str(target), str(wheel)],
        check=True,
        timeout=300,
    )
    root = tmp_path / "autograder"
    (root / "submission").mkdir(parents=True)
    (root / "submission" / "softmax.py").write_text(
        get_assignment("softmax").reference_source(), encoding="utf-8"
    )
    env = dict(
        os.environ,
        AUTOGRADER_ROOT=str(root),
        PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
        PYTHONPATH=str(target),
    )
    done = subprocess.run(
        [str(autograder / "source" / "run_autograder")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert f"coursekit from {target / 'coursekit'}" in done.stdout
    results = json.loads((root / "results" / "results.json").read_text())
    assert results["score"] == get_assignment("softmax").max_score() == 23
    assert all(t["status"] == "passed" for t in results["tests"])
    visibility = {t["visibility"] for t in results["tests"]}
    assert visibility == {"visible", "after_due_date"}


def test_a_stub_scores_zero_and_a_broken_python_still_writes_results(
    autograder, tmp_path
):
    root = tmp_path / "autograder"
    (root / "submission" / "sub").mkdir(parents=True)
    notebook = root / "submission" / "sub" / "softmax.ipynb"
    notebook.write_text(
        json.dumps(get_assignment("softmax").student_notebook()), encoding="utf-8"
    )
    result = run_autograder("softmax", root, timeout=5)
    assert result.score == 0 and result.max_score == 23
    data = json.loads((root / "results" / "results.json").read_text())
    assert data["score"] == 0 and len(data["tests"]) == 15

    (root / "results" / "results.json").unlink()
    env = dict(os.environ, AUTOGRADER_ROOT=str(root), COURSEKIT_PYTHON="/no/python")
    script = str(autograder / "source" / "run_autograder")
    subprocess.run([script], env=env, capture_output=True, timeout=60, check=True)
    data = json.loads((root / "results" / "results.json").read_text())
    assert data["score"] == 0 and "could not run" in data["output"]


def test_the_submission_is_found_or_the_student_is_told_why(tmp_path):
    softmax = get_assignment("softmax")
    folder = tmp_path / "submission"
    folder.mkdir()
    (folder / "notes.txt").write_text("hi")
    with pytest.raises(SubmissionError, match=r"No \.py or \.ipynb.*notes\.txt"):
        find_submission(folder, softmax)
    (folder / "helper.py").write_text("")
    assert find_submission(folder, softmax) == folder / "helper.py"
    (folder / "other.ipynb").write_text("{}")
    with pytest.raises(SubmissionError, match="Several files"):
        find_submission(folder, softmax)
    (folder / "softmax.py").write_text("")
    (folder / ".ipynb_checkpoints").mkdir()
    (folder / ".ipynb_checkpoints" / "softmax-checkpoint.ipynb").write_text("{}")
    assert find_submission(folder, softmax) == folder / "softmax.py"

    result = run_autograder("softmax", tmp_path / "empty")
    assert result.score == 0 and "No .py or .ipynb" in (result.error or "")
    assert (tmp_path / "empty" / "results" / "results.json").is_file()
