r"""Checkers for a student's own implementation, with feedback a student can act on.

Each ``check_<name>(fn)`` calls a student's function ``fn`` on inputs chosen to
reveal the usual mistakes, compares every result with a float64 reference, and
returns a :class:`CheckReport`: truthy when every check passes, with one
message per problem otherwise. A message says which input revealed the
problem, what was expected, what came back, and what to change:

.. code-block:: text

    With scores [1000, 0] (float64, overflow), your softmax returned [nan, 0];
    expected [1, 0]. Subtract the row maximum before exp, ...

The same mistake seen on several inputs is one message, which lists them.

What the checkers promise:

- **They never crash on a broken function.** An exception inside ``fn``, a
  result of the wrong type or shape, ``nan``: each becomes a problem message
  naming the input. If ``fn`` fails on the first, simplest input, the other
  checks are not run (the report says so): fix that first.
- **They are deterministic.** Inputs come from a fixed seed and a private
  ``torch.Generator`` (the global random state is never touched), so the same
  function gets the same messages on every run.
- **They check behaviour, not code**: values against the reference on several
  shapes and batch dimensions, the extreme inputs where textbook formulas break
  (overflow, underflow, ``-inf``, fully masked rows), that dtype and device are
  kept (float64, float32, float16, bfloat16), that no input is modified in
  place, and, by autograd through ``fn``, the gradient.

Conventions, those of the library:

- ``fn`` takes and returns ``torch.Tensor`` and works along the last dimension.
  With ``numpy=True`` it takes and returns NumPy arrays instead (the gradient
  and device checks are then left out, and the report says so).
- Boolean masks are **True where a query may attend**; a row with nothing to
  attend to gets all-zero weights (and a zero output), never ``nan``.
- :func:`check_softmax_backward` expects ``fn(s, grad_output)`` with ``s`` the
  softmax *output*, as :func:`softmaxbook.softmax_backward` does.
- Every result must be on the device of the inputs. The device check also
  runs ``fn`` on float32 inputs on :func:`softmaxbook.get_device` (CUDA,
  then Apple MPS) when that is not the CPU, or on the ``device`` passed.

For an autograder, ``check_softmax(fn).raise_if_failed()`` raises an
``AssertionError`` listing every problem, which pytest shows as the failure.
"""

from __future__ import annotations

import math
import re
import textwrap
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from . import reference
from .device import get_device

__all__ = [
    "CheckReport",
    "check_softmax",
    "check_log_softmax",
    "check_masked_softmax",
    "check_attention",
    "check_softmax_backward",
    "check_sparsemax",
    "check_top_p_filter",
    "check_merge_attention_states",
    "check_attention_entropy",
]

F64, F32, F16, BF16 = torch.float64, torch.float32, torch.float16, torch.bfloat16
INF = math.inf

# (atol, rtol) between a student's result and the float64 reference computed
# from the same (rounded) input: a few units of the dtype's rounding, far below
# what any of the mistakes the checkers look for changes.
_TOL = {F64: (1e-10, 1e-10), F32: (2e-5, 2e-5), F16: (6e-3, 6e-3), BF16: (4e-2, 4e-2)}
_NUMPY_DTYPE = {F64: np.float64, F32: np.float32, F16: np.float16}
_WIDTH = 76  # fits a code cell of the website (77 columns at 1280 px)
_ALSO = 3  # how many other inputs with the same problem a message lists


# --------------------------------------------------------------------------------------
# The report


@dataclass
class CheckReport:
    """The outcome of a checker: truthy when every check passed.

    Attributes
    ----------
    checker : str
        The checker that ran, e.g. ``"check_softmax"``.
    function : str
        The name of the checked function.
    problems : list of str
        One message per problem: the input that revealed it, what was
        expected, what came back, and a hint. Empty when all checks passed.
    checked : list of str
        What the checker looked at, in words (the same on every machine).

    Examples
    --------
    >>> import torch, softmaxbook as sb
    >>> report = sb.checks.check_softmax(torch.softmax)
    >>> report.ok, bool(report)
    (False, False)
    >>> print(report.problems[0])  # doctest: +ELLIPSIS
    With scores [1, 0.5, 2.5, -0.1] (float64), your softmax raised TypeError: ...
    >>> sb.checks.check_softmax(lambda x: torch.softmax(x, dim=-1)).ok
    True
    """

    checker: str
    function: str
    problems: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        head = f"{self.checker}({self.function}): "
        if self.ok:
            lines = [head + "all checks passed."]
            lines += _wrap(
                "Checked: " + "; ".join(self.checked) + ".", subsequent_indent="  "
            )
            return "\n".join(lines)
        count = len(self.problems)
        lines = [head + f"{count} problem{'s' if count > 1 else ''}"]
        for number, problem in enumerate(self.problems, 1):
            lines += _wrap(
                problem, initial_indent=f"{number:>2}. ", subsequent_indent="    "
            )
        return "\n".join(lines)

    def _repr_pretty_(
        self, printer, cycle
    ) -> None:  # IPython shows str(), not the fields
        printer.text(str(self))

    def raise_if_failed(self) -> None:
        """Raise ``AssertionError`` with every problem, if there is any (for pytest)."""
        if self.problems:
            raise AssertionError(str(self))


# --------------------------------------------------------------------------------------
# Formatting


def _wrap(text: str, **indents) -> list[str]:
    """Wrap at ``_WIDTH`` columns; short ``[...]`` and ``(...)`` groups stay whole."""
    chars, opened = list(text), []
    for i, char in enumerate(chars):
        if char in "([":
            opened.append(i)
        elif char in ")]" and opened:
            start = opened.pop()
            if i - start <= 40:  # keep "[nan, 0]" and "(float64, overflow)" whole
                chars[start:i] = [c if c != " " else "\0" for c in chars[start:i]]
    text = re.sub(r"\b(\w{1,2}) \(", "\\1\0(", "".join(chars))  # "q (4, 8)" stays whole
    lines = textwrap.wrap(text, _WIDTH, break_on_hyphens=False, **indents)
    return [line.replace("\0", " ") for line in lines]


def _number(v: float) -> str:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return "0" if v == 0 else f"{v:.4g}"


def _fmt(t, limit: int = 8) -> str:
    """A short, stable rendering of a tensor's values: ``[0.7311, 0.2689, 0]``."""
    t = torch.as_tensor(t).detach().to("cpu", F64)
    if t.dim() == 0:
        return _number(float(t))
    if t.dim() == 2 and t.numel() <= limit:
        return "[" + ", ".join(_fmt(row) for row in t) + "]"
    flat = [_number(v) for v in t.reshape(-1)[:limit].tolist()]
    more = ", ..." if t.numel() > limit else ""
    text = "[" + ", ".join(flat) + more + "]"
    return text if t.dim() <= 1 else f"{text} (shape {_shape(t)})"


def _shape(t) -> str:
    return str(tuple(t.shape))


def _dtype(dtype) -> str:
    return str(dtype).replace("torch.", "")  # also NumPy's dtypes: "float32"


def _function_name(fn) -> str:
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return "a lambda" if name == "<lambda>" else name


# Hints for exceptions, by a fragment of the message: what a student can change.
_ERROR_HINTS = [
    (
        "without overflow",
        "A fill value like -1e9 does not fit in float16 (its largest "
        "number is 65504): fill with float('-inf'), or torch.finfo(dtype).min.",
    ),
    (
        "in-place",
        "Avoid in-place operations (x -= m, x.exp_(), x[mask] = ...) on "
        "tensors autograd needs: write x = x - m.",
    ),
    (
        "inplace",
        "Avoid in-place operations (x -= m, x.exp_(), x[mask] = ...) on "
        "tensors autograd needs: write x = x - m.",
    ),
    (
        "unexpected keyword argument 'mask'",
        "Accept the mask as a keyword argument: def attention(q, k, v, mask=None).",
    ),
    (
        "must match the size",
        "Check the shapes: a row's sum or maximum needs "
        "keepdim=True to broadcast against the row.",
    ),
    (
        "Expected size for first two dimensions of batch2",
        "Check the shapes: the scores "
        "are q @ k.transpose(-2, -1), of shape (..., L, S), and the output is "
        "weights @ v.",
    ),
    (
        "cannot be multiplied",
        "Check the shapes: the scores are q @ k.transpose(-2, -1), "
        "of shape (..., L, S), and the output is weights @ v.",
    ),
    (
        "could not be broadcast",
        "Check the shapes: reduce with keepdims=True so that the "
        "row sums broadcast against the rows.",
    ),
    ("unsupported ScalarType", "NumPy has no bfloat16: stay in torch operations."),
    ("numpy()", "Stay in torch: .numpy() leaves autograd; use torch operations."),
    (
        "same device",
        "Create new tensors on the input's device, e.g. with "
        "torch.zeros_like(x) or x.new_full(...).",
    ),
    (
        "expected scalar type",
        "Keep one dtype: create new tensors with the input's "
        "dtype (torch.zeros_like(x), x.new_tensor(...)).",
    ),
    (
        "same dtype",
        "Keep one dtype: create new tensors with the input's dtype "
        "(torch.zeros_like(x), x.new_tensor(...)).",
    ),
]


def _error_hint(error: Exception, hints=_ERROR_HINTS) -> str:
    if isinstance(error, NotImplementedError):
        return "Implement the function: the stub still raises NotImplementedError."
    text = str(error)
    for fragment, hint in hints:
        if fragment in text:
            return hint
    return ""


def _close(
    got: Tensor, want: Tensor, atol: float, rtol: float, nan: bool = False
) -> Tensor:
    return torch.isclose(got, want, atol=atol, rtol=rtol, equal_nan=nan)


# --------------------------------------------------------------------------------------
# The session: calls the student's function and collects the problems


Candidate = tuple[str, Tensor, str]  # (key, what that mistake returns, hint)


