"""softmaxbook.models: the recall task, the tiny transformer, and a short training run
that learns."""

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


# --- training and evaluation ----------------------------------------------------------


class _Oracle(torch.nn.Module):
    """Puts a logit of 10 on the target: the answer at the last position is always
    right."""

    def __init__(self, targets):
        super().__init__()
        self.targets = targets

    def forward(self, tokens):
        logits = torch.zeros(*tokens.shape, 8)
        logits[torch.arange(len(tokens)), -1, self.targets[: len(tokens)]] = 10.0
        return logits


def test_evaluate_hand_case():
    tokens = torch.zeros(4, 3, dtype=torch.long)
    targets = torch.tensor([1, 2, 3, 4])
    scores = sb.evaluate(_Oracle(targets), (tokens, targets))
    assert scores["accuracy"] == 1.0
    assert scores["loss"] == pytest.approx(
        -math.log(math.exp(10) / (math.exp(10) + 7)), abs=1e-6
    )
    wrong = sb.evaluate(_Oracle(targets + 1), (tokens, targets))
    assert wrong["accuracy"] == 0.0


def test_evaluate_per_position_targets_ignore_minus_100():
    model = _model()
    tokens = torch.randint(8, (5, 9), generator=_gen())
    targets = torch.full((5, 9), -100)
    targets[:, -1] = 3
    last = sb.evaluate(model, (tokens, torch.full((5,), 3)))
    every = sb.evaluate(model, (tokens, targets))
    assert every["loss"] == pytest.approx(last["loss"], rel=1e-6)


def _recall(n, seed):
    return sb.make_associative_recall(
        n, n_pairs=2, n_keys=3, n_values=3, generator=_gen(seed)
    )


def test_short_training_run_learns():
    torch.manual_seed(0)
    model = sb.TinyTransformer(6, 5, d_model=16, n_heads=2, generator=_gen(1))
    history = sb.train(
        model,
        _recall(2000, 0),
        steps=120,
        batch_size=32,
        lr=1e-2,
        warmup=10,
        eval_data=_recall(500, 1),
        eval_every=60,
        generator=_gen(2),
    )
    assert history.steps == [0, 60, 120]
    assert history.eval_loss[-1] < 0.5 * history.eval_loss[0]
    assert history.eval_accuracy[-1] > 0.6  # chance is 1/3 for a guess among the values
    assert (
        history.entropy.shape
        == history.distance.shape
        == history.sparsity.shape
        == (3, 2, 2)
    )


def test_training_is_deterministic():
    def run():
        model = _model(d_model=16, n_heads=2)
        data = sb.make_associative_recall(
            300, n_pairs=4, n_keys=4, n_values=4, generator=_gen()
        )
        history = sb.train(model, data, steps=20, eval_every=10, generator=_gen(5))
        return history, model

    (h1, m1), (h2, m2) = run(), run()
    assert h1.train_loss == h2.train_loss and h1.eval_accuracy == h2.eval_accuracy
    assert torch.equal(h1.entropy, h2.entropy)
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters()))


def test_train_prints_only_with_progress(capsys):
    data = sb.make_associative_recall(
        50, n_pairs=4, n_keys=4, n_values=4, generator=_gen()
    )
    sb.train(_model(), data, steps=3, track_attention=False)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
    history = sb.train(_model(), data, steps=3, track_attention=False, progress=True)
    captured = capsys.readouterr()
    assert "3/3" in captured.out and captured.err == ""
    assert history.entropy.numel() == 0 and len(history.steps) == 2


def test_train_errors():
    model = _model()
    data = sb.make_associative_recall(
        10, n_pairs=4, n_keys=4, n_values=4, generator=_gen()
    )
    with pytest.raises(TypeError, match="pair"):
        sb.train(model, data[0])
    with pytest.raises(ValueError, match="targets"):
        sb.train(model, (data[0], data[1][:5]))
    with pytest.raises(ValueError, match="steps must be >= 1"):
        sb.train(model, data, steps=0)
    with pytest.raises(ValueError, match="lr"):
        sb.train(model, data, lr=0.0)
    with pytest.raises(ValueError, match="warmup"):
        sb.train(model, data, warmup=-1)


def test_train_argument_types_and_nan():
    # A wrong type is a TypeError, a bad value a ValueError, and nan is never taken.
    model = _model()
    data = sb.make_associative_recall(
        10, n_pairs=4, n_keys=4, n_values=4, generator=_gen()
    )
    with pytest.raises(TypeError, match="warmup must be an int"):
        sb.train(model, data, steps=1, warmup=1.5)
    for bad in (float("nan"), float("inf"), -0.1):
        with pytest.raises(ValueError, match="weight_decay must be a finite number"):
            sb.train(model, data, steps=1, weight_decay=bad)
    with pytest.raises(TypeError, match="weight_decay must be a real number"):
        sb.train(model, data, steps=1, weight_decay="0.1")


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
