"""The sweep runner both studies share: every ``(variant, seed)`` on worker processes.

A study (:mod:`~bookkit.studies.case_study`, :mod:`~bookkit.studies.sink_study`)
defines what one run is; this module runs many of them, rounds what they
return, and writes the stored sweep in one format. Each worker process starts
from a fresh interpreter (``spawn``: no threads inherited from a fork) and runs
on one thread, so the order of float sums, and with it every stored digit, is
fixed on a given machine.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from typing import Any

import torch

__all__ = ["round_to", "rounded", "one_thread", "run_sweep", "dumps"]

Job = tuple[str, int]  # (variant, seed)


def round_to(x: float, digits: int) -> float:
    """``x`` to ``digits`` significant digits (what a stored sweep keeps)."""
    return float(f"{x:.{digits}g}")


def rounded(t: torch.Tensor, digits: int) -> list[Any] | float:
    """A tensor as (nested lists of) floats rounded to ``digits`` significant digits."""
    return [rounded(x, digits) for x in t] if t.dim() else round_to(t.item(), digits)


def one_thread(deterministic: bool = False) -> None:
    """What every worker does first: one thread, so a fixed order of float sums."""
    torch.set_num_threads(1)
    if deterministic:
        torch.use_deterministic_algorithms(True)


def run_sweep(
    run_one: Callable[[str, int], dict[str, Any]],
    initializer: Callable[[], None],
    variants: Sequence[str],
    seeds: Sequence[int],
    workers: int = 2,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """``run_one(variant, seed)`` for every pair, on ``workers`` processes, in order.

    ``run_one`` and ``initializer`` must be module-level functions (the worker
    processes import them by name). The result lists the runs variant by
    variant, seed by seed, whatever order they finished in.
    """
    jobs: list[Job] = [(v, s) for v in variants for s in seeds]
    with ProcessPoolExecutor(
        workers, mp_context=get_context("spawn"), initializer=initializer
    ) as pool:
        futures = {pool.submit(run_one, v, s): (v, s) for v, s in jobs}
        done: Iterable[Future[dict[str, Any]]] = as_completed(futures)
        if progress:
            from tqdm import tqdm

            done = tqdm(done, total=len(jobs), desc="runs", ncols=80)
        results = {futures[f]: f.result() for f in done}
    return [results[job] for job in jobs]


def dumps(record: dict[str, Any]) -> str:
    """A stored sweep as JSON text: its header indented, then one line per run,
    so that a diff of the file shows which runs changed."""
    header = json.dumps({k: v for k, v in record.items() if k != "runs"}, indent=1)
    runs = ",\n".join("  " + json.dumps(run) for run in record["runs"])
    return header[:-2] + ',\n "runs": [\n' + runs + "\n ]\n}\n"
