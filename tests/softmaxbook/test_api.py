"""The public API is a promise: its names, their types, and how little importing costs.

Instructors pin ``softmaxbook`` and build assignments on ``sb.<name>``: removing
or renaming a public name breaks them, so the set of names is pinned here and
changes only on purpose (add the new name to PUBLIC below in the same commit).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import softmaxbook as sb

# Every name of softmaxbook.__all__. A name may be added; none may disappear.
PUBLIC = {
    # softmax
    "softmax", "log_softmax", "logsumexp",
    # masking
    "causal_mask", "padding_mask", "masked_softmax", "additive_mask", "mask_fill_value",
    # attention patterns and the FlexAttention idea
    "document_ids", "document_mask", "sliding_window_mask", "prefix_lm_mask",
    "alibi_slopes", "alibi_bias", "mask_from_mod", "block_mask_from_mod",
    "BlockSparsity", "flex_attention", "chunked_mask", "document_positions",
    # bounded logits and the output layer's losses
    "soft_cap", "max_attention_logits", "qk_clip_", "label_smoothed_cross_entropy",
    "z_loss", "chunked_cross_entropy",
    # attention
    "scaled_dot_product_attention", "NORMALIZERS",
    # online softmax and FlashAttention
    "online_softmax", "flash_attention", "flash_attention_steps", "FlashStep",
    "merge_attention_states", "flash_attention_backward", "CAUSAL_ALIGNMENTS",
    "FlashAttention",
    # decoding and many devices
    "repeat_kv_heads", "aligned_causal_mask", "split_k_attention", "ring_attention",
    "run_ring_attention", "RingRun",
    # gradients
    "softmax_jacobian", "softmax_backward", "SoftmaxFunction",
    "softmax_with_custom_backward",
    # alternatives
    "sparsemax", "entmax15", "entmax_bisect", "softmax_one", "relu_normalize",
    "sigmoid_normalize",
    # attending to nothing, length, and the normalizers of 2023-2025
    "sink_softmax", "softpick", "clipped_softmax", "relu_attention", "ignore_gap",
    "scalable_softmax", "yarn_logit_scale", "adaptive_temperature_softmax",
    "stick_breaking", "differential_attention", "selective_attention",
    "latent_attention", "linear_attention", "gated_delta_rule",
    # sampling and calibration
    "top_k_filter", "top_p_filter", "sample", "ReliabilityTable", "reliability_table",
    "expected_calibration_error", "fit_temperature", "min_p_filter",
    "SpeculativeResult", "speculative_accept",
    # analysis
    "entropy", "attention_entropy", "attention_distance", "attention_sparsity",
    # models
    "make_associative_recall", "MultiHeadAttention", "TransformerBlock",
    "TinyTransformer", "route_topk",
    # devices and the kernel dispatch
    "get_device", "DEVICE_ENV_VAR", "explain_dispatch", "DispatchDecision",
    "triton_available",
    # modules and the version
    "reference", "kernels", "checks", "__version__",
    # 0.2: the normalizers' registry and package, and the API's own map
    "normalizers", "NormalizerInfo", "API_GROUPS", "API_STABILITY",
}  # fmt: skip

# Names importable from a module path that chapters or courses may use.
MODULE_PATHS = {
    "softmaxbook.attention": ["NORMALIZERS", "scaled_dot_product_attention"],
    "softmaxbook.normalizers": ["NORMALIZERS", "NormalizerInfo", "all_normalizers",
                                "softmax", "log_softmax", "logsumexp", "sparsemax",
                                "entmax15", "entmax_bisect", "softmax_one",
                                "relu_normalize", "sigmoid_normalize", "sink_softmax",
                                "softpick", "clipped_softmax", "relu_attention",
                                "scalable_softmax", "adaptive_temperature_softmax",
                                "yarn_logit_scale", "stick_breaking"],
    "softmaxbook.analysis": ["ignore_gap"],
    "softmaxbook.device": ["get_device", "explain_dispatch", "DispatchDecision",
                           "triton_available"],
    "softmaxbook.kernels": ["fused_softmax", "triton_softmax", "triton_flash_attention",
                            "triton_flash_forward", "triton_flash_backward",
                            "enable_interpreter", "interpreter_enabled",
                            "triton_available", "kernel_source", "explain_dispatch",
                            "DispatchDecision"],
    "softmaxbook.sampling": ["top_k_filter", "top_p_filter", "sample",
                             "expected_calibration_error", "reliability_table",
                             "fit_temperature", "ReliabilityTable", "min_p_filter",
                             "speculative_accept", "SpeculativeResult"],
    "softmaxbook.models": ["make_associative_recall", "TinyTransformer",
                           "MultiHeadAttention", "TransformerBlock"],
    "softmaxbook.reference": ["naive_softmax", "softmax", "log_softmax", "logsumexp",
                              "online_softmax", "sparsemax"],
}  # fmt: skip


def test_the_public_names_are_the_promised_ones():
    names = set(sb.__all__)
    assert len(names) == len(sb.__all__), "a name is listed twice in __all__"
    missing, new = PUBLIC - names, names - PUBLIC
    assert not missing, f"public names removed: {sorted(missing)}"
    assert not new, f"new public names: add them to PUBLIC on purpose: {sorted(new)}"


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_every_public_name_is_importable_and_documented(name):
    value = getattr(sb, name)
    if callable(value) and not isinstance(value, type(sb)):
        assert inspect.getdoc(value), f"sb.{name} has no docstring"


@pytest.mark.parametrize("module", sorted(MODULE_PATHS))
def test_module_paths_keep_their_names(module):
    imported = __import__(module, fromlist=["_"])
    for name in MODULE_PATHS[module]:
        assert hasattr(imported, name), f"{module}.{name} is gone"


def _public_functions():
    """Every public function and method of the library, with its qualified name."""
    seen = {}
    modules = [sb, sb.reference, sb.kernels]
    for module in modules:
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isfunction(value):
                seen[f"{module.__name__}.{name}"] = value
            elif inspect.isclass(value):
                for attr, member in vars(value).items():
                    if attr.startswith("_") and attr != "__init__":
                        continue
                    function = getattr(member, "__func__", member)
                    if inspect.isfunction(function):
                        seen[f"{module.__name__}.{name}.{attr}"] = function
    return seen


PUBLIC_FUNCTIONS = _public_functions()


@pytest.mark.parametrize("name", sorted(PUBLIC_FUNCTIONS))
def test_public_functions_annotate_what_they_return(name):
    signature = inspect.signature(PUBLIC_FUNCTIONS[name])
    assert signature.return_annotation is not inspect.Signature.empty, (
        f"{name} has no return annotation"
    )


def test_the_package_says_it_is_typed():
    # PEP 561: type checkers read the annotations of a package that ships py.typed.
    assert (Path(sb.__file__).parent / "py.typed").exists()


# What a fresh interpreter imports, checked in one fresh interpreter: the heavy
# optional packages, the checkers, the moved names, and every module of the library.
# One process, not one per check: each check reads what its own step imported (the
# modules new after `import softmaxbook`, whether a lookup imported bookkit), so it is
# the check a process of its own would make, without paying torch's import each time.
# The steps run in the order that keeps each one's starting state: `import
# softmaxbook` first, then the moved names' lookups and the checkers (neither imports
# a heavy package or bookkit, or the steps below say so), and the import of every
# module of the library last (it imports triton).
HEAVY = ("matplotlib", "tqdm", "triton", "entmax")

# The book's harness left the library in 0.2 (it is the package bookkit): each old
# name fails with a message that says where it went, and looking it up does not
# import bookkit (a course installs softmaxbook alone).
MOVED_TO_BOOKKIT = {
    "softmaxbook": ["setup_notebook", "glue", "PALETTE", "use_style",
                    "plot_distribution", "plot_curves", "plot_heatmap", "time_call",
                    "machine_info", "train", "evaluate", "TrainingHistory",
                    "notebook", "plotting", "timing"],
    "softmaxbook.models": ["train", "evaluate", "TrainingHistory", "training",
                           "case_study", "sink_study"],
}  # fmt: skip

LIBRARY_MODULES = sorted(
    info.name for info in pkgutil.walk_packages(sb.__path__, prefix="softmaxbook.")
)

_FRESH = """
import importlib, json, sys, traceback
out = {}
# 1. `import softmaxbook` after a bare `import torch`: which packages are new.
# (torch itself imports tqdm for torch.hub on some versions, so tqdm is checked
# against a bare `import torch`.)
import torch
before = set(sys.modules)
import softmaxbook as sb
out["new"] = sorted({m.split(".")[0] for m in set(sys.modules) - before})
out["checks_eager"] = "softmaxbook.checks" in sys.modules
out["checks_in_dir"] = "checks" in dir(sb)
# 2. Each moved name: an AttributeError, and bookkit still unimported after it.
out["moved"] = {}
for module, names in MOVED:
    m = importlib.import_module(module)
    for name in names:
        had = "bookkit" in sys.modules
        try:
            getattr(m, name)
        except AttributeError as e:
            message = str(e)
        else:
            message = "no AttributeError"
        if "bookkit" in sys.modules and not had:
            message += " (the lookup imported bookkit)"
        out["moved"][f"{module}.{name}"] = message
