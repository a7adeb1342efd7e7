"""Every normalizer by name, with its properties: the registry.

A *normalizer* maps scores to weights along one dimension,
``f(scores, dim=-1, **options) -> weights``, every option with a default.
:data:`NORMALIZERS` holds each one as a :class:`NormalizerInfo`: the function
and what a table of normalizers (or a test, or a model) needs to know about it
without calling it. The entries are made by the ``@normalizer`` decorator of
:mod:`softmaxbook.normalizers._policy`, next to each normalizer's math, so a
normalizer cannot exist without its entry.

The keys are every name ``normalizer=`` accepts in
:func:`~softmaxbook.scaled_dot_product_attention` and the models: each
normalizer's function name, plus the short names ``"relu"`` and ``"sigmoid"``
of :func:`relu_normalize` and :func:`sigmoid_normalize` (the same entries).
An entry is callable like its function, so ``NORMALIZERS["sparsemax"](x)`` is
``sparsemax(x)``.

>>> from softmaxbook.normalizers import NORMALIZERS
>>> info = NORMALIZERS["sparsemax"]
>>> info.sparse, info.sums_to_one, info.parameters
(True, True, ())
>>> NORMALIZERS["relu"] is NORMALIZERS["relu_normalize"]
True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

__all__ = ["NORMALIZERS", "NormalizerInfo", "all_normalizers"]


@dataclass(frozen=True)
class NormalizerInfo:
    """A normalizer and its properties, as the registry holds it.

    - ``name``: the function's name, e.g. ``"sparsemax"``;
    - ``function``: ``function(scores, dim=-1, **options) -> weights``;
    - ``sparse``: finite scores can get exactly zero weight;
    - ``sums_to_one``: the weights of a row sum to 1 (on a row with something
      to attend to; :func:`~softmaxbook.relu_normalize` also needs a positive
      score);
    - ``temperature``: takes a ``temperature=`` keyword;
    - ``differentiable``: has a gradient (almost everywhere) that autograd
      and ``torch.func`` can take;
    - ``empty_rows``: what a row of only ``-inf`` (nothing to attend) gives,
      ``"zeros"``, or ``"nan"`` as ``torch.softmax`` does;
    - ``upcast``: ``float16``/``bfloat16`` scores are computed in
      ``float32``, forward and backward, and rounded back once; False where
      torch's own half kernel runs (its forward computes in float32, its
      backward in the input's dtype);
    - ``parameters``: the options it takes besides the scores and ``dim``,
      all with defaults;
    - ``aliases``: other names it is registered under.

    Calling the entry calls the function.
    """

    name: str
    function: Callable[..., Tensor]
    sparse: bool
    sums_to_one: bool
    temperature: bool
    differentiable: bool
    empty_rows: str
    upcast: bool
    parameters: tuple[str, ...]
    aliases: tuple[str, ...] = ()

    def __call__(self, scores: Tensor, *, dim: int = -1, **options: Any) -> Tensor:
        """Call the function: ``NORMALIZERS[name](scores, dim=-1, **options)``.

        ``dim`` and the options are keywords here: the functions differ in what their
        second positional parameter is (``dim`` for most, ``sinks`` for
        ``sink_softmax``, ``alpha`` for ``entmax_bisect``).
        """
        return self.function(scores, dim=dim, **options)


#: Every normalizer by name (and alias) -> its :class:`NormalizerInfo`.
#:
#: :meta hide-value:
NORMALIZERS: dict[str, NormalizerInfo] = {}


def register(info: NormalizerInfo) -> NormalizerInfo:
    """Add ``info`` under its name and its aliases; a name is registered once."""
    for name in (info.name, *info.aliases):
        if name in NORMALIZERS:
            raise ValueError(f"a normalizer named {name!r} is already registered")
        NORMALIZERS[name] = info
    return info


def all_normalizers() -> tuple[NormalizerInfo, ...]:
    """Each registered normalizer once (aliases left out), sorted by name.

    >>> from softmaxbook.normalizers import all_normalizers
    >>> [info.name for info in all_normalizers()][:3]
    ['adaptive_temperature_softmax', 'clipped_softmax', 'entmax15']
    """
    return tuple(
        info
        for name, info in sorted(NORMALIZERS.items())
        if isinstance(info, NormalizerInfo) and name == info.name
    )
