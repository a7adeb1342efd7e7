"""Argument checks shared by the library: one clear error per kind of bad input.

Every public function validates its arguments with these helpers, so that bad
input fails at the call with a message that names the argument, instead of
deep inside torch or, worse, as a silent ``nan``. The checks that several
modules share live here once: a tensor, a dimension, a positive number, a
boolean mask (True = may attend), the ``q, k, v`` of attention, the
``is_causal`` names and grouped-query heads (the pieces that
:func:`softmaxbook.attention._args.resolve_attention`, the one resolver of
every attention entry point, builds on; ``check_attention_args`` remains for the
kernels, which sit below the attention layer); and :func:`zero_empty_rows`, the one
guard that keeps a row with nothing to attend from turning into ``nan``;
and :func:`check_installed`, the one message for a missing optional package.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Iterable
from numbers import Real

import torch
from torch import Tensor


def check_tensor(x: object, name: str = "x") -> Tensor:
    """Raise ``TypeError`` unless ``x`` is a ``torch.Tensor``."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def check_float(x: object, name: str = "x") -> Tensor:
    """Raise ``TypeError`` unless ``x`` is a floating-point tensor."""
    x = check_tensor(x, name)
    if not x.is_floating_point():
        raise TypeError(
            f"{name} must be a floating-point tensor, got dtype {x.dtype}; "
            f"convert it first, e.g. {name}.float()"
        )
    return x


def check_dim(x: Tensor, dim: int, name: str = "dim") -> int:
    """Return ``dim`` as a non-negative index; ``IndexError`` when out of range.

    A 0-d tensor counts as one row of one entry: ``dim`` may be 0 or -1.
    """
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{name} must be an int, got {type(dim).__name__}")
    ndim = max(x.dim(), 1)
    if not -ndim <= dim < ndim:
        raise IndexError(
            f"{name}={dim} is out of range for a tensor with {x.dim()} dimension(s); "
            f"expected {-ndim} <= {name} < {ndim}"
        )
    return dim % ndim


