r"""A tiny transformer built on the library's attention, with a pluggable normalizer (the case study).

Everything here is small enough to train on a laptop CPU in seconds:

- :func:`make_associative_recall` generates the toy task (key-value pairs,
  then a query key; predict its value), seeded and reproducible.
- :class:`TinyTransformer` is a decoder-only, pre-LayerNorm transformer with
  learned positional embeddings whose attention is
  :func:`~softmaxbook.scaled_dot_product_attention`: the normalizer
  (``"softmax"``, ``"sparsemax"``, ...), the scale and a temperature are
  arguments, and the forward pass can return every attention map.
- :func:`train` and :func:`evaluate` fit and score it, and record the
  per-head diagnostics of :mod:`softmaxbook.analysis` along the way.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import check_positive, check_positive_int, check_tensor
from .analysis import attention_distance, attention_entropy, attention_sparsity
from .attention import Normalizer, _resolve_normalizer, scaled_dot_product_attention
from .masking import causal_mask

__all__ = [
    "make_associative_recall",
    "MultiHeadAttention",
    "TransformerBlock",
    "TinyTransformer",
    "TrainingHistory",
    "train",
    "evaluate",
]


def make_associative_recall(
    n: int,
    *,
    n_pairs: int = 6,
    n_keys: int = 16,
    n_values: int = 16,
    generator: torch.Generator | None = None,
    device=None,
) -> tuple[Tensor, Tensor]:
    r"""Associative recall: :math:`k_1 v_1 \dots k_P v_P\, q \mapsto v_i` where :math:`k_i = q`.

    Each sequence lists ``n_pairs`` distinct keys, each followed by its value,
    and ends with a query: one of those keys, chosen uniformly. The target is
    the value that followed the query key. Keys are the tokens
    ``0 .. n_keys-1`` and values the tokens ``n_keys .. n_keys+n_values-1``,
    so a model needs a vocabulary of ``n_keys + n_values``. A model can only
    solve it by *looking back* at the right position, which depends on the
    content of the sequence: the task needs attention. A guess that knows
    only the set of values scores :math:`1/P` at best.

    Shapes: returns ``tokens`` ``(n, 2 * n_pairs + 1)`` and ``targets``
    ``(n,)``, both ``torch.long``.

    Parameters
    ----------
    n : int
        Number of sequences.
    n_pairs : int
        Key-value pairs per sequence (at most ``n_keys``).
    n_keys, n_values : int
        Sizes of the key and value alphabets.
    generator : torch.Generator, optional
        The source of randomness (a CPU generator); pass a seeded one for
        reproducible data.
    device : torch.device or str, optional
        Where to put the result; the data is always drawn on the CPU, so it
        is the same on every device.

    Returns
    -------
    tokens : Tensor ``(n, 2 * n_pairs + 1)``
    targets : Tensor ``(n,)``

    Raises
    ------
    ValueError
        If ``n_pairs > n_keys`` (the keys of a sequence must be distinct).
    """
    n = check_positive_int(n, "n")
    n_pairs = check_positive_int(n_pairs, "n_pairs")
    n_keys = check_positive_int(n_keys, "n_keys")
    n_values = check_positive_int(n_values, "n_values")
    if n_pairs > n_keys:
        raise ValueError(
            f"n_pairs={n_pairs} distinct keys need n_keys >= n_pairs, got n_keys={n_keys}"
        )
    # A random permutation per row (argsort of uniforms) gives distinct keys.
    keys = torch.rand(n, n_keys, generator=generator).argsort(dim=-1)[
        :, :n_pairs
    ]  # (n, P)
    values = n_keys + torch.randint(
        n_values, (n, n_pairs), generator=generator
    )  # (n, P)
    which = torch.randint(n_pairs, (n,), generator=generator)  # (n,)
    rows = torch.arange(n)
    query, targets = keys[rows, which], values[rows, which]
    pairs = torch.stack([keys, values], dim=-1).reshape(
        n, 2 * n_pairs
    )  # k1 v1 k2 v2 ...
    tokens = torch.cat([pairs, query[:, None]], dim=-1)  # (n, 2P + 1)
    return tokens.to(device), targets.to(device)


class MultiHeadAttention(nn.Module):
    r"""Multi-head self-attention: :math:`\mathrm{concat}_h\, \mathrm{normalize}(Q_h K_h^\top \cdot s / T)\, V_h \; W_O`.

    The heads are computed by :func:`~softmaxbook.scaled_dot_product_attention`,
    so the normalizer is pluggable. The scores are multiplied by
    :math:`s/T`, where :math:`s` is ``scale`` (default
    :math:`1/\sqrt{D}`, the usual scaling; ``scale=1.0`` removes it) and
    :math:`T` is ``temperature`` (below 1 sharpens every head).

    Shapes: ``x`` is ``(B, L, d_model)``; the output has the same shape and the
    weights are ``(B, H, L, L)`` with ``D = d_model // H``.

    Parameters
    ----------
    d_model : int
        Width of the residual stream; a multiple of ``n_heads``.
    n_heads : int
        Number of heads ``H``.
    normalizer : str or callable
        A name in :data:`~softmaxbook.NORMALIZERS` or ``f(scores, dim=-1)``.
    scale : float, optional
        Multiplies :math:`QK^\top`; defaults to :math:`1/\sqrt{D}`.
    temperature : float
        Divides the scaled scores.
    causal : bool
        Each position attends only to itself and earlier positions.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        normalizer: str | Normalizer = "softmax",
        scale: float | None = None,
        temperature: float = 1.0,
        causal: bool = True,
    ):
        super().__init__()
        d_model = check_positive_int(d_model, "d_model")
        n_heads = check_positive_int(n_heads, "n_heads")
        if d_model % n_heads:
            raise ValueError(
                f"d_model={d_model} must be a multiple of n_heads={n_heads}"
            )
        _resolve_normalizer(normalizer)  # fail now, not at the first forward pass
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.normalizer = normalizer
        base = (
            1.0 / math.sqrt(self.d_head)
            if scale is None
            else check_positive(scale, "scale")
        )
        #: The factor that multiplies :math:`QK^\top`: ``scale / temperature``.
        self.score_scale = base / check_positive(temperature, "temperature")
        self.causal = bool(causal)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Return ``(output, weights)``: ``(B, L, d_model)`` and ``(B, H, L, L)``."""
        B, L, d_model = x.shape
        qkv = self.qkv(x).view(B, L, 3, self.n_heads, self.d_head)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, H, L, D)
        heads, weights = scaled_dot_product_attention(
            q,
            k,
            v,
            is_causal=self.causal,
            scale=self.score_scale,
            normalizer=self.normalizer,
            return_weights=True,
        )  # (B, H, L, D), (B, H, L, L)
        return self.out(heads.transpose(1, 2).reshape(B, L, d_model)), weights


class TransformerBlock(nn.Module):
    r"""Pre-LayerNorm block: :math:`x + \mathrm{MHA}(\mathrm{LN}(x))`, then :math:`x + \mathrm{MLP}(\mathrm{LN}(x))`.

    Normalizing *before* each sublayer keeps the residual stream an identity
    path, which is what makes small transformers train without a warm-up
    ritual. The keyword arguments go to :class:`MultiHeadAttention`.

    Shapes: ``x`` is ``(B, L, d_model)``; returns ``(B, L, d_model)`` and the
    ``(B, H, L, L)`` attention weights.
    """

    def __init__(
        self, d_model: int, n_heads: int, d_ff: int | None = None, **attention
    ):
        super().__init__()
        d_ff = 4 * d_model if d_ff is None else check_positive_int(d_ff, "d_ff")
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, n_heads, **attention)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model)
        )

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Return ``(x, weights)`` after the attention and the MLP sublayers."""
        attended, weights = self.attn(self.ln1(x))
        x = x + attended
        return x + self.mlp(self.ln2(x)), weights


