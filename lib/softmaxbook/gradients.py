r"""The softmax Jacobian and its vector-Jacobian product.

For :math:`s = \mathrm{softmax}(x)` the partial derivatives are

.. math:: \frac{\partial s_i}{\partial x_j} = s_i\,(\delta_{ij} - s_j),
          \qquad J(s) = \operatorname{diag}(s) - s s^\top,

with :math:`\delta_{ij}` the Kronecker delta (1 if :math:`i = j`, else 0).
Backpropagation never needs :math:`J` itself, only the vector-Jacobian
product :math:`J^\top g = s \odot (g - s \cdot g)` (``J`` is symmetric), which
costs :math:`O(N)` time and memory instead of :math:`O(N^2)`.

Everything here is written in terms of the softmax *output* :math:`s`: that is
what a backward pass has saved, and the Jacobian is a function of it alone.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._validate import check_dim, check_float, zero_empty_rows

__all__ = [
    "softmax_jacobian",
    "softmax_backward",
    "SoftmaxFunction",
    "softmax_with_custom_backward",
]

# Reductions over a row in 16-bit floats lose digits; accumulate them in float32.
_LOW_PRECISION = (torch.float16, torch.bfloat16)


def softmax_jacobian(s: Tensor, dim: int = -1) -> Tensor:
    r"""The Jacobian of softmax from its output:
    :math:`J = \operatorname{diag}(s) - s s^\top`.

    Entry :math:`(i, j)` is
    :math:`\partial s_i / \partial x_j = s_i(\delta_{ij} - s_j)`.
    ``J`` is symmetric and positive semidefinite, each of its rows sums to 0
    (the weights always sum to one, so no change of the scores can change
    their total), and its largest eigenvalue is at most :math:`1/2`. A fully
    masked row (all zeros) gives the zero matrix.

    This materializes :math:`N^2` numbers per row: use it to look at the
    Jacobian, and :func:`~softmaxbook.softmax_backward` to backpropagate.

    Shapes: ``s`` is ``(..., N)`` along ``dim``; the result is
    ``(..., N, N)``, where ``...`` are the other dimensions of ``s`` in their
    order (``dim`` is moved to the end before the last axis is appended).

    Equivalent to ``torch.diag_embed(s) - s[..., :, None] * s[..., None, :]``
    for ``dim=-1``, and to the Jacobian torch's autograd finds:

    >>> import torch
    >>> import softmaxbook as sb
    >>> x = torch.randn(4, dtype=torch.float64)
    >>> s = torch.softmax(x, -1)
    >>> J = sb.softmax_jacobian(s)
    >>> torch.allclose(J, torch.diag_embed(s) - s[:, None] * s[None, :])
    True
    >>> J_autograd = torch.autograd.functional.jacobian(lambda x: x.softmax(-1), x)
    >>> torch.allclose(J, J_autograd), torch.allclose(J.sum(-1), torch.zeros_like(s))
    (True, True)

    Parameters
    ----------
    s : Tensor
        Softmax output (weights that sum to 1 along ``dim``, or a zero row).
    dim : int
        The dimension along which the softmax was taken; negative values
        count from the end.

    Returns
    -------
    Tensor
        The Jacobians, one ``(N, N)`` matrix per row, in the dtype of ``s``.

    Raises
    ------
    TypeError
        If ``s`` is not a floating-point tensor.
    ValueError
        If ``s`` is a 0-d tensor (a Jacobian needs a row).
    IndexError
        If ``dim`` is out of range.
    """
    check_float(s, "s")
    dim = check_dim(s, dim)
    if s.dim() == 0:
        raise ValueError("s must have at least one dimension, got a 0-d tensor")
    s = s.movedim(dim, -1)  # (..., N)
    return torch.diag_embed(s) - s.unsqueeze(-1) * s.unsqueeze(-2)  # (..., N, N)


def softmax_backward(s: Tensor, grad_output: Tensor, dim: int = -1) -> Tensor:
    r"""Vector-Jacobian product of softmax:
    :math:`\bar x = s \odot (g - \textstyle\sum_j s_j g_j)`.

    Given the softmax output :math:`s` and the gradient :math:`g` of a loss
    with respect to :math:`s`, returns the gradient with respect to the
    scores :math:`x`, :math:`J^\top g = J g`, without forming :math:`J`:
    one dot product and one elementwise update, :math:`O(N)` time and memory.
    Entries with :math:`s_i = 0` (scores of ``-inf``, masked keys) get an
    exact zero gradient when :math:`g_i - s \cdot g` is finite, as it is for a
    finite :math:`g` short of the format's overflow (in float32, ``g = [-3e38,
    3e38]`` with ``s = [1, 0]`` overflows to ``inf`` and gives ``nan``). An
    infinite or ``nan`` entry of :math:`g` makes :math:`s \cdot g` infinite or
    ``nan``: the row's gradient is then ``nan`` at the masked entries and
    ``nan`` or infinite elsewhere (``s = [0.5, 0.5, 0]``, ``g = [inf, 0, 0]``
    gives ``[nan, -inf, nan]``). In float16 and bfloat16 the arithmetic is
    done in float32 and the result rounded once.

    Shapes: ``s`` and ``grad_output`` are ``(..., N)`` along ``dim`` with the
    same shape; the result has that shape too.

    Equivalent to ``s * (g - (s * g).sum(dim, keepdim=True))``, and to
    ``softmax_jacobian(s) @ g`` for ``dim=-1``:

    >>> import torch
    >>> import softmaxbook as sb
    >>> x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    >>> g = torch.randn(3, 5, dtype=torch.float64)
    >>> s = torch.softmax(x, -1)
    >>> (x_grad,) = torch.autograd.grad(s, x, g)
    >>> vjp = sb.softmax_backward(s.detach(), g)
    >>> torch.allclose(vjp, x_grad)
    True
    >>> jacobian = sb.softmax_jacobian(s.detach())
    >>> torch.allclose(vjp, (jacobian @ g[..., None])[..., 0])
    True

    Parameters
    ----------
    s : Tensor
        Softmax output along ``dim``.
    grad_output : Tensor
        :math:`g = \partial \mathcal{L} / \partial s`, the same shape as ``s``.
    dim : int
        The dimension along which the softmax was taken.

    Returns
    -------
    Tensor
        :math:`\partial \mathcal{L} / \partial x`, in the promoted dtype of
        ``s`` and ``grad_output``.

    Raises
    ------
    TypeError
        If ``s`` or ``grad_output`` is not a floating-point tensor.
    ValueError
        If the shapes of ``s`` and ``grad_output`` differ.
    IndexError
        If ``dim`` is out of range.
    """
    check_float(s, "s")
    check_float(grad_output, "grad_output")
    if grad_output.shape != s.shape:
        raise ValueError(
            f"grad_output must have the shape of s, {tuple(s.shape)}, "
            f"got {tuple(grad_output.shape)}"
        )
    dim = check_dim(s, dim)
    out_dtype = torch.promote_types(s.dtype, grad_output.dtype)
    work = torch.float32 if out_dtype in _LOW_PRECISION else out_dtype
    s_, g_ = s.to(work), grad_output.to(work)
    dot = (s_ * g_).sum(dim=dim, keepdim=True)  # (..., 1, ...): s . g per row
    return (s_ * (g_ - dot)).to(out_dtype)


class SoftmaxFunction(torch.autograd.Function):
    r"""Softmax as a ``torch.autograd.Function`` with the hand-written backward.

    The forward pass is ``torch.softmax`` and saves only its output :math:`s`
    (``N`` numbers per row); the backward pass is
    :func:`~softmaxbook.softmax_backward`. Entries of ``-inf`` get weight 0
    and, for a finite upstream gradient (short of overflow, see
    :func:`~softmaxbook.softmax_backward`), gradient 0; a row that is entirely
    ``-inf`` (nothing to attend to) gives zeros, not ``nan``, in both passes.
    ``nan`` in the input propagates.

    Shapes: ``x`` is ``(..., N)`` along ``dim``; the output has its shape and dtype.

    Call it through :func:`~softmaxbook.softmax_with_custom_backward`, or as
    ``SoftmaxFunction.apply(x, dim)`` (positional arguments only).

    It composes with ``torch.func``: ``vmap`` (its forward is plain torch code,
    ``generate_vmap_rule``), ``grad`` and ``jacrev`` (the backward above),
    ``jacfwd`` and ``hessian`` (a ``jvp``: :math:`J` is symmetric, so
    :math:`Jt = s \odot (t - s \cdot t)` too).
    """

    # forward is plain torch code, so torch.func.vmap can batch it on its own.
    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, dim: int) -> Tensor:
        # A row of only -inf would give nan (exp(-inf - (-inf))); it gives zeros.
        return zero_empty_rows(lambda z: torch.softmax(z, dim=dim), x, dim)

    @staticmethod
    # ctx is typed Any: torch's FunctionCtx does not declare the attributes set on it.
    def setup_context(ctx: Any, inputs: tuple[Tensor, int], output: Tensor) -> None:
        ctx.dim = inputs[1]
        ctx.save_for_backward(output)  # the Jacobian is a function of s alone
        ctx.save_for_forward(output)

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor, None]:
        (s,) = ctx.saved_tensors
        return softmax_backward(s, grad_output, ctx.dim), None

    @staticmethod
    def jvp(ctx: Any, x_tangent: Tensor, _dim_tangent: None) -> Tensor:
        # Forward mode (torch.func.jacfwd, hessian): J is symmetric, so J t has
        # the form of the vector-Jacobian product.
        (s,) = ctx.saved_tensors
        return softmax_backward(s, x_tangent, ctx.dim)


def softmax_with_custom_backward(x: Tensor, dim: int = -1) -> Tensor:
    r"""Softmax whose gradient is the hand-written VJP :math:`s \odot (g - s \cdot g)`.

    The same values and gradients as ``torch.softmax(x, dim)`` (up to
    rounding), computed by :class:`~softmaxbook.SoftmaxFunction`, so the
    backward pass is code you can read and step through. Scores of ``-inf``
    get weight 0 and, for a finite upstream gradient (short of overflow, see
    :func:`~softmaxbook.softmax_backward`), a gradient of exactly 0;
    a row that is entirely ``-inf``
    gives zeros, not ``nan``. Works in every floating dtype; in float16 and
    bfloat16 the backward accumulates in float32.

    Shapes: ``x`` is ``(..., N)`` along ``dim``; the result has its shape and dtype.

    Equivalent to ``SoftmaxFunction.apply(x, dim)``; its values and gradients are
    torch's:

    >>> import torch
    >>> import softmaxbook as sb
    >>> x = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)
    >>> g = torch.randn(2, 6, dtype=torch.float64)
    >>> ours = torch.autograd.grad(sb.softmax_with_custom_backward(x), x, g)[0]
    >>> torch.allclose(ours, torch.autograd.grad(x.softmax(-1), x, g)[0])
    True
    >>> sb.softmax_with_custom_backward(torch.full((3,), float("-inf")))
    tensor([0., 0., 0.])

    Parameters
    ----------
    x : Tensor
        Scores (logits), any floating dtype and device.
    dim : int
        The dimension to normalize; negative values count from the end.

    Returns
    -------
    Tensor
        The softmax of ``x`` along ``dim``.

    Raises
    ------
    TypeError
        If ``x`` is not a floating-point tensor or ``dim`` is not an int.
    IndexError
        If ``dim`` is out of range.
    """
    check_float(x)
    dim = check_dim(x, dim)
    return SoftmaxFunction.apply(x, dim)
