"""The one policy every normalizer shares, declared once: ``@normalizer``.

Each normalizer is written as its math, a function of scores ``x`` that are
already checked and in the compute dtype, and of ``dim``, already a
non-negative index. The decorator supplies what every normalizer used to
repeat:

- ``x`` must be a floating-point ``torch.Tensor`` (``TypeError`` naming it:
  an integer tensor would be silently rounded);
- ``dim`` must be an int in range (``TypeError``/``IndexError``, as
  :func:`softmaxbook._validate.check_dim`);
- the options are checked (``options=``: a function that returns them
  checked) before any work, so bad options fail even on empty input;
- a 0-d tensor is a row of one score, and an input with no entries gives an
  empty result that keeps the autograd graph;
- ``float16``/``bfloat16`` scores are computed in ``float32`` and the weights
  rounded back once, so thresholds and sums are not found in 3 decimal digits
  (``upcast=False`` where torch's kernel already does this itself);
- and the normalizer is registered, with its properties, in
  :data:`~softmaxbook.normalizers.NORMALIZERS`.

:class:`RowwiseFunction` is the base of the normalizers written as an
autograd Function (a hand-written backward pass): its ``vmap`` rule lets
``torch.func`` batch them.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch
from torch import Tensor

from .._api import renamed_keywords
from .._validate import check_dim, check_float
from .registry import NormalizerInfo, register

__all__ = ["normalizer", "RowwiseFunction", "HALF"]

F = TypeVar("F", bound=Callable[..., Tensor])
#: ``options(x, dim, **options) -> options``: checks a normalizer's options.
Options = Callable[..., Mapping[str, Any]]

#: The dtypes computed in float32 and rounded back.
HALF = (torch.float16, torch.bfloat16)


def _rowwise(
    math: Callable[..., Tensor],
    x: Tensor,
    dim: int,
    options: dict[str, Any],
    check: Options | None,
    upcast: bool,
) -> Tensor:
    """``math(x=x, dim=dim, **options)`` for any shape of ``x``, in compute dtype."""
    scalar = x.dim() == 0
    if scalar:  # a single score is a row of length 1
        x, dim = x.unsqueeze(0), 0
    if check is not None:
        options = dict(check(x, dim, **options))
    if x.numel() == 0:
        out = x * 0  # nothing to normalize; keeps the autograd graph
    elif upcast and x.dtype in HALF:
        out = math(x=x.float(), dim=dim, **options).to(x.dtype)
    else:  # no .to(), not even a no-op: one torch call on the common path
        out = math(x=x, dim=dim, **options)
    return out.squeeze(0) if scalar else out


def _binder(
    name: str, signature: inspect.Signature
) -> Callable[[tuple[Any, ...], dict[str, Any]], dict[str, Any]]:
    """A fast ``signature.bind(*args, **kwargs)`` with the defaults applied.

    ``Signature.bind`` costs more than a small softmax; this fills a dict of
    the defaults instead, and leaves every unusual call (too many arguments,
    an unknown or repeated keyword, a missing ``x``) to ``bind`` itself, for
    Python's own ``TypeError`` with the function's ``name``.
    """
    positional = [
        n
        for n, p in signature.parameters.items()
        if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    ]
    defaults = {
        n: p.default
        for n, p in signature.parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    optional = defaults.keys()
    # taken[i]: the names that i positional arguments fill
    taken = [frozenset(positional[:i]) for i in range(len(positional) + 1)]

    def bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        n = len(args)
        if not 0 < n <= len(positional) or not (
            kwargs.keys() <= optional and taken[n].isdisjoint(kwargs)
        ):
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as error:  # Python's message, with the function's name
                raise TypeError(f"{name}(): {error}") from None
            bound.apply_defaults()
            return dict(bound.arguments)
        arguments = dict(defaults)
        arguments.update(zip(positional, args))
        arguments.update(kwargs)
        return arguments

    return bind


def normalizer(
    *,
    sparse: bool,
    sums_to_one: bool,
    differentiable: bool = True,
    empty_rows: str = "zeros",
    aliases: tuple[str, ...] = (),
    options: Options | None = None,
    upcast: bool = True,
    renamed: Mapping[str, str] | None = None,
) -> Callable[[F], F]:
    """Declare a normalizer: wrap its math in the shared policy and register it.

    The decorated function takes ``(x, dim, **options)`` (its signature is
    the public one, with ``x`` and ``dim`` and every option defaulted) and is
    called with ``x`` checked and in the compute dtype and ``dim`` a
    non-negative index. ``sparse``, ``sums_to_one``, ``differentiable``,
    ``empty_rows`` and ``upcast`` are its properties in the registry (see
    :class:`~softmaxbook.normalizers.NormalizerInfo`); a ``temperature``
    option is read off the signature. ``options(x, dim, **options)`` returns
    the options checked; ``renamed`` maps deprecated keyword names to new
    ones (``{"sink": "sinks"}``).

    >>> import torch
    >>> @normalizer(sparse=False, sums_to_one=True)
    ... def doubled_softmax(x, dim=-1):
    ...     return torch.softmax(2 * x, dim)
    >>> doubled_softmax(torch.tensor([0.0, 1.0], dtype=torch.float16)).dtype
    torch.float16
    >>> from softmaxbook.normalizers.registry import NORMALIZERS
    >>> NORMALIZERS.pop("doubled_softmax").sums_to_one
    True
    """

    def decorate(math: F) -> F:
        signature = inspect.signature(math)
        if list(signature.parameters)[:1] != ["x"] or "dim" not in signature.parameters:
            raise TypeError(f"a normalizer takes (x, ..., dim, ...), not {signature}")

        bind = _binder(math.__name__, signature)

        @functools.wraps(math)
        def checked(*args: Any, **kwargs: Any) -> Tensor:
            opts = bind(args, kwargs)
            x = check_float(opts.pop("x"))
            dim = check_dim(x, opts.pop("dim"))
            return _rowwise(math, x, dim, opts, options, upcast)

        public = renamed_keywords(**renamed)(checked) if renamed else checked
        parameters = tuple(p for p in signature.parameters if p not in ("x", "dim"))
        info = NormalizerInfo(
            name=math.__name__,
            function=public,
            sparse=sparse,
            sums_to_one=sums_to_one,
            temperature="temperature" in parameters,
            differentiable=differentiable,
            empty_rows=empty_rows,
            upcast=upcast,
            parameters=parameters,
            aliases=aliases,
        )
        register(info)
        return public  # type: ignore[return-value]

    return decorate


class RowwiseFunction(torch.autograd.Function):
    """An autograd Function that normalizes ``x`` along ``dim``, row by row.

    ``forward(x, dim, *options)`` computes, ``setup_context`` saves what the
    backward pass needs, and the ``vmap`` rule below lets ``torch.func.vmap``
    (and so ``jacrev``, ``jacfwd`` of a batch, per-sample gradients) batch it:
    a vmapped dimension is one more batch dimension, so the rule moves it to
    the front and normalizes the same ``dim`` of every row at once.
    """

    @classmethod
    def vmap(
        cls,
        info: Any,
        in_dims: tuple[int | None, ...],
        x: Tensor,
        dim: int,
        *options: Any,
    ) -> tuple[Tensor, int | None]:
        if in_dims[0] is None:  # x is not batched: nothing to do but the call
            return cls.apply(x, dim, *options), None
        x = x.movedim(in_dims[0], 0)
        return cls.apply(x, dim if dim < 0 else dim + 1, *options), 0
