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


@pytest.fixture(scope="session")
def book_build():
    """Build the website once (``jupyter-book build . -W -n --keep-going``).

    Returns the completed process; ``_build/html`` holds the site. A fresh
    build every session, so the tests check today's sources.
    """
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    command = [
        str(jupyter_book) if jupyter_book.exists() else "jupyter-book",
        "build",
        str(ROOT),
        "-W",
        "-n",
        "--keep-going",
    ]
    shutil.rmtree(BUILD / "html", ignore_errors=True)
    shutil.rmtree(BUILD / ".doctrees", ignore_errors=True)
    env = dict(os.environ, PYTHONWARNINGS="ignore::DeprecationWarning")
    return subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, env=env, timeout=900
    )