class _Session:
    """One run of a checker: calls ``fn`` safely and collects problems by kind.

    Problems with the same kind (the same exception, the same diagnosed
    mistake) are merged into one message that lists every input showing it.
    """

    def __init__(
        self, fn, noun: str, *, numpy: bool = False, device=None, hints: tuple = ()
    ):
        if not callable(fn):
            raise TypeError(
                f"fn must be a callable (the function to check), "
                f"got {type(fn).__name__}"
            )
        if not isinstance(numpy, bool):
            raise TypeError(f"numpy must be True or False, got {type(numpy).__name__}")
        self.fn, self.noun, self.numpy = fn, noun, numpy
        # The device check runs on the accelerator; on a CPU-only machine it would
        # repeat the float32 checks, so it runs there only when asked for.
        self.device = torch.device(device) if device is not None else get_device()
        self.device_asked = device is not None
        self.stopped = False
        self.hints = list(hints) + _ERROR_HINTS  # (fragment of a message, hint)
        self._problems: dict = {}

    # -- problems ----------------------------------------------------------------------

    def problem(self, key, label: str, message: str) -> None:
        if key in self._problems:
            _, first, also = self._problems[key]
            if label != first and label not in also:
                also.append(label)  # shown up to _ALSO times, then counted
        else:
            self._problems[key] = (message, label, [])

    def report(
        self,
        checker: str,
        checked: list[str],
        skipped: str = "the gradient and the device",
    ) -> CheckReport:
        problems = []
        for message, _, also in self._problems.values():
            if also:
                shown = "; ".join(also[:_ALSO])
                more = len(also) - _ALSO
                if more > 0:
                    shown += f"; and {more} more input{'s' if more > 1 else ''}"
                message += f" The same problem with {shown}."
            problems.append(message)
        if self.stopped:
            problems.append(
                "The other checks did not run: fix the problem above first."
            )
        if self.numpy:
            checked = [c for c in checked if c != "the device kept"]
            checked.append(f"not checked with numpy=True: {skipped}")
        return CheckReport(checker, _function_name(self.fn), problems, checked)

    @property
    def failed(self) -> bool:
        return bool(self._problems)

    # -- calling -----------------------------------------------------------------------

    def call(
        self,
        label: str,
        args,
        kwargs=(),
        *,
        shapes,
        outputs: int = 1,
        shape_hint: Callable[[tuple], str] | None = None,
    ):
        """``fn(*args, **kwargs)``, checked; the output(s) as tensors, or None.

        ``args`` and ``kwargs`` are sequences of ``(name, tensor)``; ``shapes``
        the expected shape of each output. Reports an exception, an input
        modified in place, a result of the wrong type or shape.
        """
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
            self._raised(label, error)
            return None
        self._check_unchanged(label, given, before)
        result = self._outputs(label, out, shapes, outputs, shape_hint)
        device = next((t.device for _, t in named if isinstance(t, Tensor)), None)
        if result is None or self.numpy or device is None:
            return result
        for o in result if outputs > 1 else [result]:
            if o.device != device:
                self._wrong_device(label, device, o.device)
                return None
        return result

    def _wrong_device(self, label: str, want, got) -> None:
        self.problem(
            ("device",),
            label,
            f"With {label}, given tensors on {want}, {self.noun} returned a "
            f"tensor on {got}. Create new tensors on the input's device "
            f"(torch.zeros_like(x), x.new_full(...)), and do not move the "
            f"result (no .cpu(), .cuda() or .to(device)).",
        )

    def _to_user(self, t):
        """What ``fn`` receives: a copy, so that an in-place change cannot leak into
        the next check (a leaf that requires grad goes as it is, for autograd)."""
        if isinstance(t, _Scalar):
            return t.value
        if not isinstance(t, Tensor):
            return t
        if self.numpy:
            return t.detach().cpu().numpy().copy()
        return t if t.requires_grad else t.clone()

    def _raised(self, label: str, error: Exception) -> None:
        text = str(error).strip().splitlines()[0][:160] if str(error).strip() else ""
        name = type(error).__name__
        hint = _error_hint(error, self.hints)
        message = f"With {label}, {self.noun} raised {name}" + (
            f": {text}" if text else ""
        )
        message = message.rstrip(".") + "." + (f" {hint}" if hint else "")
        self.problem(("raised", name, hint or text), label, message)

    def _check_unchanged(self, label: str, given: dict, before: dict) -> None:
        for name, old in before.items():
            new = given[name]
            new = torch.from_numpy(np.asarray(new)) if self.numpy else new.detach()
            if new.shape == old.shape and torch.equal(new.cpu(), old.cpu()):
                continue
            self.problem(
                ("in place", name),
                label,
                f"With {label}, {self.noun} changed its argument {name} in place: it "
                f"held {_fmt(old)} before the call and {_fmt(new)} after. Work on a "
                "new tensor: write x = x - m rather than x -= m, and use "
                "masked_fill rather than masked_fill_ or x[mask] = value.",
            )

    def _outputs(self, label: str, out, shapes, outputs: int, shape_hint):
        if outputs == 1:
            results = [self._tensor(label, out)]
        elif not isinstance(out, (tuple, list)) or len(out) != outputs:
            got = f"a {type(out).__name__}" + (
                f" of length {len(out)}" if isinstance(out, (tuple, list)) else ""
            )
            self.problem(
                ("type", "tuple"),
                label,
                f"With {label}, {self.noun} returned {got}; return a pair "
                f"(out, lse) of {self._kind()}s.",
            )
            return None
        else:
            results = [self._tensor(label, o) for o in out]
        if any(r is None for r in results):
            return None
        for result, shape in zip(results, shapes):
            if tuple(result.shape) != tuple(shape):
                self.problem(
                    ("shape", tuple(result.shape)),
                    label,
                    f"With {label}, {self.noun} returned shape "
                    f"{_shape(result)}; expected {tuple(shape)}."
                    + (shape_hint or self._shape_hint)(
                        tuple(result.shape), tuple(shape)
                    ),
                )
                return None
        return results[0] if outputs == 1 else results

    def _kind(self) -> str:
        return "NumPy array" if self.numpy else "torch.Tensor"

    def _tensor(self, label: str, out):
        if (
            self.numpy
            and isinstance(out, (np.ndarray, np.generic))
            and np.issubdtype(np.asarray(out).dtype, np.floating)
        ):
            return torch.from_numpy(np.array(out))
        if not self.numpy and isinstance(out, Tensor) and out.is_floating_point():
            return out
        if isinstance(out, (Tensor, np.ndarray)):
            kind = f"a {type(out).__name__} of dtype {_dtype(out.dtype)}"
        else:
            kind = "None" if out is None else f"a {type(out).__name__}"
        hint = {
            "list": "build the result with tensor operations, not a Python list",
            "float": "do not call .item() or float(): keep the result a tensor",
            "NoneType": "did you forget the return statement?",
            "tuple": "return only the result (torch.max returns a (values, indices) "
            "pair: use .values)",
        }.get(type(out).__name__, "")
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

    def _shape_hint(self, got: tuple, want: tuple) -> str:
        if got == want[:-1]:
            return (
                " You reduced over the last dimension: the result keeps one entry "
                "per score (use keepdim=True in the sums you divide by)."
            )
        if got == want + want[-1:]:
            return (
                " That is a full Jacobian per row: return the vector-Jacobian "
                "product instead, one number per score."
            )
        return ""

    # -- comparing ---------------------------------------------------------------------

    def dtype(self, label: str, got: Tensor, want, hint: str = "") -> bool:
        want_dtype = _NUMPY_DTYPE[want] if self.numpy else want
        have = got.numpy().dtype if self.numpy else got.dtype
        if have == want_dtype:
            return True
        self.problem(
            ("dtype",),
            label,
            f"With {label}, {self.noun} returned "
            f"{_dtype(have)}; keep the input's dtype. "
            + (hint or (_NUMPY_DTYPE_HINT if self.numpy else _DTYPE_HINT)),
        )
        return False

    def values(
        self,
        label: str,
        got: Tensor,
        want: Tensor,
        dtype,
        *,
        key="values",
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
        atol, rtol = _TOL[dtype]
        atol *= magnitude
        g = got.detach().to("cpu", F64)
        want = want.to(F64)
        if bool(_close(g, want, atol, rtol).all()):
            return True
        hint = first() if first else ""
        if hint:
            self.problem(
                (key, hint), label, self._mismatch(label, g, want, what) + " " + hint
            )
            return False
        for _, result, hint in candidates() if candidates else []:
            if result.shape == g.shape and bool(
                _close(g, result, atol, rtol, nan=True).all()
            ):
                self.problem(
                    (key, hint),
                    label,
                    self._mismatch(label, g, want, what) + " " + hint,
                )
                return False
        hint = explain(g, want) if explain else ""
        self.problem(
            (key, hint),
            label,
            self._mismatch(label, g, want, what) + (" " + hint if hint else ""),
        )
        return False

    def _mismatch(self, label: str, got: Tensor, want: Tensor, what: str) -> str:
        if got.dim() <= 1 and got.numel() <= 8:
            subject = f"{what} of {self.noun} is" if what else f"{self.noun} returned"
            return f"With {label}, {subject} {_fmt(got)}; expected {_fmt(want)}."
        error = (got - want).abs().nan_to_num(nan=INF)
        error = torch.where((got == want) | (got.isnan() & want.isnan()), 0.0, error)
        where = np.unravel_index(int(error.reshape(-1).argmax()), tuple(got.shape))
        if got.dim() == 1:
            i = int(where[0])
            return (
                f"With {label}, entry {i} of {what or 'the result'} of {self.noun} "
                f"is {_fmt(got[i])}; expected {_fmt(want[i])}."
            )
        row = tuple(int(i) for i in where[:-1])
        name = f"row {row[0] if len(row) == 1 else row}"
        whose = what or "the result"
        return (
            f"With {label}, {name} of {whose} of {self.noun} is "
            f"{_fmt(got[row])}; expected {_fmt(want[row])}."
        )

    # -- gradients ---------------------------------------------------------------------

    def gradient(
        self,
        label: str,
        args,
        kwargs=(),
        *,
        wrt,
        shapes,
        output_grads,
        want: dict,
        forward,
        outputs: int = 1,
        hint: str = "",
        where: Tensor | None = None,
        project=None,
    ) -> None:
        """Backpropagate ``output_grads`` through ``fn`` and compare with ``want``.

        ``want`` maps the name of each input in ``wrt`` to its float64 gradient;
        every gradient must be finite, and equal to ``want`` where ``where`` is
        True (everywhere by default), after ``project`` (a function applied to
        both, for a gradient defined only up to some direction). ``forward``
        holds the expected output(s):
        when they are wrong (a problem the forward checks of the same input
        report), the gradients are not compared.
        """
        leaves = {}
        args = [(n, self._leaf(n, t, wrt, leaves)) for n, t in args]
        kwargs = [(n, self._leaf(n, t, wrt, leaves)) for n, t in kwargs]
        out = self.call(label, args, kwargs, shapes=shapes, outputs=outputs)
        if out is None:
            return
        outs = list(out) if outputs > 1 else [out]
        expected = list(forward) if outputs > 1 else [forward]
        for o, w in zip(outs, expected):
            if o.dtype != w.dtype or not bool(
                _close(o.detach().to(F64), w, 1e-10, 1e-10).all()
            ):
                return
        if not all(o.requires_grad for o in outs):
            self.problem(
                ("no grad",),
                label,
                f"With {label}, the result of {self.noun} is not connected to "
                f"its inputs in autograd (requires_grad is False), so no "
                f"gradient can flow back. Use torch operations only: no "
                f".numpy(), .item(), .detach(), torch.tensor(...) of results, or "
                f"torch.no_grad().",
            )
            return
        try:
            grads = torch.autograd.grad(
                outs, list(leaves.values()), output_grads, allow_unused=True
            )
        except Exception as error:  # a broken backward: report it, like the forward
            self._raised(label + " (in the backward pass)", error)
            return
        for name, grad in zip(leaves, grads):
            self._compare_grad(label, name, grad, want[name], hint, where, project)

    @staticmethod
    def _leaf(name: str, t, wrt, leaves: dict):
        if t is None or name not in wrt:
            return t
        leaves[name] = t.detach().clone().requires_grad_(True)
        return leaves[name]

    def _compare_grad(
        self,
        label: str,
        name: str,
        grad,
        want: Tensor,
        hint: str,
        where: Tensor | None = None,
        project=None,
    ) -> None:
        if grad is None:
            self.problem(
                ("unused", name),
                label,
                f"With {label}, the result of {self.noun} does not depend on "
                f"{name} in autograd: its gradient with respect to {name} is "
                f"missing.",
            )
            return
        grad = grad.detach().to("cpu", F64)
        if not bool(torch.isfinite(grad).all()):
            self.problem(
                ("grad nan", name),
                label,
                f"With {label}, the gradient of {self.noun} with respect to "
                f"{name} contains nan or inf: {_fmt(grad[~torch.isfinite(grad)][:4])}"
                f". "
                + (
                    hint or "Look for 0 * inf, inf - inf or 0 / 0 in the backward pass."
                ),
            )
            return
        if project is not None:
            grad, want = project(grad), project(want)
        if where is not None:  # compare only there (e.g. where the weights are > 0)
            grad, want = grad[where], want[where]
        self.values(
            label,
            grad,
            want,
            F64,
            key=("grad", name),
            what=(f"the gradient with respect to {name} (by autograd)"),
            explain=lambda g, w: (
                "The forward values are right but not their derivatives: did part of "
                "the computation happen outside autograd (.item(), .detach(), "
                "torch.no_grad())?"
            ),
        )

    # -- devices -----------------------------------------------------------------------

    def on_device(self, label: str, args, kwargs=(), *, shapes, want, outputs: int = 1):
        """Run on the accelerator, if there is one; check the device and the values.

        The values are compared at float16's tolerance: this check is about the
        device, and an accelerator may compute float32 products in TF32.
        """
        if self.numpy or (self.device.type == "cpu" and not self.device_asked):
            return
        move = [(n, t.to(self.device) if isinstance(t, Tensor) else t) for n, t in args]
        kmove = [
            (n, t.to(self.device) if isinstance(t, Tensor) else t) for n, t in kwargs
        ]
        out = self.call(label, move, kmove, shapes=shapes, outputs=outputs)
        if out is None:
            return
        for o, w in zip(out if outputs > 1 else [out], want if outputs > 1 else [want]):
            self.values(label, o, w, F16)


_NUMPY_DTYPE_HINT = (
    "NumPy promotes float32 and float16 to float64 when they meet a float64 array "
    "or NumPy scalar (np.sqrt(d) is one): use math.sqrt for numbers, and convert the "
    "result back with .astype(x.dtype)."
)
_DTYPE_HINT = (
    "Do not convert with .float() or .double(), and create new tensors with "
    "the input's dtype (torch.zeros_like(x), x.new_tensor(...)); to compute in "
    "a wider type, convert the result back with .to(x.dtype)."
)


# --------------------------------------------------------------------------------------
# Inputs and references


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(g: torch.Generator, *shape, scale: float = 1.0) -> Tensor:
    return torch.randn(*shape, generator=g, dtype=F64) * scale


def _np(t):
    return None if t is None else t.detach().to("cpu", F64).numpy()


def _t(a) -> Tensor:
    return torch.from_numpy(np.asarray(a, dtype=np.float64))


def _random_mask(g: torch.Generator, *shape, keep: float = 0.6) -> Tensor:
    """A random boolean mask (True = may attend) with at least one True per row."""
    mask = torch.rand(*shape, generator=g) < keep
    mask[..., 0] |= ~mask.any(dim=-1)
    return mask


def _label(name: str, x: Tensor, note: str = "") -> str:
    """``scores [1000, 0] (float64)`` or ``random scores of shape (3, 7) (float64)``."""
    words = _dtype(x.dtype) + (f", {note}" if note else "")
    if x.numel() <= 4:
        return f"{name} {_fmt(x)} ({words})"
    return f"random {name} of shape {_shape(x)} ({words})"


def _dtypes(session: _Session) -> list:
    """The low-precision dtypes to check: NumPy has no bfloat16."""
    return [F32, F16] if session.numpy else [F32, F16, BF16]


def _dtype_words(session: _Session) -> str:
    return "float64, float32, float16" + ("" if session.numpy else ", bfloat16")


def _softmax_t(x: Tensor, keep: Tensor | None = None, dim: int = -1) -> Tensor:
    """Differentiable float64 masked softmax; a row with nothing to attend gives 0."""
    if keep is not None:
        x = x.masked_fill(~keep, -INF)
    empty = torch.isneginf(x).all(dim=dim, keepdim=True)
    return torch.softmax(x.masked_fill(empty, 0.0), dim=dim).masked_fill(empty, 0.0)


def _vjp(s: Tensor, g: Tensor, dim: int = -1) -> Tensor:
    return s * (g - (s * g).sum(dim=dim, keepdim=True))


def _rows_sum_hint(got: Tensor, target: float = 1.0, what: str = "rows") -> str:
    sums = got.sum(dim=-1)
    if bool(_close(sums, torch.full_like(sums, target), 1e-6, 1e-6).all()):
        return ""
    if target == 1 and got.dim() > 1 and abs(float(got.sum()) - 1) < 1e-6:
        return (
            "Your whole result sums to 1, not each row: divide each row by its own "
            "sum, e.sum(dim=-1, keepdim=True)."
        )
    return (
        f"The {what} of your result sum to {_fmt(sums.reshape(-1), 4)} instead of "
        f"{_number(target)}."
    )


# --------------------------------------------------------------------------------------
# Softmax and log-softmax

_MAX_HINT = (
    "Subtract the row maximum before exp, m = x.max(dim=-1, keepdim=True).values: "
    "then every exponent is <= 0, nothing overflows, and the largest term is "
    "exp(0) = 1, so the sum is never 0."
)


def _wrong_dim_candidates(x: Tensor, function) -> list[Candidate]:
    """What normalizing along another dimension would give."""
    found = []
    for d in range(x.dim() - 1):
        found.append(
            (
                f"dim {d}",
                _t(function(_np(x), axis=d)),
                f"That is the result along dim={d}: normalize each row along the "
                f"last dimension (dim=-1), whatever the number of batch "
                f"dimensions.",
            )
        )
    return found


def _rowwise(
    session: _Session,
    label: str,
    x: Tensor,
    want: Tensor,
    *,
    candidates=None,
    explain=None,
    magnitude: bool = False,
    first=None,
) -> bool:
    """Check ``fn(x)`` against ``want``; False when the result is unusable."""
    out = session.call(label, [("x", x)], shapes=[x.shape])
    if out is None:
        return False
    size = x.abs().nan_to_num(posinf=0.0).max().clamp(min=1.0) if magnitude else 1.0
    if session.dtype(label, out, x.dtype):
        session.values(
            label,
            out,
            want,
            x.dtype,
            candidates=candidates,
            explain=explain,
            magnitude=float(size),
            first=first and (lambda: first(x)),
        )
    return True


def _rowwise_checks(
    session: _Session,
    *,
    seed: int,
    reference_fn,
    derivative,
    extremes,
    basic,
    candidates,
    explain,
    shapes,
    scale: float,
    gradient: bool,
    checked_extremes: str,
    magnitude: bool = False,
    first=None,
) -> list[str]:
    """The checks shared by the row-wise functions (softmax, log-softmax, sparsemax)."""
    x = torch.tensor(basic, dtype=F64)
    if not _rowwise(
        session,
        _label("scores", x),
        x,
        _t(reference_fn(_np(x))),
        candidates=lambda: candidates(x),
        explain=lambda got, want: explain(got, want, x),
        first=first,
        magnitude=magnitude,
    ):
        session.stopped = True
        return []
    g = _generator(seed)
    inputs = [_randn(g, *shape, scale=scale) for shape in shapes]
    for x in inputs:
        _rowwise(
            session,
            _label("scores", x),
            x,
            _t(reference_fn(_np(x))),
            candidates=lambda x=x: candidates(x),
            explain=lambda got, want, x=x: explain(got, want, x),
            first=first,
            magnitude=magnitude,
        )
    for _, values, note in extremes:
        for dtype in (F64, F32):
            x = torch.tensor(values, dtype=dtype)
            _rowwise(
                session,
                _label("scores", x, note),
                x,
                _t(reference_fn(_np(x))),
                candidates=lambda x=x: candidates(x),
                explain=lambda got, want, x=x: explain(got, want, x),
                first=first,
                magnitude=magnitude,
            )
    for dtype in _dtypes(session):
        x = inputs[1].to(dtype)
        _rowwise(
            session,
            _label("scores", x),
            x,
            _t(reference_fn(_np(x))),
            candidates=lambda x=x: candidates(x),
            explain=lambda got, want, x=x: explain(got, want, x),
            first=first,
            magnitude=magnitude,
        )
    x = inputs[1].to(F32)
    session.on_device(
        _label("scores", x, "on the accelerator"),
        [("x", x)],
        shapes=[x.shape],
        want=_t(reference_fn(_np(x))),
    )
    if gradient and not session.numpy:
        x = inputs[1]
        grad_out = _randn(g, *x.shape)
        session.gradient(
            _label("scores", x),
            [("x", x)],
            wrt={"x"},
            shapes=[x.shape],
            output_grads=[grad_out],
            want={"x": derivative(x, grad_out)},
            forward=_t(reference_fn(_np(x))),
        )
    return [
        f"values against the reference on scores of shapes ({len(basic)},)"
        + "".join(f", {tuple(s)}" for s in shapes),
        checked_extremes,
        f"the dtype kept ({_dtype_words(session)})",
        "the device kept",
        "the input not modified",
    ] + (
        ["the gradient, by autograd through your function"]
        if gradient and not session.numpy
        else []
    )


def _softmax_explain(got: Tensor, want: Tensor, x: Tensor) -> str:
    if bool(got.isnan().any()) and not bool(want.isnan().any()):
        return _MAX_HINT
    if bool((got < 0).any()):
        return "Weights are never negative: exp(x_i - m) / sum_j exp(x_j - m) is > 0."
    return _rows_sum_hint(got) or (
        "Compare with the formula exp(x_i - m) / sum_j exp(x_j - m), m the row maximum."
    )


def _softmax_candidates(x: Tensor) -> list[Candidate]:
    found = _wrong_dim_candidates(x, reference.softmax)
    if (
        x.dim() > 1 and x.shape[0] > 1
    ):  # the maximum of the whole tensor, not of each row
        with np.errstate(all="ignore"):
            e = np.exp(_np(x) - _np(x).max())
            found.append(
                (
                    "global max",
                    _t(e / e.sum(axis=-1, keepdims=True)),
                    "Subtract each row's own maximum, "
                    "x.max(dim=-1, keepdim=True).values, not the maximum of the "
                    "whole tensor: a row far below it underflows to 0 / 0.",
                )
            )
    with np.errstate(all="ignore"):
        mean = np.exp(_np(x) - _np(x).mean(axis=-1, keepdims=True))
    found.append(
        (
            "mean",
            _t(mean / mean.sum(axis=-1, keepdims=True)),
            "Subtract the maximum, not the mean: only the maximum makes every "
            "exponent <= 0, so that exp cannot overflow.",
        )
    )
    found.append(("naive", _t(reference.naive_softmax(_np(x))), _MAX_HINT))
    return found


def check_softmax(
    fn: Callable, *, numpy: bool = False, gradient: bool = True, device=None
) -> CheckReport:
    r"""Check a student's softmax, :math:`s_i = e^{x_i} / \sum_j e^{x_j}`.

    ``fn(x)`` takes scores of shape ``(..., N)`` and returns weights of the
    same shape and dtype. Checked: the values against
    :func:`softmaxbook.reference.softmax` on several shapes and batch
    dimensions (and which dimension was normalized, if not the last); that
    rows sum to one; overflow (``[1000, 0]``) and underflow
    (``[-1000, -1000]``) in float64 and float32; rows on very different
    scales; a score of ``-inf``; dtype (float64, float32, float16, bfloat16)
    and device kept; the input not modified; the gradient by autograd.

    Parameters
    ----------
    fn : callable
        The student's function, ``fn(x) -> weights``.
    numpy : bool
        ``fn`` takes and returns NumPy arrays (no gradient or device check).
    gradient : bool
        Also check the gradient by autograd through ``fn``.
    device : torch.device or str, optional
        Where to run the device check; default :func:`softmaxbook.get_device`.

    Returns
    -------
    CheckReport
        Truthy when every check passed; ``.problems`` lists what did not.

    Raises
    ------
    TypeError
        If ``fn`` is not callable.

    Examples
    --------
    >>> import torch, softmaxbook as sb
    >>> def naive_softmax(x):
    ...     e = torch.exp(x)
    ...     return e / e.sum(dim=-1, keepdim=True)
    >>> report = sb.checks.check_softmax(naive_softmax)
    >>> print(report.problems[0])  # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
    With scores [1000, 0] (float64, overflow), your softmax returned [nan, 0];
    expected [1, 0]. Subtract the row maximum before exp, ...
    >>> def my_softmax(x):
    ...     e = torch.exp(x - x.max(dim=-1, keepdim=True).values)
    ...     return e / e.sum(dim=-1, keepdim=True)
    >>> sb.checks.check_softmax(my_softmax).ok
    True
    """
    session = _Session(fn, "your softmax", numpy=numpy, device=device)
    extremes = [
        ("overflow", [1000.0, 0.0], "overflow"),
        ("underflow", [-1000.0, -1000.0], "underflow"),
        ("scales", [[0.0, 1.0], [1000.0, 1001.0]], "rows on different scales"),
        ("-inf", [0.0, -INF, 1.0], "a score of -inf"),
    ]
    checked = _rowwise_checks(
        session,
        seed=1,
        reference_fn=reference.softmax,
        basic=[1.0, 0.5, 2.5, -0.1],
        derivative=lambda x, g: _vjp(torch.softmax(x, -1), g),
        extremes=extremes,
        candidates=_softmax_candidates,
        explain=_softmax_explain,
        shapes=[(6,), (3, 7), (2, 3, 4, 5)],
        scale=3.0,
        gradient=gradient,
        checked_extremes="rows sum to one; overflow [1000, 0] and underflow "
        "[-1000, -1000] in float64 and float32; rows on different "
        "scales; a score of -inf",
    )
    return session.report("check_softmax", checked)


_LSE_HINT = (
    "Compute x - logsumexp(x), with logsumexp(x) = m + log(sum_j exp(x_j - m)) "
    "and m the row maximum: never take the log of a probability that may have "
    "rounded to 0."
)


def _log_softmax_explain(got: Tensor, want: Tensor, x: Tensor) -> str:
    finite = torch.isfinite(want)
    if bool((torch.isneginf(got) & finite).any()):
        return "-inf is log(0): a probability rounded to 0. " + _LSE_HINT
    if bool(got.isnan().any()):
        return (
            "Subtract the maximum inside the logsumexp: exp(1000) overflows to inf "
            "and exp(-1000) underflows to 0. " + _LSE_HINT
        )
    sums = torch.logsumexp(got, dim=-1)
    if not bool(_close(sums, torch.zeros_like(sums), 1e-6, 0).all()):
        return (
            f"The exponentials of each row should sum to one (logsumexp of each "
            f"row = 0); yours give {_fmt(sums.reshape(-1), 4)}."
        )
    return "Compare with x_i - logsumexp(x)."


def _log_softmax_candidates(x: Tensor) -> list[Candidate]:
    found = _wrong_dim_candidates(x, reference.log_softmax)
    with np.errstate(all="ignore"):
        found.append(
            (
                "naive lse",
                _t(_np(x) - np.log(np.exp(_np(x)).sum(-1, keepdims=True))),
                "Subtract the maximum inside the logsumexp: exp(1000) overflows to "
                "inf and exp(-1000) underflows to 0. " + _LSE_HINT,
            )
        )
        found.append(
            (
                "softmax",
                _t(reference.softmax(_np(x))),
                "Those are the probabilities: log-softmax returns their "
                "logarithms, x - logsumexp(x).",
            )
        )
        found.append(
            (
                "log of softmax",
                _t(np.log(reference.softmax(_np(x)))),
                "That is log(softmax(x)): the softmax rounds tiny probabilities "
                "to 0 and log(0) = -inf. " + _LSE_HINT,
            )
        )
    return found


def check_log_softmax(
    fn: Callable, *, numpy: bool = False, gradient: bool = True, device=None
) -> CheckReport:
    r"""Check a student's log-softmax, :math:`x_i - \log \sum_j e^{x_j}`.

    ``fn(x)`` takes scores ``(..., N)`` and returns log-probabilities of the
    same shape and dtype. Checked: values against
    :func:`softmaxbook.reference.log_softmax` on several shapes; that the
    exponentials of each row sum to one; ``[1000, 0]`` (``log(softmax(x))``
    gives ``-inf`` here, the right answer is ``[0, -1000]``) and
    ``[-1000, -1000]`` in float64 and float32; rows on different scales; a
    score of ``-inf``; dtype and device kept; the input not modified; the
    gradient by autograd.

    Parameters
    ----------
    fn : callable
        The student's function, ``fn(x) -> log_probabilities``.
    numpy : bool
        ``fn`` takes and returns NumPy arrays (no gradient or device check).
    gradient : bool
        Also check the gradient by autograd through ``fn``.
    device : torch.device or str, optional
        Where to run the device check; default :func:`softmaxbook.get_device`.

    Returns
    -------
    CheckReport

    Examples
    --------
    >>> import torch, softmaxbook as sb
    >>> report = sb.checks.check_log_softmax(lambda x: torch.log(torch.softmax(x, -1)))
    >>> print(report.problems[0])  # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
    With scores [1000, 0] (float64, overflow), your log-softmax returned [0, -inf];
    expected [0, -1000]. That is log(softmax(x)): ...
    >>> def my_log_softmax(x):
    ...     return x - torch.logsumexp(x, dim=-1, keepdim=True)
    >>> sb.checks.check_log_softmax(my_log_softmax).ok
    True
    """
    session = _Session(fn, "your log-softmax", numpy=numpy, device=device)
    extremes = [
        ("overflow", [1000.0, 0.0], "overflow"),
        ("underflow", [-1000.0, -1000.0], "underflow"),
        ("scales", [[0.0, 1.0], [1000.0, 1001.0]], "rows on different scales"),
        ("-inf", [0.0, -INF, 1.0], "a score of -inf"),
    ]

    def derivative(x, g):
        return g - torch.softmax(x, -1) * g.sum(-1, keepdim=True)

    checked = _rowwise_checks(
        session,
        seed=2,
        reference_fn=reference.log_softmax,
        basic=[1.0, 0.5, 2.5, -0.1],
        derivative=derivative,
        extremes=extremes,
        candidates=_log_softmax_candidates,
        explain=_log_softmax_explain,
        shapes=[(6,), (3, 7), (2, 3, 4, 5)],
        scale=3.0,
        gradient=gradient,
        magnitude=True,
        checked_extremes="exp of each row sums to one; [1000, 0] and [-1000, -1000] in "
        "float64 and float32; rows on different scales; a score of -inf",
    )
    return session.report("check_log_softmax", checked)


# --------------------------------------------------------------------------------------
# Sparsemax

_SUPPORT_HINT = (
    "Check the support: sort the scores in decreasing order, z_1 >= z_2 >= "
    "..., keep the largest k (counting from 1) with 1 + k z_k > z_1 + ... + "
    "z_k, and use tau = (z_1 + ... + z_k - 1) / k."
)


def _sparsemax_k(x: np.ndarray, shift: int) -> np.ndarray:
    """Sparsemax with a support off by ``shift``: a usual mistake, to diagnose."""
    z = -np.sort(-x, axis=-1)
    cumsum = np.cumsum(z, axis=-1)
    k = np.arange(1, x.shape[-1] + 1)
    k_max = (1 + k * z > cumsum).sum(axis=-1, keepdims=True)
    k_max = np.clip(k_max + shift, 1, x.shape[-1])
    tau = (np.take_along_axis(cumsum, k_max - 1, axis=-1) - 1) / k_max
    return np.maximum(x - tau, 0.0)


def _sparsemax_candidates(x: Tensor) -> list[Candidate]:
    xs = _np(x)
    found = _wrong_dim_candidates(x, reference.sparsemax)
    for shift in (-1, 1):
        found.append(
            (
                f"k{shift:+d}",
                _t(_sparsemax_k(xs, shift)),
                f"Your support has one key {'too few' if shift < 0 else 'too many'}"
                f". " + _SUPPORT_HINT,
            )
        )
    found.append(
        (
            "softmax",
            _t(reference.softmax(xs)),
            "That is the softmax: sparsemax is max(x - tau, 0) with the threshold "
            "tau, which gives exact zeros.",
        )
    )
    return found


def _sparsemax_explainer(session: _Session):
    def explain(got: Tensor, want: Tensor, x: Tensor) -> str:
        if bool((got < 0).any()):
            return "Weights are never negative: clip at zero, max(x - tau, 0)."
        return _support_hint(got, want)

    return explain


def _sorted_hint(session: _Session, x: Tensor) -> str:
    """When unsorted scores fail, try sorted ones: the threshold comes from a sort."""
    xs = torch.sort(x, dim=-1, descending=True).values
    if torch.equal(xs, x):
        return ""
    quiet = _Session(session.fn, session.noun, numpy=session.numpy, device="cpu")
    out = quiet.call("", [("x", xs)], shapes=[xs.shape])
    if out is None or not bool(
        _close(out.to(F64), _t(reference.sparsemax(_np(xs))), *_TOL[x.dtype]).all()
    ):
        return ""
    return (
        "Your sparsemax is right when the scores come already sorted, but not "
        "otherwise: compute the threshold from the scores sorted in decreasing order "
        "(torch.sort(x, dim=-1, descending=True)), then apply it to the scores in "
        "their original order."
    )


def _support_hint(got: Tensor, want: Tensor) -> str:
    support_got, support_want = (got > 0).sum(-1), (want > 0).sum(-1)
    if not torch.equal(support_got, support_want):
        return (
            f"Your result has {_fmt(support_got.reshape(-1), 4)} nonzero entries per "
            f"row where sparsemax has {_fmt(support_want.reshape(-1), 4)}. "
            + _SUPPORT_HINT
        )
    return _rows_sum_hint(got) or _SUPPORT_HINT


def _sparsemax_grad(x: Tensor, g: Tensor) -> Tensor:
    """The sparsemax VJP: on the support, g minus its mean there; 0 elsewhere."""
    support = (_t(reference.sparsemax(_np(x))) > 0).to(F64)
    mean = (g * support).sum(-1, keepdim=True) / support.sum(-1, keepdim=True)
    return support * (g - mean)


def check_sparsemax(
    fn: Callable, *, numpy: bool = False, gradient: bool = True, device=None
) -> CheckReport:
    r"""Check a student's sparsemax, :math:`\max(x - \tau, 0)`.

    The threshold :math:`\tau` is the number with
    :math:`\sum_i \max(x_i - \tau, 0) = 1`.

    ``fn(x)`` takes scores ``(..., N)`` and returns weights of the same shape
    and dtype, normalized along the last dimension. Checked: values against
    :func:`softmaxbook.reference.sparsemax` on dense, medium and sparse
    inputs of several shapes (with a diagnosis of a support off by one, and
    of a threshold taken from unsorted scores); exact zeros outside the
    support; ties; a one-hot result; large scores and a shift by 100 (which
    changes nothing); dtype and device kept; the input not modified; the
    gradient by autograd (on the support, :math:`g - \bar g`; 0 elsewhere).

    Parameters
    ----------
    fn : callable
        The student's function, ``fn(x) -> weights``.
    numpy : bool
        ``fn`` takes and returns NumPy arrays (no gradient or device check).
    gradient : bool
        Also check the gradient by autograd through ``fn``.
    device : torch.device or str, optional
        Where to run the device check; default :func:`softmaxbook.get_device`.

    Returns
    -------
    CheckReport

    Examples
    --------
    >>> import torch, softmaxbook as sb
    >>> sb.checks.check_sparsemax(sb.sparsemax).ok
    True
    >>> report = sb.checks.check_sparsemax(lambda x: torch.softmax(x, -1))
    >>> print(report.problems[0])  # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
    With scores [0.6, 0.3, 0.8, -0.1] (float64), your sparsemax returned [...];
    expected [0.3667, 0.06667, 0.5667, 0]. That is the softmax: ...
    """
    session = _Session(
        fn,
        "your sparsemax",
        numpy=numpy,
        device=device,
        hints=[
            (
                "out of bounds",
                "An index went out of range: the support size k counts from 1 "
                "(it is at least 1), and the k-th largest score sits at index k - 1.",
            )
        ],
    )
    explain = _sparsemax_explainer(session)
    extremes = [
        ("ties", [1.0, 1.0, 1.0, 1.0], "ties"),
        ("one-hot", [3.0, 0.0, 0.0], "a one-hot result"),
        ("large", [1000.0, 999.5, 0.0], "large scores"),
        ("shift", [100.6, 100.3, 100.8, 99.9], "the basic scores + 100"),
    ]
    checked = _rowwise_checks(
        session,
        seed=3,
        reference_fn=reference.sparsemax,
        basic=[0.6, 0.3, 0.8, -0.1],
        derivative=_sparsemax_grad,
        extremes=extremes,
        candidates=_sparsemax_candidates,
        explain=explain,
        shapes=[(6,), (3, 7), (2, 3, 4, 5)],
        scale=1.0,
        first=lambda x: _sorted_hint(session, x),
        gradient=gradient,
        checked_extremes="ties; a one-hot result; large scores; a shift by 100",
    )
    if session.stopped:
        return session.report("check_sparsemax", checked)
    g = _generator(33)
    for scale, words in ((0.05, "dense support"), (4.0, "sparse support")):
        x = _randn(g, 4, 9, scale=scale)
        label = _label("scores", x, words)
        want = _t(reference.sparsemax(_np(x)))
        out = session.call(label, [("x", x)], shapes=[x.shape])
        if out is None:
            continue
        if not session.values(
            label,
            out,
            want,
            F64,
            candidates=lambda x=x: _sparsemax_candidates(x),
            explain=lambda got, w, x=x: explain(got, w, x),
            first=lambda x=x: _sorted_hint(session, x),
        ):
            continue
        leaked = (want == 0) & (out != 0)
        if bool(leaked.any()):
            session.problem(
                ("zeros",),
                label,
                f"With {label}, your sparsemax returned "
                f"{_fmt(out[leaked][:4])} where the weights are exactly 0. "
                f"Sparsemax gives exact zeros: clip with "
                f"torch.clamp(x - tau, min=0), do not add an epsilon.",
            )
    checked.insert(1, "dense and sparse supports; exact zeros outside the support")
    return session.report("check_sparsemax", checked)


# --------------------------------------------------------------------------------------
# Masked softmax

_EMPTY_NAN_HINT = (
    "A row whose mask is all False has every score at -inf, so its maximum is -inf and "
    "-inf - (-inf) = nan. Such a row has nothing to attend to: give it zeros, e.g. by "
    "replacing its scores with 0 before the softmax and its weights with 0 after."
)
_UNIFORM_HINT = (
    "A fully masked row came back spread evenly over keys it may not see: that is what "
    "a finite fill such as -1e9 does (every score equal, so the softmax is uniform). "
    "Use -inf for masked scores and give rows with nothing to attend all-zero weights."
)
_POLARITY_HINT = (
    "That is the softmax over the entries where the mask is False: the mask "
    "means True = may attend (keep). Use scores.masked_fill(~mask, "
    "float('-inf'))."
)
_IGNORED_HINT = (
    "That is the softmax of all the scores, as if there were no mask: masked "
    "entries (mask False) must get weight exactly 0."
)


def _masked_reference(scores: Tensor, mask: Tensor) -> Tensor:
    filled = np.where(np.broadcast_to(mask.numpy(), scores.shape), _np(scores), -np.inf)
    return _t(reference.softmax(filled))


def _masked_candidates(scores: Tensor, mask: Tensor) -> list[Candidate]:
    plain = _t(reference.softmax(_np(scores)))
    partly = ~mask.expand(scores.shape).all(dim=-1, keepdim=True)
    return [
        ("polarity", _masked_reference(scores, ~mask), _POLARITY_HINT),
        ("ignored", plain, _IGNORED_HINT),
        # scores + (~mask) * -inf: 0 * -inf = nan in every row with a masked key
        ("0 * -inf", plain.masked_fill(partly, math.nan), _NAN_MASK_HINT),
    ]


_NAN_MASK_HINT = (
    "nan appeared in rows that keep some entries: 0 * -inf is nan, so an "
    "additive mask built as (~mask) * float('-inf') poisons every entry of "
    "a row with a masked key. Build the masked scores with "
    "scores.masked_fill(~mask, float('-inf')) or torch.where."
)


def _masked_explain(scores: Tensor, mask: Tensor):
    def explain(got: Tensor, want: Tensor) -> str:
        keep = mask.expand(want.shape)
        empty = ~keep.any(dim=-1, keepdim=True).expand(want.shape)
        kept_zero = (got[keep] == 0) | got[keep].isnan()
        masked = got[~keep]
        if bool(kept_zero.all()) and bool(((masked != 0) & masked.isfinite()).any()):
            return _POLARITY_HINT
        if bool(got[~empty].isnan().any()):
            small = bool(
                scores.abs().max() < 80
            )  # exp cannot overflow, even in float32
            return _NAN_MASK_HINT if small else _MAX_HINT
        if bool(empty.any()):
            rows = got[empty].reshape(-1, want.shape[-1])
            if bool(rows.isnan().any()):
                return _EMPTY_NAN_HINT
            if bool(
                _close(rows, torch.full_like(rows, 1 / rows.shape[-1]), 1e-3, 0).all()
            ):
                return _UNIFORM_HINT
            if not bool((rows == 0).all()):
                return (
                    "A row whose mask is all False has nothing to attend to: its "
                    "weights must all be 0."
                )
        if bool((got[~keep] != 0).any()):
            return (
                f"Masked entries (mask False) got weight {_fmt(got[~keep][:4])}: "
                f"they must get exactly 0."
            )
        return _rows_sum_hint(got)

    return explain


def _masked_case(session: _Session, label: str, scores: Tensor, mask: Tensor) -> bool:
    out = session.call(
        label, [("scores", scores), ("mask", mask)], shapes=[scores.shape]
    )
    if out is None:
        return False
    if session.dtype(label, out, scores.dtype):
        session.values(
            label,
            out,
            _masked_reference(scores, mask),
            scores.dtype,
            candidates=lambda: _masked_candidates(scores, mask),
            explain=_masked_explain(scores, mask),
        )
    return True


def check_masked_softmax(
    fn: Callable, *, numpy: bool = False, gradient: bool = True, device=None
) -> CheckReport:
    r"""Check a student's masked softmax, ``fn(scores, mask)``, True = may attend.

    .. math:: p_i = \frac{m_i e^{x_i}}{\sum_j m_j e^{x_j}}, \qquad
              p = 0 \ \text{for a row with}\ \textstyle\sum_j m_j = 0

    ``scores`` is ``(..., N)`` and ``mask`` a boolean tensor that broadcasts
    to it; the result has the shape and dtype of ``scores``. Checked: values
    on several shapes with full-size and broadcast masks (causal ``(L, S)``,
    padding ``(B, 1, 1, S)``); the mask's polarity (diagnosed when flipped or
    ignored); a fully masked row gives zeros (not ``nan``, not the uniform
    row a ``-1e9`` fill gives); overflow; dtype (float16 included, where
    ``-1e9`` does not fit) and device kept; neither argument modified; the
    gradient by autograd, zero and finite on the fully masked row.

    Parameters
    ----------
    fn : callable
        The student's function, ``fn(scores, mask) -> weights``.
    numpy : bool
        ``fn`` takes and returns NumPy arrays (no gradient or device check).
    gradient : bool
        Also check the gradient by autograd through ``fn``.
    device : torch.device or str, optional
        Where to run the device check; default :func:`softmaxbook.get_device`.

    Returns
    -------
    CheckReport

    Examples
    --------
    >>> import torch, softmaxbook as sb
    >>> def minus_1e9(scores, mask):
    ...     return torch.softmax(scores.masked_fill(~mask, -1e9), dim=-1)
    >>> report = sb.checks.check_masked_softmax(minus_1e9)
    >>> any("spread evenly" in p for p in report.problems)
    True
    >>> sb.checks.check_masked_softmax(sb.masked_softmax).ok
    True
    """
    session = _Session(fn, "your masked softmax", numpy=numpy, device=device)
    scores = torch.tensor([[1.0, 0.5, 2.5, -0.1]] * 3, dtype=F64)
    causal = torch.ones(3, 4, dtype=torch.bool).tril()
    if not _masked_case(
        session, "scores of shape (3, 4) (float64) with a causal mask", scores, causal
    ):
        session.stopped = True
        return session.report("check_masked_softmax", [])
    g = _generator(4)
    x = _randn(g, 2, 3, 5, 6, scale=3.0)
    cases = [
        (
            "random scores of shape (2, 3, 5, 6) (float64) with a random mask of the "
            "same shape",
            x,
            _random_mask(g, 2, 3, 5, 6),
        ),
        (
            "random scores of shape (2, 3, 5, 6) (float64) with a causal mask of shape "
            "(5, 6)",
            x,
            torch.ones(5, 6, dtype=torch.bool).tril(),
        ),
        (
            "random scores of shape (2, 3, 5, 6) (float64) with a padding mask of "
            "shape (2, 1, 1, 6), lengths 6 and 4",
            x,
            (torch.arange(6) < torch.tensor([6, 4])[:, None]).reshape(2, 1, 1, 6),
        ),
    ]
    for label, s, m in cases:
        _masked_case(session, label, s, m)
    empty = causal.clone()
    empty[1] = False
    _masked_case(
        session,
        "scores of shape (3, 4) (float64) whose row 1 is fully masked",
        scores,
        empty,
    )
    big = torch.tensor([[1000.0, 0.0, 3.0], [0.0, 1.0, 2.0]], dtype=F64)
    _masked_case(
        session,
        "scores [[1000, 0, 3], [0, 1, 2]] (float64) with the last "
        "column masked (overflow)",
        big,
        torch.tensor([True, True, False]),
    )
    low = _randn(g, 4, 6, scale=3.0)
    low_mask = _random_mask(g, 4, 6)
    low_mask[2] = False
    for dtype in [F64] + _dtypes(session):
        s = low.to(dtype)
        _masked_case(
            session,
            f"random scores of shape (4, 6) ({_dtype(dtype)}) with a "
            f"random mask whose row 2 is fully masked",
            s,
            low_mask,
        )
    s = low.to(F32)
    session.on_device(
        "float32 scores on the accelerator",
        [("scores", s), ("mask", low_mask)],
        shapes=[s.shape],
        want=_masked_reference(s, low_mask),
    )
    if gradient and not session.numpy:
        grad_out = _randn(g, 4, 6)
        s = low.clone()
        want = torch.autograd.functional.vjp(
            lambda t: _softmax_t(t, low_mask), s, grad_out
        )[1]
        session.gradient(
            "random scores of shape (4, 6) (float64) with a random mask "
            "whose row 2 is fully masked",
            [("scores", s), ("mask", low_mask)],
            wrt={"scores"},
            shapes=[s.shape],
            output_grads=[grad_out],
            want={"scores": want},
            forward=_masked_reference(s, low_mask),
            hint=(
                "The forward pass may give zeros and the backward pass "
                "still nan: torch.where(c, a, b) sends gradient into both "
                "branches, and a nan in the branch not taken poisons it. "
                "Replace a fully masked row's scores with 0 before the "
                "softmax, and zero its weights after."
            ),
        )
    checked = [
        "values on shapes (3, 4) and (2, 3, 5, 6) with full-size, causal (L, S) "
        "and padding (B, 1, 1, S) masks",
        "the mask's polarity (True = may attend)",
        "a fully masked row gives zeros",
        "overflow [1000, 0]",
        f"the dtype kept ({_dtype_words(session)})",
        "the device kept",
        "the inputs not modified",
    ] + (
        ["the gradient, by autograd, finite and zero on a fully masked row"]
        if gradient and not session.numpy
        else []
    )
    return session.report("check_masked_softmax", checked)


# --------------------------------------------------------------------------------------
# Attention


def _attention_np(q, k, v, mask=None, scale=None, axis=-1, fill=-np.inf) -> Tensor:
    q, k, v = _np(q), _np(k), _np(v)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ np.swapaxes(k, -1, -2) * scale  # (..., L, S)
    if mask is not None:
        scores = np.where(np.broadcast_to(mask.numpy(), scores.shape), scores, fill)
    return _t(reference.softmax(scores, axis=axis) @ v)


def _attention_t(q, k, v, mask=None) -> Tensor:
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    keep = None if mask is None else mask.expand(scores.shape)
    return _softmax_t(scores, keep) @ v


def _attention_candidates(q, k, v, mask) -> list[Candidate]:
    d, dv = q.shape[-1], v.shape[-1]
    found = [
        (
            "no scale",
            _attention_np(q, k, v, mask, 1.0),
            "That is attention without the scale: multiply the scores q @ k^T by "
            "1/sqrt(D), D the size of the last dimension of q and k.",
        ),
        (
            "1/D",
            _attention_np(q, k, v, mask, 1 / d),
            "You scaled the scores by 1/D; the scale is 1/sqrt(D), D the size of the "
            "last dimension of q and k.",
        ),
        (
            "queries",
            _attention_np(q, k, v, mask, axis=-2),
            "You normalized over the queries (dim=-2): each query's weights must sum "
            "to one over the keys, the last dimension of the scores (dim=-1).",
        ),
    ]
    if dv != d:
        found.append(
            (
                "1/sqrt(Dv)",
                _attention_np(q, k, v, mask, 1 / math.sqrt(dv)),
                "You scaled by the square root of the values' dimension; the scale "
                "uses the dimension of the queries and keys, 1/sqrt(D) with D = "
                "q.shape[-1].",
            )
        )
    if mask is not None:
        found += [
            ("polarity", _attention_np(q, k, v, ~mask), _POLARITY_HINT),
            ("ignored", _attention_np(q, k, v), _IGNORED_HINT),
        ]
        if bool((~mask.any(dim=-1)).any()):
            found.append(
                (
                    "finite fill",
                    _attention_np(q, k, v, mask, fill=-1e9),
                    "A query whose mask row is all False came back as the "
                    "average of all the values: that is what a finite fill such "
                    "as -1e9 does (every score equal, so the softmax is uniform). "
                    "Use -inf for masked scores, and give a query with nothing to "
                    "attend to zero weights and a zero output.",
                )
            )
    return found


def _attention_explain(mask):
    def explain(got: Tensor, want: Tensor) -> str:
        if bool(got.isnan().any()):
            if mask is not None and bool((~mask.any(dim=-1)).any()):
                return (
                    "A query whose mask row is all False has nothing to attend to: "
                    "its output must be zeros, not nan. " + _EMPTY_NAN_HINT
                )
            return _MAX_HINT + " (Or use a stable softmax such as torch.softmax.)"
        return (
            "Compare with softmax(q @ k.transpose(-2, -1) / sqrt(D), dim=-1) @ v, "
            "masked entries at -inf."
        )

    return explain


def _attention_case(session, label, q, k, v, mask=None, *, keyword=True) -> bool:
    kwargs = [("mask", mask)] if keyword else []
    shape = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]) + (
        q.shape[-2],
        v.shape[-1],
    )
    out = session.call(label, [("q", q), ("k", k), ("v", v)], kwargs, shapes=[shape])
    if out is None:
        return False
    if session.dtype(label, out, q.dtype):
        session.values(
            label,
            out,
            _attention_np(q, k, v, mask),
            q.dtype,
            candidates=lambda: _attention_candidates(q, k, v, mask),
            explain=_attention_explain(mask),
        )
    return True


