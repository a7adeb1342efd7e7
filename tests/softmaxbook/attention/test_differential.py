"""softmaxbook.attention.differential: the difference of two softmax attention maps."""

from __future__ import annotations

import pytest
import torch

import softmaxbook as sb


def _qkv(seed, *shapes):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]


def test_is_the_difference_of_two_attention_maps():
    q1, k1, q2, k2, v = _qkv(
        0, (2, 3, 5, 4), (2, 3, 6, 4), (2, 3, 5, 4), (2, 3, 6, 4), (2, 3, 6, 7)
    )
    lam = torch.tensor([0.2, 0.5, 0.8], dtype=torch.float64)
    out, w = sb.differential_attention(q1, k1, q2, k2, v, lam, return_weights=True)
    _, a1 = sb.scaled_dot_product_attention(q1, k1, v, return_weights=True)
    _, a2 = sb.scaled_dot_product_attention(q2, k2, v, return_weights=True)
    torch.testing.assert_close(w, a1 - lam[:, None, None] * a2)
    torch.testing.assert_close(out, w @ v)
    # Each row sums to 1 - lambda of its head.
    torch.testing.assert_close(w.sum(-1), (1 - lam)[:, None].expand(2, 3, 5))


def test_common_mode_attention_cancels():
    # Both maps put the same weight on a sink key 0; only map 1 finds key 3.
    s1 = torch.tensor([[4.0, 0.0, 0.0, 3.0, 0.0]], dtype=torch.float64)
    s2 = torch.tensor([[4.0, 0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    eye = torch.eye(5, dtype=torch.float64)
    _, w = sb.differential_attention(
        s1, eye, s2, eye, eye, 0.75, scale=1.0, return_weights=True
    )
    assert w[0].argmax() == 3 and abs(float(w[0, 0])) < 0.1 * float(w[0, 3])
    _, plain = sb.scaled_dot_product_attention(
        s1, eye, eye, scale=1.0, return_weights=True
    )
    assert plain[0].argmax() == 0  # softmax alone is dominated by the sink


def test_masks_and_gradients():
    q1, k1, q2, k2, v = _qkv(1, (4, 3), (4, 3), (4, 3), (4, 3), (4, 2))
    leaves = [t.requires_grad_() for t in (q1, k1, q2, k2, v)]
    lam = torch.tensor(0.6, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[2] = False  # a query with nothing to attend
    out, w = sb.differential_attention(*leaves, lam, mask=mask, return_weights=True)
    assert (w[2] == 0).all() and (out[2] == 0).all() and (w[~mask] == 0).all()
    assert torch.autograd.gradcheck(
        lambda *t: sb.differential_attention(*t[:5], t[5], is_causal=True),
        (*leaves, lam),
    )


def test_errors():
    q, k, v = _qkv(2, (2, 4, 3), (2, 5, 3), (2, 5, 3))
    with pytest.raises(ValueError, match="one shape"):
        sb.differential_attention(q, k, q[:, :2], k, v)
    with pytest.raises(ValueError, match="broadcast"):
        sb.differential_attention(q, k, q, k, v, torch.ones(3, dtype=torch.float64))
    with pytest.raises(TypeError, match="lam"):
        sb.differential_attention(q, k, q, k, v, "0.5")
    with pytest.raises(TypeError, match="floating"):
        sb.differential_attention(q.long(), k, q, k, v)
