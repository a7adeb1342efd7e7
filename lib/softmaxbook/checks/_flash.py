"""What the FlashAttention checkers compare with, and the mistakes they recognize.

The references are float64 attention computed whole; the mistakes are the tile
loop computed in float64 the wrong way (no rescale of what was accumulated
before a tile raised the running maximum, a causal mask built from a tile's own
indices), and the logsumexp in the wrong units. Also here: the recorder of the
largest tensor a forward pass creates, and the walk over what an autograd graph
saves for its backward pass.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ._inputs import F64, INF
from ._session import Candidate

LN2 = math.log(2.0)

RESCALE_HINT = (
    "That is the tile loop without the rescale: when a tile raises a row's running "
    "maximum from m to m_new, what was accumulated before was computed with "
    "exp(s - m) and must be multiplied by alpha = exp(m - m_new): "
    "l = alpha * l + rowsum(P) and o = alpha * o + P @ V."
)
RESCALE_O_HINT = (
    "Your running sum l is rescaled but the output accumulated so far is not: when "
    "the running maximum rises from m to m_new, multiply o by exp(m - m_new) as "
    "well, o = exp(m - m_new) * o + P @ V."
)
RESCALE_L_HINT = (
    "Your output is rescaled but the running sum l is not: when the running "
    "maximum rises from m to m_new, multiply l by exp(m - m_new) as well, "
    "l = exp(m - m_new) * l + rowsum(P)."
)
_LSE = (
    "lse = m + log(l), with l the running sum of exp(s - m) and m the running maximum"
)
LSE_HINTS = {
    "base 2": "That is the logsumexp in base 2 (log2 of the sum of exp): an exp2 "
    "kernel works in base 2, but lse is the natural logarithm: multiply it by "
    "ln 2, lse = (m2 + log2(l)) * math.log(2).",
    "mixed": "Your maximum is in base-2 units (the scores times log2(e)) and the log "
    "of the sum natural: convert the maximum back, lse = m2 * math.log(2) + log(l).",
    "log2": "Your log of the sum is in base 2 and the maximum natural: take the "
    "natural logarithm, lse = m + log(l) (torch.log, not torch.log2).",
    "no max": f"That is log(l) without the maximum: l sums exp(s - m), so {_LSE}.",
    "m": f"That is the row maximum m, not the logsumexp: {_LSE}.",
    "l": f"That is the running sum l, not its logarithm: {_LSE}.",
    "unscaled": "That is the logsumexp of the unscaled scores q @ k^T: take it of "
    "the scores the softmax normalizes, q @ k^T * scale (scale = 1/sqrt(D)).",
}
CAUSAL_IGNORED_HINT = (
    "That is attention without the causal mask: query i may attend only to keys "
    "j <= i. Mask the scores above the diagonal with -inf in the tiles that cross "
    "it, and skip the tiles entirely above it."
)
CAUSAL_STRICT_HINT = (
    "Your causal mask also removes the diagonal: query i attends to keys j <= i, "
    "itself included (torch.tril keeps the diagonal; use >=, not >)."
)
CAUSAL_LOCAL_HINT = (
    "The causal mask must compare positions in the whole sequence: key k0 + j is "
    "visible to query q0 + i when k0 + j <= q0 + i. A mask built from the tile's own "
    "indices (torch.tril(torch.ones(block_q, block_k))) is right only in the tiles "
    "on the diagonal."
)
NOT_NORMALIZED_HINT = (
    "That is the output before the division by the running sum: after the last "
    "tile, return o / l."
)
NO_SCALE_HINT = (
    "That is attention without the scale: multiply the scores q @ k^T by "
    "1/sqrt(D), D the size of the last dimension of q and k."
)


# -- references --------------------------------------------------------------------


def scores64(q: Tensor, k: Tensor, causal: bool, scale: bool = True) -> Tensor:
    """The float64 scores ``q k^T / sqrt(D)`` ``(..., L, S)``, ``-inf`` above the
    diagonal when ``causal`` (torch's alignment: query i sees keys j <= i)."""
    s = q.to(F64) @ k.to(F64).transpose(-2, -1)
    if scale:
        s = s / math.sqrt(q.shape[-1])
    if causal:
        L, S = s.shape[-2:]
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), -INF)
    return s


def masked(s: Tensor, mask: Tensor | None) -> Tensor:
    return s if mask is None else s.masked_fill(~mask, -INF)


