"""Every attention entry point works under ``torch.compile(fullgraph=True)`` and
gives its eager result, forward and backward.

A compiled model traces the library's argument checks along with the math, so
nothing on the way may read a tensor's values into Python: the checks that
look at values (a row with nothing to attend, a nan in the output of torch's
kernel) are skipped while tracing, and the path then taken gives the same
result. ``flash_attention`` reaches the compiler as one operator
(``torch.ops.softmaxbook.flash_attention``). Each case compiles one function
with ``aot_eager`` (dynamo's graph and AOTAutograd's forward and backward
graphs, run by eager kernels) in float64 and compares the output and the
gradients of every input with the eager call's; ``inductor`` (generated C++)
runs for the causal SDPA by default and for the rest in the slow set (its C++
compilation takes 10 to 60 s a case on two cores). ``ring_attention`` needs a
process group and is not compiled here.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch._dynamo

import softmaxbook as sb

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
TOL = {
    torch.float64: {"atol": 1e-12, "rtol": 1e-10},
    torch.float32: {"atol": 2e-5, "rtol": 2e-5},
}


def _compare(name: str, backend: str, dtype: torch.dtype) -> None:
    f, kv_heads = CASES[name]
    g = torch.Generator().manual_seed(0)
    inputs = [
        torch.randn(B, H, L, D, generator=g, dtype=dtype),
        torch.randn(B, kv_heads, S, D, generator=g, dtype=dtype),
        torch.randn(B, kv_heads, S, D, generator=g, dtype=dtype),
    ]

    def run(fn):
        leaves = [t.clone().requires_grad_(True) for t in inputs]
        out = fn(*leaves)
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        grads = torch.autograd.grad(out, leaves, grad.to(dtype), allow_unused=True)
        return [out.detach(), *(gr for gr in grads if gr is not None)]

    torch._dynamo.reset()
    eager = run(f)
    compiled = run(torch.compile(f, fullgraph=True, backend=backend))
    torch._dynamo.reset()
    assert len(compiled) == len(eager) > 1
    for got, want in zip(compiled, eager):
        torch.testing.assert_close(got, want, **TOL[dtype])


@pytest.mark.parametrize("name", list(CASES))
def test_every_entry_point_compiles_with_aot_eager(name):
    _compare(name, "aot_eager", torch.float64)


def test_sdpa_compiles_with_inductor():
    _compare("sdpa_causal", "inductor", torch.float32)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in CASES if n != "sdpa_causal"])
def test_every_entry_point_compiles_with_inductor(name):
    _compare(name, "inductor", torch.float32)
