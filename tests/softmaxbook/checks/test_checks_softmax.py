"""softmaxbook.checks, the softmax family: each typical student mistake in softmax,
log-softmax, masked softmax, the softmax backward and sparsemax is caught with the right
message, and every correct implementation passes.

The mistakes below are the ones students make (and the book discusses): no max
subtraction, the wrong dimension, a mask used the wrong way round, a -1e9 fill, a
softmax backward without its sum term, a sparsemax threshold from unsorted scores, ...
Each test names the fragment of the message that a student needs to read to fix that
mistake. Attention, top-p, merging and entropy are in test_checks_attention.py; broken
functions, the report and its scores in test_checks_reports.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _checks_helpers import NEG_INF, _assert_caught, _assert_passes

import softmaxbook as sb
from softmaxbook import checks

# --------------------------------------------------------------------------------------
# Softmax


def softmax_stable(x):
    e = torch.exp(x - x.max(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1, keepdim=True)


def softmax_via_logsumexp(x):
    return torch.exp(x - torch.logsumexp(x, dim=-1, keepdim=True))


def softmax_amax_divide(x):
    shifted = x - x.amax(dim=-1, keepdim=True)
    return shifted.exp().div(shifted.exp().sum(-1, keepdim=True))


def softmax_numpy(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax_naive(x):
    e = torch.exp(x)
    return e / e.sum(dim=-1, keepdim=True)


def softmax_dim0(x):
    e = torch.exp(x - x.max(dim=0, keepdim=True).values)
    return e / e.sum(dim=0, keepdim=True)


def softmax_dim1(x):  # right for 2-D input only: the 4-D input reveals it
    return torch.softmax(x, dim=1 if x.dim() > 1 else 0)


def softmax_global_max(x):
    e = torch.exp(x - x.max())
    return e / e.sum(dim=-1, keepdim=True)


def softmax_mean(x):
    e = torch.exp(x - x.mean(dim=-1, keepdim=True))
    return e / e.sum(dim=-1, keepdim=True)


def softmax_sum_all(x):
    e = torch.exp(x - x.max(dim=-1, keepdim=True).values)
    return e / e.sum()


def softmax_no_keepdim(x):
    e = torch.exp(x - x.max(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1)


def softmax_in_place(x):
    x -= x.max(dim=-1, keepdim=True).values
    x.exp_()
    return x / x.sum(dim=-1, keepdim=True)


def softmax_float32(x):
    return torch.softmax(x.float(), dim=-1)


def softmax_through_numpy(x):
    return torch.from_numpy(softmax_numpy(x.numpy()))


def softmax_no_grad(x):
    with torch.no_grad():
        return torch.softmax(x, dim=-1)


SOFTMAX_MISTAKES = [
    (
        softmax_naive,
        [
            "With scores [1000, 0] (float64, overflow)",
            "returned [nan, 0]",
            "expected [1, 0]",
            "Subtract the row maximum before exp",
        ],
    ),
    (softmax_dim0, ["That is the result along dim=0", "dim=-1"]),
    (softmax_dim1, ["shape (2, 3, 4, 5)", "That is the result along dim=1"]),
    (softmax_global_max, ["rows on different scales", "each row's own maximum"]),
    (softmax_mean, ["not the mean"]),
    (softmax_sum_all, ["Your whole result sums to 1, not each row"]),
    (softmax_no_keepdim, ["raised RuntimeError", "keepdim=True"]),
    (softmax_in_place, ["changed its argument x in place", "x = x - m"]),
    (softmax_float32, ["returned float32; keep the input's dtype", ".to(x.dtype)"]),
    (softmax_through_numpy, ["Stay in torch"]),
    (softmax_no_grad, ["not connected to its inputs in autograd"]),
]


@pytest.mark.parametrize(
    "fn, fragments", SOFTMAX_MISTAKES, ids=lambda v: getattr(v, "__name__", "")
)
def test_softmax_mistakes_are_caught(fn, fragments):
    _assert_caught(checks.check_softmax(fn), fragments)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.softmax(x, dim=-1),
        softmax_stable,
        softmax_via_logsumexp,
        softmax_amax_divide,
        sb.softmax,
        sb.softmax_with_custom_backward,
        lambda x: torch.nn.functional.softmax(x, dim=-1),
    ],
)
def test_correct_softmaxes_pass(fn):
    _assert_passes(checks.check_softmax(fn))


def test_numpy_softmax():
    _assert_passes(checks.check_softmax(softmax_numpy, numpy=True))
    report = checks.check_softmax(
        lambda x: np.exp(x) / np.exp(x).sum(-1, keepdims=True), numpy=True
    )
    _assert_caught(report, ["Subtract the row maximum"])
    assert (
        "not checked with numpy=True: the gradient and the device" in str(report)
        or not report.ok
    )


# --------------------------------------------------------------------------------------
# Log-softmax


def log_softmax_of_softmax(x):
    return torch.log(torch.softmax(x, dim=-1))


def log_softmax_naive_lse(x):
    return x - torch.log(torch.exp(x).sum(dim=-1, keepdim=True))


def log_softmax_returns_softmax(x):
    return torch.softmax(x, dim=-1)


def log_softmax_dim0(x):
    return torch.log_softmax(x, dim=0)


def log_softmax_no_keepdim(x):
    return x - torch.logsumexp(x, dim=-1)


def log_softmax_stable(x):
    m = x.max(dim=-1, keepdim=True).values
    return x - m - torch.log(torch.exp(x - m).sum(dim=-1, keepdim=True))


def log_softmax_numpy(x):
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


LOG_SOFTMAX_MISTAKES = [
    (log_softmax_of_softmax, ["[1000, 0]", "-inf", "log(softmax(x))", "logsumexp"]),
    (log_softmax_naive_lse, ["Subtract the maximum inside the logsumexp"]),
    (log_softmax_returns_softmax, ["Those are the probabilities"]),
    (log_softmax_dim0, ["along dim=0"]),
    (log_softmax_no_keepdim, ["keepdim=True"]),
]


@pytest.mark.parametrize(
    "fn, fragments", LOG_SOFTMAX_MISTAKES, ids=lambda v: getattr(v, "__name__", "")
)
def test_log_softmax_mistakes_are_caught(fn, fragments):
    _assert_caught(checks.check_log_softmax(fn), fragments)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.log_softmax(x, dim=-1),
        log_softmax_stable,
        lambda x: x - torch.logsumexp(x, -1, keepdim=True),
        sb.log_softmax,
    ],
)
def test_correct_log_softmaxes_pass(fn):
    _assert_passes(checks.check_log_softmax(fn))


def test_numpy_log_softmax():
    _assert_passes(checks.check_log_softmax(log_softmax_numpy, numpy=True))


# --------------------------------------------------------------------------------------
# Masked softmax


def masked_correct(scores, mask):
    filled = scores.masked_fill(~mask, NEG_INF)
    empty = torch.isneginf(filled).all(dim=-1, keepdim=True)
    weights = torch.softmax(filled.masked_fill(empty, 0.0), dim=-1)
    return weights.masked_fill(empty, 0.0)


def masked_by_multiplying(scores, mask):
    # exp of the shifted scores times the 0/1 mask, renormalized with a guarded sum
    keep = mask.expand(scores.shape)
    m = scores.masked_fill(~keep, NEG_INF).amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(scores - m) * keep
    total = e.sum(dim=-1, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))


def masked_numpy(scores, mask):
    keep = np.broadcast_to(mask, scores.shape)
    filled = np.where(keep, scores, -np.inf)
    m = filled.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(filled - m)
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total > 0, total, 1.0)


def masked_flipped(scores, mask):
    return torch.softmax(scores.masked_fill(mask, NEG_INF), dim=-1)


def masked_minus_1e9(scores, mask):
    return torch.softmax(scores.masked_fill(~mask, -1e9), dim=-1)


def masked_inf_no_guard(scores, mask):
    return torch.softmax(scores.masked_fill(~mask, NEG_INF), dim=-1)


def masked_where_guard(scores, mask):
    # The forward pass gives zeros for an empty row (exp(x - (-inf)) * 0 is nan, and
    # where picks 0), but the nan reaches the scores' gradient.
    m = scores.masked_fill(~mask, NEG_INF).amax(dim=-1, keepdim=True)
    e = torch.exp(scores - m) * mask
    total = e.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, e / total, torch.zeros_like(e))


def masked_where_guard_after_fill(scores, mask):
    # Harmless, unlike the above: masked_fill's backward zeroes the gradient of the
    # masked scores, so the nan of the unselected branch never reaches them.
    e = torch.exp(
        scores.masked_fill(~mask, NEG_INF)
        - scores.masked_fill(~mask, NEG_INF).amax(dim=-1, keepdim=True)
    )
    total = e.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, e / total, torch.zeros_like(e))


def masked_nan_to_num(scores, mask):  # correct: masked_fill's backward zeroes the nan
    return torch.softmax(scores.masked_fill(~mask, NEG_INF), dim=-1).nan_to_num(0.0)


def masked_ignored(scores, mask):
    return torch.softmax(scores, dim=-1)


def masked_additive_zero_times_inf(scores, mask):
    return torch.softmax(scores + (~mask).to(scores.dtype) * NEG_INF, dim=-1)


def masked_in_place(scores, mask):
    scores.masked_fill_(~mask, NEG_INF)
    return masked_correct(scores, mask)


MASKED_MISTAKES = [
    (masked_flipped, ["True = may attend", "masked_fill(~mask"]),
    (masked_minus_1e9, ["spread evenly", "-1e9"]),
    (masked_minus_1e9, ["does not fit in float16"]),
    (masked_inf_no_guard, ["-inf - (-inf) = nan", "give it zeros"]),
    (masked_where_guard, ["torch.where(c, a, b) sends gradient into both branches"]),
    (masked_ignored, ["as if there were no mask"]),
    (masked_additive_zero_times_inf, ["0 * -inf is nan"]),
    (masked_in_place, ["changed its argument scores in place"]),
]


@pytest.mark.parametrize(
    "fn, fragments", MASKED_MISTAKES, ids=lambda v: getattr(v, "__name__", "")
)
def test_masked_softmax_mistakes_are_caught(fn, fragments):
    _assert_caught(checks.check_masked_softmax(fn), fragments)


@pytest.mark.parametrize(
    "fn",
    [
        masked_correct,
        masked_by_multiplying,
        sb.masked_softmax,
        masked_where_guard_after_fill,
        masked_nan_to_num,
    ],
)
def test_correct_masked_softmaxes_pass(fn):
    _assert_passes(checks.check_masked_softmax(fn))


def test_numpy_masked_softmax():
    _assert_passes(checks.check_masked_softmax(masked_numpy, numpy=True))


# --------------------------------------------------------------------------------------
# Softmax backward


def backward_einsum(s, g):
    return s * g - s * torch.einsum("...n,...n->...", s, g).unsqueeze(-1)


def backward_jacobian_product(s, g):
    jacobian = torch.diag_embed(s) - s.unsqueeze(-1) * s.unsqueeze(-2)
    return (jacobian @ g.unsqueeze(-1)).squeeze(-1)


def backward_numpy(s, g):
    return s * (g - (s * g).sum(axis=-1, keepdims=True))


def backward_missing_sum(s, g):
    return s * g


def backward_wrong_sign(s, g):
    return s * ((s * g).sum(dim=-1, keepdim=True) - g)


def backward_unweighted(s, g):
    return s * (g - g.sum(dim=-1, keepdim=True))


def backward_from_scores(s, g):
    p = torch.softmax(s, dim=-1)
    return p * (g - (p * g).sum(dim=-1, keepdim=True))


def backward_full_jacobian(s, g):
    return torch.diag_embed(s) - s.unsqueeze(-1) * s.unsqueeze(-2)


def backward_dim0(s, g):
    return s * (g - (s * g).sum(dim=0, keepdim=True))


def backward_no_keepdim(s, g):
    return s * (g - (s * g).sum(dim=-1))


def backward_in_place(s, g):
    g -= (s * g).sum(dim=-1, keepdim=True)
    return s * g


def backward_not_multiplied(s, g):
    return g - (s * g).sum(dim=-1, keepdim=True)


BACKWARD_MISTAKES = [
    (backward_missing_sum, ["That is s * g", "misses the term"]),
    (backward_wrong_sign, ["The sign is flipped"]),
    (backward_unweighted, ["weighted by s"]),
    (backward_from_scores, ["s is already the softmax output", "sb.softmax_backward"]),
    (backward_full_jacobian, ["returned shape (4, 4); expected (4,)", "full Jacobian"]),
    (backward_dim0, ["summed s * g along dim=0"]),
    (backward_no_keepdim, ["keepdim=True"]),
    (backward_in_place, ["changed its argument grad_output in place"]),
    (backward_not_multiplied, ["Multiply by s"]),
]


@pytest.mark.parametrize(
    "fn, fragments", BACKWARD_MISTAKES, ids=lambda v: getattr(v, "__name__", "")
)
def test_softmax_backward_mistakes_are_caught(fn, fragments):
    _assert_caught(checks.check_softmax_backward(fn), fragments)


@pytest.mark.parametrize(
    "fn", [sb.softmax_backward, backward_einsum, backward_jacobian_product]
)
def test_correct_softmax_backwards_pass(fn):
    _assert_passes(checks.check_softmax_backward(fn))


def test_numpy_softmax_backward():
    report = checks.check_softmax_backward(backward_numpy, numpy=True)
    _assert_passes(report)
    assert report.checked[-1] == "not checked with numpy=True: the device"
    assert "the device kept" not in report.checked


# --------------------------------------------------------------------------------------
# Sparsemax


def sparsemax_sort(x, dim=-1):
    """The chapter's version (Martins & Astudillo, 2016, Algorithm 1)."""
    z, _ = torch.sort(x, dim=dim, descending=True)
    k = torch.arange(1, x.shape[dim] + 1, dtype=x.dtype, device=x.device)
    cumsum = z.cumsum(dim)
    k_max = (1 + k * z > cumsum).sum(dim, keepdim=True)
    tau = (cumsum.gather(dim, k_max - 1) - 1) / k_max
    return torch.clamp(x - tau, min=0)


