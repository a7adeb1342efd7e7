"""softmaxbook.normalizers.sinks: sink logits, softpick, clipped softmax, ReLU
attention; and the score gap that ignoring keys takes (softmaxbook.analysis).

Each map against its defining formula (and against the authors' published code
where there is one), its own properties (exact zeros, gradients that stop, the
sum of the weights), and the errors. The contract every normalizer keeps
(removed keys, empty rows, half precision, torch.func, gradcheck) is checked on
every registered normalizer in test_normalizer_contract.py.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F

import softmaxbook as sb
from random_inputs import scores

# ---------------------------------------------------------------------- sink_softmax


def _cat_reference(x, sink, dim=-1):
    """Softmax over the row and its sink logit, the sink's weight dropped."""
    row = list(x.shape)
    row[dim] = 1
    extra = torch.as_tensor(sink, dtype=x.dtype).expand(row)
    full = torch.cat([x, extra], dim).softmax(dim)
    return full.narrow(dim, 0, x.shape[dim])


@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_sink_softmax_is_softmax_with_an_extra_logit(dim):
    x = scores((4, 5, 6), scale=3.0)
    row = [4, 5, 6]
    row[dim] = 1
    sink = scores(tuple(row), scale=2.0, seed=3)
    torch.testing.assert_close(
        sb.sink_softmax(x, sink, dim=dim), _cat_reference(x, sink, dim)
    )
    # A number broadcasts to every row.
    torch.testing.assert_close(
        sb.sink_softmax(x, 1.5, dim=dim), _cat_reference(x, 1.5, dim)
    )


def test_sink_softmax_with_sink_zero_is_softmax_one_and_minus_inf_is_softmax():
    x = scores((3, 7))
    torch.testing.assert_close(sb.sink_softmax(x, 0.0), sb.softmax_one(x))
    torch.testing.assert_close(sb.sink_softmax(x, float("-inf")), torch.softmax(x, -1))


def test_sink_softmax_weights_sum_to_one_minus_the_sink_weight():
    x = scores((5, 8))
    sink = scores((5, 1), seed=2)
    total = sb.sink_softmax(x, sink).sum(-1, keepdim=True)
    sink_weight = torch.exp(sink) / (
        torch.exp(sink) + torch.exp(x).sum(-1, keepdim=True)
    )
    torch.testing.assert_close(total, 1 - sink_weight)
    assert (total < 1).all()


def test_sink_softmax_gradient_with_respect_to_the_sink():
    x = scores((4, 6))
    sink = scores((4, 1), seed=5).requires_grad_(True)
    xs = x.clone().requires_grad_(True)
    w = scores((4, 6), seed=6)
    (sb.sink_softmax(xs, sink) * w).sum().backward()
    ref_sink = sink.detach().clone().requires_grad_(True)
    ref_x = x.clone().requires_grad_(True)
    (_cat_reference(ref_x, ref_sink) * w).sum().backward()
    torch.testing.assert_close(sink.grad, ref_sink.grad)
    torch.testing.assert_close(xs.grad, ref_x.grad)
    # d p_i / d b = -p_i p_sink
    p = sb.sink_softmax(x, sink.detach())
    p_sink = 1 - p.sum(-1, keepdim=True)
    torch.testing.assert_close(sink.grad, -(p * w).sum(-1, keepdim=True) * p_sink)