def check_attention(
    fn: Callable,
    *,
    masks: bool = True,
    numpy: bool = False,
    gradient: bool = True,
    device=None,
) -> CheckReport:
    r"""Check a student's attention, ``fn(q, k, v, mask=None)`` returning the output.

    .. math:: \mathrm{softmax}\!\left(\frac{Q K^\top}{\sqrt{D}},\ \text{mask}\right) V

    ``q`` is ``(..., L, D)``, ``k`` ``(..., S, D)``, ``v`` ``(..., S, Dv)``;
    ``mask`` is boolean, True = may attend, broadcastable to ``(..., L, S)``;
    the output is ``(..., L, Dv)``. Checked: values without a mask (called as
    ``fn(q, k, v)``) on an unbatched and a batched input with
    :math:`L \ne S` and :math:`D \ne D_v`; the :math:`1/\sqrt{D}` scale
    (diagnosed when missing, or :math:`1/D`, or :math:`1/\sqrt{D_v}`); the
    softmax over the keys, not the queries; a causal and a padding mask
    (polarity diagnosed); a query with nothing to attend to gives a zero
    output; large scores (overflow); dtype and device kept; no input
    modified; the gradients with respect to ``q``, ``k`` and ``v``.

    Parameters
    ----------
    fn : callable
        The student's function, ``fn(q, k, v, mask=None) -> out``.
    masks : bool
        Also check masks. With ``masks=False`` the function is only ever
        called as ``fn(q, k, v)``, for attention written before masks are
        taught (chapter 3 of the book).
    numpy : bool
        ``fn`` takes and returns NumPy arrays (no gradient or device check).
    gradient : bool
        Also check the gradients by autograd through ``fn``.
    device : torch.device or str, optional
        Where to run the device check; default :func:`softmaxbook.get_device`.

    Returns
    -------
    CheckReport

    Examples
    --------
    >>> import math, torch, softmaxbook as sb
    >>> def unscaled(q, k, v, mask=None):
    ...     return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v
    >>> report = sb.checks.check_attention(unscaled)
    >>> print(report.problems[0])  # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
    With q (4, 8), k (6, 8), v (6, 5) (float64), no mask, row 3 of the result of
    your attention is [...]; expected [...]. That is attention without the scale:
    multiply the scores q @ k^T by 1/sqrt(D), D the size of the last dimension ...
    >>> def attention(q, k, v, mask=None):
    ...     return sb.scaled_dot_product_attention(q, k, v, mask=mask)
    >>> sb.checks.check_attention(attention).ok
    True
    """
    session = _Session(fn, "your attention", numpy=numpy, device=device)
    g = _generator(5)
    q, k, v = _randn(g, 4, 8), _randn(g, 6, 8), _randn(g, 6, 5)
    if not _attention_case(
        session,
        "q (4, 8), k (6, 8), v (6, 5) (float64), no mask",
        q,
        k,
        v,
        keyword=False,
    ):
        session.stopped = True
        return session.report("check_attention", [])
    qb, kb, vb = _randn(g, 2, 3, 5, 16), _randn(g, 2, 3, 7, 16), _randn(g, 2, 3, 7, 4)
    batched = "q (2, 3, 5, 16), k (2, 3, 7, 16), v (2, 3, 7, 4) (float64)"
    _attention_case(session, batched + ", no mask", qb, kb, vb, keyword=False)
    causal = torch.ones(5, 7, dtype=torch.bool).tril()
    padding = (torch.arange(7) < torch.tensor([7, 4])[:, None]).reshape(2, 1, 1, 7)
    empty = causal.clone()
    empty[3] = False
    if masks:
        _attention_case(session, batched + ", a causal mask (5, 7)", qb, kb, vb, causal)
        _attention_case(
            session,
            batched + ", a padding mask (2, 1, 1, 7) with lengths 7 and 4",
            qb,
            kb,
            vb,
            padding,
        )
        _attention_case(
            session,
            batched + ", a causal mask whose query 3 may attend to nothing",
            qb,
            kb,
            vb,
            empty,
        )
    qo = torch.tensor([[50.0] * 4, [0.0] * 4], dtype=F64)
    ko = torch.tensor([[10.0] * 4, [0.0] * 4, [-10.0] * 4], dtype=F64)
    vo = _randn(g, 3, 2)
    _attention_case(
        session,
        "q (2, 4), k (3, 4) with scores q k^T / sqrt(D) up to 1000 (overflow)",
        qo,
        ko,
        vo,
        keyword=False,
    )
    for dtype in _dtypes(session):
        _attention_case(
            session,
            f"q (4, 8), k (6, 8), v (6, 5) ({_dtype(dtype)})",
            q.to(dtype),
            k.to(dtype),
            v.to(dtype),
            keyword=False,
        )
    q32, k32, v32 = q.float(), k.float(), v.float()
    session.on_device(
        "float32 q, k, v on the accelerator",
        [("q", q32), ("k", k32), ("v", v32)],
        shapes=[(4, 5)],
        want=_attention_np(q32, k32, v32),
    )
    if gradient and not session.numpy:
        grad_out = _randn(g, 2, 3, 5, 4)
        mask = empty if masks else None
        want = torch.autograd.functional.vjp(
            lambda a, b, c: _attention_t(a, b, c, mask), (qb, kb, vb), grad_out
        )[1]
        session.gradient(
            batched
            + (
                ", a causal mask whose query 3 may attend to nothing"
                if masks
                else ", no mask"
            ),
            [("q", qb), ("k", kb), ("v", vb)],
            [("mask", mask)] if masks else [],
            wrt={"q", "k", "v"},
            shapes=[(2, 3, 5, 4)],
            output_grads=[grad_out],
            want=dict(zip("qkv", want)),
            forward=_attention_np(qb, kb, vb, mask),
        )
    checked = (
        [
            "values on (L, D) and (B, H, L, D) inputs with L != S and D != Dv",
            "the 1/sqrt(D) scale",
            "the softmax over the keys",
        ]
        + (
            [
                "causal and padding masks (True = may attend)",
                "a query with nothing to attend gives zeros",
            ]
            if masks
            else []
        )
        + [
            "overflow",
            f"the dtype kept ({_dtype_words(session)})",
            "the device kept",
            "the inputs not modified",
        ]
        + (
            ["the gradients with respect to q, k and v"]
            if gradient and not session.numpy
            else []
        )
        + ([] if masks else ["not checked with masks=False: masks"])
    )
    return session.report("check_attention", checked)


