"""The tests of the `flash-attention` assignment: flash_forward, flash_backward and
the FlashAttention autograd Function."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from ..._model import Assignment, TestCase, Visibility
from .. import _builders as b
from .. import _common as c
from .._common import BF16, F32, F64, Candidate

FORBIDDEN = ("softmax", "sdpa", "softmaxbook", "entmax")
ALIGN = "bottom_right"
LOG2E = 1 / math.log(2)

RESCALE_HINT = (
    "That is the tiled sum without the rescale: when a new tile raises the running "
    "maximum from m to m_new, what was accumulated so far (the output and the sum l) "
    "was computed against the old maximum and must be multiplied by exp(m - m_new) "
    "before the new tile's terms are added."
)
LSE_BASE2_HINT = (
    "That logsumexp is in base 2 (log2 of the sum, e.g. from exp2 with scores scaled "
    "by log2(e)): return the natural log, lse = m + log(l), or divide by log2(e)."
)
LSE_NO_MAX_HINT = (
    "That is log(l) alone: l sums exp(s - m), so the logsumexp is m + log(l); "
    "add the running maximum back."
)
LSE_MAX_HINT = "That is the row maximum m; the logsumexp is m + log(l)."
LSE_UNSCALED_HINT = (
    "That is the logsumexp of the unscaled scores q k^T; take it of the scores the "
    "softmax sees, q k^T / sqrt(D)."
)
NORMALIZE_HINT = "Divide the accumulated output by the running sum l at the end."
ALIGN_HINT = (
    "That is the top-left alignment (key j for query i when j <= i). This assignment "
    "aligns the causal mask at the bottom right, as FlashAttention does: key j for "
    "query i when j <= i + S - L."
)
PARTIAL_HINT = (
    "The last, partial block of keys was skipped: when S is not a multiple of "
    "block_k, the last tile is k[..., j:S, :] (range(0, S, block_k) with "
    "min(j + block_k, S))."
)
EMPTY_HINT = (
    "A query that may see no key (causal with L > S) has every score at -inf: its "
    "running maximum stays -inf and exp(-inf - (-inf)) is nan. Such a row has "
    "output 0 and lse -inf: use 0 in place of an -inf maximum, and divide by l only "
    "where l > 0."
)
ROWSUM_HINT = (
    "dS = P * (dP - Delta) with Delta = rowsum(dO * O), one number per query: "
    "without that term dS = P * dP, as if the softmax's normalizer did not depend on "
    "the scores."
)
BACKWARD_NAN_HINT = (
    "nan appeared: for a query that sees no key, lse is -inf and s - lse is "
    "-inf - (-inf); replace that lse by 0 (its weights are then exp(-inf) = 0)."
)


# --- grader-side: the expectation and the likely mistakes ---------------------------


def _kw(case: dict[str, Any]) -> tuple[bool, int, int]:
    kw = case["kwargs"]
    causal = bool(kw.get("is_causal", False))
    return causal, int(kw.get("block_q", 16)), int(kw.get("block_k", 16))


def _lse_dtype(dtype: torch.dtype) -> torch.dtype:
    return F32 if dtype in (torch.float16, BF16) else dtype


def _expect_forward(case: dict[str, Any]) -> list[tuple[str, Tensor, torch.dtype]]:
    from .. import _refs

    q, k, v = case["args"]
    out, lse, _ = _refs.attention(q, k, v, None, _kw(case)[0], ALIGN)
    return [("out", out, q.dtype), ("lse", lse, _lse_dtype(q.dtype))]


def _tiled(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    causal: bool,
    bq: int,
    bk: int,
    rescale_acc: bool = True,
    rescale_l: bool = True,
    align: str = ALIGN,
    last_block: bool = True,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The tiled forward pass in float64, with a mistake switched on or off:
    (out, lse, m, l)."""
    from .. import _refs

    q, k, v = q.to(F64), k.to(F64), v.to(F64)
    L, S = q.shape[-2], k.shape[-2]
    stop = S if last_block else S // bk * bk
    s_all = _refs.scores(q, k)
    if causal:
        s_all = s_all.masked_fill(~_refs.causal_keep(L, S, align), -math.inf)
    m = torch.full(q.shape[:-1] + (1,), -math.inf, dtype=F64)
    l = torch.zeros_like(m)  # noqa: E741
    acc = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=F64)
    for j0 in range(0, stop, bk):
        s = s_all[..., j0 : j0 + bk]
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        m_safe = m_new.nan_to_num(neginf=0.0)
        p = torch.exp(s - m_safe)
        alpha = torch.exp(m - m_safe)
        l = (l * alpha if rescale_l else l) + p.sum(-1, keepdim=True)  # noqa: E741
        acc = (acc * alpha if rescale_acc else acc) + p @ v[..., j0 : j0 + bk, :]
        m = m_new
    with torch.no_grad():
        out = torch.where(l > 0, acc / l, 0.0)
        lse = (m.nan_to_num(neginf=0.0) + torch.log(l)).squeeze(-1)
    return out, lse, m.squeeze(-1), l.squeeze(-1)