def test_sink_softmax_gradcheck_in_x_and_sink():
    x = scores((3, 5), scale=1.5).requires_grad_(True)
    sink = torch.tensor([[0.3], [-1.0], [2.0]], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(sb.sink_softmax, (x, sink))
    masked = x.detach().clone()
    masked[1] = float("-inf")
    masked[0, 2] = float("-inf")
    masked.requires_grad_(True)
    p = sb.sink_softmax(masked, sink)
    assert (p[1] == 0).all() and p[0, 2] == 0
    p.sum().backward()
    assert torch.isfinite(masked.grad).all() and (masked.grad[1] == 0).all()
    assert torch.isfinite(sink.grad).all() and sink.grad[1] == 0


def test_sink_softmax_large_logits_do_not_overflow():
    x = torch.tensor([[1e4, 1e4 - 1.0, -1e4]], dtype=torch.float32)
    p = sb.sink_softmax(x, 1e4 + 2.0)
    torch.testing.assert_close(p.double(), _cat_reference(x.double(), 1e4 + 2.0))
    assert torch.isfinite(sb.sink_softmax(x, -1e4)).all()


def test_sink_softmax_sink_far_above_the_scores():
    """The shift includes the sink: e^(b - max x) alone overflows float32 for
    b = 100 above scores near 0, and its gradient would then be inf * 0 = nan."""
    x = torch.tensor([[0.0, -1.0, 0.5]], requires_grad=True)
    sink = torch.tensor(100.0, requires_grad=True)
    p = sb.sink_softmax(x, sink)
    (p * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    x64, sink64 = x.detach().double().requires_grad_(), sink.detach().double()
    sink64.requires_grad_()
    p64 = _cat_reference(x64, sink64)
    (p64 * torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)).sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(sink.grad)
    torch.testing.assert_close(p.double(), p64.detach(), atol=1e-30, rtol=0)
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=1e-30, rtol=0)


def test_sink_softmax_bad_sinks():
    x = scores((3, 4))
    with pytest.raises(ValueError, match="broadcast"):
        sb.sink_softmax(x, torch.zeros(3, 4))  # one per entry, not per row
    with pytest.raises(TypeError, match="floating-point"):
        sb.sink_softmax(x, torch.zeros(3, 1, dtype=torch.long))
    with pytest.raises(TypeError, match="real number"):
        sb.sink_softmax(x, "0")
    with pytest.raises(TypeError, match="real number"):
        sb.sink_softmax(x, True)


def test_sink_softmax_takes_sinks_by_position_and_by_name_and_no_longer_sink():
    x = scores((3, 4))
    b = scores((3, 1), seed=3)
    expected = _cat_reference(x, b)
    torch.testing.assert_close(sb.sink_softmax(x, b, -1), expected)
    torch.testing.assert_close(sb.sink_softmax(x, sinks=b, dim=-1), expected)
    # 0.2's spelling sink= was removed in 0.3, as its deprecation warning said.
    with pytest.raises(TypeError, match="sink"):
        sb.sink_softmax(x, sink=b)
    # The default sink logit, 0, is softmax_one's.
    torch.testing.assert_close(sb.sink_softmax(x), sb.softmax_one(x))


# ---------------------------------------------------------------------- softpick


def _softpick_published(x, dim=-1, eps=1e-8):
    """The formula as the authors' reference code writes it (naive_softpick_attn.py)."""
    x_m = torch.max(x, dim=dim, keepdim=True).values
    x_m_e_m = torch.exp(-x_m)
    x_e_1 = torch.exp(x - x_m) - x_m_e_m
    r_x_e_1 = F.relu(x_e_1)
    a_x_e_1 = torch.where(x.isfinite(), torch.abs(x_e_1), 0)
    return r_x_e_1 / (torch.sum(a_x_e_1, dim=dim, keepdim=True) + eps)


def test_softpick_matches_its_formula_and_the_published_code():
    x = scores((6, 9), scale=1.5)
    x[:, 0] = 1.0  # every row has a positive score
    e = torch.expm1(x)
    expected = torch.relu(e) / e.abs().sum(-1, keepdim=True)
    torch.testing.assert_close(sb.softpick(x), expected)
    # The published code shifts by the row maximum and adds eps: equal to ~1e-8.
    torch.testing.assert_close(
        sb.softpick(x), _softpick_published(x), atol=1e-7, rtol=0
    )
    masked = x.clone()
    masked[:, 3] = float("-inf")
    torch.testing.assert_close(
        sb.softpick(masked), _softpick_published(masked), atol=1e-7, rtol=0
    )


def test_softpick_zero_on_non_positive_scores_and_sum_is_p_over_p_plus_n():
    x = scores((8, 10), scale=2.0)
    p = sb.softpick(x)
    assert (p[x <= 0] == 0).all() and (p[x > 0] > 0).all()
    e = torch.expm1(x)
    positive = e.clamp_min(0).sum(-1)
    negative = (-e).clamp_min(0).sum(-1)
    torch.testing.assert_close(p.sum(-1), positive / (positive + negative))
    # A row of non-positive scores attends to nothing: weights and gradient 0.
    quiet = (-torch.rand(3, 5, dtype=torch.float64)).requires_grad_(True)
    out = sb.softpick(quiet)
    assert (out == 0).all()
    (out * scores((3, 5), seed=4)).sum().backward()
    assert (quiet.grad == 0).all()


