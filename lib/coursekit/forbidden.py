"""Forbidden calls: what a "from scratch" test may not use, however it is reached.

A test names the groups it forbids (``TestCase.forbidden``); while its ``run`` executes,
:func:`guard` watches three levels at once:

* **aten operators**, through a ``TorchDispatchMode``: ``torch.softmax(x)``,
  ``x.softmax(-1)``, ``nn.Softmax()(x)``, ``F.cross_entropy`` and
  ``torch.ops.aten._softmax`` all end in ``aten._softmax`` or ``aten._log_softmax``,
  however the student reached them (a renamed import, a method, a module, a lambda);
  the operator raises :class:`ForbiddenCallError`;
* **Python-level entry points**, through ``sys.setprofile``: the C functions
  (``torch.softmax``, ``Tensor.softmax``, ``F.scaled_dot_product_attention``, the
  autograd engine's ``run_backward``) and Python functions (``torch.func.grad``,
  ``nn.MultiheadAttention.forward``, ``scipy.special.softmax``), which name the call
  the student wrote, and catch what never reaches a forbidden aten operator (under a
  dispatch mode torch's SDPA takes its math path; forward-mode AD never runs the
  backward engine);
* **packages**: any call into a function whose code lives in ``softmaxbook`` or
  ``entmax`` (however it was imported, even by file path), or in an assignment's
  reference solution, and ``import softmaxbook`` / ``import entmax`` while guarded.

Every call caught is *recorded*, so a test fails even when the student's code catches
the exception and falls back to something else. ``torch.logsumexp`` is its own group
(``"logsumexp"``): it is a legitimate reduction in most tasks, and forbidden only
where the stable log-sum-exp is the point of the exercise. ``exp``, ``max``, ``sum``,
``matmul``, ``where``, ``masked_fill``, ``cumsum``, ``sort`` and ``topk`` are never
forbidden.

The guard is a tripwire for ordinary code, not a jail: code that deliberately
disables it (pops the dispatch mode, clears the profile function) can escape it, as
it can any check made inside the process it runs in. The grade itself does not depend
on the student's process being honest: outputs are judged in the grader's process.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import linecache
import sys
import sysconfig
import threading
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType, ModuleType, TracebackType
from typing import Any

__all__ = [
    "GROUPS",
    "ForbiddenCallError",
    "ForbiddenImportError",
    "Group",
    "Guard",
    "ImportBlocker",
    "guard",
]


class ForbiddenCallError(RuntimeError):
    """Raised inside the student's code by a forbidden aten operator."""


class ForbiddenImportError(ImportError):
    """Raised by ``import softmaxbook`` (or entmax, or a reference solution)."""


@dataclass(frozen=True)
class Group:
    """One forbidden-call group.

    Attributes
    ----------
    why
        Half a sentence a student reads after the call's name.
    aten
        aten operator names (``OpOverloadPacket.__name__``, e.g. ``"_softmax"``).
    aten_prefixes
        Prefixes of aten operator names (``"_scaled_dot_product_"``).
    builtins
        ``__name__`` of C functions, caught when Python code calls them.
    python
        ``(qualname, module prefix, shown as)`` of Python functions.
    packages
        Top-level packages whose every function is forbidden, and whose import is
        blocked.
    """

    why: str
    aten: frozenset[str] = frozenset()
    aten_prefixes: tuple[str, ...] = ()
    builtins: frozenset[str] = frozenset()
    python: tuple[tuple[str, str, str], ...] = ()
    packages: tuple[str, ...] = ()


_SOFTMAX_ATEN = frozenset(
    """_softmax _log_softmax _safe_softmax softmax log_softmax special_softmax
    special_log_softmax _softmax_backward_data _log_softmax_backward_data
    _masked_softmax _masked_softmax_backward _sparse_softmax _sparse_log_softmax
    cross_entropy_loss nll_loss nll_loss_nd nll_loss_forward nll_loss_backward
    nll_loss2d nll_loss2d_forward nll_loss2d_backward""".split()
)
# Under a dispatch mode torch's SDPA takes its math path, whose trace is a
# _safe_softmax (a from-scratch attention never calls it).
_SDPA_ATEN = frozenset(
    """scaled_dot_product_attention _fused_sdp_choice _safe_softmax _masked_softmax
    _native_multi_head_attention _transformer_encoder_layer_fwd""".split()
)
_F = "torch.nn.functional"
_FUNC_TRANSFORMS = "grad grad_and_value vjp jvp jacrev jacfwd hessian linearize".split()

