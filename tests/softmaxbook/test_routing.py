"""Tests for softmaxbook.routing: the top-k router of a mixture-of-experts layer."""

from __future__ import annotations

import pytest
import torch

import softmaxbook as sb
from softmaxbook.routing import route_topk


def _logits(n=16, E=8, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, E, generator=g, dtype=dtype) * 2


def _reference(logits, k, score, normalize, bias, scale):
    """Row by row in plain Python: the formula of the docstring."""
    weights, indices = [], []
    for row in logits.tolist():
        z = torch.tensor(row, dtype=torch.float64)
        s = torch.softmax(z, -1) if score == "softmax" else 1 / (1 + torch.exp(-z))
        chooser = s + (bias if bias is not None else 0.0)
        order = sorted(range(len(row)), key=lambda e: -float(chooser[e]))[:k]
        w = torch.stack([s[e] for e in order])
        if normalize:
            w = w / w.sum()
        weights.append(w * scale)
        indices.append(order)
    return torch.stack(weights), torch.tensor(indices)


@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_the_formula(score, normalize, with_bias):
    for seed in range(5):
        z = _logits(seed=seed)
        g = torch.Generator().manual_seed(100 + seed)
        bias = (
            torch.randn(8, generator=g, dtype=torch.float64) * 0.3
            if with_bias
            else None
        )
        w, i = route_topk(z, 3, score=score, normalize=normalize, bias=bias, scale=2.5)
        w_ref, i_ref = _reference(z, 3, score, normalize, bias, 2.5)
        assert torch.equal(i, i_ref)
        torch.testing.assert_close(w, w_ref, rtol=1e-12, atol=1e-14)


def test_softmax_topk_renormalized_is_softmax_over_the_topk_logits():
    # The Mixtral identity: the common factor 1/sum_j exp(z_j) cancels.
    z = _logits(seed=3)
    w, i = route_topk(z, 2, score="softmax", normalize=True)
    torch.testing.assert_close(
        w, torch.softmax(z.gather(-1, i), -1), rtol=1e-13, atol=0
    )


def test_sigmoid_normalized_differs_from_softmax_over_topk():
    z = torch.tensor([[3.0, 1.0, -2.0, -4.0]], dtype=torch.float64)
    w_sig, _ = route_topk(z, 2, score="sigmoid")
    w_soft, _ = route_topk(z, 2, score="softmax")
    assert (w_sig - w_soft).abs().max() > 0.1


def test_bias_moves_the_choice_not_the_weights():
    z = torch.tensor([[2.0, 1.9, 0.0, -1.0]], dtype=torch.float64)
    bias = torch.tensor([0.0, 0.0, 0.5, 0.0], dtype=torch.float64)
    _, plain = route_topk(z, 2, score="sigmoid")
    w, biased = route_topk(z, 2, score="sigmoid", bias=bias)
    assert plain.tolist() == [[0, 1]] and sorted(biased.tolist()[0]) == [0, 2]
    s = torch.sigmoid(z)[0, [0, 2]]
    torch.testing.assert_close(w[0].sort().values, (s / s.sum()).sort().values)


def test_all_neg_inf_row_gets_zero_weights():
    z = _logits(n=3)
    z[1] = float("-inf")
    for score in ("softmax", "sigmoid"):
        w, _ = route_topk(z, 2, score=score)
        assert torch.equal(w[1], torch.zeros(2, dtype=z.dtype))
        assert torch.isfinite(w).all()


def test_half_precision_is_scored_in_float32():
    z = _logits(dtype=torch.float32)
    w16, i16 = route_topk(z.bfloat16(), 2)
    w32, _ = route_topk(z.bfloat16().float(), 2)
    assert w16.dtype == torch.bfloat16 and i16.dtype == torch.int64
    torch.testing.assert_close(w16.float(), w32, rtol=1e-2, atol=0)


def test_batch_shapes():
    z = torch.randn(2, 5, 8, dtype=torch.float64)
    w, i = route_topk(z, 3)
    assert w.shape == (2, 5, 3) and i.shape == (2, 5, 3)


@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
def test_gradcheck(score):
    z = _logits(n=4, E=6).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: route_topk(t, 2, score=score)[0], (z,))


def test_exported():
    assert sb.route_topk is route_topk
    assert sb.API_STABILITY["route_topk"] == "experimental"


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"logits": torch.tensor([[1, 2, 3]])}, TypeError, "logits"),
        ({"logits": torch.tensor(1.0)}, ValueError, "logits"),
        ({"k": 0}, ValueError, "k"),
        ({"k": 9}, ValueError, "k=9"),
        ({"k": 2.0}, TypeError, "k"),
        ({"score": "relu"}, ValueError, "score"),
        ({"normalize": 1}, TypeError, "normalize"),
        ({"bias": torch.zeros(3)}, ValueError, "bias"),
        ({"bias": torch.zeros(8, dtype=torch.int64)}, TypeError, "bias"),
        ({"scale": 0.0}, ValueError, "scale"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    args = {"logits": torch.randn(4, 8), "k": 2, **kwargs}
    logits, k = args.pop("logits"), args.pop("k")
    with pytest.raises(error, match=match):
        route_topk(logits, k, **args)


def test_compiles_with_fullgraph():
    # Dynamo captures the whole router in one graph (aot_eager: no code generation).
    def f(z, b):
        return route_topk(z, 2, score="sigmoid", bias=b, scale=2.5)

    z, b = _logits(n=4, E=8), torch.zeros(8, dtype=torch.float64)
    w, i = torch.compile(f, fullgraph=True, backend="aot_eager")(z, b)
    w_ref, i_ref = f(z, b)
    assert torch.equal(i, i_ref)
    torch.testing.assert_close(w, w_ref, rtol=1e-12, atol=0)
