"""The recipe and seed sweep of the case study (chapter 9): every variant, ten seeds.

Chapter 9 trains a two-layer Transformer on associative recall and compares
variants of its attention: softmax, softmax-off-by-one, no
:math:`1/\\sqrt{d_k}` scale, temperature 0.1, entmax-1.5, sparsemax,
sigmoid, and two controls. One run of one variant says little: the same
recipe with another seed can succeed where the first failed. :func:`sweep`
trains every variant with every seed of :data:`SEEDS`, on several processes
with one thread each; ``make experiments`` (the script
``experiments/case_study_sweep.py``) runs it and stores what the chapter plots
and asserts in the package, where :func:`load` reads it, so the chapter runs
from an installed ``bookkit`` too (in Colab, say)::

    from bookkit.studies import case_study as cs
    stored = cs.load()                      # the sweep as it was measured
    fresh = cs.run("sparsemax", seed=11)    # one run again, about 10 s on a CPU

A *seed* ``s`` initializes the model with ``s`` and draws the minibatches
with ``s + 1``; the data (training and held-out sequences) are the same in
every run. Seed 1 is the run that the chapter trains and shows.

The chapter, the script and ``tests/bookkit/test_experiments.py`` import this module,
so the recipe, the diagnostics and the runs have one definition. Each run is
repeatable bit for bit on one machine (one thread, deterministic kernels);
another CPU gives results that differ from about the third digit on.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from softmaxbook import (
    TinyTransformer,
    attention_distance,
    attention_entropy,
    attention_sparsity,
    causal_mask,
    make_associative_recall,
)

from . import sweep as _sweep
from . import training
from .training import TrainingHistory

#: Where the stored sweep lives: package data, so an installed library has it.
DATA_FILE = Path(__file__).resolve().parents[1] / "data" / "case_study_sweep.json"

# The task, the model and the training recipe of chapter 9.
N_PAIRS, N_KEYS, N_VALUES = 4, 8, 8
VOCAB, LENGTH = N_KEYS + N_VALUES, 2 * N_PAIRS + 1
DATA_SEED, N_TRAIN, N_TEST = 0, 20_000, 2_000
CONFIG: dict[str, Any] = {"d_model": 32, "n_heads": 2, "n_layers": 2}
TRAIN = {"steps": 600, "batch_size": 64, "lr": 3e-3, "warmup": 50, "eval_every": 50}
PROBE = 500  # held-out sequences for the statistics at initialization
SATURATED = 0.9  # a row whose largest weight exceeds this is saturated
SOLVED = 0.95  # the held-out accuracy that counts as solving the task

# Each variant: the arguments of TinyTransformer that differ from softmax.
VARIANTS: dict[str, dict[str, Any]] = {
    "softmax": {},
    "softmax_one": {"normalizer": "softmax_one"},
    "unscaled": {"scale": 1.0},
    "T = 0.1": {"temperature": 0.1},
    "entmax15": {"normalizer": "entmax15"},
    "sparsemax": {"normalizer": "sparsemax"},
    "sigmoid": {"normalizer": "sigmoid"},
    # Controls: the two saturated variants, started from softmax's attention
    # maps. The query and key weights are scaled by g, so the scores by g**2,
    # which undoes the missing 1/sqrt(d_k) = 1/4 (g = 1/2) or the
    # temperature 0.1 (g = sqrt(0.1)).
    "unscaled, small init": {"scale": 1.0, "init_gain": 0.5},
    "T = 0.1, small init": {"temperature": 0.1, "init_gain": 0.1**0.5},
}
SEEDS = tuple(range(1, 100, 10))  # 1, 11, ..., 91
DIGITS = 4  # significant digits stored; other CPUs agree to about 2 or 3

Pair = tuple[torch.Tensor, torch.Tensor]  # (tokens (N, L), targets (N,))
Data = tuple[Pair, Pair]  # (training set, held-out set)


def make_data() -> Data:
    """The training and the held-out set, the same in every run."""
    generator = torch.Generator().manual_seed(DATA_SEED)
    task: dict[str, Any] = {
        "n_pairs": N_PAIRS,
        "n_keys": N_KEYS,
        "n_values": N_VALUES,
        "generator": generator,
    }
    train = make_associative_recall(N_TRAIN, **task)
    test = make_associative_recall(N_TEST, **task)
    return train, test


def new_model(seed: int = 1, **variant: Any) -> TinyTransformer:
    """The chapter's model initialized from ``seed``; ``variant``: VARIANTS."""
    generator = torch.Generator().manual_seed(seed)
    return TinyTransformer(VOCAB, LENGTH, **CONFIG, **variant, generator=generator)


def fit(
    model: nn.Module,
    data: Data,
    seed: int = 1,
    *,
    progress: bool = False,
    **overrides: Any,
) -> TrainingHistory:
    """Train with the chapter's recipe; minibatches drawn with ``seed + 1``."""
    train, test = data
    generator = torch.Generator().manual_seed(seed + 1)
    return training.train(
        model,
        train,
        eval_data=test,
        **{**TRAIN, **overrides},
        progress=progress,
        generator=generator,
    )