GROUPS: dict[str, Group] = {
    "softmax": Group(
        why="this test asks you to build it from exp, max and sum yourself",
        aten=_SOFTMAX_ATEN,
        builtins=_SOFTMAX_ATEN,
        python=(
            ("softmax", _F, f"{_F}.softmax"),
            ("log_softmax", _F, f"{_F}.log_softmax"),
            ("softmin", _F, f"{_F}.softmin"),
            ("gumbel_softmax", _F, f"{_F}.gumbel_softmax"),
            ("cross_entropy", _F, f"{_F}.cross_entropy"),
            ("nll_loss", _F, f"{_F}.nll_loss"),
            ("Softmax.forward", "torch.nn.modules", "torch.nn.Softmax"),
            ("LogSoftmax.forward", "torch.nn.modules", "torch.nn.LogSoftmax"),
            ("Softmin.forward", "torch.nn.modules", "torch.nn.Softmin"),
            ("Softmax2d.forward", "torch.nn.modules", "torch.nn.Softmax2d"),
            (
                "CrossEntropyLoss.forward",
                "torch.nn.modules",
                "torch.nn.CrossEntropyLoss",
            ),
            ("NLLLoss.forward", "torch.nn.modules", "torch.nn.NLLLoss"),
            ("softmax", "scipy.special", "scipy.special.softmax"),
            ("log_softmax", "scipy.special", "scipy.special.log_softmax"),
        ),
    ),
    "logsumexp": Group(
        why="this test asks you to write the max trick of the log-sum-exp yourself",
        aten=frozenset({"logsumexp", "special_logsumexp"}),
        builtins=frozenset({"logsumexp", "special_logsumexp"}),
        python=(("logsumexp", "scipy.special", "scipy.special.logsumexp"),),
    ),
    "sdpa": Group(
        why="this test asks you to compute attention with matmul and a softmax of "
        "your own",
        aten=_SDPA_ATEN,
        aten_prefixes=(
            "_scaled_dot_product_",
            "_flash_attention_",
            "_efficient_attention_",
            "_cudnn_attention",
        ),
        builtins=_SDPA_ATEN
        | set(
            """_scaled_dot_product_attention_math _scaled_dot_product_flash_attention
            _scaled_dot_product_flash_attention_for_cpu
            _scaled_dot_product_efficient_attention""".split()
        ),
        python=(
            (
                "multi_head_attention_forward",
                _F,
                f"{_F}.multi_head_attention_forward",
            ),
            (
                "MultiheadAttention.forward",
                "torch.nn.modules",
                "torch.nn.MultiheadAttention",
            ),
            (
                "flex_attention",
                "torch.nn.attention",
                "torch.nn.attention.flex_attention.flex_attention",
            ),
        ),
    ),
    "autograd": Group(
        why="this test asks you to derive the gradient by hand",
        builtins=frozenset({"run_backward", "_make_dual", "_unpack_dual"}),
        python=(
            ("grad", "torch.autograd", "torch.autograd.grad"),
            ("backward", "torch.autograd", "torch.autograd.backward"),
            ("Tensor.backward", "torch._tensor", "Tensor.backward"),
            *(
                (name, "torch._functorch", f"torch.func.{name}")
                for name in _FUNC_TRANSFORMS
            ),
            *(
                (name, "torch.autograd.functional", f"torch.autograd.functional.{name}")
                for name in ("jacobian", "hessian", "vjp", "jvp", "hvp", "vhp")
            ),
            ("make_dual", "torch.autograd.forward_ad", "torch.autograd.forward_ad"),
        ),
    ),
    "softmaxbook": Group(
        why="the course library is what this assignment asks you to write",
        packages=("softmaxbook", "bookkit"),
    ),
    "entmax": Group(
        why="this assignment asks you to write sparsemax and entmax yourself",
        packages=("entmax",),
    ),
}

#: The reference solutions (``coursekit/assignments/<package>/solution.py``) are
#: forbidden in every guard, whatever the groups.
_ASSIGNMENTS_DIR = str(Path(__file__).resolve().parent / "assignments") + "/"


