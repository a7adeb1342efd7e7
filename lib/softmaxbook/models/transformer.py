r"""A tiny decoder-only transformer whose attention is the library's, normalizer
pluggable."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from .._validate import check_positive, check_positive_int, check_tensor
from ..attention.sdpa import (
    Normalizer,
    resolve_normalizer,
    scaled_dot_product_attention,
)

__all__ = ["MultiHeadAttention", "TransformerBlock", "TinyTransformer"]


class MultiHeadAttention(nn.Module):
    r"""Multi-head self-attention:
    :math:`\mathrm{concat}_h\, \mathrm{normalize}(Q_h K_h^\top \cdot s / T)\,
    V_h \; W_O`.

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
        A name in ``softmaxbook.NORMALIZERS`` or ``f(scores, dim=-1)``.
    scale : float, optional
        Multiplies :math:`QK^\top`; defaults to :math:`1/\sqrt{D}`.
    temperature : float
        Divides the scaled scores.
    causal : bool
        Each position attends only to itself and earlier positions.
    sinks : bool
        Give each head a learned sink logit :math:`b_h` (as in gpt-oss): the
        parameter :attr:`sinks` of shape ``(H,)``, initialized to 0, so that
        a head's weights are
        :math:`e^{s_j} / (e^{b_h} + \sum_k e^{s_k})` and may sum to less
        than 1 (at initialization, :func:`~softmaxbook.softmax_one`). Softmax
        normalizer only.
    gate : bool
        Multiply the heads' output, before :math:`W_O`, by an elementwise
        sigmoid gate :math:`\sigma(x W_\theta + b_\theta)` computed from the
        layer's input (the gated attention of Qiu et al., 2025): a head can
        then output (almost) nothing without a sink. Its weights start like
        every linear map's and its bias at 0, so the gate averages about 1/2
        at initialization.
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
        sinks: bool = False,
        gate: bool = False,
    ) -> None:
        super().__init__()
        d_model = check_positive_int(d_model, "d_model")
        n_heads = check_positive_int(n_heads, "n_heads")
        if d_model % n_heads:
            raise ValueError(
                f"d_model={d_model} must be a multiple of n_heads={n_heads}"
            )
        name, _ = resolve_normalizer(normalizer)  # fail now, not at the first pass
        if sinks and name != "softmax":
            raise ValueError(
                f"sinks=True needs the softmax normalizer, got normalizer={name!r}"
            )
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
        #: The learned sink logits ``(H,)``, or None.
        self.sinks = nn.Parameter(torch.zeros(n_heads)) if sinks else None
        #: The gate's linear map ``d_model -> d_model``, or None.
        self.gate = nn.Linear(d_model, d_model) if gate else None

    def forward(
        self, x: Tensor, *, need_weights: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        """Return ``(output, weights)``: ``(B, L, d_model)`` and ``(B, H, L, L)``.

        With ``need_weights=False`` (as in ``torch.nn.MultiheadAttention``) the
        weights are not formed and ``None`` is returned in their place, so that a
        softmax layer without sinks takes torch's fused kernel
        (``sb.explain_dispatch`` says which path a call takes); the output is the
        same up to rounding.
        """
        if not isinstance(need_weights, bool):
            raise TypeError(
                f"need_weights must be a bool, got {type(need_weights).__name__}"
            )
        B, L, d_model = x.shape
        qkv = self.qkv(x).view(B, L, 3, self.n_heads, self.d_head)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, H, L, D)
        result = scaled_dot_product_attention(
            q,
            k,
            v,
            is_causal=self.causal,
            scale=self.score_scale,
            normalizer=self.normalizer,
            sinks=self.sinks,
            return_weights=need_weights,
        )  # (B, H, L, D), and (B, H, L, L) with need_weights
        heads, weights = result if isinstance(result, tuple) else (result, None)
        heads = heads.transpose(1, 2).reshape(B, L, d_model)
        if self.gate is not None:  # elementwise, so per head and per dimension
            heads = heads * torch.sigmoid(self.gate(x))
        return self.out(heads), weights


class TransformerBlock(nn.Module):
    r"""Pre-LayerNorm block: :math:`x + \mathrm{MHA}(\mathrm{LN}(x))`, then
    :math:`x + \mathrm{MLP}(\mathrm{LN}(x))`.

    Normalizing *before* each sublayer keeps the residual stream an identity
    path; Xiong et al. (2020) show that such pre-LN transformers have
    well-behaved gradients at initialization and train without the learning-rate
    warm-up that post-LN ones need (the book's recipe keeps a short one). The
    keyword arguments go to :class:`MultiHeadAttention`.

    Shapes: ``x`` is ``(B, L, d_model)``; returns ``(B, L, d_model)`` and the
    ``(B, H, L, L)`` attention weights.
    """

    def __init__(
        self, d_model: int, n_heads: int, d_ff: int | None = None, **attention: Any
    ) -> None:
        super().__init__()
        d_ff = 4 * d_model if d_ff is None else check_positive_int(d_ff, "d_ff")
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, n_heads, **attention)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model)
        )

    def forward(
        self, x: Tensor, *, need_weights: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        """Return ``(x, weights)`` after the attention and the MLP sublayers
        (``weights`` is None with ``need_weights=False``)."""
        attended, weights = self.attn(self.ln1(x), need_weights=need_weights)
        x = x + attended
        return x + self.mlp(self.ln2(x)), weights


class TinyTransformer(nn.Module):
    r"""A small decoder-only transformer:
    :math:`\mathrm{logits} = W_U\, \mathrm{LN}(\mathrm{blocks}(E[x] + P))`.

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
        ``softmaxbook.NORMALIZERS``, or ``f(scores, dim=-1)``.
    scale : float, optional
        Multiplies :math:`QK^\top`; default :math:`1/\sqrt{D}` with
        ``D = d_model // n_heads``; ``1.0`` trains without the scale.
    temperature : float
        Divides the scaled scores of every head (``0.1`` = ten times sharper).
    causal : bool
        Causal self-attention (a position sees itself and the past only).
    init_gain : float
        Multiplies the initial query and key weights.
    sinks, gate : bool
        Learned sink logits per head, and gated attention, in every layer
        (see :class:`MultiHeadAttention`).
    generator : torch.Generator, optional
        Seeds the initialization (a CPU generator).

    Raises
    ------
    ValueError
        On a non-positive size, scale or temperature, an unknown normalizer,
        ``sinks=True`` with a normalizer other than softmax,
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
        sinks: bool = False,
        gate: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
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
                sinks=sinks,
                gate=gate,
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
            assert isinstance(block, TransformerBlock)  # for the type checker
            d_model = block.attn.qkv.in_features
            block.attn.qkv.weight[: 2 * d_model].mul_(init_gain)  # the W_Q and W_K rows

    def forward(
        self, tokens: Tensor, *, return_weights: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Logits ``(B, L, V)``, or ``(logits, weights)`` with the ``(B, n_layers, H, L,
        L)`` maps.

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
        maps: list[Tensor] = []
        for block in self.blocks:
            x, weights = block(x, need_weights=return_weights)
            if weights is not None:
                maps.append(weights)
        logits = self.unembed(self.ln_f(x))  # (B, L, V)
        if return_weights:
            return logits, torch.stack(maps, dim=1)
        return logits
