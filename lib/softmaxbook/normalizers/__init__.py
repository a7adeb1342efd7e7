r"""Normalizers: maps from attention scores to weights, and their registry.

A normalizer takes scores ``x`` and a dimension ``dim`` (and options with
defaults) and returns weights of the same shape and dtype. Each is written
once, as its math, in the module of its family; ``@normalizer``
(``softmaxbook.normalizers._policy``) supplies the policy they share:
floating-point tensors only, ``dim`` checked, ``float16``/``bfloat16``
computed in ``float32`` and rounded back once, 0-d and empty input; ``-inf``
is a removed key. And it registers each one, with its properties, in
:data:`NORMALIZERS`, which ``normalizer="name"`` of
:func:`~softmaxbook.scaled_dot_product_attention` and the models read.

- :mod:`~softmaxbook.normalizers.exponential`: :func:`softmax` (with a
  temperature), :func:`log_softmax`, :func:`logsumexp`;
- :mod:`~softmaxbook.normalizers.sparse`: :func:`sparsemax`,
  :func:`entmax15`, :func:`entmax_bisect`, exact zeros on the simplex;
- :mod:`~softmaxbook.normalizers.pointwise`: :func:`softmax_one`,
  :func:`relu_normalize`, :func:`sigmoid_normalize`;
- :mod:`~softmaxbook.normalizers.sinks`: :func:`sink_softmax`,
  :func:`softpick`, :func:`clipped_softmax`, :func:`relu_attention`, maps
  that may attend to nothing;
- :mod:`~softmaxbook.normalizers.length`: :func:`scalable_softmax`,
  :func:`adaptive_temperature_softmax`, and :func:`yarn_logit_scale`,
  keeping attention sharp at length;
- :mod:`~softmaxbook.normalizers.stickbreaking`: :func:`stick_breaking`.

>>> import torch
>>> from softmaxbook.normalizers import NORMALIZERS
>>> x = torch.tensor([1.2, 0.9, 0.1, -1.0])
>>> {name: int((NORMALIZERS[name](x) == 0).sum()) for name in ("softmax", "sparsemax")}
{'softmax': 0, 'sparsemax': 2}
"""

from . import registry
from .exponential import log_softmax, logsumexp, softmax
from .length import adaptive_temperature_softmax, scalable_softmax, yarn_logit_scale
from .pointwise import relu_normalize, sigmoid_normalize, softmax_one
from .registry import NormalizerInfo, all_normalizers
from .sinks import clipped_softmax, relu_attention, sink_softmax, softpick
from .sparse import entmax15, entmax_bisect, sparsemax
from .stickbreaking import stick_breaking

#: Every normalizer by name (and alias) -> its :class:`NormalizerInfo`: the
#: names ``normalizer=`` accepts. The dict of ``registry``, filled by
#: ``@normalizer`` next to each normalizer's math.
#:
#: :meta hide-value:
NORMALIZERS = registry.NORMALIZERS

__all__ = [
    # the registry
    "NORMALIZERS",
    "NormalizerInfo",
    "all_normalizers",
    # exponential
    "softmax",
    "log_softmax",
    "logsumexp",
    # sparse
    "sparsemax",
    "entmax15",
    "entmax_bisect",
    # pointwise
    "softmax_one",
    "relu_normalize",
    "sigmoid_normalize",
    # sinks
    "sink_softmax",
    "softpick",
    "clipped_softmax",
    "relu_attention",
    # length
    "scalable_softmax",
    "adaptive_temperature_softmax",
    "yarn_logit_scale",
    # stick-breaking
    "stick_breaking",
]