def sparsemax_bisection(x):
    """tau by bisection on sum(max(x - tau, 0)) = 1, then exactly from the support."""
    lo = x.max(dim=-1, keepdim=True).values - 1
    hi = x.max(dim=-1, keepdim=True).values
    for _ in range(80):
        mid = (lo + hi) / 2
        over = torch.clamp(x - mid, min=0).sum(-1, keepdim=True) > 1
        lo, hi = torch.where(over, mid, lo), torch.where(over, hi, mid)
    support = x > lo
    tau = ((x * support).sum(-1, keepdim=True) - 1) / support.sum(-1, keepdim=True)
    return torch.clamp(x - tau, min=0)


def sparsemax_numpy(x):
    z = -np.sort(-x, axis=-1)
    k = np.arange(1, x.shape[-1] + 1)
    cumsum = np.cumsum(z, axis=-1)
    k_max = (1 + k * z > cumsum).sum(axis=-1, keepdims=True)
    tau = (np.take_along_axis(cumsum, k_max - 1, axis=-1) - 1) / k_max
    return np.maximum(x - tau, 0.0).astype(x.dtype)


def sparsemax_unsorted(x):
    k = torch.arange(1, x.shape[-1] + 1, dtype=x.dtype)
    cumsum = x.cumsum(-1)
    k_max = (1 + k * x > cumsum).sum(-1, keepdim=True)
    tau = (cumsum.gather(-1, k_max - 1) - 1) / k_max
    return torch.clamp(x - tau, min=0)