# 3. The checkers, imported on first use by every way of reaching them.
try:
    first = sb.checks
    assert "softmaxbook.checks" in sys.modules, "sb.checks did not import it"
    from softmaxbook import checks
    import softmaxbook.checks
    assert first is checks is softmaxbook.checks is sys.modules[checks.__name__], (
        "not one module"
    )
    from softmaxbook import *
    assert checks.check_softmax(lambda x: x.softmax(-1)).ok, "check_softmax failed"
    out["checks"] = "ok"
except Exception:
    out["checks"] = traceback.format_exc()
# 4. Every module of the library (an ImportError: an optional dependency, triton,
# which test_layers' test_every_module_imports covers): bookkit still unimported.
for name in MODULES:
    try:
        importlib.import_module(name)
    except ImportError:
        pass
harness = [m for m in sys.modules if m.partition(".")[0] == "bookkit"]
out["bookkit_after_all"] = sorted(harness)
print(json.dumps(out))
"""


def _fresh_interpreter() -> dict:
    """What the steps of ``_FRESH`` saw, run in a fresh interpreter."""
    code = (
        f"MOVED = {list(MOVED_TO_BOOKKIT.items())!r}\n"
        f"MODULES = {LIBRARY_MODULES!r}\n" + _FRESH
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


def test_a_fresh_interpreter_imports_only_what_each_step_needs():
    fresh = _fresh_interpreter()
    # matplotlib, tqdm and triton are imported only when a figure, a progress bar
    # or a kernel is first needed.
    for heavy in HEAVY:
        assert heavy not in fresh["new"], f"import softmaxbook imports {heavy}"
    # softmaxbook.checks is a third of the library's source: `import softmaxbook`
    # leaves it alone, and each way of reaching it imports it then.
    assert not fresh["checks_eager"], "softmaxbook.checks imported eagerly"
    assert fresh["checks_in_dir"], "checks is not in dir(softmaxbook)"
    assert fresh["checks"] == "ok", fresh["checks"]
    # Each moved name says where it went, without importing bookkit.
    wrong = {}
    for module, names in MOVED_TO_BOOKKIT.items():
        for name in names:
            message = fresh["moved"][f"{module}.{name}"]
            problem = _moved_name_problem(module, name, message)
            if problem:
                wrong[f"{module}.{name}"] = problem
    assert not wrong, wrong
    # The static check of test_layers reads import statements; this runs them, so
    # an import hidden in a string (importlib, __import__) is caught too.
    assert fresh["bookkit_after_all"] == [], (
        f"softmaxbook imports {fresh['bookkit_after_all']}"
    )


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        sb.no_such_name  # noqa: B018


def _moved_name_problem(module: str, name: str, message: str) -> str | None:
    """What is wrong with the message that looking up a moved name gave, or None."""
    if "imported bookkit" in message:
        return message
    if f"{module}.{name} moved to bookkit: use bookkit." not in message:
        return f"says {message!r}"
    new = message.split(": use ")[1].split()[0]  # e.g. bookkit.studies.case_study
    if not _resolves(new):
        return f"the message names {new}, which does not exist"
    return None


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` names a module, or an attribute of a module."""
    parent, _, attr = dotted.rpartition(".")
    if hasattr(importlib.import_module(parent), attr):
        return True
    return importlib.util.find_spec(dotted) is not None


