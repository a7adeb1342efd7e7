"""Timers shared by the benchmarks: a median of wall-clock runs, and CUDA events.

Written once here, used by every script in ``benchmarks/`` (performance is
measured here, never in the tests).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Median wall-clock time of ``repeats`` calls of ``fn``, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


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


def machine() -> str:
    """One line naming the CPU, its cores and torch's threads (and the GPU, if any)."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    line = f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__} with "
    line += f"{torch.get_num_threads()} threads"
    if torch.cuda.is_available():
        line += f"; GPU: {torch.cuda.get_device_name()}"
    return line
