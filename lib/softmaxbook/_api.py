"""How the public API changes: every deprecated spelling, declared once.

A public name of ``softmaxbook`` is a promise to the courses that use it. When
a module, a keyword or a name moves, the old spelling keeps working for one
minor version. :data:`DEPRECATIONS` is the one table of them: what the old
spelling was, what replaces it, and the version that removes it
(``tests/softmaxbook/test_deprecations.py`` fails once a spelling outlives that
version). Two mechanisms read the table:

- :func:`renamed_keywords` accepts a function's old keyword names, with a
  ``DeprecationWarning`` that names the new one (it refuses a keyword that is
  not in the table);
- :func:`alias_moved_modules` lets ``import softmaxbook.<old path>`` import a
  module that moved (silently: the module is the same object).

The old names of the dispatch paths (``"fused"``, ``"torch"``, ``"dropout"``)
compare equal to the new ones (``softmaxbook.kernels.dispatch.DispatchPath``).

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
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class Deprecation(NamedTuple):
    """One deprecated spelling: what it was, what replaces it, and when it goes."""

    kind: str  # "module", "keyword" or "path"
    old: str
    new: str
    since: str  # the version that deprecated it
    removed_in: str  # the version that removes it


_ATTENTION_MODULES = (
    "online",
    "flash",
    "flex",
    "decode",
    "ring",
    "differential",
    "selective",
    "capping",
)

#: Every deprecated spelling of the API. A keyword is written ``function(old=)``.
DEPRECATIONS: tuple[Deprecation, ...] = (
    # 0.3: the attention modules moved into the package softmaxbook.attention
    *(
        Deprecation(
            "module",
            f"softmaxbook.{name}",
            f"softmaxbook.attention.{name}",
            "0.3",
            "0.4",
        )
        for name in _ATTENTION_MODULES
    ),
    Deprecation(
        "module",
        "softmaxbook.attention._tiles",
        "softmaxbook.attention.flash._tiles",
        "0.3",
        "0.4",
    ),
    # 0.3: one vocabulary of dispatch paths
    Deprecation("path", "fused", "torch-fused", "0.3", "0.4"),
    Deprecation("path", "torch", "tiles (flash_attention) or explicit", "0.3", "0.4"),
    Deprecation("path", "dropout", "explicit", "0.3", "0.4"),
)

#: Modules that moved, old dotted path -> new: the old path still imports, and
#: is the new module itself (the same functions, the same classes).
MOVED_MODULES: dict[str, str] = {
    d.old: d.new for d in DEPRECATIONS if d.kind == "module"
}

#: The keyword shims in use, ``function(old=)`` -> its entry: filled by
#: :func:`renamed_keywords` as the library's modules are imported.
APPLIED_KEYWORDS: dict[str, Deprecation] = {}


def _entry(kind: str, old: str) -> Deprecation:
    for d in DEPRECATIONS:
        if d.kind == kind and d.old == old:
            return d
    raise LookupError(
        f"{old} is not in softmaxbook._api.DEPRECATIONS: declare the deprecated "
        "spelling there, with the version that removes it"
    )


def _warn(old: str, new: str, removed_in: str, stacklevel: int = 3) -> None:
    warnings.warn(
        f"{old} is deprecated and will be removed in softmaxbook {removed_in}; "
        f"use {new} instead",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def renamed_keywords(**old_to_new: str) -> Callable[[F], F]:
    """Accept the old keyword names of a function, with a warning naming the new.

    Each ``function(old=)`` must be in :data:`DEPRECATIONS` (which says when it
    goes); the decorator records it in :data:`APPLIED_KEYWORDS`.

    No keyword is deprecated in 0.3 (0.2's ``sink_softmax(sink=)`` went as
    announced); a keyword missing from the table is refused:

    >>> def sink_softmax(x, *, sinks=None):
    ...     return sinks
    >>> renamed_keywords(sink="sinks")(sink_softmax)
    Traceback (most recent call last):
    ...
    LookupError: sink_softmax(sink=) is not in softmaxbook._api.DEPRECATIONS: ...
    """

    def decorate(function: F) -> F:
        entries = {
            old: _entry("keyword", f"{function.__name__}({old}=)") for old in old_to_new
        }
        for entry in entries.values():
            APPLIED_KEYWORDS[entry.old] = entry

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in old_to_new.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(
                            f"{function.__name__}() got both {old}= (deprecated) "
                            f"and {new}=; pass only {new}="
                        )
                    _warn(
                        f"{function.__name__}({old}=...)",
                        f"{new}=",
                        entries[old].removed_in,
                    )
                    kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


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
