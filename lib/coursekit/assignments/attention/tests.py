"""The tests of the `attention` assignment: masked_softmax and
scaled_dot_product_attention."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from ..._model import Assignment, TestCase, Visibility
from .. import _builders as b
from .. import _common as c
from .._common import BF16, F16, F32, F64, Candidate

FORBIDDEN = ("softmax", "sdpa", "softmaxbook", "entmax")

EMPTY_NAN_HINT = (
    "A row whose mask is all False has every score at -inf, so its maximum is -inf "
    "and -inf - (-inf) = nan. Such a row has nothing to attend to: give it zeros, e.g. "
    "replace its maximum by 0 before exp and divide its sum (0) by 1 instead."
)
UNIFORM_HINT = (
    "A fully masked row came back spread evenly over keys it may not see: that is what "
    "a finite fill such as -1e9 does. Fill with -inf and give rows with nothing to "
    "attend all-zero weights."
)
POLARITY_HINT = (
    "That is the softmax over the entries where the mask is False: the mask means "
    "True = may attend. Use scores.masked_fill(~mask, float('-inf'))."
)
IGNORED_HINT = (
    "That is the softmax of all the scores, as if there were no mask: entries where "
    "the mask is False must get weight exactly 0."
)
BACKWARD_NAN_HINT = (
    "The forward pass may give zeros and the backward pass still nan: torch.where(c, "
    "a, b) sends gradient into both branches, and a nan in the branch not taken "
    "poisons it. Keep nan out of every intermediate: replace an empty row's maximum "
    "by 0 before exp and its sum by 1 before dividing."
)


# --- masked_softmax -----------------------------------------------------------------


def _ms_case(
    scores: Tensor, mask: Tensor, dim: int | None = None, note: str = ""
) -> dict[str, Any]:
    where = c.label("scores", scores, note) + f" and a mask of shape {c.shape_of(mask)}"
    if mask.numel() <= 12:
        where = c.label("scores", scores, note) + f" and mask {_bools(mask)}"
    if dim is not None:
        where += f" and dim={dim}"
    kwargs = {} if dim is None else {"dim": dim}
    return {"args": [scores, mask], "kwargs": kwargs, "where": where}


def _bools(mask: Tensor) -> str:
    return c.fmt(mask.to(F64), 12).replace("1", "T").replace("0", "F")


def _ms_expect(case: dict[str, Any]) -> Tensor:
    from .. import _refs

    scores, mask = case["args"]
    dim = int(case["kwargs"].get("dim", -1))
    filled = scores.to(F64).masked_fill(~mask.expand_as(scores), -c.INF)
    return _refs.softmax(filled, dim)


def _ms_candidates(case: dict[str, Any]) -> list[Candidate]:
    from .. import _refs

    scores, mask = case["args"]
    dim = int(case["kwargs"].get("dim", -1))
    keep = mask.expand_as(scores)
    s64 = scores.to(F64)
    plain = _refs.softmax(s64, dim)
    empty = ~keep.any(dim=dim, keepdim=True)
    finite = _refs.softmax(s64.masked_fill(~keep, -1e9), dim)
    return [
        ("", _refs.softmax(s64.masked_fill(keep, -c.INF), dim), POLARITY_HINT),
        ("", plain, IGNORED_HINT),
        (
            "",
            plain * keep,
            "You zeroed the masked weights after the softmax without renormalizing: "
            "mask the scores (fill with -inf) before it.",
        ),
        ("", torch.where(empty, finite, _ms_expect(case)), UNIFORM_HINT),
    ]


def _ms_explain(case: dict[str, Any], got: Tensor, want: Tensor) -> str:
    if bool(got.isnan().any()):
        return (
            EMPTY_NAN_HINT
            if bool((want == 0).all(-1).any())
            else c.words(
                """nan appeared in rows that keep some entries: 0 * -inf is nan, so an
            additive mask built as (~mask) * float('-inf') poisons every entry of its
            row. Use scores.masked_fill(~mask, float('-inf'))."""
            )
        )
    return "Compare with the softmax of scores.masked_fill(~mask, float('-inf'))."


def _ms_test(
    name: str, points: float, vis: Visibility, desc: str, cases: Any
) -> TestCase:
    return b.call_test(
        name=name,
        points=points,
        visibility=vis,
        fn="masked_softmax",
        description=desc,
        noun="your masked_softmax",
        cases=cases,
        expect=_ms_expect,
        candidates=_ms_candidates,
        explain=_ms_explain,
        forbidden=FORBIDDEN,
    )


def _ms_values() -> list[dict[str, Any]]:
    g = c.generator(21)
    scores = c.randn(g, 2, 4, 6, scale=2.0)
    return [_ms_case(scores, c.random_mask(g, 2, 4, 6))]


def _ms_broadcast() -> list[dict[str, Any]]:
    g = c.generator(22)
    scores = c.randn(g, 2, 3, 4, 5, scale=2.0)
    return [
        _ms_case(scores, c.random_mask(g, 4, 5)),
        _ms_case(scores, c.random_mask(g, 2, 1, 1, 5)),
    ]


_EMPTY_MASK = torch.tensor(
    [[True, False, True, False], [False, False, False, False], [True, True, True, True]]
)


def _ms_empty() -> list[dict[str, Any]]:
    scores = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 2.0, 0.0], [0.0] * 4])
    return [
        _ms_case(scores.to(d), _EMPTY_MASK, note="a fully masked row")
        for d in (F64, F32)
    ]


def _ms_dim() -> list[dict[str, Any]]:
    g = c.generator(23)
    scores = c.randn(g, 2, 5, 4, scale=2.0)
    return [_ms_case(scores, c.random_mask(g, 5, 4), dim=-2)]


def _ms_low_precision() -> list[dict[str, Any]]:
    g = c.generator(24)
    scores = c.randn(g, 3, 6, scale=2.0)
    mask = c.random_mask(g, 3, 6)
    mask[1] = False
    note = "a fully masked row"
    return [_ms_case(scores.to(d), mask, note=note) for d in (F16, BF16)]


def _ms_large() -> list[dict[str, Any]]:
    scores = torch.tensor([[1000.0, 0.0, -1000.0], [-1000.0, -999.0, 1000.0]])
    mask = torch.tensor([[True, True, False], [True, True, False]])
    return [_ms_case(scores.to(d), mask, note="large scores") for d in (F64, F32)]


def _ms_grad_case() -> dict[str, Any]:
    g = c.generator(25)
    scores = c.randn(g, 3, 5, scale=2.0)
    mask = c.random_mask(g, 3, 5)
    mask[1] = False
    case = _ms_case(scores, mask, note="a fully masked row")
    case["where"] += " and a random grad_output"
    return {**case, "wrt": [0], "names": ["scores"], "grad": c.randn(g, 3, 5)}


def _ms_grads(case: dict[str, Any]) -> list[Tensor]:
    s, g = _ms_expect(case), case["grad"]
    return [s * (g - (s * g).sum(-1, keepdim=True))]


def _ms_grad_explain_wrapper() -> TestCase:
    test = b.autograd_test(
        name="masked_softmax_gradient",
        points=2,
        visibility="hidden",
        fn="masked_softmax",
        description="autograd through masked_softmax: right and finite gradients, "
        "also for a fully masked row",
        noun="your masked_softmax",
        case=_ms_grad_case,
        expect=_ms_expect,
        grads=_ms_grads,
        forbidden=FORBIDDEN,
    )

    def judge(inputs: dict[str, Any], outputs: dict[str, Any]) -> str | None:
        message = test.judge(inputs, outputs)
        grads = outputs.get("grads")
        if message and isinstance(grads, list) and isinstance(grads[0], Tensor):
            if bool(grads[0].isnan().any()):
                return c.words(message + " " + BACKWARD_NAN_HINT)
        return message

    return dataclasses.replace(test, judge=b.robust(judge))


# --- scaled_dot_product_attention ---------------------------------------------------


def _qkv(
    g: torch.Generator, batch: tuple[int, ...], L: int, S: int
) -> tuple[Tensor, Tensor, Tensor]:
    q, k = c.randn(g, *batch, L, 8), c.randn(g, *batch, S, 8)
    return q, k, c.randn(g, *batch, S, 4)


def _sdpa_case(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    note: str = "",
) -> dict[str, Any]:
    dtype = c.dtype_name(q.dtype) + (f", {note}" if note else "")
    where = f"random q {c.shape_of(q)}, k {c.shape_of(k)}, v {c.shape_of(v)} ({dtype})"
    kwargs: dict[str, Any] = {}
    if mask is not None:
        kwargs["mask"] = mask
        where += f" and a mask of shape {c.shape_of(mask)}"
    if is_causal:
        kwargs["is_causal"] = True
        where += " and is_causal=True"
    return {"args": [q, k, v], "kwargs": kwargs, "where": where}


def _sdpa_expect(case: dict[str, Any], align: str = "top_left") -> Tensor:
    from .. import _refs

    q, k, v = case["args"]
    kw = case["kwargs"]
    causal = kw.get("is_causal", False)
    return _refs.attention(q, k, v, kw.get("mask"), causal, align)[0]


def _sdpa_candidates(case: dict[str, Any]) -> list[Candidate]:
    from .. import _refs

    q, k, v = (a.to(F64) for a in case["args"])
    kw = case["kwargs"]
    mask, causal = kw.get("mask"), kw.get("is_causal", False)
    L, S, D = q.shape[-2], k.shape[-2], q.shape[-1]

    def attend(scale: float, keep: Tensor | None, dim: int = -1) -> Tensor:
        s = q @ k.transpose(-1, -2) * scale
        if keep is not None:
            s = s.masked_fill(~keep.expand_as(s), -c.INF)
        return _refs.softmax(s, dim) @ v

    keep = _refs.keep_of(L, S, mask, causal, "top_left")
    found: list[Candidate] = [
        ("", attend(1.0, keep), "Scale the scores by 1 / sqrt(D), D = q.shape[-1]."),
        ("", attend(1 / D, keep), "Scale by 1 / sqrt(D), not 1 / D."),
        ("", attend(D**0.5, keep), "Divide the scores by sqrt(D); do not multiply."),
    ]
    if L == S:
        found.append(
            (
                "",
                attend(D**-0.5, keep, dim=-2),
                "You normalized over the queries (dim=-2): each query's weights over "
                "the keys (dim=-1) sum to 1.",
            )
        )
    if mask is not None:
        flipped = _refs.keep_of(L, S, ~mask, causal, "top_left")
        found.append(("", attend(D**-0.5, flipped), POLARITY_HINT))
        unmasked = _refs.keep_of(L, S, None, causal, "top_left")
        found.append(("", attend(D**-0.5, unmasked), IGNORED_HINT))
    if causal:
        found.append(
            (
                "",
                attend(D**-0.5, _refs.keep_of(L, S, mask, False, "top_left")),
                "is_causal was ignored: query i may attend to keys j <= i only.",
            )
        )
        upper = torch.ones(L, S, dtype=torch.bool).triu()
        strict = torch.ones(L, S, dtype=torch.bool).tril(-1)
        found.append(
            (
                "",
                attend(D**-0.5, upper if mask is None else upper & mask),
                "The causal mask is the wrong way round: query i attends to keys "
                "j <= i (torch.ones(L, S).tril()), not j >= i.",
            )
        )
        found.append(
            (
                "",
                attend(D**-0.5, strict if mask is None else strict & mask),
                "Each query attends to itself too: keep j <= i, the diagonal included.",
            )
        )
        if L != S:
            br = _refs.keep_of(L, S, mask, True, "bottom_right")
            found.append(
                (
                    "",
                    attend(D**-0.5, br),
                    "That is the bottom-right alignment (key j for query i when "
                    "j <= i + S - L); this assignment uses torch's top-left one: "
                    "j <= i, torch.ones(L, S).tril().",
                )
            )
    return found


def _sdpa_explain(case: dict[str, Any], got: Tensor, want: Tensor) -> str:
    if bool(got.isnan().any()):
        return EMPTY_NAN_HINT
    if bool((got == 0).all()) and not bool((want == 0).all()):
        return (
            "Your output is all zeros, as if every key were masked: a key may be "
            "attended where the mask is True (and, with mask=None, everywhere)."
        )
    return ""


def _sdpa_test(
    name: str, points: float, vis: Visibility, desc: str, cases: Any
) -> TestCase:
    return b.call_test(
        name=name,
        points=points,
        visibility=vis,
        fn="scaled_dot_product_attention",
        description=desc,
        noun="your scaled_dot_product_attention",
        cases=cases,
        expect=_sdpa_expect,
        candidates=_sdpa_candidates,
        explain=_sdpa_explain,
        forbidden=FORBIDDEN,
    )


def _sdpa_values() -> list[dict[str, Any]]:
    return [_sdpa_case(*_qkv(c.generator(26), (2, 3), 5, 7))]


def _sdpa_mask() -> list[dict[str, Any]]:
    g = c.generator(27)
    return [_sdpa_case(*_qkv(g, (2,), 5, 7), mask=c.random_mask(g, 5, 7))]


def _sdpa_causal() -> list[dict[str, Any]]:
    return [_sdpa_case(*_qkv(c.generator(28), (2,), 6, 6), is_causal=True)]


def _sdpa_rectangular() -> list[dict[str, Any]]:
    g = c.generator(29)
    return [
        _sdpa_case(*_qkv(g, (2,), 4, 7), is_causal=True),
        _sdpa_case(*_qkv(g, (2,), 7, 4), is_causal=True),
    ]


def _sdpa_mask_causal() -> list[dict[str, Any]]:
    g = c.generator(30)
    mask = c.random_mask(g, 2, 1, 6, 6)
    mask[..., 0] = True  # every query keeps key 0, which causality allows
    return [_sdpa_case(*_qkv(g, (2, 2), 6, 6), mask=mask, is_causal=True)]


def _sdpa_empty() -> list[dict[str, Any]]:
    g = c.generator(31)
    mask = c.random_mask(g, 5, 7)
    mask[2] = False
    return [_sdpa_case(*_qkv(g, (2,), 5, 7), mask=mask, note="a fully masked query")]


def _sdpa_dtypes() -> list[dict[str, Any]]:
    g = c.generator(32)
    q, k, v = _qkv(g, (2, 2), 5, 7)
    return [_sdpa_case(q.to(d), k.to(d), v.to(d)) for d in (F32, BF16)]


def _sdpa_large() -> list[dict[str, Any]]:
    q, k, v = _qkv(c.generator(33), (2,), 5, 7)
    return [_sdpa_case(q * 30, k * 30, v, note="scores of several hundred")]


def _sdpa_grad_case() -> dict[str, Any]:
    g = c.generator(34)
    q, k, v = _qkv(g, (2,), 5, 7)
    mask = c.random_mask(g, 5, 7)
    case = _sdpa_case(q, k, v, mask=mask)
    case["where"] += " and a random grad_output"
    grad = c.randn(g, 2, 5, 4)
    return {**case, "wrt": [0, 1, 2], "names": ["q", "k", "v"], "grad": grad}


def _sdpa_grads(case: dict[str, Any]) -> list[Tensor]:
    from .. import _refs

    q, k, v = case["args"]
    return list(_refs.attention_grads(q, k, v, case["grad"], case["kwargs"]["mask"]))


TESTS: tuple[TestCase, ...] = (
    _ms_test(
        "masked_softmax_values",
        2,
        "visible",
        "random scores (2, 4, 6) and a random mask of the same shape",
        _ms_values,
    ),
    _ms_test(
        "masked_softmax_broadcast",
        2,
        "visible",
        "scores (2, 3, 4, 5) with masks (4, 5) and (2, 1, 1, 5) that broadcast",
        _ms_broadcast,
    ),
    _ms_test(
        "masked_softmax_empty_row",
        2,
        "visible",
        "a row whose mask is all False gives zeros, not nan (float64, float32)",
        _ms_empty,
    ),
    _sdpa_test(
        "sdpa_values",
        2,
        "visible",
        "attention on q (2, 3, 5, 8), k (2, 3, 7, 8), v (2, 3, 7, 4), no mask",
        _sdpa_values,
    ),
    _sdpa_test(
        "sdpa_mask",
        1,
        "visible",
        "a boolean mask (L, S) that broadcasts over the batch",
        _sdpa_mask,
    ),
    _sdpa_test(
        "sdpa_causal",
        2,
        "visible",
        "is_causal=True with L == S",
        _sdpa_causal,
    ),
    _ms_test(
        "masked_softmax_dim",
        1,
        "hidden",
        "masked softmax along dim=-2",
        _ms_dim,
    ),
    _ms_test(
        "masked_softmax_low_precision",
        1,
        "hidden",
        "float16 and bfloat16 scores with a fully masked row",
        _ms_low_precision,
    ),
    _ms_test(
        "masked_softmax_large_scores",
        1,
        "hidden",
        "scores of +-1000 with a mask",
        _ms_large,
    ),
    _ms_grad_explain_wrapper(),
    _sdpa_test(
        "sdpa_causal_rectangular",
        2,
        "hidden",
        "is_causal=True with L < S and L > S (top-left alignment)",
        _sdpa_rectangular,
    ),
    _sdpa_test(
        "sdpa_mask_and_causal",
        1,
        "hidden",
        "a mask and is_causal=True together: both must allow a key",
        _sdpa_mask_causal,
    ),
    _sdpa_test(
        "sdpa_fully_masked_query",
        1,
        "hidden",
        "a query whose mask row is all False gives a zero output row",
        _sdpa_empty,
    ),
    _sdpa_test(
        "sdpa_dtypes",
        1,
        "hidden",
        "float32 and bfloat16 inputs give an output of the same dtype",
        _sdpa_dtypes,
    ),
    _sdpa_test(
        "sdpa_large_scores",
        1,
        "hidden",
        "scores of several hundred: no overflow",
        _sdpa_large,
    ),
    b.autograd_test(
        name="sdpa_gradient",
        points=2,
        visibility="hidden",
        fn="scaled_dot_product_attention",
        description="autograd through your attention gives the right dq, dk, dv",
        noun="your scaled_dot_product_attention",
        case=_sdpa_grad_case,
        expect=_sdpa_expect,
        grads=_sdpa_grads,
        forbidden=FORBIDDEN,
    ),
)

ASSIGNMENT = Assignment(
    id="attention",
    title="Masked softmax and scaled dot-product attention",
    functions=("masked_softmax", "scaled_dot_product_attention"),
    tests=TESTS,
    spec=b.spec_text("attention", TESTS),
    package="attention",
)