def check_real(value: object, name: str) -> float:
    """Raise unless ``value`` is a finite real number (not a bool, not ``nan``)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return float(value)


def check_positive(value: object, name: str) -> float:
    """Raise unless ``value`` is a finite real number > 0 (a temperature, a scale)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    number = float(value)
    if not (math.isfinite(number) and number > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return number


def check_nonnegative(value: object, name: str) -> float:
    """Raise unless ``value`` is a finite real number >= 0 (a threshold, a decay)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    number = float(value)
    if not (math.isfinite(number) and number >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    return number


def check_positive_int(value: object, name: str) -> int:
    """Raise unless ``value`` is an int >= 1 (a block size, a count)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def check_nonnegative_int(value: object, name: str) -> int:
    """Raise unless ``value`` is an int >= 0 (a number of warm-up steps)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


# --------------------------------------------------------------------------------------
# Masks and attention arguments
# --------------------------------------------------------------------------------------


def check_mask(mask: object, scores: Tensor, name: str = "mask") -> Tensor:
    """Check that ``mask`` is a boolean tensor that broadcasts to ``scores``.

    Returns ``mask`` expanded to the shape of ``scores``: a view, no copy.

    Raises
    ------
    TypeError
        If ``mask`` is not a tensor or not boolean.
    ValueError
        If ``mask`` does not broadcast to the shape of ``scores``, or lives on
        another device.
    """
    mask = check_tensor(mask, name)
    if mask.dtype != torch.bool:
        hint = (
            "for a 0/-inf additive mask use (additive == 0)"
            if mask.is_floating_point()
            else "for a 0/1 mask use .bool()"
        )
        raise TypeError(
            f"{name} must be a boolean tensor (True = may attend), got dtype "
            f"{mask.dtype}; {hint}"
        )
    try:
        shape = torch.broadcast_shapes(mask.shape, scores.shape)
    except RuntimeError:
        shape = None
    if shape != scores.shape:
        raise ValueError(
            f"{name} of shape {tuple(mask.shape)} does not broadcast to the scores' "
            f"shape {tuple(scores.shape)}"
        )
    if mask.device != scores.device:
        raise ValueError(
            f"{name} is on {mask.device} but the scores are on {scores.device}; "
            f"move it with {name}.to(scores.device)"
        )
    return mask.expand(scores.shape)


def check_qkv(q: Tensor, k: Tensor, v: Tensor, groups: int = 1) -> tuple[int, ...]:
    """Check the queries, keys and values of attention; return their batch shape.

    ``q`` is ``(..., L, D)``, ``k`` is ``(..., S, D)`` and ``v`` is
    ``(..., S, Dv)``: one floating dtype, one device, batch dimensions that
    broadcast. With ``groups > 1`` (grouped-query attention, checked by
    :func:`check_gqa_heads`) each key and value head serves ``groups`` query
    heads: the batch shape counts the query heads.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float(t, name)
        if t.dim() < 2:
            raise ValueError(
                f"{name} must have at least 2 dimensions (..., length, dim), "
                f"got shape {tuple(t.shape)}"
            )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(
            f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    if not (q.device == k.device == v.device):
        raise ValueError(
            f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}"
        )
    qs, ks, vs = q.shape, k.shape, v.shape  # read once: each read costs
    if qs[-1] != ks[-1]:
        raise ValueError(
            "q and k must have the same last dimension D, got "
            f"q {tuple(qs)} and k {tuple(ks)}"
        )
    if ks[-2] != vs[-2]:
        raise ValueError(
            "k and v must have the same length S (dimension -2), got "
            f"k {tuple(ks)} and v {tuple(vs)}"
        )
    qb, kb, vb = qs[:-2], ks[:-2], vs[:-2]
    if groups > 1:  # the heads k and v stand for (dimension -3)
        kb, vb = kb[:-1] + (kb[-1] * groups,), vb[:-1] + (vb[-1] * groups,)
    if qb == kb == vb:
        return qb  # the common case, without broadcast_shapes' cost
    try:
        return torch.broadcast_shapes(qb, kb, vb)
    except RuntimeError:
        raise ValueError(
            f"the batch dimensions of q {tuple(qs)}, k {tuple(ks)} and "
            f"v {tuple(vs)} do not broadcast"
        ) from None


def check_attention_args(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    is_causal: bool,
    scale: float | None,
) -> tuple[tuple[int, ...], float, Tensor | None]:
    """Check the arguments every attention function takes.

    Returns ``(batch, scale, keep)``: the broadcast batch shape, the scale
    (``1/sqrt(D)`` by default) and the mask expanded to ``batch + (L, S)``
    (a view, no copy), or None without a mask.
    """
    batch = check_qkv(q, k, v)
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    if mask is not None and is_causal:
        raise ValueError(
            "pass either mask or is_causal=True, not both "
            "(combine them yourself: mask & causal_mask(L, S))"
        )
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1]) if q.shape[-1] else 1.0
    else:
        scale = check_positive(scale, "scale")
    keep = None
    if mask is not None:
        # A scalar expanded to the scores' shape stands in for them, unallocated.
        L, S = q.shape[-2], k.shape[-2]
        scores = torch.empty((), device=q.device).expand(batch + (L, S))
        keep = check_mask(mask, scores)
    return batch, scale, keep


# --------------------------------------------------------------------------------------
# Rows with nothing to attend
# --------------------------------------------------------------------------------------


def zero_empty_rows(
    normalize: Callable[[Tensor], Tensor], scores: Tensor, dim: int
) -> Tensor:
    """``normalize(scores)``, with zeros for the rows whose scores are all ``-inf``.

    Such a row (a query with nothing to attend) would give ``exp(-inf - -inf)
    = nan`` in a softmax. It is replaced by zeros *before* ``normalize``, a
    finite stand-in that keeps ``nan`` out of the forward and the backward
    pass, and its output is zeroed *after*, so its weights and their gradient
    are exactly 0.
    """
    empty = torch.isneginf(scores).all(dim=dim, keepdim=True)  # (..., 1, ...)
    return normalize(scores.masked_fill(empty, 0.0)).masked_fill(empty, 0.0)


