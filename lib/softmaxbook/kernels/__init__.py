r"""Triton kernels behind the library's functions: a fused row softmax and
FlashAttention, forward and backward.

On a CUDA device with Triton installed, :func:`fused_softmax` and
:func:`~softmaxbook.flash_attention` run these kernels; everywhere else they run
torch code: ``torch.softmax``, and for attention on the CPU torch's own compiled
FlashAttention kernel where it computes the same thing, otherwise the library's
tile loops (:func:`~softmaxbook.explain_dispatch` reports which, and why).
Triton is imported only when a kernel is first launched, so the library
imports and works without it.

Without a GPU the kernels still run, slowly, in Triton's interpreter, which
executes each program instance in NumPy on the CPU. That is how the tests check
them on a CPU-only machine, and how a reader steps through them. The
interpreter must be chosen before Triton is first imported in the process:
set the environment variable ``TRITON_INTERPRET=1`` before starting Python, or
call :func:`enable_interpreter` before anything imports ``triton``.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

from .._numerics import causal_offset
from .._validate import check_attention_args, check_causal, check_dim, check_float
from . import dispatch
from .dispatch import (
    INTERPRETER_ENV_VAR,
    DispatchDecision,
    explain_dispatch,
    interpreter_enabled,
    triton_available,
)

__all__ = [
    "fused_softmax",
    "triton_softmax",
    "triton_flash_attention",
    "triton_flash_forward",
    "triton_flash_backward",
    "enable_interpreter",
    "interpreter_enabled",
    "triton_available",
    "explain_dispatch",
    "DispatchDecision",
    "kernel_source",
    "flash_launch_config",
]


def enable_interpreter() -> bool:
    """Make Triton run kernels in its interpreter, on CPU tensors; return True.

    Sets ``TRITON_INTERPRET=1``. Triton reads it when it is imported (its
    standard library of ``tl.max``, ``tl.sum`` ... is compiled then), so this
    must happen before the first ``import triton`` in the process. Calling it
    again, or after Triton was imported with the interpreter on, is harmless.

    Raises
    ------
    ImportError
        If Triton is not installed.
    RuntimeError
        If Triton was already imported without the interpreter.
    """
    if not triton_available():
        raise ImportError(
            "Triton is not installed; pip install triton (or softmaxbook[gpu])"
        )
    if "triton" in sys.modules and not interpreter_enabled():
        raise RuntimeError(
            "Triton was already imported without its interpreter; restart Python "
            "and call softmaxbook.kernels.enable_interpreter() (or set "
            "TRITON_INTERPRET=1) before "
            "anything imports triton"
        )
    os.environ[INTERPRETER_ENV_VAR] = "1"
    return True


def _backend() -> ModuleType:
    """Import the Triton kernels on first use, with a clear error when that cannot
    work."""
    if not triton_available():
        raise ImportError(
            "Triton is not installed; pip install triton (or softmaxbook[gpu])"
        )
    from . import _triton

    return _triton


def _check_runnable(t: Tensor, name: str) -> None:
    if t.device.type == "cuda":
        if interpreter_enabled():
            raise RuntimeError(
                f"{name} is on a CUDA device but TRITON_INTERPRET=1 forces Triton's "
                "CPU interpreter; unset it to run the kernels natively"
            )
        return
    if t.device.type != "cpu":
        raise ValueError(
            f"{name} is on {t.device}; the Triton kernels run on CUDA devices, "
            "or on the CPU in Triton's interpreter"
        )
    if not interpreter_enabled():
        raise RuntimeError(
            f"{name} is on the CPU, where Triton kernels run only in its "
            "interpreter: call softmaxbook.kernels.enable_interpreter() before "
            "anything imports triton "
            "(or set TRITON_INTERPRET=1), or use a CUDA tensor"
        )


def triton_softmax(x: Tensor, dim: int = -1) -> Tensor:
    r"""Softmax by the fused Triton kernel: one program per row, one read and one write.

    Each program loads its whole row into registers, takes the maximum, the
    exponentials and their sum there, and writes the normalized row: the
    input is read from memory once and the output written once, the minimum
    for any softmax. Computed in float32 and stored in the input's dtype.
    Runs natively on CUDA tensors and in Triton's interpreter on CPU tensors
    (see :func:`enable_interpreter`).

    Shapes: ``x`` is ``(..., N)``; the result has the same shape and dtype.

    Equivalent to ``torch.softmax(x, dim)`` (a row of all ``-inf`` gives
    ``nan``, as in torch):

    >>> import torch
    >>> from softmaxbook import kernels
    >>> kernels.enable_interpreter()  # CPU tensors: before anything imports triton
    True
    >>> x = torch.randn(4, 100)
    >>> torch.allclose(kernels.triton_softmax(x), torch.softmax(x, -1), atol=1e-6)
    True

    Raises
    ------
    TypeError
        If ``x`` is not a float16, bfloat16 or float32 tensor.
    ValueError
        If a row is wider than the kernel's limit, 65536 entries
        (``SOFTMAX_KERNEL_MAX_COLS``).
    RuntimeError
        If ``x`` is on the CPU and the interpreter is not enabled.
    """
    check_float(x)
    dim = check_dim(x, dim)
    _check_kernel_dtype(x, "x")
    _check_runnable(x, "x")
    width = x.shape[dim] if x.dim() else 1
    if width > dispatch.SOFTMAX_KERNEL_MAX_COLS:
        raise ValueError(
            f"x has rows of {width} entries along dim={dim}; the fused kernel holds "
            f"a row of at most {dispatch.SOFTMAX_KERNEL_MAX_COLS} in one piece "
            "(fused_softmax falls back to torch.softmax for wider rows)"
        )
    return _backend().softmax(x, dim)


def fused_softmax(x: Tensor, dim: int = -1) -> Tensor:
    r"""Softmax that runs :func:`triton_softmax` where it can and ``torch.softmax``
    elsewhere.

    The dispatch of :func:`~softmaxbook.explain_dispatch` ``("softmax", x)``:
    the Triton kernel for CUDA tensors when Triton is installed and no
    gradient is needed, torch otherwise. Both give the same result up to
    rounding.

    Shapes: ``x`` is ``(..., N)``; the result has the same shape and dtype.

    Equivalent to ``torch.softmax(x, dim)``:

    >>> import torch
    >>> from softmaxbook import kernels
    >>> x = torch.randn(4, 100)
    >>> torch.allclose(kernels.fused_softmax(x), torch.softmax(x, -1), atol=1e-6)
    True
    """
    check_float(x)
    dim = check_dim(x, dim)
    if explain_dispatch("softmax", x.movedim(dim, -1)).path == "triton":
        return _backend().softmax(x, dim)
    return torch.softmax(x, dim=dim)


def triton_flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    is_causal: bool | str = False,
    scale: float | None = None,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    r"""FlashAttention's forward pass as one Triton kernel.

    One program computes a block of query rows: it loads the queries once,
    streams the key and value tiles through on-chip memory with the online
    softmax (running maximum, running sum, rescaled output accumulator) and
    writes only the output rows and their logsumexp. The scores exist only
    tile by tile, in registers, in base 2: ``log2(e)`` is folded into the
    scale, so that ``exp2`` replaces ``exp``. Runs natively on CUDA tensors
    and in Triton's interpreter on CPU tensors (see
    :func:`enable_interpreter`).

    This is the forward kernel alone, with no autograd graph:
    :func:`~softmaxbook.flash_attention` runs it on a GPU together with the
    backward kernels (:func:`triton_flash_backward`), and adds grouped-query
    heads and sinks.

    Shapes: as :func:`~softmaxbook.flash_attention`: ``q`` ``(..., L, D)``,
    ``k`` ``(..., S, D)``, ``v`` ``(..., S, Dv)`` with broadcasting batch
    dimensions; the result is ``(..., L, Dv)`` in the input dtype and the
    logsumexp ``(..., L)`` in float32.

    Equivalent to ``softmaxbook.flash_attention(q, k, v, mask=mask,
    is_causal=is_causal, scale=scale, return_lse=return_lse)``, and to
    torch's attention:

    >>> import torch
    >>> import torch.nn.functional as F
    >>> from softmaxbook import kernels
    >>> kernels.enable_interpreter()  # CPU tensors: before anything imports triton
    True
    >>> q, k, v = torch.randn(3, 2, 4, 40, 16).unbind(0)  # (B, H, L, D) each
    >>> out = kernels.triton_flash_attention(q, k, v, is_causal=True)
    >>> expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    >>> torch.allclose(out, expected, atol=1e-5)
    True

    Raises
    ------
    TypeError, ValueError
        For bad input, as :func:`~softmaxbook.flash_attention`; also for a
        dtype other than float16, bfloat16, float32, for bfloat16 in Triton's
        CPU interpreter (its ``tl.dot`` cannot multiply bfloat16), and for a
        head dimension of q or v above ``ATTENTION_KERNEL_MAX_HEAD_DIM`` (256)
        of ``softmaxbook.kernels.dispatch``.
    RuntimeError
        If the tensors are on the CPU and the interpreter is not enabled, or
        a gradient is required (use :func:`~softmaxbook.flash_attention`).
    """
    align = check_causal(is_causal)
    batch, scale, keep = check_attention_args(q, k, v, mask, align is not None, scale)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise RuntimeError(
            "triton_flash_attention is the forward kernel alone and records no "
            "gradient; use softmaxbook.flash_attention, which runs the backward "
            "kernels too"
        )
    L, S, BH = q.shape[-2], k.shape[-2], math.prod(batch)

    def flat(t: Tensor) -> Tensor:  # (..., n, d) broadcast to the batch -> (BH, n, d)
        return t.expand(batch + t.shape[-2:]).reshape((BH,) + t.shape[-2:])

    causal = None if align is None else (L, causal_offset(align, L, S))
    mask3 = None if keep is None else keep.reshape(BH, L, S)
    out, lse = triton_flash_forward(
        flat(q), flat(k), flat(v), mask=mask3, causal=causal, scale=scale
    )
    out, lse = out.reshape(batch + (L, v.shape[-1])), lse.reshape(batch + (L,))
    return (out, lse) if return_lse else out


def triton_flash_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    causal: tuple[int, int] | None = None,
    scale: float,
) -> tuple[Tensor, Tensor]:
    r"""Launch the FlashAttention forward kernel on the flat layout.

    The layout :func:`~softmaxbook.flash_attention` brings every call to:
    ``q`` ``(BH, R, D)``, ``k`` ``(BH, S, D)``, ``v`` ``(BH, S, Dv)``, an
    optional boolean ``mask`` ``(BH, R, S)`` (True = may attend), and an
    optional causal rule ``(period, offset)``: row :math:`r` may attend to
    keys :math:`j \le r \bmod \text{period} + \text{offset}` (query heads of
    a group are stacked as rows, so positions repeat every ``period`` rows).

    Returns ``(out, lse)``: ``(BH, R, Dv)`` in the dtype of ``q``, and the
    logsumexp ``(BH, R)`` in float32 (``-inf`` for rows with nothing to
    attend, whose output is zeros).
    """
    _check_flat(q, k, v, mask)
    return _backend().flash_forward(_backend().Flat(q, k, v, mask, causal, scale))


def triton_flash_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    grad_out: Tensor,
    lse: Tensor,
    delta: Tensor,
    *,
    mask: Tensor | None = None,
    causal: tuple[int, int] | None = None,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    r"""Launch the two FlashAttention backward kernels on the flat layout.

    One program per block of keys keeps their :math:`dK, dV` in registers
    while the query blocks stream past; one program per block of queries
    does the same for :math:`dQ` (no atomics). Both recompute each tile of
    weights from the logsumexp, :math:`P = 2^{s_2 - \mathrm{lse}_2}` in base
    2, and use :math:`dS = P \circ (dP - \delta)`: no weight is stored. The
    price is recomputation: both kernels form the tile of scores :math:`S`
    and of :math:`dP`, so a tile costs 7 matrix products (4 in the first
    kernel, 3 in the second) against 4 from stored weights (:math:`dV, dP,
    dQ, dK`), and 5 in a single kernel that adds :math:`dQ` with atomics.

    Shapes: as :func:`triton_flash_forward`; ``grad_out`` ``(BH, R, Dv)``,
    ``lse`` and ``delta`` ``(BH, R)``, with :math:`\delta_r = \sum_d
    dO_{rd}\, O_{rd}` minus the gradient of the logsumexp. Returns ``(dq,
    dk, dv)`` in float32.
    """
    _check_flat(q, k, v, mask)
    problem = _backend().Flat(q, k, v, mask, causal, scale)
    return _backend().flash_backward(problem, grad_out, lse, delta)


def _check_flat(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float(t, name)
        if t.dim() != 3:
            raise ValueError(f"{name} must be (BH, length, dim), got {tuple(t.shape)}")
        _check_runnable(t, name)
    _check_kernel_dtype(q, "q")
    if q.dtype == torch.bfloat16 and q.device.type == "cpu":
        # Triton's interpreter multiplies the raw bit patterns of bfloat16 in tl.dot
        # (not supported upstream): the output would be garbage, silently.
        raise TypeError(
            "q is bfloat16, which Triton's CPU interpreter cannot multiply (tl.dot "
            "reads its raw bits); use float16 or float32 there, or a CUDA device"
        )
    limit = dispatch.ATTENTION_KERNEL_MAX_HEAD_DIM
    if max(q.shape[-1], v.shape[-1]) > limit:
        raise ValueError(
            f"the kernel takes head dimensions up to {limit}, got q "
            f"{tuple(q.shape)} and v {tuple(v.shape)}"
        )
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError(f"mask must be a boolean tensor, got dtype {mask.dtype}")


def _check_kernel_dtype(x: Tensor, name: str) -> None:
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(
            f"{name} must be float16, bfloat16 or float32 for the Triton kernels, "
            f"got {x.dtype}"
        )


def kernel_source(name: str) -> str:
    """The Triton source of a kernel, as text: ``"softmax"``, ``"flash_attention"``
    (the forward pass), ``"flash_attention_dkdv"`` and ``"flash_attention_dq"``
    (the backward pass).

    Read from the module file without importing Triton, so that the book can
    show the kernels on any machine.

    >>> from softmaxbook import kernels
    >>> print(kernels.kernel_source("softmax").splitlines()[1])
    def _softmax_kernel(x_ptr, y_ptr, n_cols, ...):
    """
    names = {
        "softmax": "_softmax_kernel",
        "flash_attention": "_flash_attention_kernel",
        "flash_attention_dkdv": "_flash_attention_dkdv_kernel",
        "flash_attention_dq": "_flash_attention_dq_kernel",
    }
    if name not in names:
        raise ValueError(f"name={name!r} is unknown; expected one of {sorted(names)}")
    text = (Path(__file__).with_name("_triton.py")).read_text()
    start = text.index(f"@triton.jit\ndef {names[name]}(")
    end = text.find("\n\n\n", start)
    return text[start : end if end != -1 else len(text)].rstrip() + "\n"


def flash_launch_config(
    head_dim: int, dtype: torch.dtype = torch.float32, *, backward: bool = False
) -> dict[str, int]:
    """The tiles and stages the Triton FlashAttention kernels launch with.

    Read from the kernels' own launch rule for a problem of this head dimension
    and dtype (Triton is imported, no GPU needed), so that a diagram or a table
    shows what the GPU kernel really uses: ``BLOCK_M`` query rows and
    ``BLOCK_N`` keys per tile, the head dimensions padded to ``BLOCK_D`` and
    ``BLOCK_DV``, ``num_stages`` of the pipeline and ``num_warps``, of the forward
    kernel or, with ``backward=True``, of the two backward kernels.

    Raises
    ------
    ImportError
        Where Triton is not installed.
    ValueError
        If ``head_dim`` is not an int >= 1.
    """
    from .._validate import check_positive_int

    head_dim = check_positive_int(head_dim, "head_dim")
    triton = _backend()
    x = torch.zeros(1, 1, head_dim, dtype=dtype)
    problem = triton.Flat(q=x, k=x, v=x, keep=None, causal=None, scale=1.0)
    consts = triton._launch_args(problem, backward=backward)[-1]
    config = {k: int(v) for k, v in consts.items() if k.startswith("BLOCK_")}
    stages = triton.BACKWARD_STAGES if backward else triton.FORWARD_STAGES
    config["num_stages"] = int(stages)
    if "num_warps" in consts:
        config["num_warps"] = int(consts["num_warps"])
    return config
