"""Time and peak memory of attention, forward and forward + backward, against sequence
length: naive attention, torch's SDPA and the library's flash_attention.

Each measurement runs in a fresh Python process, so that one run's memory cannot
hide another's, and the methods take turns (naive, SDPA, flash, naive, ...) over
several rounds, so that a change in the machine's load hits them alike; the
table shows the median over rounds. Peak memory is the process's resident-set
high-water mark (``VmHWM`` in ``/proc/self/status``, reset by writing ``5`` to
``/proc/self/clear_refs``) minus the resident set just before the call: the
extra memory the call needed, its outputs included (for forward + backward: the
output and the three gradients). A warm-up call on a tiny problem first pays
the one-time costs (imports, thread pools, BLAS buffers).

    python benchmarks/attention.py          # N = 512 ... 8192, B*H = 8, D = 64
    python benchmarks/attention.py --quick  # N = 512 ... 2048, one round

It also measures grouped-query attention with a mask (``enable_gqa=True``): the
peak extra memory with shared key and value heads against that with the heads
repeated first, next to the size of one repeated copy of K (``attention_gqa.json``).

Prints the machine and its load, a table, the targets at N = 4096 (issue 12) and
whether each is met, and saves ``benchmarks/results/attention.json`` and a plot,
``benchmarks/results/attention.png``. Naive attention is not run where its
score matrices alone would exceed ``--naive-limit-gib`` (default 3 GiB): at
N = 8192 its forward + backward needs several GiB. On a machine with CUDA and
Triton it also times the Triton kernels against torch on the GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

from _timing import cuda_seconds, machine, median_seconds

RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ("naive", "sdpa", "flash")
PASSES = ("forward", "forward+backward")
BH, D = 8, 64
# Grouped-query attention with a mask: query heads per key head, new queries.
GQA_METHODS, GQA_GROUPS, GQA_L = ("gqa", "repeated"), 4, 16
LABELS = {
    "naive": "naive (scores materialized)",
    "sdpa": "torch SDPA",
    "flash": "sb.flash_attention",
}


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not found in /proc/self/status")


def _attention_fn(method: str):
    import torch
    import torch.nn.functional as F

    import softmaxbook as sb

    if method == "naive":  # the textbook formula: (L, S) scores and weights stored

        def naive(q, k, v):
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            return torch.softmax(scores, dim=-1) @ v

        return naive
    if method == "sdpa":
        return F.scaled_dot_product_attention
    if method == "flash":
        return sb.flash_attention
    raise ValueError(method)


def _naive_score_gib(n: int, passes: str) -> float:
    """The score-sized matrices naive attention holds at once: 2 (scores and
    weights) forward, about 4 with the backward pass."""
    copies = 2 if passes == "forward" else 4
    return copies * BH * n * n * 4 / 2**30


def gqa_worker(method: str, n: int, repeats: int) -> dict:
    """Grouped-query attention with a mask in this (fresh) process: ``"gqa"`` shares
    each key and value head between GQA_GROUPS query heads (``enable_gqa=True``),
    ``"repeated"`` first repeats them (``repeat_kv_heads``), as GQA with a mask once
    did inside flash_attention. Median time and peak extra memory of the forward."""
    import torch

    import softmaxbook as sb

    def inputs(s):
        g = torch.Generator().manual_seed(0)
        q = torch.randn(1, BH, GQA_L, D, generator=g)
        k, v = (torch.randn(1, BH // GQA_GROUPS, s, D, generator=g) for _ in range(2))
        mask = torch.rand(1, BH, GQA_L, s, generator=g) > 0.1
        return q, k, v, mask

    def call(q, k, v, mask):
        with torch.inference_mode():
            if method == "repeated":
                k, v = (sb.repeat_kv_heads(t, GQA_GROUPS) for t in (k, v))
                return sb.flash_attention(q, k, v, mask=mask)
            return sb.flash_attention(q, k, v, mask=mask, enable_gqa=True)

    call(*inputs(128))  # one-time costs, on a tiny problem
    args = inputs(n)
    before = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    result = call(*args)
    peak = _status_kib("VmHWM")
    del result
    return {
        "method": method,
        "n": n,
        "time_s": median_seconds(lambda: call(*args), repeats),
        "peak_extra_mib": max(peak - before, 0) / 1024,
    }


def gqa_report(sizes, rounds: int, repeats: int) -> list[dict]:
    """Peak extra memory of GQA with a mask: shared heads against repeated ones."""
    copy_mib = {n: BH * n * D * 4 / 2**20 for n in sizes}  # one repeated K or V
    print(
        f"\nGrouped-query attention with a boolean mask, forward: {BH} query heads "
        f"sharing {BH // GQA_GROUPS} key and value heads, L = {GQA_L} new queries, "
        f"D = {D}, float32; medians over {rounds} round(s)"
    )
    print(f"{'S':>6} {'method':>9} {'median s':>9} {'peak extra MiB':>15} "
          f"{'one repeated K MiB':>19}")  # fmt: skip
    rows = []
    for n in sizes:
        runs = {m: [] for m in GQA_METHODS}
        for _ in range(rounds):
            for method in GQA_METHODS:
                runs[method].append(run_fresh(method, "forward", n, repeats))
        for method in GQA_METHODS:
            row = {
                "method": method,
                "n": n,
                "time_s": statistics.median(r["time_s"] for r in runs[method]),
                "peak_extra_mib": statistics.median(
                    r["peak_extra_mib"] for r in runs[method]
                ),
                "repeated_copy_mib": copy_mib[n],
            }
            rows.append(row)
            print(f"{n:>6} {method:>9} {row['time_s']:>9.4f} "
                  f"{row['peak_extra_mib']:>15.1f} {copy_mib[n]:>19.1f}",
                  flush=True)  # fmt: skip
    return rows


def worker(method: str, passes: str, n: int, repeats: int) -> dict:
    """One configuration in this (fresh) process: median time and peak extra memory."""
    import torch

    if method in GQA_METHODS:
        return gqa_worker(method, n, repeats)
    fn = _attention_fn(method)
    g = torch.Generator().manual_seed(0)
    q, k, v, grad_out = (torch.randn(1, BH, n, D, generator=g) for _ in range(4))
    small = [torch.randn(1, BH, 128, D, generator=g) for _ in range(4)]
    if passes == "forward":

        def call(q, k, v, grad_out):
            with torch.inference_mode():
                return fn(q, k, v)

    else:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        small[:3] = [t.requires_grad_() for t in small[:3]]

        def call(q, k, v, grad_out):
            for t in (q, k, v):
                t.grad = None
            out = fn(q, k, v)
            out.backward(grad_out)
            return out, q.grad, k.grad, v.grad

    # One-time costs are paid on a tiny problem, so that the memory measured next is
    # what this size needs; it is the first call of this size, so nothing freed by
    # an earlier call of it can be reused.
    call(*small)
    before = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    result = call(q, k, v, grad_out)
    peak = _status_kib("VmHWM")
    del result
    seconds = median_seconds(lambda: call(q, k, v, grad_out), repeats)
    return {
        "method": method,
        "passes": passes,
        "n": n,
        "time_s": seconds,
        "peak_extra_mib": max(peak - before, 0) / 1024,
    }


def run_fresh(method: str, passes: str, n: int, repeats: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", method, passes, str(n)]
    cmd += ["--repeats", str(repeats)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{method} {passes} at N={n} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def gpu_report(sizes) -> None:
    """Time naive, SDPA and the library (Triton kernels) on the GPU, CUDA events."""
    import torch

    import softmaxbook as sb

    print("\nGPU (CUDA events, torch.cuda.max_memory_allocated):")
    q = torch.randn(1, BH, 16, D, device="cuda")
    print("  dispatch:", sb.explain_dispatch("flash_attention", q, q, q))
    print(f"  {'N':>6} {'pass':>17} {'method':>6} {'time ms':>9} {'peak MiB':>9}")
    for n in sizes:
        q, k, v, do = (torch.randn(1, BH, n, D, device="cuda") for _ in range(4))
        for passes in PASSES:
            for method in METHODS:
                fn = _attention_fn(method)
                leaves = [
                    t.clone().requires_grad_(passes != "forward") for t in (q, k, v)
                ]

                def call(fn=fn, leaves=leaves, passes=passes, do=do):
                    if passes == "forward":
                        with torch.inference_mode():
                            return fn(*leaves)
                    out = fn(*leaves)
                    out.backward(do)
                    return out

                call()
                torch.cuda.synchronize()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                seconds = cuda_seconds(call, 10)
                peak = (torch.cuda.max_memory_allocated() - base) / 2**20
                print(
                    f"  {n:>6} {passes:>17} {method:>6} {seconds * 1e3:>9.3f} "
                    f"{peak:>9.1f}"
                )


def _load() -> str:
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "load average unknown"
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min), {fifteen:.2f} (15 min)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="N = 512 ... 2048, 1 round"
    )
    parser.add_argument("--sizes", type=int, nargs="+", help="sequence lengths N")
    parser.add_argument("--repeats", type=int, help="timed calls per process")
    parser.add_argument("--rounds", type=int, help="fresh processes per configuration")
    parser.add_argument("--passes", choices=PASSES, nargs="+", default=list(PASSES))
    parser.add_argument("--naive-limit-gib", type=float, default=3.0)
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        method, passes, n = args.worker
        print(json.dumps(worker(method, passes, int(n), args.repeats or 3)))
        return

    sizes = args.sizes or (
        [512, 1024, 2048] if args.quick else [512, 1024, 2048, 4096, 8192]
    )
    rounds = args.rounds or (1 if args.quick else 3)
    import torch

    print("Machine:", machine())
    print("Before:", _load())
    print(
        f"Attention, B*H = {BH}, D = {D}, float32, CPU, {torch.get_num_threads()} "
        f"threads; each measurement a fresh process, {rounds} round(s) taking turns "
        "across methods; medians over rounds"
    )
    print(f"{'N':>6} {'pass':>17} {'method':>6} {'median s':>9} {'peak extra MiB':>15}")
    rows = []
    for n in sizes:
        repeats = args.repeats or (1 if args.quick else (5 if n <= 2048 else 3))
        for passes in args.passes:
            runs = {m: [] for m in METHODS}
            skipped = {
                m
                for m in METHODS
                if m == "naive" and _naive_score_gib(n, passes) > args.naive_limit_gib
            }
            for _ in range(rounds):  # naive, sdpa, flash, naive, ...
                for method in METHODS:
                    if method not in skipped:
                        runs[method].append(run_fresh(method, passes, n, repeats))
            for method in METHODS:
                if method in skipped:
                    gib = _naive_score_gib(n, passes)
                    print(f"{n:>6} {passes:>17} {method:>6}   not run (its score "
                          f"matrices alone: {gib:.0f} GiB)")  # fmt: skip
                    continue
                row = {
                    "method": method,
                    "passes": passes,
                    "n": n,
                    "time_s": statistics.median(r["time_s"] for r in runs[method]),
                    "peak_extra_mib": statistics.median(
                        r["peak_extra_mib"] for r in runs[method]
                    ),
                    "rounds": [
                        (r["time_s"], r["peak_extra_mib"]) for r in runs[method]
                    ],
                }
                rows.append(row)
                print(
                    f"{n:>6} {passes:>17} {method:>6} {row['time_s']:>9.4f} "
                    f"{row['peak_extra_mib']:>15.1f}",
                    flush=True,
                )
    gqa_rows = gqa_report(sizes, rounds, args.repeats or (1 if args.quick else 3))
    print("After:", _load())
    _targets(rows, sizes)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "attention.json").write_text(json.dumps(rows, indent=1))
    (RESULTS / "attention_gqa.json").write_text(json.dumps(gqa_rows, indent=1))
    _plot(rows, sizes)
    print(f"Saved {RESULTS / 'attention.png'}")
    if torch.cuda.is_available() and __import__("softmaxbook").triton_available():
        gpu_report(sizes)
    else:
        print("No CUDA GPU here: the Triton kernels were not timed.")


def _targets(rows, sizes) -> None:
    """The targets of issue 12 at N = 4096, each with whether this run met it."""
    by = {(r["method"], r["passes"], r["n"]): r for r in rows}
    n = 4096 if 4096 in sizes else max(sizes)

    def ratio(method, passes, key, versus):
        a, b = by.get((method, passes, n)), by.get((versus, passes, n))
        return None if a is None or b is None else a[key] / b[key]

    checks = [
        ("forward+backward time / SDPA's", ratio("flash", PASSES[1], "time_s", "sdpa"),
         1.5, 1.0),
        ("forward+backward peak memory / naive's",
         ratio("flash", PASSES[1], "peak_extra_mib", "naive"), 0.10, None),
        ("forward+backward peak memory / SDPA's",
         ratio("flash", PASSES[1], "peak_extra_mib", "sdpa"), None, 1.0),
        ("forward time / SDPA's",
         ratio("flash", PASSES[0], "time_s", "sdpa"), 1.0, None),
        ("forward peak memory / SDPA's",
         ratio("flash", PASSES[0], "peak_extra_mib", "sdpa"), 1.0, None),
    ]  # fmt: skip
    print(f"\nTargets at N = {n} (flash_attention):")
    for name, value, target, stretch in checks:
        if value is None:
            print(f"  {name}: not measured")
            continue
        verdicts = []
        if target is not None:
            verdicts.append(
                f"target <= {target:g}: {'met' if value <= target else 'NOT met'}"
            )
        if stretch is not None:
            verdicts.append(
                f"stretch <= {stretch:g}: {'met' if value <= stretch else 'not met'}"
            )
        print(f"  {name} = {value:.3f} ({'; '.join(verdicts)})")


def _plot(rows, sizes) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(10, 7.5))
    for i, passes in enumerate(PASSES):
        for method in METHODS:
            mine = [r for r in rows if r["method"] == method and r["passes"] == passes]
            if not mine:
                continue
            ns = [r["n"] for r in mine]
            axes[i, 0].plot(ns, [r["time_s"] for r in mine], "o-", label=LABELS[method])
            axes[i, 1].plot(
                ns, [r["peak_extra_mib"] for r in mine], "o-", label=LABELS[method]
            )
        for ax, what, ylabel in (
            (axes[i, 0], "time", "median time (s)"),
            (axes[i, 1], "peak extra memory", "peak extra memory (MiB)"),
        ):
            ax.set(
                xscale="log",
                yscale="log",
                xlabel="sequence length N",
                ylabel=ylabel,
                title=f"{passes.capitalize()}: {what}, B·H = {BH}, D = {D}",
            )
            ax.set_xticks(sizes, [str(n) for n in sizes])
            ax.minorticks_off()
            ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "attention.png", dpi=120)


if __name__ == "__main__":
    main()
