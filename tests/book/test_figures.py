"""Every figure on the website is sharp, and its text legible on a phone.

Read from the notebooks' stored outputs (no build, no browser): every figure is
SVG (or a PNG at least twice as wide as it is shown), and every text in it is at
least 9 CSS px when the page is read on a 390 px phone, where a figure is shown
``min(its width, CONTENT_WIDTH_390)`` px wide (tests/book/_site_geometry.py).

How the size of a text is read from an SVG: with ``svg.fonttype = "path"`` (the
book's style, bookkit.use_style), matplotlib's SVG backend
(``RendererSVG._draw_text_as_path``) writes each text as a comment holding the
string, then ``<g transform="translate(x y) [rotate(a)] scale(s -s)">`` of glyph
``<use>`` elements, with ``s = fontsize / TextToPath.FONT_SCALE`` and
``FONT_SCALE = 100``: the font size in points is ``100 s``. Mathtext is written
the same way, each glyph ``<use>`` carrying its own ``scale(u)`` (0.7 for a
sub- or superscript, 0.49 for a script's script), so a glyph's size is
``100 s u`` (a radical sign, drawn from a "Size" font at its own scale, is not
text). A text run must be at least 9 px, and a script glyph at least ``0.7 x 9``
px (the size of a script of a 9 px text).
``test_the_reader_recovers_matplotlibs_font_sizes`` checks this reading against
the installed matplotlib.

Captions are checked too: no caption writes math as text (``sqrt(``, ``d_k``,
``e^(``) outside its MyST math.
"""

from __future__ import annotations

import base64
import json
import re
import struct
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest
from _site_geometry import CONTENT_WIDTH_390, CONTENT_WIDTH_1280

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = ROOT / "chapters"
PAGES = sorted(
    p for p in CHAPTERS.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts
)

#: The smallest text a reader is asked to read on a phone, in CSS px.
MIN_TEXT_PX = 9.0
#: mathtext's size of a sub- or superscript relative to its text (SHRINK_FACTOR).
SCRIPT_SHRINK = 0.7
#: matplotlib.textpath.TextToPath.FONT_SCALE: glyph paths are drawn at 100 pt.
FONT_SCALE = 100.0
PX_PER_PT = 4 / 3

_NS = "{http://www.w3.org/2000/svg}"
_XLINK = "{http://www.w3.org/1999/xlink}"
_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_SCALE = re.compile(rf"scale\(({_NUM})(?:[ ,]+({_NUM}))?\)")
_FONT_SIZE = re.compile(rf"font(?:-size)?:[^;]*?({_NUM})(px|pt)?")


@dataclass
class TextRun:
    text: str
    size_pt: float  # the text's font size
    smallest_pt: float  # its smallest glyph (a sub- or superscript in mathtext)


@dataclass
class Svg:
    width_pt: float
    texts: list[TextRun]


def _length_pt(value: str | None) -> float:
    if value is None:
        raise ValueError("the SVG has no width")
    m = re.fullmatch(rf"\s*({_NUM})\s*(pt|px)?\s*", value)
    if not m:
        raise ValueError(f"unreadable SVG width {value!r}")
    return float(m.group(1)) * (1.0 if m.group(2) == "pt" else 1 / PX_PER_PT)


def read_svg(svg: str) -> Svg:
    """The SVG's width in points and every text run in it with its sizes."""
    parser = ET.XMLParser(target=ET.TreeBuilder(insert_comments=True))
    root = ET.fromstring(svg.encode("utf-8"), parser=parser)
    texts: list[TextRun] = []

    def walk(element: ET.Element) -> None:
        previous = None
        for child in element:
            if child.tag is ET.Comment:
                previous = child
                continue
            scale = _SCALE.search(child.get("transform", ""))
            if child.tag == _NS + "g" and previous is not None and scale:
                size = abs(float(scale.group(1))) * FONT_SCALE
                glyphs = [
                    abs(float(m.group(1)))
                    if (m := _SCALE.search(u.get("transform", "")))
                    else 1.0
                    for u in child.iter(_NS + "use")
                    # a radical or a big delimiter, drawn from a "Size" font, is no text
                    if "Size" not in u.get(_XLINK + "href", "")
                ]
                if glyphs:  # an empty string draws nothing
                    texts.append(
                        TextRun((previous.text or "").strip(), size, size * min(glyphs))
                    )
            elif child.tag == _NS + "text":  # svg.fonttype "none": real text
                style = (
                    child.get("style", "") + ";font-size:" + child.get("font-size", "")
                )
                m = _FONT_SIZE.search(style)
                size = (
                    float(m.group(1)) if m else 12.0
                )  # SVG's user unit is the pt here
                run = "".join(child.itertext()).strip()
                texts.append(TextRun(run, size, size))
            else:
                walk(child)
            previous = None

    walk(root)
    return Svg(_length_pt(root.get("width")), texts)


def displayed_px(width_pt: float) -> float:
    """How wide the website shows a figure of this width on a 390 px phone."""
    return min(width_pt * PX_PER_PT, CONTENT_WIDTH_390)


