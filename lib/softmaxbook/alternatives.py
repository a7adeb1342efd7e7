r"""Alternatives to softmax as attention normalizers.

Sparse maps that can put exactly zero weight on a key (sparsemax, 1.5-entmax,
:math:`\alpha`-entmax), softmax-off-by-one that may put (almost) no weight
anywhere, and two elementwise normalizers (ReLU and sigmoid). Every function
maps scores to weights along ``dim``, treats ``-inf`` entries as removed keys,
gives all-zero weights (and zero gradients, never ``nan``) for a row whose
entries are all ``-inf``, and has a hand-written backward pass.

Half-precision inputs (``float16``, ``bfloat16``) are computed in ``float32``
and the result is cast back, so the thresholds are not found in 3 decimal
digits.

Each map is a ``torch.autograd.Function`` in the modern form (``forward``,
``setup_context``, ``backward``) with a ``vmap`` rule, so it composes with
``torch.func``: ``vmap``, ``grad``, ``jacrev``, per-sample gradients.

Speed: sparsemax and 1.5-entmax find their threshold without sorting whole
rows. The threshold is known to lie above ``t0`` (the row maximum minus 1, or
minus 2 for 1.5-entmax), so only the keys above ``t0`` can be in the support:
one pass collects them (a few percent of a row of N(0, 1) scores); for
1.5-entmax a few Newton steps on the threshold equation, run on the
candidates alone, raise the bound and drop most of them; the few left are
sorted and the exact sort-based formula runs on those. A row with too many
candidates for this to pay, or whose threshold comes out below the bound that
chose its candidates, is sorted in full (the fallback). The result is the
exact (sort-based) solution.
"""

from __future__ import annotations

import inspect
import math
from numbers import Real

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ._validate import check_dim, check_float, check_positive_int

__all__ = [
    "sparsemax",
    "entmax15",
    "entmax_bisect",
    "softmax_one",
    "relu_normalize",
    "sigmoid_normalize",
]

_HALF = (torch.float16, torch.bfloat16)


def _compute_dtype(x: Tensor) -> torch.dtype:
    return torch.float32 if x.dtype in _HALF else x.dtype


def _apply(function, x: Tensor, dim: int, *args) -> Tensor:
    """Run ``function`` (an autograd Function) along ``dim`` in the compute dtype.

    Half-precision scores are upcast to float32 here, once, and the weights
    rounded back at the end: the thresholds and sums are found in float32, and
    the Functions below never see a 16-bit float. 0-d and empty inputs too.
    """
    if x.dim() == 0:  # a single score is a row of length 1
        return _apply(function, x.unsqueeze(0), 0, *args).squeeze(0)
    if x.numel() == 0:
        return x * 0  # nothing to normalize; keeps the autograd graph
    return function.apply(x.to(_compute_dtype(x)), dim, *args).to(x.dtype)


class _RowwiseFunction(torch.autograd.Function):
    """An autograd Function that normalizes ``x`` along ``dim``, row by row.

    ``forward(x, dim, *options)`` computes, ``setup_context`` saves what the
    backward pass needs, and the ``vmap`` rule below lets ``torch.func.vmap``
    (and so ``jacrev``, ``jacfwd`` of a batch, per-sample gradients) batch it:
    a vmapped dimension is one more batch dimension, so the rule moves it to
    the front and normalizes the same ``dim`` of every row at once.
    """

    @classmethod
    def vmap(cls, info, in_dims, x, dim, *options):
        if in_dims[0] is None:  # x is not batched: nothing to do but the call
            return cls.apply(x, dim, *options), None
        x = x.movedim(in_dims[0], 0)
        return cls.apply(x, dim if dim < 0 else dim + 1, *options), 0


# --------------------------------------------------------------------------------------
# sparsemax and 1.5-entmax: exact thresholds from a few sorted candidates
# --------------------------------------------------------------------------------------
# Both maps are p = g(z - t)_+ with z the scores shifted so that each row's maximum
# is 0, g(r) = r for sparsemax and g(r) = (r/2)^2 for 1.5-entmax, and t the unique
# threshold with sum_i g((z_i - t)_+) = 1. (The 1.5-entmax threshold of Peters et al.
# is t / 2.) The largest entry alone must not exceed 1, so t >= -1 for sparsemax and
# t >= -2 for entmax.

