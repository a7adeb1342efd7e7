"""The library's layers: chapters -> public API -> modules -> kernels, with no cycle.

Every import statement of every module is read from its source (function-level
imports included, since they hide cycles from a plain import), and:

- every module imports;
- the graph of imports between the library's modules has no cycle;
- no module imports a private (``_name``) function, class or constant of
  another module: private helpers stay in their module, and what several
  modules share lives in ``softmaxbook._validate``;
- the kernels import nothing of the library but ``_validate`` and themselves;
- no module imports the package ``softmaxbook`` itself (the public API is the
  layer above the modules, not below);
- the layer table of ``lib/README.md`` names every module, and no module imports
  one of a layer below it in that table.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
import re
from pathlib import Path

import pytest

import softmaxbook

ROOT = softmaxbook.__name__
MODULES = sorted(
    info.name for info in pkgutil.walk_packages(softmaxbook.__path__, prefix=ROOT + ".")
)


def _source(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    return Path(spec.origin)


def _is_package(module: str) -> bool:
    return _source(module).name == "__init__.py"


def _package(module: str) -> str:
    return module if _is_package(module) else module.rpartition(".")[0]


def _is_module(name: str) -> bool:
    return name == ROOT or name in MODULES


def _imports(module: str) -> list[tuple[str, list[str]]]:
    """Each import of ``module`` as (absolute module imported from, names imported)."""
    tree = ast.parse(_source(module).read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the package, up level - 1 more packages
                base = _package(module).split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            found.append((target, [alias.name for alias in node.names]))
    return found


def _edges(module: str) -> set[str]:
    """The library modules that importing ``module`` runs (its parents excluded)."""
    targets = set()
    for target, names in _imports(module):
        for name in [target] + [f"{target}.{n}" for n in names]:
            while _is_module(name) and name != ROOT:
                targets.add(name)  # importing a.b.c imports a.b first
                name = name.rpartition(".")[0]
    ancestors = {module.rsplit(".", i)[0] for i in range(module.count("."))}
    return targets - ancestors - {module}


GRAPH = {module: _edges(module) for module in MODULES}


@pytest.mark.parametrize("module", MODULES)
def test_every_module_imports(module):
    if module.endswith("._triton") and importlib.util.find_spec("triton") is None:
        pytest.skip("the Triton kernels need triton (softmaxbook[gpu])")
    importlib.import_module(module)


def test_the_import_graph_has_no_cycle():
    visiting, done = [], set()

    def visit(module):
        if module in done:
            return
        if module in visiting:
            cycle = visiting[visiting.index(module) :] + [module]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        visiting.append(module)
        for target in sorted(GRAPH[module]):
            visit(target)
        visiting.pop()
        done.add(module)

    for module in MODULES:
        visit(module)


def test_no_module_imports_a_private_name_of_another():
    offences = []
    for module in MODULES:
        for target, names in _imports(module):
            if not target.startswith(ROOT):
                continue
            for name in names:
                if not name.startswith("_") or name.startswith("__"):
                    continue
                submodule = f"{target}.{name}"
                if _is_module(submodule) and target == _package(module):
                    continue  # a private module of the importer's own package
                offences.append(f"{module} imports {name} from {target}")
    assert not offences, "\n".join(offences)


def test_kernels_import_only_the_shared_checks():
    allowed = {f"{ROOT}._validate", f"{ROOT}._numerics", f"{ROOT}.kernels"}
    for module in MODULES:
        if module.startswith(f"{ROOT}.kernels"):
            outside = {
                target
                for target in GRAPH[module]
                if not target.startswith(f"{ROOT}.kernels") and target not in allowed
            }
            assert not outside, f"{module} imports {sorted(outside)}"


def test_normalizers_import_only_the_policy_layer():
    # The normalizers sit below masking and attention (lib/README.md): they import
    # the argument checks, the API's change policy and each other, nothing above.
    allowed = {
        f"{ROOT}._validate",
        f"{ROOT}._numerics",
        f"{ROOT}._api",
        f"{ROOT}.normalizers",
    }
    modules = [m for m in MODULES if m.startswith(f"{ROOT}.normalizers")]
    assert f"{ROOT}.normalizers._policy" in modules
    for module in modules:
        outside = {
            target
            for target in GRAPH[module]
            if not target.startswith(f"{ROOT}.normalizers") and target not in allowed
        }
        assert not outside, f"{module} imports {sorted(outside)}"


#: The attention entry points (lib/README.md): each resolves its arguments with the
#: one resolver, softmaxbook.attention._args.
ATTENTION_ENTRY_POINTS = (
    "attention.sdpa", "attention.flash", "attention.flex", "attention.decode",
    "attention.ring", "attention.differential", "attention.selective",
    "attention.capping",
)  # fmt: skip


def test_every_attention_entry_point_resolves_its_arguments_in_one_place():
    resolver = f"{ROOT}.attention._args"
    # The resolver sits at the bottom of the attention layer: the checks, the
    # shared numerics, torch.
    bottom = {f"{ROOT}._validate", f"{ROOT}._numerics"}
    assert set(GRAPH[resolver]) <= bottom, GRAPH[resolver]
    missing = [
        name
        for name in ATTENTION_ENTRY_POINTS
        if resolver not in GRAPH[f"{ROOT}.{name}"]
    ]
    assert not missing, f"these modules do not import {resolver}: {missing}"


def test_no_module_imports_the_public_api():
    # ``from . import reference`` names a sibling module, not the public API.
    for module in MODULES:
        for target, names in _imports(module):
            public = [name for name in names if not _is_module(f"{ROOT}.{name}")]
            assert target != ROOT or not public, (
                f"{module} imports from {ROOT}: {public}"
            )


def test_the_graph_is_read():
    # The test above would pass on an empty graph: check that it holds known edges.
    assert f"{ROOT}.masking" in GRAPH[f"{ROOT}.attention.sdpa"]
    assert f"{ROOT}.kernels" in GRAPH[f"{ROOT}.attention.flash"]
    assert f"{ROOT}._validate" in GRAPH[f"{ROOT}.kernels"]
    assert f"{ROOT}.kernels._triton" in GRAPH[f"{ROOT}.kernels"]
    assert len(MODULES) >= 20


@pytest.mark.parametrize("module", MODULES)
def test_the_library_never_imports_the_books_harness(module):
    # bookkit (glue, figures, timing, the studies, diagrams, the claims ledger)
    # serves the book; a course installs softmaxbook alone.
    harness = [name for name, _ in _imports(module) if name.split(".")[0] == "bookkit"]
    assert not harness, f"{module} imports the book's harness: {harness}"


# That importing every module of the library, run (so an import hidden in a string,
# importlib or __import__, is caught too), leaves the harness alone is checked in
# tests/softmaxbook/test_api.py (test_a_fresh_interpreter_imports_only_what_each_step_
# needs), in the one fresh interpreter that its other import checks share.


# ---------------------------------------------------------------------------------
# The layer table of lib/README.md
# ---------------------------------------------------------------------------------

README = Path(__file__).resolve().parents[2] / "lib" / "README.md"


def _layer_table() -> list[tuple[str, list[str]]]:
    """``(layer, modules)`` for each row of the module map, in order (bottom first)."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## `softmaxbook`: the module map", 1)[1]
    section = section.split("\n#", 1)[0]  # up to the next heading
    rows, layer = [], ""
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or cells[0] in {"Layer", "---"}:
            continue
        layer = cells[0] or layer
        names = re.findall(r"`([a-z_][a-z_.]*)`", cells[1])
        rows.append((layer, [f"{ROOT}.{name}" for name in names]))
    return rows


