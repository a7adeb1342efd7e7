"""The report a checker returns, and the formatting of its messages.

A message quotes tensors briefly (``[0.7311, 0.2689, 0]``, four significant
digits, the same on every machine) and is wrapped to fit a code cell of the
website. The problems of one run are collected by :class:`Problems`, which
merges the same mistake seen on several inputs into one message.
"""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

WIDTH = 76  # fits a code cell of the website (77 columns at 1280 px)
ALSO = 3  # how many other inputs with the same problem a message lists


@dataclass(frozen=True)
class CheckResult:
    """One check of a checker: an input the function was called on, and its verdict.

    Attributes
    ----------
    name : str
        What was checked, in words: the input (``"scores [1000, 0] (float64,
        overflow)"``), with ``": the gradient"`` for the gradient on it.
    passed : bool
        True when this check showed no problem.
    points : float
        What the check is worth (1 unless a checker says otherwise).
    message : str
        Why it failed, in the words of the report's problems (the first
        problem this check showed); empty when it passed.
    """

    name: str
    passed: bool
    points: float = 1.0
    message: str = ""

    @property
    def score(self) -> float:
        """``points`` when passed, else 0."""
        return self.points if self.passed else 0.0


@dataclass
class CheckReport:
    """The outcome of a checker: truthy when every check passed.

    A grade is :attr:`score` out of :attr:`max_score`. A stub that raises
    ``NotImplementedError`` scores 0, each passed check adds its points, and a
    correct function scores :attr:`max_score`. Counting the problems is no
    grade, since a stub reports fewer problems than most wrong functions.

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
    results : list of CheckResult
        One result per check, in the order they ran: each input the function
        was called on (and its gradient, and the accelerator) is one check,
        passed when it showed no problem. The list is the same for every
        function a checker is given (with the same options, on the same
        machine): when the first input fails, the other checks still run for
        the score, although only the first problem is reported.

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

    The score of a softmax that overflows, and its first failed check:

    >>> def naive_softmax(x):
    ...     e = torch.exp(x)
    ...     return e / e.sum(dim=-1, keepdim=True)
    >>> report = sb.checks.check_softmax(naive_softmax)
    >>> f"{report.score:g} / {report.max_score:g}"
    '10 / 16'
    >>> failed = next(r for r in report.results if not r.passed)
    >>> failed.name, failed.points
    ('scores [1000, 0] (float64, overflow)', 1.0)
    """

    checker: str
    function: str
    problems: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    results: list[CheckResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems

    @property
    def score(self) -> float:
        """The sum of the points of the passed checks (0 for a stub)."""
        # No colon in that line: napoleon would read what precedes one as a type.
        return sum(r.score for r in self.results)

    @property
    def max_score(self) -> float:
        """The points of all the checks."""
        return sum(r.points for r in self.results)

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        head = f"{self.checker}({self.function}): "
        if self.ok:
            lines = [head + "all checks passed."]
            lines += wrap(
                "Checked: " + "; ".join(self.checked) + ".", subsequent_indent="  "
            )
            return "\n".join(lines)
        count = len(self.problems)
        lines = [head + f"{count} problem{'s' if count > 1 else ''}"]
        for number, problem in enumerate(self.problems, 1):
            lines += wrap(
                problem, initial_indent=f"{number:>2}. ", subsequent_indent="    "
            )
        return "\n".join(lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))  # IPython shows str(), not the fields

    def raise_if_failed(self) -> None:
        """Raise ``AssertionError`` with every problem, if there is any (for pytest)."""
        if self.problems:
            raise AssertionError(str(self))