def test_the_harness_names_are_not_public_api():
    moved = {name for names in MOVED_TO_BOOKKIT.values() for name in names}
    assert not moved & set(sb.__all__)
    assert not {"train", "evaluate", "TrainingHistory"} & set(sb.models.__all__)


# The API a reader can see whole (0.2): explicit, grouped, marked, versioned.

INIT = Path(sb.__file__)


def test_the_package_imports_every_name_explicitly():
    tree = ast.parse(INIT.read_text())
    stars = [
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names)
    ]
    assert not stars, f"star imports in softmaxbook/__init__.py: {stars}"


def test_every_public_name_belongs_to_one_topic():
    # Each name comes from a module of exactly one group of API_GROUPS, so the API
    # page, which documents the groups' modules, shows every name once.
    modules = {m: group for group, ms in sb.API_GROUPS.items() for m in ms}
    assert len(modules) == sum(len(ms) for ms in sb.API_GROUPS.values())

    def documented_in(dotted: str) -> str | None:
        # The longest module of API_GROUPS that is ``dotted`` or holds it.
        inside = [m for m in modules if dotted == m or dotted.startswith(m + ".")]
        return max(inside, key=len, default=None)

    for name in sb.__all__:
        value = getattr(sb, name)
        if name in modules or name.startswith("__") or name.startswith("API_"):
            continue
        home = getattr(value, "__module__", None) or ""
        found = documented_in(home.removeprefix("softmaxbook."))
        if found is None or name not in _module_all(found):
            # constants (no __module__), or a name defined in a private module:
            # found by the documented module that lists it
            found = next(m for m in modules if name in _module_all(m))
        assert found in modules, f"sb.{name} ({home}) is in no group of API_GROUPS"