def sparsemax_zero_based_k(x):
    z, _ = torch.sort(x, dim=-1, descending=True)
    k = torch.arange(0, x.shape[-1], dtype=x.dtype)  # off by one: k starts at 0
    cumsum = z.cumsum(-1)
    k_max = (1 + k * z > cumsum).sum(-1, keepdim=True)
    tau = (cumsum.gather(-1, k_max - 1) - 1) / k_max
    return torch.clamp(x - tau, min=0)


def sparsemax_no_clip(x):
    z, _ = torch.sort(x, dim=-1, descending=True)
    k = torch.arange(1, x.shape[-1] + 1, dtype=x.dtype)
    cumsum = z.cumsum(-1)
    k_max = (1 + k * z > cumsum).sum(-1, keepdim=True)
    tau = (cumsum.gather(-1, k_max - 1) - 1) / k_max
    return x - tau


def sparsemax_epsilon(x):
    return sparsemax_sort(x) + 1e-13


def sparsemax_detached_tau(x):
    z, _ = torch.sort(x, dim=-1, descending=True)
    k = torch.arange(1, x.shape[-1] + 1, dtype=x.dtype)
    cumsum = z.cumsum(-1)
    k_max = (1 + k * z > cumsum).sum(-1, keepdim=True)
    tau = ((cumsum.gather(-1, k_max - 1) - 1) / k_max).detach()
    return torch.clamp(x - tau, min=0)


