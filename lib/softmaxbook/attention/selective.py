r"""Selective attention: a token may tell every later query to forget an
earlier one.

Leviathan, Kalman and Matias (2025) add one parameter-free step to causal
attention. A selection matrix :math:`S` (in the paper, the attention logits of
one head, through a ReLU) says how much token :math:`k` wants to mask token
:math:`j`; the masking accumulates over the tokens that came before the query,

.. math::

    F_{i,j} = \sum_{k < i} S_{k,j}, \qquad
    \mathrm{weights}_i = \mathrm{softmax}\Big(\frac{q_i K^\top}{\sqrt D}
    - F_{i,:}\Big),

so a key that some earlier token selected is pushed down for every query
after it. A token never masks itself, and the first token (the ``<BOS>``)
is never masked. Masked keys can then be dropped from a key-value cache.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..masking import causal_mask
from ._args import resolve_attention
from .sdpa import scaled_dot_product_attention

__all__ = ["selective_attention"]


def _forgetting(selection: Tensor) -> Tensor:
    """The accumulated penalty ``F`` ``(..., L, L)`` of selection logits ``S``.

    ``S`` is ReLU'd, its first column (the first token) and its diagonal (a
    token selecting itself) are zeroed, and ``F[i] = sum_{k < i} S[k]``: row
    ``i`` sums the selections of the tokens strictly before query ``i``.
    """
    L = selection.shape[-1]
    s = torch.relu(selection)  # -inf (masked) selects nothing
    keep = torch.ones(L, L, dtype=torch.bool, device=s.device)
    keep[:, 0] = False  # never mask the first token
    keep.fill_diagonal_(False)  # a token does not mask itself
    s = s * keep.to(s.dtype)
    f = s.cumsum(-2)  # F[i] = sum_{k <= i} S[k]
    return torch.cat([torch.zeros_like(f[..., :1, :]), f[..., :-1, :]], dim=-2)


def selective_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    selector: int = 0,
    scale: float | None = None,
    is_causal: bool | str = True,
    enable_gqa: bool = False,
    mask: Tensor | None = None,
    sinks: Tensor | None = None,
    dropout_p: float = 0.0,
    return_weights: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    r"""Causal self-attention with selective attention's forgetting penalty.

    The scores of head ``selector`` are the selection logits :math:`S` (as in
    the paper, head 0); every head's causal scores are reduced by
    :math:`F_{i,j} = \sum_{k < i} \mathrm{relu}(S_{k,j})`, with the first token
    and the diagonal never selected, before the softmax. With all selection
    logits :math:`\le 0` this is plain causal softmax attention.

    Shapes: ``q``, ``k``, ``v`` are ``(..., H, L, D)`` (heads in dimension
    -3, one length ``L`` for queries and keys); the output is
    ``(..., H, L, Dv)`` and the weights ``(..., H, L, L)``.

    Parameters
    ----------
    q, k, v : Tensor
        Queries, keys and values of causal self-attention.
    selector : int
        The head whose scores select (dimension -3 of the scores).
    scale : float, optional
        Multiplies :math:`QK^\top`; defaults to :math:`1/\sqrt{D}`.
    is_causal : bool or str
        Selective attention is causal self-attention: ``True``,
        ``"top_left"`` or ``"bottom_right"`` (one mask for one length);
        ``False`` raises a ``ValueError``.
    enable_gqa : bool
        As in :func:`~softmaxbook.scaled_dot_product_attention`: ``k`` and
        ``v`` may have fewer heads, a divisor of the query heads.
    mask, sinks, dropout_p :
        Not supported (the causal mask is part of the method): ``None``,
        ``None`` and ``0`` only.
    return_weights : bool
        Also return the weights.

    Returns
    -------
    Tensor or tuple of Tensor
        The output, or ``(out, weights)``.

    Raises
    ------
    TypeError
        If the tensors are not floating point or ``selector`` is not an int.
    ValueError
        If the shapes do not fit (queries and keys of different lengths, no
        head dimension), or ``selector`` is not a head.
    """
    if is_causal is False:
        raise ValueError(
            "selective attention is causal self-attention: is_causal must be True, "
            "'top_left' or 'bottom_right', got False"
        )
    args = resolve_attention(
        q, k, v, mask=mask, is_causal=is_causal, scale=scale, sinks=sinks,
        enable_gqa=enable_gqa, dropout_p=dropout_p, caller="selective_attention",
        unsupported=("mask", "sinks", "dropout_p"),
    )  # fmt: skip
    if q.dim() < 3 or q.shape[-2] != k.shape[-2]:
        raise ValueError(
            "selective attention is causal self-attention: q and k must be "
            f"(..., H, L, D) with one L, got q {tuple(q.shape)} and k "
            f"{tuple(k.shape)}"
        )
    if isinstance(selector, bool) or not isinstance(selector, int):
        raise TypeError(f"selector must be an int, got {type(selector).__name__}")
    heads = args.batch[-1]
    if not -heads <= selector < heads:
        raise ValueError(f"selector={selector} is not one of the {heads} heads")
    L = q.shape[-2]
    keys = k if args.groups == 1 else k.repeat_interleave(args.groups, dim=-3)
    scores = (q @ keys.transpose(-2, -1)) * args.scale  # (..., H, L, L)
    allowed = causal_mask(L, device=q.device)
    selection = scores.select(-3, selector).masked_fill(~allowed, float("-inf"))
    penalty = _forgetting(selection).unsqueeze(-3)  # (..., 1, L, L), every head

    def penalized_softmax(s: Tensor, dim: int = -1) -> Tensor:
        return torch.softmax(s - penalty, dim=dim)

    return scaled_dot_product_attention(
        q,
        k,
        v,
        is_causal=True,
        scale=args.scale,
        enable_gqa=enable_gqa,
        normalizer=penalized_softmax,
        return_weights=return_weights,
    )
