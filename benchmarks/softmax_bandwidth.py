"""Effective memory bandwidth of softmax implementations, as a fraction of a plain copy.

A softmax must read its input once and write its output once, so its useful
traffic is ``2 * numel * itemsize`` bytes; dividing that by the time gives an
*effective* bandwidth. The ceiling is what the machine achieves for a plain
copy of the same array into a preallocated buffer (the same two passes, no
arithmetic), measured in the same run. Every implementation is reported as a
fraction of that copy; the ones that allocate their output, or make extra
passes over the data, land well below 1.

    python benchmarks/softmax_bandwidth.py            # 4096 x 4096 float32 (64 MiB)
    python benchmarks/softmax_bandwidth.py --quick

On a machine with CUDA and Triton it also measures the fused Triton kernel
against ``torch.softmax`` and a device copy on the GPU.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

import softmaxbook as sb
from _timing import cuda_seconds, machine, median_seconds


def numpy_naive(x):
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def numpy_stable(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def cpu_report(rows: int, cols: int, repeats: int) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, cols, generator=g)
    xn = x.numpy()
    y, yn = torch.empty_like(x), np.empty_like(xn)
    nbytes = 2 * x.numel() * x.element_size()  # one read + one write
    cases = {
        "copy into a preallocated buffer (torch)": lambda: y.copy_(x),
        "copy into a preallocated buffer (NumPy)": lambda: np.copyto(yn, xn),
        "NumPy naive exp(x) / sum": lambda: numpy_naive(xn),
        "NumPy stable (max subtracted)": lambda: numpy_stable(xn),
        "torch.softmax": lambda: torch.softmax(x, dim=-1),
        "sb.softmax": lambda: sb.softmax(x),
        "sb.online_softmax (block 128)": lambda: sb.online_softmax(x),
    }
    print(
        f"CPU, {torch.get_num_threads()} threads; x is {rows} x {cols} float32 "
        f"({x.numel() * 4 / 2**20:.0f} MiB); useful traffic 2 x that; "
        f"median of {repeats}"
    )
    with torch.inference_mode():
        results = {
            name: nbytes / median_seconds(fn, repeats) / 1e9
            for name, fn in cases.items()
        }
    ceiling = results["copy into a preallocated buffer (torch)"]
    print(f"{'implementation':<42} {'GB/s':>7} {'of copy':>8}")
    for name, gbs in results.items():
        print(f"{name:<42} {gbs:>7.2f} {gbs / ceiling:>8.2f}")


def gpu_report(rows: int, cols: int, repeats: int) -> None:
    from softmaxbook import kernels

    x = torch.randn(rows, cols, device="cuda")
    y = torch.empty_like(x)
    nbytes = 2 * x.numel() * x.element_size()

    cases = {
        "copy into a preallocated buffer": lambda: y.copy_(x),
        "torch.softmax": lambda: torch.softmax(x, dim=-1),
        "kernels.triton_softmax (fused, Triton)": lambda: kernels.triton_softmax(x),
        "sb.online_softmax (torch ops)": lambda: sb.online_softmax(x),
    }
    print(f"\nGPU; x is {rows} x {cols} float32; CUDA events, {repeats} calls")
    print("dispatch:", sb.explain_dispatch("softmax", x))
    with torch.inference_mode():
        results = {
            name: nbytes / cuda_seconds(fn, repeats) / 1e9 for name, fn in cases.items()
        }
    ceiling = results["copy into a preallocated buffer"]
    print(f"{'implementation':<42} {'GB/s':>8} {'of copy':>8}")
    for name, gbs in results.items():
        print(f"{name:<42} {gbs:>8.1f} {gbs / ceiling:>8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="a 1024 x 4096 array, 3 repeats"
    )
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    rows = args.rows or (1024 if args.quick else 4096)
    repeats = args.repeats or (3 if args.quick else 9)
    print("Machine:", machine())
    cpu_report(rows, args.cols, repeats)
    if torch.cuda.is_available() and sb.triton_available():
        gpu_report(rows, args.cols, max(repeats, 20))
    else:
        print(
            "No CUDA GPU here: the fused Triton softmax was not timed "
            "(it runs natively only on a GPU)."
        )


if __name__ == "__main__":
    main()