def sparsemax_is_softmax(x):
    return torch.softmax(x, dim=-1)


SPARSEMAX_MISTAKES = [
    (
        sparsemax_unsorted,
        ["right when the scores come already sorted", "descending=True"],
    ),
    (sparsemax_zero_based_k, ["support", "counting from 1"]),
    (sparsemax_no_clip, ["never negative", "max(x - tau, 0)"]),
    (sparsemax_epsilon, ["exactly 0", "do not add an epsilon"]),
    (sparsemax_detached_tau, ["gradient with respect to x", "outside autograd"]),
    (sparsemax_is_softmax, ["That is the softmax"]),
]


@pytest.mark.parametrize(
    "fn, fragments", SPARSEMAX_MISTAKES, ids=lambda v: getattr(v, "__name__", "")
)
def test_sparsemax_mistakes_are_caught(fn, fragments):
    _assert_caught(checks.check_sparsemax(fn), fragments)


@pytest.mark.parametrize("fn", [sparsemax_sort, sparsemax_bisection, sb.sparsemax])
def test_correct_sparsemaxes_pass(fn):
    _assert_passes(checks.check_sparsemax(fn))


def test_sparsemax_of_the_entmax_package_passes():
    entmax = pytest.importorskip("entmax")  # a test dependency (pyproject's [test])
    _assert_passes(checks.check_sparsemax(lambda x: entmax.sparsemax(x, dim=-1)))


def test_numpy_sparsemax():
    _assert_passes(checks.check_sparsemax(sparsemax_numpy, numpy=True))
