"""How the book's pages are numbered, titled and anchored (issue 28).

1. Pages are numbered, headings are not. Sphinx numbers a page's own headings
in the same sequence as the pages its toctree lists, so the sidebar read
"5. Gradients", then "5.11, 5.12", the first ten numbers taken by the
headings of the chapter page. Here, once Sphinx has numbered everything, a
chapter keeps its number (5), its deep-dive pages are numbered 5.1, 5.2, ...
in the order of ``_toc.yml``, and headings inside a page carry no number, so
the sidebar, the page titles and the "next" links agree and show no gap.
Figure numbers are unchanged: they follow the chapter (Fig. 5.3), which is
the first part of every number on its pages.

2. Plain-text tab titles. A page title with math (``Scaling by
$\\sqrt{d_k}$``) is typeset in the page and the sidebar, but a browser tab,
a bookmark and a search result show the ``<title>`` as text: there it is
written in Unicode (``Scaling by √dₖ``), never as TeX.

3. Anchors for the claims ledger. The verification cells that check a page's
claims are left out of the website, so each claim of the ledger links to the
visible paragraph, formula or cell just before its cell: the text that makes
the claim. That element gets the id ``bookkit.claims.claim_anchor`` gives the
cell, and the ledger (``softmaxbook_sphinx.py``) links to it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from docutils import nodes

# ---------------------------------------------------------------- 1. numbering


def _renumber(app, env):
    """Number pages 5, 5.1, 5.2, ... and leave headings inside a page unnumbered."""
    pages = {
        doc: numbers[""]
        for doc, numbers in env.toc_secnumbers.items()
        if numbers.get("")
    }
    # Each page's children (pages whose number extends its own by one), in order.
    children: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    for number in sorted(pages.values()):
        children.setdefault(number[:-1], []).append(number)
    new: dict[tuple[int, ...], tuple[int, ...]] = {}
    for number in sorted(pages.values(), key=len):
        parent = number[:-1]
        base = new.get(parent, parent)
        new[number] = (
            number if not parent else (*base, children[parent].index(number) + 1)
        )
    for doc, numbers in env.toc_secnumbers.items():
        page = pages.get(doc)
        for anchor in numbers:
            # An empty tuple, not a missing key: Sphinx would fall back to the
            # page's number for a heading it finds no entry for.
            numbers[anchor] = new[page] if anchor == "" and page else ()
        toc = env.tocs.get(doc)
        if toc is not None:
            for reference in toc.findall(nodes.reference):
                if reference.get("anchorname") or not page:
                    reference.attributes.pop("secnumber", None)
                else:
                    reference["secnumber"] = list(new[page])
        if doc in env.titles and page:
            env.titles[doc]["secnumber"] = list(new[page])
    return []


# ----------------------------------------------------------------- 2. titles

_SYMBOLS = {
    "alpha": "α",
    "beta": "β",
    "gamma": "γ",
    "delta": "δ",
    "epsilon": "ε",
    "varepsilon": "ε",
    "lambda": "λ",
    "mu": "μ",
    "sigma": "σ",
    "tau": "τ",
    "theta": "θ",
    "ell": "ℓ",
    "cdot": "·",
    "times": "×",
    "top": "⊤",
    "le": "≤",
    "leq": "≤",
    "ge": "≥",
    "geq": "≥",
    "infty": "∞",
    "to": "→",
    "approx": "≈",
    "log": "log",
    "exp": "exp",
    "max": "max",
    "min": "min",
}
_SUB = dict(zip("0123456789aehijklmnoprstuvx+-=()", "₀₁₂₃₄₅₆₇₈₉ₐₑₕᵢⱼₖₗₘₙₒₚᵣₛₜᵤᵥₓ₊₋₌₍₎"))
_SUP = dict(zip("0123456789+-=()n⊤", "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ⁿᵀ"))


def _script(text: str, table: dict[str, str], mark: str) -> str:
    if text and all(c in table for c in text):
        return "".join(table[c] for c in text)
    return f"{mark}{text}" if len(text) == 1 else f"{mark}({text})"


def tex_to_text(tex: str) -> str:
    """A short TeX formula as Unicode text: ``\\sqrt{d_k}`` -> ``√dₖ``."""
    out = tex
    for _ in range(4):  # innermost groups first
        out = re.sub(
            r"\\sqrt\{([^{}]*)\}",
            lambda m: (
                "√"
                + (
                    m.group(1)
                    if len(re.sub(r"_\{?\w+\}?", "", m.group(1))) <= 1
                    else f"({m.group(1)})"
                )
            ),
            out,
        )
        out = re.sub(
            r"\\(?:mathrm|operatorname|text|mathbf|mathit)\{([^{}]*)\}", r"\1", out
        )
        out = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"\1/\2", out)
    out = re.sub(r"\\([A-Za-z]+)", lambda m: _SYMBOLS.get(m.group(1), m.group(1)), out)
    out = re.sub(
        r"_\{([^{}]*)\}|_(\w)",
        lambda m: _script(m.group(1) or m.group(2), _SUB, "_"),
        out,
    )
    out = re.sub(
        r"\^\{([^{}]*)\}|\^(\S)",
        lambda m: _script(m.group(1) or m.group(2), _SUP, "^"),
        out,
    )
    out = re.sub(r"\\[,;:! ]", " ", out)
    return re.sub(r"\s+", " ", out.replace("{", "").replace("}", "")).strip()


def plain_title(html: str) -> str:
    """A title as Sphinx renders it (math as ``\\(...\\)``), its math as text."""
    return re.sub(
        r"\\\((.*?)\\\)|\$(.+?)\$",
        lambda m: tex_to_text(m.group(1) or m.group(2)),
        html,
    )


def _plain_titles(app, pagename, templatename, context, doctree):
    for key in ("title", "pagetitle"):
        if isinstance(context.get(key), str):
            context[key] = plain_title(context[key])


# ----------------------------------------------------- 3. anchors of the claims


def _cell_of(node: nodes.Node) -> int | None:
    """The notebook cell a node was rendered from (myst-nb numbers a cell's
    lines from (index + 1) * 10000), or None."""
    for sub in node.findall(nodes.Element):
        if sub.get("cell_index") is not None:
            return int(sub["cell_index"])
        if sub.line and sub.line >= 10000:
            return sub.line // 10000 - 1
    return None


def _anchor_claims(app, doctree):
    from bookkit.claims import claim_anchor, is_verification_cell

    source = Path(app.env.doc2path(app.env.docname))
    if source.suffix != ".ipynb":
        return
    cells = json.loads(source.read_text(encoding="utf-8"))["cells"]
    checks = [i for i, cell in enumerate(cells) if is_verification_cell(cell)]
    if not checks:
        return
    # The page's blocks (a section's paragraphs, formulas, cells, and the
    # sections themselves), in reading order, with their cells.
    blocks: list[tuple[int, nodes.Element]] = []
    for section in doctree.findall(nodes.section):
        title = section.next_node(nodes.title)
        index = _cell_of(title) if title is not None else None
        if index is not None:
            blocks.append((index, section))
        for child in section.children:
            if isinstance(child, (nodes.section, nodes.title, nodes.target)):
                continue
            index = _cell_of(child)
            if index is not None:
                blocks.append((index, child))
    blocks.sort(key=lambda pair: pair[0])  # stable: a section before its text
    first = doctree.next_node(nodes.section)
    for check in checks:
        before = [node for index, node in blocks if index < check]
        node = before[-1] if before else first
        anchor = claim_anchor(cells[check].get("id") or check)
        if node is not None and anchor not in node["ids"]:
            node["ids"].append(anchor)


def setup(app):
    app.connect("env-get-updated", _renumber, priority=900)  # after TocTreeCollector
    app.connect("doctree-read", _anchor_claims)
    app.connect("html-page-context", _plain_titles)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
