"""Timing a call and naming the machine: what a chapter's timing cell needs.

Timings are never part of a claim that must hold everywhere: the book shows
them in cells whose output nbval ignores, always beside :func:`machine_info`,
and asserts only comparisons with a wide margin. The benchmarks in
``benchmarks/`` use the same two functions, so a number in a chapter and a
number in a benchmark are measured the same way.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from collections.abc import Callable

import torch

from ._checks import check_positive_int

__all__ = ["time_call", "machine_info"]

_STATISTICS: dict[str, Callable[[list[float]], float]] = {
    "median": statistics.median,
    "min": min,
}


def time_call(
    fn: Callable[..., object],
    *args: object,
    repeats: int = 5,
    warmup: int = 1,
    statistic: str = "median",
    threads: int | None = None,
    min_seconds: float = 0.01,
) -> float:
    r"""Seconds per call of ``fn(*args)``: the median (or minimum) of ``repeats`` runs.

    ``warmup`` calls run first and are not counted (first calls pay for
    caches, allocations, compilation). A call faster than ``min_seconds`` is
    repeated within each run until the run lasts about that long, and the run
    is divided by the count (as :mod:`timeit` does), so that the clock's
    resolution does not dominate. When CUDA is available the device is
    synchronized around each run, so the time is the GPU's work, not the
    launch of it. The minimum estimates the cost without interference (other
    processes only ever add time); the median, what a caller sees.

    Parameters
    ----------
    fn : callable
        What to time; its result is discarded.
    *args
        Passed to ``fn``.
    repeats : int
        Timed runs, ``>= 1``.
    warmup : int
        Untimed calls before them, ``>= 0``.
    statistic : {"median", "min"}
        How the ``repeats`` runs are summarized.
    threads : int, optional
        Run with this many torch threads (restored afterwards); one thread is
        far less disturbed by a busy machine.
    min_seconds : float
        The shortest run; ``0`` times exactly one call per run.

    Returns
    -------
    float
        Seconds per call.

    Raises
    ------
    TypeError
        If ``fn`` is not callable or a count is not an int.
    ValueError
        If ``repeats < 1``, ``warmup < 0``, ``threads < 1``,
        ``min_seconds < 0`` or ``statistic`` is unknown.

    Examples
    --------
    >>> import torch, bookkit as bk
    >>> x = torch.randn(256, 1024)
    >>> seconds = bk.time_call(torch.softmax, x, -1, statistic="min", threads=1)
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    repeats = check_positive_int(repeats, "repeats")
    _check_count(warmup, "warmup")
    if statistic not in _STATISTICS:
        raise ValueError(
            f"statistic={statistic!r} is unknown; expected 'median' or 'min'"
        )
    if threads is not None:
        threads = check_positive_int(threads, "threads")
    if isinstance(min_seconds, bool) or not isinstance(min_seconds, (int, float)):
        raise TypeError(
            f"min_seconds must be a number, got {type(min_seconds).__name__}"
        )
    if not min_seconds >= 0:
        raise ValueError(f"min_seconds must be >= 0, got {min_seconds}")
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        for _ in range(warmup):
            fn(*args)
        number = max(1, math.ceil(min_seconds / max(_run(fn, args, 1), 1e-9)))
        times = [_run(fn, args, number) / number for _ in range(repeats)]
    finally:
        torch.set_num_threads(before)
    return _STATISTICS[statistic](times)


def _run(fn: Callable[..., object], args: tuple[object, ...], number: int) -> float:
    """Seconds for ``number`` back-to-back calls, the GPU synchronized around them."""
    sync: Callable[[], None] = (
        torch.cuda.synchronize if torch.cuda.is_available() else _nothing
    )
    sync()
    start = time.perf_counter()
    for _ in range(number):
        fn(*args)
    sync()
    return time.perf_counter() - start


def _nothing() -> None:
    """What synchronizing means without a GPU."""


def _check_count(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


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
