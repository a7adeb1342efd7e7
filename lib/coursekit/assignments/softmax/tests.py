"""The tests of the `softmax` assignment: softmax, log_softmax, cross_entropy."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from ..._model import Assignment, TestCase
from .. import _builders as b
from .. import _common as c
from .._common import BF16, F16, F32, F64, INF, Candidate

FORBIDDEN = ("softmax", "logsumexp", "sdpa", "softmaxbook", "entmax")

MAX_HINT = (
    "Subtract the row maximum before exp, m = x.amax(dim=dim, keepdim=True): then "
    "every exponent is <= 0, nothing overflows, and the largest term is exp(0) = 1, "
    "so the sum is never 0."
)
LSE_HINT = (
    "Compute (x - m) - log(sum_j exp(x_j - m)), m the row maximum: never take the log "
    "of a probability that may have rounded to 0."
)


def _case(x: Tensor, dim: int | None = None, note: str = "") -> dict[str, Any]:
    where = c.label("scores", x, note) + ("" if dim is None else f" and dim={dim}")
    return {"args": [x], "kwargs": {} if dim is None else {"dim": dim}, "where": where}


def _dim(case: dict[str, Any]) -> int:
    return int(case["kwargs"].get("dim", -1))


def _wrong_dims(
    case: dict[str, Any], fn: Callable[[Tensor, int], Tensor]
) -> list[Candidate]:
    x, dim = case["args"][0], _dim(case)
    found: list[Candidate] = []
    for d in range(x.dim()):
        if d != dim % x.dim():
            found.append(
                (
                    "",
                    fn(x, d),
                    f"That is the result along dim={d}: normalize along the dim you "
                    f"are given (here {dim}), whatever the number of dimensions.",
                )
            )
    return found


def _softmax_candidates(case: dict[str, Any]) -> list[Candidate]:
    from .. import _refs

    x, dim = case["args"][0], _dim(case)
    xs = x.to(F64)
    with torch.no_grad():
        naive = torch.exp(xs) / torch.exp(xs).sum(dim, keepdim=True)
    return [*_wrong_dims(case, _refs.softmax), ("", naive, MAX_HINT)]


def _softmax_explain(case: dict[str, Any], got: Tensor, want: Tensor) -> str:
    if bool(got.isnan().any()):
        return MAX_HINT
    if bool((got < 0).any()):
        return "Weights are never negative: exp(x_i - m) / sum_j exp(x_j - m) > 0."
    dim = _dim(case)
    sums = got.to(F64).sum(dim)
    if got.dim() > 1 and abs(float(sums.sum()) - 1) < 1e-3:
        return (
            "Your whole result sums to 1, not each slice along dim: divide by the sum "
            "along dim, e.sum(dim=dim, keepdim=True)."
        )
    if not bool(torch.isclose(sums, torch.ones_like(sums), atol=1e-3).all()):
        return f"Each slice along dim must sum to 1; yours sum to {c.fmt(sums)}."
    return "Compare with exp(x_i - m) / sum_j exp(x_j - m), m the row maximum."


def _log_softmax_candidates(case: dict[str, Any]) -> list[Candidate]:
    from .. import _refs

    x, dim = case["args"][0], _dim(case)
    xs = x.to(F64)
    p = _refs.softmax(xs, dim)
    with torch.no_grad():
        naive = xs - torch.log(torch.exp(xs).sum(dim, keepdim=True))
        log_of_softmax = torch.log(p.to(x.dtype).to(F64))
    return [
        *_wrong_dims(case, _refs.log_softmax),
        (
            "",
            naive,
            "Subtract the maximum inside the logsumexp: exp(1000) overflows to inf and "
            "exp(-1000) underflows to 0. " + LSE_HINT,
        ),
        ("", log_of_softmax, "That is log(softmax(x)). " + LSE_HINT),
        ("", p, "Those are the probabilities: return their logarithms. " + LSE_HINT),
    ]


def _log_softmax_explain(case: dict[str, Any], got: Tensor, want: Tensor) -> str:
    if bool((torch.isneginf(got) & torch.isfinite(want)).any()):
        return "-inf is log(0), a probability rounded to 0. " + LSE_HINT
    if bool(got.isnan().any()):
        return "exp overflowed or 0/0 appeared. " + LSE_HINT
    return LSE_HINT


def _random_cases(seed: int, dtypes: tuple[torch.dtype, ...] = (F64,)) -> list[Any]:
    g = c.generator(seed)
    xs = [c.randn(g, 3, 7, scale=3.0), c.randn(g, 2, 3, 4, 5, scale=3.0)]
    return [_case(x.to(d)) for d in dtypes for x in xs]


_EXTREMES = [
    [[1000.0, 0.0], [-1000.0, -1000.0], [0.0, 1000.0]],
    [[0.0, -1000.0], [1000.0, 1001.0], [-1000.0, -999.0]],
]


def _extreme_cases() -> list[dict[str, Any]]:
    return [
        _case(torch.tensor(v, dtype=d), note="large scores")
        for d in (F64, F32)
        for v in _EXTREMES
    ]


def _dim_cases(seed: int) -> list[dict[str, Any]]:
    x = c.randn(c.generator(seed), 2, 3, 4, scale=2.0)
    return [_case(x, 0), _case(x, 1), _case(x, -2)]


def _softmax_test(
    name: str, points: float, vis: Any, desc: str, cases: Any
) -> TestCase:
    from_refs = _expect_softmax
    return b.call_test(
        name=name,
        points=points,
        visibility=vis,
        fn="softmax",
        description=desc,
        noun="your softmax",
        cases=cases,
        expect=from_refs,
        candidates=_softmax_candidates,
        explain=_softmax_explain,
        forbidden=FORBIDDEN,
    )


def _expect_softmax(case: dict[str, Any]) -> Tensor:
    from .. import _refs

    return _refs.softmax(case["args"][0], _dim(case))


def _expect_log_softmax(case: dict[str, Any]) -> Tensor:
    from .. import _refs

    return _refs.log_softmax(case["args"][0], _dim(case))


def _log_softmax_test(
    name: str, points: float, vis: Any, desc: str, cases: Any
) -> TestCase:
    return b.call_test(
        name=name,
        points=points,
        visibility=vis,
        fn="log_softmax",
        description=desc,
        noun="your log_softmax",
        cases=cases,
        expect=_expect_log_softmax,
        candidates=_log_softmax_candidates,
        explain=_log_softmax_explain,
        forbidden=FORBIDDEN,
    )


# --- cross-entropy ------------------------------------------------------------------


def _ce_case(logits: Tensor, targets: Tensor, note: str = "") -> dict[str, Any]:
    where = c.label("logits", logits, note) + f" and targets {c.fmt(targets)}"
    return {"args": [logits, targets], "kwargs": {}, "where": where}


def _expect_ce(case: dict[str, Any]) -> Tensor:
    from .. import _refs

    logits, targets = case["args"]
    log_p = _refs.log_softmax(logits)
    return -log_p.gather(-1, targets.unsqueeze(-1)).mean()


def _ce_candidates(case: dict[str, Any]) -> list[Candidate]:
    from .. import _refs

    logits, targets = case["args"]
    log_p = _refs.log_softmax(logits)
    picked = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    p = _refs.softmax(logits)
    with torch.no_grad():
        naive = torch.log(p.to(logits.dtype).to(F64)).gather(-1, targets.unsqueeze(-1))
    return [
        ("", -picked.sum(), "That is the sum over rows: cross_entropy is their mean."),
        ("", picked.mean(), "The sign is flipped: the loss is -log p[target]."),
        (
            "",
            -log_p.mean(),
            "You averaged -log p over every class; pick each row's target class, "
            "log_p.gather(-1, targets.unsqueeze(-1)) or log_p[arange(N), targets].",
        ),
        (
            "",
            -p.gather(-1, targets.unsqueeze(-1)).mean(),
            "That is -p[target], the probability; the loss takes its log.",
        ),
        ("", -naive.mean(), "That is -log(softmax(x))[target]. " + LSE_HINT),
    ]


def _ce_cases() -> list[dict[str, Any]]:
    g = c.generator(31)
    logits = c.randn(g, 5, 4, scale=2.0)
    targets = torch.randint(0, 4, (5,), generator=g)
    return [_ce_case(logits, targets)]


def _ce_extreme_cases() -> list[dict[str, Any]]:
    logits = torch.tensor([[1000.0, 0.0, -1000.0], [0.0, 1000.0, 0.0]])
    targets = torch.tensor([2, 1])
    return [_ce_case(logits.to(d), targets, "large logits") for d in (F64, F32)]


def _ce_dtype_cases() -> list[dict[str, Any]]:
    g = c.generator(32)
    logits = c.randn(g, 64, 10, scale=3.0).to(F32)
    return [_ce_case(logits, torch.randint(0, 10, (64,), generator=g))]


def _ce_test(name: str, points: float, vis: Any, desc: str, cases: Any) -> TestCase:
    return b.call_test(
        name=name,
        points=points,
        visibility=vis,
        fn="cross_entropy",
        description=desc,
        noun="your cross_entropy",
        cases=cases,
        expect=_expect_ce,
        candidates=_ce_candidates,
        forbidden=FORBIDDEN,
    )


# --- through autograd: gradients, and the input left alone --------------------------


def _grad_case(fn: str) -> dict[str, Any]:
    g = c.generator(41)
    x = c.randn(g, 3, 7, scale=2.0)
    if fn == "cross_entropy":
        targets = torch.randint(0, 7, (3,), generator=g)
        case = _ce_case(x, targets)
        return {**case, "wrt": [0], "names": ["logits"], "grad": None}
    case = _case(x)
    case["where"] += " and a random grad_output"
    return {**case, "wrt": [0], "names": ["x"], "grad": c.randn(g, 3, 7)}


def _grad_want(fn: str) -> Callable[[dict[str, Any]], list[Tensor]]:
    def want(case: dict[str, Any]) -> list[Tensor]:
        from .. import _refs

        x, g = case["args"][0], case["grad"]
        s = _refs.softmax(x)
        if fn == "cross_entropy":
            onehot = torch.nn.functional.one_hot(case["args"][1], x.shape[-1])
            return [(s - onehot.to(F64)) / x.shape[0]]
        if fn == "softmax":
            return [s * (g - (s * g).sum(-1, keepdim=True))]
        return [g - s * g.sum(-1, keepdim=True)]

    return want


_EXPECT = {
    "softmax": lambda case: _expect_softmax(case),
    "log_softmax": lambda case: _expect_log_softmax(case),
    "cross_entropy": lambda case: _expect_ce(case),
}


def _grad_test(fn: str, points: float) -> TestCase:
    return b.autograd_test(
        name=f"{fn}_gradient",
        points=points,
        visibility="hidden",
        fn=fn,
        description=f"autograd through your {fn} gives the right gradient",
        noun=f"your {fn}",
        case=lambda: _grad_case(fn),
        expect=_EXPECT[fn],
        grads=_grad_want(fn),
        forbidden=FORBIDDEN,
    )


def _unchanged_run(
    functions: Mapping[str, Callable[..., Any]], inputs: dict[str, Any]
) -> dict[str, Any]:
    x = inputs["x"].clone()
    result = c.attempt(functions["softmax"], x)
    return {**result, "unchanged": bool(torch.equal(x, inputs["x"]))}


def _unchanged_judge(inputs: dict[str, Any], outputs: dict[str, Any]) -> str | None:
    case = _case(inputs["x"])
    message = b.judge_call(case, outputs, _expect_softmax(case), noun="your softmax")
    if message:
        return message
    if not outputs.get("unchanged"):
        return (
            f"With {case['where']}, your softmax changed its input x: avoid in-place "
            "operations on it (x -= m, x.exp_()); write x = x - m."
        )
    return None


TESTS: tuple[TestCase, ...] = (
    _softmax_test(
        "softmax_values",
        2,
        "visible",
        "softmax of random scores (a matrix and a 4-d batch) along the last dim",
        lambda: _random_cases(11),
    ),
    _softmax_test(
        "softmax_dim",
        1,
        "visible",
        "softmax along dim=0, dim=1 and dim=-2 of a 3-d tensor",
        lambda: _dim_cases(12),
    ),
    _softmax_test(
        "softmax_large_scores",
        2,
        "visible",
        "scores of +-1000 in float64 and float32: no overflow, no nan",
        _extreme_cases,
    ),
    _log_softmax_test(
        "log_softmax_values",
        2,
        "visible",
        "log-softmax of random scores along the last dim",
        lambda: _random_cases(13),
    ),
    _log_softmax_test(
        "log_softmax_large_scores",
        2,
        "visible",
        "log-softmax of scores of +-1000: finite, e.g. [0, -1000] for [1000, 0]",
        _extreme_cases,
    ),
    _ce_test(
        "cross_entropy_values",
        2,
        "visible",
        "the mean cross-entropy of random logits (5, 4) and int64 targets",
        _ce_cases,
    ),
    _softmax_test(
        "softmax_dtypes",
        1,
        "hidden",
        "float32, float16 and bfloat16 scores give weights of the same dtype",
        lambda: _random_cases(14, (F32, F16, BF16)),
    ),
    _softmax_test(
        "softmax_minus_inf",
        1,
        "hidden",
        "a score of -inf gets weight exactly 0",
        lambda: [
            _case(torch.tensor([[0.0, -INF, 1.0], [-INF, 2.0, -INF]], dtype=d))
            for d in (F64, F32)
        ],
    ),
    TestCase(
        name="softmax_input_unchanged",
        points=1,
        visibility="hidden",
        functions=("softmax",),
        description="softmax returns the right weights and leaves its input alone",
        make_inputs=lambda: {"x": c.randn(c.generator(15), 4, 6, scale=2.0)},
        run=_unchanged_run,
        judge=b.robust(_unchanged_judge),
        forbidden=FORBIDDEN,
    ),
    _grad_test("softmax", 2),
    _log_softmax_test(
        "log_softmax_dim_dtypes",
        1,
        "hidden",
        "log-softmax along other dims, and in float32 and bfloat16",
        lambda: _dim_cases(16) + _random_cases(17, (F32, BF16)),
    ),
    _grad_test("log_softmax", 1),
    _ce_test(
        "cross_entropy_large_logits",
        2,
        "hidden",
        "logits of +-1000 give the finite loss (1000 here)",
        _ce_extreme_cases,
    ),
    _ce_test(
        "cross_entropy_float32",
        1,
        "hidden",
        "float32 logits (64, 10) give a float32 scalar loss",
        _ce_dtype_cases,
    ),
    _grad_test("cross_entropy", 2),
)

ASSIGNMENT = Assignment(
    id="softmax",
    title="Softmax, log-softmax and cross-entropy from scratch",
    functions=("softmax", "log_softmax", "cross_entropy"),
    tests=TESTS,
    spec=b.spec_text("softmax", TESTS),
    package="softmax",
)