# --------------------------------------------------------------------------------------
# The softmax backward pass (vector-Jacobian product)


def _backward_candidates(s: Tensor, g: Tensor) -> list[Candidate]:
    found = [
        (
            "no sum",
            s * g,
            "That is s * g: it misses the term -s_i * sum_j s_j g_j, which "
            "comes from the denominator that couples every entry of the row. Return "
            "s * (g - (s * g).sum(dim=-1, keepdim=True)).",
        ),
        (
            "sign",
            -_vjp(s, g),
            "The sign is flipped: the gradient is s * (g - s . g), "
            "not s * (s . g - g).",
        ),
        (
            "unweighted",
            s * (g - g.sum(-1, keepdim=True)),
            "The sum must be weighted by s: s . g = sum_j s_j g_j, not sum_j g_j.",
        ),
        (
            "no s",
            g - (s * g).sum(-1, keepdim=True),
            "Multiply by s: the gradient is "
            "s * (g - s . g), and it is 0 wherever s is 0.",
        ),
        (
            "scores",
            _vjp(torch.softmax(s, -1), g),
            "Your function seems to apply the "
            "softmax to its first argument. s is already the softmax output (as in "
            "sb.softmax_backward(s, grad_output)): use it as it is.",
        ),
    ]
    for d in range(s.dim() - 1):
        found.append(
            (
                f"dim {d}",
                _vjp(s, g, dim=d),
                f"You summed s * g along dim={d}; "
                f"the sum runs over the row, the last dimension (dim=-1).",
            )
        )
    return found


