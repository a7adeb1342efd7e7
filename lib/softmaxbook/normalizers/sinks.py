r"""Normalizers that may attend to nothing, and what softmax needs to get close.

Softmax weights sum to one, so a head with nothing to read on a row must still
spend a whole unit of weight somewhere. Trained models spend it on an early
token with a small value, an *attention sink* (Xiao et al., 2024); to make the
other weights small, the sink's score must exceed theirs by about
:math:`\log(n/\epsilon)`, a gap that grows without bound as
:math:`\epsilon \to 0` (:func:`ignore_gap`). The maps here relax the
constraint, each in its own way:

- :func:`sink_softmax`: softmax with one extra logit per row (a learned *sink
  logit*, as in gpt-oss) whose weight is dropped; the weights sum to less
  than one. With a sink logit of 0 it is
  :func:`~softmaxbook.softmax_one`.
- :func:`softpick`: :math:`\mathrm{relu}(e^{x_i} - 1) / \sum_j |e^{x_j} - 1|`
  (Zuhri et al., 2025): a key with a score :math:`\le 0` gets exactly zero
  weight, so a row of non-positive scores attends to nothing.
- :func:`clipped_softmax`: softmax stretched and clipped to :math:`[0, 1]`
  (Bondarenko et al., 2023): exact zeros at a finite score gap (and exact ones,
  when stretched above 1, ``zeta > 1``).
- :func:`relu_attention`: :math:`\mathrm{relu}(x_i) / n` (Wortsman et al.,
  2023): no normalization at all, so nothing forces a unit of weight.

Every map takes ``(x, dim)`` like the library's other normalizers, treats
``-inf`` as a removed key, gives zeros (and zero gradients) for a row with
nothing left, and is built from differentiable torch operations, so autograd,
``gradcheck`` and ``torch.func`` (``vmap``, ``grad``, ``jacrev``) work through
it unchanged. The shared policy (argument checks, ``float16``/``bfloat16`` in
``float32``, 0-d and empty input) is ``@normalizer``'s.
"""

from __future__ import annotations

from numbers import Real

import torch
from torch import Tensor

from .._validate import check_real, zero_empty_rows
from ._policy import normalizer

__all__ = ["sink_softmax", "softpick", "clipped_softmax", "relu_attention"]


def _removed(x: Tensor) -> Tensor:
    # -inf is a removed key; nan is not (it must propagate, not disappear).
    return torch.isneginf(x)


# --------------------------------------------------------------------------------------
# softmax with a sink logit
# --------------------------------------------------------------------------------------


def _sink_options(x: Tensor, dim: int, *, sinks: float | Tensor) -> dict[str, Tensor]:
    """The sinks as a tensor that broadcasts to ``x`` with ``dim`` of size 1."""
    if isinstance(sinks, Real) and not isinstance(sinks, bool):
        return {"sinks": torch.tensor(float(sinks), dtype=x.dtype, device=x.device)}
    if not isinstance(sinks, Tensor):
        raise TypeError(
            f"sinks must be a real number or a floating-point tensor, got "
            f"{type(sinks).__name__}"
        )
    if not sinks.is_floating_point():
        raise TypeError(
            f"sinks must be a floating-point tensor, got dtype {sinks.dtype}; "
            "convert it first, e.g. sinks.float()"
        )
    if sinks.device != x.device:
        raise ValueError(
            f"sinks is on {sinks.device} but x is on {x.device}; "
            "move it with sinks.to(x.device)"
        )
    row = list(x.shape)
    row[dim] = 1
    try:
        shape = torch.broadcast_shapes(sinks.shape, tuple(row))
    except RuntimeError:
        shape = None
    if shape != tuple(row):
        raise ValueError(
            f"sinks of shape {tuple(sinks.shape)} must broadcast to {tuple(row)}: "
            f"the shape of x {tuple(x.shape)} with dimension {dim} of size 1 "
            "(one sink logit per row)"
        )
    return {"sinks": sinks}