_T0 = {"sparsemax": -1.0, "entmax15": -2.0}
# Newton steps on the candidates before they are sorted: each shrinks the candidate set
# toward the support (about halving it for 1.5-entmax, whose first candidates are many).
_NEWTON_STEPS = {"sparsemax": 0, "entmax15": 3}
# Candidates are counted slightly below the Newton iterate, which in exact arithmetic is
# already below the threshold; the margin absorbs rounding (z is O(1) there).
_MARGIN = 1e-4
# A row with more candidates than this share of its length is sorted in full: the
# fallback for wide supports (scores of a small spread, long runs of ties).
_FULL_SORT_SHARE = 4


def _sorted_threshold(v: Tensor, kind: str) -> tuple[Tensor, Tensor]:
    """Exact threshold from the k largest shifted scores ``v`` (R, k), sorted
    descending.

    Returns ``(t, support_size)``, both (R, 1). If the support size equals k, the true
    support may be larger than the candidates and the row must be redone.
    """
    valid = v > float("-inf")  # -inf (removed) entries sort last
    v = torch.where(valid, v, torch.zeros((), dtype=v.dtype, device=v.device))
    rho = torch.arange(1, v.shape[-1] + 1, dtype=v.dtype, device=v.device)  # (k,)
    csum = v.cumsum(-1)
    if kind == "sparsemax":
        # Prefix j is in the support iff 1 + j v_j > sum_{i<=j} v_i
        # (Martins & Astudillo, 2016).
        support = valid & (1 + rho * v > csum)
        size = support.sum(-1, keepdim=True).clamp_min(1)
        t = (csum.gather(-1, size - 1) - 1) / size.to(v.dtype)
    else:
        # On a support of size j, sum_i ((v_i - t)/2)^2 = 1 is a quadratic in t whose
        # relevant root is t/2 = mean - sqrt((1 - j * var) / j), with the mean and
        # variance of v/2.
        y = v / 2
        mean = y.cumsum(-1) / rho
        mean_sq = (y * y).cumsum(-1) / rho
        delta = (1 - rho * (mean_sq - mean * mean)) / rho
        tau = mean - torch.sqrt(delta.clamp_min(0))
        support = valid & (tau <= y)
        size = support.sum(-1, keepdim=True).clamp_min(1)
        t = 2 * tau.gather(-1, size - 1)
    return t, size


def _compact(z: Tensor, keep: Tensor, full_share: int = 0) -> tuple[Tensor, Tensor]:
    """The entries of each row of ``z`` (R, n) where ``keep`` is True, packed to the
    left of an (R, k) array padded with -inf (k: the most any row keeps).

    With ``full_share``, rows that keep more than ``n / full_share`` entries are left
    out (all -inf) and flagged in the second result, a boolean (R,).
    """
    R, n = z.shape
    where = keep.reshape(-1).nonzero().squeeze(-1)  # flat indices, row by row
    rows = where.div(n, rounding_mode="floor")
    counts = torch.bincount(rows, minlength=R)
    full = counts * full_share > n if full_share else counts < 0  # (R,)
    if full_share and bool(full.any()):
        kept = ~full[rows]
        where, rows = where[kept], rows[kept]
        counts = counts.masked_fill(full, 0)
    width = max(int(counts.max()), 1) if R else 1
    starts = counts.cumsum(0) - counts  # where each row's entries begin in `where`
    slot = torch.arange(where.numel(), device=z.device) - starts[rows]
    packed = z.new_full((R, width), float("-inf"))
    packed.view(-1)[rows * width + slot] = z.reshape(-1)[where]
    return packed, full


