"""The attention-sink experiment of chapter 10: five attentions, five seeds each.

A one-layer Transformer learns a recall task in which many queries have
nothing to recall. Each sequence starts with a ``<bos>`` token, then mixes
*store* tokens, each carrying a key and the value the sequence assigns to that
key, and *query* tokens carrying a key. At a query, the model must output the
key's value if a store token earlier in the sequence carried that key, and
``NONE`` otherwise. A query with a match is answered by attending to the
matching store tokens; a query without one has nothing in the sequence to
read, and that is where a softmax head needs somewhere to put its weight.

:func:`sweep` trains every variant of :data:`VARIANTS` (softmax, softmax with
learned sink logits as in gpt-oss, gated attention, softpick, and softmax
without ``<bos>`` as a control) with every seed of :data:`SEEDS`, on several
processes with one thread each; ``make experiments`` (the script
``experiments/sink_sweep.py``) runs it and stores what the chapter plots and
asserts in the package, where :func:`load` reads it, so the chapter runs from
an installed ``bookkit`` too::

    from bookkit.studies import sink_study as ss
    stored = ss.load()                  # the sweep as it was measured
    fresh = ss.run("softmax", seed=1)   # one run again: under a minute on a CPU

A *seed* ``s`` initializes the model with ``s`` and draws the minibatches with
``s + 1``; the data are the same in every run. The chapter, the script and
``tests/bookkit/test_sink_sweep.py`` import this module, so the task, the recipe and
the measurements have one definition. A run is repeatable bit for bit on one
machine (one thread); another CPU gives results that differ from about the
third digit on, which the chapter's claims leave room for.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from softmaxbook import (
    TinyTransformer,
    TransformerBlock,
    causal_mask,
    scaled_dot_product_attention,
)

from . import sweep as _sweep
from . import training
from .training import TrainingHistory

#: Where the stored sweep lives: package data, so an installed library has it.
DATA_FILE = Path(__file__).resolve().parents[1] / "data" / "sink_sweep.json"

# The task: K keys, V values, T tokens after <bos>, a store token w.p. P_STORE.
K, V, T, P_STORE = 8, 8, 16, 0.5
BOS = 0
QUERY0 = 1 + K * V  # store tokens are 1 .. K*V: 1 + key * V + value
ANSWER0 = QUERY0 + K  # query tokens are QUERY0 + key
NONE = ANSWER0 + V  # answers are ANSWER0 + value, then NONE
VOCAB, LENGTH = NONE + 1, T + 1
IGNORE = -100  # positions that are not scored (torch's ignore_index)
DATA_SEED, N_TRAIN, N_TEST = 0, 20_000, 2_000

CONFIG: dict[str, Any] = {"d_model": 32, "n_heads": 2, "n_layers": 1}
TRAIN = {"steps": 1000, "batch_size": 64, "lr": 3e-3, "warmup": 50, "eval_every": 100}
VARIANTS: dict[str, dict[str, Any]] = {
    "softmax": {},
    "sink logits": {"sinks": True},
    "gated": {"gate": True},
    "softpick": {"normalizer": "softpick"},
    # The control: softmax on the same task with a random first token, no <bos>.
    "softmax, no <bos>": {"bos": False},
}
SEEDS = (1, 11, 21, 31, 41)
SINK_HEAD = 0.3  # a head whose mean weight on <bos> exceeds this is a sink head
DIGITS = 4  # significant digits stored; another CPU agrees to about 2 or 3

Pair = tuple[torch.Tensor, torch.Tensor]  # tokens (N, L), targets (N, L)


def make_task(n: int, generator: torch.Generator, bos: bool = True) -> Pair:
    """``n`` sequences of the recall task and their per-position targets.

    Targets are ``ANSWER0 + value`` at a query whose key was stored before it,
    ``NONE`` at a query whose key was not, and ``IGNORE`` elsewhere (the first
    token and store tokens). With ``bos=False`` the first token is a random
    store token instead of ``<bos>``, one that no query's answer depends on.
    """
    values = torch.randint(V, (n, K), generator=generator)  # each key's value
    keys = torch.randint(K, (n, T), generator=generator)
    is_store = torch.rand(n, T, generator=generator) < P_STORE
    value = values.gather(1, keys)
    tokens = torch.where(is_store, 1 + keys * V + value, QUERY0 + keys)
    stored = torch.nn.functional.one_hot(keys, K) * is_store[..., None]  # (n, T, K)
    before = stored.cumsum(1) - stored  # stores strictly before each position
    seen = before.gather(2, keys[..., None]).squeeze(-1) > 0
    targets = torch.where(seen, ANSWER0 + value, torch.full_like(value, NONE))
    targets = targets.masked_fill(is_store, IGNORE)
    first = torch.full((n, 1), BOS, dtype=torch.long)
    if not bos:
        first = torch.randint(1, QUERY0, (n, 1), generator=generator)
    ignored = torch.full((n, 1), IGNORE, dtype=torch.long)
    return torch.cat([first, tokens], 1), torch.cat([ignored, targets], 1)


def make_data(bos: bool = True) -> tuple[Pair, Pair]:
    """The training and the held-out set, the same in every run."""
    generator = torch.Generator().manual_seed(DATA_SEED)
    return make_task(N_TRAIN, generator, bos), make_task(N_TEST, generator, bos)


def new_model(seed: int = 1, **variant: Any) -> TinyTransformer:
    """The chapter's model initialized from ``seed``; ``variant``: VARIANTS."""
    variant = {k: v for k, v in variant.items() if k != "bos"}  # a data option
    generator = torch.Generator().manual_seed(seed)
    return TinyTransformer(VOCAB, LENGTH, **CONFIG, **variant, generator=generator)


