"""The website builds with warnings as errors, and every chapter in the table of
contents exists."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a full build: `make test-fast` leaves it out
def test_book_builds_without_warnings(book_build):
    output = book_build.stdout + book_build.stderr
    warnings = [
        line for line in output.splitlines() if re.search(r"WARNING|ERROR", line)
    ]
    assert book_build.returncode == 0, output[-5000:]
    assert not warnings, "\n".join(warnings)
    assert (ROOT / "_build" / "html" / "index.html").exists()


def _toc_files():
    return re.findall(r"file:\s*(\S+)", (ROOT / "_toc.yml").read_text())


def test_every_toc_entry_exists():
    for entry in _toc_files():
        assert list(ROOT.glob(entry + ".*")), (
            f"_toc.yml lists {entry}, which does not exist"
        )


@pytest.mark.parametrize(
    "notebook", sorted((ROOT / "chapters").glob("*.ipynb")), ids=lambda p: p.name
)
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


@pytest.mark.parametrize(
    "notebook", sorted((ROOT / "chapters").glob("*.ipynb")), ids=lambda p: p.name
)
def test_glued_floats_are_rounded(notebook):
    """A glued float carries at most 6 significant digits, never a full repr (sb.glue's
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


@pytest.mark.parametrize(
    "notebook", sorted((ROOT / "chapters").glob("*.ipynb")), ids=lambda p: p.name
)
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
