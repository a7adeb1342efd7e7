r"""A tiny transformer built on the library's attention, with a pluggable normalizer,
and the toy task it learns.

Everything here is small enough to train on a laptop CPU in seconds:

- :func:`make_associative_recall` generates the toy task (key-value pairs,
  then a query key; predict its value), seeded and reproducible.
- :class:`TinyTransformer` is a decoder-only, pre-LayerNorm transformer with
  learned positional embeddings whose attention is
  :func:`~softmaxbook.scaled_dot_product_attention`: the normalizer
  (``"softmax"``, ``"sparsemax"``, ...), the scale and a temperature are
  arguments, and the forward pass can return every attention map.

A course trains it with its own loop, or with the book's (``bookkit.train``,
``bookkit.evaluate``), which lives in the book's harness with the case study
and the sink study that use it.
"""

from .data import make_associative_recall
from .transformer import MultiHeadAttention, TinyTransformer, TransformerBlock

__all__ = [
    "make_associative_recall",
    "MultiHeadAttention",
    "TransformerBlock",
    "TinyTransformer",
]

# The training loop and the studies moved to the book's harness in 0.2; each old
# name says where it went, without importing bookkit.
_MOVED_TO_BOOKKIT = {
    "train": "bookkit.train",
    "evaluate": "bookkit.evaluate",
    "TrainingHistory": "bookkit.TrainingHistory",
    "training": "bookkit.studies.training",
    "case_study": "bookkit.studies.case_study",
    "sink_study": "bookkit.studies.sink_study",
}


def __getattr__(name: str) -> object:
    if name in _MOVED_TO_BOOKKIT:
        raise AttributeError(
            f"softmaxbook.models.{name} moved to bookkit: use {_MOVED_TO_BOOKKIT[name]}"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