def saturation(weights: torch.Tensor) -> torch.Tensor:
    """Fraction of rows whose largest weight exceeds SATURATED, per head.

    ``weights`` is ``(B, layers, H, L, L)``. Query 0 has a single key and
    is always one-hot, so it is left out. Returns a ``(layers, H)`` tensor.
    """
    rows = weights[..., 1:, :]
    return (rows.amax(-1) > SATURATED).float().mean(dim=(0, -1))


def head_scores(
    weights: torch.Tensor, tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-head previous-token, answer and key scores, each ``(layers, H)``.

    ``weights`` is ``(B, layers, H, L, L)`` for the ``(B, L)`` associative
    recall ``tokens``. *Previous-token*: the mean weight that each value
    position puts on the key just before it. *Answer*: the mean weight of
    the final query on the position of the answer (the value after the
    matching key). *Key*: its mean weight on the matching key itself.
    """
    rows = torch.arange(len(tokens))
    # Which pair the query asks for, then the positions of v_1 .. v_P.
    key_slot = (tokens[:, 0:-1:2] == tokens[:, -1:]).float().argmax(-1)
    value_pos = torch.arange(1, LENGTH - 1, 2)
    previous = weights[:, :, :, value_pos, value_pos - 1].mean(dim=(0, -1))
    answer = weights[rows, :, :, -1, 2 * key_slot + 1].mean(0)
    key = weights[rows, :, :, -1, 2 * key_slot].mean(0)
    return previous, answer, key


def first_step_above(history: TrainingHistory, level: float = SOLVED) -> int | None:
    """The first recorded step with held-out accuracy >= ``level``, or None."""
    return next(
        (
            step
            for step, accuracy in zip(history.steps, history.eval_accuracy)
            if accuracy >= level
        ),
        None,
    )


def _round(x: float) -> float:
    return _sweep.round_to(x, DIGITS)


def _rounded(t: torch.Tensor) -> list[Any] | float:
    return _sweep.rounded(t, DIGITS)


def _maps(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        _, weights = model(tokens, return_weights=True)
    return weights  # (B, layers, H, L, L)


def init_statistics(variant: str, seed: int, tokens: torch.Tensor) -> dict[str, Any]:
    """Saturation, entropy and exact zeros of a freshly initialized model."""
    model = new_model(seed, **VARIANTS[variant])
    weights = _maps(model, tokens[:PROBE])
    per_head = saturation(weights)
    zeros = attention_sparsity(weights, causal_mask(LENGTH))
    entropy = attention_entropy(weights)
    return {
        "init_saturation": _round(per_head.mean().item()),
        "init_saturation_heads": _rounded(per_head),
        "init_entropy": _round(entropy.mean().item()),
        "init_zeros": _round(zeros.mean().item()),
    }


def run(variant: str, seed: int, data: Data | None = None) -> dict[str, Any]:
    """Train one variant with one seed; return what the chapter uses."""
    data = make_data() if data is None else data
    tokens = data[1][0]
    model = new_model(seed, **VARIANTS[variant])
    history = fit(model, data, seed)
    # fit's last record is the held-out evaluation of the trained model (step
    # TRAIN["steps"]); evaluating it again would give the same numbers.
    final = {"accuracy": history.eval_accuracy[-1], "loss": history.eval_loss[-1]}
    weights = _maps(model, tokens)  # all held-out sequences
    previous, answer, key = head_scores(weights, tokens)
    allowed = causal_mask(LENGTH)
    zeros = attention_sparsity(weights, allowed).mean(0)  # (layers, H)
    entropy = attention_entropy(weights).mean(0)
    return dict(
        variant=variant,
        seed=seed,
        **init_statistics(variant, seed, tokens),
        accuracy=[_round(a) for a in history.eval_accuracy],
        loss=[_round(x) for x in history.eval_loss],
        entropy=_rounded(history.entropy.mean(dim=(1, 2))),  # (records,)
        entropy_layers=_rounded(history.entropy.mean(2)),  # (records, layers)
        final_accuracy=_round(final["accuracy"]),
        final_loss=_round(final["loss"]),
        step95=first_step_above(history),
        final_entropy=_round(entropy.mean().item()),
        final_zeros=_round(zeros.mean().item()),
        previous=_round(previous[0].max().item()),  # best layer-1 head
        answer=_round(answer[1].max().item()),  # best layer-2 head
        # Per head, (layers, H), on the held-out set after training.
        heads={
            "previous": _rounded(previous),
            "answer": _rounded(answer),
            "key": _rounded(key),
            "entropy": _rounded(entropy),
            "distance": _rounded(attention_distance(weights).mean(0)),
            "zeros": _rounded(zeros),
        },
    )


_DATA: Data | None = None  # each worker process makes the data once


def _init_worker() -> None:
    global _DATA
    _sweep.one_thread(deterministic=True)
    _DATA = make_data()


def _run_in_worker(variant: str, seed: int) -> dict[str, Any]:
    return run(variant, seed, _DATA)


def sweep(
    variants: Sequence[str] = tuple(VARIANTS),
    seeds: Sequence[int] = SEEDS,
    workers: int = 2,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Every ``(variant, seed)`` run on ``workers`` processes, in order."""
    return _sweep.run_sweep(
        _run_in_worker, _init_worker, variants, seeds, workers, progress
    )


def load(path: Path = DATA_FILE) -> dict[str, Any]:
    """The stored sweep: recipe, variants, seeds, steps, machine, runs."""
    return json.loads(Path(path).read_text())
