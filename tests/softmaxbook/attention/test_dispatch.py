"""Tests of softmaxbook.kernels.dispatch: which code path a call takes, and why.

The rule reads plain facts (device types, dtypes, gradient, widths), so it is
tested here without a GPU and without Triton.
"""

from __future__ import annotations

import pytest
import torch

import softmaxbook as sb
from softmaxbook.kernels import dispatch


def test_cpu_tensors_take_the_torch_path():
    x = torch.randn(2, 3)
    decision = sb.explain_dispatch("softmax", x)
    assert decision == sb.DispatchDecision("softmax", "explicit", decision.reason)
    assert "CUDA devices only" in decision.reason and "on cpu" in decision.reason
    assert str(decision).startswith("softmax -> explicit: ")
    q = torch.randn(1, 4, 8)
    # The kernels' rule: no Triton on the CPU (flash_attention then picks among
    # its CPU paths, see test_flash)
    assert dispatch.kernel_decision("flash_attention", q, q, q).path == "tiles"
    assert sb.explain_dispatch("flash_attention", q, q, q).path != "triton"


def _facts(**overrides):
    facts = {
        "device_types": {"cuda"},
        "dtypes": {torch.float16},
        "needs_grad": False,
        "width": 64,
        "have_triton": True,
        "interpreter": False,
    }
    facts.update(overrides)
    return facts


@pytest.mark.parametrize("op", ["softmax", "flash_attention"])
def test_decision_rule_takes_triton_on_cuda(op):
    assert dispatch._decide(op, **_facts()).path == "triton"


@pytest.mark.parametrize(
    "overrides,reason",
    [
        ({"device_types": {"cuda", "cpu"}}, "CUDA devices only"),
        ({"have_triton": False}, "Triton is not installed"),
        ({"dtypes": {torch.float64}}, "not torch.float64"),
        ({"dtypes": {torch.float16, torch.float32}}, "different dtypes"),
    ],
)
def test_decision_rule_falls_back_with_a_reason(overrides, reason):
    decision = dispatch._decide("flash_attention", **_facts(**overrides))
    assert decision.path == "tiles" and reason in decision.reason


def test_a_gradient_keeps_flash_attention_on_triton_but_not_softmax():
    # FlashAttention has backward kernels; the fused softmax kernel is forward-only.
    assert dispatch._decide("flash_attention", **_facts(needs_grad=True)).path == (
        "triton"
    )
    decision = dispatch._decide("softmax", **_facts(needs_grad=True))
    assert decision.path == "explicit" and "forward pass only" in decision.reason


def test_decision_rule_shape_limits():
    wide = dispatch._decide(
        "softmax", **_facts(width=dispatch.SOFTMAX_KERNEL_MAX_COLS + 1)
    )
    assert wide.path == "explicit" and "exceed" in wide.reason
    deep = dispatch._decide("flash_attention", **_facts(width=512))
    assert deep.path == "tiles" and "head dimension 512" in deep.reason


def test_explain_dispatch_sees_autograd_and_triton(monkeypatch):
    x = torch.randn(3, requires_grad=True)
    monkeypatch.setattr(dispatch, "_decide", lambda op, **facts: facts)
    assert sb.explain_dispatch("softmax", x)["needs_grad"] is True
    with torch.no_grad():
        assert sb.explain_dispatch("softmax", x)["needs_grad"] is False
    monkeypatch.setattr(dispatch.importlib.util, "find_spec", lambda name: None)
    assert sb.explain_dispatch("softmax", x)["have_triton"] is False
    assert sb.triton_available() is False


def test_explain_dispatch_bad_input():
    with pytest.raises(ValueError, match="op='matmul' is unknown"):
        sb.explain_dispatch("matmul", torch.ones(2))
    with pytest.raises(ValueError, match="needs the tensors"):
        sb.explain_dispatch("softmax")
    with pytest.raises(TypeError, match=r"argument 1 must be a torch.Tensor"):
        sb.explain_dispatch("softmax", [1.0, 2.0])


# ---------------------------------------------------------------- the fixed defects


def _captured_facts(monkeypatch):
    monkeypatch.setattr(dispatch, "_decide", lambda op, **facts: facts)


def test_the_value_head_size_counts_too(monkeypatch):
    # q and k have D = 64, v has Dv = 512: above the kernel's limit, so torch.
    _captured_facts(monkeypatch)
    q, v = torch.zeros(2, 8, 64), torch.zeros(2, 8, 512)
    assert dispatch.kernel_decision("flash_attention", q, q, v)["width"] == 512
    monkeypatch.undo()
    deep_v = dispatch._decide("flash_attention", **_facts(width=512))
    assert deep_v.path == "tiles" and "512" in deep_v.reason


def test_the_interpreter_keeps_cuda_tensors_on_torch(monkeypatch):
    # TRITON_INTERPRET=1 runs Triton on CPU tensors only: CUDA tensors go to torch.
    decision = dispatch._decide("flash_attention", **_facts(interpreter=True))
    assert decision.path == "tiles" and "TRITON_INTERPRET" in decision.reason
    _captured_facts(monkeypatch)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert sb.explain_dispatch("softmax", torch.zeros(3))["interpreter"] is True
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert sb.explain_dispatch("softmax", torch.zeros(3))["interpreter"] is False


