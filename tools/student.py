"""Write student versions of the chapters: plain Markdown, no answers, run anywhere.

Usage::

    python tools/student.py [--out DIR] [--ref REF] [NOTEBOOK ...]

writes each notebook (by default every page under ``chapters/``) to ``DIR``
(by default ``_build/student/``), keeping its place under ``chapters/`` so that
links between pages work. ``make student`` runs it. A student version reads
well in plain Jupyter, JupyterHub and Colab, has no answer to an exercise, and
runs top to bottom.

**Plain Markdown.** The book is written in MyST for Jupyter Book, whose markup
Jupyter shows raw. The student version renders it:

- numbers glued with myst-nb (``{glue:text}`name:.2f```, ``{glue}``, ``{glue:md}``
  and the ``{glue:figure}`` directive) are replaced by the values stored in the
  notebook's outputs, formatted as myst-nb formats them;
- ``{exercise}`` becomes **Exercise 2.5** (ex-stability-5), numbered as on
  the website; ``{solution}`` blocks go (below); admonitions (``{note}``,
  ``{admonition}``, dropdowns...) become block quotes with a bold title;
  ``{literalinclude}`` becomes a code block holding the included source;
- ``{cite}`` becomes author-year text linked to the paper, ``{term}`` and
  ``{func}`` their text, ``{doc}`` a link to the student notebook of that page,
  ``{ref}`` and ``{numref}`` the exercise's or figure's number; a figure's caption
  is written under it as a Markdown cell, with its number.

**No answers.** The convention (cell tags are set in JupyterLab's property
inspector, or in the cell's ``metadata.tags`` list):

- In Markdown, every ``{solution}`` directive block of sphinx-exercise is
  removed, whatever its fence, and so is everything between the gated
  directives ``{solution-start}`` and ``{solution-end}``, across cells, except
  the code cells tagged ``solution`` or ``exercise`` (below). A Markdown cell
  tagged ``solution`` is removed.
- A code cell tagged ``solution`` holds the reference answer of an "implement
  it yourself" exercise. The student version keeps its imports, classes and
  module constants (``UPPER_CASE = ...``), and each function's signature and
  docstring with the body replaced by ``raise NotImplementedError`` (so do the
  methods of a class); it clears the outputs and tags the cell ``answer``. A
  cell may give its own stub in ``metadata.softmaxbook.stub``.
- A code cell tagged ``exercise`` (the call of a checker) keeps its code and
  loses its outputs: the student runs it to see the feedback.
- **Hidden answer cells are removed.** A code cell is an answer, and goes, if
  its metadata says so (``"softmaxbook": {"answers": "ex-label"}``, or a list of
  labels), or if it is a hidden verification cell (tag ``remove-cell``) that
  either stands after the page's first exercise (where a page keeps its
  exercises and their solutions, so what is checked there is an answer) or
  names an exercise (its label, or the word "exercise"). Such cells check
  claims about exercises (ex-stability-5's count of ``exp`` calls, ex-masking-2's
  gradients) and would hand a student the answer. Removing them must leave the
  notebook runnable: if a later cell uses a name that only a removed cell
  defines, the tool stops with an error naming both.

**Runs anywhere.** The first code cell gets the Colab preamble of
``tools/colab_cell.py``: where the library is missing (Colab) it installs it,
pinned to the release of this checkout (``--ref``, default ``v`` +
``softmaxbook.__version__``); elsewhere it does nothing. Plotting code hidden
on the website (``hide-input``) is collapsed in JupyterLab.

Only the standard library and ``nbformat`` (to validate the result) are used:
no myst-nb, no Sphinx.
"""

from __future__ import annotations

import argparse
import ast
import copy
import functools
import importlib.util
import itertools
import json
import os
import re
import sys
import unicodedata
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOLUTION_TAG, EXERCISE_TAG, ANSWER_TAG = "solution", "exercise", "answer"
HIDING_TAGS = ("hide-input", "hide-cell", "remove-input", "remove-cell")
VERIFICATION_TAG = "remove-cell"


