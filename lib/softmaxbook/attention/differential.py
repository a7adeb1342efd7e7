r"""Differential attention: the difference of two softmax maps.

Ye et al. (2025) compute two attention maps per head from two halves of the
queries and keys and subtract them:

.. math::

    \mathrm{DiffAttn}(X) = \Big(\mathrm{softmax}\big(Q_1 K_1^\top s\big)
    - \lambda\, \mathrm{softmax}\big(Q_2 K_2^\top s\big)\Big) V .

Attention that both maps give alike (the common mode: a sink, a spread over
irrelevant keys) cancels; what only the first map gives survives. The
weights of a row sum to :math:`1 - \lambda`, and single weights may be
negative. In the Diff Transformer, :math:`\lambda` is learned (re-parametrized
as :math:`e^{\lambda_{q1} \cdot \lambda_{k1}} - e^{\lambda_{q2} \cdot
\lambda_{k2}} + \lambda_{\text{init}}`, with
:math:`\lambda_{\text{init}} = 0.8 - 0.6 e^{-0.3 (l - 1)}` in layer
:math:`l`), each head's output is normalized (RMSNorm) and multiplied by
:math:`1 - \lambda_{\text{init}}`; those belong to the layer, not to this
function.
"""

from __future__ import annotations

from numbers import Real

import torch
from torch import Tensor

from .._validate import check_qkv
from ._args import resolve_attention
from .sdpa import scaled_dot_product_attention

__all__ = ["differential_attention"]


def _check_lam(lam: object, batch: tuple[int, ...], like: Tensor) -> Tensor:
    """``lam`` as a tensor shaped ``batch + (1, 1)``-broadcastable."""
    if isinstance(lam, Real) and not isinstance(lam, bool):
        return torch.tensor(float(lam), dtype=like.dtype, device=like.device)
    if not isinstance(lam, Tensor) or not lam.is_floating_point():
        raise TypeError(
            "lam must be a real number or a floating-point tensor, got "
            f"{type(lam).__name__ if not isinstance(lam, Tensor) else lam.dtype}"
        )
    try:
        ok = torch.broadcast_shapes(lam.shape, batch) == batch
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"lam of shape {tuple(lam.shape)} must broadcast to the batch "
            f"dimensions {batch} of the scores, e.g. (H,) for one value per head"
        )
    return lam.to(device=like.device)[..., None, None]


def differential_attention(
    q1: Tensor,
    k1: Tensor,
    q2: Tensor,
    k2: Tensor,
    v: Tensor,
    lam: float | Tensor = 0.8,
    *,
    mask: Tensor | None = None,
    is_causal: bool | str = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    sinks: Tensor | None = None,
    dropout_p: float = 0.0,
    return_weights: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    r"""Differential attention:
    :math:`\big(\mathrm{softmax}(Q_1 K_1^\top s) -
    \lambda\,\mathrm{softmax}(Q_2 K_2^\top s)\big) V`.

    Each map is :func:`~softmaxbook.scaled_dot_product_attention` with the
    softmax normalizer, the same ``mask``, ``is_causal`` and ``scale``; the
    weights are their difference, with :math:`\lambda` per head or shared.
    A row's weights sum to :math:`1 - \lambda`; a query with nothing to
    attend gets zeros.

    Shapes: ``q1``, ``q2`` are ``(..., L, D)``, ``k1``, ``k2`` are
    ``(..., S, D)``, ``v`` is ``(..., S, Dv)``; ``lam`` is a number or a
    tensor that broadcasts to the batch dimensions ``...`` (e.g. ``(H,)`` for
    ``(B, H, L, D)`` queries); the output is ``(..., L, Dv)`` and the weights
    ``(..., L, S)``.

    Parameters
    ----------
    q1, k1 : Tensor
        Queries and keys of the first (signal) map.
    q2, k2 : Tensor
        Queries and keys of the second (subtracted) map.
    v : Tensor
        Values.
    lam : float or Tensor
        :math:`\lambda`, the weight of the second map (a tensor may require
        a gradient). Ye et al. start it at 0.2 to 0.8 depending on the
        layer.
    mask, is_causal, scale, enable_gqa :
        As in :func:`~softmaxbook.scaled_dot_product_attention` (a boolean or
        float mask, ``True``/``"top_left"``/``"bottom_right"``, shared key
        and value heads), the same for both maps.
    sinks, dropout_p :
        Not supported (a sink of a difference of maps is not defined by the
        paper): ``None`` and ``0`` only.
    return_weights : bool
        Also return the (signed) weights.

    Returns
    -------
    Tensor or tuple of Tensor
        The output ``(..., L, Dv)``, or ``(out, weights)``.

    Raises
    ------
    TypeError
        If a tensor is not floating point, the dtypes differ, or ``lam`` is
        neither a number nor a floating-point tensor.
    ValueError
        If the shapes do not match (``q1`` and ``q2`` must have one shape,
        and ``k1`` and ``k2`` too), or ``lam`` does not broadcast to the batch
        dimensions; and as :func:`~softmaxbook.scaled_dot_product_attention`.
    """
    args = resolve_attention(
        q1, k1, v, mask=mask, is_causal=is_causal, scale=scale, sinks=sinks,
        enable_gqa=enable_gqa, dropout_p=dropout_p, caller="differential_attention",
        unsupported=("sinks", "dropout_p"),
    )  # fmt: skip
    check_qkv(q2, k2, v, groups=args.groups)
    if q1.shape != q2.shape or k1.shape != k2.shape:
        raise ValueError(
            "the two maps need queries of one shape and keys of one shape, got "
            f"q1 {tuple(q1.shape)}, q2 {tuple(q2.shape)}, "
            f"k1 {tuple(k1.shape)}, k2 {tuple(k2.shape)}"
        )
    lam = _check_lam(lam, args.batch, v)
    first, second = (
        scaled_dot_product_attention(
            qi, ki, v, mask=mask, is_causal=is_causal, scale=scale,
            enable_gqa=enable_gqa, return_weights=True,
        )[1]
        for qi, ki in ((q1, k1), (q2, k2))
    )  # fmt: skip
    weights = first - lam.to(first.dtype) * second  # (..., L, S)
    if args.groups > 1:  # each value head serves G query heads
        v = v.repeat_interleave(args.groups, dim=-3)
    out = weights @ v  # (..., L, Dv)
    return (out, weights) if return_weights else out
