"""softmaxbook.checks, attention and what is built on it: each typical student mistake
in attention, the top-p filter, merging partial attention results and attention entropy
is caught with the right message, and every correct implementation passes.

The mistakes below are the ones students make (and the book discusses): a missing or
wrong scale, a mask used the wrong way round, a nucleus one token too wide, a merge
that forgets to renormalize, an entropy in bits, ... Each test names the fragment of
the message that a student needs to read to fix that mistake.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _checks_helpers import NEG_INF, _assert_caught, _assert_passes
from test_checks_softmax import masked_correct, masked_numpy

import softmaxbook as sb
from softmaxbook import checks
from softmaxbook.checks.sampling import _top_p_inputs

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
