"""Timing a call and naming the machine: what a chapter's timing cell needs.

Timings are never part of a claim that must hold everywhere: the book shows
them in cells whose output nbval ignores, always beside :func:`machine_info`,
and asserts only comparisons with a wide margin. The benchmarks in
``benchmarks/`` use the same two functions, so a number in a chapter and a
number in a benchmark are measured the same way.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable

import torch

from ._checks import check_positive_int

__all__ = ["time_call", "machine_info"]

_STATISTICS = {"median": statistics.median, "min": min}


def time_call(
    fn: Callable[..., object],
    *args,
    repeats: int = 5,
    warmup: int = 1,
    statistic: str = "median",
) -> float:
    r"""Seconds per call of ``fn(*args)``: the median (or minimum) of ``repeats`` runs.

    ``warmup`` calls run first and are not counted (first calls pay for
    caches, allocations, compilation). When CUDA is available the device is
    synchronized before and after each call, so the time is the GPU's work,
    not the launch of it. The minimum estimates the cost without
    interference; the median what a caller sees on a busy machine.

    Parameters
    ----------
    fn : callable
        What to time; its result is discarded.
    *args
        Passed to ``fn``.
    repeats : int
        Timed calls, ``>= 1``.
    warmup : int
        Untimed calls before them, ``>= 0``.
    statistic : {"median", "min"}
        How the ``repeats`` times are summarized.

    Returns
    -------
    float
        Seconds per call.

    Raises
    ------
    TypeError
        If ``fn`` is not callable or a count is not an int.
    ValueError
        If ``repeats < 1``, ``warmup < 0`` or ``statistic`` is unknown.

    Examples
    --------
    >>> import torch, softmaxbook as sb
    >>> x = torch.randn(256, 1024)
    >>> seconds = sb.time_call(torch.softmax, x, -1, repeats=3)
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    repeats = check_positive_int(repeats, "repeats")
    if isinstance(warmup, bool) or not isinstance(warmup, int):
        raise TypeError(f"warmup must be an int, got {type(warmup).__name__}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if statistic not in _STATISTICS:
        raise ValueError(
            f"statistic={statistic!r} is unknown; expected 'median' or 'min'"
        )
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        fn(*args)
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn(*args)
        sync()
        times.append(time.perf_counter() - start)
    return _STATISTICS[statistic](times)


def machine_info() -> str:
    """One line naming the CPU, its logical cores, torch and its threads (and a GPU).

    Print it beside every timing: a time means nothing without the machine.

    Returns
    -------
    str
        E.g. ``"AMD EPYC, 2 logical cores; torch 2.13.0, 2 threads"``.
    """
    cpu = _cpu_name()
    threads = torch.get_num_threads()
    line = f"{cpu}, {os.cpu_count()} logical cores; torch {torch.__version__}, "
    line += f"{threads} thread{'s' if threads != 1 else ''}"
    if torch.cuda.is_available():
        line += f"; GPU: {torch.cuda.get_device_name()}"
    return line


def _cpu_name() -> str:
    # /proc/cpuinfo names the model on Linux; platform.processor() is often empty there.
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"
