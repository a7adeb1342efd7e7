r"""Softmax at length: keeping attention sharp when the number of keys grows.

With a fixed score margin :math:`\delta` between one key and :math:`n - 1`
others, softmax gives the key :math:`e^\delta / (e^\delta + n - 1)`, which
fades to 0 as :math:`n` grows: what was a sharp lookup at the training length
is a blur at ten times the length. Three remedies, all a multiplication of the
scores:

- :func:`scalable_softmax` (SSMax, Nakanishi 2025): multiply the scores by
  :math:`s \log n`, so the weight of a key ahead by a fixed margin no longer
  fades with :math:`n`.
- :func:`yarn_logit_scale`: the attention temperature of YaRN (Peng et al.,
  2024), a constant factor for a context window stretched :math:`s` times.
- :func:`adaptive_temperature_softmax` (Veličković et al., 2024): sharpen a
  row by a factor read off its own entropy, at inference time (only rows of
  entropy between about 0.85 and 5.94 nats).

The normalizers take ``(x, dim)`` like the library's others, treat ``-inf``
as a removed key, give zeros for a row with nothing left, and are built from
differentiable torch operations (autograd, ``gradcheck`` and ``torch.func``
work through them). The shared policy (argument checks, half precision in
``float32``, 0-d and empty input) is ``@normalizer``'s.
"""

from __future__ import annotations

import math
from numbers import Real

import torch
from torch import Tensor

from .._validate import check_real, zero_empty_rows
from ._policy import normalizer

__all__ = ["scalable_softmax", "yarn_logit_scale", "adaptive_temperature_softmax"]


def _safe_softmax(x: Tensor, dim: int) -> Tensor:
    """Softmax with zeros (and zero gradients) for rows of only ``-inf``."""
    return zero_empty_rows(lambda s: torch.softmax(s, dim), x, dim)


def _scale_scores(x: Tensor, factor: Tensor) -> Tensor:
    """``factor * x`` on the finite scores; ``-inf`` (removed) stays ``-inf``.

    The removed entries are zeroed before the product, so that a factor with a
    gradient (a learned ``s``) never sees ``-inf * 0 = nan`` in its backward.
    """
    removed = torch.isneginf(x)
    return (x.masked_fill(removed, 0.0) * factor).masked_fill(removed, float("-inf"))


# --------------------------------------------------------------------------------------
# Scalable-Softmax
# --------------------------------------------------------------------------------------


def _scalable_options(
    x: Tensor, dim: int, *, s: float | Tensor, n: float | Tensor | None
) -> dict[str, float | Tensor | None]:
    if isinstance(s, Tensor):
        if not s.is_floating_point():
            raise TypeError(f"s must be a floating-point tensor, got dtype {s.dtype}")
    else:
        s = check_real(s, "s")
    if n is not None:
        values = torch.as_tensor(n, dtype=torch.float64)
        if not (torch.isfinite(values).all() and (values >= 1).all()):
            raise ValueError(f"n must be finite and >= 1, got {n}")
    return {"s": s, "n": n}


@normalizer(sparse=False, sums_to_one=True, options=_scalable_options)
def scalable_softmax(
    x: Tensor,
    dim: int = -1,
    *,
    s: float | Tensor = 0.43,
    n: float | Tensor | None = None,
) -> Tensor:
    r"""Scalable-Softmax (SSMax):
    :math:`p_i = n^{s x_i} / \sum_j n^{s x_j} = \mathrm{softmax}(s \log n \cdot x)_i`.

    Nakanishi (2025) replaces softmax in attention by this map, with
    :math:`n` the number of keys a query sees and :math:`s` a scalar learned
    per layer and head. Multiplying the scores by :math:`s \log n` keeps a
    key that leads the others by a fixed margin :math:`\delta` sharp at every
    length: its weight is
    :math:`n^{s\delta} / (n^{s\delta} + n - 1)`, which tends to 1 when
    :math:`s\delta > 1` instead of fading like softmax's
    :math:`e^\delta / (e^\delta + n - 1)`. In an attention layer it is the
    same as multiplying each query by :math:`s \log n`.

    ``n`` defaults to the number of entries of each row that are not
    ``-inf``: the sequence length without a mask, the position (plus one) of
    the query under a causal mask. The default ``s = 0.43`` is the value of
    the paper's Figure 1; a model learns its own.

    ``-inf`` entries get weight 0; a row of only ``-inf`` gives zeros.

    Shapes: ``x`` is ``(..., N)``; ``s`` and ``n`` are numbers or tensors
    that broadcast to ``x`` with ``dim`` of size 1; the result has the shape
    and dtype of ``x``.

    Equivalent to ``torch.softmax(s * math.log(n) * x, dim)`` for a row of
    ``n`` finite scores:

    >>> import math
    >>> import torch
    >>> import softmaxbook as sb
    >>> x = torch.randn(2, 64)
    >>> expected = torch.softmax(0.43 * math.log(64) * x, -1)
    >>> torch.allclose(sb.scalable_softmax(x, s=0.43), expected)
    True

    Parameters
    ----------
    x : Tensor
        Scores, any floating dtype and device.
    dim : int
        The dimension of the keys; negative values count from the end.
    s : float or Tensor
        The scaling parameter (a tensor may require a gradient).
    n : int, float or Tensor, optional
        The length to scale for, ``>= 1``; by default, counted per row.

    Returns
    -------
    Tensor
        Weights on the simplex along ``dim`` (zeros for an empty row).

    Raises
    ------
    TypeError
        If ``x`` is not a floating-point tensor, ``dim`` is not an int, or
        ``s`` is neither a real number nor a floating-point tensor.
    ValueError
        If ``s`` or ``n`` is not finite, or ``n < 1``.
    IndexError
        If ``dim`` is out of range.
    """
    if n is None:  # the keys this row may attend to
        n = (~torch.isneginf(x)).sum(dim, keepdim=True).clamp_min(1).to(x.dtype)
    else:
        n = torch.as_tensor(n, dtype=x.dtype, device=x.device)
    s = s.to(x.dtype) if isinstance(s, Tensor) else s
    # n = 1 makes a factor of 0: a single key, whose weight is 1 whatever its score.
    return _safe_softmax(_scale_scores(x, s * torch.log(n)), dim)


