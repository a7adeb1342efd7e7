"""What the assignments' tests share: calling a submission, and judging what came back.

Two halves, for two processes:

* the **student's** process runs :func:`attempt` and :func:`plain` (inside a test's
  ``run``): call a submitted function, catch what it raises, and turn whatever it
  returned into plain data (detached CPU tensors, numbers, strings, lists), the only
  things that cross back to the grader;
* the **grader's** process runs the rest (inside ``make_inputs`` and ``judge``): build
  seeded inputs and compare what came back with float64 expectations, naming the
  likely mistake when the result matches one (a "candidate").

This module imports torch and the standard library only, never ``softmaxbook``: the
student's process imports it too.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

F64, F32, F16, BF16 = torch.float64, torch.float32, torch.float16, torch.bfloat16
INF = math.inf

#: (atol, rtol) of a result against the float64 expectation computed from the same
#: (rounded) inputs: a few units of the dtype's rounding, far below any mistake the
#: tests name.
TOL: dict[torch.dtype, tuple[float, float]] = {
    F64: (1e-8, 1e-8),
    F32: (1e-4, 1e-4),
    F16: (6e-3, 6e-3),
    BF16: (4e-2, 4e-2),
}

_MAX_DEPTH = 4
_MAX_ITEMS = 16


# --- the student's process ----------------------------------------------------------


def plain(value: Any, depth: int = 0) -> Any:
    """``value`` as plain data: a detached CPU ``torch.Tensor`` (not a subclass),
    numbers, strings, None, lists of them (as ``{"sequence", "items", "length"}``);
    anything else as ``"<an object of type T>"``."""
    if isinstance(value, Tensor):
        t = value.detach()
        if type(t) is not Tensor:
            t = t.as_subclass(Tensor)
        if t.layout != torch.strided:
            return f"<a {str(t.layout).replace('torch.', '')} tensor>"
        return t.to("cpu").clone().contiguous()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, tuple | list) and depth < _MAX_DEPTH:
        kind = "tuple" if isinstance(value, tuple) else "list"
        items = [plain(v, depth + 1) for v in value[:_MAX_ITEMS]]
        return {"sequence": kind, "items": items, "length": len(value)}
    return f"<an object of type {type(value).__name__}>"


def attempt(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """``{"value": plain(fn(...))}``, or ``{"raised": "TypeError: ..."}``.

    Only ``Exception`` is caught: ``SystemExit``, ``KeyboardInterrupt`` and the
    grader's own interruptions pass through.
    """
    try:
        return {"value": plain(fn(*args, **kwargs))}
    except Exception as error:  # the student's mistake, reported as a message
        return {"raised": describe_error(error)}


def describe_error(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    first = text[0] if text else ""
    if len(first) > 200:
        first = first[:200] + "..."
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


# --- the grader's process: formatting -----------------------------------------------


def fmt_number(v: float) -> str:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == 0:
        return "0"
    return f"{v:.7g}" if abs(v) >= 1000 else f"{v:.4g}"  # 9999.5, not 1e+04


def fmt(t: Any, limit: int = 8) -> str:
    """A short rendering of a tensor's values: ``[0.7311, 0.2689, 0]``."""
    t = torch.as_tensor(t).detach().to("cpu", F64)
    if t.dim() == 0:
        return fmt_number(float(t))
    if t.dim() == 2 and t.numel() <= max(limit, 12):
        return "[" + ", ".join(fmt(row) for row in t) + "]"
    flat = [fmt_number(v) for v in t.reshape(-1)[:limit].tolist()]
    more = ", ..." if t.numel() > limit else ""
    text = "[" + ", ".join(flat) + more + "]"
    return text if t.dim() <= 1 else f"{text} (shape {shape_of(t)})"


def shape_of(t: Tensor) -> str:
    return str(tuple(t.shape))


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def label(name: str, x: Tensor, note: str = "") -> str:
    """``scores [1000, 0] (float64)`` or ``random scores of shape (3, 7) (float32)``."""
    words = dtype_name(x.dtype) + (f", {note}" if note else "")
    if x.numel() <= 12:
        return f"{name} {fmt(x, 12)} ({words})"
    return f"random {name} of shape {shape_of(x)} ({words})"


