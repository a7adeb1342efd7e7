"""Which implementation a call runs, and why: the one dispatch module.

Every choice of implementation in the library is made here, on plain facts
about the call (device, dtype, whether a gradient is needed, shapes, the
options), so :func:`explain_dispatch` reports exactly what the library does,
and each rule is tested on plain facts, without a GPU. The paths have one
vocabulary, :data:`PATHS`:

- ``"triton"``: the library's Triton kernels, on a CUDA GPU;
- ``"torch-fused"``: torch's own fused kernel
  (``torch.nn.functional.scaled_dot_product_attention``, or on the CPU
  ``aten::_scaled_dot_product_flash_attention_for_cpu``), where it computes
  the same thing;
- ``"tiles"``: the library's FlashAttention tile loops in torch: no ``(L, S)``
  matrix is formed;
- ``"explicit"``: the library's torch code with every intermediate formed (the
  scores and weights of attention, the row of a softmax).

:func:`~softmaxbook.scaled_dot_product_attention` takes ``"torch-fused"`` or
``"explicit"`` (:func:`sdpa_decision`); :func:`~softmaxbook.flash_attention`
takes ``"triton"``, ``"torch-fused"`` or ``"tiles"``, and ``"explicit"`` when it
drops weights (:func:`flash_decision`); the opt-in softmax kernel
(:func:`~softmaxbook.kernels.fused_softmax`) takes ``"triton"`` or
``"explicit"`` (:func:`kernel_decision`), and :func:`~softmaxbook.softmax`
never dispatches.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["explain_dispatch", "DispatchDecision", "triton_available"]

#: The paths a call may take (the module docstring says what each one runs).
PATHS: dict[str, str] = {
    "triton": "the library's Triton kernels, on a CUDA GPU",
    "torch-fused": "torch's own fused attention kernel",
    "tiles": "the library's FlashAttention tile loops in torch",
    "explicit": "the library's torch code, every intermediate formed",
}

#: The 0.2 names of the paths, which ``DispatchDecision.path`` still compares
#: equal to until 0.4 (``softmaxbook._api.DEPRECATIONS``): ``"fused"`` was
#: torch's kernel, ``"torch"`` the library's torch code, ``"dropout"`` the weights
#: formed to drop them.
OLD_PATH_NAMES: dict[str, frozenset[str]] = {
    "fused": frozenset({"torch-fused"}),
    "torch": frozenset({"tiles", "explicit"}),
    "dropout": frozenset({"explicit"}),
}


class DispatchPath(str):
    """A name of :data:`PATHS`; equal to its 0.2 name too, until 0.4."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str) and other in OLD_PATH_NAMES:
            return str(self) in OLD_PATH_NAMES[other]
        # str(self) == other, not str.__eq__(self, other): torch.compile traces
        # the first (the second fails in dynamo: "expected 1 argument, got 2").
        return str(self) == other

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = str.__hash__

    def __repr__(self) -> str:
        return repr(str(self))


#: Operations with a Triton kernel, and :func:`explain_dispatch`'s names for them.
KERNEL_OPS = ("softmax", "flash_attention")

#: The operation whose decision is between torch's fused kernel and the explicit
#: computation (``sdpa_decision``).
SDPA_OP = "scaled_dot_product_attention"

#: ``(path, reason)`` of an operation defined above the kernels, registered by the
#: module that defines it (:func:`register_explainer`): the kernels never import
#: the layers above them.
_EXPLAINERS: dict[str, Callable[..., tuple[str, str]]] = {}


def register_explainer(op: str, explain: Callable[..., tuple[str, str]]) -> None:
    """Let :func:`explain_dispatch` answer for ``op`` with ``explain(*tensors,
    **options) -> (path, reason)``; the module that defines ``op`` calls this."""
    _EXPLAINERS[op] = explain


#: Dtypes the Triton kernels accept (float64 and others stay on the torch path).
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

#: The widest row the fused softmax kernel holds in registers in one piece.
SOFTMAX_KERNEL_MAX_COLS = 65536

#: The largest head dimension (of the queries and keys, and of the values) that
#: the FlashAttention kernel accepts.
ATTENTION_KERNEL_MAX_HEAD_DIM = 256

