"""How the public API changes: stability marks and deprecated aliases, declared once.

A public name of :mod:`softmaxbook` is a promise to the courses that use it. When
a name, a keyword or a module moves, the old spelling keeps working for one minor
version and says where the new one is, with a ``DeprecationWarning``:

- :func:`deprecated_alias` wraps a function under its old name;
- :func:`renamed_keywords` accepts a function's old keyword names;
- :func:`moved_module` turns a module that moved into a forwarding shim.

:func:`experimental` marks a name whose signature may still change in a minor
version; every other public name is stable (see ``softmaxbook.API_STABILITY``).
"""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

#: The minor version in which the deprecated spellings below are removed.
REMOVED_IN = "0.3"


def _warn(old: str, new: str, stacklevel: int = 3) -> None:
    warnings.warn(
        f"{old} is deprecated and will be removed in softmaxbook {REMOVED_IN}; "
        f"use {new} instead",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def experimental(obj: F) -> F:
    """Mark ``obj`` experimental: it may change in a minor version.

    The mark is an attribute, ``obj.__experimental__ = True``, that the API page
    and ``softmaxbook.API_STABILITY`` read.
    """
    obj.__experimental__ = True  # type: ignore[attr-defined]
    return obj


def is_experimental(obj: object) -> bool:
    """True when ``obj`` was marked with :func:`experimental`."""
    return bool(getattr(obj, "__experimental__", False))


def deprecated_alias(function: F, old_name: str) -> F:
    """Return ``function`` under ``old_name``: same behaviour, plus a warning.

    >>> import warnings
    >>> def new(x):
    ...     return x + 1
    >>> old = deprecated_alias(new, "old")
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     old(1), caught[0].category.__name__
    (2, 'DeprecationWarning')
    """
    new_name = f"{function.__module__.split('._')[0]}.{function.__qualname__}"

    @functools.wraps(function)
    def alias(*args: Any, **kwargs: Any) -> Any:
        _warn(old_name, new_name)
        return function(*args, **kwargs)

    alias.__name__ = alias.__qualname__ = old_name.rsplit(".", 1)[-1]
    alias.__doc__ = f"Deprecated alias of :func:`{new_name}`."
    return alias  # type: ignore[return-value]


def renamed_keywords(**old_to_new: str) -> Callable[[F], F]:
    """Accept the old keyword names of a function, with a warning naming the new.

    >>> import warnings
    >>> @renamed_keywords(sink="sinks")
    ... def f(x, *, sinks=None):
    ...     return sinks
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     f(1, sink=2)
    2
    """

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in old_to_new.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(
                            f"{function.__name__}() got both {old}= (deprecated) "
                            f"and {new}=; pass only {new}="
                        )
                    _warn(f"{function.__name__}({old}=...)", f"{new}=")
                    kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def moved_module(old: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that forwards the old module's names, with a warning.

    ``names`` maps each public name of the old module to the module that now
    holds it. Use it as the whole body of a shim module::

        __getattr__ = moved_module(__name__, {"sparsemax": "softmaxbook.normalizers"})
    """

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        _warn(f"{old}.{name}", f"{names[name]}.{name}")
        return getattr(importlib.import_module(names[name]), name)

    return __getattr__
