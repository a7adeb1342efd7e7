"""Put the Colab install preamble at the top of each notebook's first code cell.

Usage::

    python tools/colab_cell.py [--ref REF] [--check] [NOTEBOOK ...]

edits each notebook (by default every page under ``chapters/``) in place so
that its first code cell starts with::

    import importlib.util

    # In Colab, or any Python without this book's library: install it first.
    if importlib.util.find_spec("bookkit") is None:
        REPO = "https://github.com/softmaxbook/softmax-in-attention"
        %pip install --quiet "softmaxbook[book] @ git+{REPO}"

Where the library is installed (a laptop set up with ``pip install -e .``, the
book's tests) the ``if`` is false and the cell prints what it printed before,
so stored outputs do not change. In Colab, or any fresh Python, it installs
the library with the chapters' extra (entmax, tqdm, Triton on Linux) from the
repository; ``--ref v0.2.0`` pins a tag or a commit (``make student`` pins the
release of the checkout, ``v`` + ``softmaxbook.__version__``). Without
``--ref`` it installs the repository's default branch, whose notebooks the
website's "Launch in Colab" button opens.

A page whose first cell imports a package it names in
``bk.setup_notebook(requires=(...))`` (chapter 6 imports ``entmax``) also gets
``require(...)`` before that import, so a missing package is reported with its
name, why the page needs it and the install line, not as a bare
``ModuleNotFoundError``.

Running the script again replaces the preamble (for example with another
``--ref``) and changes nothing else. ``--check`` edits nothing and exits with
status 1, naming the notebooks whose first code cell lacks the current
preamble. Only the standard library is used.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_REPO = "https://github.com/softmaxbook/softmax-in-attention"
PACKAGE = "softmaxbook[book]"
MARK = "# In Colab, or any Python without this book's library: install it first."

# The preamble as this script writes it, with any repository, ref and requirement
# line, so that a second run finds and replaces the first one's.
_EXISTING = re.compile(
    r"\Aimport importlib\.util\n\n" + re.escape(MARK) + r"\n"
    r'if importlib\.util\.find_spec\("bookkit"\) is None:\n'
    r'    REPO = "[^"\n]*"\n'
    r"    %pip install [^\n]*\n"
    r"(?:\nfrom bookkit\.notebook import require\n\n"
    r"require\([^\n]*\)[^\n]*\n)?"
    r"\n*"
)


def repository_url(root: Path = ROOT) -> str:
    """The book's repository, from ``_config.yml`` (``repository: url:``)."""
    config = root / "_config.yml"
    if config.exists():
        match = re.search(
            r"^repository:\s*\n(?:[ \t]+.*\n)*?[ \t]+url:\s*(\S+)",
            config.read_text(encoding="utf-8"),
            re.M,
        )
        if match:
            return match.group(1).strip("\"'")
    return DEFAULT_REPO


def release_ref(root: Path = ROOT) -> str:
    """``v`` + ``softmaxbook.__version__``, read from the source (no import)."""
    text = (root / "lib" / "softmaxbook" / "__init__.py").read_text(encoding="utf-8")
    match = re.search(r'^__version__\s*=\s*"([^"]+)"', text, re.M)
    if not match:
        raise ValueError("lib/softmaxbook/__init__.py defines no __version__")
    return "v" + match.group(1)


def early_requirements(source: str) -> list[str]:
    """Packages named in ``setup_notebook(requires=...)`` that the cell imports.

    Those imports run before ``setup_notebook`` could say what is missing, so
    the preamble checks them first.
    """
    try:
        tree = ast.parse(_without_magics(source))
    except SyntaxError:
        return []
    required: list[str] = []
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _name(node.func) == "setup_notebook":
            for keyword in node.keywords:
                if keyword.arg == "requires":
                    try:
                        value = ast.literal_eval(keyword.value)
                    except ValueError:
                        continue
                    required += [value] if isinstance(value, str) else list(value)
        elif isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imported.add(node.module.split(".")[0])
    return [name for name in required if name in imported]


