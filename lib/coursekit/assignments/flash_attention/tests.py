"""The tests of the `flash-attention` assignment: flash_forward, flash_backward and
the FlashAttention autograd Function."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from ..._model import Assignment, TestCase, Visibility
from .. import _builders as b
from .. import _common as c
from .._common import BF16, F32, F64
from . import _mistakes as m

FORBIDDEN = ("softmax", "sdpa", "softmaxbook", "entmax")

# --- grader-side: the expectation and the likely mistakes ---------------------------


def _expect_forward(case: dict[str, Any]) -> list[tuple[str, Tensor, torch.dtype]]:
    from .. import _refs

    q, k, v = case["args"]
    out, lse, _ = _refs.attention(q, k, v, None, m.options(case)[0], m.ALIGN)
    return [("out", out, q.dtype), ("lse", lse, m.lse_dtype(q.dtype))]


def _forward_explain(case: dict[str, Any], got: Tensor, want: Tensor) -> str:
    if bool(got.isnan().any()):
        return m.EMPTY_HINT
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
        candidates=m.forward_candidates,
        explain=_forward_explain,
        forbidden=FORBIDDEN,
    )


# --- flash_backward -----------------------------------------------------------------


def _backward_case(
    seed: int, L: int, S: int, causal: bool, dtype: torch.dtype = F64
) -> dict[str, Any]:
    from .. import _refs

    q, k, v = (t.to(dtype) for t in _qkv(seed, L, S))
    out, lse, _ = _refs.attention(q, k, v, None, causal, m.ALIGN)
    grad = c.randn(c.generator(seed + 1), 2, L, 4).to(dtype)
    case = _case(q, k, v)
    note = ", is_causal=True" if causal else ""
    case["where"] += f"{note}, their out and lse, and a random grad_output"
    case["args"] = [q, k, v, out.to(dtype), lse.to(m.lse_dtype(dtype)), grad]
    case["kwargs"] = {"is_causal": True} if causal else {}
    return case


def _expect_backward(case: dict[str, Any]) -> list[tuple[str, Tensor, torch.dtype]]:
    from .. import _refs

    q, k, v, _, _, grad = case["args"]
    found = _refs.attention_grads(q, k, v, grad, None, m.options(case)[0], m.ALIGN)
    return [(n, t, q.dtype) for n, t in zip(("dq", "dk", "dv"), found)]


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
        candidates=m.backward_candidates,
        explain=lambda case, got, want: (
            m.BACKWARD_NAN_HINT if bool(got.isnan().any()) else ""
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
        candidates=lambda: m.forward_candidates(case),
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
    message = b.judge_call(
        case,
        outputs["results"][0],
        expected[0][1],
        noun=noun,
        candidates=lambda: m.apply_candidates(case),
    )
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
    return _refs.attention(q, k, v, None, causal, m.ALIGN)[0]


def _autograd_grads(case: dict[str, Any]) -> list[Tensor]:
    from .. import _refs

    q, k, v, causal = case["args"]
    return list(_refs.attention_grads(q, k, v, case["grad"], None, causal, m.ALIGN))


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
        candidates=m.apply_candidates,
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
