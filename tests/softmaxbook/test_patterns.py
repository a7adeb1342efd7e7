"""Tests for softmaxbook.patterns: document, sliding-window, prefix-LM masks, ALiBi."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import softmaxbook as sb

# --- document_ids and document_mask ---------------------------------------------------


def test_document_ids_by_hand():
    assert sb.document_ids([3, 2, 1]).tolist() == [0, 0, 0, 1, 1, 2]
    assert sb.document_ids([2, 0, 1], 5).tolist() == [0, 0, 2, -1, -1]
    assert sb.document_ids(torch.tensor([1, 1])).dtype == torch.long
    assert sb.document_ids([]).shape == (0,)


def test_document_mask_by_hand():
    ids = torch.tensor([0, 0, 1, 1, 1, -1])
    expected = torch.tensor(
        [
            [1, 1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [0, 0, 1, 1, 1, 0],
            [0, 0, 1, 1, 1, 0],
            [0, 0, 1, 1, 1, 0],
            [0, 0, 0, 0, 0, 0],  # a padding query attends to nothing
        ],
        dtype=torch.bool,
    )
    assert torch.equal(sb.document_mask(ids), expected)
    assert torch.equal(sb.document_mask(ids, causal=True), expected & sb.causal_mask(6))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=5), st.integers(0, 3))
def test_packed_attention_equals_each_document_alone(lengths, extra):
    # The defining property: packing documents into one row with a causal
    # document mask gives, for every document, exactly the causal attention of
    # that document on its own; padding rows give zeros.
    total = sum(lengths) + extra
    if total == 0:
        return
    g = torch.Generator().manual_seed(sum(lengths) * 7 + extra)
    q, k, v = (torch.randn(total, 4, generator=g, dtype=torch.float64) for _ in "qkv")
    ids = sb.document_ids(lengths, total)
    packed = sb.scaled_dot_product_attention(
        q, k, v, mask=sb.document_mask(ids, causal=True)
    )
    start = 0
    for n in lengths:
        if n:
            part = slice(start, start + n)
            alone = sb.scaled_dot_product_attention(
                q[part], k[part], v[part], is_causal=True
            )
            torch.testing.assert_close(packed[part], alone, rtol=1e-12, atol=1e-12)
        start += n
    assert (packed[start:] == 0).all()


def test_document_mask_varlen_batch_matches_padding_mask():
    # one document per row, padded with -1: the key side is padding_mask
    lengths = torch.tensor([4, 2, 0])
    positions = torch.arange(4)
    ids = torch.where(positions < lengths[:, None], 0, -1)  # (B, L)
    mask = sb.document_mask(ids)  # (B, L, L)
    keys = sb.padding_mask(lengths, 4)  # (B, S)
    queries = keys
    assert torch.equal(mask, queries[:, :, None] & keys[:, None, :])


def test_document_mask_cross_attention_and_broadcasting():
    q_ids = torch.tensor([[0, 1], [1, 1]])  # (B=2, L=2)
    kv_ids = torch.tensor([0, 0, 1])  # (S=3,), broadcast over the batch
    mask = sb.document_mask(q_ids, kv_ids)
    assert mask.shape == (2, 2, 3)
    assert mask[0].int().tolist() == [[1, 1, 0], [0, 0, 1]]
    assert mask[1].int().tolist() == [[0, 0, 1], [0, 0, 1]]


def test_document_errors():
    with pytest.raises(TypeError, match="lengths"):
        sb.document_ids([1.5, 2])
    with pytest.raises(ValueError, match=">= 0"):
        sb.document_ids([2, -1])
    with pytest.raises(ValueError, match="total must be >= sum"):
        sb.document_ids([2, 2], 3)
    with pytest.raises(TypeError, match="total"):
        sb.document_ids([2], 3.0)
    with pytest.raises(TypeError, match="q_ids must be an integer"):
        sb.document_mask(torch.zeros(3))
    with pytest.raises(TypeError, match=r"q_ids must be a torch\.Tensor"):
        sb.document_mask([0, 0, 1])
    with pytest.raises(ValueError, match="do not broadcast"):
        sb.document_mask(torch.zeros(2, 3, dtype=torch.long), torch.zeros(3, 4).long())
    with pytest.raises(TypeError, match="causal"):
        sb.document_mask(torch.zeros(3, dtype=torch.long), causal=1)


# --- sliding_window_mask ------------------------------------------------------------


@pytest.mark.parametrize("L, S", [(6, 6), (4, 7), (7, 4), (1, 1)])
@pytest.mark.parametrize("window", [1, 2, 3, 10])
def test_sliding_window_counts_and_definition(L, S, window):
    mask = sb.sliding_window_mask(L, S, window=window)
    for i in range(L):
        for j in range(S):
            assert bool(mask[i, j]) == (0 <= i - j < window)
    # every query sees min(i + 1, window) keys when S >= L
    if S >= L:
        assert mask.sum(-1).tolist() == [min(i + 1, window) for i in range(L)]
    two_sided = sb.sliding_window_mask(L, S, window=window, causal=False)
    assert torch.equal(two_sided & sb.causal_mask(L, S), mask)


def test_sliding_window_limits_and_torch_agreement():
    assert torch.equal(sb.sliding_window_mask(5, window=5), sb.causal_mask(5))
    assert torch.equal(sb.sliding_window_mask(5, window=1), torch.eye(5, dtype=bool))
    assert sb.sliding_window_mask(4, window=9, causal=False).all()
    # Hugging Face's overlay: kv_idx > q_idx - window, on top of causality
    i, j = torch.arange(8)[:, None], torch.arange(8)
    assert torch.equal(sb.sliding_window_mask(8, window=3), (j <= i) & (j > i - 3))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 8, 4, generator=g, dtype=torch.float64) for _ in "qkv")
    mask = sb.sliding_window_mask(8, window=3)
    torch.testing.assert_close(
        sb.scaled_dot_product_attention(q, k, v, mask=mask, explicit=True),
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
    )


@pytest.mark.parametrize("L", range(1, 9))
@pytest.mark.parametrize("S", range(1, 9))
def test_sliding_window_limits_depend_on_L(L, S):
    # The causal window is the causal mask exactly when window >= L (the causal
    # mask's farthest pair is query L - 1 and key 0), whatever S is: window >= S
    # is not enough when L > S. Two-sided, every pair is allowed exactly when
    # window >= max(L, S), and a query sees at most 2 * window - 1 keys.
    for window in range(1, 11):
        causal = sb.sliding_window_mask(L, S, window=window)
        assert torch.equal(causal, sb.causal_mask(L, S)) == (window >= L)
        two_sided = sb.sliding_window_mask(L, S, window=window, causal=False)
        assert bool(two_sided.all()) == (window >= max(L, S))
        assert int(two_sided.sum(-1).max()) == min(2 * window - 1, S, L + window - 1)
    if L > S:  # the docstring's old condition, window >= S, fails here
        assert not torch.equal(
            sb.sliding_window_mask(L, S, window=S), sb.causal_mask(L, S)
        )


def test_sliding_window_docstring_states_the_limits():
    # The API page states the conditions that the test above checks.
    doc = " ".join(sb.sliding_window_mask.__doc__.split())
    assert "``window >= L``, whatever ``S`` is" in doc
    assert "``window >= max(L, S)``" in doc
    assert "``2 * window - 1`` keys" in doc
    assert "``window >= S`` gives back the causal mask" not in doc


def test_sliding_window_errors():
    with pytest.raises(ValueError, match="window must be >= 1"):
        sb.sliding_window_mask(4, window=0)
    with pytest.raises(TypeError, match="window"):
        sb.sliding_window_mask(4, window=2.0)
    with pytest.raises(TypeError, match="causal"):
        sb.sliding_window_mask(4, window=2, causal=None)
    with pytest.raises(ValueError, match="L must be >= 1"):
        sb.sliding_window_mask(0, window=2)


# --- prefix_lm_mask -----------------------------------------------------------------


@pytest.mark.parametrize("p", [0, 1, 3, 6])
def test_prefix_lm_by_definition(p):
    mask = sb.prefix_lm_mask(6, p)
    for i in range(6):
        for j in range(6):
            assert bool(mask[i, j]) == (j < p or j <= i)
    if p == 0:
        assert torch.equal(mask, sb.causal_mask(6))
    if p == 6:
        assert mask.all()


def test_prefix_lm_batch_and_independence_of_the_prefix():
    masks = sb.prefix_lm_mask(5, torch.tensor([1, 3]))
    assert masks.shape == (2, 5, 5)
    assert torch.equal(masks[1], sb.prefix_lm_mask(5, 3))
    # the prefix never sees the continuation: its outputs do not depend on it
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(5, 4, generator=g, dtype=torch.float64) for _ in "qkv")
    k2, v2 = k.clone(), v.clone()
    k2[3:] += 1.0
    v2[3:] += 1.0
    mask = sb.prefix_lm_mask(5, 3)
    a = sb.scaled_dot_product_attention(q, k, v, mask=mask)
    b = sb.scaled_dot_product_attention(q, k2, v2, mask=mask)
    assert torch.equal(a[:3], b[:3]) and not torch.equal(a[3:], b[3:])


def test_prefix_lm_errors():
    with pytest.raises(ValueError, match=r"\[0, L=4\]"):
        sb.prefix_lm_mask(4, 5)
    with pytest.raises(ValueError, match=r"\[0, L=4\]"):
        sb.prefix_lm_mask(4, [1, -1])
    with pytest.raises(TypeError, match="prefix_lengths"):
        sb.prefix_lm_mask(4, 1.5)
    with pytest.raises(TypeError, match="prefix_lengths"):
        sb.prefix_lm_mask(4, True)


# --- ALiBi --------------------------------------------------------------------------


def _reference_slopes(n):
    # ALiBi's reference implementation (Press et al.), written out again.
    def power_of_2(m):
        start = 2 ** (-(2 ** -(math.log2(m) - 3)))
        return [start * start**i for i in range(m)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + _reference_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6, 8, 12, 16])
def test_alibi_slopes_match_the_reference_recipe(n):
    slopes = sb.alibi_slopes(n)
    assert slopes.shape == (n,) and slopes.dtype == torch.float32
    torch.testing.assert_close(slopes, torch.tensor(_reference_slopes(n)))
    if n == 8:
        assert slopes.tolist() == [2.0**-k for k in range(1, 9)]


def test_alibi_bias_definition_and_shift_invariance():
    slopes = sb.alibi_slopes(4).double()
    bias = sb.alibi_bias(slopes, 5, 7)
    assert bias.shape == (4, 5, 7) and bias.dtype == torch.float64
    i, j = torch.arange(5)[:, None], torch.arange(7)
    torch.testing.assert_close(bias, -slopes[:, None, None] * (i - j).abs())
    # on causal rows, the reference's m * j differs by a constant per row:
    # the softmax cannot tell them apart
    scores = torch.randn(4, 5, 7, dtype=torch.float64)
    causal = sb.causal_mask(5, 7)
    a = sb.masked_softmax(scores + bias, causal)
    b = sb.masked_softmax(scores + slopes[:, None, None] * j, causal)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def test_alibi_errors():
    with pytest.raises(ValueError, match="n_heads must be >= 1"):
        sb.alibi_slopes(0)
    with pytest.raises(TypeError, match="slopes must be a floating-point"):
        sb.alibi_bias(torch.tensor([1, 2]), 3)
    with pytest.raises(ValueError, match="slopes must be 1-D"):
        sb.alibi_bias(torch.ones(2, 2), 3)


# --- document_positions -------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=6))
def test_document_positions_restart_at_every_document(lengths):
    # Hugging Face's culen2pos: one arange per document, concatenated
    ids = sb.document_ids(lengths)
    positions = sb.document_positions(ids)
    expected = torch.cat([torch.arange(n) for n in lengths])
    assert torch.equal(positions, expected)
    # and back: the restarts (positions == 0) are where the documents begin,
    # which is how transformers builds cu_seqlens from packed position ids
    starts = (positions == 0).nonzero().view(-1)
    bounds = torch.cat([starts, torch.tensor([len(ids)])])
    assert bounds.diff().tolist() == list(lengths)


def test_document_positions_batch_padding_and_empty():
    ids = torch.stack([sb.document_ids([2, 3], 7), sb.document_ids([7])])
    assert sb.document_positions(ids).tolist() == [
        [0, 1, 0, 1, 2, 0, 1],  # the padding run is numbered like a document
        list(range(7)),
    ]
    assert sb.document_positions(torch.zeros(2, 0, dtype=torch.long)).shape == (2, 0)
    assert sb.document_positions(torch.tensor([5])).tolist() == [0]
    assert sb.document_positions(torch.tensor([1, 1], dtype=torch.int32)).dtype == (
        torch.long
    )


def test_document_positions_errors():
    with pytest.raises(TypeError, match="ids must be an integer"):
        sb.document_positions(torch.zeros(3))
    with pytest.raises(TypeError, match="ids must be an integer"):
        sb.document_positions(torch.zeros(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="at least one dimension"):
        sb.document_positions(torch.tensor(1))
    with pytest.raises(TypeError, match=r"ids must be a torch\.Tensor"):
        sb.document_positions([0, 0, 1])


# --- chunked_mask -------------------------------------------------------------------


def _meta_chunked_mask(seq_len: int, chunk: int) -> torch.Tensor:
    # Meta's create_chunked_attention_mask (llama-models, models/llama4/model.py)
    block_pos = torch.abs(
        (torch.arange(seq_len).unsqueeze(0) // chunk)
        - (torch.arange(seq_len).unsqueeze(1) // chunk)
    )
    token_pos = torch.arange(seq_len).unsqueeze(0) - torch.arange(seq_len).unsqueeze(1)
    return (block_pos == 0) & (token_pos <= 0)


@pytest.mark.parametrize("L", [1, 5, 12, 17])
@pytest.mark.parametrize("chunk", [1, 3, 4, 20])
def test_chunked_mask_matches_llama4_reference(L, chunk):
    mask = sb.chunked_mask(L, chunk=chunk)
    assert torch.equal(mask, _meta_chunked_mask(L, chunk))
    assert mask.sum(-1).tolist() == [i % chunk + 1 for i in range(L)]
    # a causal document mask whose documents are the chunks
    assert torch.equal(mask, sb.document_mask(torch.arange(L) // chunk, causal=True))
    two_sided = sb.chunked_mask(L, chunk=chunk, causal=False)
    assert torch.equal(two_sided & sb.causal_mask(L), mask)


def test_chunked_mask_limits_rectangular_and_attention():
    assert torch.equal(sb.chunked_mask(6, chunk=6), sb.causal_mask(6))
    assert torch.equal(sb.chunked_mask(6, chunk=1), torch.eye(6, dtype=torch.bool))
    assert sb.chunked_mask(4, 6, chunk=8, causal=False).all()
    i, j = torch.arange(5)[:, None], torch.arange(9)
    assert torch.equal(sb.chunked_mask(5, 9, chunk=3), (i // 3 == j // 3) & (j <= i))
    # chunked attention equals attention within each chunk alone
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(10, 4, generator=g, dtype=torch.float64) for _ in "qkv")
    out = sb.scaled_dot_product_attention(
        q, k, v, mask=sb.chunked_mask(10, chunk=4), explicit=True
    )
    for start in range(0, 10, 4):
        part = slice(start, start + 4)
        alone = F.scaled_dot_product_attention(
            q[part], k[part], v[part], is_causal=True
        )
        torch.testing.assert_close(out[part], alone, rtol=1e-12, atol=1e-12)


def test_chunked_mask_errors():
    with pytest.raises(ValueError, match="chunk"):
        sb.chunked_mask(4, chunk=0)
    with pytest.raises(TypeError, match="chunk"):
        sb.chunked_mask(4, chunk=2.0)
    with pytest.raises(TypeError, match="causal"):
        sb.chunked_mask(4, chunk=2, causal=None)
    with pytest.raises(ValueError, match="L"):
        sb.chunked_mask(0, chunk=2)
    with pytest.raises(TypeError, match="S"):
        sb.chunked_mask(3, "4", chunk=2)