def _forward_candidates(case: dict[str, Any]) -> list[Candidate]:
    q, k, v = case["args"]
    causal, bq, bk = _kw(case)
    found: list[Candidate] = []
    for acc, l_ in ((False, True), (False, False), (True, False)):
        out, lse, _, _ = _tiled(q, k, v, causal, bq, bk, acc, l_)
        found += [("out", out, RESCALE_HINT), ("lse", lse, RESCALE_HINT)]
    out, lse, m, l = _tiled(q, k, v, causal, bq, bk)  # noqa: E741
    scale = math.sqrt(q.shape[-1])
    unscaled, unscaled_lse, _, _ = _tiled(q * scale, k, v, causal, bq, bk)
    found += [
        ("lse", lse * LOG2E, LSE_BASE2_HINT),
        ("lse", torch.log(l), LSE_NO_MAX_HINT),
        ("lse", m, LSE_MAX_HINT),
        ("lse", unscaled_lse, LSE_UNSCALED_HINT),
        ("out", out * l.unsqueeze(-1), NORMALIZE_HINT),
        ("out", unscaled, "Scale the scores by 1 / sqrt(D), D = q.shape[-1]."),
    ]
    if causal and q.shape[-2] != k.shape[-2]:
        top, top_lse, _, _ = _tiled(q, k, v, causal, bq, bk, align="top_left")
        found += [("out", top, ALIGN_HINT), ("lse", top_lse, ALIGN_HINT)]
    if k.shape[-2] % bk:
        cut, cut_lse, _, _ = _tiled(q, k, v, causal, bq, bk, last_block=False)
        found += [("out", cut, PARTIAL_HINT), ("lse", cut_lse, PARTIAL_HINT)]
    return found


def _forward_explain(case: dict[str, Any], got: Tensor, want: Tensor) -> str:
    if bool(got.isnan().any()):
        return EMPTY_HINT
    return ""


def _case(
    q: Tensor, k: Tensor, v: Tensor, note: str = "", **kwargs: Any
) -> dict[str, Any]:
    dtype = c.dtype_name(q.dtype) + (f", {note}" if note else "")
    where = f"random q {c.shape_of(q)}, k {c.shape_of(k)}, v {c.shape_of(v)} ({dtype})"
    shown = ", ".join(f"{key}={value}" for key, value in kwargs.items())
    where += f", {shown}" if shown else ""
    return {"args": [q, k, v], "kwargs": kwargs, "where": where}


def _qkv(
    seed: int, L: int, S: int, batch: tuple[int, ...] = (2,), D: int = 8
) -> tuple[Tensor, Tensor, Tensor]:
    g = c.generator(seed)
    return c.randn(g, *batch, L, D), c.randn(g, *batch, S, D), c.randn(g, *batch, S, 4)


def _cast(
    t: tuple[Tensor, Tensor, Tensor], dtype: torch.dtype = F32
) -> tuple[Tensor, Tensor, Tensor]:
    return t[0].to(dtype), t[1].to(dtype), t[2].to(dtype)


def _forward_test(
    name: str, points: float, vis: Visibility, desc: str, cases: Any
) -> TestCase:
    return b.call_test(
        name=name,
        points=points,
        visibility=vis,
        fn="flash_forward",
        description=desc,
        noun="your flash_forward",
        cases=cases,
        expect=_expect_forward,
        candidates=_forward_candidates,
        explain=_forward_explain,
        forbidden=FORBIDDEN,
    )


# --- flash_backward -----------------------------------------------------------------


def _backward_case(
    seed: int, L: int, S: int, causal: bool, dtype: torch.dtype = F64
) -> dict[str, Any]:
    from .. import _refs

    q, k, v = (t.to(dtype) for t in _qkv(seed, L, S))
    out, lse, _ = _refs.attention(q, k, v, None, causal, ALIGN)
    grad = c.randn(c.generator(seed + 1), 2, L, 4).to(dtype)
    case = _case(q, k, v)
    note = ", is_causal=True" if causal else ""
    case["where"] += f"{note}, their out and lse, and a random grad_output"
    case["args"] = [q, k, v, out.to(dtype), lse.to(_lse_dtype(dtype)), grad]
    case["kwargs"] = {"is_causal": True} if causal else {}
    return case


