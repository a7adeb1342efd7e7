"""Numerics that several modules share, each written once.

- :func:`acc_dtype`: the dtype the attention code accumulates in (float32, or
  float64 for float64 input: float16 and bfloat16 are computed in float32 and
  rounded once);
- :func:`causal_offset`: where a causal mask's diagonal sits, for each alignment;
- :func:`functorch_active`: whether a ``torch.func`` transform is running.

The argument checks live beside this module, in :mod:`softmaxbook._validate`.
"""

from __future__ import annotations

import torch

__all__ = ["acc_dtype", "causal_offset", "functorch_active"]


def acc_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """The accumulation dtype of ``dtypes``: their promotion, and float32 at least.

    >>> acc_dtype(torch.bfloat16), acc_dtype(torch.float64)
    (torch.float32, torch.float64)
    >>> acc_dtype(torch.float16, torch.float64)
    torch.float64
    """
    acc = torch.float32
    for dtype in dtypes:
        acc = torch.promote_types(acc, dtype)
    return acc


def causal_offset(align: str, L: int, S: int) -> int:
    """The diagonal of a causal mask: query ``i`` may attend to keys ``j <= i +
    offset``; 0 for ``"top_left"`` (torch's), ``S - L`` for ``"bottom_right"``
    (the last query sees the last key).

    >>> causal_offset("top_left", 2, 5), causal_offset("bottom_right", 2, 5)
    (0, 3)
    """
    return 0 if align == "top_left" else S - L


def functorch_active() -> bool:
    """True inside a ``torch.func`` transform (``vmap``, ``grad``, ``jacrev``)."""
    active = getattr(torch._C, "_are_functorch_transforms_active", None)
    return bool(active and active())
