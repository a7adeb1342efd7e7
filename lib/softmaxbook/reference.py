r"""NumPy float64 reference implementations, written to read like the math.

These are the specification the library's torch code is checked against: the
tests compare :func:`~softmaxbook.softmax`, :func:`~softmaxbook.log_softmax`,
:func:`~softmaxbook.logsumexp`, :func:`~softmaxbook.online_softmax`,
:func:`~softmaxbook.sparsemax` and softmax attention with them. They favour
clarity over speed, take and return NumPy arrays, and compute in float64 whatever
the input dtype.

Shapes: ``x`` is ``(..., N)`` and the functions reduce along ``axis``
(default the last).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

__all__ = [
    "naive_softmax",
    "softmax",
    "log_softmax",
    "logsumexp",
    "online_softmax",
    "sparsemax",
]


def _as_float64(x: ArrayLike) -> np.ndarray:
    x = np.asarray(x)
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise TypeError(f"x must be a real numeric array, got dtype {x.dtype}")
    return x.astype(np.float64)


def naive_softmax(x: ArrayLike, axis: int = -1) -> np.ndarray:
    r"""Softmax straight from the definition: :math:`e^{x_i} / \sum_j e^{x_j}`.

    Deliberately unstable: ``exp`` overflows to ``inf`` for inputs above about
    709.78 (in float64), the sum becomes ``inf``, and the weights become
    ``inf / inf = nan`` where ``exp`` overflowed and 0 elsewhere (and a row whose
    every ``exp`` underflows gives ``0 / 0 = nan``). Chapter 2 uses it to show why
    :func:`softmax` subtracts the maximum first.

    >>> from softmaxbook import reference
    >>> reference.naive_softmax([1.0, 2.0, 3.0]).round(4).tolist()
    [0.09, 0.2447, 0.6652]
    >>> reference.naive_softmax([1000.0, 0.0]).tolist()  # e^1000 overflows
    [nan, 0.0]
    """
    x = _as_float64(x)
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(x)
        return e / e.sum(axis=axis, keepdims=True)


def softmax(x: ArrayLike, axis: int = -1) -> np.ndarray:
    r"""Stable softmax: :math:`e^{x_i - m} / \sum_j e^{x_j - m}` with
    :math:`m = \max_j x_j`.

    Subtracting the maximum changes nothing mathematically (softmax is
    invariant to adding a constant) but makes every exponent :math:`\le 0`, so
    ``exp`` cannot overflow and the largest term is exactly 1.

    A row whose entries are all ``-inf`` has no mass to normalize; it gives
    zeros rather than ``nan`` (the convention for fully masked attention rows).

    >>> from softmaxbook import reference
    >>> reference.softmax([1000.0, 0.0]).tolist()
    [1.0, 0.0]
    >>> reference.softmax([[-float("inf"), -float("inf")]]).tolist()
    [[0.0, 0.0]]
    """
    x = _as_float64(x)
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)  # an all -inf row: keep exp(-inf) = 0
    e = np.exp(x - m)
    total = e.sum(axis=axis, keepdims=True)
    # Only an empty row (total == 0) is special; a nan row must stay nan.
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total == 0, 0.0, e / np.where(total == 0, 1.0, total))


def logsumexp(x: ArrayLike, axis: int = -1, keepdims: bool = False) -> np.ndarray:
    r"""Stable :math:`\log \sum_j e^{x_j} = m + \log \sum_j e^{x_j - m}`,
    :math:`m = \max_j x_j`.

    A row of all ``-inf`` gives ``-inf`` (the log of an empty sum).

    >>> import math
    >>> from softmaxbook import reference
    >>> math.isclose(reference.logsumexp([0.0, 0.0]), math.log(2))
    True
    >>> round(float(reference.logsumexp([1000.0, 1000.0])), 6)  # 1000 + log 2
    1000.693147
    """
    x = _as_float64(x)
    m = np.max(x, axis=axis, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        out = m_safe + np.log(np.exp(x - m_safe).sum(axis=axis, keepdims=True))
    out = np.where(np.isposinf(m), np.inf, out)
    return out if keepdims else np.squeeze(out, axis=axis)


def log_softmax(x: ArrayLike, axis: int = -1) -> np.ndarray:
    r"""Stable :math:`\log \mathrm{softmax}(x)_i = x_i - \operatorname{logsumexp}(x)`.

    Never takes the log of a rounded-to-zero probability, so very negative
    log-probabilities stay finite where ``log(softmax(x))`` gives ``-inf``.

    >>> import numpy as np
    >>> from softmaxbook import reference
    >>> reference.log_softmax([0.0, -1000.0]).tolist()
    [0.0, -1000.0]
    >>> with np.errstate(divide="ignore"):
    ...     np.log(reference.softmax([0.0, -1000.0])).tolist()
    [0.0, -inf]
    """
    x = _as_float64(x)
    return x - logsumexp(x, axis=axis, keepdims=True)


def online_softmax(x: ArrayLike, axis: int = -1, block_size: int = 1) -> np.ndarray:
    r"""Streaming softmax of Milakov & Gimelshein (2018): one pass for the normalizer.

    Reads the row in blocks while keeping a running maximum :math:`m` and a
    running sum :math:`d` of :math:`e^{x_j - m}`. When a block raises the
    maximum from :math:`m` to :math:`m'`, the old sum is rescaled:

    .. math:: d' = d \, e^{m - m'} + \sum_{j \in \text{block}} e^{x_j - m'}

    A second pass writes :math:`e^{x_i - m} / d`. With ``block_size=1`` this
    is exactly the paper's element-by-element loop.

    >>> import numpy as np
    >>> from softmaxbook import reference
    >>> x = np.random.default_rng(0).normal(size=(3, 10))
    >>> np.allclose(reference.online_softmax(x, block_size=4), reference.softmax(x))
    True
    """
    x = _as_float64(x)
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    ndim = max(x.ndim, 1)  # a 0-d array is one row of one entry, as for softmax
    if not -ndim <= axis < ndim:
        raise ValueError(
            f"axis={axis} is out of range for x with {x.ndim} dimension(s); "
            f"expected {-ndim} <= axis < {ndim}"
        )
    if x.ndim == 0:
        return online_softmax(x.reshape(1), 0, block_size).reshape(())
    x = np.moveaxis(x, axis, -1)
    n = x.shape[-1]
    m = np.full(x.shape[:-1] + (1,), -np.inf)
    d = np.zeros(x.shape[:-1] + (1,))
    for start in range(0, n, block_size):
        block = x[..., start : start + block_size]
        m_new = np.maximum(m, block.max(axis=-1, keepdims=True))
        m_safe = np.where(np.isneginf(m_new), 0.0, m_new)
        d = d * np.exp(m - m_safe) + np.exp(block - m_safe).sum(axis=-1, keepdims=True)
        m = m_new
    m_safe = np.where(np.isneginf(m), 0.0, m)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(d == 0, 0.0, np.exp(x - m_safe) / np.where(d == 0, 1.0, d))
    return np.moveaxis(out, -1, axis)


def sparsemax(x: ArrayLike, axis: int = -1) -> np.ndarray:
    r"""Sparsemax (Martins & Astudillo, 2016): the Euclidean projection onto the
    simplex.

    .. math:: \mathrm{sparsemax}(x) = \arg\min_{p \in \Delta} \lVert p - x \rVert^2
              = [x - \tau(x)]_+

    The threshold :math:`\tau` comes from sorting: with :math:`z` sorted in
    decreasing order, the support size is the largest :math:`k` with
    :math:`1 + k z_k > \sum_{j \le k} z_j`, and
    :math:`\tau = (\sum_{j \le k} z_j - 1) / k`.

    >>> from softmaxbook import reference
    >>> reference.sparsemax([1.0, 0.8, -1.0]).round(4).tolist()  # tau = 0.4
    [0.6, 0.4, 0.0]
    """
    x = _as_float64(x)
    x = np.moveaxis(x, axis, -1)
    z = -np.sort(-x, axis=-1)
    k = np.arange(1, x.shape[-1] + 1)
    cumsum = np.cumsum(z, axis=-1)
    support = 1 + k * z > cumsum
    k_max = support.sum(axis=-1, keepdims=True)
    tau = (np.take_along_axis(cumsum, k_max - 1, axis=-1) - 1) / k_max
    return np.moveaxis(np.maximum(x - tau, 0.0), -1, axis)