def _is_solution_module(fullname: str) -> bool:
    parts = fullname.split(".")
    return parts[:2] == ["coursekit", "assignments"] and parts[-1] == "solution"


_SOLUTION_WHY = "a submission is graded on its own code"

_bypass = threading.local()


def _package_dir(name: str) -> str | None:
    """The folder of top-level package ``name``, found without importing it."""
    module = sys.modules.get(name)
    files = getattr(module, "__file__", None) if module is not None else None
    if files is None:
        _bypass.on = True
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        finally:
            _bypass.on = False
        files = spec.origin if spec is not None else None
    if not files:
        return None
    return str(Path(files).resolve().parent) + "/"


def _describe_builtin(fn: Any) -> str:
    name = str(getattr(fn, "__name__", fn))
    owner = getattr(fn, "__self__", None)
    if name == "run_backward":
        return "the autograd engine (Tensor.backward / torch.autograd.grad)"
    if name in ("_make_dual", "_unpack_dual"):
        return "forward-mode autograd (torch.autograd.forward_ad)"
    if str(getattr(fn, "__qualname__", "")).startswith("_VariableFunctionsClass."):
        return f"torch.{name}"
    if isinstance(owner, ModuleType):
        where = {
            "torch._C._nn": "torch.nn.functional",
            "torch._C._special": "torch.special",
        }.get(owner.__name__, owner.__name__)
        shown = name.removeprefix("special_") if where == "torch.special" else name
        return f"{where}.{shown}"
    if owner is not None and type(owner).__name__ in ("Tensor", "Parameter"):
        return f"Tensor.{name}"
    if owner is not None and "pybind11" in type(owner).__module__:
        return f"torch.ops.aten.{name}"
    return name


_HERE = str(Path(__file__).resolve())
_STDLIB = str(Path(sysconfig.get_paths()["stdlib"]).resolve()) + "/"


def _library_dirs() -> tuple[str, ...]:
    dirs = [_STDLIB, str(Path(__file__).resolve().parent) + "/"]
    for name in ("torch", "numpy", "scipy", "softmaxbook", "bookkit", "entmax"):
        found = _package_dir(name) if name in sys.modules else None
        if found:
            dirs.append(found)
    return tuple(dirs)


def _called_by_import_system(frame: FrameType) -> bool:
    """Whether the import system called ``frame``'s function (a library's meta path
    finder, on an import deep in torch): imports are checked by the import hook."""
    back = frame.f_back
    return back is not None and back.f_code.co_filename.startswith("<frozen importlib")


def call_site(frame: FrameType | None, student_files: Collection[str] = ()) -> str:
    """Where the student's code made the call: ``line 5 of f.py: `return ...```."""
    libraries = _library_dirs()
    fallback: FrameType | None = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename in student_files:
            break
        if (
            fallback is None
            and not filename.startswith(libraries)
            and not filename.startswith("<frozen")
        ):
            fallback = frame
        frame = frame.f_back
    frame = frame or fallback
    if frame is None:
        return ""
    filename, line = frame.f_code.co_filename, frame.f_lineno
    text = linecache.getline(filename, line).strip()
    shown = Path(filename).name if filename.startswith("/") else filename
    return f"line {line} of {shown}" + (f": `{text}`" if text else "")


@dataclass
class _Event:
    name: str
    site: str
    aten: bool


