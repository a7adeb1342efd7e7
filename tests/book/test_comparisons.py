"""No page compares torch's attention with itself and calls it agreement.

Since 0.2, ``sb.scaled_dot_product_attention`` and ``sb.flash_attention`` hand a call
that torch's fused kernel can serve to that kernel. A page that compares such a call
with ``torch.nn.functional.scaled_dot_product_attention`` compares torch with torch:
the check cannot fail, and the sentence it supports ("the library agrees with
torch") says nothing. Where a page compares the two, the library's call takes its own
code: ``explicit=True``, or a ``block_size=`` (the tile loops), or a normalizer other
than softmax, which torch's kernel cannot compute.

The rule reads each code cell's syntax: a value computed by one of these library calls
(without what forces its own path) and a value computed by torch's SDPA, both
reaching one comparison (``allclose``, ``assert_close``, ``equal``, a difference
``a - b``, ``isclose``) in the same cell, is a self-comparison.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted(
    p
    for p in (ROOT / "chapters").rglob("*.ipynb")
    if ".ipynb_checkpoints" not in p.parts
)
LIBRARY_CALLS = {"scaled_dot_product_attention", "flash_attention", "sdpa"}
COMPARISONS = {"allclose", "assert_close", "equal", "isclose", "array_equal"}
_MAGIC = re.compile(r"^\s*[%!].*$", re.MULTILINE)


def _call_name(node: ast.AST) -> tuple[str, str] | None:
    """``(owner, name)`` of a call such as ``sb.flash_attention(...)``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        owner = node.func.value
        if isinstance(owner, ast.Name):
            return owner.id, node.func.attr
        if isinstance(owner, ast.Attribute):  # torch.nn.functional.x
            return owner.attr, node.func.attr
    return None


def _forces_own_path(call: ast.Call) -> bool:
    """The library's own code runs: explicit=True, a block size, another normalizer."""
    for kw in call.keywords:
        if kw.arg == "explicit" and not (
            isinstance(kw.value, ast.Constant) and kw.value.value is False
        ):
            return True
        if kw.arg == "block_size" and not (
            isinstance(kw.value, ast.Constant) and kw.value.value is None
        ):
            return True
        if kw.arg == "normalizer" and not (
            isinstance(kw.value, ast.Constant) and kw.value.value == "softmax"
        ):
            return True
    return False


def _kind(node: ast.AST) -> str | None:
    """ "lib" for the library's fused-eligible call, "torch" for torch's SDPA."""
    named = _call_name(node)
    if named is None:
        return None
    owner, name = named
    if owner == "sb" and name in LIBRARY_CALLS and isinstance(node, ast.Call):
        return None if _forces_own_path(node) else "lib"
    if owner in {"F", "functional"} and name == "scaled_dot_product_attention":
        return "torch"
    return None


def self_comparisons(source: str) -> list[str]:
    """The comparisons in one cell between a library value and torch's SDPA."""
    tree = ast.parse(_MAGIC.sub("", source))
    kinds: dict[str, str] = {}
    for node in ast.walk(tree):  # names bound to either kind of result
        if isinstance(node, ast.Assign):
            kind = next(filter(None, map(_kind, ast.walk(node.value))), None)
            if kind:
                for target in node.targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            kinds[name.id] = kind

    def reached(node: ast.AST) -> set[str]:
        found = set()
        for sub in ast.walk(node):
            kind = _kind(sub)
            if kind:
                found.add(kind)
            if isinstance(sub, ast.Name) and sub.id in kinds:
                found.add(kinds[sub.id])
        return found

    hits = []
    for node in ast.walk(tree):
        named = _call_name(node)
        is_cmp = (named and named[1] in COMPARISONS) or (
            isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub)
        )
        if is_cmp and reached(node) == {"lib", "torch"}:
            hits.append(ast.unparse(node)[:120])
    return hits


def test_the_rule_catches_a_self_comparison():
    cell = (
        "out = sb.flash_attention(q, k, v, is_causal=True)\n"
        "ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)\n"
        "print((out - ref).abs().max())\n"
    )
    assert self_comparisons(cell)
    assert not self_comparisons(
        cell.replace("is_causal=True)\nref", "explicit=True)\nref")
    )
    inline = "torch.allclose(sb.scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v))"  # noqa: E501
    assert self_comparisons(inline)
    assert not self_comparisons(
        inline.replace("(q, k, v), F", "(q, k, v, block_size=8), F")
    )


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_page_compares_torch_with_itself(notebook):
    nb = json.loads(notebook.read_text())
    found = []
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            found += [
                f"cell {index}: {hit}"
                for hit in self_comparisons("".join(cell["source"]))
            ]
    assert not found, (
        "these compare torch's SDPA with a library call that hands the work to it; "
        "pass explicit=True (or a block_size) so the library's own code runs:\n"
        + "\n".join(found)
    )