def _name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def _without_magics(source: str) -> str:
    """IPython's ``%`` and ``!`` lines as ``pass``, so that ``ast`` parses the rest."""
    return re.sub(r"(?m)^([ \t]*)[%!].*$", r"\1pass", source)


def preamble(
    ref: str | None = None, repo: str = DEFAULT_REPO, requires: Sequence[str] = ()
) -> str:
    """The lines that start the first code cell (ending in a blank line)."""
    at = f"@{ref}" if ref else ""
    lines = [
        "import importlib.util",
        "",
        MARK,
        'if importlib.util.find_spec("bookkit") is None:',
        f'    REPO = "{repo}"',
        f'    %pip install --quiet "{PACKAGE} @ git+{{REPO}}{at}"',
    ]
    if requires:
        names = ", ".join(json.dumps(name) for name in requires)
        names = f"({names},)" if len(requires) > 1 else names
        lines += [
            "",
            "from bookkit.notebook import require",
            "",
            f"require({names})  # says why the page needs it, and how to install it",
        ]
    return "\n".join(lines) + "\n\n"


def strip_preamble(source: str) -> str:
    """The cell's source without a preamble written by this script."""
    return _EXISTING.sub("", source, count=1)


def with_preamble(source: str, ref: str | None = None, repo: str = DEFAULT_REPO) -> str:
    """``source`` with the preamble at its top (replacing an earlier one)."""
    body = strip_preamble(source)
    return preamble(ref, repo, early_requirements(body)) + body


def has_preamble(source: str, ref: str | None = None, repo: str = DEFAULT_REPO) -> bool:
    """Whether ``source`` starts with the current preamble for this ref and repo."""
    return source == with_preamble(source, ref, repo)


def installed_ref(source: str) -> str | None:
    """The tag or commit the cell's preamble installs (None: the default branch)."""
    match = re.search(r'%pip install [^\n]*@ git\+\{REPO\}(?:@([^"\s]+))?"', source)
    return match.group(1) if match else None


def first_code_cell(nb: dict) -> dict | None:
    return next((c for c in nb["cells"] if c["cell_type"] == "code"), None)


def source_of(cell: dict) -> str:
    source = cell["source"]
    return "".join(source) if isinstance(source, list) else source


def apply(nb: dict, ref: str | None = None, repo: str = DEFAULT_REPO) -> bool:
    """Put the preamble into ``nb``'s first code cell (in place); True if it changed."""
    cell = first_code_cell(nb)
    if cell is None:
        return False
    before = source_of(cell)
    after = with_preamble(before, ref, repo)
    if after == before:
        return False
    cell["source"] = after.splitlines(keepends=True)
    return True


def write_notebook(path: Path, nb: dict) -> None:
    """Write as Jupyter does (nbformat's layout), so the diff is only the cell."""
    text = json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    path.write_text(text, encoding="utf-8")


def chapter_pages(root: Path = ROOT) -> list[Path]:
    return sorted(
        p
        for p in (root / "chapters").rglob("*.ipynb")
        if ".ipynb_checkpoints" not in p.parts
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    parser.add_argument(
        "--ref",
        default=None,
        help="a tag or commit to install (default: the repository's default branch);"
        " 'release' means v + softmaxbook.__version__",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="change nothing; exit 1 if a notebook lacks the preamble",
    )
    args = parser.parse_args(argv)
    ref = release_ref() if args.ref == "release" else args.ref
    repo = repository_url()
    notebooks = args.notebooks or chapter_pages()
    missing = []
    for path in notebooks:
        nb = json.loads(path.read_text(encoding="utf-8"))
        if args.check:
            cell = first_code_cell(nb)
            if cell is None or not has_preamble(source_of(cell), ref, repo):
                missing.append(path)
            continue
        changed = apply(nb, ref, repo)
        if changed:
            write_notebook(path, nb)
        print(f"{path}: {'preamble written' if changed else 'unchanged'}")
    if args.check:
        for path in missing:
            print(f"{path}: the first code cell lacks the Colab preamble")
        print(f"{len(notebooks) - len(missing)} of {len(notebooks)} have it")
        return 1 if missing else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
