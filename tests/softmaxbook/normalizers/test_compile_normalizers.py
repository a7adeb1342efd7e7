"""Every normalizer works under ``torch.compile(fullgraph=True)`` and gives its
eager result, forward and backward.

Parametrized over the registry, so a new normalizer is compiled as soon as it
is registered. The rows are 300 keys long, past the length (128) where
sparsemax and 1.5-entmax switch from a full sort to their candidate search
(whose sizes depend on the data): compiled, they sort in full, and the weights
and gradients must still be the eager ones. Each row holds removed keys
(``-inf``) and one row holds nothing but removed keys, so the branches that
keep those at zero (``torch.where``, never a Python ``if`` on a value) are
traced too.

``aot_eager`` (dynamo's graph, AOTAutograd's forward and backward graphs, run by
eager kernels) runs for every normalizer; ``inductor`` (generated C++ kernels)
for softmax by default and for every normalizer in the slow set: its C++
compilation takes 10 to 60 s per normalizer on two cores.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch._dynamo

from softmaxbook.normalizers import all_normalizers

INFOS = {info.name: info for info in all_normalizers()}
NAMES = list(INFOS)
# Options other than the defaults, so they are traced too; entmax_bisect's
# bisection is unrolled by the compiler, 20 steps rather than 50 keep it fast.
OPTIONS = {
    "sink_softmax": {"sinks": 0.5},
    "entmax_bisect": {"alpha": 1.3, "n_iter": 20},
}
# float32 kernels may associate a sum differently once compiled (inductor
# fuses); the weights and gradients are O(1).
TOL = {"atol": 2e-6, "rtol": 2e-5}


def _scores() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 300, generator=g)
    x[..., ::7] = float("-inf")  # removed keys
    x[1, 2] = float("-inf")  # a row with nothing to attend
    return x


def _compare(name: str, backend: str, dim: int = -1) -> None:
    torch._dynamo.reset()
    f = functools.partial(INFOS[name].function, dim=dim, **OPTIONS.get(name, {}))
    x = _scores().movedim(-1, dim).contiguous()
    grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))

    def weights_and_grad(fn):
        xr = x.clone().requires_grad_(True)
        y = fn(xr)
        (gx,) = torch.autograd.grad(y, xr, grad)
        return y.detach(), gx

    eager = weights_and_grad(f)
    compiled = weights_and_grad(torch.compile(f, fullgraph=True, backend=backend))
    torch.testing.assert_close(compiled[0], eager[0], **TOL, equal_nan=True)
    torch.testing.assert_close(compiled[1], eager[1], **TOL, equal_nan=True)
    torch._dynamo.reset()


@pytest.mark.parametrize("name", NAMES)
def test_every_normalizer_compiles_with_aot_eager(name):
    _compare(name, "aot_eager")


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
def test_sparse_maps_compile_along_another_dim(name):
    _compare(name, "aot_eager", dim=1)


def test_softmax_compiles_with_inductor():
    _compare("softmax", "inductor")


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in NAMES if n != "softmax"])
def test_every_normalizer_compiles_with_inductor(name):
    _compare(name, "inductor")