# --------------------------------------------------------------------------------------
# Optional packages
# --------------------------------------------------------------------------------------

#: The optional packages the chapters use, and the extra of softmaxbook that
#: installs each (``pip install "softmaxbook[book]"``).
OPTIONAL_PACKAGES = {"entmax": "book", "tqdm": "book", "triton": "book"}


def check_installed(packages: str | Iterable[str], needed_by: str) -> None:
    """Raise ``ImportError`` naming every missing package and the line that installs it.

    ``packages`` are import names (``"entmax"``); they are looked up, not
    imported, so the check is cheap and has no side effect.
    """
    if isinstance(packages, str):
        packages = (packages,)
    if not all(isinstance(name, str) and name for name in packages):
        raise TypeError(
            f"packages must be names of packages, e.g. ('entmax',), got {packages!r}"
        )
    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    if not missing:
        return
    extras = sorted(
        {OPTIONAL_PACKAGES[name] for name in missing if name in OPTIONAL_PACKAGES}
    )
    others = [name for name in missing if name not in OPTIONAL_PACKAGES]
    commands = [f'pip install "softmaxbook[{",".join(extras)}]"'] if extras else []
    commands += [f"pip install {' '.join(others)}"] if others else []
    message = (
        f"{needed_by} needs {' and '.join(missing)}, which "
        f"{'is' if len(missing) == 1 else 'are'} not installed; install "
        f"{'it' if len(missing) == 1 else 'them'} with: {' && '.join(commands)}"
    )
    if "triton" in missing:
        message += " (Triton is built for Linux; elsewhere, read this on the website)"
    raise ImportError(message, name=missing[0])


# --------------------------------------------------------------------------------------
# Grouped-query attention and the causal alignment
# --------------------------------------------------------------------------------------

#: The names ``is_causal`` accepts besides True and False (see
#: :data:`softmaxbook.attention.flash.CAUSAL_ALIGNMENTS`).
CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")


def check_causal(is_causal: object) -> str | None:
    """``None`` for no causal mask, else ``"top_left"`` (also for True) or
    ``"bottom_right"``."""
    if isinstance(is_causal, bool):
        return "top_left" if is_causal else None
    if isinstance(is_causal, str):
        if is_causal not in CAUSAL_ALIGNMENTS:
            raise ValueError(
                f"is_causal={is_causal!r} is unknown; expected True, False or one "
                f"of {list(CAUSAL_ALIGNMENTS)}"
            )
        return is_causal
    raise TypeError(
        f"is_causal must be a bool or one of {list(CAUSAL_ALIGNMENTS)}, "
        f"got {type(is_causal).__name__}"
    )


def check_gqa_heads(q: Tensor, k: Tensor, v: Tensor) -> int:
    """For grouped-query attention: the number G of query heads per key head.

    ``q`` is ``(..., Hq, L, D)``, ``k`` and ``v`` ``(..., Hkv, S, .)`` with
    ``Hq`` a multiple of ``Hkv`` (torch's ``enable_gqa``).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(t, name)
        if t.dim() < 3:
            raise ValueError(
                f"enable_gqa=True needs {name} with a head dimension (..., heads, "
                f"length, dim), got shape {tuple(t.shape)}"
            )
    hq, hk, hv = q.shape[-3], k.shape[-3], v.shape[-3]
    if hk != hv or hk == 0 or hq % hk:
        raise ValueError(
            "enable_gqa=True needs k and v with the same number of heads, dividing "
            f"the number of query heads; got q {tuple(q.shape)}, k "
            f"{tuple(k.shape)}, v {tuple(v.shape)}"
        )
    return hq // hk
