"""softmaxbook: the library of the executable textbook *Softmax in Attention*.

Softmax and its relatives for transformer attention, written to be read: torch
functions that run on CPU, CUDA and Apple MPS, NumPy references that read like
the math (:mod:`softmaxbook.reference`), fused kernels
(:mod:`softmaxbook.kernels`) and a grader for students' code
(:mod:`softmaxbook.checks`).

>>> import torch, softmaxbook as sb
>>> sb.softmax(torch.tensor([1.0, 0.5, 2.5, -0.1]))
tensor([0.1557, 0.0945, 0.6980, 0.0518])

The public API is below, grouped by topic (the API page shows the same groups,
``sb.API_GROUPS``); each name is ``sb.<name>``. ``sb.API_STABILITY`` marks each
name stable (kept across minor versions; a rename keeps a deprecated alias for one
minor version) or experimental (may still change in a minor version).
"""

import importlib as _importlib
import typing as _typing

from . import _api, kernels, normalizers, reference

# isort: split
# Softmax and the normalizers: every map from scores to weights, one registry.
from .normalizers import (
    NORMALIZERS,
    NormalizerInfo,
    adaptive_temperature_softmax,
    clipped_softmax,
    entmax15,
    entmax_bisect,
    log_softmax,
    logsumexp,
    relu_attention,
    relu_normalize,
    scalable_softmax,
    sigmoid_normalize,
    sink_softmax,
    softmax,
    softmax_one,
    softpick,
    sparsemax,
    stick_breaking,
    yarn_logit_scale,
)

# isort: split
# Masks and attention patterns: which keys a query may see.
from .attention.flex import (
    BlockSparsity,
    block_mask_from_mod,
    flex_attention,
    mask_from_mod,
)
from .masking import (
    additive_mask,
    causal_mask,
    mask_fill_value,
    masked_softmax,
    padding_mask,
)
from .patterns import (
    alibi_bias,
    alibi_slopes,
    chunked_mask,
    document_ids,
    document_mask,
    document_positions,
    prefix_lm_mask,
    sliding_window_mask,
)

# isort: split
# Attention: the explicit and fused paths, FlashAttention, decoding, many devices.
from .attention.capping import max_attention_logits, qk_clip_, soft_cap
from .attention.decode import aligned_causal_mask, repeat_kv_heads, split_k_attention
from .attention.differential import differential_attention
from .attention.flash import (
    CAUSAL_ALIGNMENTS,
    FlashAttention,
    FlashStep,
    flash_attention,
    flash_attention_backward,
    flash_attention_steps,
)
from .attention.latent import latent_attention
from .attention.linear_recurrent import gated_delta_rule, linear_attention
from .attention.online import merge_attention_states, online_softmax
from .attention.ring import RingRun, ring_attention, run_ring_attention
from .attention.sdpa import scaled_dot_product_attention
from .attention.selective import selective_attention

# isort: split
# Gradients: the Jacobian and the backward pass written out.
from .gradients import (
    SoftmaxFunction,
    softmax_backward,
    softmax_jacobian,
    softmax_with_custom_backward,
)

# isort: split
# The output layer: losses, sampling, calibration.
from .losses import chunked_cross_entropy, label_smoothed_cross_entropy, z_loss
from .sampling import (
    ReliabilityTable,
    SpeculativeResult,
    expected_calibration_error,
    fit_temperature,
    min_p_filter,
    reliability_table,
    sample,
    speculative_accept,
    top_k_filter,
    top_p_filter,
)

# isort: split
# Analysis: what an attention map does.
from .analysis import (
    attention_distance,
    attention_entropy,
    attention_sparsity,
    entropy,
    ignore_gap,
)

# isort: split
# Models: a small transformer with a pluggable normalizer, a task for it, and the
# router of a mixture-of-experts layer.
from .models import (
    MultiHeadAttention,
    TinyTransformer,
    TransformerBlock,
    make_associative_recall,
)
from .routing import route_topk

# isort: split
# Devices and kernels: where the work runs, and which path a call takes.
from .device import DEVICE_ENV_VAR, get_device
from .kernels.dispatch import DispatchDecision, explain_dispatch, triton_available

if _typing.TYPE_CHECKING:  # imported on first use at run time: see __getattr__ below
    from . import checks

__version__ = "0.3.0"