@normalizer(sparse=False, sums_to_one=False, options=_sink_options)
def sink_softmax(x: Tensor, sinks: float | Tensor = 0.0, dim: int = -1) -> Tensor:
    r"""Softmax with a sink logit:
    :math:`p_i = e^{x_i} / (e^{b} + \sum_j e^{x_j})`.

    The softmax of the row with one more entry, the *sink logit* :math:`b`,
    whose weight :math:`e^b / (e^b + \sum_j e^{x_j})` is dropped: the weights
    sum to less than one, and the head attends to (almost) nothing when every
    score is well below :math:`b`. This is the attention of gpt-oss, where
    each head learns its own :math:`b`; with :math:`b = 0` it is
    :func:`~softmaxbook.softmax_one`. The gradient with respect to the sink
    is :math:`\partial p_i / \partial b = -p_i\, p_{\text{sink}}`.

    Stable for any finite input: the row is shifted by
    :math:`\max(b, \max_j x_j)`. ``-inf`` entries get weight 0; a row of only
    ``-inf`` gives zeros (the sink takes everything).

    Shapes: ``x`` is ``(..., N)`` (normalized along ``dim``); ``sinks`` is a
    number or a tensor that broadcasts to ``x`` with ``dim`` of size 1, e.g.
    ``(..., 1)``; the result has the shape and dtype of ``x``.

    Equivalent to
    ``torch.cat([x, sinks.expand(...)], dim).softmax(dim)`` without its last
    entry along ``dim``:

    >>> import torch
    >>> x, b = torch.tensor([[1.0, -0.5, 2.0]]), torch.tensor([[0.5]])
    >>> full = torch.cat([x, b], dim=-1).softmax(-1)[:, :-1]
    >>> torch.allclose(sink_softmax(x, b), full)
    True

    Parameters
    ----------
    x : Tensor
        Scores, any floating dtype and device.
    sinks : float or Tensor
        The sink logit(s) :math:`b`; a tensor can require a gradient (a
        learned sink). The default, 0, makes it
        :func:`~softmaxbook.softmax_one`.
    dim : int
        The dimension to normalize; negative values count from the end.

    Returns
    -------
    Tensor
        Non-negative weights whose sum along ``dim`` is below 1 in exact
        arithmetic; computed, it rounds to 1 when the sink's share is below the
        dtype's resolution (a score 200 above the sink, in float32).

    Raises
    ------
    TypeError
        If ``x`` is not a floating-point tensor, ``dim`` is not an int, or
        ``sinks`` is neither a real number nor a floating-point tensor.
    ValueError
        If ``sinks`` does not broadcast to one logit per row, or lives on
        another device.
    IndexError
        If ``dim`` is out of range.
    """
    sink = sinks.to(x.dtype)  # type: ignore[union-attr]  # a tensor: _sink_options
    # Shift by the largest logit of the row, the sink's included, so that every
    # exponential is <= 1. The shift cancels in the ratio: it needs no gradient.
    m = torch.maximum(x.amax(dim, keepdim=True), sink).detach()
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)  # no finite logit
    e = torch.exp(x - m)
    total = torch.exp(sink - m) + e.sum(dim, keepdim=True)
    # A removed row with a sink of -inf has nothing at all: 0 / 1 = 0.
    return e / torch.where(total > 0, total, torch.ones_like(total))


# --------------------------------------------------------------------------------------
# softpick
# --------------------------------------------------------------------------------------


def _softpick(x: Tensor, dim: int) -> Tensor:
    removed = _removed(x)
    # e^x - 1 = e^c (e^(x-c) - e^-c) for any shift c; c = max(max_j x_j, 0)
    # keeps every exponential <= 1, and the factor e^c cancels in the ratio.
    # Each sign gets the form that is accurate near 0 (expm1), and each branch
    # sees only its own half-line, so neither overflows (nor leaks a nan into
    # the gradient of the other through torch.where).
    c = x.amax(dim, keepdim=True).clamp_min(0).detach()
    c = torch.where(torch.isneginf(c), torch.zeros_like(c), c)
    xp, xn = x.clamp_min(0), x.clamp_max(0)
    above = -torch.exp(xp - c) * torch.expm1(-xp)  # e^(x-c) (1 - e^-x), x > 0
    below = torch.exp(-c) * torch.expm1(xn)  # e^-c (e^x - 1), x <= 0
    shifted = torch.where(x > 0, above, below)  # e^-c (e^x - 1)
    numerator = torch.relu(shifted)
    magnitude = torch.where(removed, torch.zeros_like(shifted), shifted.abs())
    total = magnitude.sum(dim, keepdim=True)
    # total = 0 only when every kept score is exactly 0 (or none is kept):
    # then the numerator is 0 as well, and the weights are 0.
    return numerator / torch.where(total > 0, total, torch.ones_like(total))


