"""How long ``import softmaxbook`` takes on top of ``import torch``.

A training script that imports the library should pay for what it uses: the
target is under 0.1 s beyond torch. matplotlib, tqdm and triton are imported
only when a figure, a progress bar or a kernel is first needed, and
``softmaxbook.checks`` (the checkers of students' code) when first used
(``tests/softmaxbook/test_api.py`` checks that none of them is imported).

Each measurement is a fresh Python process that times ``import torch`` and
then ``import softmaxbook``, in wall-clock and in CPU time (the CPU time
hardly changes when other processes share the machine; the wall-clock time
does); the script reports the medians and the ranges. Bytecode caching is on,
as in an installed package: a first, unmeasured process writes the ``.pyc``
files (with ``PYTHONDONTWRITEBYTECODE`` set, every import would compile the
sources again, which is not what a user's ``import`` costs).

    python benchmarks/import_time.py            # 15 processes
    python benchmarks/import_time.py --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from _timing import machine

CHILD = """
import json, time
t0, c0 = time.perf_counter(), time.process_time()
import torch
t1, c1 = time.perf_counter(), time.process_time()
import softmaxbook
t2, c2 = time.perf_counter(), time.process_time()
print(json.dumps({"torch": t1 - t0, "softmaxbook": t2 - t1,
                  "torch cpu": c1 - c0, "softmaxbook cpu": c2 - c1}))
"""
# As installed: bytecode is written once and read afterwards.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}

TARGET_S = 0.1


def one_run() -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        capture_output=True,
        text=True,
        check=True,
        env=ENV,
    )
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="fresh processes")
    args = parser.parse_args()
    print("Machine:", machine(), f"; load average {os.getloadavg()[0]:.1f}")
    one_run()  # writes the bytecode caches
    runs = [one_run() for _ in range(args.runs)]
    for name in ("torch", "softmaxbook", "torch cpu", "softmaxbook cpu"):
        times = [run[name] for run in runs]
        print(
            f"import {name:<16} median {statistics.median(times):.3f} s "
            f"(range {min(times):.3f} to {max(times):.3f} s, {len(times)} processes)"
        )
    for kind in ("", " cpu"):
        extra = statistics.median(run["softmaxbook" + kind] for run in runs)
        verdict = "met" if extra < TARGET_S else "NOT met"
        what = "CPU time" if kind else "wall-clock"
        print(
            f"softmaxbook beyond torch, {what}: {extra:.3f} s "
            f"(target < {TARGET_S} s: {verdict})"
        )


if __name__ == "__main__":
    main()
