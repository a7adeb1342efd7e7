"""The book's harness: what only *Softmax in Attention* needs, not a course.

``softmaxbook`` is the library instructors reuse; ``bookkit`` holds what the
book's pages need beside it. A chapter's first cell reads::

    import softmaxbook as sb
    import bookkit as bk

    device = bk.setup_notebook(seed=0)

- :mod:`bookkit.notebook`: :func:`setup_notebook` and :func:`glue` (numbers in
  the prose);
- :mod:`bookkit.plotting`: the figure style (:data:`PALETTE`, :func:`use_style`)
  and the book's plot helpers;
- :mod:`bookkit.timing`: :func:`time_call` and :func:`machine_info`, the timing
  tables' measurements;
- :mod:`bookkit.studies`: the training loop (:func:`train`, :func:`evaluate`,
  :class:`TrainingHistory`) and the case-study and sink-study runners
  (``from bookkit.studies import case_study``);
- :mod:`bookkit.diagrams`: the drawn diagrams; :mod:`bookkit.claims`: the claims
  ledger's reader; :mod:`bookkit.facts`, :mod:`bookkit.hardware`: shared numbers.

``bookkit`` imports ``softmaxbook``; ``softmaxbook`` never imports ``bookkit``.
"""

from .notebook import glue, setup_notebook
from .plotting import PALETTE, plot_curves, plot_distribution, plot_heatmap, use_style
from .studies.training import TrainingHistory, evaluate, train
from .timing import machine_info, time_call

__all__ = [
    # the first cell of a page, and numbers glued into its prose
    "setup_notebook",
    "glue",
    # figures
    "PALETTE",
    "use_style",
    "plot_distribution",
    "plot_curves",
    "plot_heatmap",
    # timing cells
    "time_call",
    "machine_info",
    # the studies' training loop
    "train",
    "evaluate",
    "TrainingHistory",
]