def _expect_backward(case: dict[str, Any]) -> list[tuple[str, Tensor, torch.dtype]]:
    from .. import _refs

    q, k, v, _, _, grad = case["args"]
    found = _refs.attention_grads(q, k, v, grad, None, _kw(case)[0], ALIGN)
    return [(n, t, q.dtype) for n, t in zip(("dq", "dk", "dv"), found)]


def _backward_candidates(case: dict[str, Any]) -> list[Candidate]:
    from .. import _refs

    q, k, v, _, _, grad = case["args"]
    out, _, p = _refs.attention(q, k, v, None, _kw(case)[0], ALIGN)
    v64, g64 = v.to(F64), grad.to(F64)
    no_rowsum = _refs.grads_from(q, k, p, _refs.ds_of(p, out, v64, g64, False), g64)
    unscaled = _refs.grads_from(q, k, p, _refs.ds_of(p, out, v64, g64), g64, False)
    hint = "The scores are q k^T / sqrt(D): dq and dk carry the factor 1 / sqrt(D)."
    return [
        ("dq", no_rowsum[0], ROWSUM_HINT),
        ("dk", no_rowsum[1], ROWSUM_HINT),
        ("dq", unscaled[0], hint),
        ("dk", unscaled[1], hint),
    ]


def _backward_test(
    name: str, points: float, vis: Visibility, desc: str, cases: Any
) -> TestCase:
    return b.call_test(
        name=name,
        points=points,
        visibility=vis,
        fn="flash_backward",
        description=desc,
        noun="your flash_backward",
        cases=cases,
        expect=_expect_backward,
        candidates=_backward_candidates,
        explain=lambda case, got, want: (
            BACKWARD_NAN_HINT if bool(got.isnan().any()) else ""
        ),
        forbidden=FORBIDDEN,
    )


# --- the forward pass's memory ------------------------------------------------------

# L = S = 128 and a batch of 2: the scores of one sequence have L * L = 16384 entries,
# q, k and v 2048 each, a (2, 16, 16) tile 512, and even the scores of all queries
# against one block of 16 keys, (2, L, 16), 4096; the limit is half of L * L.
MEMORY_L = 128
MEMORY_LIMIT = MEMORY_L * MEMORY_L // 2


def _memory_case() -> dict[str, Any]:
    return _case(*_cast(_qkv(70, MEMORY_L, MEMORY_L)), block_q=16, block_k=16)


_PEAK: list[type] = []


def _peak_mode() -> Any:
    """A dispatch mode recording the largest storage any aten operator returns."""
    if not _PEAK:
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        class Peak(TorchDispatchMode):
            size = 0
            which = ""

            @classmethod
            def _should_skip_dynamo(cls) -> bool:
                # Otherwise torch wraps __torch_dispatch__ in torch._dynamo.disable,
                # and the first operator imports torch._dynamo (seconds).
                return False

            def __torch_dispatch__(
                self,
                func: Any,
                types: Any,
                args: Any = (),
                kwargs: dict[str, Any] | None = None,
            ) -> Any:
                result = func(*args, **(kwargs or {}))
                for t in tree_flatten(result)[0]:
                    if isinstance(t, Tensor):
                        try:
                            size = t.untyped_storage().nbytes() // t.element_size()
                        except Exception:
                            size = t.numel()
                        if size > self.size:
                            self.size = size
                            self.which = f"of shape {tuple(t.shape)} ({func})"
                return result

        _PEAK.append(Peak)
    return _PEAK[0]()


def _memory_run(
    functions: Mapping[str, Callable[..., Any]], inputs: dict[str, Any]
) -> dict[str, Any]:
    case = inputs["cases"][0]
    peak = _peak_mode()
    with peak:
        entry = c.attempt(functions["flash_forward"], *case["args"], **case["kwargs"])
    return {"results": [entry], "largest": peak.size, "which": peak.which}


def _memory_judge(inputs: dict[str, Any], outputs: dict[str, Any]) -> str | None:
    case = inputs["cases"][0]
    message = b.judge_call(
        case,
        outputs["results"][0],
        _expect_forward(case),
        noun="your flash_forward",
        candidates=lambda: _forward_candidates(case),
    )
    if message:
        return message
    if int(outputs.get("largest", 0)) >= MEMORY_LIMIT:
        return (
            f"With {case['where']}, your flash_forward made a tensor of "
            f"{outputs['largest']} entries, {outputs['which']}; the scores of one "
            f"sequence have L * S = {MEMORY_L * MEMORY_L}. The point of the tiles is "
            "never to hold the (L, S) scores or weights: keep one (block_q, block_k) "
            "tile at a time and carry only m, l and the output between tiles."
        )
    return None


