"""Tests for softmaxbook.attention.flex: mask_mod and score_mod, block sparsity,
attention."""

from __future__ import annotations

import warnings

import pytest
import torch

import softmaxbook as sb

flex_module = pytest.importorskip("torch.nn.attention.flex_attention")


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _qkv(B=2, H=3, L=16, S=16, D=8, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=g, dtype=dtype)
    k = torch.randn(B, H, S, D, generator=g, dtype=dtype)
    v = torch.randn(B, H, S, D, generator=g, dtype=dtype)
    return q, k, v


# --- mask_from_mod ------------------------------------------------------------------


def test_mask_from_mod_matches_the_pattern_functions():
    assert torch.equal(mask_eq := sb.mask_from_mod(causal, 1, 1, 5, 7)[0, 0],
                       sb.causal_mask(5, 7))  # fmt: skip
    assert mask_eq.dtype == torch.bool

    def window(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < 3)

    assert torch.equal(
        sb.mask_from_mod(window, 1, 1, 8, 8)[0, 0], sb.sliding_window_mask(8, window=3)
    )
    ids = sb.document_ids([3, 4, 1])

    def documents(b, h, q_idx, kv_idx):
        return (ids[q_idx] == ids[kv_idx]) & (q_idx >= kv_idx)

    assert torch.equal(
        sb.mask_from_mod(documents, 1, 1, 8, 8)[0, 0],
        sb.document_mask(ids, causal=True),
    )


def test_mask_from_mod_uses_batch_and_head_indices():
    lengths = torch.tensor([3, 5])

    def per_batch_and_head(b, h, q_idx, kv_idx):  # head 1 is causal, head 0 not
        return (kv_idx < lengths[b]) & ((h == 0) | (q_idx >= kv_idx))

    mask = sb.mask_from_mod(per_batch_and_head, 2, 2, 5, 5)
    assert mask.shape == (2, 2, 5, 5)
    assert torch.equal(mask[1, 0], torch.ones(5, 5, dtype=torch.bool))
    assert torch.equal(mask[0, 1], sb.causal_mask(5) & (torch.arange(5) < 3))


def test_mask_from_mod_agrees_with_torch_create_mask():
    ids = sb.document_ids([5, 6, 5])

    def documents(b, h, q_idx, kv_idx):
        return ids[q_idx] == ids[kv_idx]

    ours = sb.mask_from_mod(documents, 2, 2, 16, 16)
    theirs = flex_module.create_mask(documents, 2, 2, 16, 16, device="cpu")
    assert torch.equal(ours, theirs)


def test_mask_from_mod_errors():
    with pytest.raises(TypeError, match="mask_mod must be callable"):
        sb.mask_from_mod(None, 1, 1, 2, 2)
    with pytest.raises(TypeError, match="boolean tensor"):
        sb.mask_from_mod(lambda b, h, q, k: (q - k).float(), 1, 1, 2, 2)
    with pytest.raises(TypeError, match="boolean tensor"):
        sb.mask_from_mod(lambda b, h, q, k: True, 1, 1, 2, 2)
    with pytest.raises(ValueError, match="does not broadcast"):
        sb.mask_from_mod(lambda b, h, q, k: torch.ones(3, dtype=torch.bool), 1, 1, 2, 2)
    with pytest.raises(ValueError, match="S must be >= 1"):
        sb.mask_from_mod(causal, 1, 1, 2, 0)
    with pytest.raises(TypeError, match="B must be an int"):
        sb.mask_from_mod(causal, 1.0, 1, 2, 2)


# --- block_mask_from_mod ------------------------------------------------------------


@pytest.mark.parametrize("L, S, block", [(16, 16, 4), (16, 16, 8), (10, 13, 4)])
def test_block_sparsity_by_definition(L, S, block):
    mask = sb.mask_from_mod(causal, 1, 1, L, S)[0, 0]
    sparsity = sb.block_mask_from_mod(causal, 1, 1, L, S, block_size=block)
    nq, nk = -(-L // block), -(-S // block)
    assert sparsity.computed.shape == sparsity.full.shape == (1, 1, nq, nk)
    for r in range(nq):
        for c in range(nk):
            tile = mask[r * block : (r + 1) * block, c * block : (c + 1) * block]
            assert bool(sparsity.computed[0, 0, r, c]) == bool(tile.any())
            assert bool(sparsity.full[0, 0, r, c]) == bool(tile.all())
    assert (~sparsity.full | sparsity.computed).all()  # full implies computed


def test_block_sparsity_agrees_with_torch_block_mask():
    def window(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < 20)

    for mod in (causal, window):
        ours = sb.block_mask_from_mod(mod, 1, 2, 64, 64, block_size=16)
        theirs = flex_module.create_block_mask(mod, 1, 2, 64, 64, "cpu", BLOCK_SIZE=16)
        assert torch.equal(ours.computed, theirs.to_dense().bool())
        full_counts = theirs.full_kv_num_blocks  # (B, H, n_q_blocks)
        assert torch.equal(ours.full.sum(-1), full_counts.long())
        assert ours.fraction_skipped() == pytest.approx(theirs.sparsity() / 100)
    # causal with 4 x 4 tiles: 6 of the 16 tiles lie above the diagonal
    causal_tiles = sb.block_mask_from_mod(causal, 1, 1, 64, 64, block_size=16)
    assert causal_tiles.fraction_skipped() == pytest.approx(6 / 16)


def test_block_mask_errors():
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        sb.block_mask_from_mod(causal, 1, 1, 4, 4, block_size=0)
    with pytest.raises(TypeError, match="block_size"):
        sb.block_mask_from_mod(causal, 1, 1, 4, 4, block_size=(2, 2, 2))


# --- flex_attention -----------------------------------------------------------------


def _torch_flex(*args, **kwargs):
    with warnings.catch_warnings():  # the eager, unfused path warns that it is one
        warnings.simplefilter("ignore", UserWarning)
        return flex_module.flex_attention(*args, **kwargs)


@pytest.mark.slow  # torch's eager flex_attention traces its mods on first use
def test_flex_attention_matches_torch_flex_attention_eager():
    q, k, v = _qkv()
    ids = sb.document_ids([5, 7, 4])
    slopes = sb.alibi_slopes(3).double()

    def documents(b, h, q_idx, kv_idx):
        return (ids[q_idx] == ids[kv_idx]) & (q_idx >= kv_idx)

    def alibi_and_cap(score, b, h, q_idx, kv_idx):
        return sb.soft_cap(score - slopes[h] * (q_idx - kv_idx).abs(), 5.0)

    ours = sb.flex_attention(q, k, v, score_mod=alibi_and_cap, mask_mod=documents)
    block_mask = flex_module.create_block_mask(documents, 2, 3, 16, 16, "cpu")
    theirs = _torch_flex(q, k, v, score_mod=alibi_and_cap, block_mask=block_mask)
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)


