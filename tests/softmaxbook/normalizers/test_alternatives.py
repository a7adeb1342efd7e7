"""softmaxbook.normalizers.sparse and .pointwise: sparsemax, entmax, softmax_one,
ReLU and sigmoid normalizers.

Agreement with the entmax package (deep-spin/entmax) and with the NumPy reference,
the threshold search, the Jacobians, each map's own properties, extremes and
errors. The contract every normalizer keeps (removed keys, empty rows, half
precision, torch.func, gradcheck, bad input) is checked on every registered
normalizer in test_normalizer_contract.py.
"""

from __future__ import annotations

import math

import entmax
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import softmaxbook as sb
from random_inputs import scores, vjp
from softmaxbook import reference as ref
from softmaxbook.normalizers import sparse as alt

SIMPLEX_MAPS = {
    "sparsemax": sb.sparsemax,
    "entmax15": sb.entmax15,
    "entmax_bisect": lambda x, dim=-1: sb.entmax_bisect(x, alpha=1.3, dim=dim),
}
ALL_MAPS = {
    **SIMPLEX_MAPS,
    "softmax_one": sb.softmax_one,
    "relu": sb.relu_normalize,
    "sigmoid": sb.sigmoid_normalize,
}


# ---------------------------------------------------------------------- agreement


@pytest.mark.parametrize("scale", [0.05, 1.0, 30.0])
@pytest.mark.parametrize(
    "shape,dim", [((5, 40), -1), ((3, 300), 1), ((7, 4, 6), 0), ((2, 64, 3), -2)]
)
@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
def test_agrees_with_entmax_package_forward_and_gradient(name, shape, dim, scale):
    x = scores(shape, scale=scale)
    ours, theirs = getattr(sb, name), getattr(entmax, name)
    p, g = vjp(lambda t: ours(t, dim=dim), x)
    q, h = vjp(lambda t: theirs(t, dim=dim), x)
    torch.testing.assert_close(p, q, atol=1e-12, rtol=0)
    torch.testing.assert_close(g, h, atol=1e-10, rtol=0)
    # The same exact zeros, not just small numbers.
    assert torch.equal(p == 0, q == 0)


@pytest.mark.parametrize("alpha", [1.1, 1.5, 2.0, 3.0])
@pytest.mark.parametrize("dim", [-1, 0])
def test_entmax_bisect_agrees_with_entmax_package(alpha, dim):
    x = scores((6, 30), scale=3.0)
    p, g = vjp(lambda t: sb.entmax_bisect(t, alpha=alpha, dim=dim), x)
    q, h = vjp(lambda t: entmax.entmax_bisect(t, alpha=alpha, dim=dim), x)
    torch.testing.assert_close(p, q, atol=1e-10, rtol=0)
    torch.testing.assert_close(g, h, atol=1e-8, rtol=0)


