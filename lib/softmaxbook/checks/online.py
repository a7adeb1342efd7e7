"""The checker of a student's merge of two partial attention results."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .. import reference
from ._gradient import compare_gradients
from ._inputs import F64, INF, generator, numpy64, randn, tensor64
from ._report import CheckReport, dtype_name, fmt
from ._session import Candidate, Session

__all__ = ["check_merge_attention_states"]

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
