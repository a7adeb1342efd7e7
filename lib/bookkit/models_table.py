"""The models of 2024-2026 and what their attention does, read from a data file.

``lib/bookkit/data/models_2025.json`` holds one row per open model: its attention
kind, heads, layer pattern, sinks, QK-norm, soft-capping, normalizer, router and
context length. Every cell is a ``{"value": ..., "source": {...}}`` pair whose
source names the repository, the file and the field it was read from (and the
commit, where one was read); a value that no released config or code file gave
is the string ``"not found"``. Chapter 11's core page loads the file with
:func:`load_models`, shows it with :func:`markdown_table` and computes from it
(:func:`kv_cache_bytes_per_token`, :func:`count`).

The loader validates every row and raises a :class:`ValueError` that names the
model and the column of the first bad cell.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DATA_FILE",
    "NOT_FOUND",
    "COLUMNS",
    "ATTENTION_KINDS",
    "NORMALIZERS",
    "ROUTERS",
    "ModelRow",
    "load_models",
    "validate",
    "markdown_table",
    "kv_cache_bytes_per_token",
    "count",
]

#: The data file the book's chapter 11 reads.
DATA_FILE = Path(__file__).resolve().parent / "data" / "models_2025.json"
#: The value of a cell that no released config or code file gave.
NOT_FOUND = "not found"
#: The columns every row has, in the order of the table.
COLUMNS = (
    "attention",
    "q_heads",
    "kv_heads",
    "cache_width",
    "layers",
    "full_layers",
    "window",
    "sinks",
    "qk_norm",
    "softcap",
    "normalizer",
    "router",
    "experts",
    "context",
)
#: Known attention kinds.
ATTENTION_KINDS = frozenset({"MHA", "GQA", "MQA", "MLA", "linear hybrid"})
#: Known attention normalizers.
NORMALIZERS = frozenset({"softmax", "softmax + sink", "softmax in full layers only"})
#: Known router normalizers (a dense model has none).
ROUTERS = frozenset(
    {"softmax", "softmax over top-k", "sigmoid", "sigmoid over top-k", "none (dense)"}
)
_VOCABULARY = {
    "attention": ATTENTION_KINDS,
    "normalizer": NORMALIZERS,
    "router": ROUTERS,
}
_INTEGER_COLUMNS = ("q_heads", "kv_heads", "cache_width", "layers", "full_layers")
_YEARS = range(2024, 2027)


@dataclass(frozen=True)
class ModelRow:
    """One model of the table: its name, the variant it describes, and its cells.

    ``values[column]`` is the cell's value (``NOT_FOUND`` where none was found);
    ``sources[column]`` the source it was read from.
    """

    model: str
    variant: str
    released: int
    values: Mapping[str, Any]
    sources: Mapping[str, Mapping[str, str]]

    def known(self, column: str) -> bool:
        """Whether the cell ``column`` has a value (not ``"not found"``)."""
        return self.values[column] != NOT_FOUND


def _check_source(source: Any, where: str, *, paper_ok: bool = False) -> None:
    if not isinstance(source, Mapping):
        raise ValueError(f"{where}: 'source' must be an object, got {source!r}")
    if paper_ok and source.get("arxiv"):
        return
    for key in ("repo", "path", "field"):
        if not isinstance(source.get(key), str) or not source[key]:
            raise ValueError(
                f"{where}: the source needs a non-empty {key!r}, got {dict(source)!r}"
            )
    if source["repo"].count("/") != 1:
        raise ValueError(
            f"{where}: the source's repo must read 'owner/name', got {source['repo']!r}"
        )


def validate(data: Mapping[str, Any]) -> list[ModelRow]:
    """Check the parsed data file and return its rows.

    Every row needs ``model``, ``variant``, ``released`` (a year 2024-2026 with its
    source) and one cell per column of :data:`COLUMNS`; every cell a ``value`` and a
    ``source`` with ``repo`` ("owner/name"), ``path`` and ``field``. Attention kind,
    normalizer and router are checked against their vocabularies, the head and
    layer counts must be positive integers.

    Raises
    ------
    ValueError
        Naming the model and the column of the first bad cell.
    """
    rows = data.get("models") if isinstance(data, Mapping) else None
    if not isinstance(rows, list) or not rows:
        raise ValueError("data: 'models' must be a non-empty list")
    out = []
    for i, row in enumerate(rows):
        name = row.get("model") if isinstance(row, Mapping) else None
        if not isinstance(name, str) or not name:
            raise ValueError(f"models[{i}]: 'model' must be a non-empty string")
        if not isinstance(row.get("variant"), str) or not row["variant"]:
            raise ValueError(
                f"{name}: 'variant' must say which model or defaults the row describes"
            )
        released = row.get("released")
        if not isinstance(released, Mapping) or released.get("value") not in _YEARS:
            raise ValueError(
                f"{name}: 'released' must be a year 2024-2026 with a source, "
                f"got {released!r}"
            )
        _check_source(released.get("source"), f"{name}.released", paper_ok=True)
        cells = row.get("cells")
        if not isinstance(cells, Mapping):
            raise ValueError(f"{name}: 'cells' must be an object")
        missing = [col for col in COLUMNS if col not in cells]
        if missing:
            raise ValueError(f"{name}: missing columns {missing}")
        values, sources = {}, {}
        for col in COLUMNS:
            cell = cells[col]
            where = f"{name}.{col}"
            if not isinstance(cell, Mapping) or "value" not in cell:
                raise ValueError(
                    f"{where}: a cell needs a 'value' (or 'not found') and a 'source'"
                )
            value = cell["value"]
            if value is None or value == "":
                raise ValueError(f"{where}: empty value; write 'not found' instead")
            _check_source(cell.get("source"), where)
            if value != NOT_FOUND:
                if col in _VOCABULARY and value not in _VOCABULARY[col]:
                    raise ValueError(
                        f"{where}: {value!r} is not one of {sorted(_VOCABULARY[col])}"
                    )
                if col in _INTEGER_COLUMNS and (
                    not isinstance(value, int) or isinstance(value, bool) or value <= 0
                ):
                    raise ValueError(
                        f"{where}: must be a positive integer, got {value!r}"
                    )
            values[col], sources[col] = value, dict(cell["source"])
        if values["full_layers"] != NOT_FOUND and values["layers"] != NOT_FOUND:
            if values["full_layers"] > values["layers"]:
                raise ValueError(f"{name}.full_layers: more full layers than layers")
        out.append(ModelRow(name, row["variant"], released["value"], values, sources))
    return out


def load_models(path: str | Path | None = None) -> list[ModelRow]:
    """Read and validate the data file (default :data:`DATA_FILE`)."""
    with open(DATA_FILE if path is None else path, encoding="utf-8") as f:
        return validate(json.load(f))


def markdown_table(
    rows: Sequence[ModelRow],
    columns: Sequence[str] = COLUMNS,
    headers: Mapping[str, str] | None = None,
) -> str:
    """The rows as a Markdown table, one line per model; ``|`` in a value is escaped."""
    unknown = [c for c in columns if c not in COLUMNS]
    if unknown:
        raise ValueError(f"columns: unknown {unknown}; known {list(COLUMNS)}")
    headers = dict(headers or {})

    def cell(v: Any) -> str:
        text = f"{v:,}" if isinstance(v, int) else str(v)
        return text.replace("|", "\\|")

    head = ["model", *(headers.get(c, c) for c in columns)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        lines.append(
            "| "
            + " | ".join([row.model, *(cell(row.values[c]) for c in columns)])
            + " |"
        )
    return "\n".join(lines)


def kv_cache_bytes_per_token(row: ModelRow, bytes_per_value: int = 2) -> int | None:
    """Bytes one token adds to the cache of the full-attention layers.

    ``full_layers * kv_heads * cache_width * bytes_per_value`` times 2 (a key and a
    value) for MHA/GQA/MQA and linear hybrids with GQA full layers, times 1 for
    MLA (one latent serves both, the key's RoPE part included in its width). A
    windowed or chunked layer caches at most its window and is left out; a linear
    layer caches a fixed state. ``None`` where a needed cell is "not found".
    """
    if bytes_per_value <= 0:
        raise ValueError(f"bytes_per_value must be positive, got {bytes_per_value}")
    needed = ("full_layers", "kv_heads", "cache_width")
    if not all(row.known(c) for c in needed):
        return None
    # An MLA cache (DeepSeek's, Kimi Linear's full layers) stores one latent of width
    # kv_lora_rank + qk_rope_head_dim: its width's source names kv_lora_rank.
    mla = "kv_lora_rank" in row.sources["cache_width"].get("field", "")
    tensors = 1 if mla else 2
    v = row.values
    return int(
        v["full_layers"] * v["kv_heads"] * v["cache_width"] * tensors * bytes_per_value
    )


def count(
    rows: Sequence[ModelRow], column: str, predicate: Callable[[Any], bool]
) -> int:
    """How many rows have a known value in ``column`` for which ``predicate`` holds."""
    if column not in COLUMNS:
        raise ValueError(f"column: unknown {column!r}; known {list(COLUMNS)}")
    return sum(1 for r in rows if r.known(column) and predicate(r.values[column]))
