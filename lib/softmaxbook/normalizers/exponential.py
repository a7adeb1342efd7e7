r"""Softmax and log-softmax with a temperature, and logsumexp, in torch.

These are thin, checked wrappers around torch's fused kernels: the same dtype
and device as the input, no extra copies, and a clear error for bad input.
With ``temperature=1`` they cost what ``torch.softmax`` costs, plus the
argument checks. Half precision goes to torch's kernels as it is: its
softmax and logsumexp compute in float32 themselves and round once, so an
upcast here would only add two copies (``upcast=False`` in the policy). Its
CPU ``log_softmax`` along the last dimension does not round once in float16
and bfloat16 (torch 2.13: errors of several units in the last place of the
result, -0.1011 where -0.1007 is the correctly rounded value), and
:func:`log_softmax` passes that on; upcast to float32 yourself where it
matters. Like ``torch.softmax``, a row
of only ``-inf`` gives ``nan``: :func:`~softmaxbook.masked_softmax` is the
softmax that gives such a row zeros.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._validate import check_dim, check_float, check_positive
from ._policy import normalizer

__all__ = ["softmax", "log_softmax", "logsumexp"]


def _temperature(x: Tensor, dim: int, *, temperature: float) -> dict[str, float]:
    return {"temperature": check_positive(temperature, "temperature")}


def _scaled(x: Tensor, temperature: float) -> Tensor:
    return x if temperature == 1.0 else x / temperature  # no copy in the common case


@normalizer(
    sparse=False,
    sums_to_one=True,
    empty_rows="nan",
    options=_temperature,
    upcast=False,
)
def softmax(x: Tensor, dim: int = -1, *, temperature: float = 1.0) -> Tensor:
    r"""Softmax along ``dim``:
    :math:`\mathrm{softmax}(x)_i = e^{x_i/T} / \sum_j e^{x_j/T}`.

    This is ``torch.softmax``, on every device, plus one division of ``x``
    by ``temperature`` when it is not 1: the same kernel, the same cost. It
    never switches to another implementation; the fused Triton softmax is
    opt-in, as :func:`softmaxbook.kernels.fused_softmax`. Stable for any
    finite input: the kernel subtracts the row maximum before ``exp``.
    Entries equal to ``-inf`` get weight 0; a ``nan`` anywhere in a row makes
    the whole row ``nan`` rather than hiding it.

    Shapes: ``x`` is ``(..., N)``; the result has the same shape and dtype.

    Equivalent to ``torch.softmax(x / temperature, dim)``:

    >>> import torch
    >>> import softmaxbook as sb
    >>> x = torch.randn(3, 5)
    >>> torch.allclose(sb.softmax(x, temperature=2.0), torch.softmax(x / 2.0, -1))
    True

    Parameters
    ----------
    x : Tensor
        Scores (logits), any floating dtype and device.
    dim : int
        The dimension to normalize; negative values count from the end.
    temperature : float
        :math:`T > 0`. Below 1 sharpens the distribution, above 1 flattens it.

    Examples
    --------
    >>> import torch
    >>> x = torch.tensor([1.0, 0.5, 2.5, -0.1])
    >>> softmax(x)
    tensor([0.1557, 0.0945, 0.6980, 0.0518])
    >>> torch.allclose(softmax(x, temperature=2.0), torch.softmax(x / 2.0, -1))
    True
    """
    return torch.softmax(_scaled(x, temperature), dim=dim)


def log_softmax(x: Tensor, dim: int = -1, *, temperature: float = 1.0) -> Tensor:
    r"""Log-softmax along ``dim``: :math:`x_i/T - \log \sum_j e^{x_j/T}`.

    Computed without forming the probabilities, so it stays finite where
    ``log(softmax(x))`` underflows to ``-inf``. This is what cross-entropy
    losses use, and why they take logits rather than probabilities.

    Shapes: ``x`` is ``(..., N)``; the result has the same shape and dtype.

    It is not in the registry of normalizers: its values are log-weights.

    Equivalent to ``torch.log_softmax(x / temperature, dim)``:

    >>> import torch
    >>> x = torch.tensor([0.0, -800.0])
    >>> log_softmax(x)
    tensor([   0., -800.])
    >>> torch.equal(log_softmax(x), torch.log_softmax(x, -1))
    True
    """
    check_float(x)
    dim = check_dim(x, dim)
    temperature = check_positive(temperature, "temperature")
    return torch.log_softmax(_scaled(x, temperature), dim=dim)


def logsumexp(x: Tensor, dim: int = -1, keepdim: bool = False) -> Tensor:
    r"""Stable :math:`\log \sum_j e^{x_j} = m + \log \sum_j e^{x_j - m}`,
    :math:`m = \max_j x_j`.

    A smooth maximum: :math:`\max_j x_j \le \operatorname{logsumexp}(x) \le
    \max_j x_j + \log N`. A row of all ``-inf`` gives ``-inf``.

    Shapes: ``x`` is ``(..., N)``; the result is ``(...)``, or ``(..., 1)``
    with ``keepdim=True``.

    A reduction, not a normalizer (it is not in the registry).

    Equivalent to ``torch.logsumexp(x, dim, keepdim)``:

    >>> import torch
    >>> logsumexp(torch.tensor([0.0, 0.0]))
    tensor(0.6931)
    """
    check_float(x)
    dim = check_dim(x, dim)
    return torch.logsumexp(x, dim=dim, keepdim=keepdim)
