"""softmaxbook.checks: each typical student mistake is caught with the right message,
every correct implementation passes, and no broken function crashes a checker.

The mistakes below are the ones students make (and the book discusses): no max
subtraction, the wrong dimension, a mask used the wrong way round, a -1e9 fill,
a missing scale, a softmax backward without its sum term, a sparsemax threshold
from unsorted scores, ... Each test names the fragment of the message that a
student needs to read to fix that mistake.
"""

from __future__ import annotations

import doctest
import math
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import softmaxbook as sb
from softmaxbook import checks
from softmaxbook.checks._session import Session
from softmaxbook.checks.sampling import _top_p_inputs

NEG_INF = float("-inf")


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
# Attention


def attention_correct(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return sb.masked_softmax(scores, mask) @ v


def attention_torch(q, k, v, mask=None):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def attention_einsum(q, k, v, mask=None):
    scores = torch.einsum("...ld,...sd->...ls", q * q.shape[-1] ** -0.5, k)
    return torch.einsum(
        "...ls,...sv->...lv",
        masked_correct(scores, mask) if mask is not None else torch.softmax(scores, -1),
        v,
    )


def attention_numpy(q, k, v, mask=None):
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is None:
        mask = np.ones(scores.shape, dtype=bool)
    return masked_numpy(scores, mask) @ v


def attention_unscaled(q, k, v, mask=None):
    return sb.masked_softmax(q @ k.transpose(-2, -1), mask) @ v


def attention_scaled_by_d(q, k, v, mask=None):
    return sb.masked_softmax(q @ k.transpose(-2, -1) / q.shape[-1], mask) @ v


def attention_scaled_by_dv(q, k, v, mask=None):
    return sb.masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(v.shape[-1]), mask) @ v


def attention_over_queries(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-2) @ v


def attention_no_transpose(q, k, v, mask=None):
    return torch.softmax(q @ k / math.sqrt(q.shape[-1]), dim=-1) @ v


