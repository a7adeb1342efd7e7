"""Training and evaluation of the case study's models, with per-head diagnostics."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from softmaxbook import (
    attention_distance,
    attention_entropy,
    attention_sparsity,
    causal_mask,
)

from .._checks import (
    check_nonnegative,
    check_nonnegative_int,
    check_positive,
    check_positive_int,
    check_tensor,
)
from ..notebook import require

__all__ = ["TrainingHistory", "train", "evaluate"]

#: ``(tokens, targets)``: tokens ``(N, L)``, targets ``(N,)`` or ``(N, L)``.
Pair = tuple[Tensor, Tensor]


def _check_data(data: object, name: str) -> Pair:
    if not (isinstance(data, (tuple, list)) and len(data) == 2):
        raise TypeError(
            f"{name} must be a pair (tokens, targets), got {type(data).__name__}"
        )
    tokens, targets = data
    check_tensor(tokens, f"{name}[0] (tokens)")
    check_tensor(targets, f"{name}[1] (targets)")
    if tokens.dim() != 2 or targets.shape not in (tokens.shape[:1], tokens.shape):
        raise ValueError(
            f"{name}: tokens must be (N, L) and targets (N,) or (N, L), got "
            f"{tuple(tokens.shape)} and {tuple(targets.shape)}"
        )
    if tokens.shape[0] == 0:
        raise ValueError(f"{name} is empty")
    return tokens, targets


def _loss_and_correct(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor, int]:
    # Targets (N,) are predicted at the last position; (N, L) at every position,
    # where -100 marks a position that is not scored (PyTorch's ignore_index).
    if targets.dim() == 1:
        logits = logits[:, -1]  # (N, V)
    logits, targets = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()  # a loss summed in half precision loses digits
    loss = F.cross_entropy(logits, targets, ignore_index=-100)
    scored = targets != -100
    correct = ((logits.argmax(-1) == targets) & scored).sum()
    return loss, correct, int(scored.sum())


@torch.no_grad()
def evaluate(
    model: nn.Module, data: Pair, *, batch_size: int = 1024
) -> dict[str, float]:
    r"""Mean cross-entropy and accuracy of ``model`` on ``data``:
    :math:`-\frac1N\sum_n \log p(y_n)`.

    ``model`` maps ``(B, L)`` tokens to ``(B, L, V)`` logits. Targets of shape
    ``(N,)`` are scored at the last position (as in
    :func:`softmaxbook.make_associative_recall`); targets ``(N, L)`` at every position
    except those equal to ``-100``. The model is put in eval mode and
    restored afterwards.

    Shapes: ``data`` is ``(tokens, targets)`` with tokens ``(N, L)``.

    Parameters
    ----------
    model : torch.nn.Module
    data : tuple of Tensor
        ``(tokens, targets)``.
    batch_size : int
        Sequences per forward pass.

    Returns
    -------
    dict
        ``{"loss": float, "accuracy": float}``.
    """
    tokens, targets = _check_data(data, "data")
    batch_size = check_positive_int(batch_size, "batch_size")
    was_training = model.training
    model.eval()
    total_loss, total_correct, total = 0.0, 0, 0
    for start in range(0, tokens.shape[0], batch_size):
        x, y = tokens[start : start + batch_size], targets[start : start + batch_size]
        loss, correct, count = _loss_and_correct(model(x), y)
        total_loss += float(loss) * count
        total_correct += int(correct)
        total += count
    model.train(was_training)
    return {
        "loss": total_loss / max(total, 1),
        "accuracy": total_correct / max(total, 1),
    }


@dataclass
class TrainingHistory:
    """What :func:`train` records, one entry per evaluation (step 0 included).

    ``entropy``, ``distance`` and ``sparsity`` are ``(R, n_layers, H)``
    tensors (``R`` records) of :func:`~softmaxbook.attention_entropy`,
    :func:`~softmaxbook.attention_distance` and :func:`~softmaxbook.attention_sparsity`,
    averaged over the probe sequences; they are empty when attention is not
    tracked. ``seconds`` is the wall-clock time of the training loop.
    """

    steps: list = field(default_factory=list)
    train_loss: list = field(default_factory=list)
    eval_loss: list = field(default_factory=list)
    eval_accuracy: list = field(default_factory=list)
    entropy: Tensor = field(default_factory=lambda: torch.empty(0))
    distance: Tensor = field(default_factory=lambda: torch.empty(0))
    sparsity: Tensor = field(default_factory=lambda: torch.empty(0))
    seconds: float = 0.0


@torch.no_grad()
def _head_statistics(model: nn.Module, probe: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    was_training = model.training
    model.eval()
    _, weights = model(probe, return_weights=True)  # (B, n_layers, H, L, L)
    model.train(was_training)
    weights = weights.float()
    L = weights.shape[-1]
    allowed = (
        causal_mask(L, device=weights.device)
        if getattr(model, "causal", False)
        else None
    )
    # Means over the probe batch: one number per layer and head.
    return (
        attention_entropy(weights).mean(0).cpu(),
        attention_distance(weights).mean(0).cpu(),
        attention_sparsity(weights, mask=allowed).mean(0).cpu(),
    )


def train(
    model: nn.Module,
    data: Pair,
    *,
    steps: int = 1000,
    batch_size: int = 64,
    lr: float = 3e-3,
    weight_decay: float = 0.0,
    warmup: int = 0,
    max_grad_norm: float | None = 1.0,
    eval_data: Pair | None = None,
    eval_every: int = 100,
    track_attention: bool = True,
    probe_size: int = 256,
    generator: torch.Generator | None = None,
    progress: bool = False,
) -> TrainingHistory:
    r"""Fit ``model`` with AdamW on minibatches of ``data``; return a
    :class:`TrainingHistory`.

    Minimizes the cross-entropy of :func:`evaluate` with AdamW at learning
    rate :math:`\eta_t = \eta \min(1, t/\text{warmup}) \cdot
    \tfrac12(1 + \cos(\pi t / \text{steps}))` (linear warm-up, cosine decay)
    and gradients clipped to norm ``max_grad_norm``. Each step draws
    ``batch_size`` sequences with replacement from ``generator``, so a seeded
    generator and a seeded model give the same run every time on the same
    machine (call ``torch.use_deterministic_algorithms(True)`` to make torch
    refuse non-deterministic kernels). Every ``eval_every`` steps, and
    before the first, it records the mean training loss since the previous
    record, the loss and accuracy on ``eval_data`` (or on ``data`` if none),
    and, with ``track_attention``, per-head
    :func:`~softmaxbook.attention_entropy`, :func:`~softmaxbook.attention_distance`
    and :func:`~softmaxbook.attention_sparsity` on the first ``probe_size`` evaluation
    sequences. The library prints nothing: ``progress=True`` shows a
    ``tqdm`` progress bar on standard output.

    Shapes: ``data`` and ``eval_data`` are ``(tokens, targets)`` with tokens
    ``(N, L)`` and targets ``(N,)`` (scored at the last position) or ``(N, L)``.

    Parameters
    ----------
    model : torch.nn.Module
        Maps tokens to logits; with ``track_attention``, also accepts
        ``return_weights=True`` like :class:`TinyTransformer`.
    data : tuple of Tensor
        The training set ``(tokens, targets)``.
    steps, batch_size : int
        Optimizer steps and sequences per step.
    lr, weight_decay : float
        AdamW's peak learning rate and decoupled weight decay.
    warmup : int
        Steps of linear learning-rate warm-up.
    max_grad_norm : float, optional
        Clip the gradient norm to this; ``None`` disables clipping.
    eval_data : tuple of Tensor, optional
        Held-out ``(tokens, targets)``.
    eval_every : int
        Steps between records.
    track_attention : bool
        Record the per-head diagnostics.
    probe_size : int
        Sequences used for the diagnostics.
    generator : torch.Generator, optional
        Draws the minibatches (a CPU generator).
    progress : bool
        Show a progress bar.

    Returns
    -------
    TrainingHistory

    Raises
    ------
    TypeError
        If ``data`` is not a pair of tensors, or a count (``steps``,
        ``warmup``, ...) is not an int, or a rate not a real number.
    ValueError
        If the shapes do not fit, a count is out of range (``warmup < 0``,
        ``steps < 1``), or ``lr``, ``weight_decay`` or ``max_grad_norm`` is
        negative, zero where it must be positive, or not finite.
    """
    tokens, targets = _check_data(data, "data")
    eval_data = (
        _check_data(eval_data, "eval_data")
        if eval_data is not None
        else (tokens, targets)
    )
    steps = check_positive_int(steps, "steps")
    batch_size = check_positive_int(batch_size, "batch_size")
    eval_every = check_positive_int(eval_every, "eval_every")
    probe_size = check_positive_int(probe_size, "probe_size")
    lr = check_positive(lr, "lr")
    warmup = check_nonnegative_int(warmup, "warmup")
    weight_decay = check_nonnegative(weight_decay, "weight_decay")
    if max_grad_norm is not None:
        max_grad_norm = check_positive(max_grad_norm, "max_grad_norm")

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)

    def lr_factor(step: int) -> float:
        ramp = min(1.0, (step + 1) / warmup) if warmup else 1.0
        return ramp * 0.5 * (1.0 + math.cos(math.pi * step / steps))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    probe = eval_data[0][:probe_size]
    history = TrainingHistory()
    stats: list[tuple[Tensor, Tensor, Tensor]] = []
    running, count = 0.0, 0

    def record(step: int) -> None:
        nonlocal running, count
        scores = evaluate(model, eval_data)
        history.steps.append(step)
        history.train_loss.append(running / count if count else scores["loss"])
        history.eval_loss.append(scores["loss"])
        history.eval_accuracy.append(scores["accuracy"])
        if track_attention:
            stats.append(_head_statistics(model, probe))
        running, count = 0.0, 0

    bar = None
    if progress:
        require("tqdm", needed_by="train(progress=True)")
        from tqdm import tqdm  # only needed for the bar

        # stdout, not stderr: notebooks keep stderr for warnings.
        bar = tqdm(total=steps, file=sys.stdout, mininterval=1.0, ncols=80, leave=True)
    start = time.perf_counter()
    model.train()
    record(0)
    device = tokens.device
    for step in range(1, steps + 1):
        index = torch.randint(tokens.shape[0], (batch_size,), generator=generator).to(
            device
        )
        loss, _, _ = _loss_and_correct(model(tokens[index]), targets[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if max_grad_norm is not None:
            nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        schedule.step()
        running += float(loss.detach())
        count += 1
        if step % eval_every == 0 or step == steps:
            record(step)
            if bar is not None:
                bar.set_postfix(
                    loss=f"{history.eval_loss[-1]:.3f}",
                    acc=f"{history.eval_accuracy[-1]:.3f}",
                    refresh=False,
                )
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    history.seconds = time.perf_counter() - start
    if stats:
        history.entropy, history.distance, history.sparsity = (
            torch.stack(s) for s in zip(*stats)
        )
    return history
