"""Tests of softmaxbook.device: get_device, its order and its overrides."""

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
    monkeypatch.setenv(sb.DEVICE_ENV_VAR, "")  # empty means unset: the default order
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(dev, "_mps_available", lambda: True)
    assert sb.get_device() == torch.device("mps")


def test_device_module_keeps_the_dispatch_names():
    # explain_dispatch and friends moved to softmaxbook.kernels.dispatch; the old
    # import path softmaxbook.device.<name> keeps working.
    for name in ("explain_dispatch", "DispatchDecision", "triton_available"):
        assert getattr(dev, name) is getattr(sb.kernels, name) is getattr(sb, name)


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
