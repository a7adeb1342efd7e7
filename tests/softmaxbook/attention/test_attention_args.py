"""Tests of softmaxbook.attention._args: the one argument resolver of every attention
entry point."""

from __future__ import annotations

import math
import re

import pytest
import torch

from softmaxbook.attention._args import ATTENTION_OPTIONS, resolve_attention

NEG_INF = float("-inf")


def _qkv(*batch, L=5, S=6, D=16, Dv=3):
    return (
        torch.randn(*batch, L, D),
        torch.randn(*batch, S, D),
        torch.randn(*batch, S, Dv),
    )


def test_defaults():
    q, k, v = _qkv(2, 3)
    args = resolve_attention(q, k, v)
    assert tuple(args.batch) == (2, 3) and (args.L, args.S) == (5, 6)
    assert args.scale == 0.25 and args.causal is None and args.mask is None
    assert args.sinks is None and args.groups == 1 and args.dropout_p == 0.0
    assert args.keep is None and args.bias is None


@pytest.mark.parametrize(
    ("is_causal", "L", "S", "expected"),
    [
        (False, 5, 6, None),
        (True, 5, 6, "top_left"),
        ("top_left", 5, 6, "top_left"),
        ("bottom_right", 5, 6, "bottom_right"),
        ("bottom_right", 6, 6, "top_left"),  # the same mask when L == S: one name
    ],
)
def test_is_causal_forms_are_normalized(is_causal, L, S, expected):
    q, k, v = _qkv(2, L=L, S=S)
    args = resolve_attention(q, k, v, is_causal=is_causal)
    assert args.causal == expected
    if expected is not None:
        offset = 0 if expected == "top_left" else S - L
        reference = torch.ones(L, S, dtype=torch.bool).tril(offset)
        assert torch.equal(args.causal_mask(), reference)


def test_is_causal_rejects_unknown_values():
    q, k, v = _qkv(2)
    with pytest.raises(ValueError, match="is_causal='top_right' is unknown"):
        resolve_attention(q, k, v, is_causal="top_right")
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        resolve_attention(q, k, v, is_causal=1)


def test_bool_and_float_masks():
    q, k, v = _qkv(2)
    keep = torch.rand(5, 6) > 0.3
    args = resolve_attention(q, k, v, mask=keep)
    assert args.keep is keep and args.bias is None and not args.additive
    bias = torch.randn(2, 1, 6)
    args = resolve_attention(q, k, v, attn_mask=bias)
    assert args.bias is bias and args.keep is None and args.additive


def test_masked_scores_follow_torch():
    q, k, v = _qkv(2)
    scores = torch.randn(2, 5, 6)
    bias = torch.randn(5, 6).masked_fill(torch.rand(5, 6) > 0.5, NEG_INF)
    args = resolve_attention(q, k, v, attn_mask=bias)
    torch.testing.assert_close(args.masked_scores(scores), scores + bias)
    keep = bias > 0
    args = resolve_attention(q, k, v, mask=keep)
    expected = scores.masked_fill(~keep, NEG_INF)
    torch.testing.assert_close(args.masked_scores(scores), expected)
    args = resolve_attention(q, k, v, is_causal="bottom_right")
    expected = scores.masked_fill(~torch.ones(5, 6, dtype=torch.bool).tril(1), NEG_INF)
    torch.testing.assert_close(args.masked_scores(scores), expected)