#: The environment variable that makes Triton run kernels in its CPU interpreter.
INTERPRETER_ENV_VAR = "TRITON_INTERPRET"


@dataclass(frozen=True)
class DispatchDecision:
    """Which implementation a call takes, and why.

    ``path`` is a name of ``dispatch.PATHS``: ``"triton"``, ``"torch-fused"``,
    ``"tiles"`` or ``"explicit"`` (see the module docstring). ``reason`` is one
    sentence. ``str(decision)`` reads ``"flash_attention -> tiles: ..."``.
    """

    op: str
    path: str
    reason: str

    def __post_init__(self) -> None:
        if self.path not in PATHS:
            raise ValueError(f"path {self.path!r} is not one of {sorted(PATHS)}")
        object.__setattr__(self, "path", DispatchPath(self.path))

    def __str__(self) -> str:
        return f"{self.op} -> {self.path}: {self.reason}"


_FOUND: dict = {}


def _constant_when_compiled(fn: Callable[[], bool]) -> Callable[[], bool]:
    """``torch.compiler.assume_constant_result(fn)``, without importing
    ``torch._dynamo`` (and with it triton) when the library is imported: the
    decorator only sets this flag, which torch.compile reads while it traces."""
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return fn


@_constant_when_compiled
def triton_available() -> bool:
    """True when the ``triton`` package is installed (checked without importing it).

    Looked up once per process (every attention call asks, and a lookup searches
    the import path): a package installed later is seen after a restart.
    torch.compile takes the answer as a constant, without guards on the lookup
    (traced, the lookup's cache, filled by the first trace, made every compiled
    model that calls attention compile twice), and so does it with
    :func:`interpreter_enabled`: a compiled function keeps the answer it was
    compiled with.
    """
    find = importlib.util.find_spec
    if find not in _FOUND:
        _FOUND[find] = find("triton") is not None
    return _FOUND[find]


@_constant_when_compiled
def interpreter_enabled() -> bool:
    """True when Triton runs (or, once imported, will run) kernels in its
    interpreter."""
    value = os.environ.get(INTERPRETER_ENV_VAR, "0").strip().lower()
    return value in {"1", "true", "on", "yes"}


def explain_dispatch(
    op: str, *tensors: torch.Tensor, **options: Any
) -> DispatchDecision:
    """Report which code path ``op`` takes on ``tensors`` (and, for attention,
    ``options``), and why.

    The library's functions take this same decision, so the report is what
    they do. For ``"softmax"`` and ``"flash_attention"``: the Triton kernel
    when every tensor is on a CUDA device, Triton is installed, the dtype is
    float16, bfloat16 or float32, the shape fits the kernel and, for
    ``"softmax"``, no gradient is needed (its kernel is forward-only;
    FlashAttention has a backward kernel too); otherwise the torch code, which
    gives the same result up to rounding: for ``"softmax"`` the ``"explicit"``
    path; for ``"flash_attention"`` torch's own CPU kernel (``"torch-fused"``)
    where it computes the same thing, else the library's tile loops
    (``"tiles"``, also forced by ``explicit=True`` or ``block_size=``), and
    ``"explicit"`` with ``dropout_p > 0``; pass its keyword arguments too.

    For ``"scaled_dot_product_attention"``, pass ``q, k, v`` and the keyword
    arguments of the call (``mask`` or ``attn_mask``, boolean or float,
    ``dropout_p``, ``is_causal``, ``normalizer``, ``sinks``,
    ``return_weights``, ``enable_gqa``, ``scale``, ``explicit``): the path is
    ``"torch-fused"`` (torch's fused kernel) when the semantics are the same, float
    masks and dropout included, ``"explicit"`` otherwise (see
    ``sdpa_decision``). The options are checked as the call checks them.

    Shapes: for ``"softmax"`` pass the input (normalized along its last
    dimension); for the attention ops pass ``q, k, v``.

    Parameters
    ----------
    op : str
        ``"softmax"``, ``"flash_attention"`` (the names in ``KERNEL_OPS``) or
        ``"scaled_dot_product_attention"``.
    *tensors : Tensor
        The arguments the call would get.
    **options
        For the attention ops: the call's keyword arguments (``"softmax"``
        takes none).

    Returns
    -------
    DispatchDecision
        ``path`` and a one-sentence ``reason``.

    Raises
    ------
    ValueError
        If ``op`` is unknown or no tensor is given.
    TypeError
        If an argument is not a tensor, or options are given for
        ``"softmax"``.

    Examples
    --------
    >>> import torch, softmaxbook as sb
    >>> q = torch.randn(2, 4, 8, 16)
    >>> sb.explain_dispatch("scaled_dot_product_attention", q, q, q).path
    'torch-fused'
    >>> sb.explain_dispatch("flash_attention", q, q, q).path  # on the CPU
    'torch-fused'
    >>> sb.explain_dispatch("flash_attention", q, q, q, explicit=True).path
    'tiles'
    >>> sb.explain_dispatch(
    ...     "scaled_dot_product_attention", q, q, q, return_weights=True
    ... ).path
    'explicit'
    """
    if op in _EXPLAINERS:  # the call's own rule, its arguments checked
        if op == SDPA_OP and len(tensors) != 3:
            raise ValueError(f"explain_dispatch({op!r}) needs the tensors q, k, v")
        return DispatchDecision(op, *_EXPLAINERS[op](*tensors, **options))
    if options:
        raise TypeError(
            f"explain_dispatch({op!r}) takes no keyword arguments, got "
            f"{sorted(options)}"
        )
    if op not in KERNEL_OPS:
        raise ValueError(
            f"op={op!r} is unknown; expected one of {[*KERNEL_OPS, SDPA_OP]}"
        )
    return kernel_decision(op, *tensors)