class TinyTransformer(nn.Module):
    r"""A small decoder-only transformer: :math:`\mathrm{logits} = W_U\, \mathrm{LN}(\mathrm{blocks}(E[x] + P))`.

    Token embeddings :math:`E`, learned positional embeddings :math:`P`,
    ``n_layers`` :class:`TransformerBlock` (pre-LayerNorm), a final
    LayerNorm and a linear read-out :math:`W_U` to the vocabulary. The
    attention of every head goes through
    :func:`~softmaxbook.scaled_dot_product_attention`, with the
    ``normalizer``, ``scale`` and ``temperature`` given here.

    The weights are initialized from ``generator`` (reproducible): linear
    maps from :math:`\mathcal{N}(0, 1/\text{fan\_in})`, so that after a
    LayerNorm the queries and keys have unit-variance entries and the raw
    scores :math:`q \cdot k` have variance :math:`D` (the premise of the
    :math:`1/\sqrt{D}` scale); embeddings from :math:`\mathcal{N}(0, 1)`;
    biases zero. ``init_gain`` multiplies the query and key weights, to
    study sharper or flatter attention at initialization.

    Shapes: ``tokens`` is ``(B, L)`` with ``L <= max_len``; the logits are
    ``(B, L, V)``; the weights are ``(B, n_layers, H, L, L)``.

    Parameters
    ----------
    vocab_size : int
        Number of token ids ``V``.
    max_len : int
        Longest sequence (number of positional embeddings).
    d_model, n_heads, n_layers : int
        Width, heads per layer, number of blocks.
    d_ff : int, optional
        Hidden width of the MLPs; defaults to ``4 * d_model``.
    normalizer : str or callable
        How scores become weights: ``"softmax"`` or any name in
        :data:`~softmaxbook.NORMALIZERS`, or ``f(scores, dim=-1)``.
    scale : float, optional
        Multiplies :math:`QK^\top`; default :math:`1/\sqrt{D}` with
        ``D = d_model // n_heads``; ``1.0`` trains without the scale.
    temperature : float
        Divides the scaled scores of every head (``0.1`` = ten times sharper).
    causal : bool
        Causal self-attention (a position sees itself and the past only).
    init_gain : float
        Multiplies the initial query and key weights.
    generator : torch.Generator, optional
        Seeds the initialization (a CPU generator).

    Raises
    ------
    ValueError
        On a non-positive size, scale or temperature, an unknown normalizer,
        or ``d_model`` not a multiple of ``n_heads``.
    """

    def __init__(
        self,
        vocab_size: int,
        max_len: int,
        *,
        d_model: int = 64,
        n_heads: int = 4,
        n_layers: int = 2,
        d_ff: int | None = None,
        normalizer: str | Normalizer = "softmax",
        scale: float | None = None,
        temperature: float = 1.0,
        causal: bool = True,
        init_gain: float = 1.0,
        generator: torch.Generator | None = None,
    ):
        super().__init__()
        self.vocab_size = check_positive_int(vocab_size, "vocab_size")
        self.max_len = check_positive_int(max_len, "max_len")
        self.n_layers = check_positive_int(n_layers, "n_layers")
        self.n_heads = check_positive_int(n_heads, "n_heads")
        self.causal = bool(causal)
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Parameter(torch.empty(max_len, d_model))
        self.blocks = nn.ModuleList(
            TransformerBlock(
                d_model,
                n_heads,
                d_ff,
                normalizer=normalizer,
                scale=scale,
                temperature=temperature,
                causal=causal,
            )
            for _ in range(n_layers)
        )
        self.ln_f = nn.LayerNorm(d_model)
        self.unembed = nn.Linear(d_model, vocab_size)
        self._reset_parameters(check_positive(init_gain, "init_gain"), generator)

    @torch.no_grad()
    def _reset_parameters(
        self, init_gain: float, generator: torch.Generator | None
    ) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(
                    module.weight, std=module.in_features**-0.5, generator=generator
                )
                nn.init.zeros_(module.bias)
        nn.init.normal_(self.token_embedding.weight, generator=generator)
        nn.init.normal_(self.position_embedding, generator=generator)
        for block in self.blocks:
            d_model = block.attn.qkv.in_features
            block.attn.qkv.weight[: 2 * d_model].mul_(init_gain)  # the W_Q and W_K rows

    def forward(self, tokens: Tensor, *, return_weights: bool = False):
        """Logits ``(B, L, V)``, or ``(logits, weights)`` with the ``(B, n_layers, H, L, L)`` maps.

        Parameters
        ----------
        tokens : integer Tensor ``(B, L)``
            Token ids in ``0 .. vocab_size - 1``.
        return_weights : bool
            Also return the attention weights of every layer and head.
        """
        check_tensor(tokens, "tokens")
        if tokens.dtype not in (torch.int64, torch.int32) or tokens.dim() != 2:
            raise TypeError(
                f"tokens must be a 2-D integer tensor (B, L), got dtype "
                f"{tokens.dtype} and shape {tuple(tokens.shape)}"
            )
        L = tokens.shape[1]
        if not 1 <= L <= self.max_len:
            raise ValueError(
                f"tokens has length {L}; expected 1 <= L <= max_len={self.max_len}"
            )
        x = (
            self.token_embedding(tokens) + self.position_embedding[:L]
        )  # (B, L, d_model)
        maps = []
        for block in self.blocks:
            x, weights = block(x)
            maps.append(weights)
        logits = self.unembed(self.ln_f(x))  # (B, L, V)
        return (logits, torch.stack(maps, dim=1)) if return_weights else logits


def _check_data(data, name: str) -> tuple[Tensor, Tensor]:
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
def evaluate(model: nn.Module, data, *, batch_size: int = 1024) -> dict[str, float]:
    r"""Mean cross-entropy and accuracy of ``model`` on ``data``: :math:`-\frac1N\sum_n \log p(y_n)`.

    ``model`` maps ``(B, L)`` tokens to ``(B, L, V)`` logits. Targets of shape
    ``(N,)`` are scored at the last position (as in
    :func:`make_associative_recall`); targets ``(N, L)`` at every position
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
    data,
    *,
    steps: int = 1000,
    batch_size: int = 64,
    lr: float = 3e-3,
    weight_decay: float = 0.0,
    warmup: int = 0,
    max_grad_norm: float | None = 1.0,
    eval_data=None,
    eval_every: int = 100,
    track_attention: bool = True,
    probe_size: int = 256,
    generator: torch.Generator | None = None,
    progress: bool = False,
) -> TrainingHistory:
    r"""Fit ``model`` with AdamW on minibatches of ``data``; return a :class:`TrainingHistory`.

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
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    if max_grad_norm is not None:
        max_grad_norm = check_positive(max_grad_norm, "max_grad_norm")
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")

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