TABLE = _layer_table()
LAYERS = list(dict.fromkeys(layer for layer, _ in TABLE))
PLACED = {module: layer for layer, modules in TABLE for module in modules}


def _layer(module: str) -> str | None:
    """The layer of ``module``: its own row, or the row of its nearest package."""
    name = module
    while name != ROOT:
        if name in PLACED:
            return PLACED[name]
        name = name.rpartition(".")[0]
    return None


def test_the_layer_table_is_read():
    assert LAYERS[:3] == ["policy", "kernels", "normalizers"] and "attention" in LAYERS
    assert PLACED[f"{ROOT}.attention._args"] == "attention"
    assert _layer(f"{ROOT}.attention.flash._tiles") == "attention"


def test_the_layer_table_names_real_modules_and_every_module():
    unknown = sorted(name for name in PLACED if name not in MODULES)
    assert not unknown, f"lib/README.md names modules that do not exist: {unknown}"
    missing = sorted(module for module in MODULES if _layer(module) is None)
    assert not missing, f"modules missing from lib/README.md's layer table: {missing}"


def test_no_module_imports_a_layer_below_it():
    # Below = later in the table: the table reads bottom (policy) to top (grader).
    offences = []
    for module in MODULES:
        mine = LAYERS.index(_layer(module))
        for target in GRAPH[module]:
            if LAYERS.index(_layer(target)) > mine:
                offences.append(f"{module} ({LAYERS[mine]}) imports {target}")
    assert not offences, "\n".join(offences)
