r"""Checkers of a student's FlashAttention: the tiled forward pass, the backward
pass from the logsumexp, and the autograd Function that joins them.

The conventions are those of :func:`softmaxbook.flash_attention`: ``q`` is
``(..., L, D)``, ``k`` ``(..., S, D)``, ``v`` ``(..., S, Dv)``, the scale
:math:`1/\sqrt{D}`; ``is_causal=True`` lets query :math:`i` attend to keys
:math:`j \le i`; the logsumexp ``lse`` ``(..., L)`` is
:math:`\log \sum_j e^{s_{ij}}` in natural log, ``-inf`` (and a zero output)
for a row with nothing to attend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ._flash import attention64, block_style, block_words, parameters, scores64
from ._flash_cases import (
    ForwardCase,
    as_callable,
    backward_case,
    check_memory,
    check_saved,
    configs_of,
    forward_checked,
    function_case,
    output_only,
)
from ._flash_hints import BACKWARD_HINTS, FORWARD_HINTS, FUNCTION_HINTS
from ._gradient import compare_gradients
from ._inputs import BF16, F32, F64, generator, randn, random_mask
from ._report import CheckReport, function_name
from ._session import Session

__all__ = ["check_flash_forward", "check_flash_backward", "check_flash_function"]


def check_flash_forward(
    fn: Callable[..., Any],
    *,
    lse: bool | None = None,
    causal: bool = True,
    masks: bool | None = None,
    memory: bool = True,
) -> CheckReport:
    r"""Check a student's tiled FlashAttention forward pass,
    ``fn(q, k, v, is_causal=False) -> out`` or ``(out, lse)``.

    .. math:: o_i = \sum_j \frac{e^{s_{ij}}}{\sum_{j'} e^{s_{ij'}}}\, v_j, \qquad
              \mathrm{lse}_i = \log \sum_j e^{s_{ij}}, \qquad
              s = \frac{q k^\top}{\sqrt{D}}

    computed over tiles of keys with a running maximum :math:`m`, a running
    sum :math:`\ell` and an output :math:`o` rescaled by :math:`e^{m -
    m'}` whenever a tile raises the maximum to :math:`m'`.

    ``q`` is ``(..., L, D)``, ``k`` ``(..., S, D)``, ``v`` ``(..., S, Dv)``;
    the output ``(..., L, Dv)`` in the dtype of ``q``, the logsumexp
    ``(..., L)`` in natural log (any floating dtype). When ``fn`` takes
    ``block_q`` and ``block_k`` (or ``block_size``), several tile sizes are
    passed, square and not, with lengths 37 and 45 that none divides.
    Checked: the values, and the logsumexp when returned; ``is_causal=True``
    (with :math:`L = S`, where both alignments of a causal mask agree);
    batched ``(B, H, L, D)`` input; scores that rise along the keys (every
    tile raises the maximum) and scores of :math:`\pm 1000` (overflow);
    float32 and bfloat16 kept; no input modified; that the forward pass never
    creates a tensor of :math:`L \times S` entries (with ``L = 384``, ``S =
    320`` and tiles of 64 when ``fn`` takes them: a tile loop's scores are a
    fraction of that). A missing rescale, a logsumexp in base 2, without the
    maximum or returning :math:`m`, and a causal mask built from a tile's
    own indices each get their own hint.

    Parameters
    ----------
    fn : callable
        The student's function, ``fn(q, k, v, is_causal=False) -> out`` or
        ``(out, lse)``, optionally with ``block_q=``, ``block_k=`` (or
        ``block_size=``) and ``mask=`` (boolean, True = may attend).
    lse : bool, optional
        True: ``fn`` must return ``(out, lse)``; False: the output alone.
        By default either is accepted, and the logsumexp is checked when
        returned.
    causal : bool
        Also check ``is_causal=True``.
    masks : bool, optional
        Also check a boolean mask with a query that may attend to nothing
        (a zero output, ``lse = -inf``, no ``nan``); by default when ``fn``
        has a parameter ``mask``.
    memory : bool
        Also check that no tensor of :math:`L \times S` entries is created.
        (Operations in other threads are not seen.)

    Returns
    -------
    CheckReport

    Examples
    --------
    >>> import torch, softmaxbook as sb
    >>> def flash_forward(q, k, v, is_causal=False, block_q=16, block_k=16):
    ...     return sb.flash_attention(
    ...         q, k, v, is_causal=is_causal, block_size=(block_q, block_k),
    ...         return_lse=True,
    ...     )
    >>> sb.checks.check_flash_forward(flash_forward).ok
    True
    >>> import math
    >>> def base2(q, k, v, is_causal=False, block_q=16, block_k=16):
    ...     out, lse = flash_forward(q, k, v, is_causal, block_q, block_k)
    ...     return out, lse / math.log(2)
    >>> report = sb.checks.check_flash_forward(base2)
    >>> print(report.problems[0])  # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
    With q, k, v of shape (2, 24, 8) (float64), block_q = 16 and block_k = 16,
    row ... of the logsumexp of your flash forward is [...]; expected [...]. That
    is the logsumexp in base 2 ...
    """
    if lse not in (None, True, False):
        raise TypeError(f"lse must be None, True or False, got {lse!r}")
    session = Session(fn, "your flash forward", hints=FORWARD_HINTS)
    session.name = function_name(fn)
    check = ForwardCase(session, fn, lse)
    style = check.style
    masks = "mask" in parameters(fn) if masks is None else masks
    configs = configs_of(style)
    g = generator(11)
    q, k, v = randn(g, 2, 24, 8), randn(g, 2, 24, 8), randn(g, 2, 24, 8)
    first = "q, k, v of shape (2, 24, 8) (float64)" + block_words(style, *configs[0])
    if not check.case(first, q, k, v, blocks=configs[0]):
        session.stopped = True  # the rest runs for the score, unreported
    q2, k2, v2 = randn(g, 2, 37, 16), randn(g, 2, 45, 16), randn(g, 2, 45, 8)
    shapes = "q (2, 37, 16), k (2, 45, 16), v (2, 45, 8)"
    for blocks in configs:
        words = block_words(style, *blocks)
        check.case(f"{shapes} (float64){words}", q2, k2, v2, blocks=blocks)
    if causal:
        qc = randn(g, 2, 45, 16)
        for blocks in configs:
            check.case(
                "q, k (2, 45, 16), v (2, 45, 8) (float64), is_causal=True"
                + block_words(style, *blocks),
                qc,
                k2,
                v2,
                causal=True,
                blocks=blocks,
            )
    words = block_words(style, *configs[0])
    batch = randn(g, 2, 3, 20, 8), randn(g, 2, 3, 28, 8), randn(g, 2, 3, 28, 8)
    check.case(
        f"q (2, 3, 20, 8), k and v (2, 3, 28, 8) (float64){words}",
        *batch,
        blocks=configs[0],
    )
    rise = torch.arange(40, dtype=F64)[:, None].expand(40, 4) / 8  # scores j / 4
    check.case(
        f"q (1, 6, 4), k (1, 40, 4), v (1, 40, 5) whose scores rise along the keys "
        f"(float64){words}",
        torch.ones(1, 6, 4, dtype=F64),
        rise[None],
        randn(g, 1, 40, 5),
        blocks=configs[0],
    )
    big = torch.tensor([50.0, -50.0, 0.0], dtype=F64)[:, None].expand(3, 4)
    ramp = torch.linspace(-10.0, 10.0, 40, dtype=F64)[:, None].expand(40, 4)
    check.case(
        f"q (1, 3, 4), k (1, 40, 4) with scores from -1000 to 1000 (overflow), "
        f"v (1, 40, 5) (float64){words}",
        big[None],
        ramp[None],
        randn(g, 1, 40, 5),
        blocks=configs[0],
    )
    if masks:
        mask = random_mask(g, 2, 37, 45)
        mask[:, 5] = False
        check.case(
            f"{shapes} (float64), a mask (2, 37, 45) whose query 5 may attend to "
            f"nothing{words}",
            q2,
            k2,
            v2,
            mask=mask,
            blocks=configs[0],
        )
    for dtype in (F32, BF16):
        check.case(
            f"{shapes} ({str(dtype)[6:]}){words}",
            q2.to(dtype),
            k2.to(dtype),
            v2.to(dtype),
            blocks=configs[0],
        )
    if memory:
        check_memory(session, check, fn, g)
    return session.report("check_flash_forward", forward_checked(check, causal, masks))


def check_flash_backward(
    fn: Callable[..., Any],
    *,
    causal: bool = True,
) -> CheckReport:
    r"""Check a student's FlashAttention backward pass,
    ``fn(q, k, v, out, lse, grad_output) -> (dq, dk, dv)``.

    With the weights recomputed from the logsumexp, :math:`P = e^{Z - \mathrm{lse}}`,

    .. math::

       dV &= P^\top dO, \qquad dP = dO\, V^\top, \\
       dZ &= P \circ (dP - D), \\
       dQ &= dZ\, K / \sqrt{d_k}, \qquad dK = dZ^\top Q / \sqrt{d_k}

    where :math:`D_i = \sum_d dO_{id}\, O_{id}` (one number per query row).
    ``out`` and ``lse`` are given as the forward pass returns them (``lse``
    in float32 for bfloat16 input); the results have the shapes and dtypes
    of ``q``, ``k``, ``v``. Checked: the three gradients against float64
    autograd on inputs with :math:`L \ne S` and :math:`D \ne D_v`, lengths
    37 and 45, batched ``(B, H, L, D)`` input, ``is_causal=True`` (as a
    keyword), float32 and bfloat16; no input modified. A backward without
    :math:`D` (or with :math:`D` from ``dO`` alone), without the scale, or
    that ignores the causal mask gets its own hint.

    Parameters
    ----------
    fn : callable
        The student's function, ``fn(q, k, v, out, lse, grad_output,
        is_causal=False) -> (dq, dk, dv)``.
    causal : bool
        Also check ``is_causal=True``.

    Returns
    -------
    CheckReport

    Examples
    --------
    >>> import torch, softmaxbook as sb
    >>> def flash_backward(q, k, v, out, lse, grad_output, is_causal=False):
    ...     return sb.flash_attention_backward(
    ...         q, k, v, out, lse, grad_output, is_causal=is_causal
    ...     )
    >>> sb.checks.check_flash_backward(flash_backward).ok
    True
    >>> def no_delta(q, k, v, out, lse, grad_output, is_causal=False):
    ...     s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    ...     p = torch.exp(s - lse[..., None])
    ...     ds = p * (grad_output @ v.transpose(-2, -1))  # no - D
    ...     scale = q.shape[-1] ** -0.5
    ...     return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, p.mT @ grad_output
    >>> report = sb.checks.check_flash_backward(no_delta)
    >>> print(report.problems[0])  # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
    With q, k, v of shape (2, 24, 8) (float64), row ... of dq of your flash
    backward is [...]; expected [...]. That is the backward without the rowsum
    term: dS = P * (dP - D)...
    """
    session = Session(fn, "your flash backward", hints=BACKWARD_HINTS)
    style = block_style(fn)
    configs = configs_of(style)
    g = generator(12)
    q, k, v = randn(g, 2, 24, 8), randn(g, 2, 24, 8), randn(g, 2, 24, 8)
    first = "q, k, v of shape (2, 24, 8) (float64)" + block_words(style, *configs[0])
    if not backward_case(session, style, first, q, k, v, g, blocks=configs[0]):
        session.stopped = True  # the rest runs for the score, unreported
    q2, k2, v2 = randn(g, 2, 37, 16), randn(g, 2, 45, 16), randn(g, 2, 45, 8)
    shapes = "q (2, 37, 16), k (2, 45, 16), v (2, 45, 8)"
    for blocks in configs:
        words = block_words(style, *blocks)
        label = f"{shapes} (float64){words}"
        backward_case(session, style, label, q2, k2, v2, g, blocks=blocks)
    words = block_words(style, *configs[0])
    if causal:
        qc = randn(g, 2, 45, 16)
        label = f"q, k (2, 45, 16), v (2, 45, 8) (float64), is_causal=True{words}"
        backward_case(
            session, style, label, qc, k2, v2, g, causal=True, blocks=configs[0]
        )
    batch = randn(g, 2, 3, 20, 8), randn(g, 2, 3, 28, 8), randn(g, 2, 3, 28, 8)
    label = f"q (2, 3, 20, 8), k and v (2, 3, 28, 8) (float64){words}"
    backward_case(session, style, label, *batch, g, blocks=configs[0])
    for dtype in (F32, BF16):
        label = f"{shapes} ({str(dtype)[6:]}){words}"
        qd, kd, vd = q2.to(dtype), k2.to(dtype), v2.to(dtype)
        backward_case(session, style, label, qd, kd, vd, g, blocks=configs[0])
    checked = [
        "dq, dk and dv against autograd on inputs with L != S and D != Dv",
        "lengths 37 and 45, which no tile size divides",
        "batched (B, H, L, D) input",
    ]
    checked += ["is_causal=True"] if causal else []
    checked += [
        "the dtype kept (float64, float32, bfloat16)",
        "the inputs not modified",
    ]
    return session.report("check_flash_backward", checked)


def check_flash_function(
    cls_or_fn: type[torch.autograd.Function] | Callable[..., Any],
    *,
    causal: bool = True,
) -> CheckReport:
    r"""Check a student's FlashAttention as an autograd Function: its output, its
    gradients, and what its node saves for the backward pass.

    ``cls_or_fn`` is a ``torch.autograd.Function`` subclass, called as
    ``cls.apply(q, k, v, is_causal)``, or a function ``fn(q, k, v,
    is_causal=False)`` that returns its output (``(out, lse)`` is accepted:
    the output is checked). FlashAttention's backward pass recomputes the
    weights from the logsumexp, so the autograd graph of the output keeps
    ``q, k, v``, the output and one number per query row,
    :math:`\mathrm{lse}_i = \log \sum_j e^{s_{ij}}`, never the
    :math:`L \times S` weights or scores. Checked: the output on inputs with
    :math:`L \ne S` and :math:`D \ne D_v`, with ``is_causal=True``, in
    float32 and bfloat16; the gradients with respect to ``q``, ``k`` and
    ``v`` (by autograd through ``apply``), without and with the causal mask;
    that no node of the output's autograd graph saves a tensor of
    :math:`L \times S` entries per batch element (``save_for_backward`` or an
    attribute of ``ctx``), and that the Function's node saves the logsumexp
    (natural log), each with its own hint.

    Parameters
    ----------
    cls_or_fn : torch.autograd.Function subclass or callable
        The student's Function, or a function that calls its ``apply``.
    causal : bool
        Also check ``is_causal=True``.

    Returns
    -------
    CheckReport

    Examples
    --------
    >>> import torch, softmaxbook as sb
    >>> sb.checks.check_flash_function(sb.FlashAttention).ok
    True
    >>> class SavesWeights(torch.autograd.Function):
    ...     @staticmethod
    ...     def forward(ctx, q, k, v, is_causal=False):
    ...         p = torch.softmax(q @ k.mT / q.shape[-1] ** 0.5, dim=-1)
    ...         ctx.save_for_backward(q, k, v, p)
    ...         return p @ v
    ...     @staticmethod
    ...     def backward(ctx, grad_output):
    ...         q, k, v, p = ctx.saved_tensors
    ...         dp = grad_output @ v.mT
    ...         ds = p * (dp - (p * dp).sum(-1, keepdim=True)) / q.shape[-1] ** 0.5
    ...         return ds @ k, ds.mT @ q, p.mT @ grad_output, None
    >>> report = sb.checks.check_flash_function(SavesWeights, causal=False)
    >>> print(report.problems[0])  # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
    With q (2, 37, 16), k (2, 45, 16), v (2, 45, 8) (float64), the node of your
    autograd Function (SavesWeightsBackward) saves a tensor of shape (2, 37, 45):
    37 x 45 per batch element, the attention weights or scores. ...
    """
    fn, name = as_callable(cls_or_fn)
    session = Session(output_only(fn), "your FlashAttention", hints=FUNCTION_HINTS)
    session.name = name
    g = generator(13)
    q, k, v = randn(g, 2, 24, 8), randn(g, 2, 24, 8), randn(g, 2, 24, 8)
    first = "q, k, v of shape (2, 24, 8) (float64)"
    if not function_case(session, first, q, k, v, False):
        session.stopped = True  # the rest runs for the score, unreported
    q2, k2, v2 = randn(g, 2, 37, 16), randn(g, 2, 45, 16), randn(g, 2, 45, 8)
    shapes = "q (2, 37, 16), k (2, 45, 16), v (2, 45, 8)"
    label = f"{shapes} (float64)"
    function_case(session, label, q2, k2, v2, False)
    causal_label = "q, k (2, 45, 16), v (2, 45, 8) (float64), is_causal=True"
    qc = randn(g, 2, 45, 16)
    if causal:
        function_case(session, causal_label, qc, k2, v2, True)
    for dtype in (F32, BF16):
        ql, kl, vl = (t.to(dtype) for t in (q2, k2, v2))
        function_case(session, f"{shapes} ({str(dtype)[6:]})", ql, kl, vl, False)
    cases = [(label, q2, False)] + ([(causal_label, qc, True)] if causal else [])
    for words, qq, is_causal in cases:
        _function_gradients(session, g, words, qq, k2, v2, is_causal)
    check_saved(session, label, q2, k2, v2)
    checked = [
        "the output on inputs with L != S and D != Dv",
        "the dtype kept (float64, float32, bfloat16)",
        "the gradients with respect to q, k and v",
        "no L x S tensor saved for the backward pass",
        "the logsumexp saved",
    ]
    checked[1:1] = ["is_causal=True"] if causal else []
    return session.report("check_flash_function", checked)


def _function_gradients(
    session: Session,
    g: torch.Generator,
    label: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
) -> None:
    grad = randn(g, *q.shape[:-1], v.shape[-1])
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = attention64(scores64(leaves[0], leaves[1], causal), leaves[2])[0]
    want = torch.autograd.grad(out, leaves, grad)
    compare_gradients(
        session,
        label,
        list(zip("qkv", (q, k, v))),
        [("is_causal", True)] if causal else [],
        wrt={"q", "k", "v"},
        shapes=[out.shape],
        output_grads=[grad],
        want=dict(zip("qkv", want)),
        forward=out.detach(),
    )
