"""Tests for softmaxbook.sampling: top-k/top-p filters, sampling, ECE and temperature
scaling."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import softmaxbook as sb

NEG_INF = float("-inf")


def distinct_logits(min_size=1, max_size=30):
    """Rows of logits at least 0.01 apart (no ties, even after exp, so the kept sets are
    unique)."""
    return arrays(
        np.int64,
        st.integers(min_size, max_size),
        elements=st.integers(-2000, 2000),
        unique=True,
    ).map(lambda a: a / 100.0)


# --------------------------------------------------------------------------- top-k


@settings(max_examples=50, deadline=None)
@given(distinct_logits(), st.integers(1, 40))
def test_top_k_keeps_exactly_the_k_largest(x, k):
    logits = torch.from_numpy(x)
    out = sb.top_k_filter(logits, k)
    kept = torch.isfinite(out)
    assert int(kept.sum()) == min(k, len(x))
    # the kept ones are the largest, unchanged
    assert torch.equal(out[kept], logits[kept])
    if kept.sum() < len(x):
        assert logits[kept].min() > logits[~kept].max()
    assert torch.all(torch.isneginf(out[~kept]))


def test_top_k_hand_example_and_ties_are_kept_by_value():
    x = torch.tensor([3.0, 1.0, 2.0, 0.0, 2.0])
    out = sb.top_k_filter(x, 2)
    # the 2nd largest value, 2.0, occurs twice: both are kept (value-based ties)
    assert out.tolist() == [3.0, NEG_INF, 2.0, NEG_INF, 2.0]
    assert sb.top_k_filter(x, 1).tolist() == [3.0, NEG_INF, NEG_INF, NEG_INF, NEG_INF]


def test_top_k_is_permutation_equivariant_even_with_ties():
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 4, (3, 12), generator=g).double()  # many ties
    perm = torch.randperm(12, generator=g)
    for k in (1, 3, 7):
        assert torch.equal(
            sb.top_k_filter(x, k)[:, perm], sb.top_k_filter(x[:, perm], k)
        )


def test_top_k_large_k_keeps_everything_and_input_is_untouched():
    x = torch.randn(4, 7)
    before = x.clone()
    assert torch.equal(sb.top_k_filter(x, 7), x)
    assert torch.equal(sb.top_k_filter(x, 1000), x)
    sb.top_k_filter(x, 2)
    assert torch.equal(x, before)


def test_top_k_batch_dims_match_rowwise():
    x = torch.randn(2, 3, 4, 11, dtype=torch.float64)
    out = sb.top_k_filter(x, 4)
    rows = torch.stack([sb.top_k_filter(r, 4) for r in x.reshape(-1, 11)])
    assert torch.equal(out.reshape(-1, 11), rows)
    assert out.shape == x.shape
    assert torch.equal(torch.isfinite(out).sum(-1), torch.full((2, 3, 4), 4))


def test_top_k_with_inf_entries_and_nan():
    x = torch.tensor([[0.5, NEG_INF, 2.0, NEG_INF], [NEG_INF, NEG_INF, NEG_INF, 1.0]])
    out = sb.top_k_filter(x, 3)
    # fewer than k finite logits: all finite ones survive, -inf stays -inf
    assert torch.equal(out, x)
    assert sb.top_k_filter(x, 1).tolist() == [
        [NEG_INF, NEG_INF, 2.0, NEG_INF],
        [NEG_INF, NEG_INF, NEG_INF, 1.0],
    ]
    y = torch.tensor([1.0, float("nan"), 0.0])
    assert torch.isnan(sb.top_k_filter(y, 1)[1])


@pytest.mark.parametrize(
    "dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64]
)
def test_top_k_dtypes_and_extremes(dtype):
    x = torch.tensor([1e4, -1e4, 0.0, 5.0]).to(dtype)
    out = sb.top_k_filter(x, 2)
    assert out.dtype == dtype
    assert torch.isfinite(out).tolist() == [True, False, False, True]


def test_top_k_empty_dims():
    assert sb.top_k_filter(torch.empty(0, 5), 2).shape == (0, 5)
    assert sb.top_k_filter(torch.empty(3, 0), 2).shape == (3, 0)


# --------------------------------------------------------------------------- top-p


@settings(max_examples=50, deadline=None)
@given(distinct_logits(), st.floats(0.01, 0.999))
def test_top_p_keeps_the_minimal_nucleus(x, p):
    logits = torch.from_numpy(x)
    out = sb.top_p_filter(logits, p)
    kept = torch.isfinite(out)
    probs = torch.softmax(logits, -1)
    assert kept.sum() >= 1
    assert probs.argmax() in kept.nonzero().flatten().tolist()
    # the kept tokens are the most probable ones
    if kept.sum() < len(x):
        assert probs[kept].min() > probs[~kept].max()
    # enough mass ...
    mass = float(probs[kept].sum())
    assert mass >= p - 1e-12
    # ... and minimal: dropping the least probable kept token falls short of p
    if kept.sum() > 1:
        assert mass - float(probs[kept].min()) < p + 1e-12
    assert torch.equal(out[kept], logits[kept])


def test_top_p_hand_example():
    x = torch.tensor([3.0, 1.0, 2.0, 0.0, 2.5])
    probs = torch.softmax(x.double(), -1)  # about [.463, .063, .170, .023, .281]
    assert probs.argsort(descending=True).tolist() == [0, 4, 2, 1, 3]
    # cumulative mass in that order: about .463, .744, .914, .977, 1
    assert torch.isfinite(sb.top_p_filter(x, 0.4)).tolist() == [
        True,
        False,
        False,
        False,
        False,
    ]
    assert torch.isfinite(sb.top_p_filter(x, 0.7)).tolist() == [
        True,
        False,
        False,
        False,
        True,
    ]
    assert torch.isfinite(sb.top_p_filter(x, 0.9)).tolist() == [
        True,
        False,
        True,
        False,
        True,
    ]
    assert torch.isfinite(sb.top_p_filter(x, 0.95)).tolist() == [
        True,
        True,
        True,
        False,
        True,
    ]
    assert torch.isfinite(sb.top_p_filter(x, 0.99)).tolist() == [
        True,
        True,
        True,
        True,
        True,
    ]


def test_top_p_equals_top_k_with_the_nucleus_size():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 40, generator=g, dtype=torch.float64) * 3
    out = sb.top_p_filter(x, 0.8)
    for row, filtered in zip(x, out):
        m = int(torch.isfinite(filtered).sum())
        assert torch.equal(filtered, sb.top_k_filter(row, m))


def test_top_p_one_keeps_everything_and_tiny_p_keeps_argmax():
    x = torch.tensor([[0.0, -100.0, 5.0], [1.0, 1.0, 1.0]])
    assert torch.equal(sb.top_p_filter(x, 1.0), x)
    out = sb.top_p_filter(x, 1e-9)
    assert out[0].tolist() == [NEG_INF, NEG_INF, 5.0]
    # a three-way tie for the argmax: ties are kept by value, so all three survive
    assert out[1].tolist() == [1.0, 1.0, 1.0]


def test_top_p_adapts_to_the_shape_of_the_distribution():
    ranks = torch.arange(1, 51, dtype=torch.float64)
    peaked = -2.0 * torch.log(ranks)  # Zipf with exponent 2
    flat = -0.3 * torch.log(ranks)
    n_peaked = int(torch.isfinite(sb.top_p_filter(peaked, 0.9)).sum())
    n_flat = int(torch.isfinite(sb.top_p_filter(flat, 0.9)).sum())
    assert n_peaked < 10 < n_flat


def test_top_p_with_inf_batch_and_dtypes():
    x = torch.tensor([[NEG_INF, 0.0, NEG_INF, 0.0], [2.0, NEG_INF, 0.0, NEG_INF]])
    out = sb.top_p_filter(x, 0.6)
    assert out.tolist() == [
        [NEG_INF, 0.0, NEG_INF, 0.0],
        [2.0, NEG_INF, NEG_INF, NEG_INF],
    ]
    y = torch.randn(2, 3, 9, dtype=torch.float64)
    assert torch.equal(
        sb.top_p_filter(y, 0.5).reshape(-1, 9),
        torch.stack([sb.top_p_filter(r, 0.5) for r in y.reshape(-1, 9)]),
    )
    for dtype in (torch.float16, torch.bfloat16):
        z = torch.tensor([1e4, 0.0, 3.0, -1e4]).to(dtype)
        out = sb.top_p_filter(z, 0.9)
        assert out.dtype == dtype and torch.isfinite(out).tolist() == [
            True,
            False,
            False,
            False,
        ]
    assert sb.top_p_filter(torch.empty(0, 4), 0.5).shape == (0, 4)
    assert sb.top_p_filter(torch.empty(2, 0), 0.5).shape == (2, 0)


# --------------------------------------------------------------------------- sample


def test_sample_frequencies_match_the_filtered_softmax():
    logits = torch.tensor([2.0, 1.5, 1.0, 0.0, -1.0, -3.0])
    g = torch.Generator().manual_seed(1234)
    n = 40_000
    # The kept tokens, worked out by hand (not by the library's own filters):
    # softmax(logits) = .462 .280 .170 .062 .023 .003, cumulative .462 .742 .911,
    # so the 0.8-nucleus is the first three; at T = 1.5 the top 4 have
    # probabilities .401 .287 .206 .106 (cumulative .401 .688 .894 < 0.9): all 4.
    for kwargs, kept in (
        ({}, [0, 1, 2, 3, 4, 5]),
        ({"temperature": 0.5}, [0, 1, 2, 3, 4, 5]),
        ({"temperature": 2.0, "top_k": 3}, [0, 1, 2]),
        ({"top_p": 0.8}, [0, 1, 2]),
        ({"temperature": 1.5, "top_k": 4, "top_p": 0.9}, [0, 1, 2, 3]),
    ):
        rows = logits.expand(n, -1)
        tokens = sb.sample(rows, generator=g, **kwargs)
        freq = torch.bincount(tokens, minlength=6).double() / n
        z = logits.double() / kwargs.get("temperature", 1.0)
        weights = torch.zeros(6, dtype=torch.float64)
        weights[kept] = torch.exp(z[kept])
        expected = weights / weights.sum()
        # 4.5 standard errors of a binomial proportion per token; filtered: never drawn
        se = torch.sqrt(expected * (1 - expected) / n)
        assert torch.all((freq - expected).abs() <= 4.5 * se + 1e-12), kwargs
        assert torch.all(freq[expected == 0] == 0)


def test_sample_temperature_changes_the_distribution():
    # guard against a sampler that ignores its temperature: the check above would
    # still pass for T=1, so compare two temperatures directly.
    logits = torch.tensor([1.0, 0.0]).expand(20_000, -1)
    cold = sb.sample(
        logits, temperature=0.25, generator=torch.Generator().manual_seed(0)
    )
    hot = sb.sample(logits, temperature=4.0, generator=torch.Generator().manual_seed(0))
    assert (cold == 0).double().mean() > 0.95 > 0.6 > (hot == 0).double().mean()


def test_sample_is_reproducible_with_a_generator():
    logits = torch.randn(8, 100)
    a = sb.sample(logits, top_p=0.9, generator=torch.Generator().manual_seed(7))
    b = sb.sample(logits, top_p=0.9, generator=torch.Generator().manual_seed(7))
    c = sb.sample(logits, top_p=0.9, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    # the global generator is not consumed when a generator is passed
    torch.manual_seed(0)
    expected_next = torch.rand(1)
    torch.manual_seed(0)
    sb.sample(logits, generator=torch.Generator().manual_seed(7))
    assert torch.equal(torch.rand(1), expected_next)


def test_sample_shapes_dtypes_and_masked_tokens():
    x = torch.randn(2, 3, 10)
    out = sb.sample(x)
    assert out.shape == (2, 3) and out.dtype == torch.long
    assert ((0 <= out) & (out < 10)).all()
    assert sb.sample(torch.randn(10)).shape == ()
    assert sb.sample(torch.empty(0, 10)).shape == (0,)
    # -inf tokens are never drawn, with large logits nearby
    y = torch.tensor([1e4, NEG_INF, 1e4 - 1.0, NEG_INF]).expand(2000, -1)
    tokens = sb.sample(y, generator=torch.Generator().manual_seed(0))
    assert set(tokens.tolist()) <= {0, 2}
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        assert sb.sample(torch.randn(4, 6).to(dtype), top_k=2).dtype == torch.long
    # top_k=1 is greedy decoding
    z = torch.randn(50, 30)
    assert torch.equal(sb.sample(z, top_k=1), z.argmax(-1))


def test_sample_errors():
    x = torch.randn(3, 5)
    with pytest.raises(ValueError, match=r"temperature must be > 0.*argmax"):
        sb.sample(x, temperature=0.0)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        sb.sample(x, temperature=-1.0)
    with pytest.raises(ValueError, match="temperature"):
        sb.sample(x, temperature=float("inf"))
    with pytest.raises(TypeError, match="temperature"):
        sb.sample(x, temperature="hot")
    with pytest.raises(ValueError, match="k must be >= 1"):
        sb.sample(x, top_k=0)
    with pytest.raises(ValueError, match=r"p must be in \(0, 1\]"):
        sb.sample(x, top_p=1.5)
    with pytest.raises(TypeError, match="generator"):
        sb.sample(x, generator=0)
    with pytest.raises(TypeError, match="floating-point"):
        sb.sample(torch.ones(3, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="V = 0"):
        sb.sample(torch.empty(3, 0))
    with pytest.raises(ValueError, match="all -inf"):
        sb.sample(torch.tensor([[0.0, 1.0], [NEG_INF, NEG_INF]]))
    with pytest.raises(ValueError, match="nan"):
        sb.sample(torch.tensor([0.0, float("nan")]))


def test_filter_errors():
    x = torch.randn(3, 5)
    with pytest.raises(ValueError, match="k must be >= 1, got 0"):
        sb.top_k_filter(x, 0)
    with pytest.raises(ValueError, match="k must be >= 1"):
        sb.top_k_filter(x, -3)
    with pytest.raises(TypeError, match="k must be an int, got float"):
        sb.top_k_filter(x, 2.0)
    with pytest.raises(TypeError, match="k must be an int"):
        sb.top_k_filter(x, True)
    for bad in (0.0, -0.1, 1.01, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="p must"):
            sb.top_p_filter(x, bad)
    with pytest.raises(TypeError, match="p must be a real number"):
        sb.top_p_filter(x, "0.9")
    with pytest.raises(TypeError, match="logits must be a floating-point tensor"):
        sb.top_k_filter(torch.arange(5), 2)
    with pytest.raises(TypeError, match=r"logits must be a torch.Tensor"):
        sb.top_p_filter([1.0, 2.0], 0.5)
    with pytest.raises(ValueError, match="at least one dimension"):
        sb.top_k_filter(torch.tensor(1.0), 1)


# ---------------------------------------------------------------------------
# calibration


def numpy_ece(probs, labels, n_bins):
    """Reference ECE written from the definition, with a loop over bins."""
    conf = probs.max(1)
    pred = probs.argmax(1)
    ece = 0.0
    for b in range(n_bins):
        lo, hi = b / n_bins, (b + 1) / n_bins
        in_bin = (conf > lo) & (conf <= hi) if b > 0 else (conf <= hi)
        if in_bin.any():
            ece += in_bin.mean() * abs(
                (pred[in_bin] == labels[in_bin]).mean() - conf[in_bin].mean()
            )
    return ece


def test_ece_hand_computed_case():
    # 4 predictions, 2 bins [0, .5], (.5, 1]: bin 1 holds confidences .9 (right) and .7
    # (wrong): acc .5, conf .8, gap .3, weight 1/2 bin 0 holds .4 (right) and .5 (wrong;
    # .5 goes to the lower, right-closed bin): acc .5, conf .45, gap .05, weight 1/2  ->
    # ECE = .15 + .025 = .175
    probs = torch.tensor(
        [[0.9, 0.1, 0.0], [0.7, 0.2, 0.1], [0.4, 0.3, 0.3], [0.5, 0.25, 0.25]]
    )
    labels = torch.tensor([0, 1, 0, 2])
    assert sb.expected_calibration_error(probs, labels, n_bins=2) == pytest.approx(
        0.175, abs=1e-6
    )
    table = sb.reliability_table(probs, labels, n_bins=2)
    assert table.count.tolist() == [2, 2]
    assert table.confidence.tolist() == pytest.approx([0.45, 0.8], abs=1e-6)
    assert table.accuracy.tolist() == pytest.approx([0.5, 0.5])
    assert table.lower.tolist() == [0.0, 0.5] and table.upper.tolist() == [0.5, 1.0]
    # one bin: ECE = |overall accuracy - mean confidence| = |.5 - .625|
    assert sb.expected_calibration_error(probs, labels, n_bins=1) == pytest.approx(
        0.125, abs=1e-6
    )


def test_ece_all_right_and_all_wrong_one_hot():
    probs = torch.eye(4)
    assert sb.expected_calibration_error(probs, torch.arange(4)) == 0.0
    assert sb.expected_calibration_error(probs, torch.tensor([1, 2, 3, 0])) == 1.0


@settings(max_examples=50, deadline=None)
@given(
    st.integers(1, 60), st.integers(2, 6), st.integers(1, 20), st.integers(0, 2**31 - 1)
)
def test_ece_matches_numpy_reference(n, C, n_bins, seed):
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(n, C, generator=g, dtype=torch.float64) * 3, -1)
    labels = torch.randint(0, C, (n,), generator=g)
    got = sb.expected_calibration_error(probs, labels, n_bins=n_bins)
    assert isinstance(got, float)
    assert got == pytest.approx(
        numpy_ece(probs.numpy(), labels.numpy(), n_bins), abs=1e-12
    )
    assert 0.0 <= got <= 1.0
    table = sb.reliability_table(probs, labels, n_bins=n_bins)
    assert int(table.count.sum()) == n
    assert torch.isnan(table.confidence[table.count == 0]).all()


def test_ece_of_calibrated_synthetic_data_is_near_zero():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(50_000, 5, generator=g) * 2
    probs = torch.softmax(logits, -1)
    labels = torch.multinomial(probs, 1, generator=g).squeeze(
        1
    )  # drawn from the model itself
    calibrated = sb.expected_calibration_error(probs, labels)
    overconfident = sb.expected_calibration_error(torch.softmax(3 * logits, -1), labels)
    assert calibrated < 0.01
    assert overconfident > 0.1


def test_ece_accepts_low_precision_probs():
    probs = torch.softmax(torch.randn(100, 10), -1)
    labels = torch.randint(0, 10, (100,))
    exact = sb.expected_calibration_error(probs, labels)
    assert sb.expected_calibration_error(probs.half(), labels) == pytest.approx(
        exact, abs=5e-3
    )


def test_calibration_errors():
    probs = torch.softmax(torch.randn(4, 3), -1)
    labels = torch.tensor([0, 1, 2, 0])
    with pytest.raises(ValueError, match=r"pass softmax\(logits"):
        sb.expected_calibration_error(torch.randn(4, 3), labels)
    with pytest.raises(ValueError, match=r"probs must have shape \(n, C\)"):
        sb.expected_calibration_error(probs[0], labels)
    with pytest.raises(ValueError, match=r"labels must have shape \(n,\)"):
        sb.expected_calibration_error(probs, labels[:3])
    with pytest.raises(TypeError, match="labels must be an integer tensor"):
        sb.expected_calibration_error(probs, labels.float())
    with pytest.raises(ValueError, match=r"class indices in \[0, 3\)"):
        sb.expected_calibration_error(probs, torch.tensor([0, 1, 3, 0]))
    with pytest.raises(ValueError, match="n_bins must be >= 1"):
        sb.expected_calibration_error(probs, labels, n_bins=0)
    with pytest.raises(ValueError, match="at least one prediction"):
        sb.expected_calibration_error(
            torch.empty(0, 3), torch.empty(0, dtype=torch.long)
        )
    with pytest.raises(TypeError, match="probs must be a floating-point tensor"):
        sb.reliability_table(torch.eye(3, dtype=torch.long), torch.arange(3))
    with pytest.raises(ValueError, match="nan"):
        sb.expected_calibration_error(
            torch.full((2, 2), float("nan")), torch.tensor([0, 1])
        )


# ---------------------------------------------------------------------------
# fit_temperature


@pytest.mark.parametrize("c", [0.4, 1.0, 2.5])
def test_fit_temperature_recovers_a_known_temperature(c):
    g = torch.Generator().manual_seed(42)
    true_logits = torch.randn(20_000, 6, generator=g, dtype=torch.float64) * 1.5
    labels = torch.multinomial(torch.softmax(true_logits, -1), 1, generator=g).squeeze(
        1
    )
    T = sb.fit_temperature(true_logits * c, labels)
    assert isinstance(T, float)
    assert T == pytest.approx(c, rel=0.05)


def test_fit_temperature_is_the_nll_minimizer_and_deterministic():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(500, 4, generator=g, dtype=torch.float64) * 4
    # labels from a flatter model than the logits claim: the optimum is in the bounds
    labels = torch.multinomial(torch.softmax(logits / 2, -1), 1, generator=g).squeeze(1)
    T = sb.fit_temperature(logits, labels)
    assert T == sb.fit_temperature(logits, labels)

    def nll(t):
        return float(torch.nn.functional.cross_entropy(logits / t, labels))

    grid = np.exp(np.linspace(math.log(0.01), math.log(100), 1001))
    best = grid[np.argmin([nll(t) for t in grid])]
    assert 1.2 < T < 4.0
    assert T == pytest.approx(best, rel=1e-2)
    assert nll(T) <= min(nll(T * 1.01), nll(T / 1.01))
    # float32 input gives the same answer (computed in float64)
    assert sb.fit_temperature(logits.float(), labels) == pytest.approx(T, rel=1e-5)


def test_fit_temperature_bounds_and_removed_classes():
    # perfectly separated logits: the NLL keeps falling as T -> 0, to the lower bound
    logits = torch.tensor([[5.0, 0.0], [0.0, 5.0]])
    labels = torch.tensor([0, 1])
    assert sb.fit_temperature(logits, labels) == 0.01
    assert sb.fit_temperature(logits, labels, bounds=(0.5, 2.0)) == 0.5
    # all wrong: flattening is always better, the upper bound is hit
    assert sb.fit_temperature(logits, labels.flip(0)) == 100.0
    # a removed (-inf) class that is never the label is fine
    z = torch.tensor([[2.0, 0.0, NEG_INF], [0.0, 1.0, NEG_INF], [1.0, 0.0, NEG_INF]])
    T = sb.fit_temperature(z, torch.tensor([0, 1, 1]))
    assert 0.01 < T < 100.0 and math.isfinite(T)


def test_fit_temperature_errors():
    logits = torch.randn(4, 3)
    labels = torch.tensor([0, 1, 2, 0])
    with pytest.raises(ValueError, match=r"logits must have shape \(n, C\)"):
        sb.fit_temperature(logits[0], labels)
    with pytest.raises(TypeError, match="logits must be a floating-point tensor"):
        sb.fit_temperature(logits.long(), labels)
    with pytest.raises(TypeError, match="labels must be an integer tensor"):
        sb.fit_temperature(logits, labels.double())
    with pytest.raises(ValueError, match="labels must have shape"):
        sb.fit_temperature(logits, labels[:2])
    with pytest.raises(ValueError, match="class indices"):
        sb.fit_temperature(logits, torch.tensor([0, 1, 5, 0]))
    with pytest.raises(ValueError, match="bounds must satisfy"):
        sb.fit_temperature(logits, labels, bounds=(2.0, 1.0))
    with pytest.raises(ValueError, match=r"bounds\[0\] must be a finite number > 0"):
        sb.fit_temperature(logits, labels, bounds=(0.0, 1.0))
    with pytest.raises(ValueError, match="bounds must be a pair"):
        sb.fit_temperature(logits, labels, bounds=1.0)
    with pytest.raises(ValueError, match="label's logit must be finite"):
        sb.fit_temperature(torch.tensor([[0.0, NEG_INF]]), torch.tensor([1]))
    with pytest.raises(ValueError, match="nan"):
        sb.fit_temperature(torch.tensor([[0.0, float("nan")]]), torch.tensor([0]))
    with pytest.raises(ValueError, match="at least one example"):
        sb.fit_temperature(torch.empty(0, 3), torch.empty(0, dtype=torch.long))


def test_public_api():
    for name in (
        "top_k_filter",
        "top_p_filter",
        "sample",
        "expected_calibration_error",
        "reliability_table",
        "ReliabilityTable",
        "fit_temperature",
    ):
        assert name in sb.__all__ and hasattr(sb, name)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sample_upcasts_before_dividing_by_a_small_temperature(dtype):
    # 10 / 1e-4 = 1e5 overflows float16 (largest finite 65504): dividing first would
    # turn the row into inf and nan. T -> 0 is greedy, so the argmax is drawn.
    logits = torch.tensor([[9.0, 10.0, 0.0], [1.0, -3.0, 0.5]], dtype=dtype)
    g = torch.Generator().manual_seed(0)
    tokens = sb.sample(logits.expand(50, 2, 3), temperature=1e-4, generator=g)
    assert torch.equal(tokens, torch.tensor([1, 0]).expand(50, 2))
    filtered = sb.sample(logits, temperature=1e-4, top_k=2, top_p=0.5, generator=g)
    assert filtered.tolist() == [1, 0]


# --------------------------------------------------------------------------- min-p


@settings(max_examples=50, deadline=None)
@given(distinct_logits(), st.floats(0.0, 1.0))
def test_min_p_keeps_the_tokens_above_p_times_the_largest_probability(x, p):
    z = torch.tensor(x, dtype=torch.float64)
    kept = torch.isfinite(sb.min_p_filter(z, p))
    probs = torch.softmax(z, -1)
    ratio = probs / probs.max()
    # exactly the tokens with pi_i >= p * pi_max, away from the boundary
    clear = (ratio - p).abs() > 1e-9
    assert torch.equal(kept[clear], (ratio >= p)[clear])
    assert kept[z.argmax()]  # the most probable token always survives


def test_min_p_hand_example_and_confidence_scaling():
    # probabilities .5 .3 .15 .05: with p = 0.2 the threshold is 0.1
    z = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert torch.isfinite(sb.min_p_filter(z, 0.2)).tolist() == [True] * 3 + [False]
    assert torch.equal(sb.min_p_filter(z, 0.0), z)
    assert torch.isfinite(sb.min_p_filter(z, 1.0)).tolist() == [True] + [False] * 3
    # the same p keeps few tokens of a peaked row and many of a flat one
    ranks = torch.arange(1, 51, dtype=torch.float64)
    peaked = torch.isfinite(sb.min_p_filter(-2.0 * torch.log(ranks), 0.1)).sum()
    flat = torch.isfinite(sb.min_p_filter(-0.5 * torch.log(ranks), 0.1)).sum()
    assert int(peaked) == 3 and int(flat) == 50  # r^-2 >= 0.1: r <= 3.16; r^-0.5: all


def test_min_p_inf_nan_ties_batches_and_dtypes():
    z = torch.tensor([[NEG_INF, 1.0, 1.0, -5.0], [0.0, float("nan"), -9.0, NEG_INF]])
    out = sb.min_p_filter(z, 0.5)
    assert out[0].tolist() == [NEG_INF, 1.0, 1.0, NEG_INF]  # ties kept by value
    assert math.isnan(float(out[1, 1])) and out[1, 3] == NEG_INF
    rows = torch.randn(3, 4, 20)
    batched = sb.min_p_filter(rows, 0.1)
    for i in range(3):
        for j in range(4):
            assert torch.equal(batched[i, j], sb.min_p_filter(rows[i, j], 0.1))
    for dtype in (torch.float16, torch.bfloat16):
        low = sb.min_p_filter(rows.to(dtype), 0.1)
        assert low.dtype == dtype and low.shape == rows.shape
    assert sb.min_p_filter(torch.empty(2, 0), 0.1).shape == (2, 0)
    assert torch.equal(sb.min_p_filter(rows, 0.1), sb.min_p_filter(rows, 0.1))


def test_sample_with_min_p_draws_only_survivors_in_the_right_proportions():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    n = 40_000
    tokens = sb.sample(logits.expand(n, -1), min_p=0.2,
                       generator=torch.Generator().manual_seed(11))  # fmt: skip
    freq = torch.bincount(tokens, minlength=4).double() / n
    expected = torch.tensor([0.5, 0.3, 0.15, 0.0], dtype=torch.float64) / 0.95
    se = torch.sqrt(expected * (1 - expected) / n)
    assert torch.all((freq - expected).abs() <= 4.5 * se + 1e-12)
    # temperature first: at T = 2 the same min_p keeps all four tokens
    hot = sb.sample(logits.expand(n, -1), temperature=2.0, min_p=0.2,
                    generator=torch.Generator().manual_seed(12))  # fmt: skip
    assert int(hot.max()) == 3


def test_min_p_errors():
    x = torch.randn(3, 5)
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\]"):
        sb.min_p_filter(x, 1.5)
    with pytest.raises(ValueError, match="p must be a finite number >= 0"):
        sb.min_p_filter(x, -0.1)
    with pytest.raises(TypeError, match="p must be a real number"):
        sb.min_p_filter(x, "0.1")
    with pytest.raises(TypeError, match="floating-point"):
        sb.min_p_filter(x.long(), 0.1)
    with pytest.raises(ValueError, match="at least one dimension"):
        sb.min_p_filter(torch.tensor(1.0), 0.1)
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\]"):
        sb.sample(x, min_p=2.0)


def test_softmax_can_turn_a_near_tie_into_a_tie():
    # The docstrings qualify "softmax preserves the argmax": in float32, logits 0.3
    # and the next float above it get equal probabilities, and argmax returns the
    # first index, while the argmax of the logits is the second. The order is never
    # reversed, only flattened into a tie.
    a = torch.tensor(0.3)
    z = torch.stack([a, torch.nextafter(a, torch.tensor(1.0))])
    p = torch.softmax(z, -1)
    assert z[1] > z[0] and p[0] == p[1]
    assert int(z.argmax()) == 1 and int(p.argmax()) == 0
    assert p[1] >= p[0]  # non-decreasing: never reversed
    for doc in (sb.sampling.__doc__, sb.sampling.decoding.__doc__, sb.sample.__doc__):
        text = " ".join(doc.split())
        assert "never changes which entry is largest" not in text
        assert "tie" in text


def test_dividing_by_a_temperature_can_turn_a_near_tie_into_a_tie():
    # fit_temperature's docstring: dividing by T keeps the order in exact arithmetic
    # only; float32 logits 1.5 and the next float above it, divided by 2.5, become
    # equal and argmax moves to the first index (it said accuracy is untouched).
    a = torch.tensor(1.5)
    z = torch.stack([a, torch.nextafter(a, torch.tensor(2.0))])
    assert int(z.argmax()) == 1
    tempered = z / 2.5
    assert tempered[0] == tempered[1] and int(tempered.argmax()) == 0
    text = " ".join(sb.fit_temperature.__doc__.split())
    assert "so accuracy is untouched" not in text
    assert "1.5" in text and "T = 2.5" in text
