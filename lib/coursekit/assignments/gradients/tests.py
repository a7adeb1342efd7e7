"""The tests of the `gradients` assignment: softmax_backward and attention_backward,
derived by hand (autograd is forbidden)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ..._model import Assignment, TestCase, Visibility
from .. import _builders as b
from .. import _common as c
from .._common import BF16, F32, F64, Candidate

FORBIDDEN = ("softmax", "sdpa", "softmaxbook", "entmax", "autograd")

VJP = "s * (g - (s * g).sum(dim=dim, keepdim=True))"
ROWSUM_HINT = (
    "dS = P * (dP - rowsum(dP * P)) needs the row sum: with dP = dO V^T, "
    "rowsum(dP * P) = rowsum(dO * O). That term comes from the softmax's "
    "denominator; without it dS = P * dP."
)


# --- softmax_backward ---------------------------------------------------------------


def _sb_case(
    s: Tensor, g: Tensor, dim: int | None = None, note: str = ""
) -> dict[str, Any]:
    what = "s = softmax of " + c.label("scores", s, note)
    if s.numel() <= 12:
        what = c.label("s", s, note)
    where = f"{what} and a random grad_output" + ("" if dim is None else f", dim={dim}")
    kwargs = {} if dim is None else {"dim": dim}
    return {"args": [s, g], "kwargs": kwargs, "where": where}


def _sb_expect(case: dict[str, Any]) -> Tensor:
    s, g = (a.to(F64) for a in case["args"])
    dim = int(case["kwargs"].get("dim", -1))
    return s * (g - (s * g).sum(dim, keepdim=True))


def _sb_candidates(case: dict[str, Any]) -> list[Candidate]:
    from .. import _refs

    s, g = (a.to(F64) for a in case["args"])
    dim = int(case["kwargs"].get("dim", -1))
    dot = (s * g).sum(dim, keepdim=True)
    s2 = _refs.softmax(s, dim)
    found: list[Candidate] = [
        (
            "",
            s * g,
            "That is s * g: it misses the term -s_i * sum_j s_j g_j, which comes from "
            f"the denominator that couples every entry. Return {VJP}.",
        ),
        ("", g - dot, f"Multiply by s: the gradient is {VJP}, 0 wherever s is 0."),
        (
            "",
            s * (g - g.sum(dim, keepdim=True)),
            "The sum must be weighted by s: sum_j s_j g_j, not sum_j g_j.",
        ),
        ("", -s * (g - dot), f"The sign is flipped: the gradient is {VJP}."),
        (
            "",
            s2 * (g - (s2 * g).sum(dim, keepdim=True)),
            "You applied softmax to s: s is already the softmax's output; use it as it "
            "is.",
        ),
    ]
    for d in range(s.dim()):
        if d != dim % s.dim():
            wrong = s * (g - (s * g).sum(d, keepdim=True))
            found.append(
                (
                    "",
                    wrong,
                    f"You summed along dim={d}; the sum runs along the dim you are "
                    f"given (here {dim}).",
                )
            )
    return found


def _sb_explain(case: dict[str, Any], got: Tensor, want: Tensor) -> str:
    if bool(got.isnan().any()):
        return (
            "nan appeared: the gradient needs no division and no log; it is 0 "
            "wherever s is 0, including a row of zeros (a fully masked query)."
        )
    return f"Compare with {VJP}."


def _sb_test(
    name: str, points: float, vis: Visibility, desc: str, cases: Any
) -> TestCase:
    return b.call_test(
        name=name,
        points=points,
        visibility=vis,
        fn="softmax_backward",
        description=desc,
        noun="your softmax_backward",
        cases=cases,
        expect=_sb_expect,
        candidates=_sb_candidates,
        explain=_sb_explain,
        forbidden=FORBIDDEN,
    )


def _softmax_of(x: Tensor, dim: int = -1) -> Tensor:
    e = torch.exp(x - x.amax(dim, keepdim=True))
    return e / e.sum(dim, keepdim=True)


def _sb_values() -> list[dict[str, Any]]:
    g = c.generator(51)
    out = []
    for shape in ((3, 7), (2, 3, 4, 5)):
        s = _softmax_of(c.randn(g, *shape, scale=2.0))
        out.append(_sb_case(s, c.randn(g, *shape)))
    return out


def _sb_dim() -> list[dict[str, Any]]:
    g = c.generator(52)
    x = c.randn(g, 4, 3, 5, scale=2.0)
    return [_sb_case(_softmax_of(x, 0), c.randn(g, 4, 3, 5), dim=0)]


def _sb_zeros() -> list[dict[str, Any]]:
    s = torch.tensor([[0.6225, 0.3775, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=F64)
    g = torch.tensor([[0.3, -1.0, 0.5, 2.0], [1.0, 2.0, 3.0, 4.0]], dtype=F64)
    case = _sb_case(s, g, note="masked keys and a fully masked row")
    given = f"grad_output {c.fmt(g)}"
    case["where"] = case["where"].replace("a random grad_output", given)
    return [case]


def _sb_dtypes() -> list[dict[str, Any]]:
    g = c.generator(53)
    s = _softmax_of(c.randn(g, 3, 7, scale=2.0))
    grad = c.randn(g, 3, 7)
    return [_sb_case(s.to(d), grad.to(d)) for d in (F32, BF16)]


# --- attention_backward -------------------------------------------------------------

PARTS = ("dq", "dk", "dv")


def _ab_case(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    grad: Tensor,
    mask: Tensor | None = None,
    note: str = "",
) -> dict[str, Any]:
    dtype = c.dtype_name(q.dtype) + (f", {note}" if note else "")
    where = (
        f"random q {c.shape_of(q)}, k {c.shape_of(k)}, v {c.shape_of(v)}, "
        f"grad_output {c.shape_of(grad)} ({dtype})"
    )
    kwargs = {}
    if mask is not None:
        kwargs["mask"] = mask
        where += f" and a mask of shape {c.shape_of(mask)}"
    return {"args": [q, k, v, grad], "kwargs": kwargs, "where": where}


def _ab_expect(case: dict[str, Any]) -> list[tuple[str, Tensor, torch.dtype]]:
    from .. import _refs

    q, k, v, grad = case["args"]
    found = _refs.attention_grads(q, k, v, grad, case["kwargs"].get("mask"))
    return [(name, t, q.dtype) for name, t in zip(PARTS, found)]


def _ab_candidates(case: dict[str, Any]) -> list[Candidate]:
    from .. import _refs

    q, k, v, grad = (a.to(F64) for a in case["args"])
    mask = case["kwargs"].get("mask")
    out, _, p = _refs.attention(q, k, v, mask)
    right = _refs.grads_from(q, k, p, _refs.ds_of(p, out, v, grad), grad)
    no_rowsum = _refs.grads_from(q, k, p, _refs.ds_of(p, out, v, grad, False), grad)
    unscaled = _refs.grads_from(
        q, k, p, _refs.ds_of(p, out, v, grad), grad, scaled=False
    )
    D = q.shape[-1]
    found: list[Candidate] = []
    for i, name in enumerate(PARTS[:2]):
        found += [
            (name, no_rowsum[i], ROWSUM_HINT),
            (
                name,
                unscaled[i],
                f"The scores are q k^T / sqrt(D), so {name} carries that factor too: "
                f"multiply by 1 / sqrt(D).",
            ),
            (
                name,
                right[i] / math.sqrt(D),
                f"{name} is scaled by 1 / sqrt(D) once, not twice.",
            ),
        ]
    if p.shape[-1] == p.shape[-2]:
        found.append(("dv", p @ grad, "dv = P^T dO: transpose the weights."))
    if mask is not None:
        out2, _, p2 = _refs.attention(q, k, v)
        ignored = _refs.grads_from(q, k, p2, _refs.ds_of(p2, out2, v, grad), grad)
        hint = "The mask was ignored: masked keys (mask False) get weight 0."
        found += [(n, t, hint) for n, t in zip(PARTS, ignored)]
    return found


def _ab_explain(case: dict[str, Any], got: Tensor, want: Tensor) -> str:
    if bool(got.isnan().any()):
        return (
            "nan appeared: a query with nothing to attend to has all-zero weights; "
            "compute them without -inf - (-inf) (replace its maximum by 0, its sum by "
            "1), and every gradient of that row is 0."
        )
    return ""


def _ab_test(
    name: str, points: float, vis: Visibility, desc: str, cases: Any
) -> TestCase:
    return b.call_test(
        name=name,
        points=points,
        visibility=vis,
        fn="attention_backward",
        description=desc,
        noun="your attention_backward",
        cases=cases,
        expect=_ab_expect,
        candidates=_ab_candidates,
        explain=_ab_explain,
        forbidden=FORBIDDEN,
    )


def _qkvg(
    g: torch.Generator, batch: tuple[int, ...], L: int, S: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    q, k = c.randn(g, *batch, L, 8), c.randn(g, *batch, S, 8)
    return q, k, c.randn(g, *batch, S, 4), c.randn(g, *batch, L, 4)


def _ab_values() -> list[dict[str, Any]]:
    return [_ab_case(*_qkvg(c.generator(54), (2,), 5, 7))]


def _ab_mask() -> list[dict[str, Any]]:
    g = c.generator(55)
    return [_ab_case(*_qkvg(g, (2,), 5, 7), mask=c.random_mask(g, 5, 7))]


def _ab_empty() -> list[dict[str, Any]]:
    g = c.generator(56)
    mask = c.random_mask(g, 5, 7)
    mask[3] = False
    return [_ab_case(*_qkvg(g, (2,), 5, 7), mask=mask, note="a fully masked query")]


def _ab_heads() -> list[dict[str, Any]]:
    g = c.generator(57)
    mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    mask[1, ..., 4:] = False  # padding: the second sequence has 4 keys
    return [_ab_case(*_qkvg(g, (2, 2), 6, 6), mask=mask)]


def _ab_float32() -> list[dict[str, Any]]:
    q, k, v, grad = _qkvg(c.generator(58), (2,), 5, 7)
    return [_ab_case(q.float(), k.float(), v.float(), grad.float())]


def _ab_large() -> list[dict[str, Any]]:
    q, k, v, grad = _qkvg(c.generator(59), (2,), 5, 7)
    return [_ab_case(q * 30, k * 30, v, grad, note="scores of several hundred")]


TESTS: tuple[TestCase, ...] = (
    _sb_test(
        "softmax_backward_values",
        2,
        "visible",
        "s = softmax of random scores (3, 7) and (2, 3, 4, 5), a random grad_output",
        _sb_values,
    ),
    _sb_test(
        "softmax_backward_dim",
        1,
        "visible",
        "the backward pass along dim=0",
        _sb_dim,
    ),
    _ab_test(
        "attention_backward_values",
        3,
        "visible",
        "dq, dk, dv for q (2, 5, 8), k (2, 7, 8), v (2, 7, 4), no mask",
        _ab_values,
    ),
    _ab_test(
        "attention_backward_mask",
        2,
        "visible",
        "dq, dk, dv with a boolean mask (5, 7)",
        _ab_mask,
    ),
    _sb_test(
        "softmax_backward_zeros",
        1,
        "hidden",
        "zero weights and a fully masked row give zero gradients, no nan",
        _sb_zeros,
    ),
    _sb_test(
        "softmax_backward_dtypes",
        1,
        "hidden",
        "float32 and bfloat16 inputs give a gradient of the same dtype",
        _sb_dtypes,
    ),
    _ab_test(
        "attention_backward_fully_masked_query",
        2,
        "hidden",
        "a query with nothing to attend to: zero gradient rows, no nan",
        _ab_empty,
    ),
    _ab_test(
        "attention_backward_heads_padding",
        1,
        "hidden",
        "(B, H, L, D) inputs with L == S and a padding mask (B, 1, 1, S)",
        _ab_heads,
    ),
    _ab_test(
        "attention_backward_float32",
        1,
        "hidden",
        "float32 inputs give float32 gradients",
        _ab_float32,
    ),
    _ab_test(
        "attention_backward_large_scores",
        1,
        "hidden",
        "scores of several hundred: no overflow",
        _ab_large,
    ),
)

ASSIGNMENT = Assignment(
    id="gradients",
    title="The backward pass of softmax and attention, by hand",
    functions=("softmax_backward", "attention_backward"),
    tests=TESTS,
    spec=b.spec_text("gradients", TESTS),
    package="gradients",
)