def kernel_decision(op: str, *tensors: torch.Tensor) -> DispatchDecision:
    """The kernels' own rule for ``op`` (a name in ``KERNEL_OPS``): ``"triton"``, or
    the library's torch code (``"explicit"`` for ``"softmax"``, ``"tiles"`` for
    ``"flash_attention"``), from the tensors alone.

    :func:`explain_dispatch` answers with it for ``"softmax"``; the module that
    defines ``flash_attention`` starts its own explainer from it (a Triton kernel
    first, then its CPU paths).
    """
    if not tensors:
        raise ValueError(
            f"explain_dispatch({op!r}) needs the tensors the call would get"
        )
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(
                f"argument {i + 1} must be a torch.Tensor, got {type(t).__name__}"
            )
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    if op == "softmax":
        width = tensors[0].shape[-1] if tensors[0].dim() else 1
    else:  # the head size of q and k, and the value head size Dv of v
        width = max([t.shape[-1] for t in tensors if t.dim()] or [0])
    return _decide(
        op,
        device_types={t.device.type for t in tensors},
        dtypes={t.dtype for t in tensors},
        needs_grad=needs_grad,
        width=width,
        have_triton=triton_available(),
        interpreter=interpreter_enabled(),
    )


def _decide(
    op: str,
    *,
    device_types: set[str],
    dtypes: set[torch.dtype],
    needs_grad: bool,
    width: int,
    have_triton: bool,
    interpreter: bool,
) -> DispatchDecision:
    """The dispatch rule itself, on plain facts (testable without a GPU).

    ``width`` is the row length for ``"softmax"``, and the largest head size
    (``D`` of q and k, ``Dv`` of v) for ``"flash_attention"``.
    """

    def torch_path(reason: str) -> DispatchDecision:
        return DispatchDecision(op, "explicit" if op == "softmax" else "tiles", reason)

    if device_types != {"cuda"}:
        where = ", ".join(sorted(device_types))
        return torch_path(
            f"the tensors are on {where}, and the Triton kernels run on CUDA "
            "devices only"
        )
    if not have_triton:
        return torch_path("Triton is not installed (pip install triton)")
    if interpreter:
        return torch_path(
            "TRITON_INTERPRET=1 runs Triton in its CPU interpreter, which cannot "
            "take CUDA tensors"
        )
    bad = sorted(str(d) for d in dtypes if d not in KERNEL_DTYPES)
    if bad:
        return torch_path(
            f"the kernels take float16, bfloat16 or float32, not {', '.join(bad)}"
        )
    if len(dtypes) > 1:
        return torch_path("the tensors have different dtypes")
    if needs_grad and op == "softmax":
        return torch_path(
            "a gradient is required and the softmax kernel computes the forward "
            "pass only"
        )
    if op == "softmax" and width > SOFTMAX_KERNEL_MAX_COLS:
        return torch_path(
            f"rows of {width} entries exceed the fused kernel's "
            f"{SOFTMAX_KERNEL_MAX_COLS} (one row is held on chip in one piece)"
        )
    if op == "flash_attention" and width > ATTENTION_KERNEL_MAX_HEAD_DIM:
        return torch_path(
            f"head dimension {width} (of q, k or v) exceeds the kernel's "
            f"{ATTENTION_KERNEL_MAX_HEAD_DIM}"
        )
    return DispatchDecision(
        op, "triton", "CUDA tensors and Triton is installed: the fused kernel"
    )


