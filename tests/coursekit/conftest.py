"""Shared fixtures of the course kit's grader tests: submissions written to files."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture
def write_py(tmp_path: Path) -> Callable[[str, str], Path]:
    """``write_py(name, source)``: a ``.py`` submission in a scratch folder."""

    def write(name: str, source: str) -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(source), encoding="utf-8")
        return path

    return write


@pytest.fixture
def write_ipynb(tmp_path: Path) -> Callable[[str, list[str]], Path]:
    """``write_ipynb(name, cells)``: a notebook whose code cells are ``cells``."""

    def write(name: str, cells: list[str]) -> Path:
        notebook = {
            "cells": [
                {"cell_type": "markdown", "metadata": {}, "source": "# My work"},
                *(
                    {
                        "cell_type": "code",
                        "execution_count": None,
                        "metadata": {},
                        "outputs": [],
                        "source": textwrap.dedent(cell),
                    }
                    for cell in cells
                ),
            ],
            "metadata": {},
            "nbformat": 4,
            "nbformat_minor": 5,
        }
        path = tmp_path / name
        path.write_text(json.dumps(notebook), encoding="utf-8")
        return path

    return write


@pytest.fixture
def tool_env() -> dict[str, str]:
    """The environment of a real tool's process (otter, nbgrader) and its kernels.

    The environment's bin folder is on PATH, as in an activated environment (nbgrader
    runs ``alembic`` by name), and ``rfc3987_syntax`` is not importable (see
    ``without_rfc3987_syntax/``): each of the 4 otter and 3 nbgrader processes
    imports jsonschema, which otherwise spends about 2.4 s of CPU building its grammar.
    """
    bin_dir = Path(sys.executable).parent
    blocker = Path(__file__).resolve().parent / "without_rfc3987_syntax"
    path = [str(blocker), *filter(None, [os.environ.get("PYTHONPATH")])]
    return dict(
        os.environ,
        PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        PYTHONPATH=os.pathsep.join(path),
    )
