"""Every attention entry point takes the same vocabulary (issue 21, item 2).

Each entry point (scaled_dot_product_attention on both paths, flash_attention,
flex_attention, split_k_attention, differential_attention, selective_attention,
max_attention_logits, ring attention) is called with each form of each option:
``is_causal`` as False/True/"top_left"/"bottom_right", a boolean mask, a float
additive mask with ``-inf`` entries (a fully masked row included), ``scale``,
``sinks``, ``enable_gqa``. Its result is checked against a reference that does not
go through the library's argument resolver: torch's own
``scaled_dot_product_attention`` (with the bottom-right causal mask and the sink
column written out by hand), so a resolver that mishandles a form fails here. An
option an entry point cannot honour must raise a ValueError naming it.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import softmaxbook as sb

B, H, HKV, L, S, D, DV = 2, 4, 2, 5, 7, 8, 6
NEG_INF = float("-inf")


def _masks():
    g = torch.Generator().manual_seed(21)
    # (B, 1, S, S): a call with L queries takes the first L rows
    keep = torch.rand(B, 1, S, S, generator=g) > 0.4
    keep[0, 0, 1] = False  # a query with nothing to attend: zeros
    keep[:, :, 0, 0] = True
    bias = torch.randn(B, 1, S, S, generator=g, dtype=torch.float64)
    bias = bias.masked_fill(torch.rand(B, 1, S, S, generator=g) > 0.6, NEG_INF)
    bias[1, 0, 2] = NEG_INF  # a fully removed row: zeros, as torch gives
    return keep, bias


KEEP, BIAS = _masks()
SINKS = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.float64)

#: name -> keyword arguments in the library's vocabulary (tensors made per dtype).
FORMS = {
    "plain": {},
    "is_causal=False": {"is_causal": False},
    "is_causal=True": {"is_causal": True},
    "top_left": {"is_causal": "top_left"},
    "bottom_right": {"is_causal": "bottom_right"},
    "bool_mask": {"mask": KEEP},
    "float_mask": {"mask": BIAS},
    "scale": {"scale": 0.3},
    "sinks": {"sinks": SINKS},
    "enable_gqa": {"enable_gqa": True},
}


def _inputs(form, dtype=torch.float64, L=L, S=S):
    g = torch.Generator().manual_seed(hash(form) % 2**31)
    heads_kv = HKV if form == "enable_gqa" else H
    q = torch.randn(B, H, L, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, heads_kv, S, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, heads_kv, S, DV, generator=g, dtype=torch.float64)
    kwargs = {
        name: value.to(dtype) if isinstance(value, torch.Tensor) and name != "mask"
        else value
        for name, value in FORMS[form].items()
    }  # fmt: skip
    if "mask" in kwargs:
        mask = kwargs["mask"][..., :L, :S]
        kwargs["mask"] = mask.to(dtype) if mask.is_floating_point() else mask
    return q.to(dtype), k.to(dtype), v.to(dtype), kwargs


def _torch_terms(q, k, v, kwargs):
    """The form in torch's terms: (attn_mask, is_causal, scale, enable_gqa, sinks)."""
    L, S = q.shape[-2], k.shape[-2]
    mask, causal = kwargs.get("mask"), kwargs.get("is_causal", False)
    if causal == "bottom_right":  # torch's is_causal is top-left only
        mask, causal = torch.ones(L, S, dtype=torch.bool).tril(S - L), False
    return mask, causal in (True, "top_left"), kwargs.get("scale"), kwargs


def reference(q, k, v, kwargs):
    """torch's scaled_dot_product_attention for the form (sinks written out)."""
    mask, causal, scale, _ = _torch_terms(q, k, v, kwargs)
    gqa = kwargs.get("enable_gqa", False)
    sinks = kwargs.get("sinks")
    if sinks is None:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa
        )
    # A sink is one more key with logit b and value 0: softmax over [scores, b].
    scores = q @ k.mT * (scale or D**-0.5)
    if causal:
        scores = scores.masked_fill(~torch.ones(L, S).tril().bool(), NEG_INF)
    column = sinks.view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    weights = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
    return weights @ v


