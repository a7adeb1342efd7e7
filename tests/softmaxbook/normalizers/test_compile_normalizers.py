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

One function runs every normalizer, and each backend compiles it once (one
dynamo trace, one forward and one backward graph, one inductor lowering)
rather than once per normalizer. The rows share no tensor, so
each normalizer's weights and gradient are those it would have compiled
alone; each is compared with its own eager call and a mismatch names the
normalizer. If the combined function does not compile (a graph break fails
``fullgraph=True``), each is compiled alone to name the ones that fail.
``aot_eager`` (dynamo's graph, AOTAutograd's forward and backward graphs, run
by eager kernels) also runs sparsemax and 1.5-entmax along another dim;
``inductor`` (generated C++ kernels) runs every normalizer along the last.
``COMPILE_CASES=sparsemax,softmax`` runs only the named normalizers.
"""

from __future__ import annotations

import functools

import torch

from compile_all import compile_together, selected
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


def _compare(cases: list[tuple[str, int]], backend: str) -> None:
    """One compiled function runs every (normalizer, dim) case: one trace, one
    forward and one backward graph, one compilation, rather than one per case.
    The cases share no tensor, so each case's weights and gradient are those
    of the case compiled alone; each is checked against its own eager call,
    and a failure names the case."""
    fns = [
        functools.partial(INFOS[name].function, dim=dim, **OPTIONS.get(name, {}))
        for name, dim in cases
    ]
    xs = [_scores().movedim(-1, dim).contiguous() for _, dim in cases]
    grads = [
        torch.randn(x.shape, generator=torch.Generator().manual_seed(1)) for x in xs
    ]

    def every_case(inputs):
        return tuple(f(x) for f, x in zip(fns, inputs))

    def weights_and_grad(fn):
        leaves = [x.clone().requires_grad_(True) for x in xs]
        ys = fn(leaves)
        gxs = torch.autograd.grad(ys, leaves, grads)
        return list(zip((y.detach() for y in ys), gxs))

    eager = weights_and_grad(every_case)
    compiled, _ = compile_together(
        every_case, weights_and_grad, backend, cases, lambda c: _compare([c], backend)
    )
    failures = []
    for (name, dim), got, want in zip(cases, compiled, eager):
        try:
            torch.testing.assert_close(got[0], want[0], **TOL, equal_nan=True)
            torch.testing.assert_close(got[1], want[1], **TOL, equal_nan=True)
        except AssertionError as error:
            failures.append(f"{name}, dim={dim} ({backend}): {error}")
    assert not failures, "\n\n".join(failures)


def test_every_normalizer_compiles_with_aot_eager():
    # sparsemax and entmax15 along another dim too
    extra = [(n, 1) for n in ("sparsemax", "entmax15") if n in selected(NAMES)]
    _compare([(n, -1) for n in selected(NAMES)] + extra, "aot_eager")


def test_every_normalizer_compiles_with_inductor():
    _compare([(n, -1) for n in selected(NAMES)], "inductor")
