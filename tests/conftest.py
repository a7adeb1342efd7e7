"""Shared fixtures: deterministic seeds, and one build of the book per test session."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

# Under `make test` two xdist workers share the machine's two cores. Each runs torch,
# and the notebooks' kernels, on one thread: with two threads each, their OpenMP pools
# wait on each other (a small training test took 12 times as long). An explicit
# setting wins, so `make test-portable` still runs the chapters on 2 threads.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

import torch  # after the thread settings above

if os.environ.get("PYTEST_XDIST_WORKER") and os.environ["OMP_NUM_THREADS"] == "1":
    torch.set_num_threads(1)

# Without CUDA the Triton kernels run in Triton's CPU interpreter, which Triton picks
# when it is first imported: set it here, before any test module (in whatever order
# the folders are collected) imports softmaxbook.kernels or torch's Triton paths.
if not torch.cuda.is_available() and "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "_build"


@pytest.fixture(autouse=True)
def _seed():
    import numpy as np
    import torch

    torch.manual_seed(0)
    np.random.seed(0)


class _BookBuild:
    """``jupyter-book build . -W -n --keep-going``, started once in the background.

    The build is one process on one core; the unit tests and the notebooks run
    beside it, so the website costs the session little extra time. Under
    pytest-xdist every worker collects the same tests, and the first to claim
    the run's build starts it (an exclusively created claim file); the others
    wait for its exit status, which a shell writes when the build ends, so any
    worker can read the result whichever one started it.
    """

    def __init__(self, run_id: str) -> None:
        BUILD.mkdir(exist_ok=True)
        stem = BUILD / f".book-build-{run_id}"
        self.log, self.status = stem.with_suffix(".log"), stem.with_suffix(".rc")
        self.command = [
            _jupyter_book(),
            *("build", str(ROOT), "-W", "-n", "--keep-going"),
        ]
        try:
            claim = os.open(stem.with_suffix(".claim"), os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            return  # another worker of this run builds
        os.close(claim)
        for old in BUILD.glob(".book-build-*"):
            if not old.name.startswith(stem.name):
                old.unlink(missing_ok=True)
        shutil.rmtree(BUILD / "html", ignore_errors=True)
        shutil.rmtree(BUILD / ".doctrees", ignore_errors=True)
        env = dict(os.environ, PYTHONWARNINGS="ignore::DeprecationWarning")
        # The shell writes the exit status after the build, even when the worker
        # that started it has finished its own tests and exited.
        script = (
            f"{shlex.join(self.command)} > {shlex.quote(str(self.log))} 2>&1; "
            f"echo $? > {shlex.quote(str(self.status))}.tmp && "
            f"mv {shlex.quote(str(self.status))}.tmp {shlex.quote(str(self.status))}"
        )
        subprocess.Popen(["sh", "-c", script], cwd=ROOT, env=env)

    def result(self) -> subprocess.CompletedProcess:
        deadline = time.monotonic() + 900
        while not self.status.exists():
            if time.monotonic() > deadline:
                pytest.fail("the book build did not finish in 15 minutes")
            time.sleep(1)
        log = self.log.read_text() if self.log.exists() else ""
        return subprocess.CompletedProcess(
            self.command, int(self.status.read_text()), log, ""
        )


def _jupyter_book() -> str:
    local = Path(sys.executable).with_name("jupyter-book")
    return str(local) if local.exists() else "jupyter-book"


def _run_id(config: pytest.Config) -> str:
    """One id per test run, shared by all of its xdist workers."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        return str(workerinput["testrunuid"])
    if not hasattr(config, "_book_run_id"):
        config._book_run_id = uuid.uuid4().hex  # type: ignore[attr-defined]
    return config._book_run_id  # type: ignore[attr-defined]


_BUILDS: list[_BookBuild] = []


def _needs_build(item: pytest.Item) -> bool:
    return "book_build" in getattr(item, "fixturenames", ())


# `make test` runs `--dist loadgroup`, scheduled by _Schedule below: a file under
# one of these folders keeps its tests on one worker (a notebook's cells share one
# kernel; the website, packaging and course-kit tests share a costly module-level
# setup: a browser, a built wheel, a real nbgrader or otter run). Every other test
# goes to whichever worker is free, one by one, so a file of long independent tests
# (re-trained runs, spawned ring processes) is split between the workers.
_WHOLE_FILES = ("chapters/", "tests/book/", "tests/coursekit/")
# The browser tests are split too: each worker opens its own browser once (a session
# fixture), and axe-core's page checks, the slowest of them, then run on both cores.
_SPLIT_FILES = ("tests/book/test_site.py",)


def _scope(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    whole = path.startswith(_WHOLE_FILES) and not path.startswith(_SPLIT_FILES)
    return path if whole else nodeid


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """The scheduler for `--dist loadgroup`: xdist's scope scheduler, with the
    scopes above (pytest 9 keeps node ids where xdist's own loadgroup cannot
    append its group names, so the groups are chosen here, from the ids)."""
    if config.getoption("dist", "no") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class _Schedule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    return _Schedule(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The tests of the built website run last, so the build has the whole of the
    # unit tests and the notebooks to finish in the background.
    items.sort(key=_needs_build)  # stable: the order within each group is kept


def pytest_collection_finish(session: pytest.Session) -> None:
    if not session.config.option.collectonly and any(
        _needs_build(item) for item in session.items
    ):
        _BUILDS.append(_BookBuild(_run_id(session.config)))


@pytest.fixture(scope="session")
def book_build(request: pytest.FixtureRequest) -> subprocess.CompletedProcess:
    """The website, built once per session; ``_build/html`` holds it.

    Returns the completed build process (``returncode``, ``stdout``, ``stderr``).
    A fresh build every session, so the tests check today's sources.
    """
    if not _BUILDS:  # e.g. a test that asked for the fixture indirectly
        _BUILDS.append(_BookBuild(_run_id(request.config)))
    return _BUILDS[0].result()
