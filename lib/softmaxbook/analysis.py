r"""Diagnostics of attention distributions: how spread out, how far they look.

These read attention weights (rows that sum to one, or to zero for a fully
masked row) and summarize them, for example per head, to detect collapse:

- :func:`entropy` of one distribution, with :math:`0 \log 0 = 0`;
- :func:`attention_entropy`, the mean entropy of the rows of attention maps;
- :func:`attention_distance`, how far back (or ahead) the queries look;
- :func:`attention_sparsity`, the fraction of exact zeros among the allowed keys;
- :func:`ignore_gap`, the score gap a normalizer needs to ignore a row of keys.

The map functions take weights ``(..., L, S)`` (for a model, e.g.
``(B, layers, H, L, S)``) and return one number per map, ``(...)``. A row of
zeros (a query with nothing to attend to) is left out of every average; a map
whose rows are all zeros gives 0, never ``nan``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ._validate import (
    check_dim,
    check_float,
    check_mask,
    check_nonnegative,
    check_positive_int,
    check_real,
)

__all__ = [
    "entropy",
    "attention_entropy",
    "attention_distance",
    "attention_sparsity",
    "ignore_gap",
]


def entropy(p: Tensor, dim: int = -1, *, keepdim: bool = False) -> Tensor:
    r"""Shannon entropy in nats: :math:`H(p) = -\sum_i p_i \log p_i`, with
    :math:`0 \log 0 = 0`.

    :math:`H = 0` for a one-hot row (all attention on one key, *collapse*) and
    :math:`H = \log N` for the uniform row over :math:`N` keys. The convention
    :math:`0 \log 0 = 0` (the limit) makes exact zeros, from masks or
    sparsemax, contribute nothing, in the value and in the gradient, with no
    ``1e-12`` fudge that would bias the result.

    Shapes: ``p`` is ``(..., N)``; the result is ``(...)``, or ``(..., 1)``
    with ``keepdim=True``.

    Equivalent to ``-(p * p.log()).sum(dim)`` on rows without zeros:

    >>> import math
    >>> import torch
    >>> import softmaxbook as sb
    >>> p = torch.tensor([[0.25, 0.25, 0.25, 0.25], [0.5, 0.5, 0.0, 0.0]])
    >>> sb.entropy(p)  # log 4 for the uniform row; the zeros add nothing: log 2
    tensor([1.3863, 0.6931])
    >>> math.isclose(sb.entropy(p)[1].item(), math.log(2), rel_tol=1e-6)
    True
    """
    check_float(p, "p")
    dim = check_dim(p, dim)
    positive = p > 0
    # where() on both sides keeps the gradient of the zero entries finite (0, not nan).
    plogp = torch.where(
        positive,
        p * torch.log(torch.where(positive, p, torch.ones_like(p))),
        torch.zeros_like(p),
    )
    return -plogp.sum(dim=dim, keepdim=keepdim)


def _check_weights(weights: Tensor, name: str = "weights") -> Tensor:
    check_float(weights, name)
    if weights.dim() < 2:
        raise ValueError(
            f"{name} must have at least 2 dimensions (..., L, S), "
            f"got shape {tuple(weights.shape)}"
        )
    if bool((weights < 0).any()):
        raise ValueError(
            f"{name} must be non-negative (attention weights), "
            f"got a minimum of {float(weights.min())}"
        )
    return weights


def _row_distributions(weights: Tensor) -> tuple[Tensor, Tensor]:
    # Rows normalized to sum to one (a no-op for softmax and sparsemax rows;
    # sigmoid rows do not sum to one), and which rows have any mass at all.
    mass = weights.sum(dim=-1, keepdim=True)  # (..., L, 1)
    live = mass > 0
    p = weights / torch.where(live, mass, torch.ones_like(mass))
    return p, live.squeeze(-1)  # (..., L, S), (..., L)


def _mean_over_rows(values: Tensor, live: Tensor) -> Tensor:
    # Mean over the live rows only; 0 (not 0/0 = nan) where no row is live.
    total = torch.where(live, values, torch.zeros_like(values)).sum(dim=-1)
    return total / live.sum(dim=-1).clamp(min=1).to(values.dtype)


def attention_entropy(weights: Tensor) -> Tensor:
    r"""Mean row entropy of attention maps:
    :math:`\bar H = \frac{1}{|R|}\sum_{i \in R} H(a_{i\cdot})`.

    :math:`H(a_{i\cdot}) = -\sum_j a_{ij} \log a_{ij}` (nats, :math:`0 \log 0 = 0`)
    is the entropy of query :math:`i`'s attention; :math:`R` is the set of
    rows with any weight, so a fully masked query (a row of zeros) is left
    out instead of counting as a perfectly focused one. :math:`\bar H = 0`
    for a map of one-hot rows (collapse); :math:`\log S` is the most a row
    over :math:`S` keys can reach. Rows that do not sum to one (sigmoid
    attention) are divided by their sum first, so the entropy measures how
    the attention is *spread*, not how much there is.

    Shapes: ``weights`` is ``(..., L, S)``; the result is ``(...)``, one
    number per map (e.g. ``(B, layers, H)`` for the maps of a model).

    Equivalent to ``entropy(weights).mean(-1)`` when every row sums to one:

    >>> import torch
    >>> import softmaxbook as sb
    >>> weights = torch.softmax(torch.randn(2, 3, 5, 5), dim=-1)  # (B, H, L, S)
    >>> H = sb.attention_entropy(weights)  # (B, H)
    >>> torch.allclose(H, sb.entropy(weights).mean(-1))
    True
    >>> rows = sb.masked_softmax(torch.zeros(3, 4), sb.causal_mask(3, 4))
    >>> rows[2] = 0.0  # a query with nothing to attend: left out, not counted as 0
    >>> sb.attention_entropy(rows), sb.entropy(rows[:2]).mean()
    (tensor(0.3466), tensor(0.3466))

    Parameters
    ----------
    weights : Tensor
        Non-negative attention weights, floating point.

    Returns
    -------
    Tensor
        The mean entropy of each map, in nats; 0 for a map with no live row.

    Raises
    ------
    TypeError
        If ``weights`` is not a floating-point tensor.
    ValueError
        If ``weights`` has fewer than 2 dimensions or a negative entry.
    """
    p, live = _row_distributions(_check_weights(weights))
    return _mean_over_rows(entropy(p, dim=-1), live)


def attention_distance(weights: Tensor, *, offset: int = 0) -> Tensor:
    r"""Mean attention distance:
    :math:`\bar d = \frac{1}{|R|}\sum_{i \in R} \sum_j a_{ij}\,
    |i + \text{offset} - j|`.

    How far, in positions, the queries of a map look on average: 0 for a
    head that attends to its own position, 1 for a "previous token" head,
    large for a head that reaches back to the start. Query :math:`i` sits
    at position :math:`i + \text{offset}` and key :math:`j` at position
    :math:`j`: ``offset=0`` aligns them at the top-left corner, like
    :func:`~softmaxbook.causal_mask`; ``offset = S - L`` puts the last query
    at the last key, as when new queries attend to a cache of keys. Rows
    are divided by their sum (a no-op for softmax) and rows of zeros are
    left out, as in :func:`attention_entropy`. Unlike the square
    ``torch.abs(positions[:, None] - positions[None, :])`` often seen, it
    works for any ``L`` and ``S``.

    Shapes: ``weights`` is ``(..., L, S)``; the result is ``(...)``.

    >>> import torch
    >>> import softmaxbook as sb
    >>> previous_token = torch.eye(5).roll(-1, dims=-1).tril()  # key i - 1
    >>> previous_token[0, 0] = 1.0  # query 0 has only itself
    >>> sb.attention_distance(previous_token)  # 4 rows at distance 1, one at 0
    tensor(0.8000)

    Parameters
    ----------
    weights : Tensor
        Non-negative attention weights, floating point.
    offset : int
        The position of query 0 among the keys.

    Returns
    -------
    Tensor
        The mean distance of each map, in positions; 0 for a map with no
        live row.

    Raises
    ------
    TypeError
        If ``weights`` is not a floating-point tensor or ``offset`` not an int.
    ValueError
        If ``weights`` has fewer than 2 dimensions or a negative entry.
    """
    _check_weights(weights)
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise TypeError(f"offset must be an int, got {type(offset).__name__}")
    L, S = weights.shape[-2:]
    queries = torch.arange(L, device=weights.device, dtype=weights.dtype) + offset
    keys = torch.arange(S, device=weights.device, dtype=weights.dtype)
    distance = (queries[:, None] - keys[None, :]).abs()  # (L, S)
    p, live = _row_distributions(weights)
    return _mean_over_rows((p * distance).sum(dim=-1), live)


def attention_sparsity(
    weights: Tensor, mask: Tensor | None = None, *, threshold: float = 0.0
) -> Tensor:
    r"""Fraction of zero weights among the allowed entries:
    :math:`\frac{|\{(i,j) \in A : a_{ij} \le \tau\}|}{|A|}`.

    :math:`A` holds the entries that ``mask`` allows (True = may attend), in
    rows with any weight. Masked entries are zero under every normalizer,
    so counting them would only measure the mask: pass the mask the model
    used (e.g. :func:`~softmaxbook.causal_mask`) to measure what the
    *normalizer* set to zero. Softmax gives exact zeros only by underflow;
    sparsemax and entmax give them by design. ``threshold`` :math:`\tau > 0`
    counts near-zeros too.

    Shapes: ``weights`` is ``(..., L, S)``, ``mask`` broadcasts to it; the
    result is ``(...)``.

    >>> import torch
    >>> import softmaxbook as sb
    >>> scores = torch.tensor([[2.0, 1.0, -1.0], [0.5, 0.4, 0.0], [1.0, 0.0, 3.0]])
    >>> mask = sb.causal_mask(3)
    >>> weights = sb.sparsemax(scores.masked_fill(~mask, float("-inf")))
    >>> sb.attention_sparsity(weights, mask)  # 6 allowed entries, 2 set to zero
    tensor(0.3333)

    Parameters
    ----------
    weights : Tensor
        Non-negative attention weights, floating point.
    mask : bool Tensor, optional
        The entries that could receive weight; default all.
    threshold : float
        Weights ``<= threshold`` count as zero.

    Returns
    -------
    Tensor
        A fraction in :math:`[0, 1]` per map; 0 for a map with no allowed
        entry in a live row.

    Raises
    ------
    TypeError
        If ``weights`` is not a floating-point tensor, ``mask`` not boolean,
        or ``threshold`` not a real number.
    ValueError
        If ``weights`` has fewer than 2 dimensions or a negative entry, ``mask``
        does not broadcast, or ``threshold`` is negative or not finite.
    """
    _check_weights(weights)
    threshold = check_nonnegative(threshold, "threshold")
    live = (weights.sum(dim=-1, keepdim=True) > 0).expand(weights.shape)  # (..., L, S)
    allowed = live if mask is None else check_mask(mask, weights) & live
    zeros = (weights <= threshold) & allowed
    n_allowed = allowed.sum(dim=(-2, -1)).clamp(min=1)
    return zeros.sum(dim=(-2, -1)).to(weights.dtype) / n_allowed.to(weights.dtype)


# --------------------------------------------------------------------------------------
# the score gap that ignoring a row of keys takes
# --------------------------------------------------------------------------------------

_GAP_LIMIT = 1e4  # beyond this gap a normalizer is taken to never get there
_GAP_POINTS = 16  # gaps tried at once: each round narrows the bracket 16-fold
_GAP_ROUNDS = 14  # the bracket shrinks to 1e4 / 16**14 = 1.4e-13 (about 80 ulps at 11)


def ignore_gap(
    normalizer: Callable[..., Tensor],
    n: int,
    eps: float = 1e-3,
    *,
    sink_key: bool = True,
) -> float:
    r"""The score gap :math:`\Delta` at which ``normalizer`` gives ``n``
    irrelevant keys a total weight of at most ``eps``.

    The row is ``[0, -Δ, ..., -Δ]``: one *sink key* with score 0 (dropped
    with ``sink_key=False``) and ``n`` irrelevant keys :math:`\Delta` below
    it. The result is the smallest :math:`\Delta \ge 0` for which the
    irrelevant keys get at most ``eps`` in total, found in float64 by
    narrowing a grid of 17 gaps 14 times (one batch of rows per call);
    ``inf`` when no gap up to :math:`10^4` gets there (softmax without a sink
    key, whose weights always sum to 1). For softmax with a
    sink key it is :math:`\log(n (1 - \epsilon)/\epsilon)`: each halving of
    a small :math:`\epsilon` costs about :math:`\log 2` more score (exactly
    :math:`\log 2 + \log\frac{1 - \epsilon/2}{1 - \epsilon}`), forever.
    The search brackets the gap to :math:`10^4 / 16^{14} \approx 1.4 \times
    10^{-13}`; with the rounding of the normalizer's float64 weights it is
    good to about :math:`10^{-12}`. For
    :func:`~softmaxbook.softpick` and :func:`~softmaxbook.relu_attention` it
    is 0: a score :math:`\le 0` is already ignored.

    >>> import math
    >>> import torch
    >>> import softmaxbook as sb
    >>> gap = sb.ignore_gap(torch.softmax, n=100, eps=1e-3)
    >>> round(gap, 6), round(math.log(100 * (1 - 1e-3) / 1e-3), 6)
    (11.511925, 11.511925)
    >>> sb.ignore_gap(torch.softmax, 100, sink_key=False)  # no sink: never
    inf
    >>> sb.ignore_gap(sb.softpick, 100)  # a score <= 0 is already ignored
    0.0

    Parameters
    ----------
    normalizer : callable
        ``f(scores, dim=-1)``, e.g. :func:`~softmaxbook.softmax_one` or
        ``functools.partial(sink_softmax, sinks=2.0)``; its total weight on the
        irrelevant keys must not grow with the gap.
    n : int
        The number of irrelevant keys, ``>= 1``.
    eps : float
        The total weight to reach, in ``(0, 1)``.
    sink_key : bool
        Put a key with score 0 in front of the irrelevant ones.

    Returns
    -------
    float
        The gap :math:`\Delta`, or ``math.inf``.

    Raises
    ------
    TypeError
        If ``normalizer`` is not callable, ``n`` not an int or ``eps`` not a
        real number.
    ValueError
        If ``n < 1`` or ``eps`` is not in ``(0, 1)``.
    """
    if not callable(normalizer):
        raise TypeError(
            f"normalizer must be a callable f(scores, dim=-1), got "
            f"{type(normalizer).__name__}"
        )
    n = check_positive_int(n, "n")
    eps = check_real(eps, "eps")
    if not 0 < eps < 1:
        raise ValueError(f"eps must be in (0, 1), got {eps}")
    sink = [0.0] if sink_key else []

    def weights(gaps: Tensor) -> Tensor:
        """Total weight on the irrelevant keys, one row (and one gap) per entry."""
        rows = torch.cat(
            [
                torch.tensor(sink, dtype=torch.float64).expand(len(gaps), len(sink)),
                (-gaps)[:, None].expand(len(gaps), n),
            ],
            dim=-1,
        )
        return normalizer(rows, dim=-1)[:, len(sink) :].sum(-1)

    ends = weights(torch.tensor([0.0, _GAP_LIMIT], dtype=torch.float64))
    if ends[0] <= eps:
        return 0.0
    if ends[1] > eps:
        return math.inf
    # Many bisections at once: evaluate a grid of gaps in one call, keep the
    # interval where the weight first drops to eps (it does not grow with the gap).
    low, high = 0.0, _GAP_LIMIT
    for _ in range(_GAP_ROUNDS):
        grid = torch.linspace(low, high, _GAP_POINTS + 1, dtype=torch.float64)
        first = int((weights(grid) <= eps).to(torch.int8).argmax())
        low, high = float(grid[first - 1]), float(grid[first])
    return high
