"""softmaxbook.attention.selective: selective attention (Leviathan et al., 2025)."""

from __future__ import annotations

import math

import pytest
import torch

import softmaxbook as sb


def _qkv(seed, *shapes):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]


def published(q, k, v):
    """The paper's listing (Figure 2 / Algorithm 1), for (B, H, N, D) inputs."""
    N = q.shape[-2]
    attn_logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    causal = torch.tril(torch.ones(N, N, dtype=torch.bool))
    attn_logits = torch.where(causal, attn_logits, float("-inf"))
    S = attn_logits[:, 0]  # select head 0
    S = torch.relu(S)  # only positive selection
    S[..., 0] = 0  # do not mask <BOS>
    S = (1 - torch.eye(N, dtype=S.dtype)) * S  # do not mask self
    S = torch.roll(S, 1, -2)
    S[..., 0, :] = 0  # mask strictly in the future
    F = torch.cumsum(S, dim=-2)
    attn_logits = attn_logits - F[:, None]
    return torch.softmax(attn_logits, -1) @ v


def test_matches_the_published_listing():
    q, k, v = _qkv(0, (2, 3, 7, 4), (2, 3, 7, 4), (2, 3, 7, 5))
    q, k = 2 * q, 2 * k  # enough positive selection logits to matter
    out, w = sb.selective_attention(q, k, v, return_weights=True)
    torch.testing.assert_close(out, published(q, k, v))
    plain = sb.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert not torch.allclose(out, plain)
    assert (w[..., ~sb.causal_mask(7)] == 0).all()


def test_no_positive_selection_is_plain_causal_attention():
    q, k, v = _qkv(1, (1, 2, 5, 3), (1, 2, 5, 3), (1, 2, 5, 2))
    q[:, 0], k[:, 0] = q[:, 0].abs(), -k[:, 0].abs()  # selector scores all <= 0
    out = sb.selective_attention(q, k, v)
    torch.testing.assert_close(
        out, sb.scaled_dot_product_attention(q, k, v, is_causal=True)
    )


def test_the_first_token_and_the_query_itself_are_never_masked():
    # Head 0 selects everything strongly. Query i keeps the first token, itself,
    # and token i - 1, which only token i - 1 itself could have selected.
    N = 6
    q = torch.ones(1, 2, N, 1, dtype=torch.float64) * 10
    k = torch.ones(1, 2, N, 1, dtype=torch.float64) * 10
    v = torch.eye(N, dtype=torch.float64).expand(1, 2, N, N)
    _, w = sb.selective_attention(q, k, v, return_weights=True)
    for i in range(2, N):
        row = w[0, 1, i]
        kept = torch.zeros(N, dtype=torch.bool)
        kept[[0, i - 1, i]] = True
        torch.testing.assert_close(row[kept], torch.full((3,), 1 / 3, dtype=row.dtype))
        assert row[~kept].sum() < 1e-30


def test_gradcheck_and_errors():
    q, k, v = _qkv(2, (2, 4, 3), (2, 4, 3), (2, 4, 2))
    leaves = tuple(t.requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(lambda *t: sb.selective_attention(*t), leaves)
    with pytest.raises(ValueError, match="one L"):
        sb.selective_attention(q, k[:, :3], v[:, :3])
    with pytest.raises(ValueError, match="heads"):
        sb.selective_attention(q, k, v, selector=2)
    with pytest.raises(TypeError, match="selector"):
        sb.selective_attention(q, k, v, selector=0.0)
    with pytest.raises(ValueError, match="scale"):
        sb.selective_attention(q, k, v, scale=-1.0)