def returned(entry: Any) -> str:
    """What a plain result is, in words: ``a tensor of shape (3,) (float32)``."""
    if isinstance(entry, Tensor):
        return f"a tensor of shape {shape_of(entry)} ({dtype_name(entry.dtype)})"
    if isinstance(entry, dict) and "sequence" in entry:
        return f"a {entry['sequence']} of {entry['length']} items"
    if isinstance(entry, str) and entry.startswith("<"):
        return entry.strip("<>")
    return f"{entry!r}"


# --- the grader's process: judging --------------------------------------------------

#: (name of a part, float64 expected tensor, hint): what a likely mistake returns.
Candidate = tuple[str, Tensor, str]

NOT_IMPLEMENTED = "Implement the function: the stub still raises NotImplementedError."
ERROR_HINTS = [
    (
        "without overflow",
        "A fill value like -1e9 does not fit in float16 (its largest number is 65504): "
        "fill with float('-inf').",
    ),
    ("unexpected keyword argument", "Keep the signature given in the assignment."),
    ("positional argument", "Keep the signature given in the assignment."),
    (
        "must match the size",
        "Check the shapes: a row's sum or maximum needs keepdim=True to broadcast "
        "against the row.",
    ),
    (
        "cannot be multiplied",
        "Check the shapes: the scores are q @ k.transpose(-2, -1), of shape "
        "(..., L, S), and the output is weights @ v.",
    ),
    ("numpy()", "Stay in torch: .numpy() leaves autograd; use torch operations."),
    (
        "expected scalar type",
        "Keep one dtype: create new tensors with the input's dtype "
        "(torch.zeros_like(x), x.new_full(...)).",
    ),
    ("forbidden", "The assignment asks you to write this yourself; see its spec."),
]

DTYPE_HINT = (
    "Keep the input's dtype: create new tensors with it (torch.zeros_like(x), "
    "x.new_full(...)); to compute in a wider type, convert the result back with "
    ".to(x.dtype)."
)


FLOAT32_HINT = (
    "The spec asks for float32 here: accumulate in float32 and return it with "
    ".to(torch.float32), not in half precision."
)


def error_hint(raised: str) -> str:
    if raised.startswith("NotImplementedError"):
        return NOT_IMPLEMENTED
    for fragment, hint in ERROR_HINTS:
        if fragment in raised:
            return hint
    return ""


def raised_message(entry: Mapping[str, Any], where: str, noun: str) -> str | None:
    """The message for a call that raised, or None when it returned."""
    if "raised" not in entry:
        return None
    hint = error_hint(str(entry["raised"]))
    return _join(f"With {where}, {noun} raised {entry['raised']}.", hint)


def _join(*parts: str) -> str:
    return " ".join(p.strip() for p in parts if p and p.strip())


def close(
    got: Tensor, want: Tensor, tol: tuple[float, float], scale: float = 1.0
) -> bool:
    """Every entry of ``got`` within tolerance of ``want`` (inf equal to inf)."""
    atol, rtol = tol
    g, w = got.to(F64), want.to(F64)
    return bool(torch.isclose(g, w, atol=atol * scale, rtol=rtol).all())


def worst(got: Tensor, want: Tensor, part: str, noun: str, where: str) -> str:
    """``With <where>, <noun> returned <got>; expected <want>.``, or for a large
    result the row with the largest error."""
    g, w = got.to(F64), want.to(F64)
    whose = f"{part} from {noun}" if part else noun
    if g.dim() <= 1 and g.numel() <= 8:
        verb = "is" if part else "returned"
        return f"With {where}, {whose} {verb} {fmt(g)}; expected {fmt(w)}."
    error = (g - w).abs().nan_to_num(nan=INF)
    error = torch.where((g == w) | (g.isnan() & w.isnan()), 0.0, error)
    index = int(error.reshape(-1).argmax())
    at = []
    for size in reversed(g.shape):
        at.append(index % size)
        index //= size
    at.reverse()
    if g.dim() == 1:
        i = at[0]
        return (
            f"With {where}, entry {i} of {whose} is {fmt(g[i])}; expected {fmt(w[i])}."
        )
    row = tuple(at[:-1])
    name = f"row {row[0] if len(row) == 1 else row}"
    return f"With {where}, {name} of {whose} is {fmt(g[row])}; expected {fmt(w[row])}."


