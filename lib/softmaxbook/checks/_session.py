"""The session of one checker: it calls a student's function safely and compares.

:meth:`Session.call` turns whatever the function does (raise, modify its
input in place, return a list, a wrong shape, a tensor on another device) into
a problem message naming the input; :meth:`Session.values` compares a result
with the float64 reference and, on a mismatch, finds the hint: the known
mistake that returns exactly this, or a diagnosis of the values.

Every input the function is called on is one check of the report's
:attr:`~softmaxbook.checks.CheckReport.results` (its gradient another): a
problem fails the check of the input that showed it, whichever method found
it, so that every checker feeds a score without bookkeeping of its own. After
the first, simplest input failed (``session.stopped``) the checker goes on, so
that the list of checks is the same for every function, but what it finds is
recorded in the results only: the report shows the first problem alone.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..device import get_device
from ._hints import (
    DTYPE_HINT,
    ERROR_HINTS,
    NUMPY_DTYPE_HINT,
    error_hint,
    wrong_shape_hint,
)
from ._inputs import BF16, F16, F32, F64, NUMPY_DTYPE, TOL, close
from ._report import (
    CheckReport,
    CheckResult,
    Problems,
    dtype_name,
    fmt,
    function_name,
    mismatch,
    shape_of,
)

Candidate = tuple[str, Tensor, str]  # (key, what that mistake returns, hint)
# The arguments of a call: (name, value) pairs; a value is a tensor, a Scalar or
# anything else the checked function takes.
Named = Sequence[tuple[str, Any]]
ShapeHint = Callable[[tuple[int, ...], tuple[int, ...]], str]

# What to change when a function returns something other than a tensor, by its type.
_RETURN_HINTS = {
    "list": "build the result with tensor operations, not a Python list",
    "float": "do not call .item() or float(): keep the result a tensor",
    "NoneType": "did you forget the return statement?",
    "tuple": "return only the result (torch.max returns a (values, indices) "
    "pair: use .values)",
}


# The last problem of a report whose first, simplest input failed.
STOPPED = "The other checks are not reported: fix the problem above first."


class Scalar:
    """A non-tensor argument passed through :meth:`Session.call` untouched."""

    def __init__(self, value: object) -> None:
        self.value = value


class Session(Problems):
    """One run of a checker: calls ``fn`` safely and collects problems by kind."""

    def __init__(
        self,
        fn: Callable[..., Any],
        noun: str,
        *,
        numpy: bool = False,
        gradient: bool = False,
        device: torch.device | str | None = None,
        hints: Sequence[tuple[str, str]] = (),
    ) -> None:
        if not callable(fn):
            raise TypeError(
                f"fn must be a callable (the function to check), "
                f"got {type(fn).__name__}"
            )
        if not isinstance(numpy, bool):
            raise TypeError(f"numpy must be True or False, got {type(numpy).__name__}")
        super().__init__()
        self.fn, self.noun, self.numpy = fn, noun, numpy
        self.check_gradient = bool(gradient) and not numpy  # autograd needs torch
        # The device check runs on the accelerator; on a CPU-only machine it would
        # repeat the float32 checks, so it runs there only when asked for.
        self.device = torch.device(device) if device is not None else get_device()
        self.device_asked = device is not None
        self.stopped = False
        self.hints = list(hints) + ERROR_HINTS  # (fragment of a message, hint)
        # check name -> the messages of its problems (none: passed), in order
        self._checks: dict[str, list[str]] = {}
        # the check that problems count against, when not the input's label (the
        # gradient on an input is a check of its own)
        self.section: str | None = None
        self.name: str | None = None  # the function's name in the report, if not fn's

    # -- the checks and their verdicts ------------------------------------------------

    def check(self, label: str) -> str:
        """Register the check of ``label`` (or of the current section); its name."""
        name = self.section or label
        self._checks.setdefault(name, [])
        return name

    def problem(self, key: object, label: str, message: str) -> None:
        """Record a problem against its check; in the report too unless stopped."""
        self._checks.setdefault(self.section or label, []).append(message)
        if not self.stopped:
            super().problem(key, label, message)

    def fail(self, label: str, reason: str) -> None:
        """Fail the check of ``label`` without a problem in the report: ``reason``
        says why it could not be judged (the forward values are wrong, ...)."""
        self._checks.setdefault(self.section or label, []).append(reason)

    def passed(self, label: str) -> bool:
        """Whether the check of ``label`` ran and showed no problem (so far)."""
        return label in self._checks and not self._checks[label]

    def results(self) -> list[CheckResult]:
        return [
            CheckResult(name, not messages, 1.0, messages[0] if messages else "")
            for name, messages in self._checks.items()
        ]

    def report(
        self,
        checker: str,
        checked: list[str],
        skipped: str = "the gradient and the device",
    ) -> CheckReport:
        problems = self.messages()
        if self.stopped:
            problems.append(STOPPED)
            checked = []
        if self.numpy:
            checked = [c for c in checked if c != "the device kept"]
            checked.append(f"not checked with numpy=True: {skipped}")
        name = self.name or function_name(self.fn)
        return CheckReport(checker, name, problems, checked, self.results())

    def dtypes(self) -> list[torch.dtype]:
        """The low-precision dtypes to check: NumPy has no bfloat16."""
        return [F32, F16] if self.numpy else [F32, F16, BF16]

    def dtype_words(self) -> str:
        return "float64, float32, float16" + ("" if self.numpy else ", bfloat16")

    # -- calling -----------------------------------------------------------------------

    def call(
        self,
        label: str,
        args: Named,
        kwargs: Named = (),
        *,
        shapes: Sequence[Sequence[int]],
        outputs: int = 1,
        shape_hint: ShapeHint | None = None,
        returns: str = "a pair (out, lse)",
    ) -> Any:
        """``fn(*args, **kwargs)``, checked; the output(s) as tensors, or None.

        ``args`` and ``kwargs`` are sequences of ``(name, tensor)``; ``shapes``
        the expected shape of each output (``returns`` says in words what a
        tuple of several holds). Reports an exception, an input modified in
        place, a result of the wrong type or shape.
        """
        done, out = self.invoke(label, args, kwargs)
        if not done:
            return None
        return self.accept(
            label, args, kwargs, out, shapes, outputs, shape_hint, returns
        )

    def invoke(self, label: str, args: Named, kwargs: Named = ()) -> tuple[bool, Any]:
        """Call ``fn``: ``(True, what it returned)``, or ``(False, None)`` when it
        raised (a problem). Also reports an input modified in place."""
        self.check(label)
        named = list(args) + list(kwargs)
        given = {name: self._to_user(t) for name, t in named}
        before = {
            name: t.detach().clone() for name, t in named if isinstance(t, Tensor)
        }
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = self.fn(
                    *[given[n] for n, _ in args], **{n: given[n] for n, _ in kwargs}
                )
        except Exception as error:  # the student's code may raise anything
            self.raised(label, error)
            return False, None
        self._check_unchanged(label, given, before)
        return True, out

    def accept(
        self,
        label: str,
        args: Named,
        kwargs: Named,
        out: object,
        shapes: Sequence[Sequence[int]],
        outputs: int = 1,
        shape_hint: ShapeHint | None = None,
        returns: str = "a pair (out, lse)",
    ) -> Any:
        """What :meth:`invoke` returned, as tensors of ``shapes`` on the inputs'
        device, or None (a problem)."""
        result = self._outputs(label, out, shapes, outputs, shape_hint, returns)
        named = list(args) + list(kwargs)
        device = next((t.device for _, t in named if isinstance(t, Tensor)), None)
        if result is None or self.numpy or device is None:
            return result
        for o in result if outputs > 1 else [result]:
            if o.device != device:
                self._wrong_device(label, device, o.device)
                return None
        return result

    def run(
        self,
        label: str,
        args: Named,
        kwargs: Named = (),
        *,
        want: Tensor,
        dtype: torch.dtype,
        shape: Sequence[int] | None = None,
        shape_hint: ShapeHint | None = None,
        **diagnosis: Any,
    ) -> bool:
        """Call ``fn`` on one input and compare its result with ``want``.

        The result must have the shape of ``want`` (or ``shape``) and ``dtype``;
        ``diagnosis`` (``candidates``, ``explain``, ...) goes to :meth:`values`.
        False when no usable result came back (an exception, a wrong type or
        shape), so that a checker can stop at its first, simplest input.
        """
        shapes = [want.shape if shape is None else shape]
        out = self.call(label, args, kwargs, shapes=shapes, shape_hint=shape_hint)
        if out is None:
            return False
        if self.dtype(label, out, dtype):
            self.values(label, out, want, dtype, **diagnosis)
        return True

    def _wrong_device(self, label: str, want: torch.device, got: torch.device) -> None:
        self.problem(
            ("device",),
            label,
            f"With {label}, given tensors on {want}, {self.noun} returned a "
            f"tensor on {got}. Create new tensors on the input's device "
            f"(torch.zeros_like(x), x.new_full(...)), and do not move the "
            f"result (no .cpu(), .cuda() or .to(device)).",
        )

    def _to_user(self, t: object) -> Any:
        """What ``fn`` receives: a copy, so that an in-place change cannot leak into
        the next check (a leaf that requires grad goes as it is, for autograd)."""
        if isinstance(t, Scalar):
            return t.value
        if not isinstance(t, Tensor):
            return t
        if self.numpy:
            return t.detach().cpu().numpy().copy()
        return t if t.requires_grad else t.clone()

    def raised(self, label: str, error: Exception) -> None:
        text = str(error).strip().splitlines()[0][:160] if str(error).strip() else ""
        name = type(error).__name__
        hint = error_hint(error, self.hints)
        message = f"With {label}, {self.noun} raised {name}" + (
            f": {text}" if text else ""
        )
        message = message.rstrip(".") + "." + (f" {hint}" if hint else "")
        self.problem(("raised", name, hint or text), label, message)

    def _check_unchanged(
        self, label: str, given: dict[str, Any], before: dict[str, Tensor]
    ) -> None:
        for name, old in before.items():
            new = given[name]
            new = torch.from_numpy(np.asarray(new)) if self.numpy else new.detach()
            if new.shape == old.shape and torch.equal(new.cpu(), old.cpu()):
                continue
            self.problem(
                ("in place", name),
                label,
                f"With {label}, {self.noun} changed its argument {name} in place: it "
                f"held {fmt(old)} before the call and {fmt(new)} after. Work on a "
                "new tensor: write x = x - m rather than x -= m, and use "
                "masked_fill rather than masked_fill_ or x[mask] = value.",
            )

    def _outputs(
        self,
        label: str,
        out: object,
        shapes: Sequence[Sequence[int]],
        outputs: int,
        shape_hint: ShapeHint | None,
        returns: str = "a pair (out, lse)",
    ) -> Any:
        if outputs == 1 and _looks_like_out_lse(out, shapes[0]):
            assert isinstance(out, (tuple, list))  # for mypy: checked just above
            self.problem(
                ("type", "out, lse"),
                label,
                f"With {label}, {self.noun} returned a pair of tensors of shapes "
                f"{shape_of(out[0])} and {shape_of(out[1])}, which looks like "
                f"(out, lse): here only the output is expected, return out alone.",
            )
            return None
        if outputs == 1:
            results = [self._tensor(label, out)]
        elif not isinstance(out, (tuple, list)) or len(out) != outputs:
            got = f"a {type(out).__name__}" + (
                f" of length {len(out)}" if isinstance(out, (tuple, list)) else ""
            )
            self.problem(
                ("type", "tuple"),
                label,
                f"With {label}, {self.noun} returned {got}; return {returns} of "
                f"{self._kind()}s.",
            )
            return None
        else:
            results = [self._tensor(label, o) for o in out]
        tensors = [r for r in results if r is not None]
        if len(tensors) < len(results):
            return None
        for result, shape in zip(tensors, shapes):
            if tuple(result.shape) != tuple(shape):
                self.problem(
                    ("shape", tuple(result.shape)),
                    label,
                    f"With {label}, {self.noun} returned shape "
                    f"{shape_of(result)}; expected {tuple(shape)}."
                    + (shape_hint or wrong_shape_hint)(
                        tuple(result.shape), tuple(shape)
                    ),
                )
                return None
        return tensors[0] if outputs == 1 else tensors

    def _kind(self) -> str:
        return "NumPy array" if self.numpy else "torch.Tensor"

    def _tensor(self, label: str, out: object) -> Tensor | None:
        if (
            self.numpy
            and isinstance(out, (np.ndarray, np.generic))
            and np.issubdtype(np.asarray(out).dtype, np.floating)
        ):
            return torch.from_numpy(np.array(out))
        if not self.numpy and isinstance(out, Tensor) and out.is_floating_point():
            return out
        if isinstance(out, (Tensor, np.ndarray)):
            kind = f"a {type(out).__name__} of dtype {dtype_name(out.dtype)}"
        else:
            kind = "None" if out is None else f"a {type(out).__name__}"
        hint = _RETURN_HINTS.get(type(out).__name__, "")
        if isinstance(out, np.ndarray) and not self.numpy:
            hint = "stay in torch (or check a NumPy function with numpy=True)"
        if isinstance(out, Tensor) and self.numpy:
            hint = "return a NumPy array (or check a torch function with numpy=False)"
        ending = (f": {hint}" + ("" if hint.endswith("?") else ".")) if hint else "."
        self.problem(
            ("type", kind),
            label,
            f"With {label}, {self.noun} returned {kind}; expected a "
            f"floating-point {self._kind()}{ending}",
        )
        return None

    # -- comparing ---------------------------------------------------------------------

    def dtype(self, label: str, got: Tensor, want: torch.dtype, hint: str = "") -> bool:
        want_dtype = NUMPY_DTYPE[want] if self.numpy else want
        have = got.numpy().dtype if self.numpy else got.dtype
        if have == want_dtype:
            return True
        self.problem(
            ("dtype",),
            label,
            f"With {label}, {self.noun} returned "
            f"{dtype_name(have)}; keep the input's dtype. "
            + (hint or (NUMPY_DTYPE_HINT if self.numpy else DTYPE_HINT)),
        )
        return False

    def values(
        self,
        label: str,
        got: Tensor,
        want: Tensor,
        dtype: torch.dtype,
        *,
        key: object = "values",
        candidates: Callable[[], list[Candidate]] | None = None,
        explain: Callable[[Tensor, Tensor], str] | None = None,
        what: str = "",
        magnitude: float = 1.0,
        first: Callable[[], str] | None = None,
    ) -> bool:
        """Compare ``got`` with the float64 ``want``; on a mismatch, diagnose it.

        The absolute tolerance is the dtype's, times ``magnitude``: the size of
        the inputs where a result's rounding error grows with it (``x - lse``).
        The hint comes from ``first()`` if it has one, else from the first of
        ``candidates()`` (what known mistakes return) that matches, else from
        ``explain(got, want)``.
        """
        atol, rtol = TOL[dtype]
        atol *= magnitude
        g = got.detach().to("cpu", F64)
        want = want.to(F64)
        if bool(close(g, want, atol, rtol).all()):
            return True
        hint = (
            (first() if first else "")
            or _known_mistake(g, atol, rtol, candidates() if candidates else [])
            or (explain(g, want) if explain else "")
        )
        self.problem(
            (key, hint),
            label,
            mismatch(label, self.noun, g, want, what) + (" " + hint if hint else ""),
        )
        return False

    def on_device(
        self,
        label: str,
        args: Named,
        kwargs: Named = (),
        *,
        shapes: Sequence[Sequence[int]],
        want: Any,
        outputs: int = 1,
    ) -> None:
        """Run on the accelerator, if there is one; check the device and the values.

        The values are compared at float16's tolerance: this check is about the
        device, and an accelerator may compute float32 products in TF32.
        """
        if self.numpy or (self.device.type == "cpu" and not self.device_asked):
            return
        args, kwargs = self._to_device(args), self._to_device(kwargs)
        out = self.call(label, args, kwargs, shapes=shapes, outputs=outputs)
        if out is None:
            return
        for o, w in zip(out if outputs > 1 else [out], want if outputs > 1 else [want]):
            self.values(label, o, w, F16)

    def _to_device(self, named: Named) -> list[tuple[str, Any]]:
        move = self.device
        return [(n, t.to(move) if isinstance(t, Tensor) else t) for n, t in named]


def _looks_like_out_lse(out: object, shape: Sequence[int]) -> bool:
    """Whether ``out`` is a pair ``(out, lse)`` where one tensor of ``shape`` is due:
    the output, and one number per row of it."""
    return (
        isinstance(out, (tuple, list))
        and len(out) == 2
        and all(isinstance(o, (Tensor, np.ndarray)) for o in out)
        and len(shape) > 0
        and tuple(out[0].shape) == tuple(shape)
        and tuple(out[1].shape) in (tuple(shape[:-1]), tuple(shape[:-1]) + (1,))
    )


def _known_mistake(
    got: Tensor, atol: float, rtol: float, candidates: Sequence[Candidate]
) -> str:
    """The hint of the first known mistake that returns ``got``, or ""."""
    for _, result, hint in candidates:
        if result.shape == got.shape and bool(
            close(got, result, atol, rtol, nan=True).all()
        ):
            return hint
    return ""