def attention64(s: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """``(out, lse)`` of the scores ``s`` (``-inf`` = masked): a row with nothing
    to attend gives zeros and ``-inf``."""
    lse = torch.logsumexp(s, dim=-1)
    empty = torch.isneginf(lse)[..., None]
    p = torch.exp(s - lse.masked_fill(empty[..., 0], 0.0)[..., None])
    return (p.masked_fill(empty, 0.0) @ v.to(F64)), lse


def tiled64(
    s: Tensor,
    v: Tensor,
    block_k: int,
    *,
    rescale_o: bool = True,
    rescale_l: bool = True,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The tile loop in float64 over key blocks of ``block_k``: ``(out, lse, o, l)``
    with ``o`` the output before the division; without a rescale, a mistake."""
    m = s.new_full(s.shape[:-1] + (1,), -INF)
    ell = torch.zeros_like(m)
    o = s.new_zeros(s.shape[:-1] + (v.shape[-1],))
    for k0 in range(0, s.shape[-1], block_k):
        t = s[..., k0 : k0 + block_k]
        m_new = torch.maximum(m, t.amax(dim=-1, keepdim=True))
        shift = m_new.masked_fill(torch.isneginf(m_new), 0.0)
        alpha = torch.exp(m - shift)
        p = torch.exp(t - shift)
        ell = (alpha * ell if rescale_l else ell) + p.sum(dim=-1, keepdim=True)
        o = (alpha * o if rescale_o else o) + p @ v[..., k0 : k0 + block_k, :].to(F64)
        m = m_new
    out = o / torch.where(ell > 0, ell, torch.ones_like(ell))
    lse = (m + torch.log(ell)).squeeze(-1)
    return out, lse, o, ell.squeeze(-1)


def local_causal(L: int, S: int, block_q: int, block_k: int) -> Tensor:
    """The causal mask built from each tile's own indices, in the tiles a loop that
    skips those above the diagonal visits: the mistake of CAUSAL_LOCAL_HINT."""
    i = torch.arange(L)[:, None]
    j = torch.arange(S)[None, :]
    q0, k0 = (i // block_q) * block_q, (j // block_k) * block_k
    visited = k0 <= torch.clamp(q0 + block_q - 1, max=L - 1)
    return visited & ((i - q0) >= (j - k0))


# -- the mistakes ------------------------------------------------------------------


def _variants(
    q: Tensor,
    k: Tensor,
    causal: bool,
    mask: Tensor | None,
    blocks: list[tuple[int, int]],
) -> list[tuple[str, Tensor, str]]:
    """``(key, scores, hint)``: the scores that a mistake of the scale or of the
    causal mask normalizes instead of the right ones."""
    found = [("no scale", masked(scores64(q, k, causal, False), mask), NO_SCALE_HINT)]
    if causal:
        plain = masked(scores64(q, k, False), mask)
        L, S = plain.shape[-2:]
        strict = plain.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(-1), -INF)
        found += [
            ("causal ignored", plain, CAUSAL_IGNORED_HINT),
            ("causal strict", strict, CAUSAL_STRICT_HINT),
        ]
        for block_q, block_k in blocks:
            if block_q > 0:
                local = plain.masked_fill(~local_causal(L, S, block_q, block_k), -INF)
                found.append(("causal local", local, CAUSAL_LOCAL_HINT))
    return found


def output_candidates(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    causal: bool,
    mask: Tensor | None,
    blocks: list[tuple[int, int]],
) -> list[Candidate]:
    """What the usual mistakes of a forward pass return for the output."""
    s = masked(scores64(q, k, causal), mask)
    found: list[Candidate] = []
    for _, block_k in blocks:
        for key, flags, hint in (
            ("no rescale", (False, False), RESCALE_HINT),
            ("o not rescaled", (False, True), RESCALE_O_HINT),
            ("l not rescaled", (True, False), RESCALE_L_HINT),
        ):
            if 0 < block_k < s.shape[-1]:  # one tile has nothing to rescale
                out = tiled64(s, v, block_k, rescale_o=flags[0], rescale_l=flags[1])
                found.append((key, out[0], hint))
        if block_k > 0:
            o = tiled64(s, v, block_k)[2]
            found.append(("not normalized", o, NOT_NORMALIZED_HINT))
    for key, wrong, hint in _variants(q, k, causal, mask, blocks):
        found.append((key, attention64(wrong, v)[0], hint))
    return found


def lse_candidates(
    q: Tensor,
    k: Tensor,
    causal: bool,
    mask: Tensor | None,
    blocks: list[tuple[int, int]],
) -> list[Candidate]:
    """What the usual mistakes return for the logsumexp."""
    s = masked(scores64(q, k, causal), mask)
    lse = torch.logsumexp(s, dim=-1)
    m = s.amax(dim=-1)
    log_l = lse - m  # log of l = sum exp(s - m)
    found: list[Candidate] = [
        ("base 2", lse / LN2, LSE_HINTS["base 2"]),
        ("mixed", m / LN2 + log_l, LSE_HINTS["mixed"]),
        ("mixed", m + log_l / LN2, LSE_HINTS["log2"]),
        ("no max", log_l, LSE_HINTS["no max"]),
        ("m", m, LSE_HINTS["m"]),
        ("l", torch.exp(log_l), LSE_HINTS["l"]),
    ]
    for key, wrong, hint in _variants(q, k, causal, mask, blocks):
        hint = LSE_HINTS["unscaled"] if key == "no scale" else hint
        found.append((key, torch.logsumexp(wrong, dim=-1), hint))
    for _, block_k in blocks:
        if 0 < block_k < s.shape[-1]:
            zeros = s.new_zeros(*s.shape[:-2], s.shape[-1], 1)  # no values needed
            wrong = tiled64(s, zeros, block_k, rescale_o=False, rescale_l=False)[1]
            found.append(("no rescale", wrong, RESCALE_HINT))
    return found


# -- the signature of a student's function -----------------------------------------


def parameters(fn: Callable[..., Any]) -> set[str]:
    """The names of ``fn``'s parameters (none when it has no signature)."""
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def block_style(fn: Callable[..., Any]) -> str:
    """How ``fn`` takes its tile sizes: ``"pair"`` (``block_q``, ``block_k``),
    ``"one"`` (``block_size``) or ``""`` (it does not)."""
    names = parameters(fn)
    if {"block_q", "block_k"} <= names:
        return "pair"
    return "one" if "block_size" in names else ""


def block_kwargs(style: str, block_q: int, block_k: int) -> list[tuple[str, int]]:
    if style == "pair":
        return [("block_q", block_q), ("block_k", block_k)]
    return [("block_size", block_q)] if style == "one" else []


def block_words(style: str, block_q: int, block_k: int) -> str:
    if style == "pair":
        return f", block_q = {block_q} and block_k = {block_k}"
    return f", block_size = {block_q}" if style == "one" else ""


# -- memory: the largest tensor a forward pass creates -----------------------------


class Largest(TorchDispatchMode):
    """Records the floating-point tensor with the most entries that any operation
    returns while active (its shape, and the operation)."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0
        self.shape: tuple[int, ...] = ()
        self.op = ""

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if (
                isinstance(t, Tensor)
                and t.is_floating_point()
                and t.numel() > self.numel
            ):
                self.numel, self.shape = t.numel(), tuple(t.shape)
                self.op = str(getattr(func, "__name__", func)).split(".")[0]
        return out


def recording(fn: Callable[..., Any], mode: Largest) -> Callable[..., Any]:
    """``fn``, run with ``mode`` recording what it creates."""

    def recorded(*args: Any, **kwargs: Any) -> Any:
        with mode:
            return fn(*args, **kwargs)

    return recorded


# -- what an autograd graph saves for its backward pass ----------------------------


def graph_nodes(root: Any) -> Iterator[Any]:
    """The nodes of the autograd graph below ``root`` (``out.grad_fn``), each once."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        stack += [n for n, _ in getattr(node, "next_functions", ())]


def is_function_node(node: Any) -> bool:
    """Whether ``node`` is the node of a ``torch.autograd.Function``."""
    return isinstance(node, torch.autograd.function.BackwardCFunction)


def saved_by(node: Any) -> list[Tensor]:
    """The tensors ``node`` keeps for the backward pass: saved with
    ``ctx.save_for_backward``, set as attributes of ``ctx``, or saved by one of
    torch's own operations (its ``_saved_*`` attributes)."""
    found: list[Tensor] = []
    if is_function_node(node):
        try:
            found += [t for t in node.saved_tensors if isinstance(t, Tensor)]
        except RuntimeError:  # freed by a backward pass already run
            pass
        for value in getattr(node, "__dict__", {}).values():
            values = value if isinstance(value, (list, tuple)) else [value]
            found += [t for t in values if isinstance(t, Tensor)]
        return found
    for name in dir(node):
        if name.startswith("_saved_"):
            try:
                value = getattr(node, name)
            except RuntimeError:
                continue
            if isinstance(value, Tensor):
                found.append(value)
    return found
