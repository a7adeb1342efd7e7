"""The book's one notation (the table on the landing page, chapters/index.md):
no page writes a retired form in its math.

Read from the pages' sources (no build): the math of every Markdown cell of a
chapter notebook and of every Markdown page (``$...$``, ``$$...$$``,
``{math}`...` `` roles, ``{math}`` and ``amsmath`` blocks), every figure
caption (a cell's ``mystnb.figure.caption`` or a ``{figure}`` directive), the
mathtext of every text in the stored SVG figures (axis labels, legends, diagram
labels) and every glued string. Each
retired form below is a regular expression over that math, with what replaces it.
A page that quotes a paper's own letters on purpose is listed in ``ALLOWED``,
with the reason.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_figures import captions, figures, read_svg

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = ROOT / "chapters"
PAGES = sorted(
    p
    for p in [*CHAPTERS.rglob("*.ipynb"), *CHAPTERS.rglob("*.md")]
    if ".ipynb_checkpoints" not in p.parts and p.name != "bibliography.md"
)

#: No letter, digit or backslash before: the symbol itself, not part of a word or
#: a command (\sigma, \cos, \mathrm{...} are not the letters s, A, d).
_B = r"(?<![A-Za-z0-9\\])"
_IJ = r"(?:[ij](?![A-Za-z0-9])|\{\s*[ij]\s*\}|\{\s*i\s*,?\s*j\s*\})"

#: (name, regular expression, what the notation writes instead)
RETIRED = [
    ("s_i/s_j/s_ij as scores or weights", _B + r"s_" + _IJ, "z_i (scores) or p_i"),
    ("s = ... or s) as scores or weights", _B + r"s\s*(?:=|\))", "z or p"),
    ("x_i/x_j as scores", _B + r"x_" + _IJ, "z_i"),
    ("S_ij as the score matrix", _B + r"S_" + _IJ, "z_{ij}"),
    ("S = QK^T as the score matrix", _B + r"S\s*=\s*(?:Q|\\[td]?frac\s*\{\s*Q)", "Z"),
    ("A_ij as attention weights", _B + r"A_" + _IJ, "p_{ij}"),
    (
        "A = softmax(...) or AV as attention weights",
        _B + r"A\s*(?:=\s*\\(?:operatorname|mathrm|text)\s*\{\s*softmax|V(?![A-Za-z]))",
        "P",
    ),
    (
        "sqrt(d) or sqrt(D) for the scale",
        r"\\sqrt\s*(?:\{\s*[dD]\s*\}|[dD](?![A-Za-z_]))",
        r"\sqrt{d_k}",
    ),
    ("d = n or D = n as the head dimension", _B + r"[dD]\s*=\s*\d", "d_k = n"),
    ("H(p) as entropy", _B + r"H\s*\(", r"\mathcal{H}(p)"),
    (
        "|V| as the vocabulary size",
        r"(?:\||\\[lv]?vert|\\left\s*\|)\s*V\s*(?:\||\\[rv]?vert|\\right\s*\|)",
        r"\lvert\mathcal{V}\rvert",
    ),
    ("d_i/d_j as the running sum", _B + r"d_" + _IJ, r"\ell_i"),
]
_RETIRED = [(name, re.compile(rx), fix) for name, rx, fix in RETIRED]

#: (page, retired form's name, why the page may write it). Keep it short: a page
#: quotes a paper's letters once, where it cites the paper, and says so.
ALLOWED: list[tuple[str, str, str]] = []

_CODE = re.compile(r"```(?!\{math\}).*?```|(?<!\})`[^`\n]*`", re.S)
_MATH = re.compile(
    r"```\{math\}(?P<block>.*?)```"
    r"|\$\$(?P<display>.*?)\$\$"
    r"|(?<![\\$])\$(?P<inline>[^$\n]+?)\$"
    r"|\{(?:math|eq)\}`(?P<role>[^`]*)`"
    r"|\\begin\{(?P<env>equation|align|gather|multline)\*?\}(?P<ams>.*?)\\end\{(?P=env)\*?\}",
    re.S,
)


def math_of(markdown: str) -> list[str]:
    """Every piece of math in a Markdown text (code spans and blocks left out)."""
    # {math} roles and blocks first: the code-span rule would take their backticks
    found = [m.group("role") or m.group("block") for m in _MATH.finditer(markdown)]
    found = [f for f in found if f is not None]
    rest = _CODE.sub(
        " ",
        re.sub(r"\{(?:math|eq)\}`[^`]*`|```\{math\}.*?```", " ", markdown, flags=re.S),
    )
    for m in _MATH.finditer(rest):
        piece = m.group("display") or m.group("inline") or m.group("ams")
        if piece is not None:
            found.append(piece)
    return found


def _id(page: Path) -> str:
    return str(page.relative_to(CHAPTERS))


def _markdown(page: Path) -> list[tuple[str, str]]:
    if page.suffix == ".md":
        return [("page", page.read_text(encoding="utf-8"))]
    cells = json.loads(page.read_text(encoding="utf-8"))["cells"]
    return [
        (f"cell {i}", "".join(c["source"]))
        for i, c in enumerate(cells)
        if c["cell_type"] == "markdown"
    ]


def _figure_and_glued_texts(page: Path) -> list[tuple[str, str]]:
    """The texts in the page's SVG figures (axis labels, legends, diagram labels)
    and the strings it glues into its prose."""
    if page.suffix != ".ipynb":
        return []
    found = []
    for where, mime, data in figures(page):
        if mime == "image/svg+xml":
            found += [(f"{where} text", run.text) for run in read_svg(data).texts]
    cells = json.loads(page.read_text(encoding="utf-8"))["cells"]
    for i, cell in enumerate(cells):
        for out in cell.get("outputs", []):
            if "scrapbook" in out.get("metadata", {}):
                value = out.get("data", {}).get("text/plain", "")
                found.append((f"cell {i} glued", "".join(value)))
    return found


def page_problems(page: Path) -> list[str]:
    """Every retired form in the page's math, captions, figure texts and glued
    strings, with where it is."""
    allowed = {name for p, name, _ in ALLOWED if p == _id(page)}
    places = _markdown(page) + [
        (f"{where} caption", cap)
        for where, cap in captions(page)
        if page.suffix != ".md"
    ]
    places += _figure_and_glued_texts(page)
    problems = []
    for where, source in places:
        for math in math_of(source):
            for name, rx, fix in _RETIRED:
                if name in allowed:
                    continue
                for m in rx.finditer(math):
                    snippet = math[max(0, m.start() - 15) : m.end() + 15].replace(
                        "\n", " "
                    )
                    problems.append(f"{where}: {name} in ${snippet}$ (write {fix})")
    return list(dict.fromkeys(problems))


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_page_math_uses_the_books_notation(page):
    problems = page_problems(page)
    assert not problems, f"{_id(page)}: {len(problems)} retired forms:\n" + "\n".join(
        problems[:40]
    )


def test_allowed_entries_name_pages_and_forms():
    names = {name for name, _, _ in RETIRED}
    for page, name, reason in ALLOWED:
        assert (CHAPTERS / page).exists(), page
        assert name in names and reason.strip(), (page, name)


@pytest.mark.parametrize(
    "math, retired",
    [
        (r"p_i = e^{s_i} / \sum_j e^{s_j}", "s_i/s_j/s_ij as scores or weights"),
        (r"s = \operatorname{softmax}(x)", "s = ... or s) as scores or weights"),
        (r"\operatorname{softmax}(x)_i = e^{x_i}", "x_i/x_j as scores"),
        (r"S_{ij} = q_i \cdot k_j", "S_ij as the score matrix"),
        (r"S = QK^\top", "S = QK^T as the score matrix"),
        (r"S = \frac{QK^\top}{\sqrt{d_k}}", "S = QK^T as the score matrix"),
        (
            r"A = \operatorname{softmax}(Z)",
            "A = softmax(...) or AV as attention weights",
        ),
        (r"O = AV", "A = softmax(...) or AV as attention weights"),
        (r"QK^\top/\sqrt{D}", "sqrt(d) or sqrt(D) for the scale"),
        (r"1/\sqrt d", "sqrt(d) or sqrt(D) for the scale"),
        (r"D = 64", "d = n or D = n as the head dimension"),
        (r"H(p) = -\sum_i p_i \log p_i", "H(p) as entropy"),
        (r"|V| = 50{,}000", "|V| as the vocabulary size"),
        (r"\lvert V \rvert", "|V| as the vocabulary size"),
        (
            r"d_j = d_{j-1} e^{m_{j-1} - m_j} + e^{x_j - m_j}",
            "d_i/d_j as the running sum",
        ),
    ],
)
def test_retired_forms_are_found(math, retired):
    found = [name for name, rx, _ in _RETIRED if rx.search(math)]
    assert retired in found, found


@pytest.mark.parametrize(
    "math",
    [
        r"Z = QK^\top/\sqrt{d_k}",
        r"p_i = e^{z_i} / \sum_j e^{z_j}",
        r"\sigma(z) \cos(x) \mathcal{H}(p) \lvert\mathcal{V}\rvert",
        r"S = 4096, \; L = S, \; d_k = 64",
        r"P = \operatorname{softmax}(Z), \; O = PV",
        r"(B, H, L, S) \quad \ell_j = \ell_{j-1} e^{m_{j-1} - m_j} + e^{z_j - m_j}",
        r"\frac{\mathrm{d}p}{\mathrm{d}z}, \; \mathrm{diag}(p) - pp^\top",
    ],
)
def test_the_books_notation_passes(math):
    assert [name for name, rx, _ in _RETIRED if rx.search(math)] == []


def test_math_is_read_from_markdown_and_code_is_not():
    md = "A $s_i$ and {math}`x_j`, not `s_i`;\n```python\ns = 1\n```\n$$S = QK^\\top$$"
    assert math_of(md) == ["x_j", "s_i", "S = QK^\\top"]


if __name__ == "__main__":  # a per-page list: python tests/book/test_notation.py
    total = 0
    for page in PAGES:
        problems = page_problems(page)
        total += len(problems)
        if problems:
            print(f"{_id(page)}: {len(problems)}")
            for p in problems:
                print("   ", p)
    print(f"{total} retired forms on {len(PAGES)} pages")
