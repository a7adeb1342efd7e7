r"""A tiny transformer built on the library's attention, with a pluggable normalizer
(the case study).

Everything here is small enough to train on a laptop CPU in seconds:

- :func:`make_associative_recall` generates the toy task (key-value pairs,
  then a query key; predict its value), seeded and reproducible.
- :class:`TinyTransformer` is a decoder-only, pre-LayerNorm transformer with
  learned positional embeddings whose attention is
  :func:`~softmaxbook.scaled_dot_product_attention`: the normalizer
  (``"softmax"``, ``"sparsemax"``, ...), the scale and a temperature are
  arguments, and the forward pass can return every attention map.
- :func:`train` and :func:`evaluate` fit and score it, and record the
  per-head diagnostics of :mod:`softmaxbook.analysis` along the way.
"""

from .data import make_associative_recall
from .training import TrainingHistory, evaluate, train
from .transformer import MultiHeadAttention, TinyTransformer, TransformerBlock

__all__ = [
    "make_associative_recall",
    "MultiHeadAttention",
    "TransformerBlock",
    "TinyTransformer",
    "TrainingHistory",
    "train",
    "evaluate",
]
