"""Which code path a call takes: a Triton kernel, or the library's torch code.

The rule lives next to the kernels it routes to, and it reads only facts
about the arguments (device, dtype, whether a gradient is needed, shapes),
so :func:`explain_dispatch` reports exactly what the library does, and the
rule is tested on plain facts, without a GPU.

Of the two operations with a Triton kernel, only
:func:`~softmaxbook.flash_attention` dispatches on its own (a fused kernel is
its purpose): to the Triton kernels on CUDA, to torch's own CPU FlashAttention
kernel where that computes the same thing (``path="fused"``), and otherwise to
the library's tile loops (``"torch"``; ``"dropout"`` when it drops weights).
The softmax kernel is opt-in: :func:`~softmaxbook.kernels.fused_softmax`
applies this rule, :func:`~softmaxbook.softmax` never does.

:func:`~softmaxbook.scaled_dot_product_attention` has a rule of its own
(``sdpa_decision``): where the semantics are the same (the softmax
normalizer, no sinks, no returned weights, finite scores) it hands the work to
torch's fused kernel, ``path="fused"``; otherwise it computes the scores, the
weights and their average in the open, ``path="explicit"``.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["explain_dispatch", "DispatchDecision", "triton_available"]

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

    ``path`` is ``"triton"`` (the fused kernels of :mod:`softmaxbook.kernels`)
    or ``"torch"`` (the library's torch code); ``"flash_attention"`` may also
    take ``"fused"`` (torch's own CPU FlashAttention kernel) or ``"dropout"``
    (the weights formed and dropped); for ``"scaled_dot_product_attention"``
    it is ``"fused"`` (torch's fused kernel,
    ``torch.nn.functional.scaled_dot_product_attention``) or ``"explicit"``
    (scores, weights and their average computed in the open).
    ``reason`` is one sentence. ``str(decision)`` reads
    ``"flash_attention -> torch: ..."``.
    """

    op: str
    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.op} -> {self.path}: {self.reason}"


_FOUND: dict = {}


def triton_available() -> bool:
    """True when the ``triton`` package is installed (checked without importing it).

    Looked up once per process (every attention call asks, and a lookup searches
    the import path): a package installed later is seen after a restart.
    """
    find = importlib.util.find_spec
    if find not in _FOUND:
        _FOUND[find] = find("triton") is not None
    return _FOUND[find]


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
    gives the same result up to rounding. For ``"flash_attention"`` that is
    torch's own CPU kernel (``"fused"``) where it computes the same thing,
    else the library's tile loops (``"torch"``, also forced by
    ``explicit=True`` or ``block_size=``); pass its keyword arguments too.

    For ``"scaled_dot_product_attention"``, pass ``q, k, v`` and the keyword
    arguments of the call (``mask`` or ``attn_mask``, boolean or float,
    ``dropout_p``, ``is_causal``, ``normalizer``, ``sinks``,
    ``return_weights``, ``enable_gqa``, ``scale``, ``explicit``): the path is
    ``"fused"`` (torch's fused kernel) when the semantics are the same, float
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
    'fused'
    >>> sb.explain_dispatch("flash_attention", q, q, q).path  # on the CPU
    'fused'
    >>> sb.explain_dispatch("flash_attention", q, q, q, explicit=True).path
    'torch'
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
    """The kernels' own rule for ``op`` (a name in ``KERNEL_OPS``): ``"triton"`` or
    ``"torch"``, from the tensors alone.

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
        width = max((t.shape[-1] for t in tensors if t.dim()), default=0)
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
        return DispatchDecision(op, "torch", reason)

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

#: The dtypes torch's fused CPU kernel takes (and the explicit path too).
FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

FUSED_REASON = (
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

    Returns ``(path, reason)``: ``"fused"`` hands the call to torch's fused
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
    if dtype not in FUSED_DTYPES:
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
    return "fused", FUSED_REASON