# --- FlashAttention: what its node saves, and its gradients --------------------------


def _saves_run(
    functions: Mapping[str, Callable[..., Any]], inputs: dict[str, Any]
) -> dict[str, Any]:
    case = inputs["cases"][0]
    q, k, v = (t.clone().requires_grad_(True) for t in case["args"])
    try:
        fa: Any = functions["FlashAttention"]
        out = fa.apply(q, k, v, case["kwargs"]["is_causal"])
        node = out.grad_fn
        if node is None:
            return {"results": [{"value": c.plain(out)}], "saved": "<no graph>"}
        saved = list(getattr(node, "saved_tensors", ()))
        attributes = {
            key: c.plain(value)
            for key, value in vars(node).items()
            if isinstance(value, Tensor) and value.numel() > 1
        }
    except Exception as error:
        return {"results": [{"raised": c.describe_error(error)}]}
    return {
        "results": [{"value": c.plain(out)}],
        "saved": c.plain(saved),
        "attributes": attributes,
    }


def _saves_judge(inputs: dict[str, Any], outputs: dict[str, Any]) -> str | None:
    case = inputs["cases"][0]
    noun = "FlashAttention.apply"
    expected = _expect_forward(case)
    message = b.judge_call(case, outputs["results"][0], expected[0][1], noun=noun)
    if message:
        return message
    where = case["where"]
    saved = outputs.get("saved")
    if not isinstance(saved, dict) or not saved.get("items"):
        return (
            f"With {where}, the output of {noun} has no saved tensors: save what the "
            "backward pass needs with ctx.save_for_backward(q, k, v, out, lse)."
        )
    q, k, v = case["args"]
    L, S = q.shape[-2], k.shape[-2]
    named = {"q": q, "k": k, "v": v, "out": expected[0][1], "lse": expected[1][1]}
    found, others = [], []
    for t in [*saved["items"], *outputs.get("attributes", {}).values()]:
        if not isinstance(t, Tensor):
            continue
        name = next(
            (
                n
                for n, want in named.items()
                if t.shape == want.shape and c.close(t, want, c.TOL[F32])
            ),
            None,
        )
        if name is None:
            others.append(t)
        else:
            found.append(name)
    for t in others:
        if tuple(t.shape[-2:]) == (L, S):
            return (
                f"With {where}, {noun}'s node saves a tensor of shape "
                f"{c.shape_of(t)}: the (L, S) weights or scores. Save the logsumexp "
                "(..., L) instead and recompute each tile's weights in backward: "
                "P = exp(q k^T / sqrt(D) - lse)."
            )
    missing = [n for n in named if n not in found]
    shapes = ", ".join(c.shape_of(t) for t in saved["items"] if isinstance(t, Tensor))
    if missing:
        return (
            f"With {where}, {noun}'s node does not save {', '.join(missing)} "
            f"(it saves tensors of shapes {shapes}): save exactly "
            "ctx.save_for_backward(q, k, v, out, lse), lse the natural logsumexp of "
            "each query's scores."
        )
    if others:
        return (
            f"With {where}, {noun}'s node also keeps a tensor of shape "
            f"{c.shape_of(others[0])}: save only q, k, v, out and lse (everything "
            "else is recomputed in backward)."
        )
    return None


def _autograd_case() -> dict[str, Any]:
    q, k, v = _qkv(71, 24, 24)
    case = _case(q, k, v, is_causal=True)
    case["where"] += " and a random grad_output"
    grad = c.randn(c.generator(72), 2, 24, 4)
    case["args"] = [q, k, v, True]
    case["kwargs"] = {}
    return {**case, "wrt": [0, 1, 2], "names": ["q", "k", "v"], "grad": grad}


def _autograd_expect(case: dict[str, Any]) -> Tensor:
    from .. import _refs

    q, k, v, causal = case["args"]
    return _refs.attention(q, k, v, None, causal, ALIGN)[0]


def _autograd_grads(case: dict[str, Any]) -> list[Tensor]:
    from .. import _refs

    q, k, v, causal = case["args"]
    return list(_refs.attention_grads(q, k, v, case["grad"], None, causal, ALIGN))


