"""softmaxbook.attention.flash._tiles: the three forward loops of flash_attention's
tile path.

A call whose keys fit in one tile takes the plain softmax of that tile
(``_forward_tile``); an unmasked call over several key tiles keeps one shift per
row and rescales only when a tile's weights would overflow (``_forward_lazy``);
a masked call keeps the running maximum (the loop of ``_forward_units``). Each
is checked against float64 attention, forward and backward, including the rows
and inputs that reach their special cases.
"""

from __future__ import annotations

import pytest
import torch

import softmaxbook as sb
from random_inputs import qkv, sdpa64
from softmaxbook.attention.flash import _tiles


def _spy(monkeypatch, name):
    calls = []
    real = getattr(_tiles, name)

    def spy(*args, **kw):
        calls.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(_tiles, name, spy)
    return calls


@pytest.mark.parametrize(
    "options",
    [{}, {"is_causal": True}, {"is_causal": "bottom_right"}, {"mask": True}],
)
def test_one_tile_is_the_plain_softmax_of_the_tile(options, monkeypatch):
    q, k, v = qkv(24, 40, dtype=torch.float64)
    if options.get("mask"):
        g = torch.Generator().manual_seed(1)
        mask = torch.rand(2, 1, 24, 40, generator=g) < 0.5
        mask[1, 0, 3] = False  # a query with nothing to attend
        options = {"mask": mask}
    calls = _spy(monkeypatch, "_forward_tile")
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = sb.flash_attention(*leaves, return_lse=True, explicit=True, **options)
    assert calls  # the one-tile path ran
    expected = sb.scaled_dot_product_attention(q, k, v, explicit=True, **options)
    torch.testing.assert_close(out, expected)
    multi = sb.flash_attention(q, k, v, block_size=(8, 16), **options)
    torch.testing.assert_close(out, multi)
    if "mask" in options:
        assert (out[1, :, 3] == 0).all() and torch.isneginf(lse[1, :, 3]).all()
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in leaves)


def test_one_tile_float32_error_at_most_twice_torch():
    q, k, v = qkv(64, 64)
    exact = sdpa64(q, k, v)
    ours = (sb.flash_attention(q, k, v, explicit=True).double() - exact).abs().max()
    theirs = (
        (torch.nn.functional.scaled_dot_product_attention(q, k, v).double() - exact)
        .abs()
        .max()
    )
    assert ours <= 2 * theirs + 1e-7


@pytest.mark.parametrize("is_causal", [False, True])
def test_lazy_loop_matches_float64(is_causal, monkeypatch):
    q, k, v = qkv(70, 90, dtype=torch.float64)
    calls = _spy(monkeypatch, "_forward_lazy")
    out, lse = sb.flash_attention(
        q, k, v, is_causal=is_causal, block_size=(16, 32), return_lse=True
    )
    assert calls
    torch.testing.assert_close(out, sdpa64(q, k, v, is_causal=is_causal))
    scores = q @ k.transpose(-2, -1) / 4.0
    if is_causal:
        scores = scores.masked_fill(~sb.causal_mask(70, 90), float("-inf"))
    torch.testing.assert_close(lse, scores.logsumexp(-1))


def test_lazy_loop_rescales_when_a_later_tile_rises_far(monkeypatch):
    # The first key tile holds small scores, a later one scores 200 higher (base e):
    # the later tile's weights would overflow, so the state is rescaled to them.
    q, k, v = qkv(8, 64, D=4, batch=(1,))
    k = k * 0.01
    k[:, 40] = q.mean(1) * 400 / q.mean(1).norm().square()  # score ~200 * 0.5
    monkeypatch.setattr(_tiles, "TILE_SUM_LIMIT", 2.0**20)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = sb.flash_attention(*leaves, block_size=(8, 16), return_lse=True)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    torch.testing.assert_close(out.double(), sdpa64(q, k, v), atol=1e-5, rtol=1e-5)
    scores = (q.double() @ k.double().transpose(-2, -1)) / 2.0
    torch.testing.assert_close(lse.double(), scores.logsumexp(-1), atol=1e-4, rtol=0)
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in leaves)


def test_lazy_loop_keeps_nan_in_its_own_row():
    q, k, v = qkv(8, 64, D=4, batch=(1,))
    k[0, 50, 0] = float("nan")  # in a later tile: every row sees it
    q2 = q.clone()
    q2[0, 3, 0] = float("nan")
    assert torch.isnan(sb.flash_attention(q, k, v, block_size=(8, 16))).all()
    _, k2, _ = qkv(8, 64, D=4, batch=(1,))
    out = sb.flash_attention(q2, k2, v, block_size=(8, 16))
    assert torch.isnan(out[0, 3]).all() and torch.isfinite(out[0, [0, 1, 2, 4]]).all()


def test_backward_batches_heads_per_tile():
    # 12 heads of short sequences: the backward units hold several heads at once;
    # the gradients equal float64 autograd through the explicit computation.
    q, k, v = qkv(16, 24, batch=(3, 4), dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    w = torch.randn(3, 4, 16, 16, dtype=torch.float64)
    (sb.flash_attention(*leaves, is_causal=True, explicit=True) * w).sum().backward()
    out = sb.scaled_dot_product_attention(*ref, is_causal=True, explicit=True)
    (out * w).sum().backward()
    for a, b in zip(leaves, ref):
        torch.testing.assert_close(a.grad, b.grad)