def _backward_explain(got: Tensor, want: Tensor) -> str:
    if bool(got.isnan().any()):
        return (
            "nan appeared: the gradient needs no division and no log; it is 0 "
            "wherever s is 0, including a row of zeros (a fully masked query)."
        )
    return _rows_sum_hint(got, 0.0, "rows") or (
        "Compare with s * (g - (s * g).sum(dim=-1, keepdim=True))."
    )


def _backward_case(session, label, s, grad) -> bool:
    out = session.call(label, [("s", s), ("grad_output", grad)], shapes=[s.shape])
    if out is None:
        return False
    if session.dtype(label, out, s.dtype):
        session.values(
            label,
            out,
            _vjp(s.to(F64), grad.to(F64)),
            s.dtype,
            candidates=lambda: _backward_candidates(s.to(F64), grad.to(F64)),
            explain=_backward_explain,
        )
    return True


def check_softmax_backward(
    fn: Callable, *, numpy: bool = False, device=None
) -> CheckReport:
    r"""Check a student's softmax backward pass, ``fn(s, grad_output)``.

    ``s`` is the softmax **output** (not the scores) and ``grad_output`` the
    gradient :math:`g` of a loss with respect to ``s``, both ``(..., N)``;
    ``fn`` returns the gradient with respect to the scores, the
    vector-Jacobian product

    .. math:: \bar x = J^\top g = s \odot (g - \textstyle\sum_j s_j g_j),

    of the same shape and dtype, as :func:`softmaxbook.softmax_backward` does.
    Checked: values against autograd of ``torch.softmax`` in float64 on
    several shapes, with a diagnosis of the usual mistakes (the missing sum
    term, the sign, an unweighted sum, a sum along the wrong dimension, a
    function that expects the scores instead of ``s``, a full Jacobian);
    zeros in ``s`` (masked keys) and a row of zeros (a fully masked query)
    give zero gradients; dtype and device kept; neither input modified.

    Parameters
    ----------
    fn : callable
        The student's function, ``fn(s, grad_output) -> grad_scores``.
    numpy : bool
        ``fn`` takes and returns NumPy arrays (no device check).
    device : torch.device or str, optional
        Where to run the device check; default :func:`softmaxbook.get_device`.

    Returns
    -------
    CheckReport

    Examples
    --------
    >>> import torch, softmaxbook as sb
    >>> report = sb.checks.check_softmax_backward(lambda s, g: s * g)
    >>> print(report.problems[0])  # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
    With s = softmax([1, 0.5, 2.5, -0.1]) and grad_output [0.3, -1, 0.5, 2]
    (float64), your softmax backward returned [...]; expected [...]. That is s * g:
    it misses the term -s_i * sum_j s_j g_j, ...
    >>> sb.checks.check_softmax_backward(sb.softmax_backward).ok
    True
    """
    session = _Session(fn, "your softmax backward", numpy=numpy, device=device)
    s = torch.softmax(torch.tensor([1.0, 0.5, 2.5, -0.1], dtype=F64), -1)
    grad = torch.tensor([0.3, -1.0, 0.5, 2.0], dtype=F64)
    if not _backward_case(
        session,
        f"s = softmax([1, 0.5, 2.5, -0.1]) and grad_output {_fmt(grad)} (float64)",
        s,
        grad,
    ):
        session.stopped = True
        return session.report("check_softmax_backward", [])
    g = _generator(6)
    inputs = []
    for shape in [(3, 7), (2, 3, 4, 5)]:
        s = torch.softmax(_randn(g, *shape, scale=2.0), -1)
        grad = _randn(g, *shape)
        inputs.append((s, grad))
        _backward_case(
            session,
            f"s = softmax of random scores of shape {shape} and a "
            f"random grad_output (float64)",
            s,
            grad,
        )
    s = _softmax_t(torch.tensor([[1.0, 0.5, -INF, -INF], [-INF] * 4], dtype=F64))
    grad = torch.tensor([[0.3, -1.0, 0.5, 2.0], [1.0, 2.0, 3.0, 4.0]], dtype=F64)
    _backward_case(
        session,
        "s [[0.6225, 0.3775, 0, 0], [0, 0, 0, 0]] (masked keys and "
        "a fully masked row) and grad_output [[0.3, -1, 0.5, 2], [1, 2, 3, 4]]",
        s,
        grad,
    )
    s, grad = inputs[0]
    for dtype in _dtypes(session):
        _backward_case(
            session,
            f"s = softmax of random scores of shape (3, 7) and a "
            f"random grad_output ({_dtype(dtype)})",
            s.to(dtype),
            grad.to(dtype),
        )
    session.on_device(
        "float32 s and grad_output on the accelerator",
        [("s", s.float()), ("grad_output", grad.float())],
        shapes=[s.shape],
        want=_vjp(s, grad),
    )
    checked = [
        "values against autograd on shapes (4,), (3, 7), (2, 3, 4, 5)",
        "zero weights and a fully masked row give zero gradients",
        f"the dtype kept ({_dtype_words(session)})",
        "the device kept",
        "the inputs not modified",
    ]
    return session.report("check_softmax_backward", checked, "the device")


