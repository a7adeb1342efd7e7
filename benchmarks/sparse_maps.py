"""Sparsemax and 1.5-entmax: softmaxbook against the entmax package (deep-spin/entmax).

Times ``sb.sparsemax`` / ``sb.entmax15`` and ``entmax.sparsemax`` / ``entmax.entmax15``
on one (1024, 4096) float32 CPU tensor, forward and forward+backward. Ours and theirs
alternate within every repetition, in one process, so that a busy machine slows both
alike; the script prints each median and the ratio of medians (ours / theirs, below 1
means ours is faster). Before timing it checks that both give the same weights.

Why ours is faster: entmax sorts every row in full (O(n log n) per row) to find the
threshold. We start from a point known to lie below the threshold (the row max minus 1,
or minus 2 for 1.5-entmax), take one or two Newton steps on the threshold equation,
count the keys that can still be in the support, partially sort only those
(``torch.topk``), and apply the same exact formula; a row whose support could extend
past the candidates is redone with a full sort.

Usage: ``python benchmarks/sparse_maps.py [--reps 21] [--rows 1024] [--cols 4096]
[--threads N] [--scale 1.0]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial

import torch

import softmaxbook as sb

try:
    import entmax
except ImportError:  # pragma: no cover - the peer is a test/bench dependency
    raise SystemExit("the entmax package is needed: pip install entmax") from None


def _forward(f):
    def run(x):
        return f(x)

    return run


def _forward_backward(f, grad):
    def run(x):
        x = x.detach().requires_grad_(True)
        f(x).backward(grad)
        return x.grad

    return run


def interleaved(ours, theirs, x, reps: int) -> tuple[float, float]:
    """Median seconds of ``ours(x)`` and ``theirs(x)``, alternating which goes first."""
    times = {"ours": [], "theirs": []}
    ours(x), theirs(x)  # warm-up (allocator, first-call overhead)
    for rep in range(reps):
        order = [("ours", ours), ("theirs", theirs)]
        if rep % 2:
            order.reverse()
        for name, fn in order:
            start = time.perf_counter()
            fn(x)
            times[name].append(time.perf_counter() - start)
    return statistics.median(times["ours"]), statistics.median(times["theirs"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument(
        "--scale", type=float, default=1.0, help="std of the random scores"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.rows, args.cols, generator=g) * args.scale  # float32, CPU
    grad = torch.randn(args.rows, args.cols, generator=g)
    print(
        f"x: ({args.rows}, {args.cols}) float32 CPU, N(0, {args.scale}^2) scores; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"entmax {getattr(entmax, '__version__', '?')}; "
        f"median of {args.reps} interleaved reps"
    )
    print(
        f"{'map':<10} {'pass':<17} {'ours ms':>9} {'entmax ms':>10} {'ours/entmax':>12}"
    )
    for name in ("sparsemax", "entmax15"):
        theirs = getattr(entmax, name)
        ours_f, theirs_f = getattr(sb, name), partial(theirs, dim=-1)
        torch.testing.assert_close(ours_f(x), theirs_f(x), atol=1e-6, rtol=0)
        for label, wrap in (
            ("forward", _forward),
            ("forward+backward", lambda f: _forward_backward(f, grad)),
        ):
            ours, theirs = interleaved(wrap(ours_f), wrap(theirs_f), x, args.reps)
            print(
                f"{name:<10} {label:<17} {ours * 1e3:9.1f} {theirs * 1e3:10.1f} "
                f"{ours / theirs:12.2f}"
            )


if __name__ == "__main__":
    main()