@dataclass
class Guard:
    """The record of one guarded block; use it through :func:`guard`.

    ``calls`` lists one message per call site (empty when nothing forbidden was
    touched); :meth:`message` joins them into ``"forbidden call: ..."``.
    """

    groups: tuple[str, ...]
    student_files: frozenset[str] = frozenset()
    _events: list[_Event] = field(default_factory=list)
    _why: list[str] = field(default_factory=list)
    # By id: hashing a code object hashes its bytecode and constants every time.
    # The code object is kept in the value, so its id cannot be reused.
    _cache: dict[int, tuple[CodeType, tuple[str, str] | None]] = field(
        default_factory=dict
    )
    _mode: Any = None
    _blocker: ImportBlocker | None = None
    _previous_profile: Any = None

    def __post_init__(self) -> None:
        unknown = [g for g in self.groups if g not in GROUPS]
        if unknown:
            raise ValueError(
                f"groups: unknown forbidden-call group(s) {unknown}; "
                f"known: {sorted(GROUPS)}"
            )
        chosen = [GROUPS[g] for g in self.groups]
        self._aten = frozenset().union(*(g.aten for g in chosen))
        self._prefixes = tuple(p for g in chosen for p in g.aten_prefixes)
        self._builtins = frozenset().union(*(g.builtins for g in chosen))
        self._python: dict[str, list[tuple[str, str, str]]] = {}
        for name in self.groups:
            for qualname, module, shown in GROUPS[name].python:
                self._python.setdefault(qualname, []).append((module, shown, name))
        self._packages = tuple(p for g in chosen for p in g.packages)
        self._package_dirs = tuple(
            d for d in (_package_dir(p) for p in self._packages) if d
        )

    # --- the record ---------------------------------------------------------------

    @property
    def calls(self) -> list[str]:
        """One line per call site: ``torch.softmax (aten._softmax) at line 5 ...``.

        A site names the first (outermost) entry point the student's line reached,
        then every aten operator it ended in.
        """
        sites: dict[str, tuple[list[str], list[str]]] = {}
        for e in self._events:
            api, aten = sites.setdefault(e.site, ([], []))
            bucket = aten if e.aten else api
            if e.name not in bucket:
                bucket.append(e.name)
        lines = []
        for site, (api, aten) in sites.items():
            names = api[0] if api else ", ".join(aten)
            if api and aten:
                names += f" ({', '.join(aten)})"
            lines.append(names + (f" at {site}" if site else ""))
        return lines

    def message(self) -> str | None:
        """``"forbidden call: torch.softmax (aten._softmax) at ...; <why>"`` or None."""
        calls = self.calls
        if not calls:
            return None
        why = f" ({self._why[0]})" if self._why else ""
        return "forbidden call: " + "; ".join(calls) + why

    def record(
        self, name: str, frame: FrameType | None, *, aten: bool, group: str
    ) -> None:
        site = call_site(frame, self.student_files)
        self._events.append(_Event(name, site, aten))
        why = GROUPS[group].why if group in GROUPS else _SOLUTION_WHY
        if why not in self._why:
            self._why.append(why)

    # --- the three watchers ---------------------------------------------------------

    def _aten_group(self, name: str) -> str | None:
        if name in self._aten or name.startswith(self._prefixes):
            for g in self.groups:
                group = GROUPS[g]
                if name in group.aten or name.startswith(
                    group.aten_prefixes or ("\0",)
                ):
                    return g
        return None

    def _builtin_group(self, name: str) -> str:
        return next((g for g in self.groups if name in GROUPS[g].builtins), "")

    def _classify(self, code: CodeType, frame: FrameType) -> tuple[str, str] | None:
        """``(shown name, group)`` when running ``code`` is forbidden, else None."""
        filename = code.co_filename
        if filename == _HERE:
            return None
        if filename.startswith(_ASSIGNMENTS_DIR) and filename.endswith("/solution.py"):
            package = Path(filename).parent.name
            shown = f"the reference solution (coursekit.assignments.{package}.solution)"
            return shown, "solution"
        for d in self._package_dirs:
            if filename.startswith(d):
                module = str(frame.f_globals.get("__name__", ""))
                return self._package_call(module, code, d)
        candidates = self._python.get(code.co_qualname)
        if candidates:
            module = str(frame.f_globals.get("__name__", ""))
            for prefix, shown, group in candidates:
                if module.startswith(prefix):
                    return shown, group
        return None

    def _package_call(self, module: str, code: CodeType, d: str) -> tuple[str, str]:
        top = module.split(".")[0] or Path(d).name
        group = next((g for g in self.groups if top in GROUPS[g].packages), "")
        return f"{top} (its function {code.co_name}, in {module})", group

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_call":
            name = getattr(arg, "__name__", None)
            if name in self._builtins:
                group = self._builtin_group(name)
                self.record(_describe_builtin(arg), frame, aten=False, group=group)
        elif event == "call":
            code = frame.f_code
            try:
                verdict = self._cache[id(code)][1]
            except KeyError:
                verdict = self._classify(code, frame)
                self._cache[id(code)] = (code, verdict)
            if verdict is not None and not _called_by_import_system(frame):
                self.record(verdict[0], frame.f_back, aten=False, group=verdict[1])

    def _on_aten(self, name: str) -> None:
        group = self._aten_group(name)
        if group is not None:
            self.record(f"aten.{name}", sys._getframe(2), aten=True, group=group)
            raise ForbiddenCallError(self.message() or f"aten.{name}")

    # --- the context manager ------------------------------------------------------

    def __enter__(self) -> Guard:
        blocked = [*self._packages]
        self._blocker = ImportBlocker(blocked, on_block=self._on_blocked_import)
        self._blocker.install()
        if self._aten or self._prefixes:
            self._mode = _mode_class()(self._on_aten)
            self._mode.__enter__()
        self._previous_profile = sys.getprofile()
        sys.setprofile(self._profile)  # even with no group: the reference solutions
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        sys.setprofile(self._previous_profile)
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None
        if self._blocker is not None:
            self._blocker.remove()
            self._blocker = None

    def _on_blocked_import(self, fullname: str) -> None:
        top = fullname.split(".")[0]
        group = next((g for g in self.groups if top in GROUPS[g].packages), "")
        self.record(f"import {fullname}", sys._getframe(2), aten=False, group=group)


