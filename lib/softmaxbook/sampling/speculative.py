r"""Speculative decoding's acceptance rule: a draft's tokens, the target's distribution.

A small *draft* model proposes :math:`K` tokens :math:`x_1, \dots, x_K`, drawn
from its distributions :math:`q_1, \dots, q_K`; the large *target* model
scores them all in one pass, which gives its distributions
:math:`p_1, \dots, p_{K+1}`. Token :math:`x_i` is accepted with probability
:math:`\min(1, p_i(x_i) / q_i(x_i))`; at the first rejection a replacement is
drawn from the residual :math:`\mathrm{norm}(\max(0, p_i - q_i))` and the
rest of the draft is discarded; if all :math:`K` are accepted, a bonus token
comes from :math:`p_{K+1}` (Leviathan et al., 2023; Chen et al., 2023).

Every token produced this way is distributed *exactly* as if it had been
sampled from the target: :math:`q(x)\min(1, p(x)/q(x)) = \min(p(x), q(x))`,
and the residual supplies the missing :math:`p(x) - \min(p(x), q(x))`. The
guarantee holds for the :math:`p` and :math:`q` passed in, so each must be
the distribution actually used: the target's *after* its temperature and
filters (top-k, top-p, min-p), and the draft's exactly as its tokens were
drawn.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .._validate import check_float, check_tensor

__all__ = ["SpeculativeResult", "speculative_accept"]


class SpeculativeResult(NamedTuple):
    """The outcome of :func:`speculative_accept` for every sequence of the batch."""

    #: How many draft tokens were accepted, in ``[0, K]``; shape ``(...)``.
    n_accepted: Tensor
    #: The token that follows them (a correction, or the bonus token); ``(...)``.
    next_token: Tensor


def _check_probs(probs: Tensor, name: str) -> Tensor:
    check_float(probs, name)
    if probs.dim() < 2:
        raise ValueError(
            f"{name} must be (..., positions, V), got {tuple(probs.shape)}"
        )
    if torch.isnan(probs).any() or (probs < 0).any():
        raise ValueError(f"{name} must hold probabilities: no nan, nothing negative")
    total = probs.double().sum(dim=-1)
    if ((total - 1).abs() > 1e-3).any():
        raise ValueError(
            f"every row of {name} must sum to 1 (pass probabilities, e.g. the softmax "
            f"of the tempered and filtered logits), got sums from "
            f"{float(total.min()):.4g} to {float(total.max()):.4g}"
        )
    return probs


def speculative_accept(
    target_probs: Tensor,
    draft_probs: Tensor,
    draft_tokens: Tensor,
    *,
    generator: torch.Generator | None = None,
) -> SpeculativeResult:
    r"""Verify a block of draft tokens against the target:
    accept :math:`x_i` with probability :math:`\min(1, p_i(x_i) / q_i(x_i))`,
    else draw from :math:`\mathrm{norm}(\max(0, p_i - q_i))`.

    For each sequence: draw :math:`u_i \sim U[0, 1)` and accept
    :math:`x_i` while :math:`u_i\, q_i(x_i) < p_i(x_i)`; let :math:`n` be the
    number accepted before the first rejection. If :math:`n < K` the next
    token is drawn from the residual of position :math:`n`, otherwise from
    :math:`p_{K+1}`. The tokens to emit are ``draft_tokens[..., :n]``
    followed by ``next_token``: between 1 and :math:`K + 1` tokens for one
    target pass, each distributed exactly as a sample of the target. (When
    rounding leaves a residual with no mass, :math:`p_i` is used instead:
    then :math:`p_i = q_i` up to rounding and a rejection had probability 0.)

    The expected number of accepted tokens per position is the overlap
    :math:`\alpha = \sum_x \min(p(x), q(x))`: the closer the draft, the
    longer the accepted runs.

    Shapes: ``target_probs`` is ``(..., K + 1, V)``, ``draft_probs`` is
    ``(..., K, V)``, ``draft_tokens`` is ``(..., K)`` (integers); both fields
    of the result are ``(...)``, ``torch.long``.

    >>> import torch
    >>> import softmaxbook as sb
    >>> p = torch.softmax(torch.randn(4, 8), -1)  # the target, K + 1 = 4 positions
    >>> tokens = torch.multinomial(p[:3], 1).squeeze(-1)  # a draft that is the target
    >>> result = sb.speculative_accept(p, p[:3], tokens)
    >>> result.n_accepted.item()  # p = q: every draft token is accepted
    3

    Parameters
    ----------
    target_probs : Tensor
        :math:`p_1, \dots, p_{K+1}`: the target's sampling distributions at
        the :math:`K` draft positions and the one after them, temperature
        and filters applied; rows sum to 1.
    draft_probs : Tensor
        :math:`q_1, \dots, q_K`: the distributions the draft tokens were
        drawn from; rows sum to 1.
    draft_tokens : Tensor
        :math:`x_1, \dots, x_K`, each with :math:`q_i(x_i) > 0`.
    generator : torch.Generator, optional
        The source of randomness; the global generator when ``None``.

    Returns
    -------
    SpeculativeResult
        ``(n_accepted, next_token)``.

    Raises
    ------
    TypeError
        If the probabilities are not floating point, the tokens not integers,
        or ``generator`` not a ``torch.Generator``.
    ValueError
        If the shapes do not fit, a row is not a probability distribution, a
        token is out of range, or a draft token has draft probability 0 (it
        cannot have been drawn from ``draft_probs``).
    """
    p = _check_probs(target_probs, "target_probs")
    q = _check_probs(draft_probs, "draft_probs")
    check_tensor(draft_tokens, "draft_tokens")
    if draft_tokens.is_floating_point() or draft_tokens.dtype == torch.bool:
        raise TypeError(
            f"draft_tokens must be an integer tensor, got {draft_tokens.dtype}"
        )
    K, V = q.shape[-2], q.shape[-1]
    batch = q.shape[:-2]
    if p.shape != (*batch, K + 1, V) or draft_tokens.shape != (*batch, K):
        raise ValueError(
            "expected target_probs (..., K + 1, V), draft_probs (..., K, V) and "
            f"draft_tokens (..., K); got {tuple(p.shape)}, {tuple(q.shape)} and "
            f"{tuple(draft_tokens.shape)}"
        )
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator, got {type(generator).__name__}"
        )
    if draft_tokens.numel() and (
        int(draft_tokens.min()) < 0 or int(draft_tokens.max()) >= V
    ):
        raise ValueError(f"draft_tokens must be in [0, {V})")
    x = draft_tokens.long().unsqueeze(-1)  # (..., K, 1)
    p_x = p[..., :K, :].gather(-1, x).squeeze(-1)  # (..., K)
    q_x = q.gather(-1, x).squeeze(-1)
    if (q_x <= 0).any():
        raise ValueError(
            "a draft token has probability 0 under draft_probs: pass the "
            "distribution the draft tokens were actually drawn from (same "
            "temperature and filters)"
        )
    u = torch.rand(q_x.shape, generator=generator, device=q.device, dtype=q_x.dtype)
    accepted = u * q_x < p_x  # (..., K): u < p/q, without dividing
    n = (
        accepted.long().cumprod(dim=-1).sum(dim=-1)
    )  # (...): accepted before a rejection

    index = n[..., None, None].expand(*batch, 1, V)  # position n of every sequence
    p_n = p.gather(-2, index).squeeze(-2)  # (..., V)
    q_padded = torch.cat([q, q.new_zeros(*batch, 1, V)], dim=-2)  # q_{K+1} = 0
    q_n = q_padded.gather(-2, index).squeeze(-2)
    residual = (p_n - q_n).clamp_min(0)  # = p_{K+1} after a fully accepted draft
    empty = residual.sum(dim=-1, keepdim=True) <= 0
    residual = torch.where(empty, p_n, residual)
    rows = residual.reshape(-1, V).double()
    if rows.shape[0] == 0:
        next_token = torch.empty(batch, dtype=torch.long, device=q.device)
    else:
        drawn = torch.multinomial(rows, 1, generator=generator)  # renormalizes
        next_token = drawn.reshape(batch)
    return SpeculativeResult(n, next_token)