def _sibling(name: str):
    """A module of tools/ (this folder is not a package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, Path(__file__).with_name(f"{name}.py")
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


colab_cell = _sibling("colab_cell")

# The opening fence of a MyST directive, ``:::{name}`` or ```` ```{name} ````.
_OPEN = re.compile(
    r"^[ \t]*(?P<fence>:{3,}|`{3,})\{(?P<name>[\w:-]+)\}[ \t]*(?P<arg>.*)$"
)
# A plain code fence (```` ```python ````, ``~~~``), whose content is left as it is.
_CODE_FENCE = re.compile(r"^[ \t]*(?P<fence>`{3,}|~{3,})(?![`~]*\{)")


def _closes(line: str, fence: str) -> bool:
    """A line closing a fence: the same character, at least as many, nothing else."""
    stripped = line.strip()
    return len(stripped) >= len(fence) and set(stripped) == {fence[0]}


def _end_of_block(lines: list[str], start: int, fence: str) -> int:
    """Index of the line closing the block opened at ``start`` (or the last line).

    A nested block uses a shorter fence (``:::`` inside ``::::``), so its closing
    line is too short to close the outer one.
    """
    for i in range(start + 1, len(lines)):
        if _closes(lines[i], fence):
            return i
    return len(lines) - 1  # unclosed: MyST ends the block with the cell


# --------------------------------------------------------------------------------------
# Solutions
# --------------------------------------------------------------------------------------


def strip_solutions(text: str, gated: bool = False) -> tuple[str, int, bool]:
    """Remove ``{solution}`` blocks and gated solutions from Markdown text.

    ``gated`` says whether the text starts inside a ``{solution-start}`` ...
    ``{solution-end}`` region opened in an earlier cell. Returns the text, the
    number of solutions removed, and whether a gated region is still open.
    """
    lines = text.split("\n")
    kept, removed, i = [], 0, 0
    while i < len(lines):
        opened = _OPEN.match(lines[i])
        name = opened["name"] if opened else None
        if gated:
            if name == "solution-end":
                gated = False
                i = _end_of_block(lines, i, opened["fence"]) + 1
            else:
                i += 1
            continue
        if name == "solution":
            removed += 1
            i = _end_of_block(lines, i, opened["fence"]) + 1
        elif name == "solution-start":
            removed += 1
            gated = True
            i = _end_of_block(lines, i, opened["fence"]) + 1
        else:
            kept.append(lines[i])
            i += 1
    out = re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).strip("\n")
    return out, removed, gated


# --------------------------------------------------------------------------------------
# Stubs
# --------------------------------------------------------------------------------------

_CONSTANT = re.compile(r"^_*[A-Z][A-Z0-9_]*$")


def stub(source: str) -> str:
    """The student's version of a solution cell: what the code needs, no answers.

    Imports stay; so do module constants (``BLOCK = 16``: every target an
    UPPER_CASE name), ``__all__``, and classes, whose methods become stubs
    like functions. Each top-level function keeps its decorators, signature
    and docstring; its body becomes ``raise NotImplementedError``. Every other
    statement is part of the answer and goes.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return "# Your code here\n"
    lines = source.split("\n")
    parts = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) or _is_constant(node):
            parts.append(_segment(node, lines))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            parts.append(_function_stub(node, lines))
        elif isinstance(node, ast.ClassDef):
            parts.append(_class_stub(node, lines))
    if not parts:
        return "# Your code here\n"
    # constants and imports that follow each other stay together, as in the source
    out = parts[0]
    for previous, node_text in itertools.pairwise(parts):
        tight = not previous.lstrip().startswith(("def ", "class ", "@", "async "))
        tight = tight and not node_text.lstrip().startswith(
            ("def ", "class ", "@", "async ")
        )
        out += ("\n" if tight else "\n\n\n") + node_text
    return out + "\n"


def _is_constant(node: ast.stmt) -> bool:
    if isinstance(node, ast.Assign):
        targets = [t for target in node.targets for t in _names(target)]
    elif isinstance(node, ast.AnnAssign) and node.value is not None:
        targets = _names(node.target)
    else:
        return False
    return bool(targets) and all(t == "__all__" or _CONSTANT.match(t) for t in targets)


def _names(target: ast.expr) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for element in target.elts for n in _names(element)]
    return ["<not a name>"]


def _segment(node: ast.stmt, lines: list[str]) -> str:
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return "\n".join(lines[first - 1 : node.end_lineno])


def _function_stub(node, lines: list[str]) -> str:
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    body = node.body
    has_doc = _docstring(node) is not None
    outer = " " * node.col_offset
    indent = " " * (
        body[0].col_offset if body[0].lineno > node.lineno else node.col_offset + 4
    )
    if body[0].lineno > node.lineno:
        last = body[0].end_lineno if has_doc else body[0].lineno - 1
        header = "\n".join(lines[first - 1 : last])
    else:  # a one-line def: rebuild its signature
        bare = copy.copy(node)
        bare.body = [ast.Pass()]
        bare.decorator_list = node.decorator_list
        header = "\n".join(
            outer + line for line in ast.unparse(bare).rsplit("\n", 1)[0].split("\n")
        )
    return (
        f"{header}\n{indent}# Your code here: replace the next line.\n"
        f"{indent}raise NotImplementedError({('write ' + node.name)!r})"
    )


def _docstring(node) -> ast.Expr | None:
    first = node.body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return first
    return None


def _class_stub(node: ast.ClassDef, lines: list[str]) -> str:
    """The class line, its docstring and constants, and a stub of each method."""
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    body = node.body
    header_end = body[0].lineno - 1 if body[0].lineno > node.lineno else None
    if header_end is None:  # ``class A: pass`` on one line
        return _segment(node, lines)
    parts = ["\n".join(lines[first - 1 : header_end])]
    members = []
    for child in body:
        if (
            child is _docstring(node)
            or _is_constant(child)
            or isinstance(child, (ast.Pass, ast.AnnAssign))
        ):
            members.append(_segment(child, lines))
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            members.append(_function_stub(child, lines))
        elif isinstance(child, ast.ClassDef):
            members.append(_class_stub(child, lines))
    if not members:
        members = [" " * (body[0].col_offset) + "pass"]
    return parts[0] + "\n" + "\n\n".join(members)


# --------------------------------------------------------------------------------------
# The book: page order, numbers of exercises and figures, titles, bibliography
# --------------------------------------------------------------------------------------


