"""tools/colab_cell.py: the first code cell installs the book's library in Colab, and
does nothing where it is installed.

The preamble is run in a real IPython shell (its ``%pip`` line goes through IPython's
own transformer and variable expansion, with ``pip`` itself replaced by a recorder),
and checked with ruff as the chapters are.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "colab_cell", ROOT / "tools" / "colab_cell.py"
)
colab_cell = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(colab_cell)

PAGES = colab_cell.chapter_pages(ROOT)
FIRST_CELL = """import matplotlib.pyplot as plt
import torch

import bookkit as bk
import softmaxbook as sb

device = bk.setup_notebook(seed=0)
print(sb.softmax(torch.zeros(2)), plt.__name__)"""
ENTMAX_CELL = """import entmax
import torch

import bookkit as bk

device = bk.setup_notebook(seed=0, requires=("entmax",))
print(entmax.sparsemax(torch.zeros(2), dim=-1))"""


@pytest.fixture
def shell(monkeypatch):
    """An IPython shell whose %pip records its argument instead of installing."""
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    calls = []
    ip.register_magic_function(lambda line: calls.append(line), "line", "pip")
    ip.pip_calls = calls
    yield ip
    InteractiveShell.clear_instance()


def _pretend_missing(monkeypatch, *names):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name in names else find_spec(name, *args),
    )


def _run(shell, source):
    result = shell.run_cell(source, silent=True)
    return result.error_before_exec or result.error_in_exec


def test_without_the_library_the_cell_installs_it_then_runs(shell, monkeypatch):
    _pretend_missing(monkeypatch, "bookkit")
    source = colab_cell.with_preamble("x = 41 + 1", ref="v0.2.0")
    assert _run(shell, source) is None
    assert shell.pip_calls == [
        'install --quiet "softmaxbook[book] @ '
        'git+https://github.com/softmaxbook/softmax-in-attention@v0.2.0"'
    ]
    assert shell.user_ns["x"] == 42


def test_with_the_library_the_cell_installs_nothing_and_prints_the_same(shell, capsys):
    assert _run(shell, FIRST_CELL) is None
    before = capsys.readouterr().out
    assert _run(shell, colab_cell.with_preamble(FIRST_CELL)) is None
    assert shell.pip_calls == []
    assert capsys.readouterr().out == before != ""


def test_a_missing_required_package_is_named_before_its_import(shell, monkeypatch):
    """Chapter 6 imports entmax in its first cell: without the check first, the reader
    gets a bare ModuleNotFoundError, not why the page needs entmax."""
    source = colab_cell.with_preamble(ENTMAX_CELL)
    assert 'require("entmax")' in source
    assert source.index('require("entmax")') < source.index("import entmax")
    _pretend_missing(monkeypatch, "entmax")
    error = _run(shell, source)
    assert isinstance(error, ImportError) and error.name == "entmax"
    assert "Why entmax: chapter 6" in str(error)
    assert "%pip install entmax" in str(error)
    assert shell.pip_calls == []  # the library is there: nothing is installed for it


def test_early_requirements_are_only_what_the_cell_imports():
    assert colab_cell.early_requirements(ENTMAX_CELL) == ["entmax"]
    triton = "import bookkit as bk\n\nbk.setup_notebook(seed=0, requires=('triton',))"
    assert colab_cell.early_requirements(triton) == []  # setup_notebook says it
    assert colab_cell.early_requirements(FIRST_CELL) == []


def test_running_it_again_replaces_the_preamble_and_nothing_else():
    once = colab_cell.with_preamble(ENTMAX_CELL, ref="v0.1.0")
    again = colab_cell.with_preamble(once, ref="v0.2.0")
    assert again.count("%pip install") == 1 and again.count("require(") == 1
    assert "@v0.2.0" in again and "v0.1.0" not in again
    assert again.endswith(ENTMAX_CELL)
    assert colab_cell.strip_preamble(again) == ENTMAX_CELL
    assert colab_cell.has_preamble(again, ref="v0.2.0")
    assert not colab_cell.has_preamble(again, ref=None)
    assert colab_cell.with_preamble(again, ref="v0.2.0") == again


def test_the_pinned_release_is_this_version():
    import softmaxbook

    assert colab_cell.release_ref(ROOT) == f"v{softmaxbook.__version__}"
    assert colab_cell.repository_url(ROOT) == colab_cell.DEFAULT_REPO


def _ruff():
    ruff = Path(sys.executable).with_name("ruff")
    return str(ruff) if ruff.exists() else shutil.which("ruff")


def test_ruff_accepts_the_preamble_in_a_notebook(tmp_path):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(colab_cell.with_preamble(source, ref=ref))
        for source, ref in ((FIRST_CELL, None), (ENTMAX_CELL, "v0.2.0"))
    ]
    path = tmp_path / "page.ipynb"
    nbformat.write(nb, path)
    config = ["--config", str(ROOT / "pyproject.toml")]
    for command in (["check"], ["format", "--check"]):
        result = subprocess.run(
            [_ruff(), *command, *config, str(path)], capture_output=True, text=True
        )
        assert result.returncode == 0, result.stdout + result.stderr
    # every line fits the page's 88 columns
    assert max(len(line) for c in nb.cells for line in c.source.splitlines()) <= 88


def test_command_line_writes_then_checks(tmp_path):
    for page in PAGES[:2] + [ROOT / "chapters" / "06_alternatives.ipynb"]:
        nb = json.loads(page.read_text())
        cell = colab_cell.first_code_cell(nb)  # as before the script (if it ran)
        cell["source"] = colab_cell.strip_preamble(colab_cell.source_of(cell))
        colab_cell.write_notebook(tmp_path / page.name, nb)
    copies = sorted(tmp_path.glob("*.ipynb"))
    originals = {p.name: json.loads(p.read_text()) for p in copies}
    tool = [sys.executable, str(ROOT / "tools" / "colab_cell.py")]
    check = subprocess.run([*tool, "--check", *map(str, copies)], capture_output=True)
    assert check.returncode == 1
    subprocess.run([*tool, *map(str, copies)], check=True, capture_output=True)
    check = subprocess.run([*tool, "--check", *map(str, copies)], capture_output=True)
    assert check.returncode == 0, check.stdout
    for path in copies:
        before, after = originals[path.name], json.loads(path.read_text())
        first = next(
            i for i, c in enumerate(before["cells"]) if c["cell_type"] == "code"
        )
        changed = [
            i for i, (a, b) in enumerate(zip(before["cells"], after["cells"])) if a != b
        ]
        assert changed == [first]  # one cell, its source only
        assert after["cells"][first]["outputs"] == before["cells"][first]["outputs"]
        assert "".join(after["cells"][first]["source"]).endswith(
            "".join(before["cells"][first]["source"])
        )


def _page_id(path):
    return str(path.relative_to(ROOT / "chapters"))


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_chapter_installs_what_it_needs_in_colab(page):
    nb = json.loads(page.read_text())
    source = colab_cell.source_of(colab_cell.first_code_cell(nb))
    ref = colab_cell.installed_ref(source)
    assert colab_cell.has_preamble(source, ref=ref), "no Colab preamble"