# --------------------------------------------------------------------------------------
# YaRN's attention temperature
# --------------------------------------------------------------------------------------


def yarn_logit_scale(factor: float) -> float:
    r"""YaRN's attention scale for a context stretched ``factor`` times:
    :math:`1/t = (0.1 \ln s + 1)^2`.

    YaRN (Peng et al., 2024) extends a RoPE model's context window by a
    factor :math:`s` and divides the attention logits by a temperature
    :math:`t` with :math:`\sqrt{1/t} = 0.1 \ln s + 1`. Its code multiplies the
    rotary ``cos`` and ``sin`` tables by :math:`0.1 \ln s + 1` (the
    "mscale"), which scales the rotated queries and keys alike, so their
    dot products by the square. This function returns that square; 1 for
    ``factor <= 1`` (no extension).

    It is the factor on the whole logit only where RoPE rotates every
    dimension of the queries and keys. Where it rotates a part (DeepSeek's
    Multi-head Latent Attention rotates 64 of each head's 192 query/key
    dimensions), scaled tables multiply only that part's share of the
    logit. DeepSeek-V3's ``inference/model.py`` (class ``MLA``) instead
    multiplies the whole softmax scale by ``mscale * mscale``, with
    ``mscale = 0.1 * args.mscale * ln(rope_factor) + 1``, which is this
    function's value when ``args.mscale`` is 1 (the default): the same
    factor, applied to every dimension's share of the logit.

    Parameters
    ----------
    factor : float
        The context extension factor :math:`s > 0` (e.g. 32 for a window
        stretched from 4096 to 131072 tokens).

    Returns
    -------
    float
        The factor :math:`1/t \ge 1` that multiplies the attention logits.

    Raises
    ------
    TypeError
        If ``factor`` is not a real number.
    ValueError
        If ``factor`` is not a finite number > 0.
    """
    if isinstance(factor, bool) or not isinstance(factor, Real):
        raise TypeError(f"factor must be a real number, got {type(factor).__name__}")
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"factor must be a finite number > 0, got {factor}")
    if factor <= 1:
        return 1.0
    return (0.1 * math.log(factor) + 1.0) ** 2


# --------------------------------------------------------------------------------------
# adaptive temperature
# --------------------------------------------------------------------------------------

#: The polynomial of Veličković et al. (2024) that maps a row's entropy to an
#: inverse temperature, highest power first (as ``numpy.polyval`` reads it).
_ENTROPY_POLYNOMIAL = (-0.037, 0.481, -2.3, 4.917, -1.791)
_ENTROPY_THRESHOLD = 0.5  # rows sharper than this are left alone


@normalizer(sparse=False, sums_to_one=True)
def adaptive_temperature_softmax(x: Tensor, dim: int = -1) -> Tensor:
    r"""Softmax sharpened by a temperature read off the row's entropy:
    :math:`\mathrm{softmax}(\beta(H) \cdot x)`.

    The inference-time remedy of Veličković et al. (2024): compute the
    softmax :math:`p` of the row and its entropy
    :math:`H = -\sum_i p_i \log p_i`; if :math:`H > 0.5`, multiply the
    scores by :math:`\beta = \max(\mathrm{poly}(H), 1)`, a fourth-degree
    polynomial fitted in the paper (coefficients ``-0.037, 0.481, -2.3,
    4.917, -1.791``, highest power first), and take the softmax again. The
    temperature :math:`1/\beta` is never raised, and rows that are already
    sharp (:math:`H \le 0.5`) are left as they are. The polynomial exceeds 1
    only between its real roots of :math:`\mathrm{poly}(H) = 1`, about
    :math:`H = 0.85` and :math:`H = 5.94` nats (between the entropies of
    uniform rows of 381 and 382 keys), so only rows in that range are
    sharpened; the others, sharp or spread out, keep :math:`\beta = 1`. The
    gradient flows through :math:`\beta` too (it is a function of the scores).

    ``-inf`` entries get weight 0; a row of only ``-inf`` gives zeros.

    Shapes: ``x`` is ``(..., N)``; the result has the same shape and dtype.

    Parameters
    ----------
    x : Tensor
        Scores, any floating dtype and device.
    dim : int
        The dimension to normalize; negative values count from the end.

    Returns
    -------
    Tensor
        Weights on the simplex along ``dim``, at most as spread as softmax's.

    Raises
    ------
    TypeError
        If ``x`` is not a floating-point tensor or ``dim`` is not an int.
    IndexError
        If ``dim`` is out of range.
    """
    # The entropy of the softmax, with 0 log 0 = 0 for removed keys: their log
    # is zeroed before the product, so no -inf * 0 reaches the gradient.
    removed = torch.isneginf(x)
    p = _safe_softmax(x, dim)
    logp = zero_empty_rows(lambda s: torch.log_softmax(s, dim), x, dim)
    entropy = -(p * logp.masked_fill(removed, 0.0)).sum(dim, keepdim=True)
    beta = torch.zeros_like(entropy)
    for coefficient in _ENTROPY_POLYNOMIAL:  # Horner
        beta = beta * entropy + coefficient
    beta = torch.where(entropy > _ENTROPY_THRESHOLD, beta.clamp_min(1.0), 1.0)
    return _safe_softmax(_scale_scores(x, beta), dim)
