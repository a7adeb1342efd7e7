"""The ranges of the floating-point formats, and where ``exp`` leaves them.

Two stacked panels. The top one puts float32, float16 and bfloat16 on one
logarithmic axis of magnitudes: each bar runs from the smallest subnormal
number through the smallest normal number to the largest finite one. The
bottom one shows, on a linear axis of the argument ``x``, the window where
``exp(x)`` is finite and non-zero in each format: it overflows above
``ln(max)`` and rounds to zero below ``ln(smallest subnormal / 2)``. Every
number is computed from ``torch.finfo``, none is typed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from bookkit.diagrams._draw import INK, MUTED, PALETTE, _tint, text

if TYPE_CHECKING:
    import torch
    from matplotlib.figure import Figure

__all__ = ["float_limits", "draw_float_ranges"]


def float_limits(dtype: torch.dtype) -> dict[str, float]:
    """The limits of a torch floating-point ``dtype`` and of ``exp`` in it.

    Returns a dict with the smallest subnormal (``"subnormal"``), the smallest
    normal (``"normal"``) and the largest finite (``"max"``) numbers, and the
    arguments where ``exp`` overflows (``"exp_inf_above"``, ``ln(max)``),
    turns subnormal (``"exp_subnormal_below"``, ``ln(smallest normal)``) and
    rounds to zero (``"exp_zero_below"``, ``ln(smallest subnormal / 2)``).
    The logarithms are taken in float64, the factor 2 separately (half of
    float64's smallest subnormal is itself zero).
    """
    import torch

    fi = torch.finfo(dtype)
    sub = fi.tiny * fi.eps
    return {
        "subnormal": sub,
        "normal": fi.tiny,
        "max": fi.max,
        "exp_inf_above": math.log(fi.max),
        "exp_subnormal_below": math.log(fi.tiny),
        "exp_zero_below": math.log(fi.tiny) + math.log(fi.eps) - math.log(2),
    }


def _short(v: float) -> str:
    r"""A number in 3 significant digits, in mathtext: ``$3.40\times10^{38}$`` (not
    3.4e38, whose minus sign and "e" are easily misread at phone size); 65504
    stays whole."""
    if 1 <= v < 1e5:
        return f"{v:.0f}"
    mantissa, exponent = f"{v:.2e}".split("e")
    return rf"${mantissa}\times10^{{{int(exponent)}}}$"


def _signed(v: float) -> str:
    """``v`` to one decimal, with a true minus sign."""
    return f"{v:.1f}".replace("-", "\u2212")


def draw_float_ranges(
    dtypes: Sequence[torch.dtype] | None = None, *, title: str = ""
) -> Figure:
    """Draw the ranges of float formats and the window where ``exp`` is safe.

    Parameters
    ----------
    dtypes : sequence of torch dtypes, optional
        The formats, top to bottom; float32, float16 and bfloat16 by default.
    title : str
        A title over both panels (each panel has its own title too).

    Returns
    -------
    matplotlib.figure.Figure
        A 6.4 x 6.6 inch figure with two stacked panels, text at 12.5 points
        or more.
    """
    import matplotlib.pyplot as plt
    import torch

    from bookkit.plotting import use_style

    if dtypes is None:
        dtypes = (torch.float32, torch.float16, torch.bfloat16)
    use_style()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6.4, 6.6))
    if title:
        fig.suptitle(title, fontweight="bold")
    names = [str(dt).removeprefix("torch.") for dt in dtypes]
    limits = [float_limits(dt) for dt in dtypes]
    colors = [PALETTE[i % len(PALETTE)] for i in range(len(dtypes))]
    n = len(dtypes)

    # Top: the representable magnitudes, log10 axis.
    for r, (lim, color) in enumerate(zip(limits, colors)):
        y = n - 1 - r
        lo, mid, hi = (math.log10(lim[k]) for k in ("subnormal", "normal", "max"))
        top.barh(
            y,
            mid - lo,
            left=lo,
            height=0.38,
            color=_tint(color, 0.3),
            edgecolor=color,
            hatch="//",
            linewidth=1.0,
        )
        top.barh(y, hi - mid, left=mid, height=0.38, color=color, edgecolor=color)
        text(top, lo, y - 0.3, _short(lim["subnormal"]), va="top")
        # the smallest normal number ends at its mark, so that it never runs
        # into the largest one (float16's range is short on this axis)
        text(top, mid, y + 0.3, _short(lim["normal"]), va="bottom", ha="right")
        text(top, hi, y + 0.3, _short(lim["max"]), va="bottom")
    top.set_yticks(range(n), names[::-1])
    top.set_ylim(-0.8, n - 0.3)
    lows = [math.log10(lim["subnormal"]) for lim in limits]
    highs = [math.log10(lim["max"]) for lim in limits]
    top.set_xlim(min(lows) - 6, max(highs) + 4)  # room for the labels
    top.set_xlabel("magnitude, $\\log_{10}|v|$ (hatched: subnormal; solid: normal)")
    top.set_title("Range of each format: subnormal, normal, max")
    top.grid(axis="y", visible=False)

    # Bottom: the arguments x where exp(x) is finite and non-zero.
    for r, (lim, color) in enumerate(zip(limits, colors)):
        y = n - 1 - r
        zero, subn, inf = (
            lim["exp_zero_below"],
            lim["exp_subnormal_below"],
            lim["exp_inf_above"],
        )
        bottom.barh(
            y,
            subn - zero,
            left=zero,
            height=0.38,
            color=_tint(color, 0.3),
            edgecolor=color,
            hatch="//",
            linewidth=1.0,
        )
        bottom.barh(y, inf - subn, left=subn, height=0.38, color=color, edgecolor=color)
        text(bottom, zero, y + 0.3, _signed(zero), va="bottom", ha="right")
        text(bottom, inf, y + 0.3, _signed(inf), va="bottom", ha="left")
    zmin = min(lim["exp_zero_below"] for lim in limits)
    imax = max(lim["exp_inf_above"] for lim in limits)
    left, right = zmin - 30, imax + 30
    bottom.axvspan(left, zmin, color=MUTED, alpha=0.5, lw=0)
    bottom.axvspan(imax, right, color=MUTED, alpha=0.5, lw=0)
    text(bottom, (left + zmin) / 2, -0.55, "$e^x = 0$", color=INK)
    text(bottom, (imax + right) / 2, -0.55, r"$e^x = \infty$", color=INK)
    bottom.axvline(0, color=INK, lw=0.8)
    bottom.set_yticks(range(n), names[::-1])
    bottom.set_ylim(-0.8, n - 0.3)
    bottom.set_xlim(left, right)
    bottom.set_xlabel("argument $x$ of $e^x$ (hatched: $e^x$ subnormal)")
    bottom.set_title("Where $e^x$ is finite and non-zero")
    bottom.grid(axis="y", visible=False)
    return fig