# --------------------------------------------------------------------------------------
# Top-p (nucleus) filtering


def _top_p_np(z: np.ndarray, p: float) -> np.ndarray:
    """Keep the most probable tokens while the mass ranked above them is < p."""
    order = np.argsort(-z, axis=-1, kind="stable")
    probs = reference.softmax(np.take_along_axis(z, order, axis=-1))
    before = np.cumsum(probs, axis=-1) - probs  # the mass of the tokens ranked above
    keep = np.empty(z.shape, dtype=bool)
    np.put_along_axis(keep, order, before < p, axis=-1)
    return np.where(keep, z, -np.inf)


def _top_p_shifted(z: np.ndarray, p: float, shift: int) -> np.ndarray:
    """The nucleus with one token more or fewer (at least one kept): for diagnosis."""
    order = np.argsort(-z, axis=-1, kind="stable")
    probs = reference.softmax(np.take_along_axis(z, order, axis=-1))
    size = ((np.cumsum(probs, axis=-1) - probs) < p).sum(axis=-1, keepdims=True) + shift
    ranks = np.empty(z.shape, dtype=int)
    np.put_along_axis(
        ranks, order, np.broadcast_to(np.arange(z.shape[-1]), z.shape), axis=-1
    )
    return np.where(ranks < np.clip(size, 1, None), z, -np.inf)


