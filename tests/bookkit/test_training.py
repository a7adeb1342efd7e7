"""bookkit.train and bookkit.evaluate: the book's training loop, on the library's
tiny transformer: scores by hand, a short run that learns, determinism, errors."""

from __future__ import annotations

import math

import pytest
import torch

import bookkit as bk
import softmaxbook as sb


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _model(**kw) -> sb.TinyTransformer:
    kw = {"d_model": 16, "n_heads": 2, "n_layers": 2, "generator": _gen(1), **kw}
    return sb.TinyTransformer(8, 9, **kw)


# --- evaluation by hand, then short runs ----------------------------------------------


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
    scores = bk.evaluate(_Oracle(targets), (tokens, targets))
    assert scores["accuracy"] == 1.0
    assert scores["loss"] == pytest.approx(
        -math.log(math.exp(10) / (math.exp(10) + 7)), abs=1e-6
    )
    wrong = bk.evaluate(_Oracle(targets + 1), (tokens, targets))
    assert wrong["accuracy"] == 0.0


def test_evaluate_per_position_targets_ignore_minus_100():
    model = _model()
    tokens = torch.randint(8, (5, 9), generator=_gen())
    targets = torch.full((5, 9), -100)
    targets[:, -1] = 3
    last = bk.evaluate(model, (tokens, torch.full((5,), 3)))
    every = bk.evaluate(model, (tokens, targets))
    assert every["loss"] == pytest.approx(last["loss"], rel=1e-6)


def _recall(n, seed):
    return sb.make_associative_recall(
        n, n_pairs=2, n_keys=3, n_values=3, generator=_gen(seed)
    )


def test_short_training_run_learns():
    torch.manual_seed(0)
    model = sb.TinyTransformer(6, 5, d_model=16, n_heads=2, generator=_gen(1))
    history = bk.train(
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
        history = bk.train(model, data, steps=20, eval_every=10, generator=_gen(5))
        return history, model

    (h1, m1), (h2, m2) = run(), run()
    assert h1.train_loss == h2.train_loss and h1.eval_accuracy == h2.eval_accuracy
    assert torch.equal(h1.entropy, h2.entropy)
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters()))


def test_train_prints_only_with_progress(capsys):
    data = sb.make_associative_recall(
        50, n_pairs=4, n_keys=4, n_values=4, generator=_gen()
    )
    bk.train(_model(), data, steps=3, track_attention=False)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
    history = bk.train(_model(), data, steps=3, track_attention=False, progress=True)
    captured = capsys.readouterr()
    assert "3/3" in captured.out and captured.err == ""
    assert history.entropy.numel() == 0 and len(history.steps) == 2


def test_train_errors():
    model = _model()
    data = sb.make_associative_recall(
        10, n_pairs=4, n_keys=4, n_values=4, generator=_gen()
    )
    with pytest.raises(TypeError, match="pair"):
        bk.train(model, data[0])
    with pytest.raises(ValueError, match="targets"):
        bk.train(model, (data[0], data[1][:5]))
    with pytest.raises(ValueError, match="steps must be >= 1"):
        bk.train(model, data, steps=0)
    with pytest.raises(ValueError, match="lr"):
        bk.train(model, data, lr=0.0)
    with pytest.raises(ValueError, match="warmup"):
        bk.train(model, data, warmup=-1)


def test_train_argument_types_and_nan():
    # A wrong type is a TypeError, a bad value a ValueError, and nan is never taken.
    model = _model()
    data = sb.make_associative_recall(
        10, n_pairs=4, n_keys=4, n_values=4, generator=_gen()
    )
    with pytest.raises(TypeError, match="warmup must be an int"):
        bk.train(model, data, steps=1, warmup=1.5)
    for bad in (float("nan"), float("inf"), -0.1):
        with pytest.raises(ValueError, match="weight_decay must be a finite number"):
            bk.train(model, data, steps=1, weight_decay=bad)
    with pytest.raises(TypeError, match="weight_decay must be a real number"):
        bk.train(model, data, steps=1, weight_decay="0.1")
