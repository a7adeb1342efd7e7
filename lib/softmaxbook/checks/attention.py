"""The checker of a student's scaled dot-product attention."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .. import reference
from ._gradient import compare_gradients
from ._hints import EMPTY_NAN_HINT, IGNORED_HINT, MAX_HINT, POLARITY_HINT
from ._inputs import F64, generator, numpy64, randn, softmax64, tensor64
from ._report import CheckReport, dtype_name
from ._session import Candidate, Session

__all__ = ["check_attention"]


def _attention_np(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    scale: float | None = None,
    axis: int = -1,
    fill: float = -np.inf,
) -> Tensor:
    q_, k_, v_ = numpy64(q), numpy64(k), numpy64(v)
    scale = 1 / math.sqrt(q_.shape[-1]) if scale is None else scale
    scores = q_ @ np.swapaxes(k_, -1, -2) * scale  # (..., L, S)
    if mask is not None:
        scores = np.where(np.broadcast_to(mask.numpy(), scores.shape), scores, fill)
    return tensor64(reference.softmax(scores, axis=axis) @ v_)


def _attention_t(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    keep = None if mask is None else mask.expand(scores.shape)
    return softmax64(scores, keep) @ v


def _attention_candidates(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None
) -> list[Candidate]:
    d, dv = q.shape[-1], v.shape[-1]
    found = [
        (
            "no scale",
            _attention_np(q, k, v, mask, 1.0),
            "That is attention without the scale: multiply the scores q @ k^T by "
            "1/sqrt(D), D the size of the last dimension of q and k.",
        ),
        (
            "1/D",
            _attention_np(q, k, v, mask, 1 / d),
            "You scaled the scores by 1/D; the scale is 1/sqrt(D), D the size of the "
            "last dimension of q and k.",
        ),
        (
            "queries",
            _attention_np(q, k, v, mask, axis=-2),
            "You normalized over the queries (dim=-2): each query's weights must sum "
            "to one over the keys, the last dimension of the scores (dim=-1).",
        ),
    ]
    if dv != d:
        found.append(
            (
                "1/sqrt(Dv)",
                _attention_np(q, k, v, mask, 1 / math.sqrt(dv)),
                "You scaled by the square root of the values' dimension; the scale "
                "uses the dimension of the queries and keys, 1/sqrt(D) with D = "
                "q.shape[-1].",
            )
        )
    if mask is not None:
        found += [
            ("polarity", _attention_np(q, k, v, ~mask), POLARITY_HINT),
            ("ignored", _attention_np(q, k, v), IGNORED_HINT),
        ]
        if bool((~mask.any(dim=-1)).any()):
            found.append(
                (
                    "finite fill",
                    _attention_np(q, k, v, mask, fill=-1e9),
                    "A query whose mask row is all False came back as the "
                    "average of all the values: that is what a finite fill such "
                    "as -1e9 does (every score equal, so the softmax is uniform). "
                    "Use -inf for masked scores, and give a query with nothing to "
                    "attend to zero weights and a zero output.",
                )
            )
    return found


def _attention_explain(mask: Tensor | None) -> Callable[[Tensor, Tensor], str]:
    def explain(got: Tensor, want: Tensor) -> str:
        if bool(got.isnan().any()):
            if mask is not None and bool((~mask.any(dim=-1)).any()):
                return (
                    "A query whose mask row is all False has nothing to attend to: "
                    "its output must be zeros, not nan. " + EMPTY_NAN_HINT
                )
            return MAX_HINT + " (Or use a stable softmax such as torch.softmax.)"
        return (
            "Compare with softmax(q @ k.transpose(-2, -1) / sqrt(D), dim=-1) @ v, "
            "masked entries at -inf."
        )

    return explain


def _attention_case(
    session: Session,
    label: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    keyword: bool = True,
) -> bool:
    """``fn(q, k, v, mask=mask)``, or ``fn(q, k, v)`` when not ``keyword``."""
    shape = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]) + (
        q.shape[-2],
        v.shape[-1],
    )
    return session.run(
        label,
        [("q", q), ("k", k), ("v", v)],
        [("mask", mask)] if keyword else [],
        want=_attention_np(q, k, v, mask),
        dtype=q.dtype,
        shape=shape,
        candidates=lambda: _attention_candidates(q, k, v, mask),
        explain=_attention_explain(mask),
    )


_BATCHED = "q (2, 3, 5, 16), k (2, 3, 7, 16), v (2, 3, 7, 4) (float64)"
_NOTHING = ", a causal mask whose query 3 may attend to nothing"


def _masks() -> list[tuple[str, Tensor]]:
    """(words, mask) for the batched input, 5 queries and 7 keys; the last has a
    query with nothing to attend to."""
    causal = torch.ones(5, 7, dtype=torch.bool).tril()
    padding = (torch.arange(7) < torch.tensor([7, 4])[:, None]).reshape(2, 1, 1, 7)
    empty = causal.clone()
    empty[3] = False
    return [
        (", a causal mask (5, 7)", causal),
        (", a padding mask (2, 1, 1, 7) with lengths 7 and 4", padding),
        (_NOTHING, empty),
    ]


def check_attention(
    fn: Callable[..., Any],
    *,
    masks: bool = True,
    numpy: bool = False,
    gradient: bool = True,
    device: torch.device | str | None = None,
) -> CheckReport:
    r"""Check a student's attention, ``fn(q, k, v, mask=None)`` returning the output.

    .. math:: \mathrm{softmax}\!\left(\frac{Q K^\top}{\sqrt{D}},\ \text{mask}\right) V

    ``q`` is ``(..., L, D)``, ``k`` ``(..., S, D)``, ``v`` ``(..., S, Dv)``;
    ``mask`` is boolean, True = may attend, broadcastable to ``(..., L, S)``;
    the output is ``(..., L, Dv)``. Checked: values without a mask (called as
    ``fn(q, k, v)``) on an unbatched and a batched input with
    :math:`L \ne S` and :math:`D \ne D_v`; the :math:`1/\sqrt{D}` scale
    (diagnosed when missing, or :math:`1/D`, or :math:`1/\sqrt{D_v}`); the
    softmax over the keys, not the queries; a causal and a padding mask
    (polarity diagnosed); a query with nothing to attend to gives a zero
    output; large scores (overflow); dtype and device kept; no input
    modified; the gradients with respect to ``q``, ``k`` and ``v``.

    Parameters
    ----------
    fn : callable
        The student's function, ``fn(q, k, v, mask=None) -> out``.
    masks : bool
        Also check masks. With ``masks=False`` the function is only ever
        called as ``fn(q, k, v)``, for attention written before masks are
        taught (chapter 3 of the book).
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
    >>> import math, torch, softmaxbook as sb
    >>> def unscaled(q, k, v, mask=None):
    ...     return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v
    >>> report = sb.checks.check_attention(unscaled)
    >>> print(report.problems[0])  # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
    With q (4, 8), k (6, 8), v (6, 5) (float64), no mask, row 3 of the result of
    your attention is [...]; expected [...]. That is attention without the scale:
    multiply the scores q @ k^T by 1/sqrt(D), D the size of the last dimension ...
    >>> def attention(q, k, v, mask=None):
    ...     return sb.scaled_dot_product_attention(q, k, v, mask=mask)
    >>> sb.checks.check_attention(attention).ok
    True
    """
    session = Session(
        fn, "your attention", numpy=numpy, gradient=gradient, device=device
    )
    g = generator(5)
    q, k, v = randn(g, 4, 8), randn(g, 6, 8), randn(g, 6, 5)
    if not _attention_case(
        session,
        "q (4, 8), k (6, 8), v (6, 5) (float64), no mask",
        q,
        k,
        v,
        keyword=False,
    ):
        session.stopped = True  # the rest runs for the score, unreported
    batch = randn(g, 2, 3, 5, 16), randn(g, 2, 3, 7, 16), randn(g, 2, 3, 7, 4)
    _attention_case(session, _BATCHED + ", no mask", *batch, keyword=False)
    if masks:
        for words, mask in _masks():
            _attention_case(session, _BATCHED + words, *batch, mask)
    qo = torch.tensor([[50.0] * 4, [0.0] * 4], dtype=F64)
    ko = torch.tensor([[10.0] * 4, [0.0] * 4, [-10.0] * 4], dtype=F64)
    _attention_case(
        session,
        "q (2, 4), k (3, 4) with scores q k^T / sqrt(D) up to 1000 (overflow)",
        qo,
        ko,
        randn(g, 3, 2),
        keyword=False,
    )
    for dtype in session.dtypes():
        _attention_case(
            session,
            f"q (4, 8), k (6, 8), v (6, 5) ({dtype_name(dtype)})",
            q.to(dtype),
            k.to(dtype),
            v.to(dtype),
            keyword=False,
        )
    q32, k32, v32 = q.float(), k.float(), v.float()
    session.on_device(
        "float32 q, k, v on the accelerator",
        [("q", q32), ("k", k32), ("v", v32)],
        shapes=[(4, 5)],
        want=_attention_np(q32, k32, v32),
    )
    if session.check_gradient:
        _check_gradients(session, g, batch, masks)
    return session.report("check_attention", _checked(session, masks))


def _check_gradients(
    session: Session,
    g: torch.Generator,
    batch: tuple[Tensor, Tensor, Tensor],
    masks: bool,
) -> None:
    """The gradients with respect to q, k and v, with a query that sees nothing."""
    grad_out = randn(g, 2, 3, 5, 4)
    mask = _masks()[-1][1] if masks else None
    want = torch.autograd.functional.vjp(
        lambda a, b, c: _attention_t(a, b, c, mask), batch, grad_out
    )[1]
    compare_gradients(
        session,
        _BATCHED + (_NOTHING if masks else ", no mask"),
        list(zip("qkv", batch)),
        [("mask", mask)] if masks else [],
        wrt={"q", "k", "v"},
        shapes=[(2, 3, 5, 4)],
        output_grads=[grad_out],
        want=dict(zip("qkv", want)),
        forward=_attention_np(*batch, mask),
    )


def _checked(session: Session, masks: bool) -> list[str]:
    checked = [
        "values on (L, D) and (B, H, L, D) inputs with L != S and D != Dv",
        "the 1/sqrt(D) scale",
        "the softmax over the keys",
    ]
    if masks:
        checked += [
            "causal and padding masks (True = may attend)",
            "a query with nothing to attend gives zeros",
        ]
    checked += [
        "overflow",
        f"the dtype kept ({session.dtype_words()})",
        "the device kept",
        "the inputs not modified",
    ]
    if session.check_gradient:
        checked.append("the gradients with respect to q, k and v")
    if not masks:
        checked.append("not checked with masks=False: masks")
    return checked
