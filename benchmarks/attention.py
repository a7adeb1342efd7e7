"""Time and peak memory of attention against sequence length: naive, torch SDPA,
flash_attention.

Each configuration runs in a fresh Python process, so that one run's memory
cannot hide another's. Peak memory is the process's resident-set high-water
mark (``VmHWM`` in ``/proc/self/status``) after resetting it by writing ``5``
to ``/proc/self/clear_refs``, minus the resident set just before the call: the
extra memory the call needed, including its output. A warm-up call on a tiny
problem first pays the one-time costs (imports, thread pools, BLAS buffers).

    python benchmarks/attention.py          # N = 512 ... 8192, B*H = 8, D = 64
    python benchmarks/attention.py --quick  # a short run

Prints a table, checks the targets at N = 4096 (flash_attention's peak extra
memory at most 5 % of naive attention's, its time at most 1.5x torch's SDPA)
and saves a plot to ``benchmarks/results/attention.png``. On a machine with
CUDA and Triton it also times the Triton kernel against torch on the GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

from _timing import cuda_seconds, machine, median_seconds

RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ("naive", "sdpa", "flash")
BH, D = 8, 64


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not found in /proc/self/status")


def _attention_fn(method: str, device: str = "cpu"):
    import torch
    import torch.nn.functional as F

    import softmaxbook as sb

    if (
        method == "naive"
    ):  # the textbook formula: the (L, S) scores and weights materialized

        def naive(q, k, v):
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            return torch.softmax(scores, dim=-1) @ v

        return naive
    if method == "sdpa":
        return F.scaled_dot_product_attention
    if method == "flash":
        return sb.flash_attention
    raise ValueError(method)


def worker(method: str, n: int, repeats: int) -> dict:
    """Run one configuration in this (fresh) process; return its median time and peak
    memory."""
    import torch

    fn = _attention_fn(method)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, BH, n, D, generator=g) for _ in range(3))
    with torch.inference_mode():
        # One-time costs (imports, thread pools, BLAS workspaces) are paid on a tiny
        # problem, so that the memory measured next is what this size needs; it is
        # measured on the first call of this size, so nothing freed by an earlier call
        # of it can be reused.
        fn(*(torch.randn(1, BH, 128, D, generator=g) for _ in range(3)))
        clear_refs = Path("/proc/self/clear_refs")
        before = _status_kib("VmRSS")
        clear_refs.write_text("5")  # reset VmHWM to the current resident set
        out = fn(q, k, v)
        peak = _status_kib("VmHWM")
        del out
        seconds = median_seconds(lambda: fn(q, k, v), repeats)
    return {
        "method": method,
        "n": n,
        "time_s": seconds,
        "peak_extra_mib": max(peak - before, 0) / 1024,
    }


def run_fresh(method: str, n: int, repeats: int) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        method,
        str(n),
        "--repeats",
        str(repeats),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{method} at N={n} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def gpu_report(sizes) -> None:
    """Time naive, SDPA and the library (Triton kernel) on the GPU, with CUDA events."""
    import torch

    import softmaxbook as sb

    print("\nGPU (CUDA events, torch.cuda.max_memory_allocated):")
    q = torch.randn(1, BH, 16, D, device="cuda")
    print("  dispatch:", sb.explain_dispatch("flash_attention", q, q, q))
    print(f"  {'N':>6} {'method':>6} {'time ms':>9} {'peak extra MiB':>15}")
    for n in sizes:
        q, k, v = (torch.randn(1, BH, n, D, device="cuda") for _ in range(3))
        for method in METHODS:
            fn = _attention_fn(method)
            with torch.inference_mode():
                fn(q, k, v)
                torch.cuda.synchronize()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                seconds = cuda_seconds(lambda: fn(q, k, v), 10)  # noqa: B023
            peak = (torch.cuda.max_memory_allocated() - base) / 2**20
            print(f"  {n:>6} {method:>6} {seconds * 1e3:>9.3f} {peak:>15.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="N = 512 ... 2048, one repeat"
    )
    parser.add_argument("--sizes", type=int, nargs="+", help="sequence lengths N")
    parser.add_argument(
        "--repeats", type=int, default=None, help="timed calls per configuration"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="fresh processes per configuration, interleaved across methods",
    )
    parser.add_argument(
        "--worker", nargs=2, metavar=("METHOD", "N"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.worker:
        method, n = args.worker
        print(json.dumps(worker(method, int(n), args.repeats or 3)))
        return

    sizes = args.sizes or (
        [512, 1024, 2048] if args.quick else [512, 1024, 2048, 4096, 8192]
    )
    import torch

    rounds = args.rounds or (1 if args.quick else 3)
    print("Machine:", machine())
    print(
        f"Attention, B*H = {BH}, D = {D}, float32, CPU with "
        f"{torch.get_num_threads()} threads; each configuration in a fresh process, "
        f"{rounds} rounds interleaved across methods (medians over rounds: the "
        "machine is noisy)"
    )
    print(f"{'N':>6} {'method':>6} {'median s':>9} {'peak extra MiB':>15}")
    rows = []
    for n in sizes:
        repeats = args.repeats or (1 if args.quick else (5 if n <= 2048 else 3))
        runs = {method: [] for method in METHODS}
        for _ in range(
            rounds
        ):  # naive, sdpa, flash, naive, ...: drifts in load hit all alike
            for method in METHODS:
                runs[method].append(run_fresh(method, n, repeats))
        for method in METHODS:
            row = {
                "method": method,
                "n": n,
                "time_s": statistics.median(r["time_s"] for r in runs[method]),
                "peak_extra_mib": statistics.median(
                    r["peak_extra_mib"] for r in runs[method]
                ),
            }
            rows.append(row)
            seconds, mib = row["time_s"], row["peak_extra_mib"]
            print(f"{n:>6} {method:>6} {seconds:>9.4f} {mib:>15.1f}", flush=True)

    by = {(r["method"], r["n"]): r for r in rows}
    n_check = 4096 if 4096 in sizes else max(sizes)
    mem = (
        by["flash", n_check]["peak_extra_mib"] / by["naive", n_check]["peak_extra_mib"]
    )
    speed = by["flash", n_check]["time_s"] / by["sdpa", n_check]["time_s"]
    print(
        f"\nAt N = {n_check}: flash_attention's peak extra memory is "
        f"{100 * mem:.1f} % of naive attention's (target <= 5 %: "
        f"{'met' if mem <= 0.05 else 'NOT met'}), and its time {speed:.2f}x torch's "
        f"SDPA (target <= 1.5x: {'met' if speed <= 1.5 else 'NOT met'})."
    )

    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "attention.json").write_text(json.dumps(rows, indent=1))
    _plot(rows, sizes)
    print(f"Saved {RESULTS / 'attention.png'}")

    if torch.cuda.is_available() and __import__("softmaxbook").triton_available():
        gpu_report(sizes)
    else:
        print(
            "No CUDA GPU here: the Triton kernels were not timed "
            "(they run natively only on a GPU)."
        )


def _plot(rows, sizes) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    labels = {
        "naive": "naive (scores materialized)",
        "sdpa": "torch SDPA",
        "flash": "sb.flash_attention",
    }
    for method in METHODS:
        mine = [r for r in rows if r["method"] == method]
        axes[0].plot(
            [r["n"] for r in mine],
            [r["time_s"] for r in mine],
            "o-",
            label=labels[method],
        )
        axes[1].plot(
            [r["n"] for r in mine],
            [r["peak_extra_mib"] for r in mine],
            "o-",
            label=labels[method],
        )
    for ax, title, ylabel in (
        (axes[0], "Time", "median time (s)"),
        (axes[1], "Peak extra memory", "peak extra memory (MiB)"),
    ):
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="sequence length N",
            ylabel=ylabel,
            title=f"{title}, B·H = {BH}, D = {D}",
        )
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "attention.png", dpi=120)


if __name__ == "__main__":
    main()
