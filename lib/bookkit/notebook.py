"""Helpers for the book's notebooks: one-line setup, and numbers glued into prose.

Used in the first cell of every chapter, so a chapter starts the same way on a
laptop, in Colab and on a GPU server::

    import softmaxbook as sb
    import bookkit as bk

    device = bk.setup_notebook(seed=0)
"""

from __future__ import annotations

import importlib.util
import math
import random
import sys
from collections.abc import Sequence
from typing import TypeAlias

import numpy as np
import torch

from softmaxbook import get_device

from .plotting import use_style

__all__ = ["setup_notebook", "require", "glue"]

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
        If a package in ``requires`` is not installed: see :func:`require`.
    TypeError
        If ``requires`` is not a sequence of names.

    Examples
    --------
    The first cell of a chapter that compares with the ``entmax`` package::

        import bookkit as bk
        device = bk.setup_notebook(seed=0, requires=("entmax",))
    """
    require(requires, needed_by="This notebook")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_printoptions(precision=precision, sci_mode=False)
    np.set_printoptions(precision=precision, suppress=True)
    use_style()
    return get_device()


#: Why a page of the book needs each optional package, said when it is missing.
#: They all come with ``pip install "softmaxbook[book]"``.
WHY_NEEDED = {
    "entmax": (
        "chapter 6 checks softmaxbook's sparsemax and entmax against the entmax "
        "package (https://github.com/deep-spin/entmax) and times them side by side"
    ),
    "tqdm": "the case study's training loop shows its progress with it",
    "triton": (
        "the page runs softmaxbook's Triton kernels (in Triton's CPU interpreter "
        "when there is no GPU); Triton is built for Linux only: elsewhere, read "
        "this page on the book's website"
    ),
}


def require(packages: str | Sequence[str], *, needed_by: str = "This notebook") -> None:
    """Stop with a clear message if an optional package is not installed.

    Each missing package is named with why the book needs it and the line that
    installs it, in a notebook cell (``%pip install``) and in a terminal. The
    packages are looked up, not imported, so the check is cheap. A page calls
    it (through :func:`setup_notebook`) before it imports the package.

    Parameters
    ----------
    packages : str or sequence of str
        Import names, e.g. ``"entmax"`` or ``("entmax", "tqdm")``.
    needed_by : str
        Who needs them, the start of the message.

    Raises
    ------
    ImportError
        If a package is not installed; its ``name`` is the first missing one.
    TypeError
        If ``packages`` is not a name or a sequence of names.

    Examples
    --------
    >>> require(("torch", "numpy"))  # installed: nothing happens
    """
    names = (packages,) if isinstance(packages, str) else tuple(packages)
    if not all(isinstance(name, str) and name for name in names):
        raise TypeError(
            f"packages must be names of packages, e.g. ('entmax',), got {packages!r}"
        )
    missing = [name for name in names if importlib.util.find_spec(name) is None]
    if not missing:
        return
    them = "it" if len(missing) == 1 else "them"
    lines = [
        f"{needed_by} needs the package{'s' if len(missing) > 1 else ''} "
        f"{' and '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} "
        f"not installed in this Python ({sys.executable})."
    ]
    lines += [f"Why {n}: {WHY_NEEDED[n]}." for n in missing if n in WHY_NEEDED]
    lines += [
        f"Install {them} in a notebook cell with:  %pip install {' '.join(missing)}",
        "and run this cell again.",
    ]
    if any(name in WHY_NEEDED for name in missing):
        lines.append(
            'In a terminal, pip install "softmaxbook[book]" installs every package '
            "the chapters use (entmax, tqdm and, on Linux, triton)."
        )
    raise ImportError("\n".join(lines), name=missing[0])


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