# --------------------------------------------------------------------------------------
# scaled_dot_product_attention: torch's fused kernel, or the explicit computation
# --------------------------------------------------------------------------------------

#: The dtypes for which scaled_dot_product_attention hands a call to torch's
#: ``scaled_dot_product_attention`` (which computes half precision as the explicit
#: path does).
SDPA_TORCH_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

SDPA_TORCH_REASON = (
    "softmax attention without sinks or returned weights: torch's fused kernel "
    "(torch.nn.functional.scaled_dot_product_attention) computes the same thing"
)


def sdpa_decision(
    *,
    explicit: bool,
    softmax: bool,
    sinks: bool,
    return_weights: bool,
    device_types: set[str],
    ndims: tuple[int, ...],
    empty: bool,
    dtype: torch.dtype,
    transforms: bool,
    bounded: Callable[[], bool],
) -> tuple[str, str]:
    """The rule of :func:`~softmaxbook.scaled_dot_product_attention`, on plain facts.

    Returns ``(path, reason)``: ``"torch-fused"`` hands the call to torch's fused
    kernel, ``"explicit"`` computes the scores, the weights and the output in
    the open. ``bounded`` is a callable that says whether the fused kernel's
    output is finite; it is called last, only when everything else allows the
    fused kernel, because it reads the output (the call runs the kernel and
    recomputes explicitly when the output holds a ``nan`` or an infinity).

    Why each condition: torch's fused kernel has no other normalizer, no sinks
    and no weights to return (a float mask and dropout it applies as the explicit
    path does, so neither is a condition); it runs on the CPU here (on a GPU torch picks
    among kernels whose fully masked rows are not checked by this library);
    it takes ``(B, H, L, D)`` tensors (other shapes go to torch's math
    backend, which is the explicit computation anyway); it is not twice
    differentiable, so ``torch.func`` transforms (``hessian``, ``jacrev`` of a
    gradient) keep the explicit path; and it adds a mask to the scores, so a
    ``nan`` or infinite score at a masked position would reach the output,
    where the explicit path removes it: a fused output that is not finite is
    recomputed explicitly.
    """

    def explicit_path(reason: str) -> tuple[str, str]:
        return "explicit", reason

    if explicit:
        return explicit_path("explicit=True forces the explicit computation")
    if not softmax:
        return explicit_path("another normalizer than softmax has no fused kernel")
    if sinks:
        return explicit_path("sink logits are computed explicitly (sink_softmax)")
    if return_weights:
        return explicit_path(
            "return_weights=True needs the weights, which the fused kernel never forms"
        )
    if device_types != {"cpu"}:
        where = ", ".join(sorted(device_types))
        return explicit_path(
            f"the tensors are on {where}; the fused path is taken on the CPU only"
        )
    if ndims != (4, 4, 4):
        return explicit_path(
            "torch's fused kernel takes (B, H, L, D) tensors; these have "
            f"{'/'.join(map(str, ndims))} dimensions"
        )
    if empty:
        return explicit_path("an empty dimension: nothing for a kernel to do")
    if dtype not in SDPA_TORCH_DTYPES:
        return explicit_path(f"the fused kernel does not take {dtype}")
    if transforms:
        return explicit_path(
            "a torch.func transform is active, and the fused kernel's backward "
            "is not differentiable"
        )
    if not bounded():
        return explicit_path(
            "torch's fused kernel gives nan or infinity here (a nan or infinite "
            "score, or an overflow): the call recomputes it explicitly, which keeps "
            "those of masked keys out of the output"
        )
    return "torch-fused", SDPA_TORCH_REASON