def _png_width(data: str) -> int:
    header = base64.b64decode(data.replace("\n", "")[:64])
    return struct.unpack(">I", header[16:20])[0]


def _tags(cell: dict) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def _text(value: str | list[str]) -> str:
    return value if isinstance(value, str) else "".join(value)


def figures(page: Path):
    """(where, mime type, data) of every figure the website shows on a page."""
    nb = json.loads(page.read_text(encoding="utf-8"))
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        name = cell.get("metadata", {}).get("mystnb", {}).get("figure", {}).get("name")
        hidden = {"remove-cell", "remove-output"} & _tags(cell)
        k = 0
        for out in cell.get("outputs", []):
            glued = "scrapbook" in out.get("metadata", {})
            data = out.get("data", {})
            for mime in ("image/svg+xml", "image/png", "image/jpeg"):
                if mime in data and (glued or not hidden):
                    k += 1
                    where = (
                        f"cell {i}" + (f" ({name})" if name else "") + f", figure {k}"
                    )
                    yield where, mime, _text(data[mime])
                    break


def _id(page: Path) -> str:
    return str(page.relative_to(CHAPTERS))


def page_problems(page: Path) -> list[str]:
    """Every figure of the page that is not SVG, and every text under 9 px."""
    problems = []
    for where, mime, data in figures(page):
        if mime != "image/svg+xml":
            natural = _png_width(data) if mime == "image/png" else 0
            shown = min(natural, CONTENT_WIDTH_1280)
            if natural < 2 * shown:
                problems.append(
                    f"{where}: {mime} {natural} px wide, shown {shown} px at 1280 px"
                    " (blurry: make it SVG)"
                )
            continue
        svg = read_svg(data)
        px_per_pt = displayed_px(svg.width_pt) / svg.width_pt
        for run in svg.texts:
            if MATH_AS_TEXT.search(re.sub(r"\$[^$]*\$", " ", run.text)):
                problems.append(
                    f"{where}: {run.text!r} writes math as text (use $...$)"
                )
            px, smallest = run.size_pt * px_per_pt, run.smallest_pt * px_per_pt
            if px < MIN_TEXT_PX - 1e-6:
                problems.append(
                    f"{where}: {run.text!r} is {px:.1f} px on a phone"
                    f" ({run.size_pt:.1f} pt in a {svg.width_pt:.0f} pt wide figure)"
                )
            elif smallest < SCRIPT_SHRINK * MIN_TEXT_PX - 1e-6:
                problems.append(
                    f"{where}: a script in {run.text!r} is {smallest:.1f} px on a phone"
                )
    return problems


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_figures_are_sharp_and_legible_on_a_phone(page):
    problems = page_problems(page)
    assert not problems, f"{_id(page)}: {len(problems)} problems:\n" + "\n".join(
        problems[:40]
    )


# ---- captions: math as MyST math, never as text ---------------------------------

#: Math written as text: sqrt(...), a one-letter subscript (d_k, m_old), e^(...).
MATH_AS_TEXT = re.compile(r"sqrt\(|(?<![\w\\{.-])[A-Za-z]_(?:\{|[A-Za-z0-9])|\^\(")
_MATH = re.compile(
    r"\$\$.*?\$\$|\$[^$\n]+\$|\{(?:math|eq)\}`[^`]*`", re.S
)  # $$..$$, $..$, {math}`..`
# what renders as other text: the target of a cross-reference or citation
_ROLE_TARGET = re.compile(
    r"\{(?:ref|numref|doc|cite|cite:\w+|term|glue:\w*|glue)\}`[^`]*`"
)
_DIRECTIVE = re.compile(
    r"^(?P<fence>```+|:::+)\{(?:figure|glue:figure)\}[^\n]*\n(?P<body>.*?)^(?P=fence)\s*$",
    re.S | re.M,
)


def math_as_text(caption: str) -> list[str]:
    """The places where a caption writes math as plain text."""
    plain = _ROLE_TARGET.sub(" ", _MATH.sub(" ", caption))
    return [
        plain[max(0, m.start() - 20) : m.end() + 20]
        for m in MATH_AS_TEXT.finditer(plain)
    ]


def captions(page: Path) -> list[tuple[str, str]]:
    """(where, caption) of every figure caption on a notebook or Markdown page."""
    found = []
    if page.suffix == ".md":
        cells = [{"cell_type": "markdown", "source": page.read_text(encoding="utf-8")}]
    else:
        cells = json.loads(page.read_text(encoding="utf-8"))["cells"]
    for i, cell in enumerate(cells):
        mystnb = cell.get("metadata", {}).get("mystnb", {})
        caption = mystnb.get("figure", {}).get("caption")
        if caption:
            found.append((f"cell {i} ({mystnb['figure'].get('name', '')})", caption))
        if cell["cell_type"] == "markdown":
            for m in _DIRECTIVE.finditer(_text(cell["source"])):
                body = "\n".join(
                    line
                    for line in m.group("body").splitlines()
                    if not line.startswith(":")
                )
                found.append((f"cell {i} (figure directive)", body))
    return found


CAPTION_PAGES = PAGES + sorted(CHAPTERS.rglob("*.md"))