def _module_all(module: str) -> tuple[str, ...]:
    imported = importlib.import_module(f"softmaxbook.{module}")
    return tuple(getattr(imported, "__all__", ()))


def test_every_public_name_is_marked_stable_or_experimental():
    assert set(sb.API_STABILITY) == set(sb.__all__)
    assert set(sb.API_STABILITY.values()) == {"stable", "experimental"}
    assert sb.API_STABILITY["softmax"] == "stable"
    assert sb.API_STABILITY["FlashAttention"] == "experimental"


def test_the_api_page_has_the_groups_and_the_version():
    page = (Path(__file__).resolve().parents[2] / "chapters" / "api.md").read_text()
    headings = re.findall(r"^## (.+)$", page, flags=re.M)
    assert headings == list(sb.API_GROUPS), "api.md's sections are not API_GROUPS"
    for group, modules in sb.API_GROUPS.items():
        section = page.split(f"## {group}\n", 1)[1].split("\n## ", 1)[0]
        for module in modules:
            assert f".. automodule:: softmaxbook.{module}\n" in section, (
                f"softmaxbook.{module} is not documented under {group!r}"
            )
    assert f"`softmaxbook` {sb.__version__}" in page


def test_the_version_is_in_the_changelog():
    assert sb.__version__ == "0.3.0"
    changelog = (Path(__file__).resolve().parents[2] / "CHANGELOG.md").read_text()
    assert f"## [{sb.__version__}]" in changelog