def test_bisection_matches_the_exact_maps():
    x = scores((8, 50), scale=3.0)
    torch.testing.assert_close(
        sb.entmax_bisect(x, alpha=1.5), sb.entmax15(x), atol=1e-10, rtol=0
    )
    torch.testing.assert_close(
        sb.entmax_bisect(x, alpha=2.0), sb.sparsemax(x), atol=1e-10, rtol=0
    )


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_sparsemax_agrees_with_reference(dim):
    x = scores((10, 12), scale=3.0)
    exact = torch.from_numpy(ref.sparsemax(x.numpy(), axis=dim))
    torch.testing.assert_close(sb.sparsemax(x, dim=dim), exact, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
def test_partial_sort_fallback_is_exact(name, monkeypatch):
    # A margin far above the threshold leaves too few candidates: every row must be
    # detected as unresolved and redone with the full sort: the exact result still.
    x = scores((16, 200), scale=0.3)
    expected = getattr(entmax, name)(x, dim=-1)
    monkeypatch.setattr(alt, "_MARGIN", -0.2)
    monkeypatch.setattr(alt, "_NEWTON_STEPS", {"sparsemax": 3, "entmax15": 3})
    torch.testing.assert_close(getattr(sb, name)(x), expected, atol=1e-12, rtol=0)


def _spy_thresholds(monkeypatch):
    """Record the shape of every block of sorted candidates the threshold sees."""
    shapes = []
    real = alt._sorted_threshold

    def spy(v, kind):
        shapes.append(tuple(v.shape))
        return real(v, kind)

    monkeypatch.setattr(alt, "_sorted_threshold", spy)
    return shapes


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
def test_candidates_only_are_sorted_on_normal_rows(name, monkeypatch):
    # N(0, 1) rows of 2048: the support lies among a few percent of the keys, and only
    # those are sorted, once, with no fallback.
    x = scores((32, 2048), scale=1.0)
    shapes = _spy_thresholds(monkeypatch)
    got = getattr(sb, name)(x)
    assert len(shapes) == 1 and shapes[0][0] == 32 and shapes[0][1] < 2048 // 8
    torch.testing.assert_close(
        got, getattr(entmax, name)(x, dim=-1), atol=1e-12, rtol=0
    )


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
@pytest.mark.parametrize("n", [1, 16, alt._SORT_AT_MOST, alt._SORT_AT_MOST + 1])
def test_short_rows_are_sorted_whole(name, n, monkeypatch):
    # Up to _SORT_AT_MOST keys a row is sorted once, whole; one key more takes the
    # candidate search. Both exact.
    x = scores((6, n), scale=2.0)
    shapes = _spy_thresholds(monkeypatch)
    got = getattr(sb, name)(x)
    if n <= alt._SORT_AT_MOST:
        assert shapes == [(6, n)]
    else:
        assert all(width < n for _, width in shapes[:1])
    torch.testing.assert_close(
        got, getattr(entmax, name)(x, dim=-1), atol=1e-12, rtol=0
    )


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
def test_rows_with_many_candidates_fall_back_to_the_full_sort(name, monkeypatch):
    # Scores of a small spread: most keys are candidates, so those rows are sorted in
    # full (the fallback), the others through their candidates; all exact.
    x = scores((8, 1000), scale=1.0)
    x[::2] *= 0.01  # rows 0, 2, 4, 6: wide supports
    shapes = _spy_thresholds(monkeypatch)
    got = getattr(sb, name)(x)
    assert (4, 1000) in shapes  # the four flat rows, sorted in full
    assert any(rows == 8 and width < 1000 // 4 for rows, width in shapes)
    torch.testing.assert_close(
        got, getattr(entmax, name)(x, dim=-1), atol=1e-12, rtol=0
    )


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
def test_a_threshold_below_its_candidates_bound_falls_back_to_the_full_sort(
    name, monkeypatch
):
    # A margin far above the threshold drops keys of the support from the candidates:
    # the threshold then comes out below the bound, and the row is sorted in full.
    x = scores((16, 600), scale=1.0)
    monkeypatch.setattr(alt, "_MARGIN", -0.3)
    monkeypatch.setattr(alt, "_NEWTON_STEPS", {"sparsemax": 2, "entmax15": 3})
    shapes = _spy_thresholds(monkeypatch)
    got = getattr(sb, name)(x)
    assert shapes[-1] == (16, 600)  # every row redone
    torch.testing.assert_close(
        got, getattr(entmax, name)(x, dim=-1), atol=1e-12, rtol=0
    )


def test_partial_sort_path_on_a_long_row():
    # Peaked rows of length 4096: the support is tiny, so only a few keys are sorted.
    x = scores((4, 4096), scale=4.0, dtype=torch.float32)
    torch.testing.assert_close(
        sb.sparsemax(x), entmax.sparsemax(x, -1), atol=1e-6, rtol=0
    )
    torch.testing.assert_close(
        sb.entmax15(x), entmax.entmax15(x, -1), atol=1e-6, rtol=0
    )


def test_softmax_one_is_softmax_with_an_extra_zero_logit():
    x = scores((5, 7), scale=4.0)
    padded = torch.cat([x, torch.zeros(5, 1, dtype=x.dtype)], dim=-1)
    torch.testing.assert_close(sb.softmax_one(x), torch.softmax(padded, -1)[:, :-1])
    _p, g = vjp(sb.softmax_one, x)
    _q, h = vjp(
        lambda t: torch.softmax(
            torch.cat([t, torch.zeros(5, 1, dtype=t.dtype)], -1), -1
        )[:, :-1],
        x,
    )
    torch.testing.assert_close(g, h)


def test_relu_and_sigmoid_match_their_formulas():
    x = scores((5, 8), scale=2.0)
    r = torch.relu(x)
    torch.testing.assert_close(sb.relu_normalize(x), r / r.sum(-1, keepdim=True))
    torch.testing.assert_close(sb.sigmoid_normalize(x), torch.sigmoid(x - math.log(8)))
    torch.testing.assert_close(
        sb.sigmoid_normalize(x, dim=0), torch.sigmoid(x - math.log(5))
    )
    torch.testing.assert_close(
        sb.sigmoid_normalize(x, bias=0.5), torch.sigmoid(x + 0.5)
    )
    for f, torch_f in (
        (sb.relu_normalize, lambda t: torch.relu(t) / torch.relu(t).sum(-1, True)),
        (sb.sigmoid_normalize, lambda t: torch.sigmoid(t - math.log(8))),
    ):
        torch.testing.assert_close(vjp(f, x)[1], vjp(torch_f, x)[1])


# ---------------------------------------------------------------------- gradients


@pytest.mark.parametrize("alpha", [1.25, 2.5])
def test_gradcheck_entmax_bisect_other_alphas(alpha):
    x = scores((3, 7), scale=1.5, seed=4).requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda t: sb.entmax_bisect(t, alpha=alpha, n_iter=60), (x,)
    )


def test_sparsemax_jacobian_is_the_support_projection():
    x = torch.tensor([1.2, 0.9, 0.1, -1.0, 0.7], dtype=torch.float64)
    p = sb.sparsemax(x)
    s = (p > 0).double()
    expected = torch.diag(s) - torch.outer(s, s) / s.sum()
    torch.testing.assert_close(
        torch.autograd.functional.jacobian(sb.sparsemax, x), expected
    )


# ---------------------------------------------------------------------- properties

vectors = st.lists(st.floats(-50, 50, allow_nan=False), min_size=1, max_size=24)


@settings(max_examples=50, deadline=None)
@given(vectors, st.sampled_from(list(SIMPLEX_MAPS)))
def test_simplex_maps_land_on_the_simplex_and_keep_the_order(values, name):
    x = torch.tensor(values, dtype=torch.float64)
    p = SIMPLEX_MAPS[name](x)
    assert (p >= 0).all()
    assert abs(float(p.sum()) - 1) < 1e-9
    order = torch.argsort(x)
    assert (p[order].diff() >= -1e-12).all()  # larger score, no smaller weight
    assert float(p[torch.argmax(x)]) > 0


@settings(max_examples=50, deadline=None)
@given(vectors)
def test_sparsemax_is_the_reference_projection_with_exact_zeros(values):
    x = torch.tensor(values, dtype=torch.float64)
    p = sb.sparsemax(x)
    torch.testing.assert_close(
        p, torch.from_numpy(ref.sparsemax(x.numpy())), atol=1e-12, rtol=0
    )
    # Everything below the threshold is exactly zero, and the support is {x > tau}.
    tau = float((x[p > 0] - p[p > 0]).mean())
    assert torch.equal(p > 0, x > tau + 1e-9) or torch.equal(p > 0, x > tau - 1e-9)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=2, max_size=12), st.integers(2, 4))
