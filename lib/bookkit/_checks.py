"""The argument checks of the book's harness: one clear ``TypeError`` or
``ValueError`` that names the argument.

The harness checks its own arguments: ``softmaxbook``'s checks are private to
the library (``tests/bookkit/test_public_names.py``: bookkit uses only
softmaxbook's public names). The messages read as the library's do.
"""

from __future__ import annotations

import math
from numbers import Real

from torch import Tensor

__all__ = [
    "check_tensor",
    "check_positive",
    "check_nonnegative",
    "check_positive_int",
    "check_nonnegative_int",
]


def check_tensor(x: object, name: str = "x") -> Tensor:
    """Raise ``TypeError`` unless ``x`` is a ``torch.Tensor``."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def _real(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    return float(value)


def check_positive(value: object, name: str) -> float:
    """Raise unless ``value`` is a finite real number > 0 (a learning rate)."""
    number = _real(value, name)
    if not (math.isfinite(number) and number > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return number


def check_nonnegative(value: object, name: str) -> float:
    """Raise unless ``value`` is a finite real number >= 0 (a weight decay)."""
    number = _real(value, name)
    if not (math.isfinite(number) and number >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    return number


def _int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return value


def check_positive_int(value: object, name: str) -> int:
    """Raise unless ``value`` is an int >= 1 (a number of steps, a batch size)."""
    number = _int(value, name)
    if number < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return number


def check_nonnegative_int(value: object, name: str) -> int:
    """Raise unless ``value`` is an int >= 0 (a number of warm-up steps)."""
    number = _int(value, name)
    if number < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return number
