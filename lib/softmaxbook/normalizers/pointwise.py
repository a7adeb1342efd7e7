r"""Pointwise normalizers: softmax-off-by-one, ReLU and sigmoid.

Softmax-off-by-one may put (almost) no weight anywhere; the ReLU normalizer is
cheap and sparse but has nothing to normalize on a row without a positive
score; the sigmoid weighs each key on its own. Each treats ``-inf`` entries as
removed keys, gives all-zero weights (and zero gradients, never ``nan``) for a
row whose entries are all ``-inf``, and has a hand-written backward pass: an
autograd Function with a ``vmap`` rule, so ``torch.func`` composes with it.
The shared policy (argument checks, half precision in ``float32``, 0-d and
empty input) is ``@normalizer``'s.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ._policy import RowwiseFunction, normalizer

__all__ = ["softmax_one", "relu_normalize", "sigmoid_normalize"]


# --------------------------------------------------------------------------------------
# softmax-off-by-one, ReLU and sigmoid normalization
# --------------------------------------------------------------------------------------


class _SoftmaxOne(RowwiseFunction):
    @staticmethod
    def forward(x: Tensor, dim: int) -> Tensor:
        # Shift by max(m, 0), not m: the implicit extra logit 0 is part of the
        # maximum, so e^{-shift} (its term) and every e^{x_i - shift} stay <= 1.
        # No overflow, and a row of only -inf gives 0 / 1 = 0.
        shift = x.amax(dim, keepdim=True).clamp_min(0)
        e = torch.exp(x - shift)
        return e / (torch.exp(-shift) + e.sum(dim, keepdim=True))

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        ctx.save_for_backward(output)
        ctx.dim = inputs[1]

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        (p,) = ctx.saved_tensors
        # Same form as softmax's: dp_i/dx_j = p_i (delta_ij - p_j).
        return p * (grad - (p * grad).sum(ctx.dim, keepdim=True)), None


@normalizer(sparse=False, sums_to_one=False)
def softmax_one(x: Tensor, dim: int = -1) -> Tensor:
    r"""Softmax-off-by-one:
    :math:`\mathrm{softmax}_1(x)_i = e^{x_i} / (1 + \sum_j e^{x_j})`.

    Softmax with an extra, implicit logit fixed at 0 whose weight is thrown
    away (Miller, 2023, "quiet attention"): the weights sum to
    :math:`1 - 1/(1 + \sum_j e^{x_j}) < 1`, so a head whose scores are all very
    negative can attend to (almost) nothing instead of being forced to put
    weight 1 somewhere. Stable for any finite input: the scores are shifted
    by :math:`\max(\max_j x_j, 0)`. The Jacobian has softmax's form,
    :math:`\mathrm{diag}(p) - p p^\top`.

    ``-inf`` entries get weight 0; a row of only ``-inf`` gives zeros (no
    special case needed: the extra logit absorbs all the weight).

    Shapes: ``x`` is ``(..., N)``; the result has the same shape and dtype.

    Equivalent to ``torch.softmax(torch.cat([x, zeros], dim), dim)`` with
    the last entry dropped:

    >>> import torch
    >>> import softmaxbook as sb
    >>> x = torch.randn(3, 5)
    >>> with_zero = torch.cat([x, torch.zeros(3, 1)], -1)
    >>> torch.allclose(sb.softmax_one(x), torch.softmax(with_zero, -1)[:, :-1])
    True
    >>> sb.softmax_one(torch.full((3,), -20.0)).sum() < 1e-8  # can attend to nothing
    tensor(True)

    Parameters
    ----------
    x : Tensor
        Scores, any floating dtype and device.
    dim : int
        The dimension to normalize; negative values count from the end.

    Returns
    -------
    Tensor
        Non-negative weights whose sum along ``dim`` is below 1 in exact
        arithmetic, :math:`1 - 1/(1 + \sum_j e^{x_j})`; rounding makes it 1
        when that difference is below the dtype's resolution (float32 scores
        of 20 already give 1.0).

    Raises
    ------
    TypeError
        If ``x`` is not a floating-point tensor or ``dim`` is not an int.
    IndexError
        If ``dim`` is out of range.
    """
    return _SoftmaxOne.apply(x, dim)


class _ReluNormalize(RowwiseFunction):
    @staticmethod
    def forward(x: Tensor, dim: int) -> Tensor:
        r = x.clamp_min(0)
        total = r.sum(dim, keepdim=True)
        # A row with no positive score: 0 / 1 = 0 (a nan row stays nan).
        return r / torch.where(total == 0, torch.ones_like(total), total)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        x, ctx.dim = inputs
        ctx.save_for_backward(x, output)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, p = ctx.saved_tensors
        total = x.clamp_min(0).sum(ctx.dim, keepdim=True)
        total = torch.where(total == 0, torch.ones_like(total), total)
        # d p_i / d x_j = [x_j > 0] (delta_ij - p_i) / sum_k relu(x_k).
        dx = (grad - (p * grad).sum(ctx.dim, keepdim=True)) / total
        return torch.where(x > 0, dx, torch.zeros_like(dx)), None


@normalizer(sparse=True, sums_to_one=True, aliases=("relu",))
def relu_normalize(x: Tensor, dim: int = -1) -> Tensor:
    r"""ReLU normalization: :math:`p_i = \max(x_i, 0) / \sum_j \max(x_j, 0)`.

    A cheap, sparse normalizer: non-positive scores get exactly zero weight.
    Unlike softmax it is invariant to scaling the scores (not to shifting
    them), and it has a failure mode: **a row with no positive score has
    nothing to normalize**. This function returns all-zero weights for such a
    row (and a zero gradient), rather than the ``0/0 = nan`` of the naive
    formula; note that this makes the map discontinuous there (a single score
    of :math:`+\epsilon` gives weight 1). The gradient at a score of exactly
    0 is taken to be 0.

    ``-inf`` entries get weight 0.

    Shapes: ``x`` is ``(..., N)``; the result has the same shape and dtype.

    Equivalent to ``torch.relu(x) / torch.relu(x).sum(dim, keepdim=True)``
    where that sum is positive:

    >>> import torch
    >>> import softmaxbook as sb
    >>> x = torch.tensor([[2.0, -1.0, 1.0, 1.0], [-1.0, -2.0, 0.0, -3.0]])
    >>> sb.relu_normalize(x)  # a row with nothing positive gets zeros
    tensor([[0.5000, 0.0000, 0.2500, 0.2500],
            [0.0000, 0.0000, 0.0000, 0.0000]])

    Parameters
    ----------
    x : Tensor
        Scores, any floating dtype and device.
    dim : int
        The dimension to normalize; negative values count from the end.

    Returns
    -------
    Tensor
        Weights summing to 1 along ``dim``, or all zero in a row without a
        positive score.

    Raises
    ------
    TypeError
        If ``x`` is not a floating-point tensor or ``dim`` is not an int.
    IndexError
        If ``dim`` is out of range.
    """
    return _ReluNormalize.apply(x, dim)


class _SigmoidNormalize(RowwiseFunction):
    @staticmethod
    def forward(x: Tensor, dim: int, bias: float) -> Tensor:
        return torch.sigmoid(x + bias)  # dim only chose the default bias

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        ctx.save_for_backward(output)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        (p,) = ctx.saved_tensors
        return grad * p * (1 - p), None, None


def _sigmoid_options(x: Tensor, dim: int, *, bias: float | None) -> dict[str, float]:
    if bias is None:  # -log n, n counting every key (a 0-d score is one key)
        n = x.shape[dim]
        return {"bias": -math.log(n) if n > 0 else 0.0}
    if isinstance(bias, bool) or not isinstance(bias, Real):
        raise TypeError(
            f"bias must be a real number or None, got {type(bias).__name__}"
        )
    if not math.isfinite(bias):
        raise ValueError(f"bias must be finite, got {bias}")
    return {"bias": float(bias)}


@normalizer(
    sparse=False, sums_to_one=False, aliases=("sigmoid",), options=_sigmoid_options
)
def sigmoid_normalize(x: Tensor, dim: int = -1, bias: float | None = None) -> Tensor:
    r"""Sigmoid attention weights: :math:`p_i = \sigma(x_i + b)`, by default
    :math:`b = -\log n`.

    Each key is weighted independently by a logistic sigmoid; nothing makes
    the weights sum to 1. Ramapuram et al. (2025) show that the bias
    :math:`b = -\log n`, with :math:`n` the number of keys (the size along
    ``dim``), keeps the total weight near the softmax's at the start of
    training: for scores near 0 each weight is about :math:`1/(n+1)`, so they
    sum to about 1. Without it the sum is :math:`n/2`. The Jacobian is
    diagonal, :math:`\sigma'(x_i + b) = p_i (1 - p_i)`.

    ``-inf`` entries get weight 0 (so a row of only ``-inf`` gives zeros);
    the default bias counts them in :math:`n` all the same.

    Shapes: ``x`` is ``(..., N)``; the result has the same shape and dtype.

    Equivalent to ``torch.sigmoid(x + bias)``:

    >>> import math
    >>> import torch
    >>> import softmaxbook as sb
    >>> x = torch.randn(2, 8)
    >>> torch.allclose(sb.sigmoid_normalize(x), torch.sigmoid(x - math.log(8)))
    True

    Parameters
    ----------
    x : Tensor
        Scores, any floating dtype and device.
    dim : int
        The dimension of the keys: only used for the default bias.
    bias : float, optional
        The bias :math:`b`; defaults to :math:`-\log n`, ``n = x.shape[dim]``.

    Returns
    -------
    Tensor
        Weights in :math:`[0, 1]`, not normalized: :math:`(0, 1)` in exact
        arithmetic for finite scores; 0 for ``-inf``, and rounding gives
        exactly 0 or 1 far from the bias (float32 :math:`\sigma(40) = 1`).

    Raises
    ------
    TypeError
        If ``x`` is not a floating-point tensor, ``dim`` is not an int, or
        ``bias`` is not a real number.
    ValueError
        If ``bias`` is not finite.
    IndexError
        If ``dim`` is out of range.
    """
    return _SigmoidNormalize.apply(x, dim, bias)
