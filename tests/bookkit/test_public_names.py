"""bookkit uses only softmaxbook's public names.

The book's harness is a client of the library like any course: it imports the
names a course may import, never a private module (``softmaxbook._validate``,
``softmaxbook.kernels._triton``) or a private name (``ring._Ring``). Every
import statement of every bookkit module is read from its source, function-level
imports included.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BOOKKIT = Path(__file__).resolve().parents[2] / "lib" / "bookkit"
SOURCES = sorted(BOOKKIT.rglob("*.py"))


def _private(dotted: str) -> bool:
    return any(
        part.startswith("_") and not part.startswith("__") for part in dotted.split(".")
    )


def offences(source: str) -> list[str]:
    """The imports of softmaxbook's private modules or names in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "softmaxbook" and _private(alias.name):
                    found.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.split(".")[0] != "softmaxbook":
                continue
            names = [a.name for a in node.names]
            if _private(node.module) or any(_private(n) for n in names):
                found.append(
                    f"line {node.lineno}: from {node.module} import {', '.join(names)}"
                )
    return found


def test_the_sources_are_read():
    assert len(SOURCES) >= 10
    assert offences("from softmaxbook._validate import check_tensor")
    assert offences("from softmaxbook.kernels import _triton")
    assert offences("import softmaxbook.attention.ring._x")
    assert not offences("from softmaxbook import kernels, flash_attention")
    assert not offences("from ._checks import check_tensor")  # bookkit's own


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(BOOKKIT)))
def test_bookkit_imports_only_public_names_of_softmaxbook(path):
    found = offences(path.read_text(encoding="utf-8"))
    assert not found, f"{path.relative_to(BOOKKIT)} imports private names: {found}"
