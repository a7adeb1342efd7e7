"""What the checkers feed a student's function and what they compare it with.

Inputs come from a private ``torch.Generator`` with a fixed seed (the global
random state is never touched), in float64; the references are float64 too,
computed from the same (rounded) input, and a result may differ from them by
the tolerance of its dtype.
"""

from __future__ import annotations

import math
from typing import Any, overload

import numpy as np
import torch
from torch import Tensor

from ._report import dtype_name, fmt, shape_of

F64, F32, F16, BF16 = torch.float64, torch.float32, torch.float16, torch.bfloat16
INF = math.inf

# (atol, rtol) between a student's result and the float64 reference computed
# from the same (rounded) input: a few units of the dtype's rounding, far below
# what any of the mistakes the checkers look for changes.
TOL = {F64: (1e-10, 1e-10), F32: (2e-5, 2e-5), F16: (6e-3, 6e-3), BF16: (4e-2, 4e-2)}
NUMPY_DTYPE = {F64: np.float64, F32: np.float32, F16: np.float16}


def close(
    got: Tensor, want: Tensor, atol: float, rtol: float, nan: bool = False
) -> Tensor:
    return torch.isclose(got, want, atol=atol, rtol=rtol, equal_nan=nan)


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(g: torch.Generator, *shape: int, scale: float = 1.0) -> Tensor:
    return torch.randn(*shape, generator=g, dtype=F64) * scale


@overload
def numpy64(t: Tensor) -> np.ndarray: ...
@overload
def numpy64(t: None) -> None: ...
def numpy64(t: Tensor | None) -> np.ndarray | None:
    return None if t is None else t.detach().to("cpu", F64).numpy()


def tensor64(a: Any) -> Tensor:
    return torch.from_numpy(np.asarray(a, dtype=np.float64))


def random_mask(g: torch.Generator, *shape: int, keep: float = 0.6) -> Tensor:
    """A random boolean mask (True = may attend) with at least one True per row."""
    mask = torch.rand(*shape, generator=g) < keep
    mask[..., 0] |= ~mask.any(dim=-1)
    return mask


def input_label(name: str, x: Tensor, note: str = "") -> str:
    """``scores [1000, 0] (float64)`` or ``random scores of shape (3, 7) (float64)``."""
    words = dtype_name(x.dtype) + (f", {note}" if note else "")
    if x.numel() <= 4:
        return f"{name} {fmt(x)} ({words})"
    return f"random {name} of shape {shape_of(x)} ({words})"


def softmax64(x: Tensor, keep: Tensor | None = None, dim: int = -1) -> Tensor:
    """Differentiable float64 masked softmax; a row with nothing to attend gives 0."""
    if keep is not None:
        x = x.masked_fill(~keep, -INF)
    empty = torch.isneginf(x).all(dim=dim, keepdim=True)
    return torch.softmax(x.masked_fill(empty, 0.0), dim=dim).masked_fill(empty, 0.0)


def softmax_vjp(s: Tensor, g: Tensor, dim: int = -1) -> Tensor:
    return s * (g - (s * g).sum(dim=dim, keepdim=True))
