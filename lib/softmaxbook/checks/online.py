"""The checkers of a student's online softmax and of its merge of two partial
attention results."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .. import reference
from ._flash import parameters as _parameters
from ._gradient import compare_gradients
from ._hints import MAX_HINT, rows_sum_hint
from ._inputs import (
    BF16,
    F16,
    F32,
    F64,
    INF,
    close,
    generator,
    input_label,
    numpy64,
    randn,
    softmax64,
    tensor64,
)
from ._report import CheckReport, dtype_name, fmt
from ._session import Candidate, Session

__all__ = ["check_merge_attention_states", "check_online_softmax"]

_NAMES = ["out_a", "lse_a", "out_b", "lse_b"]


def _partial(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Attention of ``q`` over keys ``k`` (float64): the output and the logsumexp."""
    scores = numpy64(q) @ np.swapaxes(numpy64(k), -1, -2) / math.sqrt(q.shape[-1])
    return tensor64(reference.softmax(scores) @ numpy64(v)), tensor64(
        reference.logsumexp(scores)
    )


def _parts(
    q: Tensor, k: Tensor, v: Tensor, at: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(out_a, lse_a, out_b, lse_b)``: the keys before ``at``, and the others."""
    before, after = slice(None, at), slice(at, None)
    return (
        *_partial(q, k[..., before, :], v[..., before, :]),
        *_partial(q, k[..., after, :], v[..., after, :]),
    )


def _merge_np(oa: Tensor, la: Tensor, ob: Tensor, lb: Tensor) -> tuple[Tensor, Tensor]:
    """The merge from its definition, stable for any lse: for the extreme cases."""
    la_, lb_ = numpy64(la), numpy64(lb)
    lse = np.logaddexp(la_, lb_)
    with np.errstate(invalid="ignore"):
        wa = np.where(np.isneginf(la_), 0.0, np.exp(la_ - lse))[..., None]
        wb = np.where(np.isneginf(lb_), 0.0, np.exp(lb_ - lse))[..., None]
    return tensor64(wa * numpy64(oa) + wb * numpy64(ob)), tensor64(lse)


def _merge_t(oa: Tensor, la: Tensor, ob: Tensor, lb: Tensor) -> tuple[Tensor, Tensor]:
    lse = torch.logaddexp(la, lb)
    return (
        torch.exp(la - lse)[..., None] * oa + torch.exp(lb - lse)[..., None] * ob,
        lse,
    )


def _merge_candidates(
    oa: Tensor, la: Tensor, ob: Tensor, lb: Tensor
) -> list[Candidate]:
    return [
        (
            "unnormalized",
            (la.exp()[..., None] * oa + lb.exp()[..., None] * ob),
            "Weight each part by its share of the total mass, exp(lse_a - lse) and "
            "exp(lse_b - lse), which sum to one; exp(lse_a) and exp(lse_b) alone do "
            "not.",
        ),
        (
            "average",
            (oa + ob) / 2,
            "An average ignores how much softmax mass each part holds: weight each "
            "part by exp(lse_part - lse), with lse = log(exp(lse_a) + exp(lse_b)).",
        ),
    ]


def _merge_explain(got: Tensor, want: Tensor) -> str:
    overflow = bool((torch.isinf(got) & torch.isfinite(want)).any())
    if bool(got.isnan().any()) or overflow:
        if bool(torch.isneginf(want).any()) or bool((want == 0).all()):
            return (
                "When both parts are empty (lse = -inf), -inf - (-inf) is nan: an "
                "empty merge gives out = 0 and lse = -inf. Shift by the maximum only "
                "where it is finite."
            )
        return (
            "exp(lse) overflows or underflows for lse = +-1000: shift by "
            "m = max(lse_a, lse_b) before exp, as the stable softmax does, and "
            "compute lse = m + log(exp(lse_a - m) + exp(lse_b - m))."
        )
    return (
        "The merged logsumexp is log(exp(lse_a) + exp(lse_b)), and the merged output "
        "exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b."
    )


def _merge_run(
    session: Session,
    label: str,
    oa: Tensor,
    la: Tensor,
    ob: Tensor,
    lb: Tensor,
    want: tuple[Tensor, Tensor],
) -> bool:
    args = list(zip(_NAMES, (oa, la, ob, lb)))
    out = session.call(label, args, shapes=[oa.shape, la.shape], outputs=2)
    if out is None:
        return False
    out_got, lse_got = out
    if session.dtype(label, out_got, oa.dtype):
        f64 = [t.to(F64) for t in (oa, la, ob, lb)]
        session.values(
            label,
            out_got,
            want[0],
            oa.dtype,
            what="an output",
            candidates=lambda: _merge_candidates(*f64),
            explain=_merge_explain,
        )
    session.values(
        label, lse_got, want[1], la.dtype, what="an lse", explain=_merge_explain
    )
    return True


def check_merge_attention_states(
    fn: Callable[..., Any],
    *,
    numpy: bool = False,
    gradient: bool = True,
    device: torch.device | str | None = None,
) -> CheckReport:
    r"""Check a student's merge of two partial attention results over disjoint keys.

    ``fn(out_a, lse_a, out_b, lse_b)`` returns ``(out, lse)``: attention over
    the union of the keys of the two parts, as
    :func:`softmaxbook.merge_attention_states` does,

    .. math:: \mathrm{lse} = \log(e^{\mathrm{lse}_a} + e^{\mathrm{lse}_b}), \qquad
              o = e^{\mathrm{lse}_a - \mathrm{lse}} o_a
                  + e^{\mathrm{lse}_b - \mathrm{lse}} o_b .

    ``out_a``, ``out_b`` are ``(..., L, Dv)`` and ``lse_a``, ``lse_b``
    ``(..., L)``. Checked: agreement with attention over all the keys for
    two splits and batch shapes; both orders of the parts; logsumexps of
    ``+-1000`` (where ``exp(lse)`` overflows or underflows); an empty part
    (``lse = -inf``, output 0) and two empty parts (``out = 0``,
    ``lse = -inf``); dtype of the output and device kept; no input modified;
    the gradients with respect to all four inputs.

    Parameters
    ----------
    fn : callable
        The student's function, ``fn(out_a, lse_a, out_b, lse_b) -> (out, lse)``.
    numpy : bool
        ``fn`` takes and returns NumPy arrays (no gradient or device check).
    gradient : bool
        Also check the gradients by autograd through ``fn``.
    device : torch.device or str, optional
        Where to run the device check; default :func:`softmaxbook.get_device`.

    Returns
    -------
    CheckReport

    Examples
    --------
    >>> import softmaxbook as sb
    >>> sb.checks.check_merge_attention_states(sb.merge_attention_states).ok
    True
    """
    session = Session(fn, "your merge", numpy=numpy, gradient=gradient, device=device)
    g = generator(8)
    q, k, v = randn(g, 2, 3, 4), randn(g, 2, 6, 4), randn(g, 2, 6, 5)
    first, want = _parts(q, k, v, 2), _partial(q, k, v)
    split = "parts over keys 0-1 and 2-5 of random q (2, 3, 4), k, v (float64)"
    if not _merge_run(session, split, *first, want):
        session.stopped = True  # the rest runs for the score, unreported
    out_a, lse_a, out_b, lse_b = first
    _merge_run(
        session, split + ", in the other order", out_b, lse_b, out_a, lse_a, want
    )
    q2, k2, v2 = randn(g, 2, 2, 4, 8), randn(g, 2, 2, 9, 8), randn(g, 2, 2, 9, 3)
    _merge_run(
        session,
        "parts over keys 0-6 and 7-8 of random q (2, 2, 4, 8), k, v (float64)",
        *_parts(q2, k2, v2, 7),
        _partial(q2, k2, v2),
    )
    _check_extremes(session, g)
    for dtype in session.dtypes():
        oa, la, ob, lb = (t.to(dtype) for t in first)
        _merge_run(
            session,
            f"the parts of the first split in {dtype_name(dtype)}",
            oa,
            la,
            ob,
            lb,
            want,
        )
    session.on_device(
        "float32 parts on the accelerator",
        list(zip(_NAMES, [t.float() for t in first])),
        shapes=[out_a.shape, lse_a.shape],
        want=want,
        outputs=2,
    )
    if session.check_gradient:
        _check_gradients(session, g, split, first, want)
    checked = [
        "agreement with attention over all keys, two splits and batch shapes",
        "both orders",
        "lse of +-1000",
        "an empty part and two empty parts",
        f"the output's dtype kept ({session.dtype_words()})",
        "the device kept",
        "the inputs not modified",
    ] + (
        ["the gradients with respect to all four inputs"]
        if session.check_gradient
        else []
    )
    return session.report("check_merge_attention_states", checked)


def _check_extremes(session: Session, g: torch.Generator) -> None:
    """Logsumexps of +-1000, an empty part and two empty parts."""
    o1, o2 = randn(g, 2, 5), randn(g, 2, 5)
    for lse_a, lse_b, words in [
        ([1000.0, -1000.0], [999.0, -1001.0], "+-1000"),
        ([1.5, 0.3], [-INF, -INF], "part b empty"),
        ([-INF, -INF], [-INF, -INF], "both parts empty"),
    ]:
        la, lb = torch.tensor(lse_a, dtype=F64), torch.tensor(lse_b, dtype=F64)
        oa = torch.zeros_like(o1) if bool(torch.isinf(la).all()) else o1
        ob = torch.zeros_like(o2) if bool(torch.isinf(lb).all()) else o2
        _merge_run(
            session,
            f"outputs of shape (2, 5), lse_a {fmt(la)} and lse_b {fmt(lb)} ({words})",
            oa,
            la,
            ob,
            lb,
            _merge_np(oa, la, ob, lb),
        )


def _check_gradients(
    session: Session,
    g: torch.Generator,
    label: str,
    parts: tuple[Tensor, ...],
    want: tuple[Tensor, Tensor],
) -> None:
    """The gradients with respect to all four inputs."""
    out_a, lse_a = parts[:2]
    grads = randn(g, *out_a.shape), randn(g, *lse_a.shape)
    want_grads = torch.autograd.functional.vjp(_merge_t, parts, grads)[1]
    compare_gradients(
        session,
        label,
        list(zip(_NAMES, parts)),
        wrt=set(_NAMES),
        shapes=[out_a.shape, lse_a.shape],
        outputs=2,
        output_grads=list(grads),
        want=dict(zip(_NAMES, want_grads)),
        forward=want,
    )


# --------------------------------------------------------------------------------------
# The online softmax: a row streamed block by block

_STATE_HINT = (
    "l sums exp(x_j - m) over the row, m its maximum: l = l * exp(m - m_new) + "
    "sum_j exp(x_j - m_new) for each block, m = m_new."
)
_ONLINE_RESCALE_HINT = (
    "That is the online softmax without the rescale: when a block raises the running "
    "maximum from m to m_new, the sum so far was taken with exp(x - m) and must be "
    "multiplied by exp(m - m_new): l = l * exp(m - m_new) + sum_j exp(x_j - m_new)."
)
_INVERTED_HINT = (
    "The rescale factor is exp(m - m_new), which is <= 1 since the maximum only "
    "grows: you multiplied by its inverse, exp(m_new - m)."
)
_STALE_HINT = (
    "Each weight must use the final maximum and sum: after the last block, "
    "p_i = exp(x_i - m) / l. Weights written block by block used the running "
    "maximum of their block's time."
)
_BLOCK_MAX_HINT = (
    "m is the running maximum of the whole row, m_new = max(m, max of the block), "
    "not the maximum of the last block alone."
)
_NO_MAX_HINT = (
    "That is sum_j exp(x_j), without the maximum: it overflows for x = 1000. "
    + _STATE_HINT
)
_BLOCK_GUESSES = [2, 3, 4, 8, 16, 32, 64, 128]


def _online64(x: Tensor, block: int, rescale: str = "right") -> dict[str, Tensor]:
    """The running state over blocks of ``block`` entries, in float64, with the
    rescale done right, not at all (``"none"``) or inverted: the final ``m`` and
    ``l`` (``(..., 1)``) and each entry's shift at the time of its block."""
    x = x.to(F64)
    m = x.new_full(x.shape[:-1] + (1,), -INF)
    ell = torch.zeros_like(m)
    shifts = torch.zeros_like(x)
    block_max = m
    for b0 in range(0, x.shape[-1], block):
        t = x[..., b0 : b0 + block]
        block_max = t.amax(dim=-1, keepdim=True)
        m_new = torch.maximum(m, block_max)
        shift = m_new.masked_fill(torch.isneginf(m_new), 0.0)
        factor = {
            "right": torch.exp(m - shift),  # 0 while m = -inf, with l = 0
            "none": torch.ones_like(m),
            "inverted": torch.exp(shift - m).masked_fill(torch.isneginf(m), 1.0),
        }[rescale]
        ell = ell * factor + torch.exp(t - shift).sum(dim=-1, keepdim=True)
        shifts[..., b0 : b0 + block] = shift
        m = m_new
    return {"m": m, "l": ell, "shifts": shifts, "block max": block_max}


def _online_candidates(x: Tensor, blocks: list[int], what: str) -> list[Candidate]:
    """What the usual mistakes return for the weights, m or l."""
    found: list[Candidate] = []
    x64 = x.to(F64)
    for block in blocks:
        if block >= x.shape[-1]:
            continue
        right = _online64(x, block)
        shift = right["m"].masked_fill(torch.isneginf(right["m"]), 0.0)
        for rescale, hint in (
            ("none", _ONLINE_RESCALE_HINT),
            ("inverted", _INVERTED_HINT),
        ):
            ell = _online64(x, block, rescale)["l"]
            if what == "weights":
                found.append((rescale, torch.exp(x64 - shift) / _safe(ell), hint))
            elif what == "l":
                found.append((rescale, ell.squeeze(-1), hint))
        if what == "weights":
            stale = torch.exp(x64 - right["shifts"]) / _safe(right["l"])
            found.append(("stale", stale, _STALE_HINT))
        elif what == "m":
            found.append(("block max", right["block max"].squeeze(-1), _BLOCK_MAX_HINT))
    if what == "l":
        found.append(("no max", torch.exp(x64).sum(dim=-1), _NO_MAX_HINT))
    return found


def _safe(ell: Tensor) -> Tensor:
    """``l`` where it is > 0, else 1: a row of -inf divides 0 by it."""
    return torch.where(ell > 0, ell, torch.ones_like(ell))


def _online_explain(x: Tensor, weights: bool) -> Callable[[Tensor, Tensor], str]:
    empty = torch.isneginf(x).all(dim=-1)
    some_inf = bool(torch.isneginf(x).any())

    def explain(got: Tensor, want: Tensor) -> str:
        if bool(empty.any()) and not bool(close(got[empty], want[empty], 0, 0).all()):
            return (
                "A row of all -inf has nothing to normalize: give it zero weights "
                "(m = -inf, l = 0), and divide by l only where l > 0."
            )
        if some_inf:
            return (
                "A block whose entries are all -inf leaves the running maximum at "
                "-inf, and exp(-inf - (-inf)) = nan: shift by 0 while it is -inf, "
                "torch.where(m_new == -inf, 0, m_new)."
            )
        if bool(got.isnan().any()) or bool(torch.isinf(got).any()):
            return MAX_HINT
        if weights:
            return rows_sum_hint(got) or (
                "Compare with p_i = exp(x_i - m) / l, with m and l after the last "
                "block: " + _STATE_HINT
            )
        return "Compare with the state after the last block: " + _STATE_HINT

    return explain


def check_online_softmax(fn: Callable[..., Any]) -> CheckReport:
    r"""Check a student's online softmax, which streams a row block by block,
    ``fn(x)`` (or ``fn(x, block_size=b)``) returning the weights or the
    running state ``(m, l)``.

    For each block :math:`B` of the row,

    .. math:: m' = \max(m, \max_{j \in B} x_j), \qquad
              \ell' = \ell\, e^{m - m'} + \sum_{j \in B} e^{x_j - m'}

    and the weights are :math:`p_i = e^{x_i - m} / \ell` with the final
    :math:`m` and :math:`\ell`. A result of the shape of ``x`` is checked as
    the weights; a pair ``(m, l)`` (shape ``(...)`` or ``(..., 1)``) as the
    row maximum and :math:`\ell = \sum_j e^{x_j - m}`. When ``fn`` takes
    ``block_size``, several are passed (3, 8, 16, 2), and lengths that they
    do not divide. Checked: values on several shapes; a maximum that rises
    in later blocks (the rescale); scores of :math:`\pm 1000`; a first
    block of ``-inf`` (where ``exp(-inf - (-inf))`` is ``nan``); a row of
    ``-inf`` (zero weights, :math:`m = -\infty`, :math:`\ell = 0`); dtype
    kept (float32, float16, bfloat16); the input not modified. A missing or
    inverted rescale, weights from a stale maximum and :math:`m` of the
    last block alone each get their own hint.

    Parameters
    ----------
    fn : callable
        The student's function, ``fn(x) -> weights`` or ``(m, l)``.

    Returns
    -------
    CheckReport

    Examples
    --------
    >>> import torch, softmaxbook as sb
    >>> sb.checks.check_online_softmax(sb.online_softmax).ok
    True
    >>> def no_rescale(x, block_size=4):
    ...     m = torch.full(x.shape[:-1] + (1,), float("-inf"), dtype=x.dtype)
    ...     l = torch.zeros_like(m)
    ...     for b in x.split(block_size, dim=-1):
    ...         m = torch.maximum(m, b.amax(dim=-1, keepdim=True))
    ...         l = l + torch.exp(b - m).sum(dim=-1, keepdim=True)  # no rescale
    ...     return m, l
    >>> report = sb.checks.check_online_softmax(no_rescale)
    >>> print(report.problems[0])  # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
    With scores [1, 0.5, 2.5, -0.1, 3, 0.2, -1, 4] (float64), block_size = 3,
    l of your online softmax is 3.471; expected 1.717. That is the online
    softmax without the rescale: ...
    """
    session = Session(fn, "your online softmax")
    takes_block = "block_size" in _parameters(fn)
    g = generator(14)

    def check(x: Tensor, words: str, block: int) -> bool:
        label = words + (f", block_size = {block}" if takes_block else "")
        return _online_case(session, label, x, block if takes_block else 0)

    first = torch.tensor([1.0, 0.5, 2.5, -0.1, 3.0, 0.2, -1.0, 4.0], dtype=F64)
    if not check(first, f"scores {fmt(first)} (float64)", 3):
        session.stopped = True  # the rest runs for the score, unreported
    matrix = randn(g, 3, 37, scale=3.0)
    for block in (8, 16) if takes_block else (8,):
        check(matrix, input_label("scores", matrix), block)
    batch = randn(g, 2, 3, 4, 50, scale=3.0)
    check(batch, input_label("scores", batch), 16)
    rising = torch.arange(40, dtype=F64) / 2
    check(rising, "scores 0, 0.5, ..., 19.5, which rise along the row (float64)", 8)
    big = [[0.0, 10.0, 1000.0, 999.0, -1000.0, 1000.0], [-1000.0, -999.0, -998.0] * 2]
    check(
        torch.tensor(big, dtype=F64),
        "scores of shape (2, 6) with entries of +-1000 (float64, overflow)",
        2,
    )
    inf_first = torch.tensor([-INF, -INF, -INF, 1.0, 2.0, 0.5], dtype=F64)
    check(inf_first, f"scores {fmt(inf_first)} (float64)", 2)
    empty = torch.tensor([[-INF] * 5, [1.0, 2.0, 3.0, 4.0, 5.0]], dtype=F64)
    check(empty, "scores of shape (2, 5) whose row 0 is all -inf (float64)", 2)
    for dtype in (F32, F16, BF16):
        check(matrix.to(dtype), input_label("scores", matrix.to(dtype)), 8)
    checked = [
        "values on scores of shapes (8,), (3, 37), (2, 3, 4, 50)"
        + (", blocks of 3, 8, 16 and 2" if takes_block else ""),
        "a maximum that rises in later blocks (the rescale)",
        "scores of +-1000",
        "a first block of -inf",
        "a row of -inf",
        "the dtype kept (float32, float16, bfloat16)",
        "the input not modified",
    ]
    return session.report("check_online_softmax", checked)


def _online_case(session: Session, label: str, x: Tensor, block: int) -> bool:
    """One call, checked as the weights (shape of x) or as (m, l)."""
    kwargs = [("block_size", block)] if block else []
    done, raw = session.invoke(label, [("x", x)], kwargs)
    if not done:
        return False
    blocks = [block] if block else _BLOCK_GUESSES
    rows = tuple(x.shape[:-1])
    if not (isinstance(raw, (tuple, list)) and len(raw) == 2):
        got = session.accept(label, [("x", x)], kwargs, raw, [x.shape])
        if got is None:
            return False
        if session.dtype(label, got, x.dtype):
            session.values(
                label,
                got,
                softmax64(x.to(F64)),
                x.dtype,
                candidates=lambda: _online_candidates(x, blocks, "weights"),
                explain=_online_explain(x, weights=True),
            )
        return True
    keep = [r for r in raw if isinstance(r, Tensor) and tuple(r.shape) == rows + (1,)]
    shapes = [rows + (1,) if keep else rows] * 2
    got = session.accept(label, [("x", x)], kwargs, raw, shapes, 2, None, "(m, l)")
    if got is None:
        return False
    x64 = x.to(F64)
    m = x64.amax(dim=-1)
    shift = m.masked_fill(torch.isneginf(m), 0.0)
    want = {"m": m, "l": torch.exp(x64 - shift[..., None]).sum(dim=-1)}
    for name, t in zip(("m", "l"), got):
        session.values(
            label,
            t.reshape(rows),
            want[name],
            x.dtype,
            key=name,
            what=name,
            magnitude=float(m.abs().nan_to_num(posinf=0.0).max().clamp(min=1.0))
            if name == "m"
            else 1.0,
            candidates=partial(_online_candidates, x, blocks, name),
            explain=_online_explain(x, weights=False),
        )
    return True
