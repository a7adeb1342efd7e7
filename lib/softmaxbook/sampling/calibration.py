r"""Calibration: how much to trust the probabilities a softmax gives.

:func:`expected_calibration_error` and :func:`reliability_table` measure
whether confidences match accuracies (Naeini et al., 2015; Guo et al., 2017);
:func:`fit_temperature` fits the single temperature of *temperature scaling*
on held-out data.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from .._validate import check_float, check_positive, check_positive_int, check_tensor

__all__ = [
    "ReliabilityTable",
    "reliability_table",
    "expected_calibration_error",
    "fit_temperature",
]


class ReliabilityTable(NamedTuple):
    r"""Per-bin statistics of a reliability diagram, returned by
    :func:`reliability_table`.

    Each field is a float64 tensor of shape ``(n_bins,)`` on the input's
    device (``count`` is ``torch.long``). Bin :math:`b` holds the predictions
    whose confidence lies in :math:`(\mathrm{lower}_b, \mathrm{upper}_b]`
    (the first bin also holds confidence 0). ``confidence`` and ``accuracy``
    are ``nan`` for an empty bin: there is nothing to average.
    """

    lower: Tensor
    upper: Tensor
    # The field shadows tuple.count (mypy objects); it keeps its public name.
    count: Tensor  # type: ignore[assignment]
    confidence: Tensor
    accuracy: Tensor


def _check_probs_labels(probs: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    check_float(probs, "probs")
    check_tensor(labels, "labels")
    if probs.dim() != 2:
        raise ValueError(
            f"probs must have shape (n, C), got shape {tuple(probs.shape)}"
        )
    n, C = probs.shape
    if (
        labels.dtype.is_floating_point
        or labels.dtype == torch.bool
        or labels.is_complex()
    ):
        raise TypeError(
            "labels must be an integer tensor (class indices), got dtype "
            f"{labels.dtype}"
        )
    if labels.shape != (n,):
        raise ValueError(
            f"labels must have shape (n,) = ({n},) to match probs "
            f"{tuple(probs.shape)}, "
            f"got {tuple(labels.shape)}"
        )
    if n == 0 or C == 0:
        raise ValueError(
            f"probs must hold at least one prediction over at least one class, "
            f"got shape {tuple(probs.shape)}"
        )
    if labels.device != probs.device:
        raise ValueError(f"labels is on {labels.device} but probs is on {probs.device}")
    if bool(((labels < 0) | (labels >= C)).any()):
        raise ValueError(
            f"labels must be class indices in [0, {C}), got values in "
            f"[{int(labels.min())}, {int(labels.max())}]"
        )
    p = probs.double()
    if bool(torch.isnan(p).any()):
        raise ValueError("probs contain nan")
    tol = 1e-2 if probs.element_size() <= 2 else 1e-4
    sums = p.sum(dim=-1)
    if bool((p < 0).any()) or bool(((sums - 1).abs() > tol).any()):
        raise ValueError(
            "probs rows must be probability distributions (entries >= 0 summing to 1, "
            f"got row sums in [{float(sums.min()):.4g}, {float(sums.max()):.4g}]); "
            "pass softmax(logits, dim=-1), not the logits"
        )
    return p, labels


def reliability_table(
    probs: Tensor, labels: Tensor, n_bins: int = 15
) -> ReliabilityTable:
    r"""Confidence and accuracy per confidence bin: the data of a reliability diagram.

    For each prediction the confidence is :math:`\hat p_i = \max_c \pi_{ic}` and
    the prediction is :math:`\hat y_i = \arg\max_c \pi_{ic}` (the first index
    among ties). The interval :math:`[0, 1]` is cut into ``n_bins`` bins of
    equal width, :math:`B_b = \{ i : \hat p_i \in (b/M, (b+1)/M] \}` for
    :math:`M` = ``n_bins``; per bin the table holds
    :math:`|B_b|`, :math:`\mathrm{conf}(B_b) = \frac{1}{|B_b|}\sum_{i \in B_b} \hat p_i`
    and :math:`\mathrm{acc}(B_b) = \frac{1}{|B_b|}\sum_{i \in B_b} [\hat y_i = y_i]`.
    A perfectly calibrated model has
    :math:`\mathrm{acc}(B_b) \approx \mathrm{conf}(B_b)`
    in every bin (Guo et al., 2017).

    Shapes: ``probs`` is ``(n, C)``, ``labels`` is ``(n,)``; every field of the
    result is ``(n_bins,)``.

    Parameters
    ----------
    probs : Tensor
        Predicted probabilities of shape ``(n, C)``; each row on the simplex.
    labels : Tensor
        True classes of shape ``(n,)``, integers in ``[0, C)``.
    n_bins : int
        The number of equal-width confidence bins, ``>= 1``.

    Returns
    -------
    ReliabilityTable
        Named fields ``lower``, ``upper``, ``count``, ``confidence``, ``accuracy``.

    Raises
    ------
    TypeError
        If ``probs`` is not floating-point or ``labels`` is not an integer tensor.
    ValueError
        On mismatched shapes, labels out of range, rows that are not
        distributions (e.g. logits passed by mistake), or empty input.
    """
    n_bins = check_positive_int(n_bins, "n_bins")
    p, labels = _check_probs_labels(probs, labels)
    conf, pred = p.max(dim=-1)  # (n,), (n,)
    correct = (pred == labels).double()
    # Right-closed bins (b/M, (b+1)/M]: ceil(conf * M) - 1, with confidence 0 in bin 0.
    idx = (torch.ceil(conf * n_bins) - 1).clamp(0, n_bins - 1).long()
    count = torch.bincount(idx, minlength=n_bins)
    conf_sum = torch.zeros(n_bins, dtype=torch.float64, device=p.device).index_add_(
        0, idx, conf
    )
    acc_sum = torch.zeros(n_bins, dtype=torch.float64, device=p.device).index_add_(
        0, idx, correct
    )
    denom = count.double()
    empty = count == 0
    nan = torch.full_like(denom, float("nan"))
    confidence = torch.where(empty, nan, conf_sum / denom.clamp_min(1))
    accuracy = torch.where(empty, nan, acc_sum / denom.clamp_min(1))
    edges = torch.linspace(0, 1, n_bins + 1, dtype=torch.float64, device=p.device)
    return ReliabilityTable(edges[:-1], edges[1:], count, confidence, accuracy)


def expected_calibration_error(
    probs: Tensor, labels: Tensor, n_bins: int = 15
) -> float:
    r"""ECE: :math:`\sum_b \frac{|B_b|}{n}\,
    \left|\mathrm{acc}(B_b) - \mathrm{conf}(B_b)\right|`.

    The average gap between confidence and accuracy, over ``n_bins``
    equal-width confidence bins, weighted by how many predictions fall in
    each bin (Naeini et al., 2015; Guo et al., 2017). 0 means calibrated (on
    this binning); the largest possible value is 1. The bins and their
    statistics are those of :func:`reliability_table`; empty bins contribute
    nothing.

    ECE is a report, not a loss: the binning makes it piecewise constant in
    the predictions, so it is returned as a Python ``float``. It depends on
    ``n_bins`` and is biased upward for small ``n`` (a handful of
    predictions per bin are noisy even for a calibrated model).

    Shapes: ``probs`` is ``(n, C)``, ``labels`` is ``(n,)``.

    >>> import torch
    >>> import softmaxbook as sb
    >>> probs = torch.tensor([[0.9, 0.1]] * 10)  # 90% sure of class 0, every time
    >>> labels = torch.tensor([0] * 7 + [1] * 3)  # right 7 times in 10
    >>> round(sb.expected_calibration_error(probs, labels), 6)  # |0.7 - 0.9|
    0.2

    Parameters
    ----------
    probs : Tensor
        Predicted probabilities of shape ``(n, C)``; each row on the simplex.
    labels : Tensor
        True classes of shape ``(n,)``, integers in ``[0, C)``.
    n_bins : int
        The number of equal-width confidence bins, ``>= 1`` (15 as in Guo et al.).

    Returns
    -------
    float
        The expected calibration error, in :math:`[0, 1]`.

    Raises
    ------
    TypeError
        If ``probs`` is not floating-point or ``labels`` is not an integer tensor.
    ValueError
        As for :func:`reliability_table`.
    """
    table = reliability_table(probs, labels, n_bins)
    n = table.count.sum()
    filled = table.count > 0
    gaps = (table.accuracy[filled] - table.confidence[filled]).abs()
    return float((table.count[filled].double() / n * gaps).sum())


def _nll_derivative(z: Tensor, labels: Tensor, beta: float) -> float:
    # d/d(beta) of mean_i [logsumexp(beta z_i) - beta z_{i,y_i}] = mean_i
    # (E_{softmax(beta z_i)}[z_i] - z_{i,y_i})
    p = torch.softmax(beta * z, dim=-1)
    zp = torch.where(p > 0, p * z, torch.zeros_like(z))  # 0 * (-inf) counts as 0
    expected = zp.sum(dim=-1)
    target = z.gather(-1, labels[:, None]).squeeze(-1)
    return float((expected - target).mean())


def fit_temperature(
    logits: Tensor,
    labels: Tensor,
    *,
    bounds: tuple[float, float] = (0.01, 100.0),
    tol: float = 1e-10,
) -> float:
    r"""Temperature scaling:
    :math:`T^\star = \arg\min_{T>0}
    -\frac{1}{n}\sum_i \log \mathrm{softmax}(z_i / T)_{y_i}`.

    Fits the single parameter of temperature scaling (Guo et al., 2017) on
    held-out data: the temperature that minimizes the negative
    log-likelihood (the cross-entropy) of the labels. Dividing all logits by
    one positive :math:`T` keeps the order within each row, so in exact
    arithmetic accuracy is untouched; only the confidences move. In floating
    point the division can turn a near-tie into a tie (float32 logits 1.5 and
    the next float above it, divided by :math:`T = 2.5`, become equal), and
    ``argmax`` then returns the first of the tied entries.

    With :math:`\beta = 1/T` the loss
    :math:`\frac{1}{n}\sum_i
    \big(\operatorname{logsumexp}(\beta z_i) - \beta z_{i,y_i}\big)`
    is convex in :math:`\beta` (a logsumexp of functions linear in
    :math:`\beta`), with derivative
    :math:`\frac{1}{n}\sum_i
    \big(\mathbb{E}_{\mathrm{softmax}(\beta z_i)}[z_i] - z_{i,y_i}\big)`,
    which is non-decreasing. So the minimizer is found by bisection on the
    sign of that derivative, in :math:`\log \beta`, inside ``bounds``: no
    learning rate, no initial guess, the same answer on every run, to
    relative precision ``tol``. Guo et al.'s reference code
    (``temperature_scaling.py`` of gpleiss/temperature_scaling) uses L-BFGS
    on :math:`T`; the minimizer is the same. Computed in float64.

    If the optimum lies outside ``bounds`` the nearer bound is returned:
    e.g. perfectly separated training logits push :math:`T \to 0`, which is
    why the temperature must be fitted on a validation split.

    Shapes: ``logits`` is ``(n, C)``, ``labels`` is ``(n,)``.

    >>> import torch
    >>> import softmaxbook as sb
    >>> logits = torch.tensor([[1.0, 0.0]] * 10)  # the same prediction ten times
    >>> labels = torch.tensor([0] * 7 + [1] * 3)  # right 7 times in 10
    >>> T = sb.fit_temperature(logits, labels)  # softmax(z / T) gives class 0 0.7
    >>> round(T, 4), round(torch.softmax(logits[0] / T, -1)[0].item(), 4)
    (1.1802, 0.7)

    Parameters
    ----------
    logits : Tensor
        Held-out logits of shape ``(n, C)``. ``-inf`` entries (removed classes) are
        allowed.
    labels : Tensor
        True classes of shape ``(n,)``, integers in ``[0, C)``.
    bounds : tuple of float
        The search interval ``(T_min, T_max)``, ``0 < T_min < T_max``.
    tol : float
        Stop when the interval in :math:`\log T` is narrower than ``tol``.

    Returns
    -------
    float
        The fitted temperature :math:`T^\star`; use it as ``softmax(logits / T)``.

    Raises
    ------
    TypeError
        If ``logits`` is not floating-point or ``labels`` is not an integer tensor.
    ValueError
        On mismatched shapes, labels out of range, bad ``bounds``, or a
        label whose logit is not finite.
    """
    check_float(logits, "logits")
    if logits.dim() != 2:
        raise ValueError(
            f"logits must have shape (n, C), got shape {tuple(logits.shape)}"
        )
    n, C = logits.shape
    check_tensor(labels, "labels")
    if (
        labels.dtype.is_floating_point
        or labels.dtype == torch.bool
        or labels.is_complex()
    ):
        raise TypeError(
            "labels must be an integer tensor (class indices), got dtype "
            f"{labels.dtype}"
        )
    if labels.shape != (n,):
        raise ValueError(
            f"labels must have shape (n,) = ({n},) to match logits "
            f"{tuple(logits.shape)}, got {tuple(labels.shape)}"
        )
    if n == 0 or C == 0:
        raise ValueError(
            f"logits must hold at least one example and one class, "
            f"got shape {tuple(logits.shape)}"
        )
    if bool(((labels < 0) | (labels >= C)).any()):
        raise ValueError(f"labels must be class indices in [0, {C})")
    if not (isinstance(bounds, (tuple, list)) and len(bounds) == 2):
        raise ValueError(f"bounds must be a pair (T_min, T_max), got {bounds!r}")
    t_min = check_positive(bounds[0], "bounds[0]")
    t_max = check_positive(bounds[1], "bounds[1]")
    if not t_min < t_max:
        raise ValueError(f"bounds must satisfy T_min < T_max, got {bounds!r}")
    tol = check_positive(tol, "tol")
    z = logits.double()
    labels = labels.to(device=z.device, dtype=torch.long)
    if bool(torch.isnan(z).any()):
        raise ValueError("logits contain nan")
    if not bool(torch.isfinite(z.gather(-1, labels[:, None])).all()):
        raise ValueError(
            "every label's logit must be finite (its class cannot have been removed)"
        )
    # Entries +inf would make every temperature equivalent; reject them too.
    if bool(torch.isposinf(z).any()):
        raise ValueError("logits contain +inf")
    lo, hi = math.log(1.0 / t_max), math.log(1.0 / t_min)  # bracket in log(beta)
    if _nll_derivative(z, labels, math.exp(lo)) >= 0:
        return t_max
    if _nll_derivative(z, labels, math.exp(hi)) <= 0:
        return t_min
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if _nll_derivative(z, labels, math.exp(mid)) > 0:
            hi = mid
        else:
            lo = mid
    return float(1.0 / math.exp(0.5 * (lo + hi)))
