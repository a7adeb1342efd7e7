"""The repository's automation: CI runs the tests, the website is published only after
they pass, and `make test-oldest` installs the lower bounds of pyproject.toml."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"


def _workflow(name: str) -> dict:
    workflow = yaml.safe_load((WORKFLOWS / name).read_text())
    # YAML 1.1 reads the key `on` as True.
    workflow["on"] = workflow.pop(True, workflow.get("on"))
    return workflow


def test_pages_deploy_only_after_the_tests_pass():
    test, book = _workflow("test.yml"), _workflow("book.yml")
    assert set(book["on"]) == {"workflow_run"}, "the book must not publish on its own"
    run = book["on"]["workflow_run"]
    assert run["workflows"] == [test["name"]] and run["types"] == ["completed"]
    assert run["branches"] == ["main"]
    build, deploy = book["jobs"]["build"], book["jobs"]["deploy"]
    assert "github.event.workflow_run.conclusion == 'success'" in build["if"]
    checkout = next(
        s for s in build["steps"] if s.get("uses", "").startswith("actions/checkout")
    )
    assert checkout["with"]["ref"] == "${{ github.event.workflow_run.head_sha }}"
    assert deploy["needs"] == "build"


def test_ci_runs_the_readme_test_command():
    steps = _workflow("test.yml")["jobs"]["test"]["steps"]
    assert any(step.get("run") == "bash .ci/run" for step in steps)
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_make_test_oldest_installs_the_declared_lower_bounds():
    declared = {}
    for requirement in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "dependencies"
    ]:
        name, bound = re.fullmatch(r"([\w-]+)>=([\d.]+)", requirement).groups()
        declared[name] = bound
    pins = re.search(
        r"^OLDEST_PINS\s*:=\s*(.+)$", (ROOT / "Makefile").read_text(), re.M
    )
    installed = dict(pin.split("==") for pin in pins.group(1).split())
    # The library itself needs torch and numpy only (a course's autograder image
    # installs nothing else); what the book draws with is an extra.
    assert set(declared) == {"torch", "numpy"}
    assert set(installed) == set(declared)
    # matplotlib is the [book] extra's (bookkit draws with it), pinned on its own line
    book = re.search(
        r"^OLDEST_BOOK_PINS\s*:=\s*(.+)$", (ROOT / "Makefile").read_text(), re.M
    )
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["book"]
    assert "matplotlib>=3.7" in extra and book.group(1).split() == ["matplotlib==3.7.0"]
    for name, bound in declared.items():
        # torch>=2.2 is tested with torch==2.2.0: the same release, all its digits.
        assert installed[name].split(".")[: len(bound.split("."))] == bound.split(
            "."
        ), (
            f"{name}: pyproject.toml declares >= {bound}, make test-oldest installs "
            f"{installed[name]}"
        )
