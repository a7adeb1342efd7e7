"""The worklist of an expert review: every sentence a reviewer must check at its source.

Usage::

    python tools/review_worklist.py [--out DIR] [PAGE_OR_MODULE ...]

For each chapter page (``.ipynb`` or ``.md``) and each library module (``.py``: the
docstrings a reader meets on the API page) it writes ``DIR/<name>.md`` (by default
``_build/review/``), a checklist with one row per sentence that makes a checkable
statement, and the reason it is on the list:

- ``number``: it quotes a number (digits or words such as "two", "a third"; not a
  section number or a year alone);
- ``source``: it names a paper (``{cite}``, "et al."), a year, a version, or another
  project (PyTorch, FlashAttention, Triton, ...): read the source, not memory;
- ``absolute``: it says only, always, never, every, all, none, cannot, impossible,
  guaranteed: look for a counterexample, in code;
- ``comparison``: it says the library agrees with, matches or equals another
  computation: check that two *different* computations are compared (the library
  hands matching CPU calls to torch's kernel; its own code runs with ``explicit=True``).

Why a worklist and not a read-through: the review rounds of this book that read pages
as prose found one error in eight of those an outside reviewer had held back; the ones
they missed were each a single sentence with a number, a paper or an "only" in it,
read past because it sounded right. A reviewer works through the list row by row and
writes a verdict in the last column: the source read (paper section, file and line),
the counterexample tried, the number recomputed. CONTRIBUTING.md, "Reviewing a page",
describes the method.

Only the standard library is used.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ABSOLUTE = re.compile(
    r"\b(only|always|never|every|everywhere|all|none|cannot|can't|impossible|"
    r"guarantee[sd]?|exactly|any)\b",
    re.IGNORECASE,
)
PROJECTS = re.compile(
    r"\b(PyTorch|torch|FlashAttention(?:-\d)?|flash-attn|xformers|Triton|CUDA|cuDNN|"
    r"JAX|NumPy|entmax|Liger|vLLM|FlexAttention|Megatron|DeepSpeed|Hugging ?Face|"
    r"transformers|GPT-\w+|Llama[\w.-]*|Gemma[\w.-]*|Mistral|Qwen[\w.-]*|DeepSeek[\w.-]*"
    r"|OLMo[\w.-]*|nanoGPT|H100|A100|H200|B200)\b"
)
CITATION = re.compile(r"\{cite[:a-z]*\}`[^`]+`|\bet al\.")
VERSION = re.compile(r"\b\d+\.\d+(?:\.\d+)?\b|\b(?:19|20)\d\d\b")
NUMBER = re.compile(r"(?<![\w.])[-−]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?\s*%?(?![\w])")
COMPARISON = re.compile(
    r"\b(agree[sd]?|match(?:es|ed)?|equals?|identical|same as|bit[- ]for[- ]bit|"
    r"to within|differ[s]? by)\b",
    re.IGNORECASE,
)
# Counts in words ("two blocks", "a third more"); not "one", mostly "the one".
NUMBER_WORDS = re.compile(
    r"\b(two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|twice|thrice|"
    r"half|third|quarter|double|triple|dozens?|hundreds?|thousands?|millions?)\b",
    re.IGNORECASE,
)
# What is not a sentence a reviewer checks: headings' numbers, figure references.
_SECTION_NUMBER = re.compile(r"^(?:\d+\.)+\d*$")


@dataclass(frozen=True)
class Row:
    """One sentence to check, where it stands and why it is on the list."""

    where: str
    sentence: str
    reasons: tuple[str, ...]


def sentences(text: str) -> list[str]:
    """Split Markdown prose into sentences, dropping code blocks and math blocks."""
    text = re.sub(r"```.*?```", " ", text, flags=re.DOTALL)
    text = re.sub(r"\$\$.*?\$\$", " [math] ", text, flags=re.DOTALL)
    text = re.sub(r"^:::.*$|^\s*:\w+:.*$", " ", text, flags=re.MULTILINE)
    flat = re.sub(r"\s+", " ", text).strip()
    # A full stop ends a sentence unless it follows "e.g", "i.e", "et al" or "Fig".
    parts = re.split(
        r"(?<!\be\.g)(?<!\bi\.e)(?<!\bal)(?<!\bFig)(?<=[.!?])\s+(?=[A-Z(*`$])", flat
    )
    return [p.strip() for p in parts if len(p.strip()) > 3]


def reasons_for(sentence: str) -> tuple[str, ...]:
    """Why a sentence is on the worklist (empty: it states nothing checkable)."""
    found = []
    numbers = [
        n
        for n in NUMBER.findall(sentence)
        if not _SECTION_NUMBER.match(n.strip()) and not VERSION.fullmatch(n.strip())
    ]
    if numbers or NUMBER_WORDS.search(sentence):
        found.append("number")
    if (
        CITATION.search(sentence)
        or PROJECTS.search(sentence)
        or VERSION.search(sentence)
    ):
        found.append("source")
    if ABSOLUTE.search(sentence):
        found.append("absolute")
    if COMPARISON.search(sentence):
        found.append("comparison")
    return tuple(found)


def notebook_rows(path: Path) -> list[Row]:
    """The worklist of a chapter page: its Markdown cells' sentences."""
    nb = json.loads(path.read_text())
    rows = []
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        for sentence in sentences("".join(cell["source"])):
            why = reasons_for(sentence)
            if why:
                rows.append(Row(f"cell {index}", sentence, why))
    return rows


