r"""The router of a mixture-of-experts layer: scores, top-k, weights.

A mixture-of-experts (MoE) layer sends each token to :math:`k` of its
:math:`E` experts and adds their outputs with weights. The router computes
one logit per expert, :math:`z = x W_g^\top`, and turns the logits into the
chosen experts and their weights. The models of 2024-2025 differ in three
choices, and :func:`route_topk` takes each as an argument:

* the **score** of an expert: :math:`s = \mathrm{softmax}(z)` over all
  experts (Mixtral, Qwen3-MoE) or :math:`s_e = \sigma(z_e)`, a sigmoid of
  each logit on its own (DeepSeek-V3);
* whether the :math:`k` selected scores are **normalized** to sum to 1
  (Mixtral always; Qwen3-MoE when its config's ``norm_topk_prob`` is set;
  DeepSeek-V3's sigmoid scores) or used as they are;
* a per-expert **selection bias** :math:`b` that is added to the scores only
  to choose the experts, never to weigh them (DeepSeek-V3's auxiliary-loss-free
  load balancing), and a final **scale** (DeepSeek-V3's ``route_scale``).

Softmax, then top-k, then normalization is the same as a softmax over the
:math:`k` largest logits alone: the common factor :math:`1/\sum_j e^{z_j}`
cancels. A sigmoid followed by normalization is not: its weights are
:math:`\sigma(z_e) / \sum_{e' \in T} \sigma(z_{e'})`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._validate import check_float, check_positive, check_positive_int

__all__ = ["route_topk", "ROUTER_SCORES"]

#: The score functions :func:`route_topk` knows.
ROUTER_SCORES = ("softmax", "sigmoid")


def route_topk(
    logits: Tensor,
    k: int,
    *,
    score: str = "softmax",
    normalize: bool = True,
    bias: Tensor | None = None,
    scale: float = 1.0,
) -> tuple[Tensor, Tensor]:
    r"""The experts a router picks for each token, and their weights.

    With :math:`z` a row of router logits over :math:`E` experts, the score
    is :math:`s = \mathrm{softmax}(z)` (``score="softmax"``) or
    :math:`s_e = \sigma(z_e) = 1/(1 + e^{-z_e})` (``score="sigmoid"``). The
    selected experts are the :math:`k` largest entries of :math:`s + b`
    (``bias`` :math:`b`, zero by default):

    .. math::

        T = \operatorname{top-}k(s + b), \qquad
        w_e = c \, \frac{s_e}{\sum_{e' \in T} s_{e'}} \quad (e \in T),

    without the denominator when ``normalize=False``; :math:`c` is ``scale``.
    The bias moves which experts are picked, never their weights: the
    weights are read from :math:`s`. A row whose logits are all ``-inf``
    gets zero weights. Logits in float16 or bfloat16 are scored in float32
    (as the Mixtral and Qwen3-MoE blocks of transformers do; DeepSeek-V3's
    reference ``Gate`` takes its sigmoid in the input's dtype) and the
    weights come back in the logits' dtype.

    Shapes: ``logits`` is ``(..., E)``; ``bias`` is ``(E,)``; ``weights``
    and ``indices`` are ``(..., k)``, ordered by :math:`s + b`, largest first.

    Parameters
    ----------
    logits : Tensor
        Floating-point router logits, experts along the last dimension.
    k : int
        Experts per token, ``1 <= k <= E``.
    score : str
        ``"softmax"`` or ``"sigmoid"`` (see ``ROUTER_SCORES``).
    normalize : bool
        Divide the :math:`k` selected scores by their sum.
    bias : Tensor, optional
        A per-expert bias added to the scores for the selection only.
    scale : float
        A positive factor on the weights (DeepSeek-V3's ``route_scale``).

    Returns
    -------
    tuple of Tensor
        ``(weights, indices)``: the weights in the logits' dtype and the
        chosen experts as ``int64``.

    Raises
    ------
    TypeError
        If ``logits`` or ``bias`` is not a floating-point tensor, ``k``
        is not an int, or ``normalize`` is not a bool.
    ValueError
        If ``logits`` has no dimension, ``k`` is outside ``1..E``, ``score``
        is unknown, ``bias`` has the wrong shape, or ``scale`` is not
        positive.

    Examples
    --------
    >>> import torch
    >>> import softmaxbook as sb
    >>> z = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    >>> w, i = sb.route_topk(z, 2)
    >>> i.tolist(), torch.allclose(w, torch.softmax(z[:, :2], -1))
    ([[0, 1]], True)
    """
    logits = check_float(logits, "logits")
    if logits.dim() == 0:
        raise ValueError("logits must have at least one dimension (the experts)")
    n_experts = logits.shape[-1]
    k = check_positive_int(k, "k")
    if k > n_experts:
        raise ValueError(f"k={k} is larger than the number of experts, {n_experts}")
    if score not in ROUTER_SCORES:
        raise ValueError(f"score must be one of {ROUTER_SCORES}, got {score!r}")
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize must be a bool, got {type(normalize).__name__}")
    scale = check_positive(scale, "scale")
    work = (
        torch.float32
        if logits.dtype in (torch.float16, torch.bfloat16)
        else logits.dtype
    )
    z = logits.to(work)
    if score == "softmax":
        empty = torch.isneginf(z).all(dim=-1, keepdim=True)
        s = torch.softmax(z.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    else:
        s = torch.sigmoid(z)
    chooser = s
    if bias is not None:
        bias = check_float(bias, "bias")
        if bias.shape != (n_experts,):
            raise ValueError(
                f"bias must have shape ({n_experts},), one entry per expert, "
                f"got {tuple(bias.shape)}"
            )
        chooser = s + bias.to(device=s.device, dtype=work)
    indices = torch.topk(chooser, k, dim=-1).indices
    weights = s.gather(-1, indices)
    if normalize:
        total = weights.sum(dim=-1, keepdim=True)
        weights = torch.where(
            total > 0, weights / total.clamp_min(torch.finfo(work).tiny), 0.0
        )
    if scale != 1.0:
        weights = weights * scale
    return weights.to(logits.dtype), indices