def _newton(v: Tensor, t: Tensor, kind: str, steps: int) -> Tensor:
    """Newton steps on the convex decreasing f(t) = sum g((v - t)_+) - 1, from the left
    of its root: each step stays left of the root (below the threshold) and nears it."""
    for _ in range(steps):
        r = (v - t).clamp_min_(0)
        if kind == "sparsemax":
            f = r.sum(-1, keepdim=True) - 1
            slope = (r > 0).sum(-1, keepdim=True).to(v.dtype)  # the support count
        else:
            f = (r * r).sum(-1, keepdim=True) / 4 - 1
            slope = r.sum(-1, keepdim=True) / 2
        t = torch.where(slope > 0, t + f / slope.clamp_min(1e-30), t)
    return t


def _exact_threshold(z: Tensor, kind: str) -> Tensor:
    """Threshold ``t`` (R, 1) of rows ``z`` (R, n) whose finite maximum is 0 (or all
    -inf or nan).

    The threshold is at least ``t0`` (-1, or -2 for 1.5-entmax: the largest entry
    alone must not exceed weight 1), so every key of the support lies above ``t0``.
    One pass over the scores collects those candidates (a few percent of a row of
    N(0, 1) scores); for 1.5-entmax a few Newton steps on the candidates alone raise
    the bound and drop most of them; the few left are sorted and the exact
    sort-based formula runs on them. The fallback sorts a row in full: a row whose
    candidates are too many for this to pay (scores of a small spread, long runs of
    ties), or whose threshold came out below the bound that chose its candidates
    (then its support might reach past them; only rounding can cause that).
    """
    bound = z.new_full((z.shape[0], 1), _T0[kind])
    # (R, k): every key of the support is among these; -inf and nan never are.
    v, full = _compact(z, z > bound, _FULL_SORT_SHARE)
    if v.shape[-1] > 1 and _NEWTON_STEPS[kind]:
        bound = _newton(v, bound, kind, _NEWTON_STEPS[kind]) - _MARGIN
        v, _ = _compact(v, v > bound)
    v = v.sort(dim=-1, descending=True).values
    t, _ = _sorted_threshold(v, kind)
    rows = (full | (t < bound).squeeze(-1)).nonzero().squeeze(-1)
    if rows.numel():  # the fallback: the full sort
        w = torch.sort(z[rows], dim=-1, descending=True).values
        t[rows] = _sorted_threshold(w, kind)[0]
    return t


def _sparse_forward(x: Tensor, dim: int, kind: str) -> Tensor:
    """Forward pass of sparsemax / 1.5-entmax along ``dim`` in the compute dtype."""
    xt = x.movedim(dim, -1)
    shape = xt.shape
    n = shape[-1]
    m = xt.amax(-1, keepdim=True)  # (..., 1)
    finite = torch.isfinite(m)
    # Shift each row's maximum to 0 (exact near the top: Sterbenz). z is a new buffer
    # that becomes the output in place.
    z = (xt - torch.where(finite, m, torch.zeros_like(m))).reshape(-1, n)  # (R, n)
    m, finite = m.reshape(-1, 1), finite.reshape(-1, 1)
    t = _exact_threshold(z, kind)
    # All -inf rows: t = +inf sends every entry to 0. A nan or +inf row stays nan.
    t = torch.where(
        finite, t, torch.where(m == float("-inf"), float("inf"), float("nan"))
    )
    z.sub_(t).clamp_min_(0)
    if kind == "entmax15":
        z.mul_(z).mul_(0.25)
    return z.reshape(shape).movedim(-1, dim)


def _support_backward(grad: Tensor, weight: Tensor, dim: int) -> Tensor:
    r"""Vector-Jacobian product of
    :math:`J = \mathrm{diag}(w) - w w^\top / \sum_j w_j`."""
    wg = weight * grad
    total = weight.sum(dim, keepdim=True)
    # Rows with an empty support (all -inf) have w = 0 and get zero gradient, not 0/0.
    q = wg.sum(dim, keepdim=True) / torch.where(
        total > 0, total, torch.ones_like(total)
    )
    return wg - q * weight


class _Sparsemax(_RowwiseFunction):
    @staticmethod
    def forward(x, dim):
        return _sparse_forward(x, dim, "sparsemax")

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)
        ctx.dim = inputs[1]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        support = (p > 0).to(p.dtype)
        return _support_backward(grad, support, ctx.dim), None