@normalizer(sparse=True, sums_to_one=False)
def softpick(x: Tensor, dim: int = -1) -> Tensor:
    r"""Softpick: :math:`p_i = \mathrm{relu}(e^{x_i} - 1) / \sum_j |e^{x_j} - 1|`.

    The rectified softmax of Zuhri et al. (2025). A score :math:`x_i \le 0`
    gets exactly zero weight, so a row whose scores are all :math:`\le 0`
    attends to nothing, at no cost in score magnitude: the "no-op" that a
    softmax head can only approach by pushing some score far above the
    others. The negative scores still count in the denominator, so the
    weights sum to :math:`P / (P + N) \le 1`, with :math:`P` the sum of
    :math:`e^{x_i} - 1` over the positive scores and :math:`N` the sum of
    :math:`1 - e^{x_j}` over the negative ones. Unlike softmax it is not
    invariant to shifting the scores: 0 is a threshold.

    Stable for any finite input (the ratio is computed with every
    exponential :math:`\le 1`, and with ``expm1`` near 0). ``-inf`` entries
    are removed keys: weight 0, and they do not count in the denominator. A
    row with no positive score, or with nothing left, gives zeros. (The
    paper adds a small :math:`\epsilon` to the denominator; that only matters
    when every score is exactly 0, where this function returns zeros.)

    Shapes: ``x`` is ``(..., N)``; the result has the same shape and dtype.

    Equivalent to ``relu(expm1(x)) / expm1(x).abs().sum(dim, keepdim=True)``
    where that sum is positive and nothing overflows:

    >>> import torch
    >>> import softmaxbook as sb
    >>> x = torch.randn(3, 6)
    >>> e = torch.expm1(x)
    >>> torch.allclose(sb.softpick(x), torch.relu(e) / e.abs().sum(-1, keepdim=True))
    True
    >>> sb.softpick(torch.tensor([0.0, -1.0, -2.0]))  # no score above 0: no weight
    tensor([0., 0., 0.])

    Parameters
    ----------
    x : Tensor
        Scores, any floating dtype and device.
    dim : int
        The dimension to normalize; negative values count from the end.

    Returns
    -------
    Tensor
        Non-negative weights whose sum along ``dim`` is at most 1, exactly 0
        on every key with a score :math:`\le 0`.

    Raises
    ------
    TypeError
        If ``x`` is not a floating-point tensor or ``dim`` is not an int.
    IndexError
        If ``dim`` is out of range.
    """
    return _softpick(x, dim)


# --------------------------------------------------------------------------------------
# clipped softmax
# --------------------------------------------------------------------------------------


def _clipped_softmax(x: Tensor, dim: int, gamma: float, zeta: float) -> Tensor:
    def clip(s: Tensor) -> Tensor:
        return ((zeta - gamma) * torch.softmax(s, dim) + gamma).clamp(0.0, 1.0)

    return zero_empty_rows(clip, x, dim)  # a row with nothing to attend: zeros


def _clipped_options(x: Tensor, dim: int, *, gamma: float, zeta: float) -> dict:
    gamma = check_real(gamma, "gamma")
    zeta = check_real(zeta, "zeta")
    if gamma > 0:
        raise ValueError(f"gamma must be <= 0 (it stretches below 0), got {gamma}")
    if zeta < 1:
        raise ValueError(f"zeta must be >= 1 (it stretches above 1), got {zeta}")
    return {"gamma": gamma, "zeta": zeta}


