r"""Losses on the output softmax as current models train it.

The cross-entropy :math:`\ell(z, y) = \operatorname{logsumexp}(z) - z_y` is
where every language model's training starts; three refinements are in
everyday use, each with its own reason:

* :func:`label_smoothed_cross_entropy`: the target is
  :math:`(1 - \varepsilon)\,e_y + \varepsilon\, u`, a little mass spread
  uniformly, so the optimum logits are finite (Szegedy et al., 2016).
* :func:`z_loss`: :math:`(\log Z)^2` with :math:`\log Z =
  \operatorname{logsumexp}(z)`, added with a small coefficient (PaLM:
  :math:`10^{-4}`) to pin down the one direction the cross-entropy does not
  see, the shift of the logits (Chowdhery et al., 2023).
* :func:`chunked_cross_entropy`: the loss of ``hidden @ weight.T`` computed
  a chunk of rows at a time, forward and backward, so that the
  ``(N, V)`` logits of a large vocabulary never exist at once (the idea of
  Cut Cross-Entropy, Wijmans et al., 2025, in plain torch).

Throughout, the classes are along the last dimension (``torch``'s
``F.cross_entropy`` wants them in dimension 1), targets equal to
``ignore_index`` do not count, and a ``-inf`` logit is a removed class.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ._numerics import acc_dtype
from ._validate import (
    check_float,
    check_nonnegative,
    check_positive,
    check_positive_int,
)

__all__ = ["label_smoothed_cross_entropy", "z_loss", "chunked_cross_entropy"]

_REDUCTIONS = ("mean", "sum", "none")


def _check_reduction(reduction: object) -> str:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    return str(reduction)


def _check_target(
    target: object, batch_shape: torch.Size, V: int, ignore_index: int
) -> Tensor:
    """Check integer targets of shape ``batch_shape`` with values in ``[0, V)``."""
    if not isinstance(target, Tensor):
        raise TypeError(f"target must be a torch.Tensor, got {type(target).__name__}")
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise TypeError(
            f"target must hold class indices (an integer tensor), got {target.dtype}"
        )
    if target.shape != batch_shape:
        raise ValueError(
            f"target must have shape {tuple(batch_shape)} (the logits without their "
            f"last dimension), got {tuple(target.shape)}"
        )
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(
            f"ignore_index must be an int, got {type(ignore_index).__name__}"
        )
    counted = target[target != ignore_index]
    if counted.numel() and (int(counted.min()) < 0 or int(counted.max()) >= V):
        raise ValueError(
            f"target holds class indices outside [0, {V}): min {int(counted.min())}, "
            f"max {int(counted.max())} (ignore_index={ignore_index})"
        )
    return target


def _reduce(per_row: Tensor, counted: Tensor, reduction: str) -> Tensor:
    if reduction == "none":
        return per_row
    total = per_row.sum()
    if reduction == "sum":
        return total
    # The mean over the counted rows; with none counted the loss is 0, not 0/0 = nan.
    return total / counted.sum().clamp_min(1)


def _upcast(x: Tensor) -> Tensor:
    # Losses are sums of many terms: float16/bfloat16 logits are upcast.
    return x.to(acc_dtype(x.dtype))


def label_smoothed_cross_entropy(
    logits: Tensor,
    target: Tensor,
    *,
    smoothing: float = 0.1,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    r"""Cross-entropy against a smoothed target:
    :math:`\ell = -\sum_i q_i \log \pi_i` with
    :math:`q = (1 - \varepsilon)\, e_y + \tfrac{\varepsilon}{K}\, \mathbf{1}`.

    :math:`\pi = \mathrm{softmax}(z)` and :math:`K` is the number of classes
    of the row, so
    :math:`\ell = (1 - \varepsilon)(-\log \pi_y) + \varepsilon \cdot
    \tfrac{1}{K}\sum_i (-\log \pi_i)`, and its gradient is
    :math:`\partial \ell / \partial z = \pi - q`: the softmax minus the
    smoothed target. Unlike the one-hot target, :math:`q` is reached by
    finite logits, with the true class :math:`\log\frac{(1 - \varepsilon)K +
    \varepsilon}{\varepsilon}` above the others; the loss stops rewarding
    larger logits there.

    Equal to ``F.cross_entropy(logits.movedim(-1, 1), target,
    label_smoothing=smoothing, ignore_index=ignore_index)`` when every logit
    is finite (see the example below). A ``-inf`` logit is a removed class: it
    gets no smoothing mass and :math:`K` counts only the finite logits of the
    row (torch spreads mass onto it and returns ``inf``). Rows whose target is
    ``ignore_index`` contribute 0 and do not count in the mean; if no row
    counts, the mean is 0. float16 and bfloat16 logits are computed in float32.

    Shapes: ``logits`` is ``(..., V)``, ``target`` is ``(...)`` (integers);
    the result is a scalar, or ``(...)`` with ``reduction="none"``, in
    float32 or float64.

    Parameters
    ----------
    logits : Tensor
        Floating-point logits, classes along the last dimension.
    target : Tensor
        Class indices in ``[0, V)``, or ``ignore_index``.
    smoothing : float
        :math:`\varepsilon \in [0, 1]`; 0 is the plain cross-entropy.
    ignore_index : int
        A target value that marks rows to skip.
    reduction : str
        How the rows' losses are combined: ``"mean"``, ``"sum"`` or ``"none"``.

    Returns
    -------
    Tensor
        The loss.

    Raises
    ------
    TypeError
        If ``logits`` is not floating point or ``target`` is not an integer
        tensor.
    ValueError
        If the shapes do not fit, a target is out of range, ``smoothing`` is
        outside ``[0, 1]``, or ``reduction`` is unknown.

    Examples
    --------
    >>> import torch
    >>> import torch.nn.functional as F
    >>> import softmaxbook as sb
    >>> logits, target = torch.randn(4, 6, 10), torch.randint(10, (4, 6))
    >>> target[0, :2] = -100  # ignored rows
    >>> ours = sb.label_smoothed_cross_entropy(logits, target, smoothing=0.1)
    >>> theirs = F.cross_entropy(
    ...     logits.movedim(-1, 1), target, label_smoothing=0.1, ignore_index=-100
    ... )
    >>> torch.allclose(ours, theirs)
    True
    """
    check_float(logits, "logits")
    if logits.dim() == 0:
        raise ValueError("logits must have at least one dimension (..., V)")
    eps = check_nonnegative(smoothing, "smoothing")
    if eps > 1:
        raise ValueError(f"smoothing must be in [0, 1], got {smoothing}")
    _check_reduction(reduction)
    _check_target(target, logits.shape[:-1], logits.shape[-1], ignore_index)
    z = _upcast(logits)
    counted = target != ignore_index  # (...)
    logp = torch.log_softmax(z, dim=-1)  # (..., V)
    picked = target.masked_fill(~counted, 0).unsqueeze(-1)
    nll = -logp.gather(-1, picked).squeeze(-1)  # (...)
    loss = nll
    if eps > 0:
        allowed = ~torch.isneginf(z)  # removed classes get no smoothing mass
        k = allowed.sum(dim=-1).clamp_min(1)
        uniform = -logp.masked_fill(~allowed, 0.0).sum(dim=-1) / k  # (...)
        loss = (1 - eps) * nll + eps * uniform
    per_row = torch.where(counted, loss, torch.zeros_like(loss))
    return _reduce(per_row, counted, reduction)


def z_loss(logits: Tensor, *, reduction: str = "mean") -> Tensor:
    r"""The z-loss :math:`(\log Z)^2`, with :math:`\log Z = \operatorname{logsumexp}(z)`
    of each row.

    The cross-entropy does not change when a constant is added to every
    logit of a row, so nothing in it stops :math:`\log Z` from drifting;
    this term pulls it to 0, i.e. makes :math:`e^{z_i}` themselves close to
    normalized probabilities. Its gradient is
    :math:`2 \log Z \cdot \mathrm{softmax}(z)`: a push on the shift of the
    row, proportional to how far :math:`\log Z` is from 0. PaLM adds it with
    the coefficient :math:`10^{-4}` (Chowdhery et al., 2023); multiply the
    result by yours. A row whose logits are all ``-inf`` contributes 0.
    float16 and bfloat16 logits are computed in float32.

    Shapes: ``logits`` is ``(..., V)``; the result is a scalar, or ``(...)``
    with ``reduction="none"``.

    Equivalent to ``torch.logsumexp(logits, -1) ** 2`` (with ``"none"``):

    >>> import torch
    >>> import softmaxbook as sb
    >>> logits = torch.randn(3, 8)
    >>> values = sb.z_loss(logits, reduction="none")
    >>> torch.allclose(values, torch.logsumexp(logits, -1) ** 2)
    True
    >>> sb.z_loss(torch.tensor([[0.0, 0.0], [-0.5, -0.5]]), reduction="none")
    tensor([0.4805, 0.0373])

    Parameters
    ----------
    logits : Tensor
        Floating-point logits, classes along the last dimension.
    reduction : str
        How the rows' values are combined: ``"mean"``, ``"sum"`` or ``"none"``.

    Returns
    -------
    Tensor
        :math:`(\log Z)^2`, reduced.

    Raises
    ------
    TypeError
        If ``logits`` is not a floating-point tensor.
    ValueError
        If ``logits`` is 0-dimensional or ``reduction`` is unknown.
    """
    check_float(logits, "logits")
    if logits.dim() == 0:
        raise ValueError("logits must have at least one dimension (..., V)")
    _check_reduction(reduction)
    z = _upcast(logits)
    empty = torch.isneginf(z).all(dim=-1, keepdim=True)  # no class left in the row
    log_z = torch.logsumexp(z.masked_fill(empty, 0.0), dim=-1)  # finite everywhere
    per_row = torch.where(empty.squeeze(-1), torch.zeros_like(log_z), log_z**2)
    counted = torch.ones_like(per_row, dtype=torch.bool)
    return _reduce(per_row, counted, reduction)


def chunked_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    *,
    bias: Tensor | None = None,
    chunk_size: int = 1024,
    soft_cap: float | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    r"""Cross-entropy of the logits :math:`z = h W^\top + b` without ever holding
    all of them: :math:`\ell_n = \operatorname{logsumexp}(z_n) - z_{n, y_n}`.

    The rows are processed ``chunk_size`` at a time. The forward pass keeps
    only each row's logsumexp; the backward pass recomputes a chunk's logits
    and turns them into the gradient
    :math:`\partial \ell_n / \partial z_n = \mathrm{softmax}(z_n) - e_{y_n}`,
    then into :math:`\partial / \partial h = G W` and
    :math:`\partial / \partial W = G^\top h`. The extra memory is one
    ``(chunk_size, V)`` block instead of the ``(N, V)`` logits and their
    gradient, at the price of computing the logits twice: four matrix
    products the size of the logits instead of three. (Liger-Kernel's fused
    linear cross-entropy computes the gradients in the forward pass instead,
    while each chunk's logits are at hand, and keeps them for the backward
    pass: three products.) Cut Cross-Entropy
    (Wijmans et al., 2025) goes further in a fused GPU kernel: it also tiles
    the vocabulary, keeps the logit tiles in on-chip memory, and skips the
    gradient entries that are negligible; this function is the same
    computation in plain torch.

    With ``soft_cap`` the logits are :math:`c \tanh(z / c)` (Gemma 2's final
    soft-capping, :func:`~softmaxbook.soft_cap`), and the gradient gets the
    factor :math:`1 - \tanh^2`. Rows whose target is ``ignore_index``
    contribute 0 and are left out of the mean (0 if no row counts). The
    logits are computed in at least float32.

    Shapes: ``hidden`` is ``(..., D)``, ``weight`` is ``(V, D)``, ``bias``
    is ``(V,)``, ``target`` is ``(...)``; the result is a scalar, or ``(...)``
    with ``reduction="none"``.

    Equivalent to ``F.cross_entropy(hidden.reshape(-1, D) @ weight.T + bias,
    target.reshape(-1), ignore_index=ignore_index)`` (for ``"mean"``), in the
    values and in the gradients:

    >>> import torch
    >>> import torch.nn.functional as F
    >>> import softmaxbook as sb
    >>> hidden = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    >>> weight = torch.randn(11, 8, dtype=torch.float64, requires_grad=True)
    >>> target = torch.randint(11, (2, 5))
    >>> ours = sb.chunked_cross_entropy(hidden, weight, target, chunk_size=3)
    >>> theirs = F.cross_entropy(hidden.reshape(-1, 8) @ weight.T, target.reshape(-1))
    >>> torch.allclose(ours, theirs)
    True
    >>> grads = torch.autograd.grad(ours, (hidden, weight))
    >>> expected = torch.autograd.grad(theirs, (hidden, weight))
    >>> all(torch.allclose(a, b) for a, b in zip(grads, expected))
    True

    Parameters
    ----------
    hidden : Tensor
        The final hidden states.
    weight : Tensor
        The output layer (the LM head), one row per class.
    target : Tensor
        Class indices in ``[0, V)``, or ``ignore_index``.
    bias : Tensor, optional
        The output layer's bias.
    chunk_size : int
        Rows per chunk, ``>= 1``: the memory-speed trade-off.
    soft_cap : float, optional
        Cap the logits at :math:`c > 0` first.
    ignore_index : int
        A target value that marks rows to skip.
    reduction : str
        How the rows' losses are combined: ``"mean"``, ``"sum"`` or ``"none"``.

    Returns
    -------
    Tensor
        The loss; differentiable in ``hidden``, ``weight`` and ``bias``
        (once: no second derivatives).

    Raises
    ------
    TypeError
        If a tensor has the wrong kind of dtype, or the dtypes differ.
    ValueError
        If the shapes do not fit, a target is out of range, ``chunk_size < 1``,
        ``soft_cap <= 0`` or ``reduction`` is unknown.
    """
    check_float(hidden, "hidden")
    check_float(weight, "weight")
    if hidden.dim() == 0 or weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(
            "hidden must be (..., D) and weight (V, D), got "
            f"{tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    if weight.dtype != hidden.dtype or weight.device != hidden.device:
        raise TypeError(
            "hidden and weight must share a dtype and a device, got "
            f"{hidden.dtype} on {hidden.device} and {weight.dtype} on {weight.device}"
        )
    if bias is not None:
        check_float(bias, "bias")
        if bias.shape != weight.shape[:1] or bias.dtype != weight.dtype:
            raise ValueError(
                f"bias must be ({weight.shape[0]},) in {weight.dtype}, got "
                f"{tuple(bias.shape)} in {bias.dtype}"
            )
    chunk_size = check_positive_int(chunk_size, "chunk_size")
    cap = None if soft_cap is None else check_positive(soft_cap, "soft_cap")
    _check_reduction(reduction)
    _check_target(target, hidden.shape[:-1], weight.shape[0], ignore_index)
    rows = hidden.reshape(-1, hidden.shape[-1])  # (N, D)
    labels = target.reshape(-1)  # (N,)
    per_row, _ = _ChunkedCrossEntropy.apply(
        rows, weight, bias, labels, chunk_size, cap, ignore_index
    )
    counted = labels != ignore_index
    if reduction == "none":
        return per_row.reshape(target.shape)
    return _reduce(per_row, counted, reduction)


def _chunk_logits(
    h: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    cap: float | None,
    acc: torch.dtype,
) -> Tensor:
    """The logits of one chunk, ``(c, V)``, in the accumulation dtype."""
    z = h.to(acc) @ weight.to(acc).T
    if bias is not None:
        z = z + bias.to(acc)
    return z if cap is None else cap * torch.tanh(z / cap)


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Per-row cross-entropy of ``hidden @ weight.T + bias``, a chunk at a time."""

    @staticmethod
    def forward(
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        target: Tensor,
        chunk_size: int,
        cap: float | None,
        ignore_index: int,
    ) -> tuple[Tensor, Tensor]:
        acc = acc_dtype(hidden.dtype)
        N = hidden.shape[0]
        losses = torch.zeros(N, dtype=acc, device=hidden.device)
        lse = torch.zeros(N, dtype=acc, device=hidden.device)
        for start in range(0, N, chunk_size):
            rows = slice(start, start + chunk_size)
            z = _chunk_logits(hidden[rows], weight, bias, cap, acc)  # (c, V)
            lse[rows] = torch.logsumexp(z, dim=-1)
            t = target[rows]
            counted = t != ignore_index
            picked = z.gather(-1, t.masked_fill(~counted, 0).unsqueeze(-1))
            losses[rows] = torch.where(counted, lse[rows] - picked.squeeze(-1), 0.0)
        return losses, lse

    @staticmethod
    # ctx is typed Any: torch's FunctionCtx does not declare the attributes set on it.
    def setup_context(
        ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]
    ) -> None:
        hidden, weight, bias, target, chunk_size, cap, ignore_index = inputs
        _, lse = output
        ctx.save_for_backward(hidden, weight, bias, target, lse)
        ctx.chunk_size, ctx.cap, ctx.ignore_index = chunk_size, cap, ignore_index
        ctx.mark_non_differentiable(lse)

    @staticmethod
    @once_differentiable
    def backward(
        ctx: Any, grad_losses: Tensor, _grad_lse: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        hidden, weight, bias, target, lse = ctx.saved_tensors
        cap, acc = ctx.cap, lse.dtype
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = (
            torch.zeros_like(weight, dtype=acc) if ctx.needs_input_grad[1] else None
        )
        need_b = bias is not None and ctx.needs_input_grad[2]
        grad_b = torch.zeros_like(bias, dtype=acc) if need_b else None
        w = weight.to(acc)
        for start in range(0, hidden.shape[0], ctx.chunk_size):
            rows = slice(start, start + ctx.chunk_size)
            h = hidden[rows].to(acc)
            z = _chunk_logits(h, weight, bias, cap, acc)  # recomputed, (c, V)
            # In place from here on: one (c, V) block at a time is the point.
            slope = None if cap is None else 1 - (z / cap) ** 2  # d(c tanh(r/c))/dr
            g = z.sub_(lse[rows].unsqueeze(-1)).exp_()  # softmax(z)
            t = target[rows]
            counted = t != ctx.ignore_index
            g.scatter_add_(
                -1,
                t.masked_fill(~counted, 0).unsqueeze(-1),
                -torch.ones_like(g[:, :1]),
            )  # softmax - one-hot
            g.mul_((grad_losses[rows] * counted).unsqueeze(-1))
            if slope is not None:
                g.mul_(slope)
            if grad_h is not None:
                grad_h[rows] = (g @ w).to(hidden.dtype)
            if grad_w is not None:
                grad_w.addmm_(g.T, h)
            if grad_b is not None:
                grad_b += g.sum(dim=0)
        grad_w = None if grad_w is None else grad_w.to(weight.dtype)
        grad_b = None if grad_b is None else grad_b.to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None
