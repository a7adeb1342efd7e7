r"""Sparse normalizers: sparsemax, 1.5-entmax and :math:`\alpha`-entmax.

Maps that can put exactly zero weight on a key: each is the projection of the
scores onto the probability simplex under a regularizer (Martins & Astudillo,
2016; Peters, Niculae & Martins, 2019), so the weights sum to one and every
score below a threshold gets weight 0. Each treats ``-inf`` entries as removed
keys, gives all-zero weights (and zero gradients, never ``nan``) for a row
whose entries are all ``-inf``, and has a hand-written backward pass.

Each map is a ``torch.autograd.Function`` in the modern form (``forward``,
``setup_context``, ``backward``) with a ``vmap`` rule, so it composes with
``torch.func``: ``vmap``, ``grad``, ``jacrev``, per-sample gradients. The
shared policy (argument checks, half precision in ``float32``, 0-d and empty
input) is ``@normalizer``'s.

Speed: sparsemax and 1.5-entmax find their threshold without sorting whole
rows where that pays. The threshold is known to lie above ``t0`` (the row
maximum minus 1, or minus 2 for 1.5-entmax), so only the keys above ``t0``
can be in the support. Rather than compare every key with a bound, the row is
cut into blocks of 4 to 16 keys (key j, j + n/b, j + 2n/b, ...: one vectorized
maximum over a view finds every block's maximum at the speed of reading the
row), and only the blocks whose maximum exceeds the bound are gathered. For
1.5-entmax the bound is raised first by four Newton steps on the block maxima
alone (the threshold of a subset of the keys lies below the row's): from
``t0`` most blocks would qualify. Of the gathered keys, those above the bound
are the candidates (for rows of 4096 down to 256 N(0, 1) scores, on average
about 0.6 to 4 % of the keys for sparsemax, within 1 of the maximum); for
1.5-entmax three Newton steps on the candidates raise the bound again; what
is left is sorted and the exact sort-based formula runs on it. What decides
the speed is the number of candidates, not the size of the support: a row
with more than half of its blocks gathered, or more than a quarter of its
keys among the candidates (scores of a small spread, long runs of ties), or
whose threshold comes out below the bound that chose its candidates, is
sorted in full (the fallback), and then costs more than a plain sort. Rows of
at most 128 keys are sorted whole at once, and so is every row under
``torch.compile`` (the candidate search's sizes depend on the data; a graph
needs static ones). The result is the exact (sort-based) threshold; the
weights are :math:`(x - \tau)_+` (and :math:`((x - \tau)/2)^2`) rounded once.
"""

from __future__ import annotations

import inspect
import math
from numbers import Real
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .._numerics import functorch_active
from .._validate import check_positive_int
from ._policy import RowwiseFunction, normalizer

__all__ = ["sparsemax", "entmax15", "entmax_bisect"]

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
# Newton steps on the block maxima, for the bound that chooses the blocks (see
# _block_candidates): from -2 alone, 1.5-entmax would keep most blocks; sparsemax
# keeps the keys within 1 of the row maximum, as it always has.
_BOUND_STEPS = {"sparsemax": 0, "entmax15": 4}
# Candidates are counted slightly below the Newton iterate, which in exact arithmetic is
# already below the threshold; the margin absorbs rounding (z is O(1) there).
_MARGIN = 1e-4
# A row with more candidates than this share of its length is sorted in full: the
# fallback for wide supports (scores of a small spread, long runs of ties).
_FULL_SORT_SHARE = 4
# Rows of at most this many keys are sorted whole: on short rows one sort costs
# less than the candidate search's bookkeeping (its host syncs and compactions).
# Measured on one CPU thread: (4, 16) rows 0.16 ms sorted against 0.66 ms by the
# search; at 256 keys and more the search wins.
_SORT_AT_MOST = 128


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


