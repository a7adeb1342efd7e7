"""Diagrams of the library's Triton kernels: where one program's tiles live on a GPU
(registers, shared memory, main memory) and how many bytes each takes, drawn from the
block sizes the library launches with; and the ahead-of-time compile report
(registers and shared memory per architecture, against the hardware's limits).

The tile sizes come from :func:`softmaxbook.kernels.flash_launch_config`, which reads
the rule the launcher itself calls, so the drawing cannot drift from the kernel.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..plotting import MIN_FONT_PT
from ._draw import INK, MUTED, PALETTE, arrow, box, canvas, text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["REPORT_FILE", "load_gpu_report", "flash_tiles", "draw_kernel_memory"]
__all__ += ["draw_gpu_report"]

#: The stored ahead-of-time compile report, written by ``make gpu-report``.
REPORT_FILE = Path(__file__).resolve().parents[1] / "data" / "gpu_report.json"

_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4}


def flash_tiles(head_dim: int = 128, dtype: str = "float16") -> dict[str, Any]:
    """The tiles one program of the FlashAttention forward kernel holds, as the
    library launches it for this head dimension and dtype.

    Returns ``block_m``, ``block_n``, ``block_d``, ``num_warps``, ``num_stages`` and
    ``tiles``: a dict ``name -> (rows, cols, bytes, where)`` with ``where`` one of
    ``"registers"`` or ``"shared"``. The score tile and the accumulator are float32;
    the query block and the key and value tiles are in the input's dtype, the key and
    value tiles once per pipeline stage.
    """
    import torch

    from softmaxbook import kernels

    if dtype not in _ITEMSIZE:
        raise ValueError(f"dtype must be one of {sorted(_ITEMSIZE)}, got {dtype!r}")
    c = kernels.flash_launch_config(head_dim, getattr(torch, dtype))
    bm, bn, bd, bdv = c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_D"], c["BLOCK_DV"]
    size, stages = _ITEMSIZE[dtype], c["num_stages"]
    tiles = {
        "Q": (bm, bd, bm * bd * size, "registers"),
        "Z, P": (bm, bn, bm * bn * 4, "registers"),
        "acc": (bm, bdv, bm * bdv * 4, "registers"),
        "m, l": (bm, 2, bm * 2 * 4, "registers"),
        "K": (bn, bd, stages * bn * bd * size, "shared"),
        "V": (bn, bdv, stages * bn * bdv * size, "shared"),
    }
    return {
        "block_m": bm,
        "block_n": bn,
        "block_d": bd,
        "num_warps": c.get("num_warps", 4),
        "num_stages": stages,
        "tiles": tiles,
    }


def load_gpu_report() -> dict[str, Any]:
    """The stored report of ``tools/gpu_report.py``: ``records`` (one per kernel,
    architecture, dtype and head dimension, with ``registers``, ``spills``,
    ``shared_bytes``, ``mma``, ``mufu_ex2``, ...), ``archs``, ``shared_limit_bytes``
    and the ``versions`` of Triton and ``ptxas`` that compiled them."""
    report: dict[str, Any] = json.loads(REPORT_FILE.read_text())
    return report


def _kib(n: int) -> str:
    return f"{n / 1024:g} KiB"


def draw_kernel_memory(head_dim: int = 128, dtype: str = "float16") -> Figure:
    """One program of the FlashAttention forward kernel: main memory (HBM) on top,
    the shared-memory buffers of the key and value tiles in the middle, the
    registers of the program's threads below, each tile with its shape and bytes."""
    t = flash_tiles(head_dim, dtype)
    bn, tiles = t["block_n"], t["tiles"]
    fs = MIN_FONT_PT
    fig, ax = canvas(
        16,
        15.2,
        figsize=(6.4, 6.1),
        title=f"One program's tiles ($d_k = {head_dim}$, {dtype})",
    )
    # main memory
    box(ax, 0.1, 11.2, 15.8, 3.0, "", color=MUTED, fill=0.35)
    text(ax, 0.4, 13.75, "main memory (HBM)", fontsize=fs, ha="left")
    hbm = [("Q", 0.4, PALETTE[0]), ("K", 4.2, PALETTE[1]), ("V", 8.2, PALETTE[1])]
    hbm += [(r"O, $\lambda$", 12.0, PALETTE[2])]
    for name, x, color in hbm:
        box(ax, x, 11.55, 3.2, 1.6, name, color=color, fontsize=fs + 1)
    # shared memory
    box(ax, 0.1, 6.3, 15.8, 4.0, "", color=PALETTE[1], fill=0.06)
    text(ax, 0.4, 9.85, "shared memory", fontsize=fs, ha="left")
    text(ax, 15.6, 9.85, f"a new {bn}-key tile each step", fontsize=fs, ha="right")
    stages = t["num_stages"]
    for name, x in (("K", 4.2), ("V", 8.2)):
        rows, cols, nbytes, _ = tiles[name]
        label = (
            f"{name}: ${rows}\\times{cols}$\n$\\times {stages}$ stages\n{_kib(nbytes)}"
        )
        box(ax, x - 0.2, 6.65, 3.6, 2.8, label, color=PALETTE[1], fontsize=fs)
        arrow(ax, (x + 1.6, 11.55), (x + 1.6, 9.45), color=PALETTE[1])
    # registers
    box(ax, 0.1, 0.1, 15.8, 5.3, "", color=PALETTE[0], fill=0.06)
    warps = t["num_warps"]
    text(
        ax,
        0.4,
        4.95,
        f"registers ({warps} warps, {32 * warps} threads)",
        fontsize=fs,
        ha="left",
    )
    reg = [("Q", 0.4, PALETTE[0]), ("Z, P", 4.4, PALETTE[3]), ("acc", 8.4, PALETTE[2])]
    for name, x, color in reg:
        rows, cols, nbytes, _ = tiles[name]
        shown = r"$Z$, $P$" if name == "Z, P" else name
        label = f"{shown}: ${rows}\\times{cols}$\n{_kib(nbytes)}"
        box(ax, x, 0.5, 3.6, 2.2, label, color=color, fontsize=fs)
    box(ax, 12.4, 0.5, 3.2, 2.2, r"$m$, $\ell$", color=PALETTE[4], fontsize=fs)
    # traffic: Q in once, K and V tiles through shared memory, O out once
    arrow(ax, (2.0, 11.55), (2.0, 2.7), color=PALETTE[0])
    text(ax, 2.25, 7.9, "once", fontsize=fs, ha="left", color=INK)
    arrow(ax, (5.8, 6.65), (6.2, 2.7), color=PALETTE[1])  # Z = Q K^T
    arrow(ax, (9.8, 6.65), (10.2, 2.7), color=PALETTE[1])  # acc += P V
    arrow(ax, (13.6, 2.7), (13.6, 11.55), color=PALETTE[2])
    text(ax, 13.85, 7.9, "once", fontsize=fs, ha="left", color=INK)
    return fig