_MODE_CLASS: list[type] = []


def _mode_class() -> type:
    """The dispatch mode class, defined on first use (it imports torch)."""
    if not _MODE_CLASS:
        from torch.utils._python_dispatch import TorchDispatchMode

        class _ForbiddenMode(TorchDispatchMode):
            @classmethod
            def _should_skip_dynamo(cls) -> bool:
                # torch wraps a mode's __torch_dispatch__ in torch._dynamo.disable
                # otherwise, and the first operator then imports torch._dynamo
                # (seconds, in every fresh grading process).
                return False

            def __init__(self, on_aten: Callable[[str], None]) -> None:
                super().__init__()
                self.on_aten = on_aten

            def __torch_dispatch__(
                self,
                func: Any,
                types: Sequence[type],
                args: Sequence[Any] = (),
                kwargs: dict[str, Any] | None = None,
            ) -> Any:
                packet = getattr(func, "overloadpacket", None)
                self.on_aten(str(getattr(packet, "__name__", func)))
                return func(*args, **(kwargs or {}))

        _MODE_CLASS.append(_ForbiddenMode)
    return _MODE_CLASS[0]


def guard(groups: Iterable[str], *, student_files: Collection[str] = ()) -> Guard:
    """A context manager under which the calls of ``groups`` are forbidden.

    Parameters
    ----------
    groups
        Names from :data:`GROUPS`: ``"softmax"``, ``"logsumexp"``, ``"sdpa"``,
        ``"autograd"``, ``"softmaxbook"``, ``"entmax"``. The reference solutions are
        forbidden under every guard, even with no group.
    student_files
        The ``co_filename`` of the student's code, so a message can point at the line
        that made the call (otherwise the innermost frame outside the libraries).

    Examples
    --------
    >>> import torch
    >>> with guard(["softmax"]) as g:
    ...     try:
    ...         torch.softmax(torch.zeros(2), -1)
    ...     except ForbiddenCallError:
    ...         pass
    >>> g.message().startswith("forbidden call: torch.softmax (aten._softmax)")
    True
    """
    if isinstance(groups, str):
        raise TypeError(
            f"groups must be a list of group names, got the string {groups!r}"
        )
    return Guard(tuple(groups), frozenset(student_files))


class ImportBlocker(importlib.abc.MetaPathFinder):
    """A ``sys.meta_path`` finder that refuses to import some packages.

    Blocks ``packages`` (top-level names, with their submodules) and, always, the
    assignments' reference solutions (``coursekit.assignments.<package>.solution``).
    ``on_block(fullname)`` is called before :class:`ForbiddenImportError` is raised.
    Only imports that reach the finders are seen: a module already in ``sys.modules``
    imports without a search (the sandbox's worker removes them first).
    """

    def __init__(
        self,
        packages: Iterable[str],
        on_block: Callable[[str], None] | None = None,
    ) -> None:
        self.packages = frozenset(packages)
        self.on_block = on_block

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if getattr(_bypass, "on", False):
            return None
        if fullname.split(".")[0] in self.packages or _is_solution_module(fullname):
            if self.on_block is not None:
                self.on_block(fullname)
            raise ForbiddenImportError(
                f"forbidden import: {fullname} (this assignment asks you to write "
                "the code yourself; the grader does not let it be imported)"
            )
        return None

    def install(self) -> None:
        sys.meta_path.insert(0, self)

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
