r"""Decoding from logits, and how much to trust the probabilities a softmax gives.

Two halves, both about the *output* softmax of a model rather than the one
inside attention:

* **Decoding.** :func:`top_k_filter` and :func:`top_p_filter` remove unlikely
  tokens by setting their logits to ``-inf``; :func:`sample` draws token
  indices after a temperature and those filters, reproducibly with a
  ``torch.Generator``. Greedy decoding is ``logits.argmax(-1)`` and needs no
  softmax at all: softmax is strictly increasing in each logit, so it never
  changes which entry is largest.
* **Calibration.** :func:`expected_calibration_error` and
  :func:`reliability_table` measure whether confidences match accuracies
  (Naeini et al., 2015; Guo et al., 2017); :func:`fit_temperature` fits the
  single temperature of *temperature scaling* on held-out data.

Throughout, ``-inf`` in a logit means "removed": such a token gets
probability 0 and is never sampled. The halves are the modules
``softmaxbook.sampling.decoding`` and ``softmaxbook.sampling.calibration``;
every name is re-exported here and as ``softmaxbook.<name>``.
"""

from .calibration import (
    ReliabilityTable,
    expected_calibration_error,
    fit_temperature,
    reliability_table,
)
from .decoding import sample, top_k_filter, top_p_filter

__all__ = [
    "top_k_filter",
    "top_p_filter",
    "sample",
    "ReliabilityTable",
    "reliability_table",
    "expected_calibration_error",
    "fit_temperature",
]
