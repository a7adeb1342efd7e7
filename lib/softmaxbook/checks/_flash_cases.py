"""The cases of the FlashAttention checkers: one call of a student's forward pass,
backward pass or autograd Function on one input, compared with float64 attention;
the memory of a forward pass; what an autograd graph saves."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import Tensor

from ._flash import (
    Largest,
    attention64,
    block_kwargs,
    block_style,
    block_words,
    graph_nodes,
    is_function_node,
    lse_candidates,
    masked,
    output_candidates,
    recording,
    saved_by,
    scores64,
)
from ._flash_hints import (
    backward_candidates,
    grad_explain,
    lse_explain,
    lse_shape_hint,
    memory_message,
    output_explain,
)
from ._inputs import BF16, F32, F64, TOL, close, randn
from ._report import fmt, function_name
from ._session import Candidate, Session

# The tile sizes tried when a function takes them: square and not, and lengths
# 37, 45 that none divides. Guessed when it does not (for the diagnosis alone).
PAIRS = [(16, 16), (16, 32), (32, 16)]
ONES = [(16, 16), (32, 32)]
GUESSES = [(16, 16), (32, 32), (64, 64), (128, 128)]


def configs_of(style: str) -> list[tuple[int, int]]:
    return PAIRS if style == "pair" else ONES if style == "one" else [(0, 0)]


def _tolerance_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """The least precise of ``dtypes`` (the one with the largest tolerance)."""
    return max(dtypes, key=lambda d: TOL.get(d, TOL[BF16])[0])


class ForwardCase:
    """The checks of one forward pass: what fn takes, and what it returned."""

    def __init__(self, session: Session, fn: Callable[..., Any], lse: bool | None):
        self.session, self.lse = session, lse
        self.style = block_style(fn)
        self.returned_lse = False  # some call returned (out, lse)

    def case(
        self,
        label: str,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        causal: bool = False,
        mask: Tensor | None = None,
        blocks: tuple[int, int] = (0, 0),
    ) -> bool:
        """Call fn on one input and compare; False when nothing usable came back."""
        session = self.session
        kwargs: list[tuple[str, Any]] = [("is_causal", True)] if causal else []
        kwargs += [("mask", mask)] if mask is not None else []
        kwargs += block_kwargs(self.style, *blocks)
        args = [("q", q), ("k", k), ("v", v)]
        done, raw = session.invoke(label, args, kwargs)
        if not done:
            return False
        out_shape = tuple(q.shape[:-1]) + (v.shape[-1],)
        pair = isinstance(raw, (tuple, list)) and len(raw) == 2
        if self.lse is True and not pair:
            session.problem(
                ("type", "out alone"),
                label,
                f"With {label}, {session.noun} returned "
                + (
                    "the output alone"
                    if isinstance(raw, Tensor) and tuple(raw.shape) == out_shape
                    else f"a {type(raw).__name__}"
                )
                + "; return the pair (out, lse): the logsumexp of each query row, "
                "lse = m + log(l) after the last tile, is what the backward pass "
                "needs to recompute the weights.",
            )
            return isinstance(raw, Tensor)
        if pair and self.lse is not False:
            shapes = [out_shape, tuple(q.shape[:-1])]
            got = session.accept(
                label, args, kwargs, raw, shapes, 2, lse_shape_hint, "(out, lse)"
            )
        else:
            got = session.accept(label, args, kwargs, raw, [out_shape])
        if got is None:
            return False
        out, lse = got if pair and self.lse is not False else (got, None)
        s = masked(scores64(q, k, causal), mask)
        want_out, want_lse = attention64(s, v)
        guesses = [blocks] if self.style else GUESSES
        if session.dtype(label, out, q.dtype):
            session.values(
                label,
                out,
                want_out,
                q.dtype,
                what="the output",
                candidates=lambda: output_candidates(q, k, v, causal, mask, guesses),
                explain=output_explain(mask, s),
            )
        if lse is not None:
            self.returned_lse = True
            session.values(
                label,
                lse,
                want_lse,
                _tolerance_dtype(lse.dtype, q.dtype),
                key="lse",
                what="the logsumexp",
                candidates=lambda: lse_candidates(q, k, causal, mask, guesses),
                explain=lse_explain,
            )
        return True


def check_memory(
    session: Session, check: ForwardCase, fn: Callable[..., Any], g: torch.Generator
) -> None:
    """The largest tensor the forward creates is smaller than the L x S scores."""
    L, S = 384, 320
    q, k, v = randn(g, 1, L, 16), randn(g, 1, S, 16), randn(g, 1, S, 16)
    blocks = (64, 64) if check.style else (0, 0)
    label = f"q (1, {L}, 16), k and v (1, {S}, 16) (float32)" + block_words(
        check.style, *blocks
    )
    mode = Largest()
    session.fn = recording(fn, mode)
    try:
        check.case(label, q.float(), k.float(), v.float(), blocks=blocks)
    finally:
        session.fn = fn
    session.section = name = f"{label}: the largest tensor created"
    try:
        session.check(name)
        if not session.passed(label):
            session.fail(
                label,
                f"With {label}, the memory of {session.noun} was not checked: "
                "its result is wrong (fix that first).",
            )
        elif mode.numel >= L * S:
            session.problem(
                ("memory",), label, memory_message(label, session.noun, mode, L, S)
            )
    finally:
        session.section = None


def forward_checked(check: ForwardCase, causal: bool, masks: bool) -> list[str]:
    blocks = {"pair": "tiles (16, 16), (16, 32), (32, 16)", "one": "tiles 16 and 32"}
    checked = [
        "values on (B, L, D) and (B, H, L, D) inputs with L != S and D != Dv",
        "lengths 37 and 45, which no tile size divides"
        + (f", with {blocks[check.style]}" if check.style else ""),
        "scores that rise along the keys (the rescale)",
        "scores of +-1000 (overflow)",
    ]
    if causal:
        checked.append("is_causal=True")
    if masks:
        checked.append("a mask with a query that may attend to nothing")
    checked += [
        "the dtype kept (float64, float32, bfloat16)",
        "the inputs not modified",
        "no tensor of L x S entries created",
    ]
    if check.returned_lse:
        checked.insert(1, "the logsumexp (natural log)")
    else:
        checked.append("not checked: the logsumexp (your function returns no lse)")
    return checked


def backward_case(
    session: Session,
    style: str,
    label: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: torch.Generator,
    *,
    causal: bool = False,
    blocks: tuple[int, int] = (0, 0),
) -> bool:
    s = scores64(q, k, causal)
    out64, lse64 = attention64(s, v)
    low = q.dtype in (torch.float16, BF16)
    out, lse = out64.to(q.dtype), lse64.to(F32 if low else q.dtype)
    grad = randn(g, *out.shape).to(q.dtype)
    kwargs: list[tuple[str, Any]] = [("is_causal", True)] if causal else []
    kwargs += block_kwargs(style, *blocks)
    args = [("q", q), ("k", k), ("v", v), ("out", out), ("lse", lse)]
    args.append(("grad_output", grad))
    shapes = [q.shape, k.shape, v.shape]
    got = session.call(
        label, args, kwargs, shapes=shapes, outputs=3, returns="(dq, dk, dv)"
    )
    if got is None:
        return False
    # The reference: float64 autograd through attention, from the rounded inputs.
    leaves = [t.to(F64).requires_grad_(True) for t in (q, k, v)]
    want = torch.autograd.grad(
        attention64(scores64(leaves[0], leaves[1], causal), leaves[2])[0],
        leaves,
        grad.to(F64),
    )
    # The error of a gradient grows with the size of the sums it adds up.
    magnitude = math.sqrt(k.shape[-2]) / 4 if low else 1.0
    found = backward_candidates(q, k, v, grad, causal)
    for name, t, w, index in zip(("dq", "dk", "dv"), got, want, range(3)):
        if not session.dtype(label, t, (q, k, v)[index].dtype):
            continue
        session.values(
            label,
            t,
            w,
            q.dtype,
            key="grad",
            what=name,
            magnitude=max(1.0, magnitude),
            candidates=partial(_one_gradient, found, index),
            explain=grad_explain(name),
        )
    return True


def _one_gradient(
    found: list[tuple[str, tuple[Tensor, Tensor, Tensor], str]], index: int
) -> list[Candidate]:
    """The candidates of ``backward_candidates`` for one of dq, dk, dv."""
    return [(key, grads[index], hint) for key, grads, hint in found]


# -- an autograd Function -------------------------------------------------------------


def as_callable(obj: object) -> tuple[Callable[..., Any], str]:
    """``(fn(q, k, v, is_causal=False), name)`` for a ``torch.autograd.Function``
    subclass (called as ``apply(q, k, v, is_causal)``) or a function."""
    if isinstance(obj, type) and issubclass(obj, torch.autograd.Function):
        cls = obj

        def apply(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Any:
            return cls.apply(q, k, v, is_causal)

        return apply, cls.__name__
    if not callable(obj):
        raise TypeError(
            "cls_or_fn must be a torch.autograd.Function subclass or a function, "
            f"got {type(obj).__name__}"
        )
    return obj, function_name(obj)


def output_only(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, returning ``out`` where it returns ``(out, lse)``."""

    def out(*args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        if (
            isinstance(result, (tuple, list))
            and len(result) == 2
            and all(isinstance(t, Tensor) for t in result)
            and result[1].dim() == result[0].dim() - 1
        ):
            return result[0]
        return result

    return out


def function_case(
    session: Session, label: str, q: Tensor, k: Tensor, v: Tensor, causal: bool
) -> bool:
    """The output of a Function on one input (``is_causal=True`` as a keyword)."""
    s = scores64(q, k, causal)
    return session.run(
        label,
        [("q", q), ("k", k), ("v", v)],
        [("is_causal", True)] if causal else [],
        want=attention64(s, v)[0],
        dtype=q.dtype,
        shape=tuple(q.shape[:-1]) + (v.shape[-1],),
        candidates=lambda: output_candidates(q, k, v, causal, None, GUESSES),
        explain=output_explain(None, s),
    )


def check_saved(session: Session, label: str, q: Tensor, k: Tensor, v: Tensor) -> None:
    """What the output's autograd graph keeps for the backward pass: the logsumexp
    (one number per query row), and no tensor of the L x S weights."""
    session.section = name = f"{label}: what the backward saves"
    try:
        session.check(name)
        if not session.passed(label):
            session.fail(
                label,
                f"With {label}, what {session.noun} saves was not checked: its "
                "output is wrong (fix that first).",
            )
            return
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        done, out = session.invoke(label, list(zip("qkv", leaves)))
        if not done:
            return
        if not isinstance(out, Tensor) or out.grad_fn is None:
            session.problem(
                ("no graph",),
                label,
                f"With {label}, the output of {session.noun} has no autograd graph "
                "(no grad_fn): return the output of your Function's apply.",
            )
            return
        _judge_saved(session, label, out, q, k)
    finally:
        session.section = None


def _judge_saved(
    session: Session, label: str, out: Tensor, q: Tensor, k: Tensor
) -> None:
    nodes = list(graph_nodes(out.grad_fn))
    custom = [n for n in nodes if is_function_node(n)]
    L, S = q.shape[-2], k.shape[-2]
    rows = tuple(q.shape[:-1])
    batch = math.prod(rows[:-1])
    saved = [(n, t) for n in nodes for t in saved_by(n) if t.is_floating_point()]
    big = [
        (n, t)
        for n, t in saved
        if tuple(t.shape[-2:]) == (L, S) or t.numel() >= batch * L * S
    ]
    if big:
        node, t = big[0]
        who = (
            f"the node of your autograd Function ({type(node).__name__})"
            if is_function_node(node)
            else f"torch's {type(node).__name__}, recorded from your forward's "
            "operations" + ("" if custom else " (no autograd Function in the graph),")
        )
        session.problem(
            ("saved", "weights"),
            label,
            f"With {label}, {who} saves a tensor of shape {tuple(t.shape)}: "
            f"{L} x {S} per batch element, the attention weights or scores. "
            f"FlashAttention saves only q, k, v, the output and the logsumexp "
            f"(one number per query row, shape {rows}) and recomputes each tile "
            f"of P = exp(q @ k^T * scale - lse) in the backward pass: "
            f"ctx.save_for_backward(q, k, v, out, lse).",
        )
        return
    if not custom:
        session.problem(
            ("saved", "no function"),
            label,
            f"With {label}, the output of {session.noun} comes from torch's own "
            f"operations ({type(out.grad_fn).__name__}), not from an autograd "
            "Function: write the forward and backward passes as a "
            "torch.autograd.Function whose forward saves q, k, v, out and lse "
            "with ctx.save_for_backward.",
        )
        return
    want = torch.logsumexp(scores64(q, k, False), dim=-1)
    per_row = [
        t.detach().reshape(rows).to(F64) for _, t in saved if t.numel() == want.numel()
    ]
    atol, rtol = TOL[F32]
    if any(bool(close(t, want, atol, rtol).all()) for t in per_row):
        return
    if per_row:
        hint = next(
            (
                h
                for _, wrong, h in lse_candidates(q, k, False, None, GUESSES)
                for t in per_row
                if bool(close(t, wrong, atol, rtol).all())
            ),
            "Save the logsumexp, lse = m + log(l), in natural log.",
        )
        session.problem(
            ("saved", "lse"),
            label,
            f"With {label}, your Function's node saves one number per query row, "
            f"{fmt(per_row[0][(0,) * (len(rows) - 1)])} in row 0, but not the "
            f"logsumexp, {fmt(want[(0,) * (len(rows) - 1)])}. {hint}",
        )
        return
    session.problem(
        ("saved", "no lse"),
        label,
        f"With {label}, your Function's node saves no tensor of one number per "
        f"query row, {rows}: save the logsumexp lse = m + log(l) with "
        "ctx.save_for_backward(q, k, v, out, lse), so that the backward pass "
        "recomputes P = exp(q @ k^T * scale - lse) tile by tile.",
    )