def fit(
    model: nn.Module, data: tuple[Pair, Pair], seed: int = 1, **overrides: Any
) -> TrainingHistory:
    """Train with the chapter's recipe; minibatches drawn with ``seed + 1``."""
    train, test = data
    generator = torch.Generator().manual_seed(seed + 1)
    recipe = {**TRAIN, **overrides}
    return training.train(
        model, train, eval_data=test, track_attention=False, generator=generator,
        **recipe,
    )  # fmt: skip


def _round(x: float) -> float:
    return _sweep.round_to(x, DIGITS)


def _rounded(t: torch.Tensor) -> list[Any] | float:
    return _sweep.rounded(t, DIGITS)


def _forward(
    model: TinyTransformer, tokens: torch.Tensor, ablate: str | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The model's forward pass, written out to reach inside its one layer.

    Returns ``(logits, weights, scores, gate)``: ``(B, L, V)``, ``(B, H, L, L)``,
    the scaled scores ``(B, H, L, L)`` and the gate ``(B, L, d_model)`` (None
    without one). ``ablate="evict"``: no query but the first may attend to the
    first token, as if a sliding window had dropped it from the cache (its
    weight goes to the other keys). ``ablate="zero value"``: the first token
    keeps its weight but its value is zero (its weight goes nowhere).
    """
    block = cast(TransformerBlock, model.blocks[0])  # a ModuleList holds Modules
    attention = block.attn
    x = model.token_embedding(tokens) + model.position_embedding[: tokens.shape[1]]
    h = block.ln1(x)
    B, L, d_model = h.shape
    qkv = attention.qkv(h).view(B, L, 3, attention.n_heads, attention.d_head)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, H, L, D)
    mask = causal_mask(L)
    if ablate == "evict":
        mask = mask.clone()
        mask[1:, 0] = False
    elif ablate == "zero value":
        v = torch.cat([torch.zeros_like(v[..., :1, :]), v[..., 1:, :]], dim=-2)
    elif ablate is not None:
        raise ValueError(f"unknown ablation {ablate!r}")
    heads, weights = scaled_dot_product_attention(
        q, k, v, mask=mask, scale=attention.score_scale,
        normalizer=attention.normalizer, sinks=attention.sinks, return_weights=True,
    )  # fmt: skip
    heads = heads.transpose(1, 2).reshape(B, L, d_model)
    gate = None if attention.gate is None else torch.sigmoid(attention.gate(h))
    if gate is not None:
        heads = heads * gate
    x = x + attention.out(heads)
    x = x + block.mlp(block.ln2(x))
    logits = model.unembed(model.ln_f(x))
    scores = (q @ k.transpose(-2, -1)) * attention.score_scale
    return logits, weights, scores, gate


@torch.no_grad()
def measure(model: TinyTransformer, data: Pair) -> dict[str, Any]:
    """What the chapter reads off a trained model, on the held-out ``data``.

    Per head, lists of ``H`` numbers: the mean weight on ``<bos>`` at queries
    without a match (``bos_none``) and with one (``bos_match``); the mean total
    weight on the tokens at queries without a match (``total_none``: below 1
    when a head can keep weight back); the mean gap between the score of
    ``<bos>`` and the largest other score at those queries (``gap_none``); the
    mean gate at queries without and with a match (gated attention only); the
    learned sink logits. And the accuracy on both kinds of query, as trained,
    with the first token evicted, and with its value zeroed (see
    :func:`_forward`).
    """
    tokens, targets = data
    model.eval()
    logits, weights, scores, gate = _forward(model, tokens)
    none, match = targets == NONE, (targets >= 0) & (targets != NONE)
    L = tokens.shape[1]
    visible = causal_mask(L)[:, 1:]  # key j >= 1 visible from query i
    rest = scores[..., 1:].masked_fill(~visible, float("-inf")).amax(-1)
    heads = range(weights.shape[1])

    def mean_over(mask: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        # (B, H, L) -> (H,)
        return torch.stack([values[:, i][mask].mean() for i in heads])

    per_head = {
        "bos_none": mean_over(none, weights[..., 0]),
        "bos_match": mean_over(match, weights[..., 0]),
        "total_none": mean_over(none, weights.sum(-1)),
        "gap_none": mean_over(none, scores[..., 0] - rest),
    }
    if gate is not None:
        by_head = gate.view(*gate.shape[:2], len(heads), -1).mean(-1).transpose(1, 2)
        per_head["gate_none"] = mean_over(none, by_head)
        per_head["gate_match"] = mean_over(match, by_head)
    sinks = cast(TransformerBlock, model.blocks[0]).attn.sinks
    if sinks is not None:
        per_head["sink_logit"] = sinks.detach().clone()
    accuracy = {}
    for ablation, prefix in ((None, "accuracy"), ("evict", "evicted"),
                             ("zero value", "zeroed")):  # fmt: skip
        if ablation is not None:
            logits = _forward(model, tokens, ablation)[0]
        predicted = logits.argmax(-1)
        accuracy[f"{prefix}_none"] = (predicted[none] == NONE).float().mean()
        accuracy[f"{prefix}_match"] = (
            (predicted[match] == targets[match]).float().mean()
        )
    return {
        **{name: _rounded(value) for name, value in per_head.items()},
        **{name: _round(float(value)) for name, value in accuracy.items()},
    }


def check_forward(model: TinyTransformer, tokens: torch.Tensor) -> None:
    """Fail loudly if :func:`_forward` no longer computes what the model does."""
    with torch.no_grad():
        ours = _forward(model, tokens)[0]
        theirs = model(tokens)
    if not torch.allclose(ours, theirs, atol=1e-5, rtol=1e-5):
        raise RuntimeError("_forward disagrees with TinyTransformer.forward")


def run(
    variant: str, seed: int, data: tuple[Pair, Pair] | None = None
) -> dict[str, Any]:
    """Train one variant with one seed; return what the chapter uses."""
    if data is None:
        data = make_data(VARIANTS[variant].get("bos", True))
    model = new_model(seed, **VARIANTS[variant])
    history = fit(model, data, seed)
    check_forward(model, data[1][0][:64])
    return {
        "variant": variant,
        "seed": seed,
        "accuracy": [_round(a) for a in history.eval_accuracy],
        "loss": [_round(x) for x in history.eval_loss],
        **measure(model, data[1]),
    }


_DATA: dict[bool, tuple[Pair, Pair]] = {}  # by bos: each worker makes both once


def _init_worker() -> None:
    _sweep.one_thread()
    _DATA.update({bos: make_data(bos) for bos in (True, False)})


def _run_in_worker(variant: str, seed: int) -> dict[str, Any]:
    return run(variant, seed, _DATA[VARIANTS[variant].get("bos", True)])


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
    """The stored sweep: task, model, recipe, variants, seeds, machine, runs."""
    return json.loads(Path(path).read_text())