def wrap(text: str, initial_indent: str = "", subsequent_indent: str = "") -> list[str]:
    """Wrap at ``WIDTH`` columns; short ``[...]`` and ``(...)`` groups stay whole."""
    chars, opened = list(text), list[int]()
    for i, char in enumerate(chars):
        if char in "([":
            opened.append(i)
        elif char in ")]" and opened:
            start = opened.pop()
            if i - start <= 40:  # keep "[nan, 0]" and "(float64, overflow)" whole
                chars[start:i] = [c if c != " " else "\0" for c in chars[start:i]]
    text = re.sub(r"\b(\w{1,2}) \(", "\\1\0(", "".join(chars))  # "q (4, 8)" stays whole
    lines = textwrap.wrap(
        text,
        WIDTH,
        break_on_hyphens=False,
        initial_indent=initial_indent,
        subsequent_indent=subsequent_indent,
    )
    return [line.replace("\0", " ") for line in lines]


def fmt_number(v: float) -> str:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return "0" if v == 0 else f"{v:.4g}"


def fmt(t: object, limit: int = 8) -> str:
    """A short, stable rendering of a tensor's values: ``[0.7311, 0.2689, 0]``."""
    t = torch.as_tensor(t).detach().to("cpu", torch.float64)
    if t.dim() == 0:
        return fmt_number(float(t))
    if t.dim() == 2 and t.numel() <= limit:
        return "[" + ", ".join(fmt(row) for row in t) + "]"
    flat = [fmt_number(v) for v in t.reshape(-1)[:limit].tolist()]
    more = ", ..." if t.numel() > limit else ""
    text = "[" + ", ".join(flat) + more + "]"
    return text if t.dim() <= 1 else f"{text} (shape {shape_of(t)})"


def shape_of(t: Any) -> str:
    return str(tuple(t.shape))


def dtype_name(dtype: object) -> str:
    return str(dtype).replace("torch.", "")  # also NumPy's dtypes: "float32"


def mismatch(label: str, noun: str, got: Tensor, want: Tensor, what: str) -> str:
    """``With <label>, <noun> returned <got>; expected <want>.``, for a large
    result the row (or entry) with the largest error."""
    if got.dim() <= 1 and got.numel() <= 8:
        subject = f"{what} of {noun} is" if what else f"{noun} returned"
        return f"With {label}, {subject} {fmt(got)}; expected {fmt(want)}."
    error = (got - want).abs().nan_to_num(nan=math.inf)
    error = torch.where((got == want) | (got.isnan() & want.isnan()), 0.0, error)
    where = np.unravel_index(int(error.reshape(-1).argmax()), tuple(got.shape))
    if got.dim() == 1:
        i = int(where[0])
        return (
            f"With {label}, entry {i} of {what or 'the result'} of {noun} "
            f"is {fmt(got[i])}; expected {fmt(want[i])}."
        )
    row = tuple(int(i) for i in where[:-1])
    name = f"row {row[0] if len(row) == 1 else row}"
    whose = what or "the result"
    return (
        f"With {label}, {name} of {whose} of {noun} is "
        f"{fmt(got[row])}; expected {fmt(want[row])}."
    )


def function_name(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return "a lambda" if name == "<lambda>" else name


class Problems:
    """The problems of one run of a checker, one message per kind.

    Problems with the same key (the same exception, the same diagnosed
    mistake) are merged into one message that lists every input showing it.
    """

    def __init__(self) -> None:
        # key -> (message, the first input that showed it, the other inputs)
        self._problems: dict[object, tuple[str, str, list[str]]] = {}

    def problem(self, key: object, label: str, message: str) -> None:
        """Record ``message``, revealed by the input ``label``, under ``key``."""
        if key in self._problems:
            _, first, also = self._problems[key]
            if label != first and label not in also:
                also.append(label)  # shown up to ALSO times, then counted
        else:
            self._problems[key] = (message, label, [])

    def messages(self) -> list[str]:
        """One message per key, naming the other inputs that showed the problem."""
        messages = []
        for message, _, also in self._problems.values():
            if also:
                shown = "; ".join(also[:ALSO])
                more = len(also) - ALSO
                if more > 0:
                    shown += f"; and {more} more input{'s' if more > 1 else ''}"
                message += f" The same problem with {shown}."
            messages.append(message)
        return messages