class _Entmax15(_RowwiseFunction):
    @staticmethod
    def forward(x, dim):
        return _sparse_forward(x, dim, "entmax15")

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)
        ctx.dim = inputs[1]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        return _support_backward(grad, p.sqrt(), ctx.dim), None


# Function.apply binds its arguments with inspect.signature on every call; a
# signature computed once makes that a lookup.
for _function in (_Sparsemax, _Entmax15):
    _function.forward.__signature__ = inspect.signature(_function.forward)


def sparsemax(x: Tensor, dim: int = -1) -> Tensor:
    r"""Sparsemax: :math:`\arg\min_{p \in \Delta} \lVert p - x \rVert^2 = [x - \tau]_+`.

    The Euclidean projection of the scores onto the probability simplex
    (Martins & Astudillo, 2016). The threshold :math:`\tau` is the unique
    number with :math:`\sum_i [x_i - \tau]_+ = 1`; every score at or below it
    gets exactly zero weight. On the support :math:`S = \{i : p_i > 0\}` the
    Jacobian is :math:`J = \mathrm{diag}(s) - s s^\top / |S|` with :math:`s`
    the 0/1 indicator of :math:`S`.

    Entries equal to ``-inf`` get weight 0 (removed); a row of only ``-inf``
    gives zeros and zero gradient. A ``nan`` (or ``+inf``) makes its row
    ``nan``. The threshold is found exactly, by sorting only the few scores
    that can be in the support instead of the whole row (see the module
    docstring).

    Shapes: ``x`` is ``(..., N)`` (normalized along ``dim``); the result has
    the same shape and dtype.

    Equivalent to ``entmax.sparsemax(x, dim)`` of the ``entmax`` package and
    to :func:`softmaxbook.reference.sparsemax`.

    Parameters
    ----------
    x : Tensor
        Scores, any floating dtype and device.
    dim : int
        The dimension to normalize; negative values count from the end.

    Returns
    -------
    Tensor
        Weights on the simplex along ``dim``: non-negative, summing to 1,
        usually with many exact zeros.

    Raises
    ------
    TypeError
        If ``x`` is not a floating-point tensor or ``dim`` is not an int.
    IndexError
        If ``dim`` is out of range.
    """
    check_float(x)
    dim = check_dim(x, dim)
    return _apply(_Sparsemax, x, dim)


def entmax15(x: Tensor, dim: int = -1) -> Tensor:
    r"""1.5-entmax: :math:`p_i = [x_i/2 - \tau]_+^2`, with :math:`\tau` such that
    :math:`\sum_i p_i = 1`.

    The :math:`\alpha = 1.5` member of the :math:`\alpha`-entmax family
    (Peters, Niculae & Martins, 2019): the maximizer of
    :math:`p^\top x + H^T_{1.5}(p)` over the simplex, with the Tsallis entropy
    :math:`H^T_{1.5}(p) = \tfrac{4}{3}(1 - \sum_i p_i^{3/2})`. Sparse like
    sparsemax, but smoother: the weights fall to zero quadratically. Its
    Jacobian is :math:`\mathrm{diag}(s) - s s^\top / \sum_j s_j` with
    :math:`s_i = \sqrt{p_i}`.

    ``-inf`` entries get weight 0; a row of only ``-inf`` gives zeros. The
    threshold is exact (the sort-based formula on the few scores that can be
    in the support).

    Shapes: ``x`` is ``(..., N)``; the result has the same shape and dtype.

    Equivalent to ``entmax.entmax15(x, dim)`` of the ``entmax`` package, and
    to ``entmax_bisect(x, alpha=1.5, dim)`` up to the bisection's tolerance.

    Parameters
    ----------
    x : Tensor
        Scores, any floating dtype and device.
    dim : int
        The dimension to normalize; negative values count from the end.

    Returns
    -------
    Tensor
        Weights on the simplex along ``dim``.

    Raises
    ------
    TypeError
        If ``x`` is not a floating-point tensor or ``dim`` is not an int.
    IndexError
        If ``dim`` is out of range.
    """
    check_float(x)
    dim = check_dim(x, dim)
    return _apply(_Entmax15, x, dim)


