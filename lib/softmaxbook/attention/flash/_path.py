"""The facts of a :func:`~softmaxbook.flash_attention` call, for the dispatch rule.

The rule itself is :func:`softmaxbook.kernels.dispatch.flash_decision`, in the
one dispatch module; here a resolved call is turned into its plain facts, and
``explain_dispatch("flash_attention", ...)`` resolves a call as
:func:`~softmaxbook.flash_attention` does and reports the path.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..._numerics import functorch_active
from ...kernels import dispatch as _dispatch
from .._args import AttentionArgs, resolve_attention
from . import _fused
from ._layout import block_sizes

__all__ = ["decide", "explain", "fits_fused", "mask_fits_fused", "rows_keep_a_key"]


def rows_keep_a_key(mask: Tensor) -> Tensor:
    """Whether every row of ``mask`` (boolean, or additive with ``-inf`` for masked
    keys) keeps a key, as a 0-dim boolean tensor: one pass, no mask-sized
    temporary (a row keeps a key when its largest additive entry is above -inf)."""
    if mask.dtype == torch.bool:
        return mask.any(dim=-1).all()
    return (mask.amax(dim=-1) > float("-inf")).all()


def fits_fused(q: Tensor, k: Tensor, mask: Tensor) -> Tensor:
    """The two conditions of the torch-fused path that read values, as a 0-dim
    boolean tensor: every row of ``mask`` keeps a key, and q and k are finite
    (torch's kernel adds the mask to the scores, so a nan at a masked key would
    reach the row)."""
    # A finite sum means finite entries (a sum that overflows only sends the call to
    # the tile loops, which is always correct).
    return rows_keep_a_key(mask) & torch.isfinite(q.sum() + k.sum())


def mask_fits_fused(q: Tensor, k: Tensor, mask: Tensor) -> bool:
    """:func:`fits_fused`, read."""
    return bool(fits_fused(q, k, mask))


def decide(
    q: Tensor, k: Tensor, v: Tensor, args: AttentionArgs, tiled: bool
) -> tuple[str, str]:
    """``(path, reason)`` of a resolved call (a name of ``dispatch.PATHS``)."""
    groups = args.groups
    kv_batch = q.shape[:-3] + (q.shape[-3] // groups,) if groups > 1 else None
    want = q.shape[:-2] if kv_batch is None else kv_batch
    mask = args.mask

    def empty_row() -> bool:
        assert mask is not None
        if torch.compiler.is_compiling():
            # The values are not known while torch.compile traces: the operator
            # reads them when it runs (mask_fits_fused) and takes the tile loops
            # for a row with nothing to attend.
            return False
        keep = mask != float("-inf") if args.additive else mask
        return not bool(keep.any(dim=-1).all())

    def finite() -> bool:
        if torch.compiler.is_compiling():
            return True  # read when the operator runs, as above
        return bool(torch.isfinite(q).all() and torch.isfinite(k).all())

    return _dispatch.flash_decision(
        kernel=_dispatch.kernel_decision("flash_attention", q, k, v),
        dropout=args.dropout_p > 0.0,
        tiled=tiled,
        additive=args.additive,
        have_cpu_kernel=_fused.available(),
        device_types={q.device.type, k.device.type, v.device.type},
        transforms=functorch_active(),
        sinks=args.sinks is not None,
        dtype=q.dtype,
        ndims=(q.dim(), k.dim(), v.dim()),
        same_head_size=q.shape[-1] == v.shape[-1],
        grouped_with_mask_or_causal=groups > 1
        and (mask is not None or args.causal is not None),
        same_batch=k.shape[:-2] == want and v.shape[:-2] == want,
        empty=q.numel() == 0 or k.numel() == 0,
        bottom_right=args.causal == "bottom_right",
        mask_ndim_fits=mask is None or mask.dim() <= q.dim(),
        has_mask=mask is not None,
        empty_row=empty_row,
        finite=finite,
    )


def explain(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    attn_mask: Tensor | None = None,
    is_causal: bool | str = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    block_size: int | tuple[int, int] | None = None,
    enable_gqa: bool = False,
    sinks: Tensor | None = None,
    explicit: bool = False,
    return_lse: bool = False,
) -> tuple[str, str]:
    """``(path, reason)`` of a :func:`flash_attention` call (``explain_dispatch``)."""
    args = resolve_attention(
        q, k, v, mask=mask, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
        sinks=sinks, enable_gqa=enable_gqa, dropout_p=dropout_p,
        caller="flash_attention",
    )  # fmt: skip
    block_sizes(block_size)
    return decide(q, k, v, args, explicit or block_size is not None)
