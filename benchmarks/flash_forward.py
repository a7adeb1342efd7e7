"""FlashAttention's forward pass at one long sequence: torch SDPA against the library.

Issue 22's target: at N = 4096 (8 heads, D = 64, float32, one torch thread)
``sb.flash_attention``'s forward takes at most 1.1x SDPA's time. The methods take
turns in one process (SDPA, ``sb.flash_attention``, its tile loops with
``explicit=True``, SDPA, ...), so that a change in the machine's load hits them
alike; the table shows each one's median and its ratio to SDPA's. Peak memory is
measured in fresh processes by ``attention.py`` (``--sizes 4096 --passes forward``).

    python benchmarks/flash_forward.py                 # N = 4096, 7 repeats
    python benchmarks/flash_forward.py --n 1024 --repeats 15
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import softmaxbook as sb
from _timing import load_average, machine

BH, D = 8, 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--causal", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, BH, args.n, D, generator=g) for _ in range(3))
    methods = {
        "torch SDPA": lambda: F.scaled_dot_product_attention(
            q, k, v, is_causal=args.causal
        ),
        "sb.flash_attention": lambda: sb.flash_attention(
            q, k, v, is_causal=args.causal
        ),
        "sb.flash_attention(explicit=True)": lambda: sb.flash_attention(
            q, k, v, is_causal=args.causal, explicit=True
        ),
    }
    print(machine())
    print(
        f"forward, N = {args.n}, {BH} heads, D = {D}, float32, causal={args.causal}; "
        f"{torch.get_num_threads()} torch thread(s); {load_average()}"
    )
    print(
        "path of sb.flash_attention:", sb.explain_dispatch("flash_attention", q, k, v)
    )
    times: dict[str, list[float]] = {name: [] for name in methods}
    with torch.inference_mode():
        for fn in methods.values():  # warm-up: one-time costs
            fn()
        for rep in range(args.repeats):
            names = list(methods)
            shift = rep % len(names)
            for name in names[shift:] + names[:shift]:
                start = time.perf_counter()
                methods[name]()
                times[name].append(time.perf_counter() - start)
    base = statistics.median(times["torch SDPA"])
    print(f"{'method':<36} {'median s':>9} {'x SDPA':>7}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<36} {med:>9.4f} {med / base:>7.3f}")
    print("After:", load_average())


if __name__ == "__main__":
    main()