def attention_flipped_mask(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return sb.masked_softmax(scores, None if mask is None else ~mask) @ v


def attention_without_mask_argument(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ v


def attention_minus_1e9(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9)
    return torch.softmax(scores, dim=-1) @ v


def attention_naive_exp(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, NEG_INF)
    e = torch.exp(scores)
    total = e.sum(-1, keepdim=True)
    return torch.where(total > 0, e / total, 0.0) @ v


ATTENTION_MISTAKES = [
    (
        attention_unscaled,
        ["without the scale", "multiply the scores q @ k^T by 1/sqrt(D)"],
    ),
    (attention_scaled_by_d, ["You scaled the scores by 1/D; the scale is 1/sqrt(D)"]),
    (attention_scaled_by_dv, ["the values' dimension"]),
    (attention_over_queries, ["normalized over the queries (dim=-2)"]),
    (attention_no_transpose, ["raised RuntimeError", "k.transpose(-2, -1)"]),
    (attention_flipped_mask, ["True = may attend"]),
    (attention_without_mask_argument, ["Accept the mask as a keyword argument"]),
    (attention_minus_1e9, ["average of all the values", "-1e9"]),
    (attention_naive_exp, ["up to 1000", "Subtract the row maximum"]),
]


@pytest.mark.parametrize(
    "fn, fragments", ATTENTION_MISTAKES, ids=lambda v: getattr(v, "__name__", "")
)
def test_attention_mistakes_are_caught(fn, fragments):
    _assert_caught(checks.check_attention(fn), fragments)


@pytest.mark.parametrize(
    "fn",
    [
        attention_correct,
        attention_einsum,
        lambda q, k, v, mask=None: sb.scaled_dot_product_attention(q, k, v, mask=mask),
    ],
)
def test_correct_attentions_pass(fn):
    _assert_passes(checks.check_attention(fn))


def _sdpa_zeros_empty_rows() -> bool:
    """Whether this torch's SDPA gives zeros (not nan) for a query with no key."""
    q = torch.ones(1, 2, 1)  # two queries, one key; the second query may not see it
    mask = torch.tensor([[[True], [False]]])
    out = torch.nn.functional.scaled_dot_product_attention(q, q[:, :1], q[:, :1], mask)
    return not out.isnan().any()


def test_torch_sdpa_is_judged_by_its_empty_rows():
    """Recent torch zeros a fully masked row (the test above); older torch gives nan,
    and then the checker must say so rather than pass it."""
    report = checks.check_attention(attention_torch)
    if _sdpa_zeros_empty_rows():
        _assert_passes(report)
    else:
        _assert_caught(report, ["must be zeros, not nan"])


def test_attention_without_masks():
    """Chapter 3's attention takes no mask: masks=False never passes one."""

    def unmasked(q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1) @ v

    report = checks.check_attention(unmasked, masks=False)
    _assert_passes(report)
    assert report.checked[-1] == "not checked with masks=False: masks"
    _assert_caught(checks.check_attention(unmasked), ["Accept the mask as a keyword"])
    _assert_caught(
        checks.check_attention(attention_unscaled, masks=False), ["without the scale"]
    )


def test_numpy_attention():
    _assert_passes(checks.check_attention(attention_numpy, numpy=True))

    def promotes(q, k, v, mask=None):  # np.sqrt returns a float64 NumPy scalar
        scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
        keep = np.ones(scores.shape, dtype=bool) if mask is None else mask
        return masked_numpy(scores, keep) @ v

    report = checks.check_attention(promotes, numpy=True)
    if (np.ones(2, np.float32) / np.sqrt(4)).dtype == np.float64:  # NumPy >= 2 (NEP 50)
        _assert_caught(
            report, ["returned float64; keep the input's dtype", "use math.sqrt"]
        )
    else:  # NumPy 1.x casts by value: the float64 scalar keeps float32: no error
        _assert_passes(report)


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


# --------------------------------------------------------------------------------------
# Top-p


def top_p_chapter(z, p):
    """The chapter's version: keep a token while the mass ranked above it is < p."""
    zs = torch.sort(z, dim=-1, descending=True).values
    ps = torch.softmax(zs, dim=-1)
    mass_before = torch.cumsum(ps, dim=-1) - ps
    m = (mass_before < p).sum(dim=-1, keepdim=True)
    return z.masked_fill(z < zs.gather(-1, m - 1), NEG_INF)


def top_p_scatter(z, p):
    """The usual library formulation: remove tokens past the mass p, shifted by one."""
    sorted_z, order = torch.sort(z, dim=-1, descending=True)
    cumulative = torch.softmax(sorted_z, dim=-1).cumsum(dim=-1)
    remove = cumulative > p
    remove[..., 1:] = remove[..., :-1].clone()
    remove[..., 0] = False
    return z.masked_fill(remove.scatter(-1, order, remove), NEG_INF)


def top_p_numpy(z, p):
    order = np.argsort(-z, axis=-1)
    probs = np.take_along_axis(np.exp(z - z.max(-1, keepdims=True)), order, -1)
    probs /= probs.sum(-1, keepdims=True)
    keep_sorted = np.cumsum(probs, -1) - probs < p
    keep = np.zeros(z.shape, dtype=bool)
    np.put_along_axis(keep, order, keep_sorted, -1)
    return np.where(keep, z, -np.inf).astype(z.dtype)


def top_p_inclusive(z, p):
    zs, order = torch.sort(z, dim=-1, descending=True)
    keep_sorted = torch.softmax(zs, dim=-1).cumsum(-1) < p
    return z.masked_fill(~keep_sorted.scatter(-1, order, keep_sorted), NEG_INF)


def top_p_one_extra(z, p):
    zs, order = torch.sort(z, dim=-1, descending=True)
    ps = torch.softmax(zs, dim=-1)
    keep_sorted = torch.cumsum(ps, -1) - ps < p
    keep_sorted[..., 1:] = keep_sorted[..., 1:] | keep_sorted[..., :-1]
    return z.masked_fill(~keep_sorted.scatter(-1, order, keep_sorted), NEG_INF)


def top_p_sorted_output(z, p):
    return torch.sort(top_p_chapter(z, p), dim=-1, descending=True).values


def top_p_zero_fill(z, p):
    kept = top_p_chapter(z, p)
    return torch.where(torch.isinf(kept), 0.0, kept)


def top_p_probabilities(z, p):
    return torch.softmax(top_p_chapter(z, p), dim=-1)


def top_p_in_place(z, p):
    return z.masked_fill_(torch.isinf(top_p_chapter(z, p)), NEG_INF)


def top_p_first_row_threshold(z, p):
    flat = z.reshape(-1, z.shape[-1])
    threshold = top_p_chapter(flat[0], p)
    cut = threshold[torch.isfinite(threshold)].min().item()
    return z.masked_fill(z < cut, NEG_INF)


TOP_P_MISTAKES = [
    (top_p_inclusive, ["dropped the token that makes the kept mass reach p = 0.7"]),
    (top_p_inclusive, ["Every token was removed", "always kept"]),
    (top_p_one_extra, ["one token too many"]),
    (top_p_sorted_output, ["in sorted order"]),
    (top_p_zero_fill, ["must be -inf, not 0"]),
    (top_p_probabilities, ["Those are probabilities"]),
    (top_p_in_place, ["changed its argument logits in place"]),
    (top_p_first_row_threshold, ["tokens per row where the nucleus has"]),
]


@pytest.mark.parametrize(
    "fn, fragments", TOP_P_MISTAKES, ids=lambda v: getattr(v, "__name__", "")
)
def test_top_p_mistakes_are_caught(fn, fragments):
    _assert_caught(checks.check_top_p_filter(fn), fragments)


@pytest.mark.parametrize("fn", [sb.top_p_filter, top_p_chapter, top_p_scatter])
def test_correct_top_p_filters_pass(fn):
    _assert_passes(checks.check_top_p_filter(fn))


def test_numpy_top_p():
    _assert_passes(checks.check_top_p_filter(top_p_numpy, numpy=True))


def test_top_p_inputs_stay_clear_of_the_boundary():
    """No cumulative mass of a checked row lies within float32 rounding of p."""
    for _, z, p in _top_p_inputs():
        probs = torch.softmax(
            torch.sort(z.double(), dim=-1, descending=True).values, -1
        )
        before = probs.cumsum(-1) - probs
        assert float((before - p).abs().min()) > 1e-4
        rows = z.reshape(-1, z.shape[-1])
        assert all(len(torch.unique(row)) == row.numel() for row in rows)  # no ties


# --------------------------------------------------------------------------------------
# Merging partial attention results


def merge_correct(out_a, lse_a, out_b, lse_b):
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    wa, wb = torch.exp(lse_a - m), torch.exp(lse_b - m)
    total = wa + wb
    lse = m + torch.log(total)
    total = torch.where(total > 0, total, torch.ones_like(total))
    return (wa / total)[..., None] * out_a + (wb / total)[..., None] * out_b, lse


def merge_logaddexp(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    share_a = torch.where(torch.isneginf(lse_a), 0.0, torch.exp(lse_a - safe))
    share_b = torch.where(torch.isneginf(lse_b), 0.0, torch.exp(lse_b - safe))
    return share_a[..., None] * out_a + share_b[..., None] * out_b, lse


def merge_numpy(out_a, lse_a, out_b, lse_b):
    lse = np.logaddexp(lse_a, lse_b)
    with np.errstate(invalid="ignore"):
        wa = np.where(np.isneginf(lse_a), 0.0, np.exp(lse_a - lse))[..., None]
        wb = np.where(np.isneginf(lse_b), 0.0, np.exp(lse_b - lse))[..., None]
    return (wa * out_a + wb * out_b).astype(out_a.dtype), lse


def merge_naive_exp(out_a, lse_a, out_b, lse_b):
    wa, wb = torch.exp(lse_a), torch.exp(lse_b)
    return (wa[..., None] * out_a + wb[..., None] * out_b) / (wa + wb)[
        ..., None
    ], torch.log(wa + wb)


def merge_unnormalized(out_a, lse_a, out_b, lse_b):
    return (
        lse_a.exp()[..., None] * out_a + lse_b.exp()[..., None] * out_b,
        torch.logaddexp(lse_a, lse_b),
    )


def merge_average(out_a, lse_a, out_b, lse_b):
    return (out_a + out_b) / 2, torch.logaddexp(lse_a, lse_b)


def merge_lse_max(out_a, lse_a, out_b, lse_b):
    out, _ = merge_correct(out_a, lse_a, out_b, lse_b)
    return out, torch.maximum(lse_a, lse_b)


def merge_unguarded(out_a, lse_a, out_b, lse_b):
    m = torch.maximum(lse_a, lse_b)
    wa, wb = torch.exp(lse_a - m), torch.exp(lse_b - m)
    return (wa[..., None] * out_a + wb[..., None] * out_b) / (wa + wb)[
        ..., None
    ], m + torch.log(wa + wb)


def merge_in_place(out_a, lse_a, out_b, lse_b):
    out, lse = merge_correct(out_a, lse_a, out_b, lse_b)
    out_a.copy_(out)
    return out_a, lse


MERGE_MISTAKES = [
    (merge_naive_exp, ["+-1000", "shift by m = max(lse_a, lse_b)"]),
    (merge_unnormalized, ["share of the total mass"]),
    (merge_average, ["An average ignores"]),
    (merge_lse_max, ["lse", "log(exp(lse_a) + exp(lse_b))"]),
    (merge_unguarded, ["both parts are empty", "-inf - (-inf) is nan"]),
    (merge_in_place, ["changed its argument out_a in place"]),
]


@pytest.mark.parametrize(
    "fn, fragments", MERGE_MISTAKES, ids=lambda v: getattr(v, "__name__", "")
)
def test_merge_mistakes_are_caught(fn, fragments):
    _assert_caught(checks.check_merge_attention_states(fn), fragments)


@pytest.mark.parametrize(
    "fn", [sb.merge_attention_states, merge_correct, merge_logaddexp]
)
def test_correct_merges_pass(fn):
    _assert_passes(checks.check_merge_attention_states(fn))


def test_numpy_merge():
    _assert_passes(checks.check_merge_attention_states(merge_numpy, numpy=True))


# --------------------------------------------------------------------------------------
# Attention entropy


def entropy_where(w):
    plogp = torch.where(w > 0, w * torch.log(torch.where(w > 0, w, 1.0)), 0.0)
    live = w.sum(-1) > 0
    return -plogp.sum(-1).sum(-1) / live.sum(-1).clamp(min=1)


def entropy_epsilon(w):
    rows = -(w * torch.log(w + 1e-12)).sum(-1)
    live = w.sum(-1) > 0
    return rows.sum(-1) / live.sum(-1).clamp(min=1)


def entropy_numpy(w):
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(w > 0, w * np.log(np.where(w > 0, w, 1.0)), 0.0)
    live = w.sum(-1) > 0
    return (-plogp.sum(-1).sum(-1) / np.maximum(live.sum(-1), 1)).astype(w.dtype)


def entropy_plogp(w):
    rows = -(w * torch.log(w)).sum(-1)
    return rows.mean(-1)


def entropy_all_rows(w):
    return -(w * torch.log(w + 1e-12)).sum(-1).mean(-1)


def entropy_bits(w):
    return entropy_where(w) / math.log(2)


def entropy_per_row(w):
    return -torch.where(w > 0, w * torch.log(torch.where(w > 0, w, 1.0)), 0.0).sum(-1)


def entropy_sign(w):
    return -entropy_where(w)


def entropy_nan_to_num(w):
    rows = -(w * torch.log(w)).nan_to_num(0.0).sum(-1)
    live = w.sum(-1) > 0
    return rows.sum(-1) / live.sum(-1).clamp(min=1)


def entropy_no_clamp(w):
    plogp = torch.where(w > 0, w * torch.log(torch.where(w > 0, w, 1.0)), 0.0)
    live = w.sum(-1) > 0
    return -plogp.sum(-1).sum(-1) / live.sum(-1)


ENTROPY_MISTAKES = [
    (entropy_plogp, ["causal map", "0 log 0 = 0"]),
    (entropy_all_rows, ["rows of zeros", "leave them out of the mean"]),
    (entropy_bits, ["in bits"]),
    (entropy_per_row, ["one entropy per row"]),
    (entropy_sign, ["The sign is flipped"]),
    (entropy_nan_to_num, ["gradient", "contains nan or inf", "0 log 0 = 0"]),
    (entropy_no_clamp, ["map of zeros", "clamp the count of live rows at 1"]),
]


@pytest.mark.parametrize(
    "fn, fragments", ENTROPY_MISTAKES, ids=lambda v: getattr(v, "__name__", "")
)
def test_entropy_mistakes_are_caught(fn, fragments):
    _assert_caught(checks.check_attention_entropy(fn), fragments)


@pytest.mark.parametrize("fn", [sb.attention_entropy, entropy_where, entropy_epsilon])
def test_correct_entropies_pass(fn):
    _assert_passes(checks.check_attention_entropy(fn))


def test_numpy_entropy():
    _assert_passes(checks.check_attention_entropy(entropy_numpy, numpy=True))


# --------------------------------------------------------------------------------------
# Broken functions never crash a checker

ALL_CHECKERS = [
    checks.check_softmax,
    checks.check_log_softmax,
    checks.check_masked_softmax,
    checks.check_attention,
    checks.check_softmax_backward,
    checks.check_sparsemax,
    checks.check_top_p_filter,
    checks.check_merge_attention_states,
    checks.check_attention_entropy,
]


def _raises(*args, **kwargs):
    raise ZeroDivisionError("division by zero")


def _returns_list(*args, **kwargs):
    return [0.25, 0.25, 0.25, 0.25]


def _returns_none(*args, **kwargs):
    return None


def _wrong_shape(*args, **kwargs):
    return args[0].sum(-1)


def _not_implemented(*args, **kwargs):
    raise NotImplementedError("write your function here")


def _returns_numpy(*args, **kwargs):
    return np.zeros(3)


def _integer(*args, **kwargs):
    return torch.zeros(args[0].shape, dtype=torch.long)


BROKEN = [
    (_raises, "raised ZeroDivisionError: division by zero"),
    (_returns_list, "returned a list; expected a floating-point torch.Tensor"),
    (
        _returns_none,
        "returned None; expected a floating-point torch.Tensor: did you "
        "forget the return statement?",
    ),
    (_wrong_shape, "returned shape"),
    (_not_implemented, "the stub still raises NotImplementedError"),
    (_returns_numpy, "stay in torch"),
    (_integer, "of dtype int64"),
]


@pytest.mark.parametrize("checker", ALL_CHECKERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    "fn, fragment", BROKEN, ids=lambda v: getattr(v, "__name__", "")
)
def test_broken_functions_become_problems(checker, fn, fragment):
    report = checker(fn)
    assert not report.ok and not report
    text = " ".join(" ".join(report.problems).split())
    if (
        checker is checks.check_merge_attention_states
        and fn is not _raises
        and fn is not _not_implemented
    ):
        fragment = "return a pair (out, lse)"  # a single value where a pair is due
    assert fragment in text, text
    # the first input failed: the report shows that problem alone
    assert report.problems[-1] == (
        "The other checks are not reported: fix the problem above first."
    )
    assert report.problems[0].startswith("With ")


def test_a_function_that_fails_only_on_some_inputs_gets_every_other_check():
    def fails_on_half(x):
        if x.dtype == torch.float16:
            raise TypeError("no half for me")
        return torch.softmax(x, dim=-1)

    report = checks.check_softmax(fails_on_half)
    assert len(report.problems) == 1
    assert report.problems[0].startswith(
        "With random scores of shape (3, 7) (float16), "
        "your softmax raised TypeError: no half for me."
    )


@pytest.mark.parametrize(
    "checker, fn",
    [
        (checks.check_softmax, softmax_stable),
        (checks.check_log_softmax, log_softmax_stable),
        (checks.check_masked_softmax, masked_correct),
        (checks.check_attention, attention_correct),
        (checks.check_softmax_backward, backward_einsum),
        (checks.check_sparsemax, sparsemax_sort),
        (checks.check_top_p_filter, top_p_chapter),
        (checks.check_merge_attention_states, merge_correct),
        (checks.check_attention_entropy, entropy_where),
    ],
    ids=lambda v: v.__name__,
)
def test_the_device_check_runs_when_asked(checker, fn, monkeypatch):
    """On a CPU-only machine the device check runs only with an explicit device."""
    calls = []
    original = Session.on_device

    def counted(self, *args, **kwargs):
        calls.append(self.device)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Session, "on_device", counted)
    _assert_passes(checker(fn, device="cpu"))
    assert calls == [torch.device("cpu")]


def test_a_result_on_another_device_is_a_problem():
    report = checks.check_softmax(lambda x: torch.softmax(x, -1).to("meta"))
    _assert_caught(
        report,
        [
            "given tensors on cpu, your softmax returned a tensor on meta",
            "do not move the result",
        ],
    )


def test_an_in_place_change_does_not_leak_into_the_next_check():
    """fn gets copies: after its in-place change the other inputs are still right."""
    report = checks.check_top_p_filter(top_p_in_place)
    assert len(report.problems) == 1, str(report)
    assert "changed its argument logits in place" in report.problems[0]
    report = checks.check_merge_attention_states(merge_in_place)
    assert [p.split(",")[0] for p in report.problems] == [
        "With parts over keys 0-1 and 2-5 of random q (2",  # the in-place change
        "With parts over keys 0-1 and 2-5 of random q (2",  # autograd refuses it
    ], str(report)


def test_not_callable_is_an_error_of_the_caller():
    with pytest.raises(TypeError, match="fn must be a callable"):
        checks.check_softmax("softmax")
    with pytest.raises(TypeError, match="numpy must be True or False"):
        checks.check_softmax(softmax_stable, numpy="yes")


# --------------------------------------------------------------------------------------
# The report


def test_report_api():
    good = checks.check_softmax(softmax_stable)
    assert good.ok and bool(good) and good.problems == []
    assert str(good).startswith("check_softmax(softmax_stable): all checks passed.")
    assert "overflow [1000, 0]" in str(good)
    good.raise_if_failed()  # does not raise

    bad = checks.check_softmax(softmax_naive)
    assert not bad.ok and not bool(bad)
    assert str(bad).startswith(
        "check_softmax(softmax_naive): 1 problem\n 1. With scores"
    )
    with pytest.raises(AssertionError) as raised:
        bad.raise_if_failed()
    assert str(raised.value) == str(bad)
    for problem in bad.problems:
        assert " ".join(problem.split()) in " ".join(str(raised.value).split())


# --------------------------------------------------------------------------------------
# Scores: per-check results that a grade can be built on

CORRECT = [
    (checks.check_softmax, softmax_stable),
    (checks.check_log_softmax, log_softmax_stable),
    (checks.check_masked_softmax, masked_correct),
    (checks.check_attention, attention_correct),
    (checks.check_softmax_backward, backward_einsum),
    (checks.check_sparsemax, sparsemax_sort),
    (checks.check_top_p_filter, top_p_chapter),
    (checks.check_merge_attention_states, merge_correct),
    (checks.check_attention_entropy, entropy_where),
    (checks.check_sink_softmax, sb.sink_softmax),
]


def _identity(*args, **kwargs):
    return args[0]


def _names(report):
    return [r.name for r in report.results]


@pytest.mark.parametrize("checker, correct", CORRECT, ids=lambda v: v.__name__)
def test_every_function_gets_the_same_checks_and_a_stub_scores_zero(checker, correct):
    good = checker(correct)
    assert good.ok and good.max_score >= 6
    assert good.score == good.max_score and all(r.passed for r in good.results)
    assert all(r.message == "" for r in good.results)
    stub = checker(_not_implemented)
    assert stub.score == 0 and not any(r.passed for r in stub.results)
    for fn in (_not_implemented, _identity, _raises, _returns_none, _wrong_shape):
        report = checker(fn)
        # the same checks, whatever the function does: a fixed max_score
        assert _names(report) == _names(good), fn.__name__
        assert 0 <= report.score < report.max_score == good.max_score
        for result in report.results:
            assert result.passed == (result.message == ""), result
    assert len(set(_names(good))) == len(good.results)


def test_the_stub_no_longer_beats_the_identity():
    # Counted as problems, an untouched stub (2: its exception, "not reported")
    # looked better than the identity (3 or more); scored, it is never above.
    stub, identity = (checks.check_softmax(f) for f in (_not_implemented, _identity))
    assert len(stub.problems) == 2 < len(identity.problems)  # the old measure
    assert stub.score == 0 == identity.score
    for checker in (checks.check_attention, checks.check_softmax_backward):
        stub, identity = checker(_not_implemented), checker(_identity)
        assert stub.score == 0 <= identity.score < identity.max_score
    # each passed check adds its points: a stable softmax > a naive one > identity
    naive = checks.check_softmax(softmax_naive)
    stable = checks.check_softmax(softmax_stable)
    identity = checks.check_softmax(_identity)
    assert identity.score < naive.score < stable.score == stable.max_score
    failed = [r.name for r in naive.results if not r.passed]
    assert failed and all(
        "overflow" in n or "underflow" in n or "different scales" in n for n in failed
    ), failed

    # a function that fails only on float16 loses that one check
    def fails_on_half(x):
        if x.dtype == torch.float16:
            raise TypeError("no half for me")
        return torch.softmax(x, dim=-1)

    half = checks.check_softmax(fails_on_half)
    assert half.score == half.max_score - 1
    (lost,) = [r for r in half.results if not r.passed]
    assert lost.name == "random scores of shape (3, 7) (float16)"
    assert lost.message == half.problems[0]


def test_a_scored_report_keeps_its_public_path_and_pickles():
    # an autograder may store reports: their classes keep the public path
    report = checks.check_softmax(softmax_naive)
    assert type(report.results[0]) is checks.CheckResult
    assert repr(report.results[0]).startswith("CheckResult(name='scores [1, 0.5")
    assert checks.CheckResult.__module__ == "softmaxbook.checks"
    again = pickle.loads(pickle.dumps(report))
    assert again == report and again.score == report.score < again.max_score
    assert checks.CheckResult("x", False, 2.5).score == 0
    assert checks.CheckResult("x", True, 2.5).score == 2.5


def test_a_stopped_check_still_scores_the_inputs_it_passes():
    # Wrong on the first, simplest input alone: the report shows that problem,
    # and the score counts every other check, which still ran.
    def fails_on_vectors(x):
        if x.dim() == 1:
            raise IndexError("tuple index out of range")
        return torch.softmax(x, dim=-1)

    report = checks.check_softmax(fails_on_vectors)
    assert len(report.problems) == 2 and report.checked == []
    assert report.problems[1] == (
        "The other checks are not reported: fix the problem above first."
    )
    failed = {r.name for r in report.results if not r.passed}
    assert failed == {
        "scores [1, 0.5, 2.5, -0.1] (float64)",
        "random scores of shape (6,) (float64)",
        "scores [1000, 0] (float64, overflow)",
        "scores [1000, 0] (float32, overflow)",
        "scores [-1000, -1000] (float64, underflow)",
        "scores [-1000, -1000] (float32, underflow)",
        "scores [0, -inf, 1] (float64, a score of -inf)",
        "scores [0, -inf, 1] (float32, a score of -inf)",
    }
    assert report.score == report.max_score - len(failed) > 0


def test_a_wrong_forward_fails_the_gradient_check_too():
    report = checks.check_softmax(softmax_dim0)
    gradient = next(r for r in report.results if r.name.endswith(": the gradient"))
    assert not gradient.passed
    assert "the gradient of your softmax was not checked" in gradient.message
    assert gradient.message not in report.problems  # a verdict, not a problem
    report = checks.check_softmax(softmax_no_grad)
    (lost,) = [r for r in report.results if not r.passed]
    assert lost.name.endswith(": the gradient")
    assert "not connected to its inputs in autograd" in lost.message


def test_report_lines_fit_a_notebook():
    """76 columns: a code cell of the website shows 77 at 1280 px."""
    for fn in (softmax_naive, softmax_in_place, softmax_dim0, softmax_stable):
        for line in str(checks.check_softmax(fn)).splitlines():
            assert len(line) <= 76, line


def test_the_instructors_page_names_the_checkers_as_they_are():
    """Each checker the instructors' page names exists, and so do the report's
    attributes it tells instructors to read."""
    page = (
        Path(__file__).resolve().parents[3] / "chapters" / "instructors.md"
    ).read_text()
    named = set(re.findall(r"`(check_\w+)`", page))
    assert named, "the page names no checker"
    assert named <= set(checks.__all__), sorted(named - set(checks.__all__))
    report = checks.check_softmax(softmax_stable)
    for attribute in re.findall(r"`report\.(\w+)", page):
        assert hasattr(report, attribute), attribute


def test_report_shows_readably_in_ipython():
    from IPython.lib.pretty import pretty

    report = checks.check_softmax(softmax_naive)
    assert pretty(report) == str(report)


def test_checkers_are_deterministic_and_leave_the_global_rng_alone():
    state = torch.get_rng_state()
    np_state = np.random.get_state()[1].copy()
    for fn in (softmax_naive, softmax_dim0, sparsemax_unsorted):
        checker = (
            checks.check_sparsemax if fn is sparsemax_unsorted else checks.check_softmax
        )
        first, second = checker(fn), checker(fn)
        assert first.problems == second.problems
    assert torch.equal(torch.get_rng_state(), state)
    assert np.array_equal(np.random.get_state()[1], np_state)


def test_the_lambda_gets_a_name():
    assert checks.check_softmax(lambda x: torch.softmax(x, -1)).function == "a lambda"


def test_public_api():
    for name in checks.__all__:
        assert getattr(sb.checks, name).__doc__
    assert "checks" in sb.__all__
    for name in checks.__all__:
        if name.startswith("check_"):
            assert "Examples" in getattr(checks, name).__doc__, name


def test_docstring_examples():
    failures, tried = doctest.testmod(checks, optionflags=doctest.ELLIPSIS)
    assert tried > 10 and failures == 0


# --------------------------------------------------------------------------------------


def _assert_caught(report, fragments):
    text = " ".join(" ".join(report.problems).split())
    assert not report.ok
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in the report:\n{report}"


def _assert_passes(report):
    assert report.ok, str(report)
