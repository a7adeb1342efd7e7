"""Every chapter in the table of contents exists, and every page reads reader first
(the -W build of the website is checked in test_site.py, with the built pages).

Reader first (the rules of CONTRIBUTING.md a program can check, on the stored
notebooks, no build needed): verification cells are removed from the website,
collapsed in Jupyter and open with their claim; no ``assert`` stands in a cell a
reader sees; the prose never talks about the test harness; a page is at most
4,000 prose words and states its reading time; every chapter draws a diagram; no
solution stands before its exercise; figures fit a phone; chapter 1's map names
every chapter; every page is in the table of contents.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bookkit.claims import (
    CLAIM_PREFIX,
    cell_claims,
    has_assert,
    is_verification_cell,
    page_claims,
)

ROOT = Path(__file__).resolve().parents[2]
# Every page of the book that is a notebook: chapters/NN_name.ipynb and the deep-dive
# pages in chapters/NN_name/.
NOTEBOOKS = sorted(
    p
    for p in (ROOT / "chapters").rglob("*.ipynb")
    if ".ipynb_checkpoints" not in p.parts
)


def _page_id(path: Path) -> str:
    return str(path.relative_to(ROOT / "chapters"))


def _toc_files():
    return re.findall(r"file:\s*(\S+)", (ROOT / "_toc.yml").read_text())


def test_every_toc_entry_exists():
    for entry in _toc_files():
        assert list(ROOT.glob(entry + ".*")), (
            f"_toc.yml lists {entry}, which does not exist"
        )


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=_page_id)
def test_notebook_is_stored_executed(notebook):
    """The website shows stored outputs: every code cell must have been run."""
    nb = json.loads(notebook.read_text())
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    code = [
        c
        for c in nb["cells"]
        if c["cell_type"] == "code" and "".join(c["source"]).strip()
    ]
    unexecuted = [i for i, c in enumerate(code) if c.get("execution_count") is None]
    assert not unexecuted, (
        f"{notebook.name}: code cells {unexecuted} have no stored output"
    )
    for cell in code:
        for out in cell.get("outputs", []):
            assert out.get("name") != "stderr", (
                f"{notebook.name} writes to stderr: {out.get('text')}"
            )
            assert out.get("output_type") != "error", f"{notebook.name} stores an error"


GLUE_MIME = "application/papermill.record/text/plain"
# The repr of a Python float: digits with a point, an exponent, or both.
FLOAT_REPR = re.compile(r"-?(\d+\.\d*(e[-+]?\d+)?|\d+e[-+]?\d+)", re.IGNORECASE)


def _significant_digits(float_repr: str) -> int:
    """Significant digits of a float's repr: ``316.2`` has 4, ``65504.0`` 5, ``2.5e-07``
    2."""
    mantissa = re.split(r"[eE]", float_repr.lstrip("-"))[0]
    return len(mantissa.replace(".", "").strip("0"))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=_page_id)
def test_glued_floats_are_rounded(notebook):
    """A glued float carries at most 6 significant digits, never a full repr (bk.glue's
    rule)."""
    nb = json.loads(notebook.read_text())
    too_long = []
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            text = out.get("data", {}).get(GLUE_MIME)
            if text is None:
                continue
            text = "".join(text)
            if FLOAT_REPR.fullmatch(text) and _significant_digits(text) > 6:
                name = out.get("metadata", {}).get("scrapbook", {}).get("name")
                too_long.append(f"{name} = {text}")
    assert not too_long, f"{notebook.name} glues unrounded floats: {too_long}"


# JSON escapes that silently eat a TeX command: "\t" is a TAB (\times, \tau, \theta),
# "\f" a form feed (\frac), "\b" a backspace (\beta), "\r" a carriage return (\right),
# "\a" and "\v" (\alpha, \vec) bells and vertical tabs.
CONTROL_CHARACTERS = {
    "\t": r"\t",
    "\f": r"\f",
    "\b": r"\b",
    "\r": r"\r",
    "\a": r"\a",
    "\v": r"\v",
}


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=_page_id)
def test_no_control_characters_ate_tex(notebook):
    nb = json.loads(notebook.read_text())
    found = []
    for index, cell in enumerate(nb["cells"]):
        source = "".join(cell["source"])
        for char, escape in CONTROL_CHARACTERS.items():
            if char in source:
                at = source.index(char)
                found.append(
                    f"cell {index}: {escape} in {source[max(0, at - 20) : at + 12]!r}"
                )
    assert not found, (
        f"{notebook.name}: a JSON escape replaced a TeX backslash: {found}"
    )


def test_the_fast_tests_never_build_the_book(request):
    # `make test-fast` runs `-m "not slow"`: no test it selects may build the website.
    builders = [
        item.nodeid
        for item in request.session.items
        if "book_build" in getattr(item, "fixturenames", ())
        and item.get_closest_marker("slow") is None
    ]
    assert not builders, (
        f"tests that build the book but are not marked slow: {builders}"
    )


# Reader first


CHAPTERS = ROOT / "chapters"
PAGES = sorted(
    p
    for p in CHAPTERS.rglob("*.ipynb")
    if ".ipynb_checkpoints" not in p.parts
    and re.match(r"(0[1-9]|1[01])_", p.relative_to(CHAPTERS).parts[0])
)
MAX_WORDS = 4000
# Reading speed of technical prose with formulas, words per minute: a stated reading
# time must lie between what a fast and a slow reader need.
FAST, SLOW = 250, 150
MIN_DIAGRAMS = 14
HIDING = {"remove-cell", "remove-input", "hide-input", "hide-cell"}
HARNESS = re.compile(
    r"nbval|pytest|ATEN_CPU_CAPABILITY|MKL_ENABLE|OMP_NUM_THREADS|load average"
    r"|verification cell|the (cell|check|test)s? (above |below )?(asserts?|checks?)\b"
    r"|assert(s|ed)? (that|in the)",
    re.IGNORECASE,
)


def _id(path: Path) -> str:
    return str(path.relative_to(CHAPTERS))


def _nb(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _src(cell: dict) -> str:
    return "".join(cell["source"])


def _tags(cell: dict) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def prose_words(markdown: str) -> int:
    """Words a reader reads: Markdown without fenced code and directive options; a glued
    number counts as one word."""
    md = re.sub(
        r"^(```|~~~)[a-z0-9]*\s*$.*?^(```|~~~)\s*$", " ", markdown, flags=re.S | re.M
    )
    md = re.sub(r"^:[a-z-]+:.*$", " ", md, flags=re.M)
    md = re.sub(r"\{glue:[a-z]+\}`[^`]*`", "X", md)
    return len(md.split())


def _markdown(nb: dict) -> list[str]:
    return [_src(c) for c in nb["cells"] if c["cell_type"] == "markdown"]


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_checks_are_out_of_the_readers_path(page):
    """Every cell with an assert is a verification cell: removed, collapsed, claimed."""
    nb = _nb(page)
    visible = [
        i
        for i, c in enumerate(nb["cells"])
        if has_assert(c) and not is_verification_cell(c)
    ]
    assert not visible, (
        f"{page.name}: cells {visible} assert but are not verification cells (tag "
        f"remove-cell, metadata jupyter.source_hidden, first line {CLAIM_PREFIX!r})"
    )


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_every_verification_cell_states_checked_claims(page):
    nb = _nb(page)
    for i, cell in enumerate(nb["cells"]):
        if not is_verification_cell(cell):
            continue
        claims = cell_claims(cell)
        assert claims, f"{page.name} cell {i}: a verification cell states no claim"
        for claim in claims:
            assert len(claim.split()) >= 5, (
                f"{page.name} cell {i}: {claim!r} is no sentence"
            )
        # A claim is followed by the code that checks it: some assert or raise after it.
        last = _src(cell).rstrip().rsplit(CLAIM_PREFIX, 1)[-1]
        assert re.search(r"^\s*(assert|raise|.*\bcheck)", last, re.M), (
            f"{page.name} cell {i}: its last claim is followed by no check"
        )
        assert not cell.get("outputs"), (
            f"{page.name} cell {i}: a verification cell prints nothing the reader needs"
        )


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_prose_speaks_about_softmax_not_the_harness(page):
    found = [m.group(0) for md in _markdown(_nb(page)) for m in HARNESS.finditer(md)]
    assert not found, f"{page.name} talks about the test harness: {found}"


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_page_fits_one_sitting_and_states_its_reading_time(page):
    markdown = _markdown(_nb(page))
    words = prose_words("\n".join(markdown))
    assert words <= MAX_WORDS, f"{page.name}: {words} prose words (at most {MAX_WORDS})"
    stated = re.search(r"Reading time: about (\d+) minutes?", markdown[0])
    assert stated, f"{page.name}: the first Markdown cell states no reading time"
    minutes = int(stated.group(1))
    assert words / FAST - 1 <= minutes <= words / SLOW + 1, (
        f"{page.name}: {words} words read in {words / FAST:.0f}-{words / SLOW:.0f}"
        f" minutes, not {minutes}"
    )


def _chapter(page: Path) -> str:
    return page.relative_to(CHAPTERS).parts[0][:2]


def _diagrams(page: Path) -> list[dict]:
    return [
        c
        for c in _nb(page)["cells"]
        if c["cell_type"] == "code"
        and "diagram" in _tags(c)
        and any(
            {"image/png", "image/svg+xml"} & o.get("data", {}).keys()
            for o in c.get("outputs", [])
        )
    ]


def test_every_chapter_draws_diagrams():
    per_chapter = {f"{n:02d}": 0 for n in range(1, 12)}
    for page in PAGES:
        per_chapter[_chapter(page)] += len(_diagrams(page))
    without = [ch for ch, n in per_chapter.items() if n == 0]
    assert not without, f"chapters without a drawn diagram: {without}"
    assert sum(per_chapter.values()) >= MIN_DIAGRAMS, per_chapter


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_diagrams_have_captions_and_alt_text(page):
    for cell in _diagrams(page):
        mystnb = cell.get("metadata", {}).get("mystnb", {})
        name = mystnb.get("figure", {}).get("name")
        assert mystnb.get("figure", {}).get("caption"), (
            f"{page.name}: {name} has no caption"
        )
        assert name, f"{page.name}: a diagram has no figure name"
        assert mystnb.get("image", {}).get("alt"), (
            f"{page.name}: {name} has no alt text"
        )
        assert "hide-input" in _tags(cell), (
            f"{page.name}: {name} shows its drawing code"
        )


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_no_solution_before_the_solutions_section(page):
    cells = _nb(page)["cells"]
    start = next(
        (
            i
            for i, c in enumerate(cells)
            if c["cell_type"] == "markdown" and re.match(r"#+ Solutions\b", _src(c))
        ),
        len(cells),
    )
    early = [
        i
        for i, c in enumerate(cells[:start])
        if "solution" in _tags(c)
        or (c["cell_type"] == "markdown" and re.search(r"\{solution", _src(c)))
    ]
    assert not early, f"{page.name}: solutions in cells {early}, before '## Solutions'"
    hidden = [
        i for i, c in enumerate(cells) if "solution" in _tags(c) and _tags(c) & HIDING
    ]
    assert not hidden, f"{page.name}: solution cells {hidden} are hidden by a tag"


def test_chapter_one_maps_every_chapter():
    text = "\n".join(
        md for page in PAGES if _chapter(page) == "01" for md in _markdown(_nb(page))
    )
    unnamed = [n for n in range(2, 12) if not re.search(rf"Chapter\s+{n}\b", text)]
    assert not unnamed, f"chapter 1 does not name chapters {unnamed}"


def test_every_page_is_in_the_table_of_contents():
    toc = (ROOT / "_toc.yml").read_text()
    listed = set(re.findall(r"file:\s*(\S+)", toc))
    missing = [
        _id(p) for p in PAGES if str(p.relative_to(ROOT).with_suffix("")) not in listed
    ]
    assert not missing, f"pages missing from _toc.yml: {missing}"


def test_the_ledger_lists_enough_claims():
    claims = [c for page in PAGES for c in page_claims(page, ROOT)]
    assert len(claims) >= 200, f"only {len(claims)} checked claims in the chapters"