def _pack(
    keep: Tensor, limit: float | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Where the True entries of each row of ``keep`` (R, n) go when packed to the
    left of an (R, k) array (k: the most any row keeps).

    Returns ``(where, target, width, full)``: the flat indices of the kept entries,
    row by row, their flat indices in the (R, width) array, the width, and, with a
    ``limit``, the rows (a boolean (R,)) that keep more than ``limit`` entries, left
    out (kept nowhere).
    """
    R, n = keep.shape
    where = keep.reshape(-1).nonzero().squeeze(-1)  # flat indices, row by row
    rows = where.div(n, rounding_mode="floor")
    counts = torch.bincount(rows, minlength=R)
    full = counts > limit if limit is not None else counts < 0  # (R,)
    if limit is not None and bool(full.any()):
        kept = ~full[rows]
        where, rows = where[kept], rows[kept]
        counts = counts.masked_fill(full, 0)
    width = max(int(counts.max()), 1) if R else 1
    starts = counts.cumsum(0) - counts  # where each row's entries begin in `where`
    slot = torch.arange(where.numel(), device=keep.device) - starts[rows]
    return where, rows * width + slot, torch.tensor(width), full


def _compact(z: Tensor, keep: Tensor, full_share: int = 0) -> tuple[Tensor, Tensor]:
    """The entries of each row of ``z`` (R, n) where ``keep`` is True, packed to the
    left of an (R, k) array padded with -inf (k: the most any row keeps).

    With ``full_share``, rows that keep more than ``n / full_share`` entries are left
    out (all -inf) and flagged in the second result, a boolean (R,).
    """
    where, target, width, full = _pack(
        keep, z.shape[-1] / full_share if full_share else None
    )
    packed = z.new_full((z.shape[0], int(width)), float("-inf"))
    packed.view(-1)[target] = z.reshape(-1)[where]
    return packed, full


def _newton_steps(v: Tensor, t: Tensor, kind: str, steps: int) -> Tensor:
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


def _newton(v: Tensor, t: Tensor, kind: str, steps: int) -> Tensor:
    """The Newton steps taken on the candidates (``_newton_steps``)."""
    return _newton_steps(v, t, kind, steps)


def _block_size(n: int) -> int:
    """Keys per block of a row of ``n`` keys (see :func:`_block_candidates`)."""
    return 16 if n >= 2048 else 8 if n >= 512 else 4


def _block_candidates(rows: Tensor, kind: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The row maxima ``m`` (R, 1), and the shifted keys of rows (R, n) that can be in
    the support, by blocks.

    Block j of a row holds the keys j, j + n/b, j + 2n/b, ... (b keys; the last
    ``n mod b`` keys are candidates always): one vectorized ``amax`` over the
    (R, b, n/b) view finds every block's maximum at the speed of reading the row.
    The threshold lies above ``t0``, and above the threshold of the block maxima
    alone (a subset of the keys reaches the sum 1 later), which Newton steps from
    ``t0`` approach from below (1.5-entmax); only the blocks whose maximum exceeds
    that bound can hold keys of the support, and only their keys are gathered.

    Returns ``(m, bound, candidates, full)``: the candidates (R, k) are the keys,
    shifted by the row maximum, of the chosen blocks (the rest of the width below
    the bound), and ``full`` flags the rows with more than half of their blocks
    chosen (left out, to be sorted in full).
    """
    R, n = rows.shape
    b = _block_size(n)
    nb = n // b
    blocks = rows[:, : b * nb].view(R, b, nb)  # key i * nb + j is blocks[:, i, j]
    tail = rows[:, b * nb :]
    top = blocks.amax(1)  # (R, nb): the block maxima
    m = top.amax(-1, keepdim=True)
    if tail.shape[-1]:
        m = torch.maximum(m, tail.amax(-1, keepdim=True))
    shift = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    top = top - shift
    bound = top.new_full((R, 1), _T0[kind])
    if _BOUND_STEPS[kind]:
        bound = _newton_steps(top, bound, kind, _BOUND_STEPS[kind]) - _MARGIN
    keep = top > bound  # (R, nb)
    where, target, width, full = _pack(keep, nb / 2)
    # Unused slots take the row's lowest block, whose keys are all below the bound
    # (a row with every block kept is left out anyway).
    index = top.argmin(-1, keepdim=True).expand(R, int(width)).contiguous()
    index.view(-1)[target] = where.remainder(nb)
    gathered = blocks.gather(2, index[:, None, :].expand(R, b, int(width)))
    candidates = gathered.reshape(R, -1)
    if tail.shape[-1]:
        candidates = torch.cat([candidates, tail], dim=-1)
    return m, bound, candidates.sub_(shift), full


def _exact_threshold(rows: Tensor, kind: str) -> tuple[Tensor, Tensor]:
    """Row maxima ``m`` (R, 1) and threshold ``t`` (R, 1), relative to ``m``, of rows
    (R, n) (a row all -inf, or holding nan or +inf, gets a meaningless ``t``).

    The threshold is at least ``t0`` (-1, or -2 for 1.5-entmax: the largest entry
    alone must not exceed weight 1), so every key of the support lies above ``t0``.
    Short rows are sorted in full at once. Longer rows: the blocks whose maximum
    can reach the support give the candidates (:func:`_block_candidates`), a few
    percent of a row of N(0, 1) scores; the candidates above the bound are kept; for
    1.5-entmax three Newton steps on them alone raise the bound and drop most of
    them; the few left are sorted and the exact sort-based formula runs on them. The
    fallback sorts a row in full: a row whose candidates are too many for this to
    pay (scores of a small spread, long runs of ties), or whose threshold came out
    below the bound that chose its candidates (then its support might reach past
    them; only rounding can cause that).
    """
    if rows.shape[-1] <= _SORT_AT_MOST or torch.compiler.is_compiling():
        # Under torch.compile the candidate search's data-dependent sizes would
        # break the graph: the full sort has static shapes and the same result.
        m = rows.amax(-1, keepdim=True)
        z = rows - torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        return m, _sorted_threshold(z.sort(dim=-1, descending=True).values, kind)[0]
    m, bound, z, full = _block_candidates(rows, kind)
    # (R, k): every key of the support is among these; -inf and nan never are.
    keep = z > bound
    full |= keep.sum(-1) * _FULL_SORT_SHARE > rows.shape[-1]
    v, _ = _compact(z, keep & ~full[:, None])
    if v.shape[-1] > 1 and _NEWTON_STEPS[kind]:
        bound = _newton(v, bound, kind, _NEWTON_STEPS[kind]) - _MARGIN
        v, _ = _compact(v, v > bound)
    v = v.sort(dim=-1, descending=True).values
    t, _ = _sorted_threshold(v, kind)
    redo = (full | (t < bound).squeeze(-1)).nonzero().squeeze(-1)
    if redo.numel():  # the fallback: the full sort
        w = rows[redo] - torch.where(torch.isfinite(m[redo]), m[redo], 0.0)
        t[redo] = _sorted_threshold(w.sort(dim=-1, descending=True).values, kind)[0]
    return m, t


def _sparse_forward(x: Tensor, dim: int, kind: str) -> Tensor:
    """Forward pass of sparsemax / 1.5-entmax along ``dim`` in the compute dtype."""
    xt = x.movedim(dim, -1)
    shape = xt.shape
    n = shape[-1]
    rows = xt.reshape(-1, n)  # (R, n); a view when dim is the last
    m, t = _exact_threshold(rows, kind)
    finite = torch.isfinite(m)
    # All -inf rows: t = +inf sends every entry to 0. A nan or +inf row stays nan.
    t = torch.where(
        finite, t, torch.where(m == float("-inf"), float("inf"), float("nan"))
    )
    # Shift each row's maximum to 0 first (exact near the top: Sterbenz), then by t:
    # m + t would round at the scale of m (1e4 scores lose 3 decimals).
    out = torch.sub(rows, torch.where(finite, m, torch.zeros_like(m)))
    if kind == "sparsemax":
        out.sub_(t).clamp_min_(0)
    else:  # ((z - t) / 2)^2 on the support: z / 2 - t / 2 rounds as z - t does
        torch.add(t * -0.5, out, alpha=0.5, out=out).clamp_min_(0)
        out.mul_(out)
    return out.reshape(shape).movedim(-1, dim)


def _support_backward(grad: Tensor, weight: Tensor, dim: int) -> Tensor:
    r"""Vector-Jacobian product of
    :math:`J = \mathrm{diag}(w) - w w^\top / \sum_j w_j`."""
    wg = weight * grad
    total = weight.sum(dim, keepdim=True)
    # Rows with an empty support (all -inf) have w = 0 and get zero gradient, not 0/0.
    q = wg.sum(dim, keepdim=True) / torch.where(
        total > 0, total, torch.ones_like(total)
    )
    # One fused pass and no new tensor (each new tensor of a (1024, 4096) batch
    # costs the CPU's allocator about as much as the arithmetic on it); out of
    # place under torch.func.vmap, which cannot batch this in place.
    if functorch_active():
        return torch.addcmul(wg, q, weight, value=-1.0)
    return wg.addcmul_(q, weight, value=-1.0)


class _Sparsemax(RowwiseFunction):
    @staticmethod
    def forward(x: Tensor, dim: int) -> Tensor:
        return _sparse_forward(x, dim, "sparsemax")

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        ctx.save_for_backward(output)
        ctx.dim = inputs[1]

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        (p,) = ctx.saved_tensors
        # The support's indicator, 1 where p > 0 (0 for nan, as p > 0 says), in one
        # float pass: a boolean mask and its conversion took four times as long.
        support = torch.sign(p)
        return _support_backward(grad, support, ctx.dim), None


class _Entmax15(RowwiseFunction):
    @staticmethod
    def forward(x: Tensor, dim: int) -> Tensor:
        return _sparse_forward(x, dim, "entmax15")

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        ctx.save_for_backward(output)
        ctx.dim = inputs[1]

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        (p,) = ctx.saved_tensors
        # sqrt(p) as p * rsqrt(p) (within an ulp): torch's CPU sqrt is slow on
        # zeros. Clamped to the smallest normal number first, a zero gives 0 * a
        # finite number, without a boolean mask (nan stays nan). p is float32 or
        # float64 here; only a p below the bound gets p / sqrt(bound) for sqrt(p),
        # both under 1.1e-19 in float32.
        tiny = torch.finfo(p.dtype).smallest_normal
        s = p.clamp_min(tiny).rsqrt_().mul_(p)
        return _support_backward(grad, s, ctx.dim), None


# Function.apply binds its arguments with inspect.signature on every call; a
# signature computed once makes that a lookup.
for _function in (_Sparsemax, _Entmax15):
    _function.forward.__signature__ = inspect.signature(_function.forward)  # type: ignore[attr-defined]


@normalizer(sparse=True, sums_to_one=True)
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
    ``nan``. The threshold is found exactly, by sorting only the scores that
    can be in the support, those within 1 of the row maximum, where they are
    few; rows of at most 128 keys, and rows with more than a quarter of their
    keys within 1 of the maximum, are sorted whole (see the module
    docstring).

    Shapes: ``x`` is ``(..., N)`` (normalized along ``dim``); the result has
    the same shape and dtype.

    Equivalent to ``entmax.sparsemax(x, dim)`` of the ``entmax`` package and
    to :func:`softmaxbook.reference.sparsemax`:

    >>> import numpy as np
    >>> import torch
    >>> import softmaxbook as sb
    >>> from softmaxbook import reference
    >>> sb.sparsemax(torch.tensor([1.0, 0.8, -1.0]))  # tau = 0.4
    tensor([0.6000, 0.4000, 0.0000])
    >>> x = torch.randn(4, 10, dtype=torch.float64)
    >>> np.allclose(sb.sparsemax(x).numpy(), reference.sparsemax(x.numpy()))
    True

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
    return _Sparsemax.apply(x, dim)


@normalizer(sparse=True, sums_to_one=True)
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
    threshold is exact: the sort-based formula on the scores that can be in
    the support, those within 2 of the row maximum, thinned by Newton steps
    (on the maxima of blocks of keys, then on the keys left); rows of at
    most 128 keys, and rows with many keys near the maximum, are sorted whole
    (see the module docstring).

    Shapes: ``x`` is ``(..., N)``; the result has the same shape and dtype.

    Equivalent to ``entmax.entmax15(x, dim)`` of the ``entmax`` package, and
    to ``entmax_bisect(x, alpha=1.5, dim)`` up to the bisection's tolerance:

    >>> import torch
    >>> import softmaxbook as sb
    >>> x = torch.randn(4, 10, dtype=torch.float64)
    >>> torch.allclose(sb.entmax15(x), sb.entmax_bisect(x, alpha=1.5), atol=1e-10)
    True

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
    return _Entmax15.apply(x, dim)


# --------------------------------------------------------------------------------------
# alpha-entmax by bisection
# --------------------------------------------------------------------------------------


class _EntmaxBisect(RowwiseFunction):
    @staticmethod
    def forward(x: Tensor, dim: int, alpha: float, n_iter: int) -> Tensor:
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
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        _, ctx.dim, ctx.alpha, _ = inputs
        ctx.save_for_backward(output)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        (p,) = ctx.saved_tensors
        # 1/g''(p) = p^(2 - alpha) on the support (Peters et al., 2019, Prop. 1).
        s = torch.where(p > 0, p.clamp_min(0) ** (2 - ctx.alpha), torch.zeros_like(p))
        return _support_backward(grad, s, ctx.dim), None, None, None


def _bisect_options(
    x: Tensor, dim: int, *, alpha: float, n_iter: int
) -> dict[str, float | int]:
    if isinstance(alpha, bool) or not isinstance(alpha, Real):
        raise TypeError(f"alpha must be a real number > 1, got {type(alpha).__name__}")
    if not (math.isfinite(alpha) and alpha > 1):
        raise ValueError(
            f"alpha must be a finite number > 1, got {alpha}; "
            "alpha = 1 is softmax: use softmax(x) instead"
        )
    return {"alpha": float(alpha), "n_iter": check_positive_int(n_iter, "n_iter")}


@normalizer(sparse=True, sums_to_one=True, options=_bisect_options)
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
    ``entmax`` package; ``alpha = 2`` is sparsemax:

    >>> import torch
    >>> import softmaxbook as sb
    >>> x = torch.randn(4, 10, dtype=torch.float64)
    >>> torch.allclose(sb.entmax_bisect(x, alpha=2.0), sb.sparsemax(x), atol=1e-10)
    True

    Parameters
    ----------
    x : Tensor
        Scores, any floating dtype and device.
    alpha : float
        :math:`\alpha > 1`. For :math:`\alpha = 1` use softmax.
    dim : int
        The dimension to normalize; negative values count from the end.
    n_iter : int
        Bisection steps: each halves the interval that holds the threshold,
        at first :math:`1 - (1/N)^{\alpha - 1} < 1` wide, so 50 bring it
        below :math:`2^{-50} \approx 9 \times 10^{-16}`.

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
    return _EntmaxBisect.apply(x, dim, alpha, n_iter)
