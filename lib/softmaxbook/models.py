"""A tiny transformer built on the library's attention, with a pluggable normalizer (the case study)."""
from __future__ import annotations

__all__: list[str] = []
