"""The book's experiments: the case study (chapter 9), the sink study (chapter 10)
and the training loop they share.

- :mod:`bookkit.studies.training`: :func:`train` and :func:`evaluate` fit and
  score a :class:`softmaxbook.TinyTransformer` and record the per-head
  diagnostics of :mod:`softmaxbook.analysis` along the way
  (:class:`TrainingHistory`).
- :mod:`bookkit.studies.case_study`: chapter 9's recipe, variants and seed sweep.
- :mod:`bookkit.studies.sink_study`: chapter 10's attention-sink experiment.

The two studies are modules, not re-exported names: a chapter writes
``from bookkit.studies import case_study as cs`` and reads ``cs.run``,
``cs.load``, ``cs.VARIANTS``.
"""

from .training import TrainingHistory, evaluate, train

__all__ = ["TrainingHistory", "train", "evaluate"]
