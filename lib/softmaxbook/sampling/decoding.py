r"""Decoding from logits: temperature, top-k, top-p, min-p filters, and sampling.

:func:`top_k_filter`, :func:`top_p_filter` and :func:`min_p_filter` remove
unlikely tokens by setting their logits to ``-inf``; :func:`sample` draws token
indices after a temperature and those filters, reproducibly with a
``torch.Generator``.
Greedy decoding is ``logits.argmax(-1)`` and needs no softmax at all: in
exact arithmetic softmax keeps the order of a row's entries, so it cannot
change which is largest; in floating point it can round two nearly equal
logits to equal probabilities (float32 logits 0.3 and the next float above
it get 0.5 each, and ``argmax`` then returns the first), so the argmax of the
logits is also the more exact. ``-inf`` in a logit means "removed": such a
token gets probability 0 and is never sampled.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._numerics import acc_dtype
from .._validate import (
    check_float,
    check_nonnegative,
    check_positive,
    check_positive_int,
)

__all__ = ["top_k_filter", "top_p_filter", "min_p_filter", "sample"]


def _check_logits(logits: Tensor, name: str = "logits") -> Tensor:
    check_float(logits, name)
    if logits.dim() == 0:
        raise ValueError(
            f"{name} must have at least one dimension (..., V), got a 0-dim tensor"
        )
    return logits


def _keep_at_least(logits: Tensor, threshold: Tensor) -> Tensor:
    # A token survives when its logit reaches the row's threshold; NaN is
    # never silently turned into -inf, so a broken row stays visibly broken.
    keep = (logits >= threshold) | torch.isnan(logits)
    return logits.masked_fill(~keep, float("-inf"))


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    r"""Keep the ``k`` largest logits of each row: :math:`z_i \mapsto -\infty` unless
    :math:`z_i \ge z_{(k)}`.

    :math:`z_{(k)}` is the ``k``-th largest logit of the row. Every other entry
    becomes ``-inf``, so a following softmax gives it probability exactly 0
    and renormalizes over the ``k`` survivors.

    Ties are resolved by value, never by position: a token whose logit
    equals the ``k``-th largest is kept too, so with ties at the boundary
    more than ``k`` tokens survive. The result therefore does not depend on
    the order of the vocabulary (it commutes with any permutation of the
    last dimension). With distinct logits exactly ``min(k, V)`` tokens are
    kept; ``k >= V`` keeps everything. Entries that are already ``-inf``
    stay ``-inf``; ``nan`` entries stay ``nan``.

    Shapes: ``logits`` is ``(..., V)``; the result has the same shape, dtype
    and device.

    Equivalent to
    ``logits.masked_fill(logits < logits.topk(k).values[..., -1:], -inf)``:

    >>> import torch
    >>> import softmaxbook as sb
    >>> logits = torch.tensor([1.0, 3.0, 2.0, 0.5])
    >>> sb.top_k_filter(logits, 2)
    tensor([-inf, 3., 2., -inf])
    >>> kth = logits.topk(2).values[..., -1:]
    >>> expected = logits.masked_fill(logits < kth, float("-inf"))
    >>> torch.equal(sb.top_k_filter(logits, 2), expected)
    True

    Parameters
    ----------
    logits : Tensor
        Floating-point scores of shape ``(..., V)``, filtered along the last
        dimension.
    k : int
        How many tokens to keep, ``k >= 1``.

    Returns
    -------
    Tensor
        A new tensor; the input is not modified.

    Raises
    ------
    TypeError
        If ``logits`` is not a floating-point tensor or ``k`` is not an int.
    ValueError
        If ``k < 1`` or ``logits`` is 0-dimensional.
    """
    _check_logits(logits)
    check_positive_int(k, "k")
    V = logits.shape[-1]
    if k >= V:
        return logits.clone()
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (..., 1)
    return _keep_at_least(logits, kth)


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    r"""Nucleus filter: keep the fewest most probable tokens whose probability mass
    reaches ``p``.

    With the row's probabilities :math:`\pi = \mathrm{softmax}(z)` sorted in
    decreasing order, :math:`\pi_{(1)} \ge \pi_{(2)} \ge \dots`, the kept
    set is the top :math:`m` tokens with
    :math:`m = \min\{\, j : \sum_{i \le j} \pi_{(i)} \ge p \,\}`
    (Holtzman et al., 2020). Every other logit becomes ``-inf``. The most
    probable token is always kept, so at least one token survives for any
    ``p`` in :math:`(0, 1]`; ``p = 1`` keeps every token.

    Ties are resolved by value, as in :func:`top_k_filter`: a token whose
    probability equals that of the last token of the nucleus is kept too,
    so with ties at the boundary the kept set can be larger than the
    minimal one; with distinct logits it is exactly the minimal set.
    The cumulative mass is summed in float64 (float32 on Apple MPS), so the
    cut does not move with rounding for a large vocabulary.

    The filter depends on the temperature applied before it: dividing the
    logits by :math:`T` changes :math:`\pi`, and hence the nucleus.
    Entries already ``-inf`` stay ``-inf``; ``nan`` entries stay ``nan``.

    Shapes: ``logits`` is ``(..., V)``; the result has the same shape, dtype
    and device.

    >>> import torch
    >>> import softmaxbook as sb
    >>> probs = torch.tensor([0.5, 0.1, 0.3, 0.1])
    >>> sb.top_p_filter(probs.log(), 0.75).softmax(-1)  # 0.5 + 0.3 reaches 0.75
    tensor([0.6250, 0.0000, 0.3750, 0.0000])

    Parameters
    ----------
    logits : Tensor
        Floating-point scores of shape ``(..., V)``, filtered along the last
        dimension.
    p : float
        The probability mass to keep, in :math:`(0, 1]`.

    Returns
    -------
    Tensor
        A new tensor; the input is not modified.

    Raises
    ------
    TypeError
        If ``logits`` is not a floating-point tensor or ``p`` is not a real number.
    ValueError
        If ``p`` is not in :math:`(0, 1]` or ``logits`` is 0-dimensional.
    """
    _check_logits(logits)
    p = check_positive(p, "p")
    if p > 1.0:
        raise ValueError(f"p must be in (0, 1], got {p}")
    if p == 1.0 or logits.shape[-1] == 0:
        return logits.clone()
    acc = torch.float32 if logits.device.type == "mps" else torch.float64
    sorted_logits = torch.sort(logits, dim=-1, descending=True).values
    probs = torch.softmax(sorted_logits.to(acc), dim=-1)  # (..., V), decreasing
    # The mass of the strictly more probable tokens:
    mass_before = torch.cumsum(probs, dim=-1) - probs
    # A token is in the nucleus while the mass above it is still short of p;
    # position 0 has mass_before = 0 < p, so the argmax is always in.
    in_nucleus = mass_before < p
    n_kept = in_nucleus.sum(dim=-1, keepdim=True).clamp_min(1)  # (..., 1)
    # The smallest kept logit, (..., 1):
    threshold = torch.gather(sorted_logits, -1, n_kept - 1)
    return _keep_at_least(logits, threshold)


def min_p_filter(logits: Tensor, p: float) -> Tensor:
    r"""Min-p filter: keep the tokens at least ``p`` times as probable as the most
    probable one, :math:`\pi_i \ge p \, \pi_{\max}`.

    The threshold scales with the model's confidence (Nguyen et al., 2025):
    when one token dominates, few others reach :math:`p\,\pi_{\max}`; when
    the distribution is flat, many do. Since
    :math:`\pi_i / \pi_{\max} = e^{z_i - z_{\max}}`, the rule needs no
    softmax: a token survives when :math:`z_i \ge z_{\max} + \log p`. The
    most probable token is always kept, ``p = 0`` keeps every token and
    ``p = 1`` only the most probable ones (ties by value, as in
    :func:`top_k_filter`). Like top-p, the kept set depends on a temperature
    applied before the filter. The threshold is computed in float64 (float32
    on Apple MPS). Entries already ``-inf`` stay ``-inf``; ``nan`` entries
    stay ``nan``.

    Shapes: ``logits`` is ``(..., V)``; the result has the same shape, dtype
    and device.

    Equivalent to
    ``logits.masked_fill(softmax(logits) < p * softmax(logits).amax(-1,
    keepdim=True), -inf)``, up to rounding at the boundary:

    >>> import torch
    >>> import softmaxbook as sb
    >>> logits = torch.randn(4, 50)
    >>> probs = logits.softmax(-1)
    >>> low = probs < 0.1 * probs.amax(-1, keepdim=True)
    >>> expected = logits.masked_fill(low, float("-inf"))
    >>> torch.equal(sb.min_p_filter(logits, 0.1), expected)
    True

    Parameters
    ----------
    logits : Tensor
        Floating-point scores of shape ``(..., V)``, filtered along the last
        dimension.
    p : float
        The base probability :math:`p \in [0, 1]` (0.05 to 0.1 are common).

    Returns
    -------
    Tensor
        A new tensor; the input is not modified.

    Raises
    ------
    TypeError
        If ``logits`` is not a floating-point tensor or ``p`` is not a real number.
    ValueError
        If ``p`` is not in :math:`[0, 1]` or ``logits`` is 0-dimensional.
    """
    _check_logits(logits)
    p = check_nonnegative(p, "p")
    if p > 1.0:
        raise ValueError(f"p must be in [0, 1], got {p}")
    if p == 0.0 or logits.shape[-1] == 0:
        return logits.clone()
    acc = torch.float32 if logits.device.type == "mps" else torch.float64
    z = logits.to(acc)
    threshold = z.amax(dim=-1, keepdim=True) + math.log(p)  # (..., 1)
    keep = (z >= threshold) | torch.isnan(logits)
    return logits.masked_fill(~keep, float("-inf"))


def sample(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    r"""Draw one token per row from :math:`\mathrm{softmax}(\mathrm{filter}(z / T))`.

    The steps, in the order most libraries use: upcast the logits to at
    least float32 (so that a small temperature cannot overflow float16),
    divide them by the temperature :math:`T`, apply :func:`top_k_filter` (if
    ``top_k`` is given), then :func:`top_p_filter` (if ``top_p`` is given),
    then :func:`min_p_filter` (if ``min_p`` is given) on the tempered logits,
    take the softmax, and draw with :func:`torch.multinomial`. This is the
    order of Hugging Face ``transformers``' samplers.

    The same ``generator`` state gives the same tokens: seed a
    ``torch.Generator`` (on the logits' device) with ``manual_seed`` to make
    sampling reproducible without touching the global random state.

    Greedy decoding is not a temperature of 0 here (that is an error): it is
    ``logits.argmax(-1)``, which needs no softmax because softmax keeps the
    order of a row (in exact arithmetic; rounding can turn a near-tie into a
    tie, never reverse an order). :math:`T \to 0^+` approaches it.

    Shapes: ``logits`` is ``(..., V)``; the result is ``(...)`` with dtype
    ``torch.long`` (a 0-dim tensor for ``(V,)`` input).

    >>> import torch
    >>> import softmaxbook as sb
    >>> logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).expand(1000, 4)
    >>> tokens = sb.sample(logits, top_k=2, generator=torch.Generator().manual_seed(0))
    >>> tokens.shape, sorted(tokens.unique().tolist())  # only the two best tokens
    (torch.Size([1000]), [0, 1])
    >>> again = sb.sample(logits, top_k=2, generator=torch.Generator().manual_seed(0))
    >>> torch.equal(tokens, again)  # the same generator state, the same tokens
    True

    Parameters
    ----------
    logits : Tensor
        Floating-point scores of shape ``(..., V)``. ``-inf`` entries are
        never drawn.
    temperature : float
        :math:`T > 0`. Below 1 sharpens, above 1 flattens the distribution.
    top_k : int, optional
        If given, sample only among the ``top_k`` most likely tokens.
    top_p : float, optional
        If given, sample only from the nucleus of mass ``top_p`` in :math:`(0, 1]`.
    min_p : float, optional
        If given, sample only tokens at least ``min_p`` times as probable as
        the most probable one, ``min_p`` in :math:`[0, 1]`.
    generator : torch.Generator, optional
        The source of randomness; the global generator when ``None``.

    Returns
    -------
    Tensor
        Token indices in ``[0, V)``, dtype ``torch.long``.

    Raises
    ------
    TypeError
        If ``logits`` is not a floating-point tensor, or an option has the wrong type.
    ValueError
        If ``temperature <= 0``, ``top_k < 1``, ``top_p`` is outside :math:`(0, 1]`,
        ``min_p`` outside :math:`[0, 1]`, ``V = 0``, or a row has no finite
        logit or contains ``nan``.
    """
    _check_logits(logits)
    if (
        isinstance(temperature, (int, float))
        and not isinstance(temperature, bool)
        and temperature <= 0
    ):
        raise ValueError(
            f"temperature must be > 0, got {temperature} (greedy decoding is "
            "logits.argmax(-1), which needs no softmax)"
        )
    t = check_positive(temperature, "temperature")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator, got {type(generator).__name__}"
        )
    V = logits.shape[-1]
    if V == 0:
        raise ValueError(
            "logits has an empty last dimension (V = 0): there is nothing to sample"
        )
    batch_shape = logits.shape[:-1]
    # Upcast before dividing: a float16 logit of 10 at T = 1e-4 would overflow.
    z = logits.to(acc_dtype(logits.dtype))
    z = z if t == 1.0 else z / t
    if top_k is not None:
        z = top_k_filter(z, top_k)
    if top_p is not None:
        z = top_p_filter(z, top_p)
    if min_p is not None:
        z = min_p_filter(z, min_p)
    rows = z.reshape(-1, V)  # (N, V)
    if rows.shape[0] == 0:
        return torch.empty(batch_shape, dtype=torch.long, device=logits.device)
    if torch.isnan(rows).any():
        raise ValueError("logits contain nan: cannot sample")
    if torch.isneginf(rows).all(dim=-1).any():
        raise ValueError(
            "a row of logits has no finite entry (all -inf): nothing to sample"
        )
    probs = torch.softmax(rows, dim=-1)  # rows are float32 or float64
    tokens = torch.multinomial(probs, 1, generator=generator)  # (N, 1)
    return tokens.reshape(batch_shape)