# ------------------------------------ scaled_dot_product_attention: fused or explicit


def _sdpa_facts(**overrides):
    facts = {
        "explicit": False,
        "softmax": True,
        "sinks": False,
        "return_weights": False,
        "device_types": {"cpu"},
        "ndims": (4, 4, 4),
        "empty": False,
        "dtype": torch.float32,
        "transforms": False,
        "bounded": lambda: True,
    }
    facts.update(overrides)
    return facts


def test_sdpa_rule_takes_the_fused_kernel_where_the_semantics_agree():
    path, reason = dispatch.sdpa_decision(**_sdpa_facts())
    assert path == "torch-fused" and "torch's fused kernel" in reason


@pytest.mark.parametrize(
    "overrides, reason",
    [
        ({"explicit": True}, "explicit=True"),
        ({"softmax": False}, "normalizer"),
        ({"sinks": True}, "sink"),
        ({"return_weights": True}, "return_weights"),
        ({"device_types": {"cuda"}}, "on cuda"),
        ({"ndims": (3, 3, 3)}, "(B, H, L, D)"),
        ({"empty": True}, "empty"),
        ({"dtype": torch.int64}, "torch.int64"),
        ({"transforms": True}, "torch.func"),
        ({"bounded": lambda: False}, "nan or infinity"),
    ],
)
def test_sdpa_rule_keeps_the_explicit_path_with_a_reason(overrides, reason):
    path, why = dispatch.sdpa_decision(**_sdpa_facts(**overrides))
    assert path == "explicit" and reason in why


def test_sdpa_rule_reads_the_tensors_last():
    # The bound on the scores reads q and k: only when all else allows the kernel.
    def never():
        raise AssertionError("bounded() was called")

    assert dispatch.sdpa_decision(**_sdpa_facts(explicit=True, bounded=never))[0] == (
        "explicit"
    )


def test_explain_dispatch_for_attention_takes_the_call_options():
    q = torch.randn(1, 2, 3, 4)
    decision = sb.explain_dispatch("scaled_dot_product_attention", q, q, q)
    assert decision.path == "torch-fused"
    assert decision.op == "scaled_dot_product_attention"
    decision = sb.explain_dispatch(
        "scaled_dot_product_attention", q, q, q, is_causal=True, explicit=True
    )
    assert decision.path == "explicit"
    with pytest.raises(ValueError, match="needs the tensors q, k, v"):
        sb.explain_dispatch("scaled_dot_product_attention", q, q)
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        sb.explain_dispatch("scaled_dot_product_attention", q, q, q, causal=True)
    with pytest.raises(ValueError, match="scale must be a finite number > 0"):
        sb.explain_dispatch("scaled_dot_product_attention", q, q, q, scale=0.0)
    with pytest.raises(TypeError, match="takes no keyword arguments"):
        sb.explain_dispatch("softmax", q, is_causal=True)
    # torch's names, float masks and dropout are the call's options too
    bias = torch.zeros(3, 3)
    decision = sb.explain_dispatch(
        "scaled_dot_product_attention", q, q, q, attn_mask=bias, dropout_p=0.1
    )
    assert decision.path == "torch-fused"
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\)"):
        sb.explain_dispatch("scaled_dot_product_attention", q, q, q, dropout_p=1.0)
    with pytest.raises(TypeError, match="got both mask= and attn_mask="):
        sb.explain_dispatch(
            "scaled_dot_product_attention", q, q, q, mask=bias, attn_mask=bias
        )


def test_explain_dispatch_leaves_the_random_state_alone():
    q = torch.randn(1, 2, 3, 4)
    state = torch.get_rng_state()
    sb.explain_dispatch("scaled_dot_product_attention", q, q, q, dropout_p=0.5)
    assert torch.equal(torch.get_rng_state(), state)


def test_one_vocabulary_of_paths():
    # Every decision of every op names one of PATHS; the 0.2 names still compare
    # equal until 0.4 (the deprecation table), and print as the new ones.
    q = torch.randn(2, 4, 8, 16)
    seen = {
        sb.explain_dispatch("softmax", q).path,
        sb.explain_dispatch("scaled_dot_product_attention", q, q, q).path,
        sb.explain_dispatch("flash_attention", q, q, q).path,
        sb.explain_dispatch("flash_attention", q, q, q, explicit=True).path,
        sb.explain_dispatch("flash_attention", q, q, q, dropout_p=0.5).path,
        sb.explain_dispatch(
            "scaled_dot_product_attention", q, q, q, return_weights=True
        ).path,
    }
    assert seen == {"explicit", "torch-fused", "tiles"} and seen <= set(dispatch.PATHS)
    fused = sb.explain_dispatch("flash_attention", q, q, q).path
    assert fused == "fused" and fused != "torch" and str(fused) == "torch-fused"
    assert sb.explain_dispatch("softmax", q).path == "torch"
    with pytest.raises(ValueError, match="not one of"):
        sb.DispatchDecision("softmax", "fused", "an old name")
