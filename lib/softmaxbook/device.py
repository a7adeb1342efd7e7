"""Where the book's computations run: CUDA, then Apple MPS, then the CPU.

The same notebooks and functions run on a laptop and on a GPU server; this
module is the one place that decides which. Set the environment variable
``SOFTMAXBOOK_DEVICE`` (``cpu``, ``cuda``, ``cuda:1``, ``mps``) to override
the choice, for example to compare a GPU machine's results with the CPU's.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import torch

__all__ = [
    "get_device",
    "DEVICE_ENV_VAR",
    "explain_dispatch",
    "DispatchDecision",
    "triton_available",
]

#: Name of the environment variable that overrides :func:`get_device`.
DEVICE_ENV_VAR = "SOFTMAXBOOK_DEVICE"


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def _check_available(device: torch.device) -> torch.device:
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"{DEVICE_ENV_VAR}={device} was requested but CUDA is not available "
                "(no NVIDIA GPU, or a CPU-only build of torch)"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise RuntimeError(
                f"{DEVICE_ENV_VAR}={device} was requested but only "
                f"{torch.cuda.device_count()} CUDA device(s) exist"
            )
    elif device.type == "mps" and not _mps_available():
        raise RuntimeError(
            f"{DEVICE_ENV_VAR}={device} was requested but Apple MPS is not available"
        )
    elif device.type not in {"cpu", "cuda", "mps"}:
        raise ValueError(
            f"{DEVICE_ENV_VAR}={device} is not supported; expected 'cpu', 'cuda', 'cuda:N' or 'mps'"
        )
    return device


def get_device(prefer: str | torch.device | None = None) -> torch.device:
    """Return the device the book computes on.

    The order is: ``prefer`` if given, else the ``SOFTMAXBOOK_DEVICE``
    environment variable if set, else CUDA if available, else Apple MPS if
    available, else the CPU.

    Parameters
    ----------
    prefer : str or torch.device, optional
        An explicit choice, checked like the environment variable.

    Raises
    ------
    ValueError
        If the requested device string is not a device torch knows.
    RuntimeError
        If the requested device is not available on this machine.
    """
    requested = (
        prefer if prefer is not None else os.environ.get(DEVICE_ENV_VAR, "").strip()
    )
    if requested:
        try:
            device = torch.device(requested)
        except (RuntimeError, TypeError) as err:
            raise ValueError(
                f"{DEVICE_ENV_VAR}={requested!r} is not a device; expected 'cpu', 'cuda', 'cuda:N' or 'mps'"
            ) from err
        return _check_available(device)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if _mps_available():
        return torch.device("mps")
    return torch.device("cpu")


# --------------------------------------------------------------------------------------
# Which code path a call takes: the Triton kernels or the torch code
# --------------------------------------------------------------------------------------

#: Operations with a Triton kernel, and :func:`explain_dispatch`'s names for them.
KERNEL_OPS = ("softmax", "flash_attention")

#: Dtypes the Triton kernels accept (float64 and others stay on the torch path).
_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

#: The widest row the fused softmax kernel holds in registers in one piece.
SOFTMAX_KERNEL_MAX_COLS = 65536

#: The largest head dimension the FlashAttention kernel accepts.
ATTENTION_KERNEL_MAX_HEAD_DIM = 256


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


def explain_dispatch(op: str, *tensors: torch.Tensor) -> DispatchDecision:
    """Report whether a call of ``op`` on ``tensors`` runs the Triton kernel or the torch code.

    The library's functions take this same decision, so the report is what
    they do: the Triton kernel when every tensor is on a CUDA device, Triton
    is installed, the dtype is float16, bfloat16 or float32, no gradient is
    needed (the kernels are forward-only) and the shape fits the kernel;
    otherwise the torch code, which gives the same result up to rounding.

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
    else:
        width = tensors[0].shape[-1] if tensors[0].dim() else 0
    return _decide(
        op,
        device_types={t.device.type for t in tensors},
        dtypes={t.dtype for t in tensors},
        needs_grad=needs_grad,
        width=width,
        have_triton=triton_available(),
    )


def _decide(
    op, *, device_types, dtypes, needs_grad, width, have_triton
) -> DispatchDecision:
    """The dispatch rule itself, on plain facts (so that it can be tested without a GPU)."""

    def torch_path(reason):
        return DispatchDecision(op, "torch", reason)

    if device_types != {"cuda"}:
        where = ", ".join(sorted(device_types))
        return torch_path(
            f"the tensors are on {where}, and the Triton kernels run on CUDA devices only"
        )
    if not have_triton:
        return torch_path("Triton is not installed (pip install triton)")
    bad = sorted(str(d) for d in dtypes if d not in _KERNEL_DTYPES)
    if bad:
        return torch_path(
            f"the kernels take float16, bfloat16 or float32, not {', '.join(bad)}"
        )
    if len(dtypes) > 1:
        return torch_path("the tensors have different dtypes")
    if needs_grad:
        return torch_path(
            "a gradient is required and the kernels compute the forward pass only"
        )
    if op == "softmax" and width > SOFTMAX_KERNEL_MAX_COLS:
        return torch_path(
            f"rows of {width} entries exceed the fused kernel's "
            f"{SOFTMAX_KERNEL_MAX_COLS} (one row is held on chip in one piece)"
        )
    if op == "flash_attention" and width > ATTENTION_KERNEL_MAX_HEAD_DIM:
        return torch_path(
            f"head dimension {width} exceeds the kernel's {ATTENTION_KERNEL_MAX_HEAD_DIM}"
        )
    return DispatchDecision(
        op, "triton", "CUDA tensors and Triton is installed: the fused kernel"
    )
