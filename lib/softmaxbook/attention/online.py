r"""Online (streaming) softmax: the normalizer in one pass over the data.

Milakov & Gimelshein (2018) observed that the maximum and the sum of
exponentials of a row can be accumulated together in one pass (element by
element in their paper, block by block here), if the running sum is rescaled
whenever the running maximum grows. This is the idea
that lets FlashAttention (:mod:`softmaxbook.attention.flash`) compute attention without
ever holding a whole row of scores; :func:`merge_attention_states` is the same
merge for two partial attention results.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._numerics import acc_dtype
from .._validate import check_dim, check_float, check_positive_int

__all__ = ["online_softmax", "merge_attention_states"]


def online_softmax(x: Tensor, dim: int = -1, *, block_size: int = 128) -> Tensor:
    r"""Softmax computed block by block with a running maximum and a rescaled running
    sum.

    For each block :math:`B` of ``block_size`` entries,

    .. math:: m' = \max(m, \max_{j \in B} x_j), \qquad
              d' = d\, e^{m - m'} + \sum_{j \in B} e^{x_j - m'}

    and finally :math:`p_i = e^{x_i - m} / d`. Equal to :func:`softmax`
    up to rounding; a row of all ``-inf`` gives zeros.

    Shapes: ``x`` is ``(..., N)``; the result has the same shape and dtype.
    The running state is computed in float32 at least (float64 stays float64).
    """
    check_float(x)
    dim = check_dim(x, dim)
    block_size = check_positive_int(block_size, "block_size")
    if x.dim() == 0:  # one row of one entry, as for softmax
        return online_softmax(x.reshape(1), 0, block_size=block_size).reshape(())
    acc = acc_dtype(x.dtype)
    xt = x.movedim(dim, -1).to(acc)  # (..., N)
    m = torch.full(xt.shape[:-1] + (1,), float("-inf"), dtype=acc, device=x.device)
    d = torch.zeros_like(m)
    for start in range(0, xt.shape[-1], block_size):
        m, alpha, p = online_step(m, xt[..., start : start + block_size])
        d = d * alpha + p.sum(dim=-1, keepdim=True)
    shift = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    p = torch.exp(xt - shift) / torch.where(d > 0, d, torch.ones_like(d))
    return p.to(x.dtype).movedim(-1, dim)


def online_step(
    m: Tensor, s: Tensor, *, base2: bool = False, inplace: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    r"""One step of the online softmax: a new block of scores ``s`` ``(..., n)``
    meets the running maximum ``m`` ``(..., 1)``.

    Returns ``(m', alpha, p)``: the new maximum :math:`m' = \max(m, \max_j s_j)`,
    the factor :math:`\alpha = e^{m - m'}` that rescales the running sums (and
    outputs) to it, and the block's weights :math:`p_j = e^{s_j - m'}`. A row
    with no key so far has :math:`m' = -\infty`: it is shifted by 0, so that
    :math:`e^{-\infty - (-\infty)}` (nan) never happens. With ``base2`` the
    scores are in base 2 (``exp2``); with ``inplace``, ``p`` overwrites ``s``.

    Every loop of the library that streams scores uses this step: the online
    softmax above, :func:`~softmaxbook.flash_attention`'s tile loops and
    :func:`~softmaxbook.flash_attention_steps`.
    """
    m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
    shift = m_new.masked_fill(torch.isneginf(m_new), 0.0)
    exp = torch.exp2 if base2 else torch.exp
    alpha = exp(m - shift)
    if inplace:
        p = s.sub_(shift).exp2_() if base2 else s.sub_(shift).exp_()
    else:
        p = exp(s - shift)
    return m_new, alpha, p


def merge_attention_states(
    out_a: Tensor,
    lse_a: Tensor,
    out_b: Tensor,
    lse_b: Tensor,
    *,
    out_dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Merge two partial attention results over disjoint key sets into one.

    If ``(out_a, lse_a)`` is attention over keys :math:`A` (with
    :math:`\mathrm{lse}_a = \log \sum_{j \in A} e^{s_j}`) and ``(out_b,
    lse_b)`` over keys :math:`B`, then attention over :math:`A \cup B` is

    .. math::

        \mathrm{lse} = \log\left(e^{\mathrm{lse}_a} + e^{\mathrm{lse}_b}\right),
        \qquad
        o = e^{\mathrm{lse}_a - \mathrm{lse}}\, o_a
          + e^{\mathrm{lse}_b - \mathrm{lse}}\, o_b .

    This is the step that lets split-K decoding and ring attention compute
    attention over keys held in different places and combine the pieces
    exactly. Merging with an empty part (``lse = -inf``, output 0) returns
    the other part; two empty parts give zeros and ``-inf``.

    Shapes: ``out_a``, ``out_b`` are ``(..., L, Dv)``; ``lse_a``, ``lse_b``
    are ``(..., L)``, as returned by ``flash_attention(..., return_lse=True)``.
    The result is ``(out, lse)`` with those shapes (batch dimensions
    broadcast); ``out`` has the dtype of ``out_a``, or ``out_dtype``. The
    merge itself runs in float32 at least.

    To merge many partial results of half-precision attention, keep the
    states in float32 (``out_dtype=torch.float32``) and round once at the
    end, as Flash-Decoding does: rounding each merged output to bfloat16
    adds one rounding error per merge.

    Equivalent to ``(w_a * out_a + w_b * out_b, lse)`` with
    ``lse = torch.logaddexp(lse_a, lse_b)`` and ``w = torch.exp(lse_x - lse)[...,
    None]``; merging two halves of the keys gives attention over all of them:

    >>> import torch
    >>> import softmaxbook as sb
    >>> q, k, v = torch.randn(4, 8), torch.randn(10, 8), torch.randn(10, 3)
    >>> out_a, lse_a = sb.flash_attention(q, k[:6], v[:6], return_lse=True)
    >>> out_b, lse_b = sb.flash_attention(q, k[6:], v[6:], return_lse=True)
    >>> out, lse = sb.merge_attention_states(out_a, lse_a, out_b, lse_b)
    >>> torch.allclose(out, sb.flash_attention(q, k, v), atol=1e-6)
    True

    Raises
    ------
    TypeError
        If an argument is not a floating tensor, or ``out_dtype`` is not a
        floating-point ``torch.dtype``.
    ValueError
        If the shapes do not fit together.
    """
    if out_dtype is not None and not (
        isinstance(out_dtype, torch.dtype) and out_dtype.is_floating_point
    ):
        raise TypeError(
            f"out_dtype must be a floating-point torch.dtype or None, got {out_dtype!r}"
        )
    for name, t in (
        ("out_a", out_a),
        ("lse_a", lse_a),
        ("out_b", out_b),
        ("lse_b", lse_b),
    ):
        check_float(t, name)
    for o_name, o, l_name, ell in (
        ("out_a", out_a, "lse_a", lse_a),
        ("out_b", out_b, "lse_b", lse_b),
    ):
        if o.dim() < 2 or tuple(ell.shape) != tuple(o.shape[:-1]):
            raise ValueError(
                f"{l_name} must have the shape of {o_name} without its last "
                f"dimension, (..., L); got {o_name} {tuple(o.shape)} and "
                f"{l_name} {tuple(ell.shape)}"
            )
    try:
        torch.broadcast_shapes(out_a.shape, out_b.shape)
    except RuntimeError:
        raise ValueError(
            f"out_a {tuple(out_a.shape)} and out_b {tuple(out_b.shape)} "
            "do not broadcast"
        ) from None
    acc = acc_dtype(lse_a.dtype, lse_b.dtype)
    la, lb = lse_a.to(acc), lse_b.to(acc)
    m = torch.maximum(la, lb)
    shift = m.masked_fill(
        torch.isneginf(m), 0.0
    )  # both parts empty: keep exp(-inf - -inf) out
    wa, wb = torch.exp(la - shift), torch.exp(lb - shift)
    total = wa + wb
    empty = total == 0  # both parts empty
    # log of a stand-in 1 there, then -inf: log(0) would be right forward but give
    # an infinite derivative, and inf * 0 = nan gradients in the backward pass.
    denom = torch.where(empty, torch.ones_like(total), total)
    lse = (shift + torch.log(denom)).masked_fill(empty, float("-inf"))
    share_a, share_b = (
        (wa / denom).unsqueeze(-1),
        (wb / denom).unsqueeze(-1),
    )  # sum to 1
    out = out_a.to(acc) * share_a + out_b.to(acc) * share_b
    return out.to(out_a.dtype if out_dtype is None else out_dtype), lse