# --------------------------------------------------------------------------------------
# alpha-entmax by bisection
# --------------------------------------------------------------------------------------


class _EntmaxBisect(_RowwiseFunction):
    @staticmethod
    def forward(x, dim, alpha, n_iter):
        m = x.amax(dim, keepdim=True)
        finite = torch.isfinite(m)
        z = (x - torch.where(finite, m, torch.zeros_like(m))) * (alpha - 1)  # max 0
        n = x.shape[dim]
        # p_i = [z_i - tau]_+^(1/(alpha-1)): tau = -1 gives the max entry weight 1
        # (sum >= 1), tau = -(1/n)^(alpha-1) gives every entry at most 1/n (sum <= 1).
        tau_lo = torch.full_like(m, -1.0)
        width = 1.0 - (1.0 / n) ** (alpha - 1)
        for _ in range(n_iter):
            width /= 2
            tau_mid = tau_lo + width
            p = (z - tau_mid).clamp_min(0) ** (1 / (alpha - 1))
            tau_lo = torch.where(p.sum(dim, keepdim=True) >= 1, tau_mid, tau_lo)
        total = p.sum(dim, keepdim=True)  # ~1; renormalize the last midpoint's weights
        safe = torch.where(total > 0, total, torch.ones_like(total))
        p = torch.where(total > 0, p / safe, 0.0)
        return torch.where(torch.isnan(m) | (m == float("inf")), float("nan"), p)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, ctx.dim, ctx.alpha, _ = inputs
        ctx.save_for_backward(output)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        # 1/g''(p) = p^(2 - alpha) on the support (Peters et al., 2019, Prop. 1).
        s = torch.where(p > 0, p.clamp_min(0) ** (2 - ctx.alpha), torch.zeros_like(p))
        return _support_backward(grad, s, ctx.dim), None, None, None


def entmax_bisect(
    x: Tensor, alpha: float = 1.5, dim: int = -1, n_iter: int = 50
) -> Tensor:
    r""":math:`\alpha`-entmax by bisection:
    :math:`p_i = [(\alpha - 1) x_i - \tau]_+^{1/(\alpha-1)}`.

    The maximizer of :math:`p^\top x + H^T_\alpha(p)` over the simplex, with
    the Tsallis entropy
    :math:`H^T_\alpha(p) = \frac{1 - \sum_i p_i^\alpha}{\alpha (\alpha - 1)}`
    (Peters, Niculae & Martins, 2019). :math:`\alpha \to 1` recovers softmax,
    :math:`\alpha = 2` is sparsemax, :math:`\alpha = 1.5` is
    :func:`~softmaxbook.entmax15`; every :math:`\alpha > 1` can give exact
    zeros. The threshold :math:`\tau` is found by ``n_iter`` halvings of an
    interval known to contain it, and the weights are renormalized to sum
    to 1. The Jacobian is :math:`\mathrm{diag}(s) - s s^\top / \sum_j s_j`
    with :math:`s_i = p_i^{2-\alpha}` on the support.

    ``-inf`` entries get weight 0; a row of only ``-inf`` gives zeros.
    ``alpha`` is a fixed number (no gradient with respect to it).

    Shapes: ``x`` is ``(..., N)``; the result has the same shape and dtype.

    Equivalent to ``entmax.entmax_bisect(x, alpha, dim, n_iter)`` of the
    ``entmax`` package.

    Parameters
    ----------
    x : Tensor
        Scores, any floating dtype and device.
    alpha : float
        :math:`\alpha > 1`. For :math:`\alpha = 1` use softmax.
    dim : int
        The dimension to normalize; negative values count from the end.
    n_iter : int
        Bisection steps; 50 reaches float64 resolution of the threshold.

    Returns
    -------
    Tensor
        Weights on the simplex along ``dim``.

    Raises
    ------
    TypeError
        If ``x`` is not a floating-point tensor, ``alpha`` is not a real
        number, or ``dim`` / ``n_iter`` is not an int.
    ValueError
        If ``alpha <= 1`` (or not finite) or ``n_iter < 1``.
    IndexError
        If ``dim`` is out of range.
    """
    check_float(x)
    dim = check_dim(x, dim)
    if isinstance(alpha, bool) or not isinstance(alpha, Real):
        raise TypeError(f"alpha must be a real number > 1, got {type(alpha).__name__}")
    if not (math.isfinite(alpha) and alpha > 1):
        raise ValueError(
            f"alpha must be a finite number > 1, got {alpha}; "
            "alpha = 1 is softmax: use softmax(x) instead"
        )
    n_iter = check_positive_int(n_iter, "n_iter")
    return _apply(_EntmaxBisect, x, dim, float(alpha), n_iter)


