r"""The one argument resolver of every attention entry point.

Every attention function of the library (``scaled_dot_product_attention``,
``flash_attention``, ``flex_attention``, ``split_k_attention``,
``ring_attention``, ``differential_attention``, ``selective_attention``,
``max_attention_logits``) takes the same vocabulary, checked here once by
:func:`resolve_attention`:

* ``q, k, v``: ``(..., L, D)``, ``(..., S, D)``, ``(..., S, Dv)``, one floating
  dtype, one device, batch dimensions that broadcast;
* ``mask`` or torch's spelling ``attn_mask``: a **boolean** mask (True = may
  attend) or a **float additive** mask, added to the scores as torch does
  (``-inf`` removes a key);
* ``is_causal``: ``True``/``"top_left"`` (torch's alignment), ``"bottom_right"``
  (flash-attn's, the KV-cache case) or ``False``;
* ``scale`` (default :math:`1/\sqrt{D}`), ``sinks`` (one sink logit per row of
  the batch, e.g. ``(H,)``), ``enable_gqa`` (fewer key and value heads, a divisor
  of the query heads) and ``dropout_p`` (dropout on the weights, as torch).

The result, an :class:`AttentionArgs`, holds what the entry points need; an entry
point that cannot honour an option names it in ``unsupported`` and the resolver
rejects it with a ``ValueError`` naming the option. A call costs a few
microseconds: nothing is allocated and no tensor is read.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from numbers import Real
from typing import NamedTuple

import torch
from torch import Tensor

from .._numerics import causal_offset
from .._validate import check_causal, check_gqa_heads, check_positive, check_qkv

__all__ = [
    "AttentionArgs",
    "resolve_attention",
    "rebuild_attention",
    "ATTENTION_OPTIONS",
]

#: The options an entry point may declare ``unsupported``, and how each is named in
#: the error.
ATTENTION_OPTIONS = {
    "mask": "a mask (mask= / attn_mask=)",
    "float_mask": "a float (additive) mask",
    "is_causal": "is_causal",
    "bottom_right": 'is_causal="bottom_right"',
    "sinks": "sinks",
    "enable_gqa": "enable_gqa=True",
    "dropout_p": "dropout_p > 0",
}


class AttentionArgs(NamedTuple):
    r"""The checked arguments of one attention call.

    ``batch`` is the broadcast batch shape of the scores (a tuple, often a
    ``torch.Size``; with ``enable_gqa``,
    the query heads'); the scores are ``batch + (L, S)``. ``causal`` is ``None``,
    ``"top_left"`` or ``"bottom_right"`` (the two agree when ``L == S``, and are
    then both given as ``"top_left"``). ``mask`` is the user's mask as given
    (broadcastable to the scores, not expanded): boolean when ``additive`` is
    False, a float mask added to the scores when it is True.
    """

    batch: tuple[int, ...]
    L: int
    S: int
    scale: float
    causal: str | None
    mask: Tensor | None
    additive: bool
    sinks: Tensor | None
    groups: int
    dropout_p: float

    @property
    def keep(self) -> Tensor | None:
        """The boolean mask (True = may attend), or None (no mask, or a float one)."""
        return None if self.additive else self.mask

    @property
    def bias(self) -> Tensor | None:
        """The float additive mask, or None (no mask, or a boolean one)."""
        return self.mask if self.additive else None

    def causal_mask(self, device: torch.device | str | None = None) -> Tensor | None:
        """The ``(L, S)`` boolean causal mask of the alignment, or None."""
        if self.causal is None:
            return None
        offset = causal_offset(self.causal, self.L, self.S)
        rows = torch.arange(self.L, device=device).unsqueeze(-1)  # (L, 1)
        return torch.arange(self.S, device=device) <= rows + offset  # (L, S)

    def masked_scores(self, scores: Tensor) -> Tensor:
        """``scores`` ``batch + (L, S)`` with the mask applied: the float mask
        added, keys removed by the boolean or causal mask set to ``-inf``.

        A softmax of the result that gives zeros for all ``-inf`` rows
        (:func:`~softmaxbook.masked_softmax` with ``mask=None``) is the
        attention weights. The result may broadcast beyond ``scores`` (a mask
        with batch dimensions that only ``v`` has).
        """
        if self.mask is not None:
            if self.additive:
                scores = scores + self.mask
            else:
                scores = scores.masked_fill(~self.mask, float("-inf"))
        causal = self.causal_mask(scores.device)
        if causal is not None:
            scores = scores.masked_fill(~causal, float("-inf"))
        return scores


def resolve_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    attn_mask: Tensor | None = None,
    is_causal: bool | str = False,
    scale: float | None = None,
    sinks: Tensor | None = None,
    enable_gqa: bool = False,
    dropout_p: float = 0.0,
    caller: str = "attention",
    unsupported: Collection[str] = (),
) -> AttentionArgs:
    r"""Check the arguments of an attention call and resolve them.

    Shapes: ``q`` is ``(..., L, D)``, ``k`` is ``(..., S, D)``, ``v`` is
    ``(..., S, Dv)`` (with ``enable_gqa``: ``(..., Hq, L, D)`` and
    ``(..., Hkv, S, .)`` with :math:`H_{kv}` dividing :math:`H_q`); ``mask``
    broadcasts to the scores ``batch + (L, S)``; ``sinks`` broadcasts to
    ``batch``.

    Parameters
    ----------
    q, k, v : Tensor
        Queries, keys and values: one floating dtype, one device.
    mask, attn_mask : Tensor, optional
        The mask (``attn_mask`` is torch's name; pass one of the two): boolean,
        True = may attend, or floating point of ``q``'s dtype, added to the
        scores (``-inf`` removes a key).
    is_causal : bool or str
        ``True`` or ``"top_left"``, ``"bottom_right"``, or ``False``; cannot be
        combined with a mask.
    scale : float, optional
        Multiplies :math:`QK^\top`: finite and > 0; default :math:`1/\sqrt{D}`.
    sinks : Tensor, optional
        Sink logits, floating point, broadcasting to the batch dimensions.
    enable_gqa : bool
        Grouped-query attention.
    dropout_p : float
        Dropout probability of the weights, in :math:`[0, 1)`.
    caller : str
        The entry point's name, for the errors.
    unsupported : collection of str
        Options (keys of :data:`ATTENTION_OPTIONS`) that ``caller`` cannot
        honour: setting one raises a ``ValueError`` naming it.

    Returns
    -------
    AttentionArgs
        The batch shape, ``L``, ``S``, the scale, the causal alignment, the
        mask and whether it is additive, the sinks, the GQA group size ``G``
        (1 without GQA) and the dropout probability.

    Raises
    ------
    TypeError
        For a tensor that is not floating point, dtypes that differ, a mask
        that is neither boolean nor of ``q``'s float dtype, both ``mask`` and
        ``attn_mask``, or a flag of the wrong type.
    ValueError
        For shapes that do not fit, another device, a mask with
        ``is_causal``, an unknown ``is_causal`` name, a ``scale`` that is not
        finite and > 0, a ``dropout_p`` outside :math:`[0, 1)`, or an option
        the caller does not support.

    Examples
    --------
    >>> import torch
    >>> q = torch.randn(2, 4, 8, 16)
    >>> args = resolve_attention(q, q, q, is_causal=True)
    >>> tuple(args.batch), args.L, args.S, args.scale, args.causal
    ((2, 4), 8, 8, 0.25, 'top_left')
    >>> bias = torch.zeros(8, 8)
    >>> resolve_attention(q, q, q, attn_mask=bias).additive
    True
    >>> kv = torch.randn(2, 2, 8, 16)  # two key heads serve four query heads
    >>> resolve_attention(q, kv, kv, enable_gqa=True).groups
    2
    """
    if attn_mask is not None:
        if mask is not None:
            raise TypeError(
                f"{caller}() got both mask= and attn_mask= (torch's name for it); "
                "pass one of them"
            )
        mask = attn_mask
    causal = check_causal(is_causal)
    if not isinstance(enable_gqa, bool):
        raise TypeError(f"enable_gqa must be a bool, got {type(enable_gqa).__name__}")
    groups = check_gqa_heads(q, k, v) if enable_gqa else 1
    batch = check_qkv(q, k, v, groups=groups)
    L, S = q.shape[-2], k.shape[-2]
    if causal == "bottom_right" and L == S:
        causal = "top_left"  # the same mask: one name for it
    if scale is None:
        D = q.shape[-1]
        scale = 1.0 / math.sqrt(D) if D else 1.0
    else:
        scale = check_positive(scale, "scale")
    additive = False if mask is None else _check_mask(mask, q, batch + (L, S))
    if sinks is not None:
        _check_sinks(sinks, batch, q)
    if dropout_p != 0.0:
        dropout_p = _check_dropout(dropout_p)
    if unsupported:
        _reject(caller, unsupported, mask, additive, causal, sinks, groups, dropout_p)
    if mask is not None and causal is not None:
        raise ValueError(
            "pass either mask or is_causal=True, not both "
            "(combine them yourself: mask & causal_mask(L, S))"
        )
    return AttentionArgs(
        batch, L, S, scale, causal, mask, additive, sinks, groups, dropout_p
    )


def rebuild_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    sinks: Tensor | None,
    causal: str | None,
    scale: float,
    groups: int,
) -> AttentionArgs:
    """The :class:`AttentionArgs` of a call that :func:`resolve_attention` has
    already checked, from its resolved parts (shapes only: nothing is checked
    again). A custom operator gets its arguments as tensors and numbers; this
    gives it back the resolved call."""
    qb, kb, vb = tuple(q.shape[:-2]), tuple(k.shape[:-2]), tuple(v.shape[:-2])
    if groups > 1:
        kb, vb = kb[:-1] + (kb[-1] * groups,), vb[:-1] + (vb[-1] * groups,)
    batch = qb if qb == kb == vb else tuple(torch.broadcast_shapes(qb, kb, vb))
    additive = mask is not None and mask.dtype != torch.bool
    L, S = q.shape[-2], k.shape[-2]
    return AttentionArgs(batch, L, S, scale, causal, mask, additive, sinks, groups, 0.0)


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether ``shape`` broadcasts to ``target`` (pure Python: no torch call)."""
    if len(shape) > len(target):
        return False
    return all(s == 1 or s == t for s, t in zip(reversed(shape), reversed(target)))


def _check_mask(mask: object, q: Tensor, scores: tuple[int, ...]) -> bool:
    """Check a boolean or float additive mask; return whether it is additive."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    additive = mask.dtype != torch.bool
    if additive and mask.dtype != q.dtype:
        hint = (
            f"convert it with mask.to({q.dtype})"
            if mask.is_floating_point()
            else "for a 0/1 mask use .bool()"
        )
        raise TypeError(
            "mask must be a boolean tensor (True = may attend) or a float "
            f"(additive) mask of q's dtype {q.dtype}, got dtype {mask.dtype}; {hint}"
        )
    if mask.shape != scores and not _broadcasts_to(tuple(mask.shape), scores):
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to the scores' "
            f"shape {tuple(scores)}"
        )
    if mask.device != q.device:
        raise ValueError(
            f"mask is on {mask.device} but the scores are on {q.device}; "
            f"move it with mask.to(scores.device)"
        )
    return additive


def _check_sinks(sinks: object, batch: tuple[int, ...], q: Tensor) -> None:
    """Sink logits: floating point, on q's device, broadcasting to the batch."""
    if not isinstance(sinks, Tensor) or not sinks.is_floating_point():
        got = sinks.dtype if isinstance(sinks, Tensor) else type(sinks).__name__
        raise TypeError(f"sinks must be a floating-point tensor, got {got}")
    if sinks.device != q.device:
        raise ValueError(
            f"sinks is on {sinks.device} but q is on {q.device}; "
            "move it with sinks.to(q.device)"
        )
    if not _broadcasts_to(tuple(sinks.shape), batch):
        raise ValueError(
            f"sinks of shape {tuple(sinks.shape)} must broadcast to the batch "
            f"dimensions {batch} of the scores: one sink logit per head, e.g. "
            "(H,) for q of shape (B, H, L, D)"
        )


def _check_dropout(p: object) -> float:
    if isinstance(p, bool) or not isinstance(p, Real):
        raise TypeError(f"dropout_p must be a real number, got {type(p).__name__}")
    p = float(p)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {p}")
    return p


def _reject(
    caller: str,
    unsupported: Collection[str],
    mask: Tensor | None,
    additive: bool,
    causal: str | None,
    sinks: Tensor | None,
    groups: int,
    dropout_p: float,
) -> None:
    """Raise for the first option that is set and that ``caller`` cannot honour."""
    given = {
        "mask": mask is not None,
        "float_mask": additive,
        "is_causal": causal is not None,
        "bottom_right": causal == "bottom_right",
        "sinks": sinks is not None,
        "enable_gqa": groups > 1,
        "dropout_p": dropout_p > 0.0,
    }
    for option in unsupported:
        if option not in given:
            raise ValueError(
                f"unknown attention option {option!r}; expected one of "
                f"{sorted(ATTENTION_OPTIONS)}"
            )
        if given[option]:
            raise ValueError(
                f"{caller} does not support {ATTENTION_OPTIONS[option]}; "
                "leave it out, or use scaled_dot_product_attention"
            )
