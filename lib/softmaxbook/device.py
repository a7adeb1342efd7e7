"""Where the book's computations run: CUDA, then Apple MPS, then the CPU.

The same notebooks and functions run on a laptop and on a GPU server; this
module is the one place that decides which. Set the environment variable
``SOFTMAXBOOK_DEVICE`` (``cpu``, ``cuda``, ``cuda:1``, ``mps``) to override
the choice, for example to compare a GPU machine's results with the CPU's.
"""

from __future__ import annotations

import os

import torch

# The kernel dispatch policy moved next to the kernels (softmaxbook.kernels.dispatch);
# these names stay importable from here, as they were.
from .kernels.dispatch import (  # noqa: F401
    DispatchDecision,
    explain_dispatch,
    triton_available,
)

__all__ = ["get_device", "DEVICE_ENV_VAR"]

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
            f"{DEVICE_ENV_VAR}={device} is not supported; "
            "expected 'cpu', 'cuda', 'cuda:N' or 'mps'"
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

    Examples
    --------
    >>> import softmaxbook as sb
    >>> sb.get_device("cpu")
    device(type='cpu')
    >>> sb.get_device().type in {"cuda", "mps", "cpu"}
    True
    """
    requested = (
        prefer if prefer is not None else os.environ.get(DEVICE_ENV_VAR, "").strip()
    )
    if requested:
        try:
            device = torch.device(requested)
        except (RuntimeError, TypeError) as err:
            raise ValueError(
                f"{DEVICE_ENV_VAR}={requested!r} is not a device; "
                "expected 'cpu', 'cuda', 'cuda:N' or 'mps'"
            ) from err
        return _check_available(device)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if _mps_available():
        return torch.device("mps")
    return torch.device("cpu")
