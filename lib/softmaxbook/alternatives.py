"""Alternatives to softmax as attention normalizers: sparsemax, entmax, softmax-off-by-one, ReLU and sigmoid normalization."""
from __future__ import annotations

__all__: list[str] = []