@pytest.mark.parametrize("page", CAPTION_PAGES, ids=_id)
def test_captions_write_math_as_math(page):
    bad = [
        f"{where}: ...{hit}..."
        for where, cap in captions(page)
        for hit in math_as_text(cap)
    ]
    assert not bad, f"{_id(page)}: math written as text in captions:\n" + "\n".join(bad)


def test_math_as_text_is_found_and_math_is_not():
    assert math_as_text("the scale 1/sqrt(d_k) of the scores")
    assert math_as_text("scores grow with d_k")
    assert math_as_text("the factor e^(λ_a-λ)")
    assert math_as_text("where m_old is the running maximum")
    assert not math_as_text(r"the scale {math}`1/\sqrt{d_k}`, and $m_{\mathrm{old}}$")
    assert not math_as_text("`sb.flash_attention_steps`, {numref}`fig-a_b` and d-k")


# ---- the reader of SVG, against matplotlib itself ------------------------------

#: The SVG settings of bookkit.use_style (set here without importing the book's kit).
BOOK_SVG = {"svg.fonttype": "path", "mathtext.fontset": "dejavusans"}


def test_the_reader_recovers_matplotlibs_font_sizes():
    """Draw texts of known sizes (plain, rotated, mathtext with scripts) and read
    them back from the SVG the book's style writes."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(BOOK_SVG)
    fig, ax = plt.subplots(figsize=(5.0, 3.0), layout=None)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.text(0.1, 0.8, "plain", fontsize=11)
    ax.text(0.1, 0.5, r"$\sqrt{d_k}\, z_i^{2}$", fontsize=20)
    ax.text(0.1, 0.2, r"$e^{\lambda_a}$", fontsize=20)
    ax.set_ylabel("rotated", fontsize=15)
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    plt.close(fig)
    svg = read_svg(buf.getvalue())
    sizes = {run.text: (run.size_pt, run.smallest_pt) for run in svg.texts}
    assert sizes["plain"] == pytest.approx((11, 11))
    assert sizes["rotated"] == pytest.approx((15, 15))
    assert sizes[r"$\sqrt{d_k}\, z_i^{2}$"] == pytest.approx((20, 20 * SCRIPT_SHRINK))
    assert sizes[r"$e^{\lambda_a}$"] == pytest.approx((20, 20 * SCRIPT_SHRINK**2))
    assert svg.width_pt == pytest.approx(5.0 * 72, abs=1)  # no tight bbox here


def test_a_small_label_fails_and_a_large_one_passes(tmp_path):
    """page_problems names the figure and the text that is too small."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(BOOK_SVG)
    outputs = []
    for size in (8, 14):
        fig, ax = plt.subplots(figsize=(6.4, 3.0))
        ax.set_xlabel(f"label at {size} pt", fontsize=size)
        ax.tick_params(labelsize=14)
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
        plt.close(fig)
        outputs.append(
            {
                "output_type": "display_data",
                "metadata": {},
                "data": {"image/svg+xml": buf.getvalue(), "text/plain": "<Figure>"},
            }
        )
    nb = {
        "cells": [
            {"cell_type": "code", "metadata": {}, "source": "", "outputs": outputs}
        ]
    }
    page = tmp_path / "page.ipynb"
    page.write_text(json.dumps(nb))
    problems = page_problems(page)
    assert (
        len(problems) == 1
        and "'label at 8 pt'" in problems[0]
        and "figure 1" in problems[0]
    )


def test_a_figure_label_with_math_as_text_fails(tmp_path):
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(BOOK_SVG)
    fig, ax = plt.subplots(figsize=(6.0, 3.0))
    ax.set_xlabel("scores / sqrt(d_k)", fontsize=14)
    ax.set_ylabel(r"weight $p_i$", fontsize=14)
    ax.tick_params(labelsize=14)
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    plt.close(fig)
    out = {
        "output_type": "display_data",
        "metadata": {},
        "data": {"image/svg+xml": buf.getvalue()},
    }
    nb = {
        "cells": [{"cell_type": "code", "metadata": {}, "source": "", "outputs": [out]}]
    }
    page = tmp_path / "page.ipynb"
    page.write_text(json.dumps(nb))
    problems = page_problems(page)
    assert len(problems) == 1 and "sqrt(d_k)" in problems[0], problems


if __name__ == "__main__":  # a per-page summary: python tests/book/test_figures.py
    total = {"figures": 0, "not SVG": 0, "figures with small text": 0, "small texts": 0}
    for page in PAGES:
        found = list(figures(page))
        problems = page_problems(page)
        blurry = [p for p in problems if "blurry" in p]
        small = [p for p in problems if "blurry" not in p]
        bad_figures = {p.split(": ")[0] for p in small}
        total["figures"] += len(found)
        total["not SVG"] += len(blurry)
        total["figures with small text"] += len(bad_figures)
        total["small texts"] += len(small)
        print(
            f"{_id(page)}: {len(found)} figures, {len(blurry)} not SVG,"
            f" {len(bad_figures)} with {len(small)} texts under {MIN_TEXT_PX:g} px"
        )
        for p in small:
            print("   ", p)
    print(total)
