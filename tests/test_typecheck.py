"""mypy on lib/ (both packages), as `make typecheck` runs it.

A test, so that `make test` checks the types beside the other tests instead of
before them: mypy takes about 30 s of one core on a fresh clone (no cache).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_finds_no_type_errors():
    # The settings, and the files checked, are [tool.mypy] of pyproject.toml.
    mypy = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True
    )
    assert mypy.returncode == 0, mypy.stdout + mypy.stderr
    assert "Success: no issues found" in mypy.stdout, mypy.stdout