def module_rows(path: Path) -> list[Row]:
    """The worklist of a library module: the docstrings of its public functions."""
    tree = ast.parse(path.read_text())
    rows = []
    for node in ast.walk(tree):  # the module itself first
        if not isinstance(
            node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
        ):
            continue
        name = getattr(node, "name", "module")
        if name.startswith("_") and name != "__init__":
            continue
        doc = ast.get_docstring(node)
        if not doc:
            continue
        for sentence in sentences(_docstring_prose(doc)):
            why = reasons_for(sentence)
            if why:
                rows.append(Row(name, sentence, why))
    return rows


def _docstring_prose(doc: str) -> str:
    """A docstring without its doctests (they run), its sections as paragraphs."""
    kept, in_example = [], False
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped.startswith((">>>", "...")):
            in_example = True
            continue
        if in_example and stripped:
            continue  # an example's expected output
        in_example = False
        if re.fullmatch(r"-{3,}", stripped):
            kept[-1:] = [""]  # "Parameters" over a rule: a section break, not prose
            continue
        kept.append(line)
    return "\n\n".join(
        p + ("." if p and not p.rstrip().endswith((".", ":", "?", "!")) else "")
        for p in re.split(r"\n\s*\n", "\n".join(kept))
    )


def markdown_rows(path: Path) -> list[Row]:
    """The worklist of a Markdown page (the preface, the glossary, ...)."""
    rows = []
    for number, paragraph in enumerate(re.split(r"\n\s*\n", path.read_text()), 1):
        for sentence in sentences(paragraph):
            why = reasons_for(sentence)
            if why:
                rows.append(Row(f"paragraph {number}", sentence, why))
    return rows


def worklist(path: Path) -> list[Row]:
    """The rows for a page (``.ipynb``, ``.md``) or a library module (``.py``)."""
    readers = {".ipynb": notebook_rows, ".md": markdown_rows, ".py": module_rows}
    if path.suffix not in readers:
        raise ValueError(f"{path}: expected a .ipynb, .md or .py file")
    return readers[path.suffix](path)


def render(path: Path, rows: list[Row]) -> str:
    """The checklist as Markdown: one row per sentence, an empty verdict column."""
    name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    lines = [
        f"# Review worklist: {name}",
        "",
        f"{len(rows)} sentences to check. Verdict: the source read (section, "
        "file:line), the counterexample tried, the number recomputed; or the fix "
        "and its check.",
        "",
        "| # | where | why | sentence | verdict |",
        "|---|---|---|---|---|",
    ]
    for number, row in enumerate(rows, 1):
        text = row.sentence.replace("|", "\\|")
        lines.append(
            f"| {number} | {row.where} | {', '.join(row.reasons)} | {text} | |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", type=Path)
    parser.add_argument("--out", type=Path, default=ROOT / "_build" / "review")
    args = parser.parse_args(argv)
    paths = args.paths or sorted((ROOT / "chapters").rglob("*.ipynb"))
    args.out.mkdir(parents=True, exist_ok=True)
    total = 0
    for path in paths:
        rows = worklist(path.resolve())
        total += len(rows)
        name = path.with_suffix("").name + ".md"
        (args.out / name).write_text(render(path.resolve(), rows))
    print(f"{total} sentences to check in {len(paths)} files, written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
