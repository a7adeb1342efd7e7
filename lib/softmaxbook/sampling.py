"""Decoding from logits: temperature, top-k and top-p (nucleus) filtering, sampling, and calibration (ECE, temperature scaling)."""
from __future__ import annotations

__all__: list[str] = []