def test_ties_get_equal_weight(values, copies):
    x = torch.tensor(values + [values[0]] * (copies - 1), dtype=torch.float64)
    for name, f in ALL_MAPS.items():
        p = f(x)
        tied = p[x == values[0]]
        # Equal up to the last bits, where vectorized and scalar exp/pow may differ.
        torch.testing.assert_close(
            tied, tied[:1].expand_as(tied), atol=1e-15, rtol=1e-12, msg=name
        )


def test_sparsemax_one_hot_when_the_gap_exceeds_one():
    x = torch.tensor([[3.0, 1.9, 0.0, -5.0]], dtype=torch.float64)
    assert torch.equal(
        sb.sparsemax(x), torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    )
    one_hot = torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    assert torch.equal(sb.entmax15(x * 2), one_hot)
    assert (sb.softmax(x) > 0).all()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-3, 3), min_size=2, max_size=10))
def test_alpha_to_one_approaches_softmax(values):
    x = torch.tensor(values, dtype=torch.float64)
    p = sb.entmax_bisect(x, alpha=1.0001, n_iter=80)
    torch.testing.assert_close(p, torch.softmax(x, -1), atol=2e-3, rtol=0)


def test_sparsity_grows_with_alpha():
    x = scores((20, 50), scale=1.0)
    zeros = [
        float((sb.entmax_bisect(x, alpha=a) == 0).double().mean())
        for a in (1.25, 1.5, 2, 3)
    ]
    assert zeros == sorted(zeros) and zeros[0] < zeros[-1]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-30, 30), min_size=1, max_size=16))
