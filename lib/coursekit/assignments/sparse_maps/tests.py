"""The tests of the `sparse-maps` assignment: sparsemax and entmax15."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..._model import Assignment, TestCase, Visibility
from .. import _builders as b
from .. import _common as c
from .._common import BF16, F32, F64, INF, Candidate

FORBIDDEN = ("softmax", "sdpa", "softmaxbook", "entmax")

SOFTMAX_HINT = (
    "That is softmax: every entry gets a positive weight. {name} gives exactly 0 to "
    "the entries below a threshold tau: p = {formula}, with tau chosen so that p sums "
    "to 1."
)
FORMULA = {"sparsemax": "max(x - tau, 0)", "entmax15": "max(x / 2 - tau, 0) ** 2"}


def _case(x: Tensor, dim: int | None = None, note: str = "") -> dict[str, Any]:
    where = c.label("scores", x, note) + ("" if dim is None else f" and dim={dim}")
    return {"args": [x], "kwargs": {} if dim is None else {"dim": dim}, "where": where}


def _dim(case: dict[str, Any]) -> int:
    return int(case["kwargs"].get("dim", -1))


def _expect(fn: str) -> Any:
    def expect(case: dict[str, Any]) -> Tensor:
        from .. import _refs

        reference = _refs.sparsemax if fn == "sparsemax" else _refs.entmax15
        return reference(case["args"][0], _dim(case))

    return expect


def _candidates(fn: str) -> Any:
    def candidates(case: dict[str, Any]) -> list[Candidate]:
        from .. import _refs

        x, dim = case["args"][0].to(F64), _dim(case)
        name = fn
        found: list[Candidate] = [
            (
                "",
                _refs.softmax(x, dim),
                SOFTMAX_HINT.format(name=name, formula=FORMULA[fn]),
            )
        ]
        relu = x.clamp(min=0)
        found.append(
            (
                "",
                relu / relu.sum(dim, keepdim=True),
                "That is max(x, 0) divided by its sum: the threshold tau is not 0 but "
                "the value that makes the clipped scores sum to 1.",
            )
        )
        if fn == "sparsemax":
            n = x.shape[dim]
            tau_all = (x.sum(dim, keepdim=True) - 1) / n
            found += [
                (
                    "",
                    (x - tau_all).clamp(min=0),
                    "tau = (sum of all entries - 1) / n uses every entry; it is the "
                    "mean over the support only: with z sorted in decreasing order, "
                    "the support is the largest k with 1 + k z_k > z_1 + ... + z_k, "
                    "and tau = (z_1 + ... + z_k - 1) / k.",
                ),
            ]
        else:
            found += [
                (
                    "",
                    _refs.sparsemax(x, dim),
                    "That is sparsemax. 1.5-entmax squares: "
                    "p = max(x / 2 - tau, 0) ** 2.",
                ),
                (
                    "",
                    _refs.sparsemax(x / 2, dim),
                    "You forgot the square: p = max(x / 2 - tau, 0) ** 2, with tau "
                    "solving sum_j max(x_j / 2 - tau, 0) ** 2 = 1.",
                ),
                (
                    "",
                    _refs.entmax15(2 * x, dim),
                    "1.5-entmax halves the scores first: p = max(x / 2 - tau, 0) ** 2 "
                    "((alpha - 1) x with alpha = 1.5), not max(x - tau, 0) ** 2.",
                ),
            ]
        for d in range(x.dim()):
            if d != dim % x.dim():
                wrong = _expect(fn)({"args": [x], "kwargs": {"dim": d}})
                found.append(
                    (
                        "",
                        wrong,
                        f"That is the result along dim={d}: work along the dim you are "
                        f"given (here {dim}).",
                    )
                )
        return found

    return candidates


def _explain(case: dict[str, Any], got: Tensor, want: Tensor) -> str:
    if bool(got.isnan().any()):
        return (
            "nan appeared: shift each row by its maximum first (both maps are "
            "unchanged by adding a constant), and keep -inf scores out of sums of "
            "squares (their weight is 0)."
        )
    sums = got.sum(-1)
    if not bool(torch.isclose(sums, torch.ones_like(sums), atol=1e-3).all()):
        return f"Each slice must sum to 1; yours sum to {c.fmt(sums.reshape(-1))}."
    return ""


def _test(
    fn: str, name: str, points: float, vis: Visibility, desc: str, cases: Any
) -> TestCase:
    return b.call_test(
        name=name,
        points=points,
        visibility=vis,
        fn=fn,
        description=desc,
        noun=f"your {fn}",
        cases=cases,
        expect=_expect(fn),
        candidates=_candidates(fn),
        explain=_explain,
        forbidden=FORBIDDEN,
    )


def _values(seed: int) -> list[dict[str, Any]]:
    g = c.generator(seed)
    return [
        _case(torch.tensor([1.0, 0.8, -1.0], dtype=F64)),
        _case(c.randn(g, 4, 7, scale=2.0)),
        _case(c.randn(g, 2, 3, 4, 5, scale=2.0)),
    ]


def _dims(seed: int) -> list[dict[str, Any]]:
    x = c.randn(c.generator(seed), 3, 4, 5, scale=2.0)
    return [_case(x, 0), _case(x, -2)]


def _ties() -> list[dict[str, Any]]:
    x = torch.tensor([[1.0, 1, 1, 0], [0.0, 0, 0, 0], [2.0, 2, -1, -1]])
    return [_case(x.to(F64), note="ties")]


def _large() -> list[dict[str, Any]]:
    x = torch.tensor([[10000.0, 9999.5, 0.0], [-10000.0, -10000.25, -10001.0]])
    return [_case(x.to(d), note="large scores") for d in (F64, F32)]


def _minus_inf() -> list[dict[str, Any]]:
    x = torch.tensor([[0.0, -INF, 0.5], [-INF, 3.0, -INF]])
    return [_case(x.to(d)) for d in (F64, F32)]


def _dtypes(seed: int) -> list[dict[str, Any]]:
    x = c.randn(c.generator(seed), 4, 7, scale=2.0)
    return [_case(x.to(d)) for d in (F32, BF16)]


def _grad_case(seed: int) -> dict[str, Any]:
    g = c.generator(seed)
    case = _case(c.randn(g, 3, 6, scale=2.0))
    case["where"] += " and a random grad_output"
    return {**case, "wrt": [0], "names": ["x"], "grad": c.randn(g, 3, 6)}


def _grads(fn: str) -> Any:
    def grads(case: dict[str, Any]) -> list[Tensor]:
        p, g = _expect(fn)(case), case["grad"]
        # d p / d x restricted to the support: sparsemax's is 1, entmax15's sqrt(p).
        weight = (p > 0).to(F64) if fn == "sparsemax" else p.sqrt()
        wg = g * weight
        return [wg - weight * wg.sum(-1, keepdim=True) / weight.sum(-1, keepdim=True)]

    return grads


def _grad_test(fn: str, seed: int) -> TestCase:
    return b.autograd_test(
        name=f"{fn}_gradient",
        points=2,
        visibility="hidden",
        fn=fn,
        description=f"autograd through your {fn} gives its Jacobian's product",
        noun=f"your {fn}",
        case=lambda: _grad_case(seed),
        expect=_expect(fn),
        grads=_grads(fn),
        forbidden=FORBIDDEN,
    )


TESTS: tuple[TestCase, ...] = (
    _test(
        "sparsemax",
        "sparsemax_values",
        2,
        "visible",
        "[1, 0.8, -1] gives [0.6, 0.4, 0]; random scores (4, 7) and (2, 3, 4, 5)",
        lambda: _values(81),
    ),
    _test(
        "sparsemax",
        "sparsemax_dim",
        1,
        "visible",
        "sparsemax along dim=0 and dim=-2 of a 3-d tensor",
        lambda: _dims(82),
    ),
    _test(
        "entmax15",
        "entmax15_values",
        2,
        "visible",
        "1.5-entmax of [1, 0.8, -1] and of random scores (4, 7) and (2, 3, 4, 5)",
        lambda: _values(83),
    ),
    _test(
        "entmax15",
        "entmax15_dim",
        1,
        "visible",
        "1.5-entmax along dim=0 and dim=-2 of a 3-d tensor",
        lambda: _dims(84),
    ),
    _test("sparsemax", "sparsemax_ties", 1, "hidden", "tied scores", _ties),
    _test(
        "sparsemax",
        "sparsemax_large_scores",
        1,
        "hidden",
        "scores near +-10000 in float64 and float32",
        _large,
    ),
    _test(
        "sparsemax",
        "sparsemax_minus_inf",
        1,
        "hidden",
        "a score of -inf gets weight 0",
        _minus_inf,
    ),
    _test(
        "sparsemax",
        "sparsemax_dtypes",
        1,
        "hidden",
        "float32 and bfloat16 scores give weights of the same dtype",
        lambda: _dtypes(85),
    ),
    _grad_test("sparsemax", 86),
    _test("entmax15", "entmax15_ties", 1, "hidden", "tied scores", _ties),
    _test(
        "entmax15",
        "entmax15_large_scores",
        1,
        "hidden",
        "scores near +-10000 in float64 and float32",
        _large,
    ),
    _test(
        "entmax15",
        "entmax15_dtypes",
        1,
        "hidden",
        "float32 and bfloat16 scores give weights of the same dtype",
        lambda: _dtypes(87),
    ),
    _grad_test("entmax15", 88),
)

ASSIGNMENT = Assignment(
    id="sparse-maps",
    title="Sparse alternatives to softmax: sparsemax and 1.5-entmax",
    functions=("sparsemax", "entmax15"),
    tests=TESTS,
    spec=b.spec_text("sparse_maps", TESTS),
    package="sparse_maps",
)
