"""The checker of a student's top-p (nucleus) filter."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .. import reference
from ._inputs import F64, generator, numpy64, randn, tensor64
from ._report import CheckReport, fmt
from ._session import Candidate, Scalar, Session

__all__ = ["check_top_p_filter"]


def _top_p_np(z: np.ndarray, p: float) -> np.ndarray:
    """Keep the most probable tokens while the mass ranked above them is < p."""
    order = np.argsort(-z, axis=-1, kind="stable")
    probs = reference.softmax(np.take_along_axis(z, order, axis=-1))
    before = np.cumsum(probs, axis=-1) - probs  # the mass of the tokens ranked above
    keep = np.empty(z.shape, dtype=bool)
    np.put_along_axis(keep, order, before < p, axis=-1)
    return np.where(keep, z, -np.inf)


def _top_p_shifted(z: np.ndarray, p: float, shift: int) -> np.ndarray:
    """The nucleus with one token more or fewer (at least one kept): for diagnosis."""
    order = np.argsort(-z, axis=-1, kind="stable")
    probs = reference.softmax(np.take_along_axis(z, order, axis=-1))
    size = ((np.cumsum(probs, axis=-1) - probs) < p).sum(axis=-1, keepdims=True) + shift
    ranks = np.empty(z.shape, dtype=int)
    np.put_along_axis(
        ranks, order, np.broadcast_to(np.arange(z.shape[-1]), z.shape), axis=-1
    )
    return np.where(ranks < np.clip(size, 1, None), z, -np.inf)


def _top_p_candidates(z: Tensor, p: float) -> list[Candidate]:
    zs = numpy64(z)
    want = _top_p_np(zs, p)
    return [
        (
            "one fewer",
            tensor64(_top_p_shifted(zs, p, -1)),
            f"You dropped the token that makes the kept mass reach p = {p}: the "
            "nucleus is the smallest set whose mass is >= p, so keep a token while "
            "the mass ranked *above* it is still < p (cumsum - probs < p).",
        ),
        (
            "one more",
            tensor64(_top_p_shifted(zs, p, 1)),
            "You kept one token too many: stop as soon as the kept mass reaches p = "
            f"{p} (keep a token while the mass ranked above it is < p).",
        ),
        (
            "sorted",
            tensor64(-np.sort(-want, axis=-1)),
            "That is the filtered row in sorted order: return the logits in their "
            "original order (compare each logit with the threshold, or scatter back).",
        ),
        (
            "zeros",
            tensor64(np.where(np.isinf(want), 0.0, want)),
            "Removed tokens must be -inf, not 0, so that the softmax gives them 0.",
        ),
        (
            "probabilities",
            tensor64(np.where(np.isinf(want), 0.0, reference.softmax(want))),
            "Those are probabilities: return the filtered logits (-inf where removed).",
        ),
    ]


def _top_p_explain(got: Tensor, want: Tensor) -> str:
    kept_got, kept_want = torch.isfinite(got).sum(-1), torch.isfinite(want).sum(-1)
    if bool((kept_got == 0).any()):
        return (
            "Every token was removed from a row: the most probable token has no mass "
            "above it, so it is always kept."
        )
    if not torch.equal(kept_got, kept_want):
        return (
            f"You kept {fmt(kept_got.reshape(-1), 4)} tokens per row where the "
            f"nucleus has {fmt(kept_want.reshape(-1), 4)}. Sort the probabilities "
            f"of each row in decreasing order and keep a token while the mass ranked "
            f"above it is < p."
        )
    return "The kept logits must be returned unchanged, the others set to -inf."


def check_top_p_filter(
    fn: Callable[..., Any],
    *,
    numpy: bool = False,
    device: torch.device | str | None = None,
) -> CheckReport:
    r"""Check a student's top-p (nucleus) filter, ``fn(logits, p)``.

    With the probabilities :math:`\pi = \mathrm{softmax}(z)` of a row sorted
    in decreasing order, the nucleus is the top
    :math:`m = \min\{j : \sum_{i \le j} \pi_{(i)} \ge p\}` tokens (Holtzman et
    al., 2020); ``fn`` returns the logits with every other entry set to
    ``-inf``, in the original order, same shape and dtype. The inputs have no
    ties and no cumulative mass within rounding of ``p``, so any correct
    convention passes. Checked: the nucleus on unsorted rows (diagnosed when
    one token too few or too many is kept, or the row comes back sorted, or
    removed tokens are 0 instead of ``-inf``, or probabilities come back); a
    small ``p`` keeps the most probable token; ``p = 1`` keeps everything;
    batched rows with different nucleus sizes; dtype and device kept; the
    logits not modified (``masked_fill_`` is in place).

    Parameters
    ----------
    fn : callable
        The student's function, ``fn(logits, p) -> filtered_logits``, ``p`` a
        Python float in (0, 1].
    numpy : bool
        ``fn`` takes and returns NumPy arrays (no device check).
    device : torch.device or str, optional
        Where to run the device check; default :func:`softmaxbook.get_device`.

    Returns
    -------
    CheckReport

    Examples
    --------
    >>> import softmaxbook as sb
    >>> sb.checks.check_top_p_filter(sb.top_p_filter).ok
    True
    """
    session = Session(fn, "your top-p filter", numpy=numpy, device=device)
    for number, (label, z, p) in enumerate(_top_p_inputs()):
        if not _top_p_run(session, label, z, p) and number == 0:
            session.stopped = True  # the rest runs for the score, unreported
    x = z.float()  # the last input: a batch
    session.on_device(
        "float32 logits on the accelerator and p = 0.8",
        [("logits", x), ("p", Scalar(0.8))],
        shapes=[x.shape],
        want=tensor64(_top_p_np(numpy64(x), 0.8)),
    )
    checked = [
        "the nucleus on unsorted rows, for p = 0.2, 0.7, 0.8, 0.9 and 1",
        "batched rows with different nucleus sizes",
        "the dtype kept (float64, float32)",
        "the device kept",
        "the logits not modified",
    ]
    return session.report("check_top_p_filter", checked, "the device")


def _top_p_inputs() -> list[tuple[str, Tensor, float]]:
    """(label, logits, p): no ties, and no cumulative mass within 1e-4 of p."""
    probs = torch.tensor([0.45, 0.10, 0.30, 0.06, 0.09], dtype=F64)
    z = torch.log(probs)
    basic = f"logits log({fmt(probs)}) (float64) and p = "
    g = generator(7)
    ranks = torch.arange(1, 41, dtype=F64)
    zipf = torch.stack([-2.0 * ranks.log(), -0.5 * ranks.log()])  # (2, 40)
    zipf = zipf[:, torch.randperm(40, generator=g)]
    batch = randn(g, 2, 3, 20, scale=2.0)
    return [
        (basic + "0.7", z, 0.7),
        (basic + "0.2", z, 0.2),
        (basic + "1", z, 1.0),
        (
            "two unsorted rows of 40 logits, one peaked and one flat (float64), and "
            "p = 0.9",
            zipf,
            0.9,
        ),
        ("random logits of shape (2, 3, 20) (float64) and p = 0.8", batch, 0.8),
        ("random logits of shape (2, 3, 20) (float32) and p = 0.8", batch.float(), 0.8),
    ]


def _top_p_run(session: Session, label: str, z: Tensor, p: float) -> bool:
    return session.run(
        label,
        [("logits", z), ("p", Scalar(p))],
        want=tensor64(_top_p_np(numpy64(z), p)),
        dtype=z.dtype,
        candidates=lambda: _top_p_candidates(z, p),
        explain=_top_p_explain,
    )