def reference_logits(q, k, kwargs):
    """The largest logit per head, written out."""
    mask, causal, scale, _ = _torch_terms(q, k, k, kwargs)
    if kwargs.get("enable_gqa"):
        k = k.repeat_interleave(H // k.shape[-3], dim=-3)
    scores = q @ k.mT * (scale or D**-0.5)
    if causal:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, NEG_INF)
    elif mask is not None:
        scores = scores + mask
    return scores.movedim(-3, 0).flatten(1).amax(1)


def _close(actual, expected, dtype):
    tol = {"atol": 1e-10, "rtol": 1e-8} if dtype == torch.float64 else {}
    torch.testing.assert_close(actual, expected, **tol)


# --------------------------------------------------------------- the entry points

ENTRY_POINTS = {
    "sdpa_fused": lambda q, k, v, **kw: sb.scaled_dot_product_attention(q, k, v, **kw),
    "sdpa_explicit": lambda q, k, v, **kw: sb.scaled_dot_product_attention(
        q, k, v, explicit=True, **kw
    ),
    "flash": lambda q, k, v, **kw: sb.flash_attention(q, k, v, **kw),
    "flex": lambda q, k, v, **kw: sb.flex_attention(q, k, v, **kw),
    "split_k": lambda q, k, v, **kw: sb.split_k_attention(q, k, v, splits=3, **kw),
    # lam = 0: the difference of maps is the first map
    "differential": lambda q, k, v, **kw: sb.differential_attention(
        q, k, -q, k, v, lam=0.0, **kw
    ),
}

#: Options an entry point rejects (ValueError naming them).
UNSUPPORTED = {"differential": {"sinks"}}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_each_entry_point_takes_each_form(entry, form, dtype):
    q, k, v, kwargs = _inputs(form, dtype)
    call = ENTRY_POINTS[entry]
    if form in UNSUPPORTED.get(entry, ()):
        with pytest.raises(ValueError, match="does not support sinks"):
            call(q, k, v, **kwargs)
        return
    _close(call(q, k, v, **kwargs), reference(q, k, v, kwargs), dtype)


@pytest.mark.parametrize("entry", ["sdpa_fused", "sdpa_explicit", "flash"])
@pytest.mark.parametrize("form", ["bool_mask", "float_mask"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_torch_keyword_names_give_torch_result(entry, form, dtype):
    """attn_mask=, dropout_p=0 and is_causal= spelled as torch spells them."""
    q, k, v, kwargs = _inputs(form, dtype)
    mask = kwargs["mask"]
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0)
    out = ENTRY_POINTS[entry](q, k, v, attn_mask=mask, dropout_p=0.0)
    _close(out, expected, dtype)


def test_sdpa_takes_torch_positional_arguments():
    q, k, v, kwargs = _inputs("float_mask", torch.float32)
    mask = kwargs["mask"]
    torch.manual_seed(3)
    expected = F.scaled_dot_product_attention(q, k, v, mask, 0.2, False, scale=0.5)
    torch.manual_seed(3)
    out = sb.scaled_dot_product_attention(q, k, v, mask, 0.2, False, scale=0.5)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("explicit", [False, True])
@pytest.mark.parametrize(
    "form", ["plain", "is_causal=True", "float_mask", "enable_gqa"]
)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_dropout_drops_the_weights_torch_drops(explicit, form, dtype):
    """With the same random state, the same weights are dropped as in torch's
    function (its math path: torch.dropout on the weights), on both paths."""
    q, k, v, kwargs = _inputs(form, dtype)
    mask, causal, _, _ = _torch_terms(q, k, v, kwargs)
    gqa = kwargs.get("enable_gqa", False)
    torch.manual_seed(7)
    expected = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=0.3, is_causal=causal, enable_gqa=gqa
    )
    torch.manual_seed(7)
    out = sb.scaled_dot_product_attention(
        q, k, v, dropout_p=0.3, explicit=explicit, **kwargs
    )
    _close(out, expected, dtype)
    assert not torch.allclose(out, reference(q, k, v, kwargs))  # something dropped