def test_softmax_one_sums_below_one_and_orders_like_softmax(values):
    x = torch.tensor(values, dtype=torch.float64)
    p = sb.softmax_one(x)
    total = float(p.sum())
    assert 0 < total < 1
    assert abs(total - (1 - 1 / (1 + float(torch.exp(x).sum())))) < 1e-12
    torch.testing.assert_close(p / total, torch.softmax(x, -1))


def test_softmax_one_can_attend_to_nothing_softmax_cannot():
    x = torch.full((8,), -20.0, dtype=torch.float64)
    assert abs(float(sb.softmax(x).sum()) - 1) < 1e-12
    assert float(sb.softmax_one(x).sum()) < 1e-7


# ---------------------------------------------------------------------- extremes


@pytest.mark.parametrize("name", list(ALL_MAPS))
def test_no_positive_score_row(name):
    x = -torch.rand(2, 6, dtype=torch.float64) - 0.1
    p, g = vjp(ALL_MAPS[name], x)
    assert torch.isfinite(p).all() and torch.isfinite(g).all()
    if name == "relu":  # the documented failure mode: nothing to normalize
        assert (p == 0).all() and (g == 0).all()


@pytest.mark.parametrize("name", list(SIMPLEX_MAPS))
def test_simplex_maps_are_shift_invariant_at_large_scores(name):
    x = torch.tensor([[1e4, 1e4 - 0.5, 0.0, -1e4]], dtype=torch.float32)
    p = SIMPLEX_MAPS[name](x)
    torch.testing.assert_close(p, SIMPLEX_MAPS[name](x - 1e4), atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", list(SIMPLEX_MAPS))
def test_simplex_maps_sum_to_one_within_one_rounding_in_half_precision(name, dtype):
    # Scores spread enough that every support holds several keys, so the threshold
    # search runs (peaked scores would make every row one-hot).
    x = scores((4, 33), scale=0.5, dtype=dtype)
    f = SIMPLEX_MAPS[name]
    assert ((f(x.double()) > 0).sum(-1) >= 3).all()
    sums = f(x).double().sum(-1)
    assert ((sums - 1).abs() <= torch.finfo(dtype).eps / 2 + 1e-6).all(), sums


def test_softmax_one_large_logits_match_softmax():
    x = torch.tensor([800.0, 799.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(sb.softmax_one(x), torch.softmax(x, -1))


# ---------------------------------------------------------------------- errors


@pytest.mark.parametrize("alpha", [1.0, 0.5, -2.0, float("nan"), float("inf")])
def test_entmax_bisect_rejects_alpha_not_above_one(alpha):
    with pytest.raises(ValueError, match="alpha must be a finite number > 1"):
        sb.entmax_bisect(torch.zeros(3), alpha=alpha)


def test_entmax_bisect_and_sigmoid_argument_types():
    with pytest.raises(TypeError, match="alpha must be a real number"):
        sb.entmax_bisect(torch.zeros(3), alpha="1.5")
    with pytest.raises(ValueError, match="n_iter must be >= 1"):
        sb.entmax_bisect(torch.zeros(3), n_iter=0)
    with pytest.raises(TypeError, match="bias must be a real number"):
        sb.sigmoid_normalize(torch.zeros(3), bias=torch.tensor(1.0))
    with pytest.raises(ValueError, match="bias must be finite"):
        sb.sigmoid_normalize(torch.zeros(3), bias=float("-inf"))


# ------------------------------------------- what the docs say about speed and bounds


def test_a_small_support_does_not_make_the_partial_sort_pay(monkeypatch):
    # Chapter 6: what decides the partial sort is how many scores lie within 1 of the
    # row maximum (the candidates), not the support. Scores of standard deviation 0.1
    # have a support of a few dozen keys of 4096, yet every key is a candidate, so
    # every row is sorted in full (the fallback), as a plain sort would.
    x = scores((8, 4096), scale=0.1, dtype=torch.float32)
    support = (sb.sparsemax(x) > 0).sum(-1)
    candidates = (x > x.amax(-1, keepdim=True) - 1).sum(-1)
    assert int(support.max()) < 64 and bool((candidates == 4096).all())
    shapes = _spy_thresholds(monkeypatch)
    sb.sparsemax(x)
    assert shapes[-1] == (8, 4096)  # every row redone by the full sort
    # N(0, 1) scores: a few dozen candidates, and only those are sorted.
    y = scores((8, 4096), scale=1.0, dtype=torch.float32)
    assert int((y > y.amax(-1, keepdim=True) - 1).sum(-1).max()) < 4096 // 16


def test_sparsemax_takes_no_newton_steps_entmax15_three(monkeypatch):
    # The sparse-maps page: sparsemax sorts its candidates as they are; only
    # 1.5-entmax, whose bound admits more candidates, takes Newton steps first.
    calls = []
    real = alt._newton

    def spy(v, t, kind, steps):
        calls.append((kind, steps))
        return real(v, t, kind, steps)

    monkeypatch.setattr(alt, "_newton", spy)
    x = scores((16, 2048), scale=1.0)
    sb.sparsemax(x)
    assert calls == []
    sb.entmax15(x)
    assert calls == [("entmax15", 3)]


def test_rounding_reaches_the_bounds_of_softmax_one_and_sigmoid():
    # In exact arithmetic softmax_one sums below 1 and sigmoid stays inside (0, 1);
    # in float32 both reach the bound, as their docstrings say.
    assert float(sb.softmax_one(torch.tensor([20.0])).sum()) == 1.0
    w = sb.sigmoid_normalize(torch.tensor([40.0, float("-inf")]), bias=0.0)
    assert w.tolist() == [1.0, 0.0]
    assert "rounding makes it 1" in " ".join(sb.softmax_one.__doc__.split())
    assert ":math:`[0, 1]`" in sb.sigmoid_normalize.__doc__


@pytest.mark.parametrize("n", [256, 1024, 4096])
def test_candidate_shares_stated_in_the_module_docstring(n):
    # "for rows of 4096 down to 256 N(0, 1) scores, on average about 0.6 to 4 % of
    # the keys for sparsemax"; for 1.5-entmax "from t0 most blocks would qualify",
    # and the four Newton steps on the block maxima keep far fewer; the candidates
    # still hold the whole support.
    b = alt._block_size(n)
    for seed in range(5):
        x = scores((256, n), scale=1.0, seed=seed)
        z = x - x.amax(-1, keepdim=True)
        share_sparsemax = float((z > -1).double().mean())
        assert 0.005 < share_sparsemax < 0.05, share_sparsemax
        top = z.view(256, b, n // b).amax(1)
        assert float((top > -2).double().mean()) > 0.5
        _, bound, candidates, full = alt._block_candidates(x, "entmax15")
        assert float((top > bound).double().mean()) < 0.3 and not bool(full.any())
        support = (sb.entmax15(x) > 0).sum(-1)
        assert bool(((candidates > bound).sum(-1) >= support).all())


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
@pytest.mark.parametrize("n", [302, 4096 + 15])
def test_keys_after_the_last_whole_block_are_candidates(name, n):
    # n mod b keys at the end of a row belong to no block; they are candidates
    # always. Here the two largest keys of every row lie among them.
    x = scores((6, n), scale=1.0)
    x[:, -1], x[:, -2] = 6.0, 5.5
    torch.testing.assert_close(
        getattr(sb, name)(x), getattr(entmax, name)(x, dim=-1), atol=1e-12, rtol=0
    )