def test_softpick_is_accurate_near_zero():
    # e^x - 1 computed as exp(x) - 1 would lose every digit here; expm1 keeps them.
    x = torch.tensor([1e-7, 2e-7, -1e-7], dtype=torch.float32)
    p = sb.softpick(x)
    exact = sb.softpick(x.double())
    torch.testing.assert_close(p.double(), exact, rtol=1e-6, atol=0)
    torch.testing.assert_close(
        exact, torch.tensor([0.25, 0.5, 0.0], dtype=torch.float64), rtol=1e-6, atol=0
    )


def test_softpick_is_not_shift_invariant():
    x = scores((2, 6))
    assert not torch.allclose(sb.softpick(x), sb.softpick(x + 1.0))


# ---------------------------------------------------------------------- clipped softmax


def test_clipped_softmax_matches_the_published_code():
    # transformers_language/models/softmax.py of
    # Qualcomm-AI-research/outlier-free-transformers
    def published(data, dim=1, eta=1.1, gamma=-0.1):
        sm_out = torch.nn.functional.softmax(data, dim=dim)
        stretched_out = sm_out * (eta - gamma) + gamma
        return torch.clip(stretched_out, 0, 1)

    x = scores((5, 7), scale=3.0)
    for gamma, zeta in [(-0.025, 1.0), (-0.1, 1.1), (0.0, 1.0), (-0.3, 1.5)]:
        torch.testing.assert_close(
            sb.clipped_softmax(x, 0, gamma=gamma, zeta=zeta),
            published(x, dim=0, eta=zeta, gamma=gamma),
        )
    torch.testing.assert_close(sb.clipped_softmax(x, gamma=0.0), torch.softmax(x, -1))


