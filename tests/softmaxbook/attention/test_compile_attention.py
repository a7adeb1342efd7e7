"""Every attention entry point works under ``torch.compile(fullgraph=True)`` and
gives its eager result, forward and backward.

A compiled model traces the library's argument checks along with the math, so
nothing on the way may read a tensor's values into Python: the checks that
look at values (a row with nothing to attend, a nan in the output of torch's
kernel) are skipped while tracing, and the path then taken gives the same
result. ``flash_attention`` reaches the compiler whole: where torch's own CPU
kernel computes the call and nothing is left to decide when it runs (no mask,
no logsumexp returned), as that kernel (``aten``'s op, as torch's SDPA
compiles), elsewhere as the library's operator
(``torch.ops.softmaxbook.flash_attention``); the test checks that each is in
the compiled graph.

One function runs every case, and each backend compiles it once (one dynamo
trace, one forward and one backward graph, one inductor lowering)
rather than once per case, which spent most of its time compiling. The cases
share no tensor, so each case's output and the gradients of its inputs are
those it would have compiled alone; each is compared with its own eager call
and a mismatch names the case. If the combined function does not compile
(a graph break fails ``fullgraph=True``), each case is compiled alone to name
the ones that fail. ``aot_eager`` (dynamo's graph and AOTAutograd's forward
and backward graphs, run by eager kernels) runs in float64, ``inductor``
(generated C++) in float32. ``COMPILE_CASES=flash_gqa,sdpa_gqa`` runs only
the named cases, e.g. to debug one. ``ring_attention`` needs a process group
and is not compiled here.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

import softmaxbook as sb
from compile_all import compile_together, selected

B, H, L, S, D = 2, 4, 6, 7, 8


def _masks() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    keep = torch.rand(B, 1, L, S, generator=g) > 0.4
    keep[..., 0] = True  # every row attends somewhere (torch's kernel and the
    keep[0, 0, 1] = False  # tiles agree on an empty row: zeros), and one row nothing
    bias = torch.randn(B, 1, L, S, generator=g, dtype=torch.float64)
    return keep, bias


KEEP, BIAS = _masks()


def _causal(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


def _capped(score, b, h, q_idx, kv_idx):
    return sb.soft_cap(score, 5.0)


# name -> (function of (q, k, v), number of key/value heads)
CASES: dict[str, tuple[Callable[..., torch.Tensor], int]] = {
    "sdpa_causal": (
        lambda q, k, v: sb.scaled_dot_product_attention(q, k, v, is_causal=True),
        H,
    ),
    "sdpa_bool_mask": (
        lambda q, k, v: sb.scaled_dot_product_attention(q, k, v, attn_mask=KEEP),
        H,
    ),
    "sdpa_float_mask": (
        lambda q, k, v: sb.scaled_dot_product_attention(
            q, k, v, attn_mask=BIAS.to(q.dtype)
        ),
        H,
    ),
    "sdpa_gqa": (
        lambda q, k, v: sb.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=True
        ),
        2,
    ),
    "sdpa_sparsemax": (
        lambda q, k, v: sb.scaled_dot_product_attention(
            q, k, v, is_causal=True, normalizer="sparsemax"
        ),
        H,
    ),
    "flash_causal": (
        lambda q, k, v: sb.flash_attention(q, k, v, is_causal=True),
        H,
    ),
    "flash_bool_mask": (lambda q, k, v: sb.flash_attention(q, k, v, mask=KEEP), H),
    "flash_float_mask": (
        lambda q, k, v: sb.flash_attention(q, k, v, mask=BIAS.to(q.dtype)),
        H,
    ),
    "flash_gqa": (
        lambda q, k, v: sb.flash_attention(q, k, v, is_causal=True, enable_gqa=True),
        2,
    ),
    "flash_tiles": (
        lambda q, k, v: sb.flash_attention(q, k, v, is_causal=True, explicit=True),
        H,
    ),
    "flex": (
        lambda q, k, v: sb.flex_attention(q, k, v, score_mod=_capped, mask_mod=_causal),
        H,
    ),
    "split_k": (
        lambda q, k, v: sb.split_k_attention(q, k, v, splits=3, is_causal=True),
        H,
    ),
    "differential": (
        lambda q, k, v: sb.differential_attention(
            q, k, q.flip(-1), k.flip(-1), v, 0.5, is_causal=True
        ),
        H,
    ),
    "selective": (  # causal self-attention: as many keys as queries
        lambda q, k, v: sb.selective_attention(
            q, k[..., :L, :], v[..., :L, :], return_weights=False
        ),
        H,
    ),
    "online_softmax": (
        lambda q, k, v: sb.online_softmax(q @ k.transpose(-2, -1), block_size=3),
        H,
    ),
    "merge_attention_states": (
        lambda q, k, v: sum(
            sb.merge_attention_states(
                *sb.flash_attention(q, k[..., :3, :], v[..., :3, :], return_lse=True),
                *sb.flash_attention(q, k[..., 3:, :], v[..., 3:, :], return_lse=True),
            )[:1]
        ),
        H,
    ),
    "soft_cap": (lambda q, k, v: sb.soft_cap(q @ k.transpose(-2, -1), 2.0), H),
}
# The flash cases compiled as torch's kernel itself, and as the library's operator.
KERNEL_CASES = {"flash_causal", "flash_gqa"}
OP_CASES = {"flash_bool_mask", "flash_float_mask", "merge_attention_states"}
TOL = {
    torch.float64: {"atol": 1e-12, "rtol": 1e-10},
    torch.float32: {"atol": 2e-5, "rtol": 2e-5},
}


def _inputs(name: str, dtype: torch.dtype) -> list[torch.Tensor]:
    kv_heads = CASES[name][1]
    g = torch.Generator().manual_seed(0)
    return [
        torch.randn(B, H, L, D, generator=g, dtype=dtype),
        torch.randn(B, kv_heads, S, D, generator=g, dtype=dtype),
        torch.randn(B, kv_heads, S, D, generator=g, dtype=dtype),
    ]


def _compare(names: list[str], backend: str, dtype: torch.dtype) -> None:
    """One compiled function runs every case in ``names``: one trace, one
    forward and one backward graph, one compilation, rather than one per case.
    The cases share no tensor, so each case's output and input gradients are
    those of the case compiled alone; each is checked against its own eager
    call, and a failure names the case."""
    inputs = {name: _inputs(name, dtype) for name in names}

    def run(fns, leaves):
        outs = fns(leaves)
        grads = [
            torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
            for out in outs
        ]
        flat = [t for case in leaves for t in case]
        got = torch.autograd.grad(outs, flat, grads, allow_unused=True)
        per_case = []
        for i, (out, case) in enumerate(zip(outs, leaves)):
            gr = got[3 * i : 3 * i + len(case)]
            per_case.append([out.detach(), *(x for x in gr if x is not None)])
        return per_case

    def leaves():
        return [[t.clone().requires_grad_(True) for t in inputs[n]] for n in names]

    def every_case(cases):
        return tuple(CASES[n][0](*case) for n, case in zip(names, cases))

    eager = run(every_case, leaves())
    compiled, graph = compile_together(
        every_case,
        lambda fn: run(fn, leaves()),
        backend,
        names,
        lambda name: _compare([name], backend, dtype),
    )
    # flash reaches the compiler whole, never traced through its tile loops: as
    # torch's own kernel where that computes it and nothing is left to decide when
    # it runs (no mask to read, no logsumexp returned), else as the library's op
    # pair, inside the autograd Function that dynamo records as subgraphs.
    modules = graph.modules()
    code = "\n".join(m.code for m in modules if isinstance(m, torch.fx.GraphModule))
    if set(names) & KERNEL_CASES:
        assert "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu" in code
    if set(names) & OP_CASES:
        assert "torch.ops.softmaxbook.flash_attention.default(" in code
        assert "torch.ops.softmaxbook.flash_attention_backward.default(" in code
    failures = []
    for name, got_case, want_case in zip(names, compiled, eager):
        try:
            assert len(got_case) == len(want_case) > 1
            for got, want in zip(got_case, want_case):
                torch.testing.assert_close(got, want, **TOL[dtype])
        except AssertionError as error:
            failures.append(f"{name} ({backend}): {error}")
    assert not failures, "\n\n".join(failures)


def test_every_entry_point_compiles_with_aot_eager():
    _compare(selected(CASES), "aot_eager", torch.float64)


def test_every_entry_point_compiles_with_inductor():
    _compare(selected(CASES), "inductor", torch.float32)


def test_a_compiled_call_compiles_once():
    """Dispatch's environment lookups (is triton installed, is its interpreter on)
    are constants to the compiler: traced, the lookup's cache, filled by the first
    trace, failed a guard and made the model compile a second time."""
    from softmaxbook.kernels import dispatch

    flag = torch.compiler.assume_constant_result(lambda: True)
    assert getattr(flag, "_dynamo_marked_constant", None) is True  # torch's flag
    for lookup in (dispatch.triton_available, dispatch.interpreter_enabled):
        assert getattr(lookup, "_dynamo_marked_constant", None) is True
    dispatch._FOUND.clear()  # as in a fresh process
    torch._dynamo.reset()
    q, k, v = torch.randn(B, H, L, D), torch.randn(B, H, S, D), torch.randn(B, H, S, D)
    f = torch.compile(
        lambda q: sb.flash_attention(q, k, v, mask=KEEP),
        backend="eager",
        fullgraph=True,
    )
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(2):
            f(q)
