"""Tests of softmaxbook.device: get_device and the dispatch report explain_dispatch."""

from __future__ import annotations

import pytest
import torch

import softmaxbook as sb
from softmaxbook import device as dev

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


@no_cuda
def test_default_device_is_cpu_without_a_gpu(monkeypatch):
    monkeypatch.delenv(sb.DEVICE_ENV_VAR, raising=False)
    monkeypatch.setattr(dev, "_mps_available", lambda: False)
    assert sb.get_device() == torch.device("cpu")


def test_default_order_prefers_cuda_then_mps(monkeypatch):
    monkeypatch.delenv(sb.DEVICE_ENV_VAR, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(dev, "_mps_available", lambda: True)
    assert sb.get_device() == torch.device("mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert sb.get_device() == torch.device("cuda")


def test_environment_variable_overrides(monkeypatch):
    monkeypatch.setenv(sb.DEVICE_ENV_VAR, "cpu")
    assert sb.get_device() == torch.device("cpu")
    monkeypatch.setenv(sb.DEVICE_ENV_VAR, "  cpu  ")
    assert sb.get_device() == torch.device("cpu")
    monkeypatch.setenv(sb.DEVICE_ENV_VAR, "")  # empty means unset
    assert sb.get_device().type in {"cpu", "cuda", "mps"}


def test_prefer_argument_wins_over_environment(monkeypatch):
    monkeypatch.setenv(sb.DEVICE_ENV_VAR, "definitely-not-a-device")
    assert sb.get_device("cpu") == torch.device("cpu")
    assert sb.get_device(torch.device("cpu")) == torch.device("cpu")


@no_cuda
@pytest.mark.parametrize("name", ["cuda", "cuda:0"])
def test_unavailable_cuda_is_a_clear_error(monkeypatch, name):
    monkeypatch.setenv(sb.DEVICE_ENV_VAR, name)
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        sb.get_device()


def test_cuda_index_beyond_device_count(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv(sb.DEVICE_ENV_VAR, "cuda:3")
    with pytest.raises(RuntimeError, match="only 1 CUDA device"):
        sb.get_device()


def test_unavailable_mps_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(dev, "_mps_available", lambda: False)
    monkeypatch.setenv(sb.DEVICE_ENV_VAR, "mps")
    with pytest.raises(RuntimeError, match="MPS is not available"):
        sb.get_device()


@pytest.mark.parametrize("name", ["gpu", "cuda:x", "tpu!"])
def test_bogus_names_are_a_clear_error(monkeypatch, name):
    monkeypatch.setenv(sb.DEVICE_ENV_VAR, name)
    with pytest.raises(ValueError, match="is not a device"):
        sb.get_device()


def test_known_but_unsupported_device_type(monkeypatch):
    monkeypatch.setenv(sb.DEVICE_ENV_VAR, "meta")
    with pytest.raises(ValueError, match="is not supported"):
        sb.get_device()


# ---------------------------------------------------------------- explain_dispatch


def test_cpu_tensors_take_the_torch_path():
    x = torch.randn(2, 3)
    decision = sb.explain_dispatch("softmax", x)
    assert decision == sb.DispatchDecision("softmax", "torch", decision.reason)
    assert "CUDA devices only" in decision.reason and "on cpu" in decision.reason
    assert str(decision).startswith("softmax -> torch: ")
    q = torch.randn(1, 4, 8)
    assert sb.explain_dispatch("flash_attention", q, q, q).path == "torch"


def _facts(**overrides):
    facts = dict(
        device_types={"cuda"},
        dtypes={torch.float16},
        needs_grad=False,
        width=64,
        have_triton=True,
    )
    facts.update(overrides)
    return facts


@pytest.mark.parametrize("op", ["softmax", "flash_attention"])
def test_decision_rule_takes_triton_on_cuda(op):
    assert dev._decide(op, **_facts()).path == "triton"


@pytest.mark.parametrize(
    "overrides,reason",
    [
        (dict(device_types={"cuda", "cpu"}), "CUDA devices only"),
        (dict(have_triton=False), "Triton is not installed"),
        (dict(dtypes={torch.float64}), "not torch.float64"),
        (dict(dtypes={torch.float16, torch.float32}), "different dtypes"),
        (dict(needs_grad=True), "forward pass only"),
    ],
)
def test_decision_rule_falls_back_with_a_reason(overrides, reason):
    decision = dev._decide("flash_attention", **_facts(**overrides))
    assert decision.path == "torch" and reason in decision.reason


def test_decision_rule_shape_limits():
    wide = dev._decide("softmax", **_facts(width=dev.SOFTMAX_KERNEL_MAX_COLS + 1))
    assert wide.path == "torch" and "exceed" in wide.reason
    deep = dev._decide("flash_attention", **_facts(width=512))
    assert deep.path == "torch" and "head dimension 512" in deep.reason


def test_explain_dispatch_sees_autograd_and_triton(monkeypatch):
    x = torch.randn(3, requires_grad=True)
    monkeypatch.setattr(dev, "_decide", lambda op, **facts: facts)
    assert sb.explain_dispatch("softmax", x)["needs_grad"] is True
    with torch.no_grad():
        assert sb.explain_dispatch("softmax", x)["needs_grad"] is False
    monkeypatch.setattr(dev.importlib.util, "find_spec", lambda name: None)
    assert sb.explain_dispatch("softmax", x)["have_triton"] is False
    assert sb.triton_available() is False


def test_explain_dispatch_bad_input():
    with pytest.raises(ValueError, match="op='matmul' is unknown"):
        sb.explain_dispatch("matmul", torch.ones(2))
    with pytest.raises(ValueError, match="needs the tensors"):
        sb.explain_dispatch("softmax")
    with pytest.raises(TypeError, match="argument 1 must be a torch.Tensor"):
        sb.explain_dispatch("softmax", [1.0, 2.0])
