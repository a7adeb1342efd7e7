"""Timers shared by the benchmarks: a median of wall-clock runs, and CUDA events.

Used by every script in ``benchmarks/`` (performance is measured here, never
in the tests). The wall-clock timer and the machine line are the library's
(:mod:`bookkit.timing`), so that chapters and benchmarks measure alike.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from bookkit.timing import machine_info, time_call


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Median wall-clock time of ``repeats`` calls of ``fn``, after one warm-up call."""
    return time_call(fn, repeats=repeats, warmup=1)


def cuda_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Mean time of ``repeats`` back-to-back calls of ``fn`` on the GPU, by CUDA events.

    One warm-up call first (compilation, caches). The events are recorded on
    the current stream around the whole loop and read after a synchronize, so
    the time is the GPU's, not the Python launch overhead of one call.
    """
    import torch

    fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / repeats


#: One line naming the CPU, its cores and torch's threads (and the GPU, if any).
machine = machine_info


def load_average() -> str:
    """The machine's load, printed with every run: timings on a busy machine differ."""
    try:
        one, five, _ = os.getloadavg()
        return f"load average {one:.2f} (1 min), {five:.2f} (5 min)"
    except OSError:  # pragma: no cover - not on every platform
        return "load average unknown"