def _top_p_candidates(z: Tensor, p: float) -> list[Candidate]:
    zs = _np(z)
    want = _top_p_np(zs, p)
    return [
        (
            "one fewer",
            _t(_top_p_shifted(zs, p, -1)),
            f"You dropped the token that makes the kept mass reach p = {p}: the "
            "nucleus is the smallest set whose mass is >= p, so keep a token while "
            "the mass ranked *above* it is still < p (cumsum - probs < p).",
        ),
        (
            "one more",
            _t(_top_p_shifted(zs, p, 1)),
            "You kept one token too many: stop as soon as the kept mass reaches p = "
            f"{p} (keep a token while the mass ranked above it is < p).",
        ),
        (
            "sorted",
            _t(-np.sort(-want, axis=-1)),
            "That is the filtered row in sorted order: return the logits in their "
            "original order (compare each logit with the threshold, or scatter back).",
        ),
        (
            "zeros",
            _t(np.where(np.isinf(want), 0.0, want)),
            "Removed tokens must be -inf, not 0, so that the softmax gives them 0.",
        ),
        (
            "probabilities",
            _t(np.where(np.isinf(want), 0.0, reference.softmax(want))),
            "Those are probabilities: return the filtered logits (-inf where removed).",
        ),
    ]


def _top_p_explain(got: Tensor, want: Tensor) -> str:
    kept_got, kept_want = torch.isfinite(got).sum(-1), torch.isfinite(want).sum(-1)
    if bool((kept_got == 0).any()):
        return (
            "Every token was removed from a row: the most probable token has no mass "
            "above it, so it is always kept."
        )
    if not torch.equal(kept_got, kept_want):
        return (
            f"You kept {_fmt(kept_got.reshape(-1), 4)} tokens per row where the "
            f"nucleus has {_fmt(kept_want.reshape(-1), 4)}. Sort the probabilities "
            f"of each row in decreasing order and keep a token while the mass ranked "
            f"above it is < p."
        )
    return "The kept logits must be returned unchanged, the others set to -inf."


def check_top_p_filter(
    fn: Callable, *, numpy: bool = False, device=None
) -> CheckReport:
    r"""Check a student's top-p (nucleus) filter, ``fn(logits, p)``.

    With the probabilities :math:`\pi = \mathrm{softmax}(z)` of a row sorted
    in decreasing order, the nucleus is the top
    :math:`m = \min\{j : \sum_{i \le j} \pi_{(i)} \ge p\}` tokens (Holtzman et
    al., 2020); ``fn`` returns the logits with every other entry set to
    ``-inf``, in the original order, same shape and dtype. The inputs have no
    ties and no cumulative mass within rounding of ``p``, so any correct
    convention passes. Checked: the nucleus on unsorted rows (diagnosed when
    one token too few or too many is kept, or the row comes back sorted, or
    removed tokens are 0 instead of ``-inf``, or probabilities come back); a
    small ``p`` keeps the most probable token; ``p = 1`` keeps everything;
    batched rows with different nucleus sizes; dtype and device kept; the
    logits not modified (``masked_fill_`` is in place).

    Parameters
    ----------
    fn : callable
        The student's function, ``fn(logits, p) -> filtered_logits``, ``p`` a
        Python float in (0, 1].
    numpy : bool
        ``fn`` takes and returns NumPy arrays (no device check).
    device : torch.device or str, optional
        Where to run the device check; default :func:`softmaxbook.get_device`.

    Returns
    -------
    CheckReport

    Examples
    --------
    >>> import softmaxbook as sb
    >>> sb.checks.check_top_p_filter(sb.top_p_filter).ok
    True
    """
    session = _Session(fn, "your top-p filter", numpy=numpy, device=device)
    for number, (label, z, p) in enumerate(_top_p_inputs()):
        if not _top_p_run(session, label, z, p) and number == 0:
            session.stopped = True
            return session.report("check_top_p_filter", [], "the device")
    x = z.float()  # the last input: a batch
    session.on_device(
        "float32 logits on the accelerator and p = 0.8",
        [("logits", x), ("p", _Scalar(0.8))],
        shapes=[x.shape],
        want=_t(_top_p_np(_np(x), 0.8)),
    )
    checked = [
        "the nucleus on unsorted rows, for p = 0.2, 0.7, 0.8, 0.9 and 1",
        "batched rows with different nucleus sizes",
        "the dtype kept (float64, float32)",
        "the device kept",
        "the logits not modified",
    ]
    return session.report("check_top_p_filter", checked, "the device")


def _top_p_inputs() -> list[tuple[str, Tensor, float]]:
    """(label, logits, p): no ties, and no cumulative mass within 1e-4 of p."""
    probs = torch.tensor([0.45, 0.10, 0.30, 0.06, 0.09], dtype=F64)
    z = torch.log(probs)
    basic = f"logits log({_fmt(probs)}) (float64) and p = "
    g = _generator(7)
    ranks = torch.arange(1, 41, dtype=F64)
    zipf = torch.stack([-2.0 * ranks.log(), -0.5 * ranks.log()])  # (2, 40)
    zipf = zipf[:, torch.randperm(40, generator=g)]
    batch = _randn(g, 2, 3, 20, scale=2.0)
    return [
        (basic + "0.7", z, 0.7),
        (basic + "0.2", z, 0.2),
        (basic + "1", z, 1.0),
        (
            "two unsorted rows of 40 logits, one peaked and one flat (float64), and "
            "p = 0.9",
            zipf,
            0.9,
        ),
        ("random logits of shape (2, 3, 20) (float64) and p = 0.8", batch, 0.8),
        ("random logits of shape (2, 3, 20) (float32) and p = 0.8", batch.float(), 0.8),
    ]


class _Scalar:
    """A non-tensor argument passed through :meth:`_Session.call` untouched."""

    def __init__(self, value):
        self.value = value


def _top_p_run(session: _Session, label: str, z: Tensor, p: float) -> bool:
    out = session.call(label, [("logits", z), ("p", _Scalar(p))], shapes=[z.shape])
    if out is None:
        return False
    if session.dtype(label, out, z.dtype):
        session.values(
            label,
            out,
            _t(_top_p_np(_np(z), p)),
            z.dtype,
            candidates=lambda: _top_p_candidates(z, p),
            explain=_top_p_explain,
        )
    return True


# --------------------------------------------------------------------------------------
# Merging partial attention results


def _partial(q, k, v) -> tuple[Tensor, Tensor]:
    """Attention of ``q`` over keys ``k`` (float64): the output and the logsumexp."""
    scores = _np(q) @ np.swapaxes(_np(k), -1, -2) / math.sqrt(q.shape[-1])
    return _t(reference.softmax(scores) @ _np(v)), _t(reference.logsumexp(scores))


def _merge_np(oa, la, ob, lb) -> tuple[Tensor, Tensor]:
    """The merge from its definition, stable for any lse: for the extreme cases."""
    la, lb = _np(la), _np(lb)
    lse = np.logaddexp(la, lb)
    with np.errstate(invalid="ignore"):
        wa = np.where(np.isneginf(la), 0.0, np.exp(la - lse))[..., None]
        wb = np.where(np.isneginf(lb), 0.0, np.exp(lb - lse))[..., None]
    return _t(wa * _np(oa) + wb * _np(ob)), _t(lse)


def _merge_t(oa, la, ob, lb) -> tuple[Tensor, Tensor]:
    lse = torch.logaddexp(la, lb)
    return (
        torch.exp(la - lse)[..., None] * oa + torch.exp(lb - lse)[..., None] * ob,
        lse,
    )


def _merge_candidates(oa, la, ob, lb) -> list[Candidate]:
    return [
        (
            "unnormalized",
            (la.exp()[..., None] * oa + lb.exp()[..., None] * ob),
            "Weight each part by its share of the total mass, exp(lse_a - lse) and "
            "exp(lse_b - lse), which sum to one; exp(lse_a) and exp(lse_b) alone do "
            "not.",
        ),
        (
            "average",
            (oa + ob) / 2,
            "An average ignores how much softmax mass each part holds: weight each "
            "part by exp(lse_part - lse), with lse = log(exp(lse_a) + exp(lse_b)).",
        ),
    ]


def _merge_explain(got: Tensor, want: Tensor) -> str:
    overflow = bool((torch.isinf(got) & torch.isfinite(want)).any())
    if bool(got.isnan().any()) or overflow:
        if bool(torch.isneginf(want).any()) or bool((want == 0).all()):
            return (
                "When both parts are empty (lse = -inf), -inf - (-inf) is nan: an "
                "empty merge gives out = 0 and lse = -inf. Shift by the maximum only "
                "where it is finite."
            )
        return (
            "exp(lse) overflows or underflows for lse = +-1000: shift by "
            "m = max(lse_a, lse_b) before exp, as the stable softmax does, and "
            "compute lse = m + log(exp(lse_a - m) + exp(lse_b - m))."
        )
    return (
        "The merged logsumexp is log(exp(lse_a) + exp(lse_b)), and the merged output "
        "exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b."
    )


def _merge_run(session, label, oa, la, ob, lb, want) -> bool:
    args = [("out_a", oa), ("lse_a", la), ("out_b", ob), ("lse_b", lb)]
    out = session.call(label, args, shapes=[oa.shape, la.shape], outputs=2)
    if out is None:
        return False
    out_got, lse_got = out
    if session.dtype(label, out_got, oa.dtype):
        f64 = [t.to(F64) for t in (oa, la, ob, lb)]
        session.values(
            label,
            out_got,
            want[0],
            oa.dtype,
            what="an output",
            candidates=lambda: _merge_candidates(*f64),
            explain=_merge_explain,
        )
    session.values(
        label, lse_got, want[1], la.dtype, what="an lse", explain=_merge_explain
    )
    return True