def compare(
    got: Any,
    want: Tensor,
    *,
    where: str,
    noun: str,
    dtype: torch.dtype,
    part: str = "",
    candidates: Callable[[], Sequence[Candidate]] | None = None,
    explain: Callable[[Tensor, Tensor], str] | None = None,
    tol: tuple[float, float] | None = None,
    scale: float = 1.0,
) -> str | None:
    """None when ``got`` is a tensor of ``want``'s shape, of ``dtype``, with its values;
    else a message: where, what came back, what was expected, and a hint.

    A hint comes from the first candidate (a likely mistake, computed from the same
    inputs) that ``got`` matches, else from ``explain(got, want)``.
    """
    whose = f"{part} from {noun}" if part else noun
    if not isinstance(got, Tensor):
        return (
            f"With {where}, {whose} is {returned(got)}; expected a tensor of shape "
            f"{shape_of(want)} ({dtype_name(dtype)})."
        )
    if tuple(got.shape) != tuple(want.shape):
        hint = ""
        if tuple(got.shape) == tuple(want.shape[:-1]) and want.dim() > 0:
            hint = (
                "You reduced over the last dimension; keep one entry per input entry."
            )
        return _join(
            f"With {where}, {whose} has shape {shape_of(got)}; expected "
            f"{shape_of(want)}.",
            hint,
        )
    if not (got.is_floating_point() and got.dtype == dtype):
        # "Keep the input's dtype" would mislead where float32 is asked of a half
        # precision result (flash_forward's lse for bfloat16 inputs).
        narrower = dtype == torch.float32 and got.dtype in (torch.float16, BF16)
        return _join(
            f"With {where}, {whose} has dtype {dtype_name(got.dtype)}; expected "
            f"{dtype_name(dtype)}.",
            FLOAT32_HINT if narrower else DTYPE_HINT,
        )
    tol = tol or TOL[dtype]
    if close(got, want, tol, scale):
        return None
    message = worst(got, want, part, noun, where)
    for cand_part, value, hint in candidates() if candidates else ():
        if (
            cand_part == part
            and value.shape == got.shape
            and close(got, value, tol, scale)
        ):
            return _join(message, hint)
    if explain is not None:
        return _join(message, explain(got, want))
    if bool(got.isnan().any()) and not bool(want.isnan().any()):
        return _join(message, "nan appeared where the expected result has none.")
    return message


def parts(entry: Any, names: Sequence[str], where: str, noun: str) -> list[Any] | str:
    """The items of a returned tuple of ``len(names)`` items, or a message."""
    if isinstance(entry, dict) and "sequence" in entry:
        if entry["length"] == len(names):
            return list(entry["items"])
        what = f"a {entry['sequence']} of {entry['length']} items"
    else:
        what = returned(entry)
    return (
        f"With {where}, {noun} returned {what}; expected a tuple ({', '.join(names)})."
    )


def randn(g: torch.Generator, *shape: int, scale: float = 1.0) -> Tensor:
    return torch.randn(*shape, generator=g, dtype=F64) * scale


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_mask(g: torch.Generator, *shape: int, keep: float = 0.6) -> Tensor:
    """A random boolean mask (True = may attend) with at least one True per row."""
    mask = torch.rand(*shape, generator=g) < keep
    mask[..., 0] |= ~mask.any(dim=-1)
    return mask


def words(text: str) -> str:
    """Collapse whitespace (messages are one paragraph)."""
    return re.sub(r"\s+", " ", text).strip()