def test_mask_errors_name_the_argument():
    q, k, v = _qkv(2)
    keep = torch.ones(5, 6, dtype=torch.bool)
    with pytest.raises(TypeError, match="got both mask= and attn_mask="):
        resolve_attention(q, k, v, mask=keep, attn_mask=keep)
    with pytest.raises(ValueError, match="not both"):
        resolve_attention(q, k, v, mask=keep, is_causal=True)
    with pytest.raises(TypeError, match=r"for a 0/1 mask use \.bool\(\)"):
        resolve_attention(q, k, v, mask=torch.ones(5, 6, dtype=torch.long))
    with pytest.raises(TypeError, match=r"mask\.to"):
        resolve_attention(q, k, v, mask=torch.zeros(5, 6, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"mask must be a torch\.Tensor"):
        resolve_attention(q, k, v, mask=[[True]])
    with pytest.raises(ValueError, match="does not broadcast to the scores' shape"):
        resolve_attention(q, k, v, mask=torch.ones(7, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask is on meta"):
        resolve_attention(q, k, v, mask=torch.ones(6, dtype=torch.bool, device="meta"))


def test_scale():
    q, k, v = _qkv(2, D=9)
    assert resolve_attention(q, k, v).scale == pytest.approx(1 / 3)
    assert resolve_attention(q, k, v, scale=2).scale == 2.0
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="scale must be a finite number > 0"):
            resolve_attention(q, k, v, scale=bad)
    with pytest.raises(TypeError, match="scale must be a real number"):
        resolve_attention(q, k, v, scale="1")


def test_sinks():
    q, k, v = _qkv(2, 3)
    sinks = torch.zeros(3)
    assert resolve_attention(q, k, v, sinks=sinks).sinks is sinks
    with pytest.raises(ValueError, match="sinks of shape"):
        resolve_attention(q, k, v, sinks=torch.zeros(4))
    with pytest.raises(TypeError, match="sinks must be a floating-point tensor"):
        resolve_attention(q, k, v, sinks=torch.zeros(3, dtype=torch.long))


def test_enable_gqa():
    q = torch.randn(2, 6, 5, 8)
    kv = torch.randn(2, 2, 7, 8)
    args = resolve_attention(q, kv, kv, enable_gqa=True)
    assert args.groups == 3 and tuple(args.batch) == (2, 6)
    resolve_attention(q, kv, kv, enable_gqa=True, mask=torch.ones(6, 5, 7) > 0)
    with pytest.raises(ValueError, match="batch dimensions"):
        resolve_attention(q, kv, kv)  # 2 key heads do not broadcast to 6
    with pytest.raises(ValueError, match="dividing"):
        resolve_attention(q, torch.randn(2, 4, 7, 8), torch.randn(2, 4, 7, 8),
                          enable_gqa=True)  # fmt: skip
    with pytest.raises(TypeError, match="enable_gqa must be a bool"):
        resolve_attention(q, q, q, enable_gqa=1)


def test_dropout_p():
    q, k, v = _qkv(2)
    assert resolve_attention(q, k, v, dropout_p=0.25).dropout_p == 0.25
    for bad in (1.0, -0.1, math.nan):
        with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\)"):
            resolve_attention(q, k, v, dropout_p=bad)
    with pytest.raises(TypeError, match="dropout_p must be a real number"):
        resolve_attention(q, k, v, dropout_p=True)


def test_qkv_messages_are_kept():
    q, k, v = _qkv(2)
    with pytest.raises(TypeError, match="q must be a floating-point tensor"):
        resolve_attention(q.long(), k, v)
    with pytest.raises(TypeError, match="share a dtype"):
        resolve_attention(q, k, v.double())
    with pytest.raises(ValueError, match="same last dimension D"):
        resolve_attention(q, k[..., :3], v)
    with pytest.raises(ValueError, match="same length S"):
        resolve_attention(q, k, v[..., :2, :])


@pytest.mark.parametrize(
    ("option", "kwargs"),
    [
        ("mask", {"mask": torch.ones(5, 6, dtype=torch.bool)}),
        ("float_mask", {"mask": torch.zeros(5, 6)}),
        ("is_causal", {"is_causal": True}),
        ("bottom_right", {"is_causal": "bottom_right"}),
        ("sinks", {"sinks": torch.zeros(2)}),
        ("dropout_p", {"dropout_p": 0.1}),
    ],
)
def test_unsupported_options_are_named(option, kwargs):
    q, k, v = _qkv(2)
    resolve_attention(q, k, v, caller="f", unsupported=[o for o in ATTENTION_OPTIONS
                                                        if o != option])  # fmt: skip
    with pytest.raises(
        ValueError, match=re.escape(f"f does not support {ATTENTION_OPTIONS[option]}")
    ):
        resolve_attention(q, k, v, caller="f", unsupported=[option], **kwargs)


def test_the_resolver_is_cheap():
    """A few microseconds, nothing allocated: no tensor is created or read."""
    q = torch.randn(2, 4, 8, 16)
    mask = torch.zeros(8, 8)
    before = torch.randn(1)  # noqa: F841  (warm the allocator)
    args = resolve_attention(q, q, q, attn_mask=mask, dropout_p=0.1)
    assert args.mask is mask  # not expanded, not copied