def test_clipped_softmax_exact_zeros_and_ones_stop_the_gradient():
    gamma, zeta = -0.05, 1.05
    x = torch.tensor([[8.0, 0.0, -1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    p = sb.clipped_softmax(x, gamma=gamma, zeta=zeta)
    s = torch.softmax(x.detach(), -1)
    zero = s <= -gamma / (zeta - gamma)
    one = s >= (1 - gamma) / (zeta - gamma)
    assert zero.any() and one.any()
    assert (p[zero] == 0).all() and (p[one] == 1).all()
    (p * torch.arange(1.0, 5.0, dtype=torch.float64)).sum().backward()
    # Every weight is clipped: no score can change any weight, the gradient is 0.
    assert (zero | one).all() and (x.grad == 0).all()


def test_clipped_softmax_errors():
    x = scores((2, 3))
    with pytest.raises(ValueError, match="gamma"):
        sb.clipped_softmax(x, gamma=0.1)
    with pytest.raises(ValueError, match="zeta"):
        sb.clipped_softmax(x, zeta=0.9)
    with pytest.raises(ValueError, match="finite"):
        sb.clipped_softmax(x, gamma=float("-inf"))
    with pytest.raises(TypeError, match="real number"):
        sb.clipped_softmax(x, zeta="1")


# ---------------------------------------------------------------------- ReLU attention


def test_relu_attention_is_relu_over_the_length():
    x = scores((4, 9))
    torch.testing.assert_close(sb.relu_attention(x), torch.relu(x) / 9)
    torch.testing.assert_close(sb.relu_attention(x, dim=0), torch.relu(x) / 4)


def test_relu_attention_counts_the_keys_a_row_may_attend_to():
    x = scores((3, 6))
    padded = torch.cat([x, torch.full((3, 4), float("-inf"), dtype=x.dtype)], -1)
    # Padding does not change the weights of the real keys.
    torch.testing.assert_close(sb.relu_attention(padded)[:, :6], sb.relu_attention(x))
    # Under a causal mask, query i sees i + 1 keys.
    causal = x.new_zeros(6, 6).masked_fill(~sb.causal_mask(6), float("-inf"))
    square = scores((6, 6)) + causal
    expected = torch.relu(square) / torch.arange(1, 7, dtype=x.dtype)[:, None]
    torch.testing.assert_close(sb.relu_attention(square), expected)


def test_relu_attention_is_continuous_where_relu_normalize_jumps():
    eps = 1e-6
    row = torch.tensor([0.0, -1.0, -2.0], dtype=torch.float64)
    above, below = row + eps, row - eps
    assert (
        float(sb.relu_normalize(above)[0]) == 1
        and float(sb.relu_normalize(below).sum()) == 0
    )
    assert (sb.relu_attention(above) - sb.relu_attention(below)).abs().max() <= eps


# ---------------------------------------------------------------------- ignore_gap


@pytest.mark.parametrize("n", [1, 10, 1000])
@pytest.mark.parametrize("eps", [1e-2, 1e-4])
def test_ignore_gap_of_softmax_with_a_sink_key(n, eps):
    softmax = lambda s, dim=-1: torch.softmax(s, dim)  # noqa: E731
    expected = math.log(n * (1 - eps) / eps)
    assert ignore_close(sb.ignore_gap(softmax, n, eps), expected)
    # softmax_one has the sink key built in; a sink logit b moves the gap by b.
    assert ignore_close(sb.ignore_gap(sb.softmax_one, n, eps, sink_key=False), expected)
    shifted = functools.partial(sb.sink_softmax, sinks=3.0)
    assert ignore_close(sb.ignore_gap(shifted, n, eps, sink_key=False), expected - 3.0)


def ignore_close(got, expected):
    return abs(got - expected) <= 1e-9 * max(1.0, abs(expected))


def test_ignore_gap_of_the_other_normalizers():
    softmax = lambda s, dim=-1: torch.softmax(s, dim)  # noqa: E731
    assert sb.ignore_gap(softmax, 10, sink_key=False) == math.inf
    assert sb.ignore_gap(sb.softpick, 10) == 0.0
    assert sb.ignore_gap(sb.relu_attention, 10) == 0.0
    # Clipped softmax: each irrelevant key is clipped to 0 once its softmax weight
    # is at most t = -gamma / (zeta - gamma) = 0.025 / 1.025, at the gap
    # log(1/t - n); the total weight falls continuously to 0 just before it.
    exact_zero = math.log(1.025 / 0.025 - 10)
    gaps = [sb.ignore_gap(sb.clipped_softmax, 10, eps) for eps in (1e-3, 1e-6, 1e-9)]
    assert gaps[0] < gaps[1] < gaps[2] <= exact_zero
    assert exact_zero - gaps[1] < 1e-4 and gaps[2] - gaps[1] < 1e-4
    # A thousand times smaller eps costs softmax log(1000) more, every time.
    assert ignore_close(
        sb.ignore_gap(softmax, 10, 1e-9) - sb.ignore_gap(softmax, 10, 1e-6),
        math.log(1000 * (1 - 1e-9) / (1 - 1e-6)),
    )


def test_ignore_gap_errors():
    with pytest.raises(TypeError, match="callable"):
        sb.ignore_gap("softmax", 3)
    with pytest.raises(ValueError, match="eps"):
        sb.ignore_gap(sb.softpick, 3, eps=1.0)
    with pytest.raises(ValueError, match="n must be"):
        sb.ignore_gap(sb.softpick, 0)


def test_what_the_docstrings_promise_at_the_edges():
    # clipped_softmax gives exact ones only when stretched above 1 (zeta > 1): with the
    # default zeta = 1 the largest weight stays below 1 at any finite gap, as the
    # module docstring now says. sink_softmax's weights sum below 1 only in exact
    # arithmetic: a score 200 above the sink rounds the sum to 1 in float32.
    from softmaxbook.normalizers import sinks

    row = torch.tensor([10.0, 0.0, 0.0])
    assert sb.clipped_softmax(row)[0] < 1
    assert sb.clipped_softmax(row, zeta=1.1)[0] == 1
    assert "``zeta > 1``" in " ".join(sinks.__doc__.split())
    assert float(sb.sink_softmax(torch.tensor([100.0]), -100.0).sum()) == 1.0
    assert "below 1 in exact arithmetic" in " ".join(sb.sink_softmax.__doc__.split())
