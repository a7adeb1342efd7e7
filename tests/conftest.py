"""Shared fixtures: deterministic seeds, and one build of the book per test session."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "_build"


@pytest.fixture(autouse=True)
def _seed():
    import numpy as np
    import torch

    torch.manual_seed(0)
    np.random.seed(0)


class _BookBuild:
    """``jupyter-book build . -W -n --keep-going``, started in the background.

    The build is one process on one core; the unit tests and the notebooks run
    on the other meanwhile, so the website costs the session little extra time.
    """

    def __init__(self) -> None:
        jupyter_book = Path(sys.executable).with_name("jupyter-book")
        command = [
            str(jupyter_book) if jupyter_book.exists() else "jupyter-book",
            *("build", str(ROOT), "-W", "-n", "--keep-going"),
        ]
        shutil.rmtree(BUILD / "html", ignore_errors=True)
        shutil.rmtree(BUILD / ".doctrees", ignore_errors=True)
        env = dict(os.environ, PYTHONWARNINGS="ignore::DeprecationWarning")
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def result(self) -> subprocess.CompletedProcess:
        stdout, stderr = self.process.communicate(timeout=900)
        return subprocess.CompletedProcess(
            self.process.args, self.process.returncode, stdout, stderr
        )


_BUILDS: list[_BookBuild] = []


def _needs_build(item: pytest.Item) -> bool:
    return "book_build" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The tests of the built website run last, so the build has the whole of the
    # unit tests and the notebooks to finish in the background.
    items.sort(key=_needs_build)  # stable: the order within each group is kept


def pytest_collection_finish(session: pytest.Session) -> None:
    if not session.config.option.collectonly and any(
        _needs_build(item) for item in session.items
    ):
        _BUILDS.append(_BookBuild())


@pytest.fixture(scope="session")
def book_build() -> subprocess.CompletedProcess:
    """The website, built once per session; ``_build/html`` holds it.

    Returns the completed build process (``returncode``, ``stdout``, ``stderr``).
    A fresh build every session, so the tests check today's sources.
    """
    if not _BUILDS:  # e.g. a test that asked for the fixture indirectly
        _BUILDS.append(_BookBuild())
    return _BUILDS[0].result()
