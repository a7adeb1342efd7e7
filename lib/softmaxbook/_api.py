"""How the public API changes: deprecated aliases, keywords and modules, declared once.

A public name of ``softmaxbook`` is a promise to the courses that use it. When
a name, a keyword or a module moves, the old spelling keeps working for one minor
version and says where the new one is, with a ``DeprecationWarning``:

- :func:`renamed_keywords` accepts a function's old keyword names;
- :func:`moved_module` turns a module that moved into a forwarding shim.

Which public names are stable and which experimental is declared in one place too:
``softmaxbook.API_STABILITY``, in the package's ``__init__``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
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


#: Modules that moved, old dotted path -> new: the old path still imports, and
#: is the new module itself (the same functions, the same classes).
MOVED_MODULES: dict[str, str] = {
    f"softmaxbook.{name}": f"softmaxbook.attention.{name}"
    for name in (
        "online", "flash", "flex", "decode", "ring", "differential", "selective",
        "capping",
    )
}  # fmt: skip


class _ModuleAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports each old path of :data:`MOVED_MODULES` as its new module."""

    def find_spec(
        self,
        fullname: str,
        path: object = None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED_MODULES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = importlib.import_module(MOVED_MODULES[spec.name])
        self._spec = module.__spec__  # the import system overwrites it with ``spec``
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = self._spec  # the new module ran when it was imported


def alias_moved_modules() -> None:
    """Let ``import softmaxbook.<old path>`` import the module's new home (once)."""
    if not any(isinstance(finder, _ModuleAlias) for finder in sys.meta_path):
        sys.meta_path.append(_ModuleAlias())
