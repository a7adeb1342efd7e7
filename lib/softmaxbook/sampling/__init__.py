r"""Decoding from logits, and how much to trust the probabilities a softmax gives.

Two halves, both about the *output* softmax of a model rather than the one
inside attention:

* **Decoding.** :func:`top_k_filter`, :func:`top_p_filter` and
  :func:`min_p_filter` remove unlikely tokens by setting their logits to
  ``-inf``; :func:`sample` draws token
  indices after a temperature and those filters, reproducibly with a
  ``torch.Generator``. Greedy decoding is ``logits.argmax(-1)`` and needs no
  softmax at all: softmax keeps the order of a row's entries (in exact
  arithmetic; in floating point it can turn a near-tie into a tie).
* **Calibration.** :func:`expected_calibration_error` and
  :func:`reliability_table` measure whether confidences match accuracies
  (Naeini et al., 2015; Guo et al., 2017); :func:`fit_temperature` fits the
  single temperature of *temperature scaling* on held-out data.

Throughout, ``-inf`` in a logit means "removed": such a token gets
probability 0 and is never sampled. The modules are
``softmaxbook.sampling.decoding``, ``softmaxbook.sampling.speculative`` and
``softmaxbook.sampling.calibration``;
every name is re-exported here and as ``softmaxbook.<name>``.
"""

from .calibration import (
    ReliabilityTable,
    expected_calibration_error,
    fit_temperature,
    reliability_table,
)
from .decoding import min_p_filter, sample, top_k_filter, top_p_filter
from .speculative import SpeculativeResult, speculative_accept

__all__ = [
    "top_k_filter",
    "top_p_filter",
    "min_p_filter",
    "sample",
    "SpeculativeResult",
    "speculative_accept",
    "ReliabilityTable",
    "reliability_table",
    "expected_calibration_error",
    "fit_temperature",
]
