r"""Stick-breaking attention: weights that favour the nearest matching key.

Tan et al. (2025) replace the softmax of a causal transformer by a
stick-breaking process. Each key :math:`j` before the query gets a break
point :math:`\beta_j = \sigma(x_j)`; walking back from the most recent key,
each key takes the fraction :math:`\beta_j` of the stick that the keys after
it left over:

.. math::

    A_j = \beta_j \prod_{k > j} (1 - \beta_k).

A key with a high score takes (almost) the whole stick and hides every older
key; two equally good keys do not split the weight, the more recent one gets
it. The order of the keys is part of the map, so it needs no positional
embedding for recency. The weights sum to
:math:`1 - \prod_k (1 - \beta_k) \le 1`: what is left of the stick is not
spent, so a row of low scores attends to (almost) nothing.

Whether a query may break the stick at its own key is a choice of the
attention, not of the formula. The authors' code excludes it
(``attend_current=False`` in their Triton kernels: the key at the query's own
position is masked, so the first query attends to nothing); the library's
default keeps it, as a causal mask with its diagonal does. Both are offered by
the ``attend_current`` keyword of :func:`stick_breaking`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ._policy import normalizer

__all__ = ["stick_breaking"]


def _stick_breaking(x: Tensor, dim: int) -> Tensor:
    # In log space: log A_j = log sigma(x_j) + sum_{k > j} log sigma(-x_k). A
    # removed key (-inf) has log sigma(-x) = 0: it leaves the stick untouched.
    keep = F.logsigmoid(-x)
    # The sum over k > j: a reversed cumulative sum, shifted by one so that no
    # -inf (a key with score +inf) is ever subtracted from another.
    after = keep.flip(dim).cumsum(dim).flip(dim).narrow(dim, 1, x.shape[dim] - 1)
    after = torch.cat([after, torch.zeros_like(keep.narrow(dim, 0, 1))], dim)
    return torch.exp(F.logsigmoid(x) + after)


def _without_current(x: Tensor, dim: int) -> Tensor:
    # The query's own key is the last key of the row that is not removed (-inf):
    # under a causal mask with its diagonal, the diagonal entry. Remove it.
    n = x.shape[dim]
    shape = [1] * x.dim()
    shape[dim] = n
    position = torch.arange(n, device=x.device).view(shape)
    visible = ~torch.isneginf(x)
    last = torch.where(visible, position, -1).amax(dim, keepdim=True)
    return x.masked_fill(position == last, float("-inf"))


def _stick_options(x: Tensor, dim: int, *, attend_current: bool) -> dict[str, bool]:
    if not isinstance(attend_current, bool):
        raise TypeError(
            "attend_current must be a bool (True: a query may attend to its own "
            f"key; False: Tan et al.'s convention), got {type(attend_current).__name__}"
        )
    return {"attend_current": attend_current}


@normalizer(sparse=False, sums_to_one=False, options=_stick_options)
def stick_breaking(x: Tensor, dim: int = -1, *, attend_current: bool = True) -> Tensor:
    r"""Stick-breaking weights:
    :math:`A_j = \sigma(x_j) \prod_{k > j} \big(1 - \sigma(x_k)\big)`.

    The attention of Tan et al. (2025). The stick is broken from the **last**
    entry along ``dim`` backward: in a causal attention row the last visible
    key is the most recent one (with the library's causal mask, the query's
    own key), so recent keys are served first. Computed in log space, stable
    for any input. The weights sum to :math:`1 - \prod_k (1 - \sigma(x_k))`,
    at most 1; the rest of the stick goes to no key.

    ``-inf`` entries are removed keys: weight 0, and they take nothing from
    the stick (:math:`\sigma(-\infty) = 0`). A row of only ``-inf`` gives
    zeros, and so does a row of very negative scores.

    The row is read as the keys a query may attend to, in order, the most
    recent last. For a query :math:`i` of causal attention with scores
    :math:`s_{i,j}`, ``attend_current`` says whether the query's own key
    :math:`j = i` is one of them:

    .. math::

        A_{i,j} = \sigma(s_{i,j}) \prod_{j < k \le m} \big(1 - \sigma(s_{i,k})\big),
        \qquad j \le m,

    with :math:`m = i` for ``attend_current=True`` and :math:`m = i - 1` for
    ``False`` (then :math:`A_{i,i} = 0`). With ``False``, the
    last key along ``dim`` that is not ``-inf`` is taken to be the query's
    own and is removed (weight 0, nothing taken from the stick): on a row
    masked by :func:`~softmaxbook.causal_mask`, the diagonal. A row with one
    visible key then gives zeros (the first query attends to nothing). This
    is the convention of Tan et al.'s code (``attend_current=False``, their
    default); ``True`` (the default here) lets the query take from the stick
    first, at its own key.

    Shapes: ``x`` is ``(..., N)``; the result has the same shape and dtype.

    Equivalent, along the last dimension, to ``b * torch.cat([left[..., 1:],
    ones], -1)`` with ``b = torch.sigmoid(x)`` and
    ``left = (1 - b).flip(-1).cumprod(-1).flip(-1)``:

    >>> import torch
    >>> import softmaxbook as sb
    >>> x = torch.randn(3, 6)
    >>> b = torch.sigmoid(x)
    >>> left = (1 - b).flip(-1).cumprod(-1).flip(-1)
    >>> expected = b * torch.cat([left[..., 1:], torch.ones(3, 1)], -1)
    >>> torch.allclose(sb.stick_breaking(x), expected)
    True

    Parameters
    ----------
    x : Tensor
        Scores, any floating dtype and device.
    dim : int
        The dimension of the keys, in order; negative values count from the
        end.
    attend_current : bool
        Keyword only. ``True`` (default): every key of the row may take from
        the stick. ``False``: the last key that is not ``-inf`` (the query's
        own under a causal mask) is left out, as in Tan et al.'s code.

    Returns
    -------
    Tensor
        Non-negative weights whose sum along ``dim`` is at most 1.

    Raises
    ------
    TypeError
        If ``x`` is not a floating-point tensor, ``dim`` is not an int, or
        ``attend_current`` is not a bool.
    IndexError
        If ``dim`` is out of range.
    """
    if not attend_current:
        x = _without_current(x, dim)
    return _stick_breaking(x, dim)
