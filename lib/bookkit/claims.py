"""The claims ledger: every claim the chapters check, read from their cells.

A *verification cell* checks what the prose beside it says. It is tagged
``remove-cell`` (the website leaves it out), carries
``"jupyter": {"source_hidden": true}`` (Jupyter shows it collapsed) and opens
with its claim, one sentence in a comment::

    # Claim: Adding c = 100 to every score moves no weight by more than 1e-12.
    assert np.abs(shifted - s).max() < 1e-12

A cell may state several claims, each followed by the code that checks it. A
claim runs on over further ``#`` lines until the first line that is not a
comment. The appendix "How this book is verified" lists them all, page by
page (``_ext/softmaxbook_sphinx.py`` calls :func:`page_claims` at build time),
so a claim is written once, where it is checked.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CLAIM_PREFIX",
    "VERIFY_TAG",
    "Claim",
    "cell_claims",
    "claim_anchor",
    "is_verification_cell",
    "page_claims",
    "has_assert",
]

CLAIM_PREFIX = "# Claim:"
VERIFY_TAG = "remove-cell"
_ASSERT = re.compile(r"^\s*assert\b", re.M)


@dataclass(frozen=True)
class Claim:
    """One checked claim: the page it is on, the cell that checks it, its text."""

    page: str  # the notebook's path without suffix, e.g. "chapters/01_definition"
    cell: int  # index of the cell in the notebook
    text: str
    cell_id: str = ""  # the cell's nbformat id, when the notebook has them

    @property
    def anchor(self) -> str:
        """The id of the place on the page that makes this claim."""
        return claim_anchor(self.cell_id or self.cell)


def claim_anchor(cell: str | int) -> str:
    """The HTML id given to the text a verification cell checks, from the cell's
    nbformat id (unique across the book, also in the single-page PDF) or its index."""
    return f"claim-{cell}"


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def has_assert(cell: dict) -> bool:
    """Whether a code cell has an ``assert`` statement at the start of a line."""
    return cell.get("cell_type") == "code" and bool(_ASSERT.search(_source(cell)))


def is_verification_cell(cell: dict) -> bool:
    """Tagged ``remove-cell``, collapsed in Jupyter, and opening with a claim."""
    tags = cell.get("metadata", {}).get("tags", [])
    hidden = cell.get("metadata", {}).get("jupyter", {}).get("source_hidden", False)
    first = _source(cell).lstrip("\n").split("\n", 1)[0]
    return (
        cell.get("cell_type") == "code"
        and VERIFY_TAG in tags
        and hidden is True
        and first.startswith(CLAIM_PREFIX)
    )


def cell_claims(cell: dict) -> list[str]:
    """The claims stated in one cell's comments, each as one line of text."""
    claims: list[str] = []
    current: list[str] | None = None
    for line in _source(cell).split("\n"):
        stripped = line.strip()
        if stripped.startswith(CLAIM_PREFIX):
            if current:
                claims.append(" ".join(current))
            current = [stripped[len(CLAIM_PREFIX) :].strip()]
        elif current is not None and stripped.startswith("#"):
            current.append(stripped.lstrip("#").strip())
        elif current is not None:
            claims.append(" ".join(current))
            current = None
    if current:
        claims.append(" ".join(current))
    return [c for c in claims if c]


def page_claims(notebook: str | Path, root: str | Path = ".") -> list[Claim]:
    """Every claim in the verification cells of one notebook, in page order."""
    path = Path(notebook)
    nb = json.loads(path.read_text(encoding="utf-8"))
    page = str(path.resolve().relative_to(Path(root).resolve()).with_suffix(""))
    return [
        Claim(page, index, text, str(cell.get("id", "")))
        for index, cell in enumerate(nb["cells"])
        if is_verification_cell(cell)
        for text in cell_claims(cell)
    ]
