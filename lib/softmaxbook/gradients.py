"""The softmax Jacobian and its vector-Jacobian product."""
from __future__ import annotations

__all__: list[str] = []