__all__ = [
    # Softmax and the normalizers
    "softmax", "log_softmax", "logsumexp", "sparsemax", "entmax15", "entmax_bisect",
    "softmax_one", "relu_normalize", "sigmoid_normalize", "sink_softmax", "softpick",
    "clipped_softmax", "relu_attention", "scalable_softmax",
    "adaptive_temperature_softmax", "yarn_logit_scale", "stick_breaking",
    "NORMALIZERS", "NormalizerInfo",
    # Masks and attention patterns
    "causal_mask", "padding_mask", "masked_softmax", "additive_mask", "mask_fill_value",
    "document_ids", "document_mask", "sliding_window_mask", "prefix_lm_mask",
    "alibi_slopes", "alibi_bias", "mask_from_mod", "block_mask_from_mod",
    "BlockSparsity", "flex_attention", "chunked_mask", "document_positions",
    # Attention
    "scaled_dot_product_attention", "online_softmax", "merge_attention_states",
    "FlashAttention", "flash_attention", "flash_attention_backward",
    "flash_attention_steps", "FlashStep", "CAUSAL_ALIGNMENTS", "repeat_kv_heads",
    "aligned_causal_mask", "split_k_attention", "ring_attention",
    "run_ring_attention", "RingRun", "differential_attention", "selective_attention",
    "soft_cap", "max_attention_logits", "qk_clip_", "latent_attention",
    "linear_attention", "gated_delta_rule",
    # Gradients
    "softmax_jacobian", "softmax_backward", "SoftmaxFunction",
    "softmax_with_custom_backward",
    # The output layer
    "label_smoothed_cross_entropy", "z_loss", "chunked_cross_entropy",
    "top_k_filter", "top_p_filter", "min_p_filter", "sample", "SpeculativeResult",
    "speculative_accept", "ReliabilityTable", "reliability_table",
    "expected_calibration_error", "fit_temperature",
    # Analysis
    "entropy", "attention_entropy", "attention_distance", "attention_sparsity",
    "ignore_gap",
    # Models
    "make_associative_recall", "MultiHeadAttention", "TransformerBlock",
    "TinyTransformer", "route_topk",
    # Devices and kernels
    "get_device", "DEVICE_ENV_VAR", "explain_dispatch", "DispatchDecision",
    "triton_available",
    # Modules, the version, the API's own map
    "normalizers", "reference", "kernels", "checks", "__version__",
    "API_GROUPS", "API_STABILITY",
]  # fmt: skip

#: The topics of the public API and the modules that hold each (the API page has
#: one section per topic, in this order).
API_GROUPS: dict[str, tuple[str, ...]] = {
    "Softmax and the normalizers": ("normalizers",),
    "Masks and attention patterns": ("masking", "patterns", "attention.flex"),
    "Attention": (
        "attention", "attention.online", "attention.flash", "attention.decode",
        "attention.ring", "attention.differential", "attention.selective",
        "attention.capping", "attention.latent", "attention.linear_recurrent",
    ),
    "Gradients": ("gradients",),
    "The output layer": ("losses", "sampling"),
    "Analysis": ("analysis",),
    "Models": ("models", "routing"),
    "Devices and kernels": ("device", "kernels"),
    "References and the grader": ("reference", "checks"),
}  # fmt: skip

# Names whose signature or behaviour may still change in a minor version: the
# normalizers and attention variants of recent papers, and the newest interfaces.
_EXPERIMENTAL = frozenset({
    "NormalizerInfo", "softpick", "scalable_softmax", "adaptive_temperature_softmax",
    "stick_breaking", "relu_attention", "differential_attention",
    "selective_attention", "qk_clip_", "ignore_gap", "FlashAttention",
    "chunked_mask", "document_positions",
    "block_mask_from_mod", "BlockSparsity", "route_topk",
    "latent_attention", "linear_attention", "gated_delta_rule",
})  # fmt: skip

#: ``"stable"`` or ``"experimental"`` for every public name (see the module docstring).
API_STABILITY: dict[str, str] = {
    name: "experimental" if name in _EXPERIMENTAL else "stable" for name in __all__
}

# softmaxbook.checks, the checkers of students' code, is imported on first use
# (sb.checks, from softmaxbook import checks): it is a third of the library's
# source, and a script that trains or plots never needs it.
_LAZY = {"checks"}


# The book's harness moved to the package ``bookkit`` in 0.2 (a course installs
# softmaxbook alone): each old name says where it went, without importing bookkit.
_MOVED_TO_BOOKKIT = {
    "setup_notebook": "bookkit.setup_notebook",
    "glue": "bookkit.glue",
    "PALETTE": "bookkit.PALETTE",
    "use_style": "bookkit.use_style",
    "plot_distribution": "bookkit.plot_distribution",
    "plot_curves": "bookkit.plot_curves",
    "plot_heatmap": "bookkit.plot_heatmap",
    "time_call": "bookkit.time_call",
    "machine_info": "bookkit.machine_info",
    "train": "bookkit.train",
    "evaluate": "bookkit.evaluate",
    "TrainingHistory": "bookkit.TrainingHistory",
    "notebook": "bookkit.notebook",
    "plotting": "bookkit.plotting",
    "timing": "bookkit.timing",
}


# The attention modules moved into the package ``softmaxbook.attention`` in 0.3:
# ``softmaxbook.flash`` (and each other old path) still imports, as the new module.
_api.alias_moved_modules()


def __getattr__(name: str) -> object:
    if f"{__name__}.{name}" in _api.MOVED_MODULES:
        return _importlib.import_module(f"{__name__}.{name}")  # also sets the attribute
    if name in _LAZY:
        return _importlib.import_module(f"{__name__}.{name}")  # also sets the attribute
    if name in _MOVED_TO_BOOKKIT:
        raise AttributeError(
            f"softmaxbook.{name} moved to bookkit: use {_MOVED_TO_BOOKKIT[name]} "
            "(import bookkit; pip install -e . installs both packages)"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LAZY)
