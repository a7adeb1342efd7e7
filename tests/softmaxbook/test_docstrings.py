"""The docstrings of the public API: annotated, and their "Equivalent to" executed.

mypy (``make typecheck``) checks the annotations of every function in lib/ and
``make doctest`` runs every docstring example; these tests say the same of the
public names in words a failing test can point at: a public function without
annotations, or an "Equivalent to" snippet that no example executes.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest

import softmaxbook


def _public_modules() -> Iterator[ModuleType]:
    """softmaxbook and its public submodules (no ``_private`` part in the name)."""
    yield softmaxbook
    for info in pkgutil.walk_packages(softmaxbook.__path__, prefix="softmaxbook."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        yield importlib.import_module(info.name)


def _public_functions() -> dict[str, Callable[..., Any]]:
    """Every function a public module lists in its ``__all__``, by its qualified name.

    ``vars()``, not ``getattr``: a deprecated module's ``__getattr__`` would warn.
    Classes contribute their public methods defined in this library.
    """
    found: dict[str, Callable[..., Any]] = {}
    for module in _public_modules():
        for name in vars(module).get("__all__", ()):
            obj = vars(module).get(name)
            if inspect.isfunction(obj):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
            elif inspect.isclass(obj) and obj.__module__.startswith("softmaxbook"):
                for attr, member in vars(obj).items():
                    fn = member.__func__ if isinstance(member, staticmethod) else member
                    if inspect.isfunction(fn) and not attr.startswith("_"):
                        found[f"{obj.__module__}.{fn.__qualname__}"] = fn
    return found


FUNCTIONS = _public_functions()


def test_the_public_api_is_found():
    # A walk that found nothing would pass every test below.
    assert len(FUNCTIONS) > 100
    assert "softmaxbook.masking.masked_softmax" in FUNCTIONS


def _unannotated(fn: Callable[..., Any]) -> list[str]:
    missing = [
        name
        for name, p in inspect.signature(fn).parameters.items()
        if p.annotation is inspect.Parameter.empty
        and name not in ("self", "cls", "ctx")
    ]
    if inspect.signature(fn).return_annotation is inspect.Signature.empty:
        missing.append("return")
    return missing


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_every_public_function_is_annotated(name):
    assert not _unannotated(FUNCTIONS[name]), (
        f"{name} has no annotation for {_unannotated(FUNCTIONS[name])}"
    )


@pytest.mark.parametrize(
    "name",
    sorted(n for n, f in FUNCTIONS.items() if "Equivalent to" in (f.__doc__ or "")),
)
def test_every_equivalent_to_snippet_is_an_executed_example(name):
    # `make doctest` runs the >>> lines; a snippet in prose alone is never run.
    assert ">>>" in FUNCTIONS[name].__doc__, (
        f"{name}'s docstring says 'Equivalent to' but shows no >>> example that "
        "checks it"
    )


def test_the_unannotated_check_catches_a_missing_annotation():
    def half(x: int, y):  # y unannotated: the point of the test
        return x

    assert _unannotated(half) == ["y", "return"]


def test_no_docstring_holds_a_control_character():
    # A backslash in a docstring that is not a raw string is an escape: ":math:`a
    # \bmod b`" holds a backspace, and MathJax shows "Math input error" on the API
    # page. Every docstring of the three packages is read from its source.
    import ast
    import re
    from pathlib import Path

    lib = Path(softmaxbook.__file__).resolve().parents[1]
    bad = []
    for path in sorted(lib.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(
                node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
            ):
                doc = ast.get_docstring(node, clean=False) or ""
                if re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f]", doc):
                    bad.append(f"{path.relative_to(lib)}: {getattr(node, 'name', '')}")
    assert not bad, f"docstrings with control characters (use r'''...'''): {bad}"
