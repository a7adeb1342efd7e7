"""softmaxbook: the library of the executable textbook *Softmax in Attention*.

Softmax and its relatives for transformer attention, written to be read:
NumPy references that read like the math (:mod:`softmaxbook.reference`), torch
functions that run on CPU, CUDA and Apple MPS, and figure helpers for the book.

>>> import torch, softmaxbook as sb
>>> sb.softmax(torch.tensor([1.0, 0.5, 2.5, -0.1]))
tensor([0.1557, 0.0945, 0.6980, 0.0518])

Every public name below is listed in the ``__all__`` of its module; this
package re-exports them all, so ``sb.<name>`` works for each.
"""

import importlib as _importlib
import typing as _typing

from . import (
    analysis,
    attention,
    capping,
    decode,
    device,
    differential,
    flash,
    flex,
    gradients,
    kernels,
    losses,
    masking,
    models,
    normalizers,
    online,
    patterns,
    reference,
    ring,
    sampling,
    selective,
)
from .analysis import *  # noqa: F403
from .attention import *  # noqa: F403
from .capping import *  # noqa: F403
from .decode import *  # noqa: F403
from .device import *  # noqa: F403
from .differential import *  # noqa: F403
from .flash import *  # noqa: F403
from .flex import *  # noqa: F403
from .gradients import *  # noqa: F403
from .kernels.dispatch import *  # noqa: F403
from .losses import *  # noqa: F403
from .masking import *  # noqa: F403
from .models import *  # noqa: F403
from .normalizers import (
    adaptive_temperature_softmax,
    clipped_softmax,
    entmax15,
    entmax_bisect,
    log_softmax,
    logsumexp,
    relu_attention,
    relu_normalize,
    scalable_softmax,
    sigmoid_normalize,
    sink_softmax,
    softmax,
    softmax_one,
    softpick,
    sparsemax,
    stick_breaking,
    yarn_logit_scale,
)
from .online import *  # noqa: F403
from .patterns import *  # noqa: F403
from .ring import *  # noqa: F403
from .sampling import *  # noqa: F403
from .selective import *  # noqa: F403

if _typing.TYPE_CHECKING:  # imported on first use at run time: see __getattr__ below
    from . import checks

__version__ = "0.1.0"

#: The public API, by module. ``reference``, ``kernels`` and ``checks`` stay
#: modules (``sb.reference.softmax``, ``sb.kernels.triton_softmax``,
#: ``sb.checks.check_softmax``); of ``kernels``, the dispatch report is also
#: here (``sb.explain_dispatch``).
__all__ = [
    "softmax",
    "log_softmax",
    "logsumexp",
    *masking.__all__,
    *patterns.__all__,
    *attention.__all__,
    *flex.__all__,
    *online.__all__,
    *flash.__all__,
    *decode.__all__,
    *ring.__all__,
    *gradients.__all__,
    "sparsemax",
    "entmax15",
    "entmax_bisect",
    "softmax_one",
    "relu_normalize",
    "sigmoid_normalize",
    "sink_softmax",
    "softpick",
    "clipped_softmax",
    "relu_attention",
    "scalable_softmax",
    "yarn_logit_scale",
    "adaptive_temperature_softmax",
    "stick_breaking",
    *differential.__all__,
    *selective.__all__,
    *capping.__all__,
    *losses.__all__,
    *sampling.__all__,
    *analysis.__all__,
    *models.__all__,
    *device.__all__,
    *kernels.dispatch.__all__,
    "reference",
    "kernels",
    "checks",
    "__version__",
]

# softmaxbook.checks, the checkers of students' code, is imported on first use
# (sb.checks, from softmaxbook import checks): it is a third of the library's
# source, and a script that trains or plots never needs it.
_LAZY = {"checks"}


# The book's harness moved to the package ``bookkit`` in 0.2 (a course installs
# softmaxbook alone): each old name says where it went, without importing bookkit.
_MOVED_TO_BOOKKIT = {
    "setup_notebook": "bookkit.setup_notebook",
    "glue": "bookkit.glue",
    "PALETTE": "bookkit.PALETTE",
    "use_style": "bookkit.use_style",
    "plot_distribution": "bookkit.plot_distribution",
    "plot_curves": "bookkit.plot_curves",
    "plot_heatmap": "bookkit.plot_heatmap",
    "time_call": "bookkit.time_call",
    "machine_info": "bookkit.machine_info",
    "train": "bookkit.train",
    "evaluate": "bookkit.evaluate",
    "TrainingHistory": "bookkit.TrainingHistory",
    "notebook": "bookkit.notebook",
    "plotting": "bookkit.plotting",
    "timing": "bookkit.timing",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        return _importlib.import_module(f"{__name__}.{name}")  # also sets the attribute
    if name in _MOVED_TO_BOOKKIT:
        raise AttributeError(
            f"softmaxbook.{name} moved to bookkit: use {_MOVED_TO_BOOKKIT[name]} "
            "(import bookkit; pip install -e . installs both packages)"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LAZY)
