"""nbval's kernels, forked from a zygote that has imported torch.

This conftest sits at the root so that it applies however the notebooks are
collected (``make test``, ``pytest chapters``, ``make test-portable``); the rest of
the shared test setup is tests/conftest.py. How and why: tests/_kernel_zygote.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_ZYGOTE = Path(__file__).parent / "tests" / "_kernel_zygote.py"


_ZYGOTE_STARTED: list[bool] = []


def _start_zygote() -> bool:
    """Start this process's zygote once; False where it cannot run. Each pytest
    process has its own (a zygote's torch was imported under its environment)."""
    if _ZYGOTE_STARTED:
        return _ZYGOTE_STARTED[0]
    _ZYGOTE_STARTED.append(False)
    if os.environ.get("SOFTMAXBOOK_ZYGOTE") == "0" or not hasattr(os, "fork"):
        return False
    import atexit
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="sb-zygote-")
    atexit.register(shutil.rmtree, folder, True)  # runs after the kill below
    path = os.path.join(folder, "socket")
    zygote = subprocess.Popen(
        [sys.executable, str(_ZYGOTE), "serve", path],
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE,  # closed when this process ends: the zygote ends too
        text=True,
    )
    atexit.register(zygote.kill)
    if zygote.stdout is None or zygote.stdout.readline().strip() != "ready":
        zygote.kill()
        return False
    os.environ["SOFTMAXBOOK_ZYGOTE"] = path  # for the launchers Jupyter starts
    _ZYGOTE_STARTED[0] = True
    return True


def pytest_configure(config: pytest.Config) -> None:
    try:
        import nbval.kernel
    except ImportError:
        return
    manager = nbval.kernel.NbvalKernelspecManager
    plain = manager.get_kernel_spec

    def get_kernel_spec(self, kernel_name):  # type: ignore[no-untyped-def]
        spec = plain(self, kernel_name)
        if kernel_name == nbval.kernel.CURRENT_ENV_KERNEL_NAME and _start_zygote():
            spec.argv = [sys.executable, str(_ZYGOTE), "launch", *spec.argv[-2:]]
        return spec

    manager.get_kernel_spec = get_kernel_spec


_LIB = Path(__file__).parent / "lib"


def pytest_collect_file(
    file_path: Path, parent: pytest.Collector
) -> pytest.Collector | None:
    """The docstrings' examples of lib/ wherever lib/ is collected (`make test`
    passes it beside tests/ and chapters/), as `pytest --doctest-modules lib`
    (`make doctest`) runs them: in one run with the other tests, on both workers,
    instead of a run of their own before them while the other core waits."""
    if (
        file_path.suffix == ".py"
        and _LIB in file_path.parents
        and file_path.name != "conftest.py"
        and not parent.config.getoption("doctestmodules")
    ):
        from _pytest.doctest import DoctestModule

        return DoctestModule.from_parent(parent, path=file_path)
    return None


def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    # softmaxbook.checks lists its checkers in __test__ so that
    # doctest.testmod(softmaxbook.checks) runs their examples although they are
    # defined in its submodules; pytest's --doctest-modules collects those
    # submodules themselves, so the listed copies would run every example twice.
    twice = [item for item in items if ".__test__." in item.name]
    if twice:
        config.hook.pytest_deselected(items=twice)
        items[:] = [item for item in items if ".__test__." not in item.name]
