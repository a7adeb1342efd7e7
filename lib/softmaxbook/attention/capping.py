r"""Keeping logits bounded: soft-capping (Gemma 2) and QK-clip (Kimi K2).

A softmax only sees differences of logits, so nothing in the loss stops
logits from growing; when they grow, attention collapses onto one key and
low-precision arithmetic overflows. Two remedies of current models act on
the logits themselves:

* :func:`soft_cap` squashes every logit into :math:`[-c, c]` with
  :math:`c \tanh(x / c)`, a smooth clamp applied in the forward pass, to
  attention scores (as a ``score_mod``, see :mod:`softmaxbook.attention.flex`) and to
  the final logits. Gemma 2 uses :math:`c = 50` in attention and
  :math:`c = 30` at the output (Gemma Team, 2024).
* :func:`qk_clip_` leaves the forward pass alone and instead rescales the
  query and key weights of a head after an optimizer step whenever the
  head's largest logit, measured by :func:`max_attention_logits`, exceeded
  a threshold :math:`\tau` (QK-clip, part of MuonClip; Kimi Team, 2025).

The output-layer relative of both, the z-loss, is a loss:
:func:`softmaxbook.losses.z_loss`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._validate import check_float, check_positive, check_tensor
from ._args import resolve_attention

__all__ = ["soft_cap", "max_attention_logits", "qk_clip_"]


def soft_cap(x: Tensor, cap: float) -> Tensor:
    r"""Logit soft-capping: :math:`x \mapsto c \tanh(x / c)`, a smooth clamp to
    :math:`[-c, c]` (the open interval in exact arithmetic).

    Close to the identity for :math:`|x| \ll c` (the slope at 0 is 1), and
    saturating at :math:`\pm c`: the derivative is
    :math:`1 - \tanh^2(x / c)`, so a logit far beyond the cap gets almost no
    gradient, and the softmax of capped logits can never be sharper than a
    logit gap of :math:`2c` allows. ``-inf`` stays ``-inf`` (a removed entry
    stays removed; :math:`c \tanh(-\infty / c) = -c` would bring it back),
    ``+inf`` becomes :math:`c`. float16 and bfloat16 are computed in float32
    and returned in their own dtype.

    Usable on attention scores, as the ``score_mod`` of
    :func:`~softmaxbook.flex_attention`::

        score_mod = lambda score, b, h, q_idx, kv_idx: soft_cap(score, 50.0)

    and on the final logits before the loss or the sampler.

    Shapes: any; the result has the shape, dtype and device of ``x``.

    Parameters
    ----------
    x : Tensor
        Floating-point logits or scores.
    cap : float
        The cap :math:`c > 0`.

    Returns
    -------
    Tensor
        Values in :math:`[-c, c]`: in :math:`(-c, c)` in exact arithmetic, but
        ``tanh`` rounds to 1 far beyond the cap (a logit of 1000 with
        :math:`c = 50` gives exactly 50) and ``+inf`` gives :math:`c`;
        ``-inf`` and ``nan`` are kept.

    Raises
    ------
    TypeError
        If ``x`` is not a floating-point tensor or ``cap`` not a real number.
    ValueError
        If ``cap`` is not finite and > 0.
    """
    check_float(x, "x")
    cap = check_positive(cap, "cap")
    work = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    capped = cap * torch.tanh(work / cap)
    # torch.where, not masked_fill: the gradient of a -inf entry flows through
    # the identity branch, and the tanh branch's derivative there is 0, not nan.
    capped = torch.where(torch.isneginf(work), work, capped)
    return capped.to(x.dtype)


def max_attention_logits(
    q: Tensor,
    k: Tensor,
    *,
    mask: Tensor | None = None,
    is_causal: bool | str = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    sinks: Tensor | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    r"""The largest attention logit of every head:
    :math:`S^h_{\max} = \max_{b, i, j \,:\, m_{bhij}} s_{bhij}` with
    :math:`s = QK^\top \cdot \text{scale}`.

    The statistic QK-clip watches (:func:`qk_clip_`): the maximum over the
    batch, the queries and the allowed keys, one number per head. Masked
    entries do not count; a head with nothing allowed gets ``-inf``. It is
    computed without gradient and returned detached.

    Shapes: ``q`` is ``(..., H, L, D)`` and ``k`` is ``(..., H, S, D)``
    (leading dimensions broadcast); ``mask`` broadcasts to
    ``(..., H, L, S)``; returns ``(H,)`` in the dtype of ``q``.

    Parameters
    ----------
    q, k : Tensor
        Queries and keys with a head dimension at position ``-3``.
    mask : Tensor, optional
        Boolean (True = may attend), or float: added to the logits, as in
        :func:`~softmaxbook.scaled_dot_product_attention` (``-inf`` removes a
        key).
    is_causal : bool or str
        Only the keys of the causal mask count: ``True`` or ``"top_left"``
        (:math:`j \le i`), ``"bottom_right"`` (:math:`j \le i + S - L`);
        cannot be combined with ``mask``.
    scale : float, optional
        Multiplies :math:`QK^\top`; defaults to :math:`1/\sqrt{D}`.
    enable_gqa : bool
        ``k`` has fewer heads than ``q``, a divisor of its count; one logit
        per query head.
    sinks, dropout_p :
        Not supported (they do not change the logits): ``None`` and ``0``
        only.

    Returns
    -------
    Tensor
        ``(H,)``: the largest logit of each head.

    Raises
    ------
    TypeError, ValueError
        As :func:`~softmaxbook.scaled_dot_product_attention` for the
        arguments, and a ``ValueError`` if ``q`` has fewer than 3 dimensions.
    """
    if isinstance(q, Tensor) and q.dim() < 3:
        raise ValueError(
            f"q must have a head dimension, shape (..., H, L, D), got {tuple(q.shape)}"
        )
    args = resolve_attention(
        q, k, k, mask=mask, is_causal=is_causal, scale=scale, sinks=sinks,
        enable_gqa=enable_gqa, dropout_p=dropout_p, caller="max_attention_logits",
        unsupported=("sinks", "dropout_p"),
    )  # fmt: skip
    with torch.no_grad():
        if args.groups > 1:  # each key head serves G query heads
            k = k.repeat_interleave(args.groups, dim=-3)
        scores = (q @ k.transpose(-2, -1)) * args.scale  # (..., H, L, S)
        scores = args.masked_scores(scores)  # removed keys are -inf
        per_head = scores.movedim(-3, 0).reshape(scores.shape[-3], -1)  # (H, ...)
        if per_head.shape[1] == 0:
            return torch.full_like(per_head[:, 0], float("-inf"))
        return per_head.amax(dim=1)


def qk_clip_(
    w_q: Tensor,
    w_k: Tensor,
    max_logits: Tensor,
    threshold: float,
    *,
    b_q: Tensor | None = None,
    b_k: Tensor | None = None,
) -> Tensor:
    r"""QK-clip, in place: shrink the query and key weights of every head whose
    largest logit exceeded :math:`\tau`, by :math:`\sqrt{\gamma_h}` each, with
    :math:`\gamma_h = \min(1, \tau / S^h_{\max})`.

    A logit :math:`q_i \cdot k_j` is bilinear in the two projections, so
    scaling both by :math:`\sqrt{\gamma_h}` scales every logit of head
    :math:`h` by exactly :math:`\gamma_h`: the head's largest logit on the
    batch it was measured on comes back to :math:`\tau`, the other heads are
    untouched, and the forward and backward passes stay what they were.
    Kimi K2 applies this after every optimizer step, with
    :math:`\tau = 100` (Kimi Team, 2025); its attention (MLA) also has a
    rotary part of the key shared by all heads, which it leaves alone while
    scaling the head's rotary query part by :math:`\gamma_h`. This function
    covers standard multi-head attention, where each head owns its rows of
    :math:`W_q` and :math:`W_k`.

    Shapes: ``w_q`` and ``w_k`` are ``(H * D, E)``, the weights of
    ``nn.Linear(E, H * D)`` projections with head ``h`` in rows
    ``h * D : (h + 1) * D`` (the layout of ``x @ w.T`` reshaped to
    ``(..., H, D)``); ``b_q`` and ``b_k`` are ``(H * D,)``; ``max_logits`` is
    ``(H,)``, from :func:`max_attention_logits`. Returns :math:`\gamma`,
    ``(H,)``.

    Parameters
    ----------
    w_q, w_k : Tensor
        Query and key weights; modified in place (without recording
        gradient history, so parameters may be passed directly).
    max_logits : Tensor
        :math:`S^h_{\max}` for each head, measured with the current weights.
    threshold : float
        :math:`\tau > 0`.
    b_q, b_k : Tensor, optional
        Biases of the projections, scaled with their weights.

    Returns
    -------
    Tensor
        ``(H,)``: :math:`\gamma_h`, 1 for heads at or below the threshold.

    Raises
    ------
    TypeError
        If a weight is not a floating-point tensor or ``threshold`` is not a
        real number.
    ValueError
        If ``threshold <= 0``, the weights' rows are not a multiple of ``H``,
        or a shape does not fit.
    """
    threshold = check_positive(threshold, "threshold")
    check_float(max_logits, "max_logits")
    if max_logits.dim() != 1:
        raise ValueError(
            f"max_logits must be (H,), one per head, got {tuple(max_logits.shape)}"
        )
    H = max_logits.shape[0]
    for name, w in (("w_q", w_q), ("w_k", w_k)):
        check_float(w, name)
        if w.dim() != 2 or H == 0 or w.shape[0] % H:
            raise ValueError(
                f"{name} must be (H * D, E) with H = {H} heads, got {tuple(w.shape)}"
            )
    for name, b, w in (("b_q", b_q, w_q), ("b_k", b_k, w_k)):
        if b is not None:
            check_tensor(b, name)
            if b.shape != (w.shape[0],):
                raise ValueError(
                    f"{name} must have shape ({w.shape[0]},), got {tuple(b.shape)}"
                )
    over = max_logits > threshold  # -inf and nan heads are left alone
    gamma = torch.where(over, threshold / max_logits, torch.ones_like(max_logits))
    root = gamma.sqrt()
    with torch.no_grad():
        for t in (w_q, w_k, b_q, b_k):
            if t is not None:
                # One factor per row, whatever the strides: an in-place multiply
                # through a reshape could silently land on a copy.
                rows = root.to(t.dtype).repeat_interleave(t.shape[0] // H)  # (H*D,)
                t.mul_(rows.view(-1, *([1] * (t.dim() - 1))))
    return gamma
