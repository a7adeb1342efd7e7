"""softmaxbook.models: the recall task and the tiny transformer (its training loop is
bookkit's: tests/bookkit/test_training.py)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import softmaxbook as sb


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _model(**kw) -> sb.TinyTransformer:
    kw = {"d_model": 16, "n_heads": 2, "n_layers": 2, "generator": _gen(1), **kw}
    return sb.TinyTransformer(8, 9, **kw)


# --- the task -------------------------------------------------------------------------


def test_recall_shapes_ranges_and_answer():
    tokens, targets = sb.make_associative_recall(
        200, n_pairs=4, n_keys=6, n_values=5, generator=_gen()
    )
    assert tokens.shape == (200, 9) and targets.shape == (200,)
    assert tokens.dtype == targets.dtype == torch.long
    keys, values, query = tokens[:, 0:8:2], tokens[:, 1:8:2], tokens[:, -1]
    assert ((keys >= 0) & (keys < 6)).all() and ((values >= 6) & (values < 11)).all()
    for row in range(200):
        assert len(set(keys[row].tolist())) == 4  # distinct keys: one right answer
        (position,) = (keys[row] == query[row]).nonzero()[0].tolist()
        assert targets[row] == values[row, position]


def test_recall_is_seeded_and_covers_every_slot():
    a = sb.make_associative_recall(500, generator=_gen(3))
    b = sb.make_associative_recall(500, generator=_gen(3))
    c = sb.make_associative_recall(500, generator=_gen(4))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])
    slot = (a[0][:, 0:12:2] == a[0][:, -1:]).float().argmax(-1)
    assert set(slot.tolist()) == set(range(6))


def test_recall_errors():
    with pytest.raises(ValueError, match="n_keys >= n_pairs"):
        sb.make_associative_recall(10, n_pairs=5, n_keys=4)
    with pytest.raises(ValueError, match="n must be >= 1"):
        sb.make_associative_recall(0)
    with pytest.raises(TypeError, match="n_pairs must be an int"):
        sb.make_associative_recall(10, n_pairs=2.0)


# --- the model ------------------------------------------------------------------------


def test_model_shapes():
    model = _model(n_layers=3)
    tokens = torch.randint(8, (5, 7), generator=_gen())
    assert model(tokens).shape == (5, 7, 8)
    logits, weights = model(tokens, return_weights=True)
    assert logits.shape == (5, 7, 8) and weights.shape == (5, 3, 2, 7, 7)


def test_softmax_weights_are_causal_rows_on_the_simplex():
    tokens = torch.randint(8, (4, 9), generator=_gen())
    _, w = _model()(tokens, return_weights=True)
    assert (w >= 0).all()
    assert torch.allclose(w.sum(-1), torch.ones(()), atol=1e-6)
    future = ~sb.causal_mask(9)
    assert (w[..., future] == 0).all()
    _, w = _model(causal=False)(tokens, return_weights=True)
    assert (w[..., future] > 0).all()


def test_attention_layer_matches_torch_sdpa():
    layer = sb.MultiHeadAttention(16, 4)
    x = torch.randn(3, 6, 16, generator=_gen())
    out, _ = layer(x)
    q, k, v = layer.qkv(x).view(3, 6, 3, 4, 4).permute(2, 0, 3, 1, 4)
    heads = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    expected = layer.out(heads.transpose(1, 2).reshape(3, 6, 16))
    assert torch.allclose(out, expected, atol=1e-6)


def test_scale_and_temperature():
    assert _model().blocks[0].attn.score_scale == pytest.approx(1 / math.sqrt(8))
    assert _model(scale=1.0).blocks[0].attn.score_scale == 1.0
    assert _model(temperature=0.1).blocks[0].attn.score_scale == pytest.approx(
        10 / math.sqrt(8)
    )
    tokens = torch.randint(8, (16, 9), generator=_gen())
    entropy = {
        t: sb.attention_entropy(
            _model(temperature=t)(tokens, return_weights=True)[1]
        ).mean()
        for t in (0.1, 1.0, 10.0)
    }
    assert entropy[0.1] < entropy[1.0] < entropy[10.0]


def test_init_gain_sharpens_attention():
    tokens = torch.randint(8, (16, 9), generator=_gen())
    flat = sb.attention_entropy(_model()(tokens, return_weights=True)[1]).mean()
    sharp = sb.attention_entropy(
        _model(init_gain=3.0)(tokens, return_weights=True)[1]
    ).mean()
    assert sharp < flat


def test_initialization_is_seeded():
    tokens = torch.randint(8, (2, 9), generator=_gen())
    a, b, c = _model(), _model(), _model(generator=_gen(2))
    assert torch.equal(a(tokens), b(tokens))
    assert not torch.equal(a(tokens), c(tokens))


def test_callable_normalizer_equals_named():
    tokens = torch.randint(8, (3, 9), generator=_gen())
    named = _model()(tokens)
    custom = _model(normalizer=lambda s, dim=-1: torch.softmax(s, dim=dim))(tokens)
    assert torch.allclose(named, custom, atol=1e-6)


@pytest.mark.parametrize("name", sorted(sb.NORMALIZERS))
def test_every_named_normalizer_runs_forward_and_backward(name):
    model = _model(normalizer=name)
    tokens = torch.randint(8, (4, 9), generator=_gen())
    logits, w = model(tokens, return_weights=True)
    assert torch.isfinite(logits).all() and torch.isfinite(w).all()
    assert (w >= 0).all() and (w[..., ~sb.causal_mask(9)] == 0).all()
    logits.sum().backward()
    assert all(
        torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None
    )


def test_model_errors():
    with pytest.raises(ValueError, match="multiple of n_heads"):
        _model(d_model=10, n_heads=4)
    with pytest.raises(ValueError, match="unknown"):
        _model(normalizer="no-such-normalizer")
    with pytest.raises(ValueError, match="temperature"):
        _model(temperature=0.0)
    with pytest.raises(ValueError, match="scale"):
        _model(scale=-1.0)
    model = _model()
    with pytest.raises(TypeError, match="integer tensor"):
        model(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="max_len=9"):
        model(torch.zeros(2, 10, dtype=torch.long))


# --- sinks and gates ---------------------------------------------------------------


def test_learned_sinks_are_a_parameter_per_head_that_trains():
    model = _model(sinks=True)
    names = dict(model.named_parameters())
    assert names["blocks.0.attn.sinks"].shape == (2,)
    assert (names["blocks.1.attn.sinks"] == 0).all()
    tokens = torch.randint(8, (4, 9), generator=_gen())
    logits, w = model(tokens, return_weights=True)
    # Sink logit 0 at initialization: every head is softmax_one.
    plain = _model()
    plain.load_state_dict(
        {k: v for k, v in model.state_dict().items() if not k.endswith("sinks")}
    )
    plain_logits = plain(tokens)
    assert (w.sum(-1) < 1).all()
    assert not torch.allclose(logits, plain_logits)
    one = _model(normalizer="softmax_one")
    one.load_state_dict(plain.state_dict())
    torch.testing.assert_close(logits, one(tokens))
    logits.sum().backward()
    assert model.blocks[0].attn.sinks.grad.abs().sum() > 0


def test_gate_multiplies_the_heads_and_trains():
    model = _model(gate=True)
    block = model.blocks[0].attn
    assert block.gate.weight.shape == (16, 16)
    x = torch.randn(3, 9, 16, generator=_gen(2))
    out, _ = block(x)
    with torch.no_grad():
        block.gate.bias.fill_(-1e4)  # close the gate
    shut, _ = block(x)
    # A closed gate leaves only the output projection's bias.
    torch.testing.assert_close(shut, block.out.bias.expand_as(shut))
    assert not torch.allclose(out, shut)
    tokens = torch.randint(8, (4, 9), generator=_gen())
    model(tokens).sum().backward()
    assert model.blocks[1].attn.gate.weight.grad.abs().sum() > 0


def test_sinks_need_softmax():
    with pytest.raises(ValueError, match="sinks=True needs the softmax"):
        _model(sinks=True, normalizer="sparsemax")


def test_the_order_blind_guess_beats_one_over_p_when_values_repeat():
    # Betting on the most frequent value of the context (ties split) is right with
    # probability E[largest count] / P, not 1/P "at best": with the defaults (6 pairs,
    # 16 values) a value repeats in about two thirds of the sequences and the guess is
    # right about 29 % of the time, as the docstring says.
    g = torch.Generator().manual_seed(0)
    tokens, _ = sb.make_associative_recall(20_000, generator=g)
    values = tokens[:, 1:-1:2]  # (n, P)
    counts = (values[:, :, None] == values[:, None, :]).sum(-1)
    largest = counts.amax(-1)
    blind = float(largest.double().mean()) / values.shape[1]  # ties split evenly
    repeats = float((largest > 1).double().mean())
    assert 0.27 < blind < 0.31 and blind > 1 / 6 + 0.1
    assert 0.6 < repeats < 0.72
    doc = " ".join(sb.make_associative_recall.__doc__.split())
    assert "at best" not in doc and "about 29 %" in doc


def _spy_on_torch_sdpa(monkeypatch):
    """Count the calls that reach torch's fused kernel from the library."""
    from softmaxbook.attention import sdpa

    calls = []
    real = sdpa.F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(sdpa.F, "scaled_dot_product_attention", spy)
    return calls


