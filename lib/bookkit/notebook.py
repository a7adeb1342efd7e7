"""Helpers for the book's notebooks: one-line setup, and numbers glued into prose.

Used in the first cell of every chapter, so a chapter starts the same way on a
laptop, in Colab and on a GPU server::

    import softmaxbook as sb
    import bookkit as bk

    device = bk.setup_notebook(seed=0)
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import TypeAlias

import numpy as np
import torch

from softmaxbook import get_device
from softmaxbook._validate import check_installed

from .plotting import use_style

__all__ = ["setup_notebook", "glue"]

#: What :func:`glue` records: a number, a string or None, also a NumPy scalar or a
#: 0-d tensor (stored as the Python number it holds).
Gluable: TypeAlias = float | int | bool | str | np.generic | torch.Tensor | None


def setup_notebook(
    seed: int = 0, *, precision: int = 4, requires: Sequence[str] = ()
) -> torch.device:
    """Seed every generator, set rounded printing and the figure style; return the
    device.

    First checks that the optional packages in ``requires`` are installed, so
    that a chapter which needs one says so in its first cell, with the command
    that installs it, instead of failing halfway down. Then seeds Python's
    ``random``, NumPy's global generator and torch (all devices). Printing
    rounds to ``precision`` digits without scientific notation, so stored
    notebook outputs do not change with the last bit of a float. Returns
    :func:`~softmaxbook.get_device`.

    Parameters
    ----------
    seed : int
        The seed of every generator.
    precision : int
        Digits that torch and NumPy print.
    requires : sequence of str
        Import names of the optional packages the notebook needs, e.g.
        ``("entmax",)``. The chapters' packages (entmax, tqdm, Triton) come
        with ``pip install "softmaxbook[book]"``.

    Raises
    ------
    ImportError
        If a package in ``requires`` is not installed. The message names the
        packages and the ``pip install`` line that installs them.
    TypeError
        If ``requires`` is not a sequence of names.

    Examples
    --------
    The first cell of a chapter that compares with the ``entmax`` package::

        import bookkit as bk
        device = bk.setup_notebook(seed=0, requires=("entmax",))
    """
    check_installed(requires, "This notebook")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_printoptions(precision=precision, sci_mode=False)
    np.set_printoptions(precision=precision, suppress=True)
    use_style()
    return get_device()


def glue(name: str, value: Gluable, *, digits: int = 4, display: bool = False) -> None:
    """Record ``value``, rounded to ``digits`` significant digits, for the book's prose.

    In Markdown, ``{glue:text}`name:.3f``` then prints the value (myst-nb's
    ``glue``). A float is stored rounded, never with all 17 digits of its
    repr: the last bits of a float depend on the CPU, the thread count and
    the order of a sum, and a stored notebook must read the same on every
    machine. Choose ``digits`` at the call by what the number's error
    supports (a float32 result is good to about 6 digits at best, a
    sample mean to far fewer). Integers, booleans and strings are stored as
    they are. NumPy scalars and 0-d tensors are stored as Python numbers.
    Outside the book build (no ``myst_nb`` installed, e.g. in Colab) this
    does nothing, so chapters run anywhere. Returns None, so a glue call
    that ends a cell adds no output.

    Parameters
    ----------
    name : str
        The key used in ``{glue:text}`name```.
    value : float or int or bool or str
        What to record; also ``None``, a NumPy scalar or a 0-d tensor.
    digits : int
        Significant digits kept of a float, from 1 to 6.

    Raises
    ------
    TypeError
        If ``value`` is not a number or a string, or ``digits`` not an int.
    ValueError
        If ``digits`` is outside 1..6.
    """
    value = _rounded(value, digits)
    try:
        from myst_nb import glue as _glue
    except ImportError:  # reading the notebook outside the book
        return
    _glue(name, value, display=display)


#: The most significant digits :func:`glue` stores: float32 carries about 7.
MAX_GLUE_DIGITS = 6


def _rounded(value: Gluable, digits: int = 4) -> float | int | bool | str | None:
    """``value`` as a Python number, a float rounded to ``digits`` significant digits.

    The rule of :func:`glue`: ``_rounded(316.22776601683796) == 316.2``;
    integers, booleans, strings and ``None`` come back unchanged, ``nan``
    and ``inf`` too.
    """
    if isinstance(digits, bool) or not isinstance(digits, int):
        raise TypeError(f"digits must be an int, got {type(digits).__name__}")
    if not 1 <= digits <= MAX_GLUE_DIGITS:
        raise ValueError(
            f"digits must be between 1 and {MAX_GLUE_DIGITS}, got {digits}"
        )
    # NumPy scalars and 0-d tensors become Python numbers, which myst-nb can
    # format with a spec such as ``:.3f`` (it cannot format ``np.float64(...)``).
    if isinstance(value, (np.generic, torch.Tensor)):
        if getattr(value, "ndim", 0) != 0:
            raise TypeError(
                f"value must be a scalar, got an array of shape {tuple(value.shape)}"
            )
        value = value.item()
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if not isinstance(value, float):
        raise TypeError(
            f"value must be a number or a string, got {type(value).__name__}"
        )
    if not math.isfinite(value) or value == 0:
        return value
    return float(f"{value:.{digits}g}")
