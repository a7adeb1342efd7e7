"""Claims of the book's front page and glossary that a fact elsewhere decides.

Each test reads the sentence from the page and checks it against the fact (the
package metadata, or a computation), so that it fails when either changes.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
INDEX = (ROOT / "chapters" / "index.md").read_text(encoding="utf-8")
GLOSSARY = (ROOT / "chapters" / "glossary.md").read_text(encoding="utf-8")
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~;\s\[]", r, maxsplit=1)[0].lower() for r in requirements}


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_index_names_the_library_requirements():
    # "It needs only `torch` and `numpy`": the install requirements, nothing more
    # (matplotlib moved to the book extra in 0.2.1).
    sentence = re.search(r"It needs only (.*?);", _flat(INDEX))
    assert sentence is not None
    named = set(re.findall(r"`([^`]+)`", sentence.group(1)))
    assert named == _names(PROJECT["project"]["dependencies"]) == {"torch", "numpy"}


def test_index_names_the_book_extra():
    sentence = re.search(r"optional packages the chapters use \((.*?)\)", _flat(INDEX))
    assert sentence is not None
    book_part = sentence.group(1).split("for the `book`")[0]
    named = {n.lower() for n in re.findall(r"`([^`]+)`", book_part)}
    named |= {"triton"} if "Triton" in book_part else set()
    assert named == _names(PROJECT["project"]["optional-dependencies"]["book"])


def test_qk_layernorm_bound_needs_the_gain_left_out():
    # The glossary bounds QK-LayerNorm's scores by sqrt(d_k) only without its learned
    # gain: with a gain of 2 on queries and keys, a score reaches 4 sqrt(d_k).
    entry = _flat(GLOSSARY.split("QK-normalization", 1)[1].split("\n\n", 1)[0])
    assert "without its learned gain" in entry
    d = 64
    x = torch.randn(d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    plain = torch.nn.functional.layer_norm(x, (d,), eps=0.0)
    score = float(plain @ plain) / d**0.5
    assert abs(score - d**0.5) < 1e-9  # the bound, reached by q = k
    gain = torch.full((d,), 2.0, dtype=torch.float64)
    gained = torch.nn.functional.layer_norm(x, (d,), weight=gain, eps=0.0)
    assert float(gained @ gained) / d**0.5 > 3.9 * d**0.5