@pytest.mark.parametrize("causal", [True, False])
def test_without_the_weights_the_layer_takes_the_fused_path(causal, monkeypatch):
    # need_weights=False (torch's nn.MultiheadAttention's name): no (B, H, L, L)
    # weights, torch's fused kernel, the same output within float32 rounding.
    torch.manual_seed(0)
    layer = sb.MultiHeadAttention(16, 4, causal=causal)
    x = torch.randn(3, 7, 16)
    calls = _spy_on_torch_sdpa(monkeypatch)
    with_weights, weights = layer(x)
    assert weights.shape == (3, 4, 7, 7) and not calls  # the explicit path
    fast, none = layer(x, need_weights=False)
    assert none is None and len(calls) == 1  # torch's fused kernel, once
    torch.testing.assert_close(fast, with_weights, atol=1e-6, rtol=1e-5)
    q = torch.randn(3, 4, 7, 4)
    path = sb.explain_dispatch("scaled_dot_product_attention", q, q, q).path
    assert path == "torch-fused"


def test_the_model_without_weights_runs_every_layer_fused(monkeypatch):
    torch.manual_seed(0)
    model = sb.TinyTransformer(11, 9, d_model=16, n_heads=2, n_layers=3)
    tokens = torch.randint(0, 11, (2, 9))
    calls = _spy_on_torch_sdpa(monkeypatch)
    logits, maps = model(tokens, return_weights=True)
    assert not calls and maps.shape == (2, 3, 2, 9, 9)
    fast = model(tokens)
    assert len(calls) == 3  # one fused call per layer
    torch.testing.assert_close(fast, logits, atol=1e-5, rtol=1e-5)
    with pytest.raises(TypeError, match="need_weights"):
        model.blocks[0].attn(torch.randn(1, 2, 16), need_weights=1)
