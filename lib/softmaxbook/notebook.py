"""Helpers for the book's notebooks: one-line setup, and numbers glued into prose.

Used in the first cell of every chapter, so a chapter starts the same way on a
laptop, in Colab and on a GPU server::

    import softmaxbook as sb
    device = sb.setup_notebook(seed=0)
"""
from __future__ import annotations

import random

import numpy as np
import torch

from .device import get_device
from .plotting import use_style

__all__ = ["setup_notebook", "glue"]


def setup_notebook(seed: int = 0, *, precision: int = 4) -> torch.device:
    """Seed every generator, set rounded printing and the figure style; return the device.

    Seeds Python's ``random``, NumPy's global generator and torch (all
    devices). Printing rounds to ``precision`` digits without scientific
    notation, so stored notebook outputs do not change with the last bit of a
    float. Returns :func:`~softmaxbook.get_device`.
    """
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_printoptions(precision=precision, sci_mode=False)
    np.set_printoptions(precision=precision, suppress=True)
    use_style()
    return get_device()


def glue(name: str, value, *, display: bool = False) -> None:
    """Record ``value`` under ``name`` for the book's prose (myst-nb's ``glue``).

    In Markdown, ``{glue:text}`name:.3f``` then prints the value. Outside the
    book build (no ``myst_nb`` installed, e.g. in Colab) this does nothing, so
    chapters run anywhere. NumPy scalars and 0-d tensors are stored as Python
    numbers. Returns None, so a glue call that ends a cell adds no output.
    """
    try:
        from myst_nb import glue as _glue
    except ImportError:  # reading the notebook outside the book
        return
    # NumPy scalars and 0-d tensors become Python numbers, which myst-nb can
    # format with a spec such as ``:.3f`` (it cannot format ``np.float64(...)``).
    if isinstance(value, (np.generic, torch.Tensor)) and getattr(value, "ndim", 0) == 0:
        value = value.item()
    _glue(name, value, display=display)