@normalizer(sparse=True, sums_to_one=False, options=_clipped_options)
def clipped_softmax(
    x: Tensor, dim: int = -1, *, gamma: float = -0.025, zeta: float = 1.0
) -> Tensor:
    r"""Clipped softmax:
    :math:`p_i = \mathrm{clip}\big((\zeta - \gamma)\,\mathrm{softmax}(x)_i +
    \gamma,\ 0,\ 1\big)`.

    Bondarenko et al. (2023) stretch the softmax slightly beyond
    :math:`[0, 1]` (:math:`\gamma < 0`, :math:`\zeta \ge 1`) and clip it
    back. A weight becomes exactly 0 once
    :math:`\mathrm{softmax}(x)_i \le -\gamma / (\zeta - \gamma)`, at a finite
    score gap, and its gradient is then exactly 0: a head that wants to
    ignore a key stops pushing its score down once the weight is zero, where
    softmax keeps pushing forever. The weights no longer sum to one.
    ``gamma = 0, zeta = 1`` is softmax.

    The defaults are the values of the authors' BERT recipe
    (``clipped(-.025:1)``); for OPT they use :math:`\gamma = -\alpha / T`
    with :math:`\alpha = 12` and :math:`T` the sequence length.

    ``-inf`` entries get weight 0; a row of only ``-inf`` gives zeros.

    Shapes: ``x`` is ``(..., N)``; the result has the same shape and dtype.

    Equivalent to
    ``torch.clip((zeta - gamma) * torch.softmax(x, dim) + gamma, 0, 1)``:

    >>> import torch
    >>> import softmaxbook as sb
    >>> x = torch.randn(3, 6)
    >>> stretched = (1.0 + 0.025) * torch.softmax(x, -1) - 0.025
    >>> torch.allclose(sb.clipped_softmax(x), stretched.clip(0, 1))
    True

    Parameters
    ----------
    x : Tensor
        Scores, any floating dtype and device.
    dim : int
        The dimension to normalize; negative values count from the end.
    gamma : float
        The lower stretch, :math:`\gamma \le 0`.
    zeta : float
        The upper stretch, :math:`\zeta \ge 1`.

    Returns
    -------
    Tensor
        Weights in :math:`[0, 1]`, exact zeros on low-scoring keys.

    Raises
    ------
    TypeError
        If ``x`` is not a floating-point tensor, ``dim`` is not an int, or
        ``gamma`` / ``zeta`` is not a real number.
    ValueError
        If ``gamma > 0``, ``zeta < 1``, or either is not finite.
    IndexError
        If ``dim`` is out of range.
    """
    return _clipped_softmax(x, dim, gamma, zeta)


# --------------------------------------------------------------------------------------
# ReLU attention
# --------------------------------------------------------------------------------------


def _relu_attention(x: Tensor, dim: int) -> Tensor:
    kept = (~_removed(x)).sum(dim, keepdim=True).clamp_min(1)
    return torch.relu(x) / kept.to(x.dtype)


@normalizer(sparse=True, sums_to_one=False)
def relu_attention(x: Tensor, dim: int = -1) -> Tensor:
    r"""ReLU attention: :math:`p_i = \max(x_i, 0) / n`, with :math:`n` the
    number of keys.

    The attention of Wortsman et al. (2023), who replace the softmax of
    vision transformers by a ReLU divided by the sequence length and find
    that the division is what lets it approach softmax attention. Nothing
    normalizes a row: the weights sum to :math:`\sum_i \max(x_i, 0) / n`,
    a row without a positive score attends to nothing (continuously, unlike
    :func:`~softmaxbook.relu_normalize`, whose denominator vanishes there),
    and a positive score has gradient :math:`1/n` whatever the others are.

    **Which** :math:`n`: the paper divides by the sequence length of a vision
    transformer, where no key is masked. Here :math:`n` counts the keys a row
    may attend to, its entries that are not ``-inf``: on an unmasked row that
    is the sequence length, as in the paper; with a causal mask it is the
    number of visible keys; and padding keys do not change the result. (A
    row of only ``-inf`` gives zeros.)

    Shapes: ``x`` is ``(..., N)``; the result has the same shape and dtype.

    Equivalent to ``torch.relu(x) / x.shape[dim]`` on a row without ``-inf``:

    >>> import torch
    >>> import softmaxbook as sb
    >>> sb.relu_attention(torch.tensor([2.0, -1.0, 1.0, 1.0]))
    tensor([0.5000, 0.0000, 0.2500, 0.2500])

    Parameters
    ----------
    x : Tensor
        Scores, any floating dtype and device.
    dim : int
        The dimension of the keys; negative values count from the end.

    Returns
    -------
    Tensor
        Non-negative weights, zero on every non-positive score.

    Raises
    ------
    TypeError
        If ``x`` is not a floating-point tensor or ``dim`` is not an int.
    IndexError
        If ``dim`` is out of range.
    """
    return _relu_attention(x, dim)
