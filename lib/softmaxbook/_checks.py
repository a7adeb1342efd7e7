"""Argument checks shared by the library: one clear error per kind of bad input.

Every public function validates its arguments with these helpers, so that bad
input fails at the call with a message that names the argument, instead of
deep inside torch or, worse, as a silent ``nan``.
"""

from __future__ import annotations

import math
from numbers import Real

from torch import Tensor


def check_tensor(x, name: str = "x") -> Tensor:
    """Raise ``TypeError`` unless ``x`` is a ``torch.Tensor``."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def check_float(x, name: str = "x") -> Tensor:
    """Raise ``TypeError`` unless ``x`` is a floating-point tensor."""
    check_tensor(x, name)
    if not x.is_floating_point():
        raise TypeError(
            f"{name} must be a floating-point tensor, got dtype {x.dtype}; "
            f"convert it first, e.g. {name}.float()"
        )
    return x


def check_dim(x: Tensor, dim: int, name: str = "dim") -> int:
    """Return ``dim`` as a non-negative index; ``IndexError`` when out of range."""
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{name} must be an int, got {type(dim).__name__}")
    ndim = max(x.dim(), 1)
    if not -ndim <= dim < ndim:
        raise IndexError(
            f"{name}={dim} is out of range for a tensor with {x.dim()} dimension(s); "
            f"expected {-ndim} <= {name} < {ndim}"
        )
    return dim % ndim


def check_positive(value, name: str) -> float:
    """Raise unless ``value`` is a finite real number > 0 (a temperature, a scale)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return float(value)


def check_positive_int(value, name: str) -> int:
    """Raise unless ``value`` is an int >= 1 (a block size, a count)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value