# --------------------------------------------------------------------------------------
# softmax-off-by-one, ReLU and sigmoid normalization
# --------------------------------------------------------------------------------------


class _SoftmaxOne(_RowwiseFunction):
    @staticmethod
    def forward(x, dim):
        # Shift by max(m, 0), not m: the implicit extra logit 0 is part of the
        # maximum, so e^{-shift} (its term) and every e^{x_i - shift} stay <= 1.
        # No overflow, and a row of only -inf gives 0 / 1 = 0.
        shift = x.amax(dim, keepdim=True).clamp_min(0)
        e = torch.exp(x - shift)
        return e / (torch.exp(-shift) + e.sum(dim, keepdim=True))

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)
        ctx.dim = inputs[1]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        # Same form as softmax's: dp_i/dx_j = p_i (delta_ij - p_j).
        return p * (grad - (p * grad).sum(ctx.dim, keepdim=True)), None


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
    the last entry dropped.

    Parameters
    ----------
    x : Tensor
        Scores, any floating dtype and device.
    dim : int
        The dimension to normalize; negative values count from the end.

    Returns
    -------
    Tensor
        Non-negative weights whose sum along ``dim`` is below 1.

    Raises
    ------
    TypeError
        If ``x`` is not a floating-point tensor or ``dim`` is not an int.
    IndexError
        If ``dim`` is out of range.
    """
    check_float(x)
    dim = check_dim(x, dim)
    return _apply(_SoftmaxOne, x, dim)


class _ReluNormalize(_RowwiseFunction):
    @staticmethod
    def forward(x, dim):
        r = x.clamp_min(0)
        total = r.sum(dim, keepdim=True)
        # A row with no positive score: 0 / 1 = 0 (a nan row stays nan).
        return r / torch.where(total == 0, torch.ones_like(total), total)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, ctx.dim = inputs
        ctx.save_for_backward(x, output)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x, p = ctx.saved_tensors
        total = x.clamp_min(0).sum(ctx.dim, keepdim=True)
        total = torch.where(total == 0, torch.ones_like(total), total)
        # d p_i / d x_j = [x_j > 0] (delta_ij - p_i) / sum_k relu(x_k).
        dx = (grad - (p * grad).sum(ctx.dim, keepdim=True)) / total
        return torch.where(x > 0, dx, torch.zeros_like(dx)), None


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
    where that sum is positive.

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
    check_float(x)
    dim = check_dim(x, dim)
    return _apply(_ReluNormalize, x, dim)


class _SigmoidNormalize(_RowwiseFunction):
    @staticmethod
    def forward(x, dim, bias):
        return torch.sigmoid(x + bias)  # dim only chose the default bias

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        return grad * p * (1 - p), None, None


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

    Equivalent to ``torch.sigmoid(x + bias)``.

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
        Weights in :math:`(0, 1)`, not normalized.

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
    check_float(x)
    dim = check_dim(x, dim)
    if bias is None:
        n = x.shape[dim] if x.dim() else 1
        bias = -math.log(n) if n > 0 else 0.0
    elif isinstance(bias, bool) or not isinstance(bias, Real):
        raise TypeError(
            f"bias must be a real number or None, got {type(bias).__name__}"
        )
    elif not math.isfinite(bias):
        raise ValueError(f"bias must be finite, got {bias}")
    return _apply(_SigmoidNormalize, x, dim, float(bias))