def draw_gpu_report(report: dict[str, Any], *, dtype: str = "float16") -> Figure:
    """Shared memory per block and registers per thread of each attention kernel
    (head dimension 128, ``dtype``) on each architecture, against the limits."""
    import matplotlib.pyplot as plt
    import numpy as np

    from ..plotting import use_style

    use_style()
    kernels = ["flash_fwd", "flash_bwd_dkdv", "flash_bwd_dq"]
    names = ["forward", r"$dK, dV$", r"$dQ$"]
    archs = report["archs"]
    rows = {
        (r["kernel"], r["arch"]): r
        for r in report["records"]
        if r["dtype"] == dtype and r["head_dim"] == 128
    }
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6.4, 6.4), sharex=True)
    x = np.arange(len(kernels))
    width = 0.8 / len(archs)
    for i, arch in enumerate(archs):
        shared = [
            (rows[k, arch]["shared_bytes"] + rows[k, arch]["static_shared_bytes"])
            / 1024
            for k in kernels
        ]
        regs = [rows[k, arch]["registers"] for k in kernels]
        pos = x + (i - (len(archs) - 1) / 2) * width
        color = PALETTE[i % len(PALETTE)]
        top.bar(pos, shared, width, color=color, label=arch)
        bottom.bar(pos, regs, width, color=color)
    limits: dict[float, list[str]] = {}
    for arch in archs:
        limits.setdefault(report["shared_limit_bytes"][arch] / 1024, []).append(arch)
    for kib, which in limits.items():
        top.axhline(kib, color=INK, linestyle="--", linewidth=1.2)
        label = ", ".join(which)
        top.text(-0.45, kib + 6, f"limit {label}", fontsize=MIN_FONT_PT, ha="left")
    top.set_ylabel("shared memory (KiB)")
    top.set_title("Per GPU: shared memory and registers")
    top.legend(ncols=3, loc="upper center", frameon=False)
    top.set_ylim(0, 340)
    bottom.axhline(255, color=INK, linestyle="--", linewidth=1.2)
    bottom.text(-0.45, 262, "255: the most a thread may use", fontsize=MIN_FONT_PT)
    bottom.set_ylim(0, 310)
    bottom.set_ylabel("registers per thread")
    bottom.set_xticks(x, names)

    return fig