class Book:
    """What rendering one page needs to know about the others."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pages: list[Path] = []  # notebooks and .md pages, in the toc's order
        self.chapter: dict[Path, int] = {}
        self.exercises: dict[str, str] = {}  # label -> "2.5"
        self.exercise_page: dict[str, Path] = {}
        self.figures: dict[str, str] = {}  # label -> "2.3"
        self.titles: dict[Path, str] = {}
        self.bib: dict[str, dict[str, str]] = {}


def _source(cell: dict) -> str:
    source = cell["source"]
    return "".join(source) if isinstance(source, list) else source


def _read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _toc(root: Path) -> list[tuple[Path, int | None, bool]]:
    """(page, chapter number or None, is a chapter's core page) in the toc's order.

    Parts with ``numbered: true`` number their chapters on from the previous
    part (Jupyter Book's default across parts); a chapter's sections share its
    number. The toc is read with a regular expression: no YAML parser needed.
    """
    toc = root / "_toc.yml"
    if not toc.exists():
        return []
    entries, chapter_indent, numbered, number = [], None, False, 0
    for line in toc.read_text(encoding="utf-8").splitlines():
        if re.match(r"^\s*-\s*caption:", line):
            numbered = False
        elif re.match(r"^\s*numbered:\s*true", line):
            numbered = True
        match = re.match(r"^(\s*)-\s*file:\s*(\S+)", line)
        if not match:
            continue
        indent, name = len(match.group(1)), match.group(2)
        path = _page_path(root / name)
        if path is None:
            continue
        if chapter_indent is None or indent <= chapter_indent:
            chapter_indent = indent
            if numbered:
                number += 1
            entries.append((path, number if numbered else None, True))
        else:
            entries.append((path, number if numbered else None, False))
    return entries


def _page_path(stem: Path) -> Path | None:
    for suffix in (".ipynb", ".md"):
        if stem.with_suffix(suffix).exists():
            return stem.with_suffix(suffix).resolve()
    return None


@functools.lru_cache(maxsize=4)
def load_book(root: Path = ROOT) -> Book:
    """Number the exercises and figures of every page, as the website does.

    sphinx-exercise and Sphinx number per chapter (``numfig_secnum_depth`` 1):
    the chapter's core page first, then its deep-dive pages in the toc's order.
    """
    book = Book(root=root)
    toc = _toc(root)
    counters: dict[int, Counter] = {}
    for path, number, _ in toc:
        book.pages.append(path)
        if number is not None:
            book.chapter[path] = number
        if path.suffix != ".ipynb":
            book.titles[path] = _md_title(path.read_text(encoding="utf-8"))
            continue
        nb = _read(path)
        book.titles[path] = _notebook_title(nb)
        counter = counters.setdefault(number or 0, Counter())
        for kind, label in _numbered_things(nb):
            counter[kind] += 1
            text = f"{number}.{counter[kind]}" if number else str(counter[kind])
            (book.exercises if kind == "exercise" else book.figures)[label] = text
            if kind == "exercise":
                book.exercise_page[label] = path
    book.bib = _bibliography(root)
    return book


def _numbered_things(nb: dict):
    """("exercise" or "figure", label) in the order the page shows them."""
    for cell in nb["cells"]:
        tags = cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] == "code":
            figure = cell.get("metadata", {}).get("mystnb", {}).get("figure", {})
            if figure.get("name") and VERIFICATION_TAG not in tags:
                yield "figure", figure["name"]
            continue
        if cell["cell_type"] != "markdown" or SOLUTION_TAG in tags:
            continue
        text, _, _ = strip_solutions(_source(cell))
        for block in _directives(text.split("\n")):
            name, options = block["name"], block["options"]
            if name == "exercise" and "nonumber" not in options:
                yield "exercise", options.get("label", f"<unlabelled {id(block)}>")
            elif name in ("figure", "glue:figure") and options.get("name"):
                yield "figure", options["name"]


def _directives(lines: list[str]):
    """Every directive block, nested ones too, with its name, argument and options."""
    i = 0
    while i < len(lines):
        opened = _OPEN.match(lines[i])
        if opened:
            end = _end_of_block(lines, i, opened["fence"])
            options, body = _options(lines[i + 1 : end])
            yield {
                "name": opened["name"],
                "arg": opened["arg"].strip(),
                "options": options,
            }
            yield from _directives(body)
            i = end + 1
        else:
            i += 1


def _options(lines: list[str]) -> tuple[dict[str, str], list[str]]:
    """A directive's ``:key: value`` lines (or a ``---`` YAML block), and its body."""
    options: dict[str, str] = {}
    i = 0
    if lines and lines[0].strip() == "---":
        end = next((j for j in range(1, len(lines)) if lines[j].strip() == "---"), 0)
        for line in lines[1:end]:
            key, _, value = line.partition(":")
            options[key.strip()] = value.strip().strip("\"'")
        i = end + 1
    while i < len(lines):
        match = re.match(r"^\s*:([\w-]+):\s*(.*)$", lines[i])
        if not match:
            break
        options[match.group(1)] = match.group(2).strip()
        i += 1
    return options, lines[i:]


def _notebook_title(nb: dict) -> str:
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            title = _md_title(_source(cell))
            if title:
                return title
    return ""


def _md_title(text: str) -> str:
    match = re.search(r"^#\s+(.+)$", text, re.M)
    return match.group(1).strip() if match else ""


# --------------------------------------------------------------------------------------
# Bibliography: author-year text without a BibTeX library
# --------------------------------------------------------------------------------------

_ACCENTS = {
    "'": "\u0301",
    "`": "\u0300",
    '"': "\u0308",
    "^": "\u0302",
    "~": "\u0303",
    "c": "\u0327",
    "v": "\u030c",
    "u": "\u0306",
    "=": "\u0304",
    ".": "\u0307",
    "H": "\u030b",
    "k": "\u0328",
}
_LETTERS = {
    "L": "Ł",
    "l": "ł",
    "o": "ø",
    "O": "Ø",
    "ss": "ß",
    "aa": "å",
    "AA": "Å",
    "ae": "æ",
    "AE": "Æ",
    "i": "ı",
    "oe": "œ",
}


def _latex_to_text(text: str) -> str:
    def accent(match: re.Match) -> str:
        return match.group(2) + _ACCENTS[match.group(1)]

    text = re.sub(r"\\([`'\"^~=.])\s*\{?([A-Za-z])\}?", accent, text)
    text = re.sub(r"\\([cvuHk])\s*\{([A-Za-z])\}", accent, text)
    text = re.sub(r"\\([cvuHk])\s+([A-Za-z])", accent, text)
    text = re.sub(
        r"\\(ss|aa|AA|ae|AE|oe|[LloOi])(?![A-Za-z])\s?",
        lambda m: _LETTERS[m.group(1)],
        text,
    )
    text = text.replace("\\&", "&").replace("--", "–")
    return unicodedata.normalize("NFC", re.sub(r"[{}]", "", text))


def _bib_files(root: Path) -> list[Path]:
    config = root / "_config.yml"
    files = []
    if config.exists():
        text = config.read_text(encoding="utf-8")
        block = re.search(r"^bibtex_bibfiles:\s*\n((?:\s+-\s*\S+\s*\n)+)", text, re.M)
        if block:
            files = [root / f for f in re.findall(r"-\s*(\S+)", block.group(1))]
    return [f for f in files if f.exists()] or sorted(
        (root / "chapters").rglob("*.bib")
    )


def _bibliography(root: Path) -> dict[str, dict[str, str]]:
    entries: dict[str, dict[str, str]] = {}
    for path in _bib_files(root):
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(r"@\w+\s*\{\s*([^,\s]+)\s*,", text):
            fields, i = {}, match.end()
            depth_end = _matching_brace(text, text.index("{", match.start()))
            body = text[i:depth_end]
            for field_match in re.finditer(r"(\w+)\s*=\s*", body):
                start = field_match.end()
                if start < len(body) and body[start] == "{":
                    end = _matching_brace(body, start)
                    value = body[start + 1 : end]
                elif start < len(body) and body[start] == '"':
                    end = body.index('"', start + 1)
                    value = body[start + 1 : end]
                else:
                    value = re.match(r"[^,}\s]*", body[start:]).group(0)
                fields.setdefault(field_match.group(1).lower(), value)
            entries[match.group(1)] = fields
    return entries


def _matching_brace(text: str, start: int) -> int:
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return len(text)


def _surnames(authors: str) -> list[str]:
    names = []
    for person in re.split(r"\s+and\s+", authors.strip()):
        person = person.strip()
        if person == "others":
            names.append("others")
        elif person.startswith("{") and person.endswith("}"):  # {Gemma Team}
            names.append(_latex_to_text(person))
        elif "," in person:
            names.append(_latex_to_text(person.split(",")[0]).strip())
        else:
            names.append(_latex_to_text(person).split()[-1])
    return names


def cite_text(key: str, bib: dict[str, dict[str, str]], textual: bool = False) -> str:
    """``Vaswani et al. (2017)`` (textual) or ``Vaswani et al., 2017``, linked."""
    entry = bib.get(key)
    if entry is None:
        return key
    names = _surnames(entry.get("author", entry.get("editor", ""))) or [key]
    if len(names) == 1:
        who = names[0]
    elif len(names) == 2 and "others" not in names:
        who = f"{names[0]} and {names[1]}"
    else:
        who = f"{names[0]} et al."
    year = entry.get("year", "n.d.")
    url = entry.get("url") or (
        f"https://doi.org/{entry['doi']}" if "doi" in entry else ""
    )
    if textual:
        return f"{who} ([{year}]({url}))" if url else f"{who} ({year})"
    text = f"{who}, {year}"
    return f"[{text}]({url})" if url else text


# --------------------------------------------------------------------------------------
# Glue: the values myst-nb stores in the outputs
# --------------------------------------------------------------------------------------


def glue_data(nb: dict) -> dict[str, dict]:
    """name -> mime bundle of every value glued in the notebook's outputs.

    myst-nb's ``glue`` writes a ``display_data`` output whose metadata holds
    ``scrapbook: {name, mime_prefix}`` and whose mime types carry that prefix
    (``application/papermill.record/text/plain``).
    """
    data = {}
    for cell in nb["cells"]:
        for output in cell.get("outputs", []) if cell["cell_type"] == "code" else []:
            scrapbook = output.get("metadata", {}).get("scrapbook")
            if not scrapbook:
                continue
            prefix = scrapbook.get("mime_prefix", "")
            data[scrapbook["name"]] = {
                mime[len(prefix) :] if mime.startswith(prefix) else mime: value
                for mime, value in output.get("data", {}).items()
            }
    return data


def format_plain_text(text: str, spec: str) -> str:
    """myst-nb's formatting of a glued ``text/plain`` value with a format spec."""
    try:
        value = ast.literal_eval(text)
    except (SyntaxError, ValueError):
        value = text
    if spec == "":
        return str(value)
    kind = spec[-1]
    if kind == "s":
        value = str(value)
    elif kind in "bcdoxX":
        value = int(value)
    elif kind in "eEfFgGn%":
        value = float(value)
    return format(value, spec)


def _bundle_text(bundle: dict) -> str:
    text = bundle.get("text/plain", "")
    return "".join(text) if isinstance(text, list) else text


def _bundle_markdown(bundle: dict, caption: str = "") -> str:
    """A glued output as Markdown: an image, Markdown, or its text."""
    for mime in ("image/png", "image/jpeg", "image/gif"):
        if mime in bundle:
            data = (
                "".join(bundle[mime])
                if isinstance(bundle[mime], list)
                else bundle[mime]
            )
            return f"![{caption}](data:{mime};base64,{data.strip()})"
    if "image/svg+xml" in bundle:
        return "".join(bundle["image/svg+xml"])
    if "text/markdown" in bundle:
        return "".join(bundle["text/markdown"])
    return _bundle_text(bundle)


# --------------------------------------------------------------------------------------
# MyST to plain Markdown
# --------------------------------------------------------------------------------------

ADMONITIONS = {
    "note": "Note",
    "tip": "Tip",
    "hint": "Hint",
    "important": "Important",
    "warning": "Warning",
    "caution": "Caution",
    "attention": "Attention",
    "danger": "Danger",
    "error": "Error",
    "seealso": "See also",
    "admonition": "",
    "dropdown": "",
    "margin": "",
    "sidebar": "",
    "topic": "",
    "epigraph": "",
    "pull-quote": "",
    "highlights": "",
    "card": "",
    "aside": "",
}
CODE_DIRECTIVES = ("code", "code-block", "sourcecode", "code-cell", "ipython")
DROPPED_DIRECTIVES = (
    "toctree",
    "tableofcontents",
    "bibliography",
    "eval-rst",
    "raw",
    "only",
    "index",
    "glossary-index",
    "solution",
    "solution-start",
    "solution-end",
)
# An inline code span, with or without a role in front of it: ``{name}`content` ``.
_SPAN = re.compile(
    r"(?P<role>\{(?P<name>[A-Za-z][\w:+.-]*)\})?(?P<ticks>`+)(?P<body>.+?)(?<!`)(?P=ticks)(?!`)",
    re.S,
)
_TARGET = re.compile(r"^\(([^()\s]+)\)=\s*$")
# What Jupyter would show raw: a role, a directive fence, a MyST target line.
# Roles are counted with their backtick: "\\mathrm{doc}(i)" in math is no role.
RAW_MARKUP = re.compile(
    r"\{glue|:::\{|```\{|\{term\}`|\{cite|\{doc\}`|\{ref\}`|\{numref\}`"
    r"|\{[a-z][\w:-]*\}`|^\([^()\s]+\)=\s*$",
    re.M,
)


def count_raw_markup(text: str) -> Counter:
    """How many of each raw MyST construct ``text`` holds (what Jupyter shows raw)."""
    found = Counter()
    for match in RAW_MARKUP.finditer(text):
        token = match.group(0)
        found["target" if token.startswith("(") else token.rstrip("`")] += 1
    return found


class Page:
    """What rendering one notebook's Markdown needs."""

    def __init__(self, path: Path | None, glue: dict[str, dict], book: Book | None):
        self.path, self.glue, self.book = path, glue, book

    def number(self, label: str, kind: str) -> str | None:
        table = (
            (self.book.exercises if kind == "exercise" else self.book.figures)
            if self.book
            else {}
        )
        return table.get(label)


def render_markdown(text: str, page: Page) -> str:
    """MyST Markdown as Markdown that Jupyter renders: see the module's docstring."""
    lines = text.split("\n")
    out: list[str] = []
    prose: list[str] = []

    def flush():
        if prose:
            out.append(render_inline("\n".join(prose), page))
            prose.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        code = _CODE_FENCE.match(line)
        opened = _OPEN.match(line)
        if code and not opened:
            flush()
            end = _end_of_block(lines, i, code["fence"])
            out.append("\n".join(lines[i : end + 1]))
            i = end + 1
        elif opened:
            flush()
            end = _end_of_block(lines, i, opened["fence"])
            inner = (
                lines[i + 1 : end]
                if _closes(lines[end], opened["fence"]) and end > i
                else lines[i + 1 :]
            )
            out.append(
                _render_directive(opened["name"], opened["arg"].strip(), inner, page)
            )
            i = end + 1
        elif (
            _TARGET.match(line) or line.strip() == "+++" or re.match(r"^%(\s|$)", line)
        ):
            i += 1  # a MyST target, block break or comment: nothing to show
        else:
            prose.append(line)
            i += 1
    flush()
    result = "\n".join(part for part in out)
    return re.sub(r"\n{3,}", "\n\n", result).strip("\n")


def _render_directive(name: str, arg: str, inner: list[str], page: Page) -> str:
    options, body_lines = _options(inner)
    body = "\n".join(body_lines).strip("\n")
    if name in DROPPED_DIRECTIVES:
        return ""
    if name == "exercise":
        label = options.get("label", "")
        number = page.number(label, "exercise") if label else None
        head = f"**Exercise {number}**" if number else "**Exercise**"
        if label:
            head += f" ({label})"
        if arg:
            head += f": {render_inline(arg, page)}"
        return f"{head}\n\n{render_markdown(body, page)}"
    if name in ADMONITIONS:
        title = render_inline(arg, page) if arg else ADMONITIONS[name]
        inside = render_markdown(body, page)
        quoted = "\n".join(f"> {line}" if line else ">" for line in inside.split("\n"))
        return (f"> **{title}**\n>\n" if title else "") + quoted
    if name in CODE_DIRECTIVES:
        language = arg or options.get("language", "")
        return f"```{language}\n{body}\n```"
    if name == "math":
        return f"$$\n{body}\n$$"
    if name == "literalinclude":
        return _literalinclude(arg, options, page)
    if name in ("figure", "image"):
        alt = options.get("alt", "")
        image = f"![{alt}]({arg})"
        return _with_caption(image, body, options.get("name"), page)
    if name.startswith("glue"):
        bundle = _glued(arg, page)
        if bundle is None:
            raise ValueError(f"{page.path}: nothing is glued under the name {arg!r}")
        shown = _bundle_markdown(bundle, options.get("alt", ""))
        return _with_caption(shown, body, options.get("name"), page)
    # Anything else: its content, as plain Markdown.
    return render_markdown(body, page)


def _with_caption(shown: str, caption: str, label: str | None, page: Page) -> str:
    if not caption:
        return shown
    number = page.number(label, "figure") if label else None
    head = f"**Fig. {number}.** " if number else ""
    return f"{shown}\n\n{head}{render_inline(caption, page)}"


def _glued(key: str, page: Page) -> dict | None:
    if "::" in key:  # glued on another page: path::name
        doc, key = key.split("::", 1)
        if page.path is None:
            return None
        other = (page.path.parent / doc).with_suffix(".ipynb")
        if not other.exists():
            return None
        return glue_data(_read(other)).get(key)
    return page.glue.get(key)


def _literalinclude(arg: str, options: dict[str, str], page: Page) -> str:
    base = (
        page.book.root
        if arg.startswith("/") and page.book
        else (page.path.parent if page.path else ROOT)
    )
    path = (base / arg.lstrip("/")).resolve()
    language = options.get("language", "python" if path.suffix == ".py" else "")
    caption = options.get("caption", "")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return f"See `{arg}`."
    if "pyobject" in options:
        text = _pyobject(text, options["pyobject"]) or text
    if "lines" in options:
        chosen = []
        all_lines = text.split("\n")
        for part in options["lines"].split(","):
            start, _, stop = part.partition("-")
            first = int(start or 1)
            last = int(stop) if stop else (first if not _ else len(all_lines))
            chosen += all_lines[first - 1 : last]
        text = "\n".join(chosen)
    if "start-after" in options and options["start-after"] in text:
        text = text.split(options["start-after"], 1)[1].split("\n", 1)[-1]
    if "end-before" in options and options["end-before"] in text:
        text = text.split(options["end-before"], 1)[0].rsplit("\n", 1)[0]
    code = f"```{language}\n{text.strip(chr(10))}\n```"
    return f"*{render_inline(caption, page)}*\n\n{code}" if caption else code


def _pyobject(source: str, dotted: str) -> str | None:
    """The source of ``Class.method`` or ``function`` in a module, as ``:pyobject:``."""
    try:
        scope = ast.parse(source).body
    except SyntaxError:
        return None
    node = None
    for part in dotted.split("."):
        node = next(
            (
                n
                for n in scope
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and n.name == part
            ),
            None,
        )
        if node is None:
            return None
        scope = node.body
    lines = source.split("\n")
    text = _segment(node, lines)
    indent = min(
        len(line) - len(line.lstrip()) for line in text.split("\n") if line.strip()
    )
    return "\n".join(line[indent:] for line in text.split("\n"))


def render_inline(text: str, page: Page) -> str:
    """Roles in running text; code spans without a role are left as they are."""

    def replace(match: re.Match) -> str:
        if not match["role"]:
            return match.group(0)
        return _render_role(match["name"], match["body"], page)

    return _SPAN.sub(replace, text)


def _split_glue(body: str) -> tuple[str, str]:
    """``name:.2f`` -> (name, .2f); ``page::name`` keeps its page; no spec -> ""."""
    doc, sep, rest = body.strip().rpartition("::")
    name, colon, spec = rest.partition(":")
    return (f"{doc}::{name}" if sep else name), (spec if colon else "")


def _explicit(body: str) -> tuple[str | None, str]:
    """``text <target>`` -> (text, target); ``target`` -> (None, target)."""
    match = re.match(r"^(.*\S)\s*<([^<>]+)>$", body.strip(), re.S)
    if match:
        return match.group(1), match.group(2).strip()
    return None, body.strip()


def _render_role(name: str, body: str, page: Page) -> str:
    if name in ("glue", "glue:", "glue:any", "glue:text", "glue:md"):
        key, spec = (
            _split_glue(body) if name in ("glue:text", "glue:md") else (body, "")
        )
        bundle = _glued(key, page)
        if bundle is None:
            raise ValueError(f"{page.path}: nothing is glued under the name {key!r}")
        if name == "glue:text":
            return format_plain_text(_bundle_text(bundle), spec)
        return _bundle_markdown(bundle)
    if name.startswith("cite"):
        keys = [k.strip() for k in _explicit(body)[1].split(",") if k.strip()]
        bib = page.book.bib if page.book else {}
        textual = name in ("cite:t", "cite:ts", "cite:author", "cite:year")
        if name == "cite:year":
            return "; ".join(bib.get(k, {}).get("year", k) for k in keys)
        parts = [cite_text(k, bib, textual=textual) for k in keys]
        return "; ".join(parts) if textual else f"({'; '.join(parts)})"
    if name == "term":
        text, target = _explicit(body)
        return text or target
    if name == "doc":
        return _doc_link(body, page)
    if name in ("ref", "numref", "eq"):
        text, label = _explicit(body)
        if name == "eq":
            return f"({label})"
        exercise = page.number(label, "exercise")
        figure = page.number(label, "figure")
        number = exercise or figure
        if text and number and ("%s" in text or "{number}" in text):
            return text.replace("%s", number).replace("{number}", number)
        if text:
            return text
        if exercise:
            return f"Exercise {exercise}"
        if figure:
            return f"Fig. {figure}"
        return label
    if name == "math":
        return f"${body}$"
    if name in ("sup", "sub", "kbd"):
        return f"<{name}>{body}</{name}>"
    if name == "abbr":
        return re.sub(r"\s*\([^()]*\)\s*$", "", body)
    # {func}, {class}, {meth}, {py:...}, {mod}, {attr}, {download}...: the name as code
    text, target = _explicit(body)
    if text:
        return text
    shown = (
        target.lstrip("~").split(".")[-1]
        if target.startswith("~")
        else target.lstrip("!")
    )
    return f"`{shown}`"


def _doc_link(body: str, page: Page) -> str:
    text, target = _explicit(body)
    base = page.path.parent if page.path else ROOT
    root = page.book.root if page.book else ROOT
    stem = (root / target.lstrip("/")) if target.startswith("/") else (base / target)
    path = _page_path(stem)
    if path is None:
        return text or target
    title = text or (page.book.titles.get(path) if page.book else None) or target
    if path.suffix != ".ipynb":  # a page of the website only (the glossary...)
        return title
    if page.path is None:
        return f"[{title}]({target}.ipynb)"
    relative = Path(_relpath(path, page.path.resolve().parent))
    return f"[{title}]({relative.as_posix()})"


def _relpath(path: Path, start: Path) -> str:
    return os.path.relpath(path, start)


# --------------------------------------------------------------------------------------
# Answer cells: what a student must not see
# --------------------------------------------------------------------------------------

_EXERCISE_MENTION = re.compile(r"\bex-[\w-]+|\bexercises?\b", re.I)


def answer_cells(nb: dict) -> dict[int, str]:
    """Index -> why, for each code cell that answers an exercise (the leak rule).

    - metadata ``softmaxbook.answers`` names the exercise(s) it answers;
    - a hidden verification cell (``remove-cell``) after the page's first
      exercise: a page keeps its exercises and their solutions at its end;
    - a hidden verification cell that names an exercise (a label ``ex-...`` or
      the word "exercise").
    """
    first_exercise = next(
        (
            i
            for i, cell in enumerate(nb["cells"])
            if cell["cell_type"] == "markdown"
            and re.search(r"^[ \t]*(:{3,}|`{3,})\{exercise\}", _source(cell), re.M)
        ),
        None,
    )
    found = {}
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        metadata = cell.get("metadata", {})
        tags = metadata.get("tags", [])
        answers = metadata.get("softmaxbook", {}).get("answers")
        if answers:
            found[i] = f"answers {answers}"
        elif (
            VERIFICATION_TAG in tags
            and first_exercise is not None
            and i > first_exercise
        ):
            found[i] = "a hidden check after the page's first exercise"
        elif VERIFICATION_TAG in tags and _EXERCISE_MENTION.search(_source(cell)):
            found[i] = "a hidden check that names an exercise"
    return found


def _bound_and_used(source: str) -> tuple[set[str], set[str]]:
    """Names a cell binds at any level, and names it reads."""
    try:
        tree = ast.parse(colab_cell._without_magics(source))
    except SyntaxError:
        return set(), set()
    bound, used = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return bound, used


def check_runnable(cells: list[dict], removed: list[tuple[dict, str]], path) -> None:
    """Stop if a kept cell reads a name that only a removed answer cell defines."""
    only_removed = set()
    for cell, _ in removed:
        only_removed |= _bound_and_used(_source(cell))[0]
    defined: set[str] = set()
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        bound, used = _bound_and_used(_source(cell))
        missing = (used - defined - bound) & only_removed
        if missing:
            raise ValueError(
                f"{path}: a cell uses {sorted(missing)}, defined only in a cell the "
                f"student version removes as an answer; define it in a visible cell"
            )
        defined |= bound


# --------------------------------------------------------------------------------------
# The student version
# --------------------------------------------------------------------------------------


def student_version(
    nb: dict,
    path: Path | None = None,
    *,
    book: Book | None = None,
    colab: str | None = None,
) -> tuple[dict, dict]:
    """The student version of a notebook (a dict from ``json.load``), and counts.

    ``path`` places the notebook in the book (numbers, links, included files);
    ``colab`` is what the Colab preamble installs: a tag or commit, ``""`` for
    the repository's default branch, None for no preamble.
    """
    if book is None and path is not None and _inside(path, ROOT / "chapters"):
        book = load_book(ROOT)
    page = Page(path=path.resolve() if path else None, glue=glue_data(nb), book=book)
    nb = copy.deepcopy(nb)
    counts = {"solutions": 0, "stubs": 0, "cleared": 0, "answers": 0, "rendered": 0}
    answers = answer_cells(nb)
    cells, removed, gated = [], [], False
    for index, cell in enumerate(nb["cells"]):
        tags = cell.get("metadata", {}).get("tags", [])
        source = _source(cell)
        if cell["cell_type"] == "markdown":
            if SOLUTION_TAG in tags:
                counts["solutions"] += 1
                continue
            text, n_removed, gated = strip_solutions(source, gated)
            counts["solutions"] += n_removed
            rendered = render_markdown(text, page)
            counts["rendered"] += sum(count_raw_markup(text).values())
            if rendered.strip():
                cell["source"] = _as_lines(rendered)
                cells.append(cell)
            continue
        # A code cell between {solution-start} and {solution-end} goes, unless it is
        # the answer of an implement-it-yourself exercise (it becomes the stub the
        # student fills in) or the checker that grades it.
        if gated and not set(tags) & {SOLUTION_TAG, EXERCISE_TAG}:
            removed.append((cell, "inside a gated solution"))
            continue
        if index in answers and not set(tags) & {SOLUTION_TAG, EXERCISE_TAG}:
            removed.append((cell, answers[index]))
            counts["answers"] += 1
            continue
        if cell["cell_type"] == "code" and SOLUTION_TAG in tags:
            custom = cell.get("metadata", {}).get("softmaxbook", {}).get("stub")
            cell["source"] = _as_lines(custom if custom is not None else stub(source))
            # The student edits this cell: it is no longer hidden on a page.
            cell["metadata"]["tags"] = [
                ANSWER_TAG if t == SOLUTION_TAG else t
                for t in tags
                if t not in HIDING_TAGS
            ]
            cell["metadata"].pop("softmaxbook", None)
            cell["metadata"].get("jupyter", {}).pop("source_hidden", None)
            _clear(cell)
            counts["stubs"] += 1
        elif cell["cell_type"] == "code" and EXERCISE_TAG in tags:
            _clear(cell)
            counts["cleared"] += 1
        elif cell["cell_type"] == "code" and "hide-input" in tags:
            # hidden on the website (plotting code): collapsed in JupyterLab
            cell["metadata"].setdefault("jupyter", {})["source_hidden"] = True
        cells.append(cell)
        caption = _caption_cell(cell, page)
        if caption is not None:
            cells.append(caption)
    check_runnable(cells, removed, path or "<notebook>")
    nb["cells"] = cells
    if colab is not None:
        colab_cell.apply(nb, ref=colab or None, repo=colab_cell.repository_url(ROOT))
    nb["metadata"].setdefault("softmaxbook", {})["student_version"] = True
    return nb, counts


def _caption_cell(cell: dict, page: Page) -> dict | None:
    """A figure's caption, which Jupyter does not show, as a Markdown cell below it."""
    if cell["cell_type"] != "code":
        return None
    figure = cell.get("metadata", {}).get("mystnb", {}).get("figure", {})
    caption = figure.get("caption")
    if not caption:
        return None
    number = page.number(figure.get("name", ""), "figure")
    head = f"**Fig. {number}.** " if number else ""
    text = head + render_markdown(str(caption), page)
    caption_cell = {"cell_type": "markdown", "metadata": {}, "source": _as_lines(text)}
    if "id" in cell:  # nbformat 4.5 ids: 1 to 64 letters, digits, - and _
        caption_cell["id"] = f"{cell['id']}"[:56] + "-caption"
    return caption_cell


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
    except ValueError:
        return False
    return True


def _as_lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _clear(cell: dict) -> None:
    cell["outputs"] = []
    cell["execution_count"] = None


def target_path(path: Path, out_dir: Path) -> Path:
    """Where the student version of ``path`` goes: its place under chapters/ kept."""
    chapters = ROOT / "chapters"
    if _inside(path, chapters):
        return out_dir / path.resolve().relative_to(chapters.resolve())
    return out_dir / path.name


def write_student_notebook(
    path: Path, out_dir: Path, ref: str | None = "release"
) -> tuple[Path, dict]:
    """Write the student version of ``path`` under ``out_dir``; return its path, counts.

    ``ref`` is what the Colab preamble installs: ``"release"`` (``v`` +
    ``softmaxbook.__version__``), a tag or commit, ``""`` for the repository's
    default branch, or None for no preamble.
    """
    nb = _read(path)
    if ref == "release":
        ref = colab_cell.release_ref(ROOT)
    student, counts = student_version(nb, path, colab=ref)
    _validate(student, path)
    target = target_path(path, out_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(
        json.dumps(student, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    return target, counts


def _validate(nb: dict, path: Path) -> None:
    import nbformat  # Jupyter's own schema check

    nbformat.validate(nbformat.from_dict(nb))
    for index, cell in enumerate(nb["cells"]):
        text = _source(cell)
        if re.search(r"\{solution(-start|-end)?\}", text) or SOLUTION_TAG in cell.get(
            "metadata", {}
        ).get("tags", []):
            raise ValueError(
                f"{path}: cell {index} of the student version still holds a solution"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "notebooks",
        nargs="*",
        type=Path,
        help="notebooks to convert (default: every page under chapters/)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "_build" / "student",
        help="where to write them (default: _build/student)",
    )
    parser.add_argument(
        "--ref",
        default="release",
        help="what the first cell installs in Colab: 'release' (default: v + "
        "softmaxbook.__version__), a tag or commit, 'default' (the repository's "
        "default branch) or 'none' (no install cell)",
    )
    args = parser.parse_args(argv)
    ref = {"none": None, "default": ""}.get(args.ref, args.ref)
    notebooks = args.notebooks or colab_cell.chapter_pages(ROOT)
    if not notebooks:
        parser.error("no notebooks found")
    for path in notebooks:
        target, counts = write_student_notebook(path, args.out, ref=ref)
        print(
            f"{path.name} -> {target}: {counts['solutions']} solution(s) and "
            f"{counts['answers']} hidden answer cell(s) removed, {counts['stubs']} "
            f"answer cell(s), {counts['cleared']} exercise output(s) cleared, "
            f"{counts['rendered']} MyST construct(s) rendered"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
