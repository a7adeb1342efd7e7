"""Which code path a call takes: a Triton kernel, or the library's torch code.

The rule lives next to the kernels it routes to, and it reads only facts
about the arguments (device, dtype, whether a gradient is needed, shapes),
so :func:`explain_dispatch` reports exactly what the library does, and the
rule is tested on plain facts, without a GPU.

Only :func:`~softmaxbook.flash_attention` dispatches on its own (a fused
kernel is its purpose). The softmax kernel is opt-in:
:func:`~softmaxbook.kernels.fused_softmax` applies this rule,
:func:`~softmaxbook.softmax` never does.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import torch

__all__ = ["explain_dispatch", "DispatchDecision", "triton_available"]

#: Operations with a Triton kernel, and :func:`explain_dispatch`'s names for them.
KERNEL_OPS = ("softmax", "flash_attention")

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
    or ``"torch"`` (the library's torch code); ``reason`` is one sentence.
    ``str(decision)`` reads ``"flash_attention -> torch: ..."``.
    """

    op: str
    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.op} -> {self.path}: {self.reason}"


def triton_available() -> bool:
    """True when the ``triton`` package is installed (checked without importing it)."""
    return importlib.util.find_spec("triton") is not None


def interpreter_enabled() -> bool:
    """True when Triton runs (or, once imported, will run) kernels in its
    interpreter."""
    value = os.environ.get(INTERPRETER_ENV_VAR, "0").strip().lower()
    return value in {"1", "true", "on", "yes"}


def explain_dispatch(op: str, *tensors: torch.Tensor) -> DispatchDecision:
    """Report whether ``op`` on ``tensors`` runs a Triton kernel or the torch code.

    The library's functions take this same decision, so the report is what
    they do: the Triton kernel when every tensor is on a CUDA device, Triton
    is installed, the dtype is float16, bfloat16 or float32, the shape fits
    the kernel and, for ``"softmax"``, no gradient is needed (its kernel is
    forward-only; FlashAttention has a backward kernel too); otherwise the
    torch code, which gives the same result up to rounding.

    Shapes: for ``"softmax"`` pass the input (normalized along its last
    dimension); for ``"flash_attention"`` pass ``q, k, v``.

    Parameters
    ----------
    op : str
        ``"softmax"`` or ``"flash_attention"`` (the names in ``KERNEL_OPS``).
    *tensors : Tensor
        The arguments the call would get.

    Returns
    -------
    DispatchDecision
        ``path`` (``"triton"`` or ``"torch"``) and a one-sentence ``reason``.

    Raises
    ------
    ValueError
        If ``op`` is unknown or no tensor is given.
    TypeError
        If an argument is not a tensor.
    """
    if op not in KERNEL_OPS:
        raise ValueError(f"op={op!r} is unknown; expected one of {list(KERNEL_OPS)}")
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
    op, *, device_types, dtypes, needs_grad, width, have_triton, interpreter
) -> DispatchDecision:
    """The dispatch rule itself, on plain facts (testable without a GPU).

    ``width`` is the row length for ``"softmax"``, and the largest head size
    (``D`` of q and k, ``Dv`` of v) for ``"flash_attention"``.
    """

    def torch_path(reason):
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