TESTS: tuple[TestCase, ...] = (
    _forward_test(
        "flash_forward_values",
        2,
        "visible",
        "out and lse for q, k (2, 32, 8), v (2, 32, 4) in float32, blocks of 16",
        lambda: [_case(*_cast(_qkv(61, 32, 32)))],
    ),
    _forward_test(
        "flash_forward_ragged",
        2,
        "visible",
        "L = 37 and S = 29, not multiples of the blocks (16, 16) and (8, 5)",
        lambda: [
            _case(*_qkv(62, 37, 29)),
            _case(*_qkv(62, 37, 29), block_q=8, block_k=5),
        ],
    ),
    _forward_test(
        "flash_forward_causal",
        2,
        "visible",
        "is_causal=True with L = S = 40, blocks of 16",
        lambda: [_case(*_qkv(63, 40, 40), is_causal=True)],
    ),
    _backward_test(
        "flash_backward_values",
        2,
        "visible",
        "dq, dk, dv from q, k, v, out, lse and grad_output (L = S = 24)",
        lambda: [_backward_case(64, 24, 24, False)],
    ),
    TestCase(
        name="flash_autograd_saves",
        points=2,
        visibility="visible",
        functions=("FlashAttention",),
        description="FlashAttention.apply gives the output, and its node saves "
        "q, k, v, out and lse only",
        make_inputs=lambda: {"cases": [_case(*_qkv(65, 24, 20), is_causal=False)]},
        run=_saves_run,
        judge=b.robust(_saves_judge),
        forbidden=FORBIDDEN,
    ),
    _forward_test(
        "flash_forward_block_sizes",
        2,
        "hidden",
        "the same result for blocks (1, 1), (4, 7), (5, 3) and (32, 32)",
        lambda: [
            _case(*_qkv(66, 20, 20), is_causal=True, block_q=bq, block_k=bk)
            for bq, bk in ((1, 1), (4, 7), (5, 3), (32, 32))
        ],
    ),
    _forward_test(
        "flash_forward_causal_rectangular",
        2,
        "hidden",
        "is_causal=True with L = 24 < S = 40: bottom-right alignment",
        lambda: [_case(*_qkv(67, 24, 40), is_causal=True)],
    ),
    _forward_test(
        "flash_forward_fully_masked_rows",
        2,
        "hidden",
        "is_causal=True with L = 40 > S = 24: rows that see no key give 0 and -inf",
        lambda: [_case(*_qkv(68, 40, 24), is_causal=True)],
    ),
    _forward_test(
        "flash_forward_bfloat16",
        2,
        "hidden",
        "bfloat16 q, k, v: out in bfloat16, lse in float32",
        lambda: [_case(*_cast(_qkv(69, 40, 40, (2, 2), 16), BF16), is_causal=True)],
    ),
    TestCase(
        name="flash_forward_memory",
        points=2,
        visibility="hidden",
        functions=("flash_forward",),
        description="the forward pass never holds the (L, S) scores (L = S = 128)",
        make_inputs=lambda: {"cases": [_memory_case()]},
        run=_memory_run,
        judge=b.robust(_memory_judge),
        forbidden=FORBIDDEN,
    ),
    _backward_test(
        "flash_backward_causal",
        2,
        "hidden",
        "the backward pass with is_causal=True, L = S = 40",
        lambda: [_backward_case(73, 40, 40, True)],
    ),
    _backward_test(
        "flash_backward_fully_masked_rows",
        1,
        "hidden",
        "is_causal=True with L = 40 > S = 24: zero gradients, no nan",
        lambda: [_backward_case(74, 40, 24, True)],
    ),
    _backward_test(
        "flash_backward_bfloat16",
        1,
        "hidden",
        "bfloat16 inputs give bfloat16 gradients",
        lambda: [_backward_case(75, 24, 24, True, BF16)],
    ),
    b.autograd_test(
        name="flash_autograd_gradients",
        points=2,
        visibility="hidden",
        fn="FlashAttention",
        method="apply",
        description="backward through FlashAttention.apply(q, k, v, True) gives the "
        "gradients of attention",
        noun="FlashAttention.apply",
        case=_autograd_case,
        expect=_autograd_expect,
        grads=_autograd_grads,
        forbidden=FORBIDDEN,
    ),
)

ASSIGNMENT = Assignment(
    id="flash-attention",
    title="FlashAttention: the tiled forward and backward passes",
    functions=("flash_forward", "flash_backward", "FlashAttention"),
    tests=TESTS,
    spec=b.spec_text("flash_attention", TESTS),
    package="flash_attention",
)
