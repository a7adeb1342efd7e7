"""The checker of a student's masked softmax (True = may attend)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .. import reference
from ._gradient import compare_gradients
from ._hints import EMPTY_NAN_HINT, IGNORED_HINT, MAX_HINT, POLARITY_HINT, rows_sum_hint
from ._inputs import (
    F32,
    F64,
    close,
    generator,
    numpy64,
    randn,
    random_mask,
    softmax64,
    tensor64,
)
from ._report import CheckReport, dtype_name, fmt
from ._session import Candidate, Session

__all__ = ["check_masked_softmax"]

_UNIFORM_HINT = (
    "A fully masked row came back spread evenly over keys it may not see: that is what "
    "a finite fill such as -1e9 does (every score equal, so the softmax is uniform). "
    "Use -inf for masked scores and give rows with nothing to attend all-zero weights."
)
_NAN_MASK_HINT = (
    "nan appeared in rows that keep some entries: 0 * -inf is nan, so an "
    "additive mask built as (~mask) * float('-inf') poisons every entry of "
    "a row with a masked key. Build the masked scores with "
    "scores.masked_fill(~mask, float('-inf')) or torch.where."
)
_BACKWARD_NAN_HINT = (
    "The forward pass may give zeros and the backward pass "
    "still nan: torch.where(c, a, b) sends gradient into both "
    "branches, and a nan in the branch not taken poisons it. "
    "Replace a fully masked row's scores with 0 before the "
    "softmax, and zero its weights after."
)


def _masked_reference(scores: Tensor, mask: Tensor) -> Tensor:
    filled = np.where(
        np.broadcast_to(mask.numpy(), scores.shape), numpy64(scores), -np.inf
    )
    return tensor64(reference.softmax(filled))


def _masked_candidates(scores: Tensor, mask: Tensor) -> list[Candidate]:
    plain = tensor64(reference.softmax(numpy64(scores)))
    partly = ~mask.expand(scores.shape).all(dim=-1, keepdim=True)
    return [
        ("polarity", _masked_reference(scores, ~mask), POLARITY_HINT),
        ("ignored", plain, IGNORED_HINT),
        # scores + (~mask) * -inf: 0 * -inf = nan in every row with a masked key
        ("0 * -inf", plain.masked_fill(partly, math.nan), _NAN_MASK_HINT),
    ]


def _masked_explain(scores: Tensor, mask: Tensor) -> Callable[[Tensor, Tensor], str]:
    def explain(got: Tensor, want: Tensor) -> str:
        keep = mask.expand(want.shape)
        empty = ~keep.any(dim=-1, keepdim=True).expand(want.shape)
        kept_zero = (got[keep] == 0) | got[keep].isnan()
        masked = got[~keep]
        if bool(kept_zero.all()) and bool(((masked != 0) & masked.isfinite()).any()):
            return POLARITY_HINT
        if bool(got[~empty].isnan().any()):
            small = bool(scores.abs().max() < 80)  # exp cannot overflow in float32
            return _NAN_MASK_HINT if small else MAX_HINT
        if bool(empty.any()):
            rows = got[empty].reshape(-1, want.shape[-1])
            if bool(rows.isnan().any()):
                return EMPTY_NAN_HINT
            if bool(
                close(rows, torch.full_like(rows, 1 / rows.shape[-1]), 1e-3, 0).all()
            ):
                return _UNIFORM_HINT
            if not bool((rows == 0).all()):
                return (
                    "A row whose mask is all False has nothing to attend to: its "
                    "weights must all be 0."
                )
        if bool((got[~keep] != 0).any()):
            return (
                f"Masked entries (mask False) got weight {fmt(got[~keep][:4])}: "
                f"they must get exactly 0."
            )
        return rows_sum_hint(got)

    return explain


def _masked_case(session: Session, label: str, scores: Tensor, mask: Tensor) -> bool:
    return session.run(
        label,
        [("scores", scores), ("mask", mask)],
        want=_masked_reference(scores, mask),
        dtype=scores.dtype,
        candidates=lambda: _masked_candidates(scores, mask),
        explain=_masked_explain(scores, mask),
    )


def check_masked_softmax(
    fn: Callable[..., Any],
    *,
    numpy: bool = False,
    gradient: bool = True,
    device: torch.device | str | None = None,
) -> CheckReport:
    r"""Check a student's masked softmax, ``fn(scores, mask)``, True = may attend.

    .. math:: p_i = \frac{m_i e^{x_i}}{\sum_j m_j e^{x_j}}, \qquad
              p = 0 \ \text{for a row with}\ \textstyle\sum_j m_j = 0

    ``scores`` is ``(..., N)`` and ``mask`` a boolean tensor that broadcasts
    to it; the result has the shape and dtype of ``scores``. Checked: values
    on several shapes with full-size and broadcast masks (causal ``(L, S)``,
    padding ``(B, 1, 1, S)``); the mask's polarity (diagnosed when flipped or
    ignored); a fully masked row gives zeros (not ``nan``, not the uniform
    row a ``-1e9`` fill gives); overflow; dtype (float16 included, where
    ``-1e9`` does not fit) and device kept; neither argument modified; the
    gradient by autograd, zero and finite on the fully masked row.

    Parameters
    ----------
    fn : callable
        The student's function, ``fn(scores, mask) -> weights``.
    numpy : bool
        ``fn`` takes and returns NumPy arrays (no gradient or device check).
    gradient : bool
        Also check the gradient by autograd through ``fn``.
    device : torch.device or str, optional
        Where to run the device check; default :func:`softmaxbook.get_device`.

    Returns
    -------
    CheckReport

    Examples
    --------
    >>> import torch, softmaxbook as sb
    >>> def minus_1e9(scores, mask):
    ...     return torch.softmax(scores.masked_fill(~mask, -1e9), dim=-1)
    >>> report = sb.checks.check_masked_softmax(minus_1e9)
    >>> any("spread evenly" in p for p in report.problems)
    True
    >>> sb.checks.check_masked_softmax(sb.masked_softmax).ok
    True
    """
    session = Session(
        fn, "your masked softmax", numpy=numpy, gradient=gradient, device=device
    )
    scores = torch.tensor([[1.0, 0.5, 2.5, -0.1]] * 3, dtype=F64)
    causal = torch.ones(3, 4, dtype=torch.bool).tril()
    if not _masked_case(
        session, "scores of shape (3, 4) (float64) with a causal mask", scores, causal
    ):
        session.stopped = True  # the rest runs for the score, unreported
    g = generator(4)
    _check_mask_shapes(session, g)
    empty = causal.clone()
    empty[1] = False
    _masked_case(
        session,
        "scores of shape (3, 4) (float64) whose row 1 is fully masked",
        scores,
        empty,
    )
    big = torch.tensor([[1000.0, 0.0, 3.0], [0.0, 1.0, 2.0]], dtype=F64)
    _masked_case(
        session,
        "scores [[1000, 0, 3], [0, 1, 2]] (float64) with the last "
        "column masked (overflow)",
        big,
        torch.tensor([True, True, False]),
    )
    _check_dtypes_device_gradient(session, g)
    checked = [
        "values on shapes (3, 4) and (2, 3, 5, 6) with full-size, causal (L, S) "
        "and padding (B, 1, 1, S) masks",
        "the mask's polarity (True = may attend)",
        "a fully masked row gives zeros",
        "overflow [1000, 0]",
        f"the dtype kept ({session.dtype_words()})",
        "the device kept",
        "the inputs not modified",
    ] + (
        ["the gradient, by autograd, finite and zero on a fully masked row"]
        if session.check_gradient
        else []
    )
    return session.report("check_masked_softmax", checked)


def _check_mask_shapes(session: Session, g: torch.Generator) -> None:
    """Batched scores with a full-size, a causal (L, S) and a padding mask."""
    x = randn(g, 2, 3, 5, 6, scale=3.0)
    batched = "random scores of shape (2, 3, 5, 6) (float64) with "
    masks = [
        ("a random mask of the same shape", random_mask(g, 2, 3, 5, 6)),
        ("a causal mask of shape (5, 6)", torch.ones(5, 6, dtype=torch.bool).tril()),
        (
            "a padding mask of shape (2, 1, 1, 6), lengths 6 and 4",
            (torch.arange(6) < torch.tensor([6, 4])[:, None]).reshape(2, 1, 1, 6),
        ),
    ]
    for words, mask in masks:
        _masked_case(session, batched + words, x, mask)


def _check_dtypes_device_gradient(session: Session, g: torch.Generator) -> None:
    """Every dtype, the accelerator and the gradient, with a fully masked row."""
    low = randn(g, 4, 6, scale=3.0)
    low_mask = random_mask(g, 4, 6)
    low_mask[2] = False
    for dtype in [F64] + session.dtypes():
        _masked_case(
            session,
            f"random scores of shape (4, 6) ({dtype_name(dtype)}) with a "
            f"random mask whose row 2 is fully masked",
            low.to(dtype),
            low_mask,
        )
    s = low.to(F32)
    session.on_device(
        "float32 scores on the accelerator",
        [("scores", s), ("mask", low_mask)],
        shapes=[s.shape],
        want=_masked_reference(s, low_mask),
    )
    if not session.check_gradient:
        return
    grad_out = randn(g, 4, 6)
    s = low.clone()
    want = torch.autograd.functional.vjp(lambda t: softmax64(t, low_mask), s, grad_out)[
        1
    ]
    compare_gradients(
        session,
        "random scores of shape (4, 6) (float64) with a random mask "
        "whose row 2 is fully masked",
        [("scores", s), ("mask", low_mask)],
        wrt={"scores"},
        shapes=[s.shape],
        output_grads=[grad_out],
        want={"scores": want},
        forward=_masked_reference(s, low_mask),
        hint=_BACKWARD_NAN_HINT,
    )