def test_flex_attention_equals_sdpa_with_the_materialized_mask():
    q, k, v = _qkv(L=6, S=9, seed=1)

    def window(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < 3)

    mask = sb.mask_from_mod(window, 2, 3, 6, 9)
    torch.testing.assert_close(
        sb.flex_attention(q, k, v, mask_mod=window),
        sb.scaled_dot_product_attention(q, k, v, mask=mask),
    )
    # no mods: plain attention; scale is honoured
    torch.testing.assert_close(
        sb.flex_attention(q, k, v, scale=0.3),
        sb.scaled_dot_product_attention(q, k, v, scale=0.3),
    )


def test_flex_attention_mask_comes_after_the_score_mod():
    # a soft cap of -inf would be -cap: the mask must still remove the key
    q, k, v = _qkv(B=1, H=1, L=4, S=4)
    out = sb.flex_attention(
        q,
        k,
        v,
        score_mod=lambda s, b, h, qi, ki: sb.soft_cap(s, 1.0) * 0 + 0.0,
        mask_mod=causal,
    )
    # all allowed scores equal: query i averages the values of keys 0..i
    expected = torch.stack([v[0, 0, : i + 1].mean(0) for i in range(4)])
    torch.testing.assert_close(out[0, 0], expected)


def _padded_documents():
    ids = torch.tensor([0, 0, 0, -1, -1, 1])

    def documents(b, h, q_idx, kv_idx):
        return (ids[q_idx] == ids[kv_idx]) & (ids[q_idx] >= 0)

    return documents


def _capped(s, b, h, q_idx, kv_idx):
    return sb.soft_cap(s, 2.0)


def test_flex_attention_empty_rows_and_gradients():
    q, k, v = _qkv(B=1, H=2, L=6, S=6, seed=2)
    documents = _padded_documents()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]

    def run(*qkv):
        return sb.flex_attention(*qkv, score_mod=_capped, mask_mod=documents)

    out = run(*leaves)
    assert (out[:, :, 3:5] == 0).all()  # padding queries: zeros
    assert torch.autograd.gradcheck(run, leaves)
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in leaves)


@pytest.mark.slow  # torch's eager flex_attention, see above
def test_flex_attention_empty_rows_agree_with_torch():
    q, k, v = _qkv(B=1, H=2, L=6, S=6, seed=2)
    documents = _padded_documents()
    ours = sb.flex_attention(q, k, v, score_mod=_capped, mask_mod=documents)
    block_mask = flex_module.create_block_mask(documents, 1, 2, 6, 6, "cpu")
    theirs = _torch_flex(
        q, k, v, score_mod=lambda s, b, h, qi, ki: 2.0 * torch.tanh(s / 2.0),
        block_mask=block_mask,
    )  # fmt: skip
    assert (theirs[:, :, 3:5] == 0).all()
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_flex_attention_low_precision(dtype):
    q, k, v = _qkv(B=1, H=1, L=8, S=8, dtype=torch.float32, seed=4)
    ref = sb.flex_attention(q, k, v, mask_mod=causal)
    low = sb.flex_attention(*(t.to(dtype) for t in (q, k, v)), mask_mod=causal)
    assert low.dtype == dtype
    tol = {torch.float16: 5e-3, torch.bfloat16: 5e-2, torch.float32: 1e-6}[dtype]
    assert float((low.float() - ref).abs().max()) < tol


def test_flex_attention_errors():
    q, k, v = _qkv(B=1, H=1, L=3, S=3)
    with pytest.raises(ValueError, match="4-D"):
        sb.flex_attention(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="share B and H"):
        sb.flex_attention(q, k.expand(2, 1, 3, 8), v.expand(2, 1, 3, 8))
    with pytest.raises(TypeError, match="score_mod must be callable"):
        sb.flex_attention(q, k, v, score_mod=3)
    with pytest.raises(TypeError, match="floating-point"):
        sb.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, ki: qi >= ki)
    with pytest.raises(ValueError, match="does not broadcast"):
        sb.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, ki: torch.ones(5))
    with pytest.raises(TypeError, match="boolean tensor"):
        sb.flex_attention(q, k, v, mask_mod=lambda b, h, qi, ki: qi - ki)
    with pytest.raises(ValueError, match="scale"):
        sb.flex_attention(q, k, v, scale=0.0)
    with pytest.raises(TypeError, match="floating-point"):
        sb.flex_attention(q.long(), k, v)