# --------------------------------------------------------------------------------------
# flash_attention: Triton, torch's CPU FlashAttention kernel, or the tile loops
# --------------------------------------------------------------------------------------

#: The dtypes of torch's CPU FlashAttention kernel on flash_attention's torch-fused
#: path: the tile loops compute float16 and bfloat16 in float32 and round once,
#: which torch's CPU kernel does not promise.
FLASH_TORCH_DTYPES = (torch.float32, torch.float64)

FLASH_TORCH_REASON = (
    "softmax attention on the CPU that torch's own FlashAttention kernel "
    "(aten::_scaled_dot_product_flash_attention_for_cpu) computes the same way"
)

FLASH_EXPLICIT_REASON = (
    "dropout_p > 0 drops weights, which the tiles never store: the weights are "
    "formed, dropped as torch does (torch.dropout) and averaged, as in "
    "torch.nn.functional.scaled_dot_product_attention"
)


def flash_decision(
    *,
    kernel: DispatchDecision,
    dropout: bool,
    tiled: bool,
    additive: bool,
    have_cpu_kernel: bool,
    device_types: set[str],
    transforms: bool,
    sinks: bool,
    dtype: torch.dtype,
    ndims: tuple[int, ...],
    same_head_size: bool,
    grouped_with_mask_or_causal: bool,
    same_batch: bool,
    empty: bool,
    bottom_right: bool,
    mask_ndim_fits: bool,
    has_mask: bool,
    empty_row: Callable[[], bool],
    finite: Callable[[], bool],
) -> tuple[str, str]:
    """The rule of :func:`~softmaxbook.flash_attention`, on plain facts.

    Returns ``(path, reason)``. ``kernel`` is :func:`kernel_decision`'s answer
    (the Triton kernels first). torch's CPU kernel is taken only where it gives
    this library's results: no sinks, float32 or float64, one batch shape for q,
    k and v (no broadcasting; grouped heads only without a mask or causality),
    ``Dv == D``, torch's causal alignment, and no row with nothing to attend (the
    kernel gives such a row a logsumexp of 0, not ``-inf``: ``empty_row`` is
    asked last, since it reads the mask). With a mask, q and k must be finite
    (``finite``): the kernel adds the mask, so a nan at a masked key would reach
    the output.
    """
    if dropout:
        return "explicit", FLASH_EXPLICIT_REASON
    if kernel.path == "triton":
        if additive:
            return "tiles", "the Triton kernel takes a boolean mask, not a float one"
        return kernel.path, kernel.reason

    def tiles(reason: str) -> tuple[str, str]:
        return "tiles", reason

    if tiled:
        return tiles("block_size= or explicit=True forces the library's tile loops")
    if not have_cpu_kernel:
        return tiles("this torch has no CPU FlashAttention operator")
    if device_types != {"cpu"}:
        return tiles(kernel.reason)
    if transforms:
        return tiles(
            "a torch.func transform is active: the tile loops batch under vmap"
        )
    if sinks:
        return tiles("sink logits are merged into the tile loops' state")
    if dtype not in FLASH_TORCH_DTYPES:
        return tiles(
            f"{dtype}: the tile loops compute in float32 and round once to "
            "the input's dtype"
        )
    if not all(2 <= n <= 4 for n in ndims) or len(set(ndims)) != 1:
        return tiles("the fused kernel takes tensors of 2 to 4 dimensions, all alike")
    if not same_head_size:
        return tiles("the value head size differs from the query head size")
    if grouped_with_mask_or_causal:
        return tiles(
            "grouped query heads with a mask or causality fold into the tiles' rows"
        )
    if not same_batch:
        return tiles("the batch shapes of q, k and v differ (broadcasting)")
    if empty:
        return tiles("an empty dimension: nothing for a kernel to do")
    if bottom_right:
        return tiles("the fused kernel aligns a causal mask top-left only")
    if has_mask:
        if not mask_ndim_fits:
            return tiles("the mask has more dimensions than q")
        if empty_row():
            return tiles("a row has nothing to attend: the tile loops give it zeros")
        if not finite():
            return tiles(
                "q or k holds a nan or infinity, which a masked key must not pass on"
            )
    return "torch-fused", FLASH_TORCH_REASON
