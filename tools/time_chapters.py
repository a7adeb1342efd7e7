"""How long each chapter takes to run top to bottom, on this machine.

Usage::

    python tools/time_chapters.py [--repeat N] [NOTEBOOK ...]

Runs ``jupyter nbconvert --execute`` on each chapter (by default every
``chapters/*.ipynb``) into a temporary directory, so the stored notebooks are
never touched, and prints the machine (CPU model, cores, torch threads) and
the wall-clock time of each run, kernel start included. With ``--repeat`` it
keeps the fastest of N runs, the least disturbed by other work on the machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def machine() -> str:
    """CPU model, logical cores, and the threads torch would use."""
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    import torch

    cores = (
        len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count()
    )
    return (
        f"{model}; {cores} logical cores available; torch {torch.__version__} with "
        f"{torch.get_num_threads()} threads; Python {platform.python_version()}"
    )


def run_once(notebook: Path, out_dir: Path) -> float:
    jupyter = Path(sys.executable).with_name("jupyter")
    command = [
        str(jupyter) if jupyter.exists() else "jupyter",
        "nbconvert",
        "--to",
        "notebook",
        "--execute",
        "--ExecutePreprocessor.timeout=600",
        "--output-dir",
        str(out_dir),
        str(notebook),
    ]
    start = time.perf_counter()
    subprocess.run(command, cwd=notebook.parent, check=True, capture_output=True)
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args(argv)
    notebooks = args.notebooks or sorted((ROOT / "chapters").glob("*.ipynb"))
    print(f"machine: {machine()}")
    total = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for notebook in notebooks:
            best = min(run_once(notebook, Path(tmp)) for _ in range(args.repeat))
            total += best
            print(f"{notebook.name:28s} {best:6.1f} s", flush=True)
    print(f"{'all chapters':28s} {total:6.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
