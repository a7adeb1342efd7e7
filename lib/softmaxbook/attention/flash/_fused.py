"""The adaptor to torch's own FlashAttention kernel for the CPU.

``aten::_scaled_dot_product_flash_attention_for_cpu`` and its backward compute
FlashAttention compiled; :mod:`softmaxbook.kernels.dispatch` decides when they
compute the same thing as the library's tile loops (the ``"torch-fused"``
path). Here the calls are brought to the kernel's conventions: 4-dimensional
``(B, H, L, D)`` tensors, an additive mask of ``q``'s dtype, and grouped query
heads stacked as rows of their key head.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..._numerics import acc_dtype as _acc

__all__ = [
    "FORWARD",
    "BACKWARD",
    "available",
    "as_additive",
    "forward",
    "backward",
    "keeps_layout",
    "empty_outputs",
    "empty_grads",
]


def _aten(name: str) -> Any:
    """The operator ``aten::name``, or None where this torch has none."""
    try:
        return getattr(torch.ops.aten, name).default
    except (AttributeError, RuntimeError):
        return None


#: torch's FlashAttention kernel for the CPU, forward and backward (None where this
#: torch has no such operator: the torch-fused path is then never taken).
FORWARD = _aten("_scaled_dot_product_flash_attention_for_cpu")
BACKWARD = _aten("_scaled_dot_product_flash_attention_for_cpu_backward")


def available() -> bool:
    """Whether this torch has the CPU kernel, forward and backward."""
    return FORWARD is not None and BACKWARD is not None


def as_additive(keep: Tensor, dtype: torch.dtype) -> Tensor:
    """A boolean mask as an additive one: True (may attend) -> 0, False -> -inf."""
    zeros = torch.zeros(keep.shape, dtype=dtype, device=keep.device)
    return zeros.masked_fill_(~keep, float("-inf"))


def _as_4d(x: Tensor) -> Tensor:
    """``(L, D)`` or ``(B, L, D)`` as the ``(B, H, L, D)`` torch's kernel takes."""
    while x.dim() < 4:
        x = x.unsqueeze(0 if x.dim() == 2 else 1)
    return x


def _kernel_mask(mask: Tensor | None, q: Tensor) -> Tensor | None:
    """The mask as torch's kernel takes it: additive, q's dtype, 4 dimensions that
    broadcast against ``_as_4d(q)``."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        mask = as_additive(mask, q.dtype)
    if q.dim() == 3 and mask.dim() == 3:  # (B, L, S) -> (B, 1, L, S)
        mask = mask.unsqueeze(1)
    while mask.dim() < 4:  # the kernel takes 2 or 4 dimensions: (S,), (H, L, S) ...
        mask = mask.unsqueeze(0)
    return mask


def _fold_groups(q: Tensor, k: Tensor) -> Tensor:
    """Grouped query heads ``(..., Hq, L, D)`` as rows ``(..., Hkv, G * L, D)``: the
    G query heads of one key head attend to it as one longer block of queries
    (without a mask or causality, rows do not know their position)."""
    hk = k.shape[-3]
    return q.reshape(q.shape[:-3] + (hk, -1, q.shape[-1]))


def forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    causal: bool,
    scale: float,
    gqa: bool,
) -> tuple[Tensor, Tensor]:
    """The output ``(..., L, Dv)`` and the logsumexp ``(..., L)`` of torch's kernel."""
    assert FORWARD is not None
    shape = q.shape
    if gqa:
        q = _fold_groups(q, k)
    out, lse = FORWARD(
        _as_4d(q),
        _as_4d(k),
        _as_4d(v),
        0.0,
        causal,
        attn_mask=_kernel_mask(mask, q),
        scale=scale,
    )
    if q.dim() < 4 or gqa:
        out, lse = out.reshape(shape[:-1] + v.shape[-1:]), lse.reshape(shape[:-1])
    return out, lse


def backward(
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    mask: Tensor | None,
    causal: bool,
    scale: float,
    gqa: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` of torch's kernel, shaped like ``q``, ``k``, ``v``."""
    assert BACKWARD is not None
    shapes = q.shape, k.shape, v.shape
    if gqa:
        q, out, grad_out = (_fold_groups(t, k) for t in (q, out, grad_out))
    if q.dim() < 4 or gqa:
        lse = lse.reshape(_as_4d(q).shape[:-1])
    grads = BACKWARD(
        _as_4d(grad_out),
        _as_4d(q),
        _as_4d(k),
        _as_4d(v),
        _as_4d(out),
        lse,
        0.0,
        causal,
        attn_mask=_kernel_mask(mask, q),
        scale=scale,
    )
    dq, dk, dv = (
        g if g.shape == s else g.reshape(s) for g, s in zip(grads, shapes, strict=True)
    )
    return dq, dk, dv


# The layouts torch's kernel returns, as its meta functions state them (the fake
# kernels of softmaxbook::flash_attention promise the same, so a compiled graph takes
# the kernel's outputs as they come, without a copy): the output like q, the
# logsumexp (B, L, H) transposed, the gradients (B, L, H, D) transposed.


def keeps_layout(q: Tensor, groups: int) -> bool:
    """Whether the outputs are the kernel's own: 4-D q without grouped heads (other
    calls are reshaped around the kernel, and their outputs are made contiguous)."""
    return q.dim() == 4 and groups == 1


def empty_outputs(q: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Empty ``(out, lse)`` in the layouts of the kernel's forward pass."""
    B, H, L = q.shape[:3]
    out = torch.empty_like(q) if v.shape[-1] == q.shape[-1] else None
    if out is None:  # the kernel takes one head dimension; keep its stride order
        out = torch.empty_permuted((B, H, L, v.shape[-1]), (0, 2, 1, 3), dtype=q.dtype,
                                   device=q.device)  # fmt: skip
    lse = torch.empty((B, L, H), dtype=_acc(q.dtype), device=q.device).transpose(1, 2)
    return out, lse


def empty_grads(*tensors: Tensor) -> tuple[Tensor, ...]:
    """Empty gradients of ``tensors`` in the layout of the kernel's backward pass."""
    return tuple(
        torch.empty_permuted(t.shape, (0, 2, 1, 3), dtype=t.dtype, device=t.device)
        for t in tensors
    )