def check_merge_attention_states(
    fn: Callable, *, numpy: bool = False, gradient: bool = True, device=None
) -> CheckReport:
    r"""Check a student's merge of two partial attention results over disjoint keys.

    ``fn(out_a, lse_a, out_b, lse_b)`` returns ``(out, lse)``: attention over
    the union of the keys of the two parts, as
    :func:`softmaxbook.merge_attention_states` does,

    .. math:: \mathrm{lse} = \log(e^{\mathrm{lse}_a} + e^{\mathrm{lse}_b}), \qquad
              o = e^{\mathrm{lse}_a - \mathrm{lse}} o_a
                  + e^{\mathrm{lse}_b - \mathrm{lse}} o_b .

    ``out_a``, ``out_b`` are ``(..., L, Dv)`` and ``lse_a``, ``lse_b``
    ``(..., L)``. Checked: agreement with attention over all the keys for
    two splits and batch shapes; both orders of the parts; logsumexps of
    ``+-1000`` (where ``exp(lse)`` overflows or underflows); an empty part
    (``lse = -inf``, output 0) and two empty parts (``out = 0``,
    ``lse = -inf``); dtype of the output and device kept; no input modified;
    the gradients with respect to all four inputs.

    Parameters
    ----------
    fn : callable
        The student's function, ``fn(out_a, lse_a, out_b, lse_b) -> (out, lse)``.
    numpy : bool
        ``fn`` takes and returns NumPy arrays (no gradient or device check).
    gradient : bool
        Also check the gradients by autograd through ``fn``.
    device : torch.device or str, optional
        Where to run the device check; default :func:`softmaxbook.get_device`.

    Returns
    -------
    CheckReport

    Examples
    --------
    >>> import softmaxbook as sb
    >>> sb.checks.check_merge_attention_states(sb.merge_attention_states).ok
    True
    """
    session = _Session(fn, "your merge", numpy=numpy, device=device)
    g = _generator(8)
    q, k, v = _randn(g, 2, 3, 4), _randn(g, 2, 6, 4), _randn(g, 2, 6, 5)
    first = (*_partial(q, k[:, :2], v[:, :2]), *_partial(q, k[:, 2:], v[:, 2:]))
    want = _partial(q, k, v)
    split = "parts over keys 0-1 and 2-5 of random q (2, 3, 4), k, v (float64)"
    if not _merge_run(session, split, *first, want):
        session.stopped = True
        return session.report("check_merge_attention_states", [])
    out_a, lse_a, out_b, lse_b = first
    _merge_run(
        session, split + ", in the other order", out_b, lse_b, out_a, lse_a, want
    )
    q2, k2, v2 = _randn(g, 2, 2, 4, 8), _randn(g, 2, 2, 9, 8), _randn(g, 2, 2, 9, 3)
    second = (
        *_partial(q2, k2[..., :7, :], v2[..., :7, :]),
        *_partial(q2, k2[..., 7:, :], v2[..., 7:, :]),
    )
    _merge_run(
        session,
        "parts over keys 0-6 and 7-8 of random q (2, 2, 4, 8), k, v (float64)",
        *second,
        _partial(q2, k2, v2),
    )
    o1, o2 = _randn(g, 2, 5), _randn(g, 2, 5)
    for la, lb, words in [
        ([1000.0, -1000.0], [999.0, -1001.0], "+-1000"),
        ([1.5, 0.3], [-INF, -INF], "part b empty"),
        ([-INF, -INF], [-INF, -INF], "both parts empty"),
    ]:
        la, lb = torch.tensor(la, dtype=F64), torch.tensor(lb, dtype=F64)
        oa = torch.zeros_like(o1) if bool(torch.isinf(la).all()) else o1
        ob = torch.zeros_like(o2) if bool(torch.isinf(lb).all()) else o2
        _merge_run(
            session,
            f"outputs of shape (2, 5), lse_a {_fmt(la)} and lse_b {_fmt(lb)} ({words})",
            oa,
            la,
            ob,
            lb,
            _merge_np(oa, la, ob, lb),
        )
    for dtype in _dtypes(session):
        _merge_run(
            session,
            f"the parts of the first split in {_dtype(dtype)}",
            *[t.to(dtype) for t in first],
            want,
        )
    names = ["out_a", "lse_a", "out_b", "lse_b"]
    session.on_device(
        "float32 parts on the accelerator",
        list(zip(names, [t.float() for t in first])),
        shapes=[out_a.shape, lse_a.shape],
        want=want,
        outputs=2,
    )
    if gradient and not session.numpy:
        grads = _randn(g, *out_a.shape), _randn(g, *lse_a.shape)
        want_grads = torch.autograd.functional.vjp(_merge_t, first, grads)[1]
        session.gradient(
            split,
            list(zip(names, first)),
            wrt=set(names),
            shapes=[out_a.shape, lse_a.shape],
            outputs=2,
            output_grads=list(grads),
            want=dict(zip(names, want_grads)),
            forward=want,
        )
    checked = [
        "agreement with attention over all keys, two splits and batch shapes",
        "both orders",
        "lse of +-1000",
        "an empty part and two empty parts",
        f"the output's dtype kept ({_dtype_words(session)})",
        "the device kept",
        "the inputs not modified",
    ] + (
        ["the gradients with respect to all four inputs"]
        if gradient and not session.numpy
        else []
    )
    return session.report("check_merge_attention_states", checked)


# --------------------------------------------------------------------------------------
# Attention entropy

_XLOGX_HINT = (
    "0 * log(0) is 0 * (-inf) = nan in floating point, but the entropy uses "
    "the limit 0 log 0 = 0: compute p * log(p) only where p > 0, e.g. "
    "torch.where(p > 0, p * torch.log(torch.where(p > 0, p, 1)), 0)."
)


def _entropy_np(w: Tensor) -> Tensor:
    p = _np(w)
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    rows = -plogp.sum(axis=-1)  # (..., L)
    live = p.sum(axis=-1) > 0
    return _t(np.where(live, rows, 0.0).sum(axis=-1) / np.maximum(live.sum(axis=-1), 1))


def _entropy_t(w: Tensor) -> Tensor:
    positive = w > 0
    plogp = torch.where(positive, w * torch.log(torch.where(positive, w, 1.0)), 0.0)
    live = w.sum(-1) > 0
    rows = torch.where(live, -plogp.sum(-1), 0.0)
    return rows.sum(-1) / live.sum(-1).clamp(min=1)


def _entropy_candidates(w: Tensor) -> list[Candidate]:
    want = _entropy_np(w)
    p = _np(w)
    with np.errstate(divide="ignore", invalid="ignore"):
        rows = -np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0).sum(axis=-1)
    return [
        (
            "bits",
            want / math.log(2),
            "That is the entropy in bits (log2): the book "
            "measures entropy in nats, with the natural log torch.log.",
        ),
        ("sign", -want, "The sign is flipped: H(p) = -sum_i p_i log p_i is >= 0."),
        (
            "all rows",
            _t(rows.mean(axis=-1)),
            "You averaged over every row, including rows of zeros (queries with "
            "nothing to attend to), which count as entropy 0: leave them out of the "
            "mean (divide by the number of rows with any weight).",
        ),
        (
            "sum",
            _t(rows.sum(axis=-1)),
            "You summed the rows' entropies: return their mean over the live rows.",
        ),
    ]


def _entropy_explain(w: Tensor):
    def explain(got: Tensor, want: Tensor) -> str:
        if bool(got.isnan().any()):
            if not bool((w > 0).any()):
                return (
                    "A map whose rows are all zeros has no live row: return 0 for it "
                    "(clamp the count of live rows at 1, and use 0 log 0 = 0)."
                )
            return _XLOGX_HINT
        return (
            "Compare with the mean, over the rows with any weight, of "
            "-sum_j w_ij log w_ij."
        )

    return explain


def _centered(grad: Tensor, support: Tensor) -> Tensor:
    """The gradient within the rows' simplex: minus its mean over each row's support.

    The entropy is defined on rows that sum to one, so a gradient is only
    determined up to a constant per row (formulas that divide by the row's sum
    and formulas that do not differ by exactly that).
    """
    count = support.sum(-1, keepdim=True).clamp(min=1)
    mean = (grad * support).sum(-1, keepdim=True) / count
    return (grad - mean) * support


def _entropy_shape_hint(got: tuple, w: Tensor) -> str:
    if got == tuple(w.shape[:-1]):
        return (
            " That is one entropy per row (per query): return one number per map, "
            "the mean over the rows that have any weight."
        )
    return ""


def _entropy_run(session, label, w) -> bool:
    out = session.call(
        label,
        [("weights", w)],
        shapes=[w.shape[:-2]],
        shape_hint=lambda got, want: _entropy_shape_hint(got, w),
    )
    if out is None:
        return False
    if session.dtype(label, out, w.dtype):
        session.values(
            label,
            out,
            _entropy_np(w),
            w.dtype,
            candidates=lambda: _entropy_candidates(w),
            explain=_entropy_explain(w),
        )
    return True


def check_attention_entropy(
    fn: Callable, *, numpy: bool = False, gradient: bool = True, device=None
) -> CheckReport:
    r"""Check a student's mean attention entropy, ``fn(weights)``, one number per map.

    .. math:: \bar H = \frac{1}{|R|} \sum_{i \in R} -\sum_j w_{ij} \log w_{ij},
              \qquad 0 \log 0 = 0,

    in nats, with :math:`R` the rows that have any weight (a fully masked
    query, a row of zeros, is left out; a map with no such row gives 0), as
    :func:`softmaxbook.attention_entropy` computes for rows that sum to one.
    ``weights`` is ``(..., L, S)``; the result is ``(...)``. Checked: softmax
    maps of several shapes; a causal map (exact zeros: ``0 log 0`` must not
    give ``nan``); one-hot and uniform rows (0 and :math:`\log S`); a map with
    a row of zeros, and one with only zeros; nats, not bits; dtype and device
    kept; the input not modified; a finite gradient (exact zeros included)
    that matches the reference on each row's support, up to a constant per
    row (the entropy is defined on rows that sum to one).

    Parameters
    ----------
    fn : callable
        The student's function, ``fn(weights) -> mean_entropy``.
    numpy : bool
        ``fn`` takes and returns NumPy arrays (no gradient or device check).
    gradient : bool
        Also check the gradient by autograd through ``fn``.
    device : torch.device or str, optional
        Where to run the device check; default :func:`softmaxbook.get_device`.

    Returns
    -------
    CheckReport

    Examples
    --------
    >>> import torch, softmaxbook as sb
    >>> def per_row_nan(w):
    ...     return -(w * torch.log(w)).sum(-1).mean(-1)
    >>> report = sb.checks.check_attention_entropy(per_row_nan)
    >>> print(report.problems[0])  # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
    With a causal map of shape (5, 5) (float64), your entropy function returned
    nan; expected 0.7416. 0 * log(0) is 0 * (-inf) = nan in floating point, ...
    >>> sb.checks.check_attention_entropy(sb.attention_entropy).ok
    True
    """
    session = _Session(fn, "your entropy function", numpy=numpy, device=device)
    w = torch.softmax(
        torch.tensor(
            [[1.0, 0.5, 2.5, -0.1], [0.0, 0.0, 1.0, 2.0], [3.0, -1.0, 0.0, 0.5]],
            dtype=F64,
        ),
        -1,
    )
    if not _entropy_run(session, "a softmax map of shape (3, 4) (float64)", w):
        session.stopped = True
        return session.report("check_attention_entropy", [])
    g = _generator(9)
    maps = torch.softmax(_randn(g, 2, 3, 5, 6, scale=2.0), -1)
    _entropy_run(session, "random softmax maps of shape (2, 3, 5, 6) (float64)", maps)
    causal = _softmax_t(_randn(g, 5, 5), torch.ones(5, 5, dtype=torch.bool).tril())
    _entropy_run(session, "a causal map of shape (5, 5) (float64)", causal)
    extremes = torch.stack(
        [torch.eye(4, dtype=F64), torch.full((4, 4), 0.25, dtype=F64)]
    )
    _entropy_run(
        session, "a one-hot map and a uniform map, shape (2, 4, 4) (float64)", extremes
    )
    padded = causal.clone()
    padded[2] = 0.0
    _entropy_run(
        session, "a causal map (5, 5) whose row 2 is all zeros (float64)", padded
    )
    _entropy_run(
        session,
        "a map of zeros, shape (1, 3, 4) (float64)",
        torch.zeros(1, 3, 4, dtype=F64),
    )
    _entropy_run(
        session, "random softmax maps of shape (2, 3, 5, 6) (float32)", maps.float()
    )
    session.on_device(
        "a float32 map on the accelerator",
        [("weights", maps.float())],
        shapes=[(2, 3)],
        want=_entropy_np(maps),
    )
    if gradient and not session.numpy:
        grad_out = torch.tensor(1.0, dtype=F64)
        want = torch.autograd.functional.vjp(_entropy_t, padded, grad_out)[1]
        session.gradient(
            "a causal map (5, 5) whose row 2 is all zeros (float64)",
            [("weights", padded)],
            wrt={"weights"},
            shapes=[()],
            output_grads=[grad_out],
            want={"weights": want},
            hint=_XLOGX_HINT,
            where=padded > 0,
            project=lambda grad: _centered(grad, padded > 0),
            forward=_entropy_np(padded),
        )
    checked = [
        "softmax maps of shapes (3, 4) and (2, 3, 5, 6)",
        "exact zeros (0 log 0 = 0)",
        "one-hot and uniform rows",
        "rows of zeros left out of the mean",
        "nats, not bits",
        "the dtype kept (float64, float32)",
        "the device kept",
        "the input not modified",
    ] + (
        [
            "a finite gradient, equal to the reference on each row's support (up to a "
            "constant per row)"
        ]
        if gradient and not session.numpy
        else []
    )
    return session.report("check_attention_entropy", checked)