def test_flash_dropout_drops_the_weights_torch_drops():
    q, k, v, kwargs = _inputs("float_mask", torch.float64)
    torch.manual_seed(11)
    expected = F.scaled_dot_product_attention(
        q, k, v, attn_mask=kwargs["mask"], dropout_p=0.25
    )
    torch.manual_seed(11)
    out = sb.flash_attention(q, k, v, attn_mask=kwargs["mask"], dropout_p=0.25)
    _close(out, expected, torch.float64)


@pytest.mark.parametrize(
    "entry",
    [
        lambda q, k, v, **kw: sb.flex_attention(q, k, v, **kw),
        lambda q, k, v, **kw: sb.split_k_attention(q, k, v, splits=2, **kw),
        lambda q, k, v, **kw: sb.differential_attention(q, k, q, k, v, **kw),
        lambda q, k, v, **kw: sb.selective_attention(q, k, v, **kw),
        lambda q, k, v, **kw: sb.max_attention_logits(q, k, **kw),
        lambda q, k, v, **kw: sb.ring_attention(q, k, v, **kw),
    ],
    ids=["flex", "split_k", "differential", "selective", "max_logits", "ring"],
)
def test_dropout_is_refused_by_name_where_it_is_not_applied(entry):
    q, k, v, _ = _inputs("plain", L=S)
    with pytest.raises(ValueError, match=re.escape("does not support dropout_p > 0")):
        entry(q, k, v, dropout_p=0.1)


# --------------------------------------------------------- max_attention_logits


@pytest.mark.parametrize("form", FORMS)
def test_max_attention_logits_takes_each_form(form):
    q, k, _, kwargs = _inputs(form)
    if form == "sinks":  # a sink logit changes no logit of the keys
        with pytest.raises(ValueError, match="does not support sinks"):
            sb.max_attention_logits(q, k, **kwargs)
        return
    out = sb.max_attention_logits(q, k, **kwargs)
    _close(out, reference_logits(q, k, kwargs), torch.float64)


# ------------------------------------------------------------ selective attention


@pytest.mark.parametrize(
    "form",
    ["plain", "is_causal=True", "top_left", "bottom_right", "scale", "enable_gqa"],
)
def test_selective_attention_takes_the_causal_forms(form):
    # With a selecting head whose queries are zero, no key is ever selected:
    # selective attention is plain causal attention (its causal mask is built in).
    q, k, v, kwargs = _inputs(form, L=S)
    q[:, 0] = 0.0
    kwargs.setdefault("is_causal", True)
    out = sb.selective_attention(q, k, v, **kwargs)
    expected = reference(q, k, v, {**kwargs, "is_causal": True})
    _close(out, expected, torch.float64)


@pytest.mark.parametrize(
    ("form", "message"),
    [
        ("is_causal=False", "is causal self-attention"),
        ("bool_mask", "does not support a mask"),
        ("float_mask", "does not support a mask"),
        ("sinks", "does not support sinks"),
    ],
)
def test_selective_attention_names_what_it_cannot_honour(form, message):
    q, k, v, kwargs = _inputs(form, L=S)
    with pytest.raises(ValueError, match=message):
        sb.selective_attention(q, k, v, **kwargs)


# ------------------------------------------------------------------ ring attention


def test_ring_attention_names_what_it_cannot_honour():
    for form, option in [
        ("bool_mask", "a mask"),
        ("float_mask", "a mask"),
        ("sinks", "sinks"),
        ("enable_gqa", "enable_gqa"),
    ]:
        q, k, v, kwargs = _inputs(form, L=S)
        with pytest.raises(
            ValueError, match=f"ring_attention does not support {option}"
        ):
            sb.ring_attention(q, k, v, **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("is_causal", [False, True, "top_left", "bottom_right"])
def test_ring_attention_takes_each_causal_form(is_causal):
    q, k, v, _ = _inputs("plain", L=8, S=8)
    run = sb.run_ring_attention(
        q, k, v, world_size=2, is_causal=is_causal, scale=0.3, timeout=240.0
    )
    expected = reference(q, k, v, {"is_causal": is_causal, "scale": 0.3})
    _close(run.out, expected, torch.float64)
