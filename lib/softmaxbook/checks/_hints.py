"""The hints the checkers give: what a student can change to fix a problem.

Those that several checkers share live here (an exception's hint, by a
fragment of its message; a dtype changed; no maximum subtracted; a mask used
the wrong way round); those of one checker stay in its module.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ._inputs import close
from ._report import fmt, fmt_number

# Hints for exceptions, by a fragment of the message: what a student can change.
ERROR_HINTS = [
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


def error_hint(error: Exception, hints: Sequence[tuple[str, str]] = ERROR_HINTS) -> str:
    if isinstance(error, NotImplementedError):
        return "Implement the function: the stub still raises NotImplementedError."
    text = str(error)
    for fragment, hint in hints:
        if fragment in text:
            return hint
    return ""


NUMPY_DTYPE_HINT = (
    "NumPy promotes float32 and float16 to float64 when they meet a float64 array "
    "or NumPy scalar (np.sqrt(d) is one): use math.sqrt for numbers, and convert the "
    "result back with .astype(x.dtype)."
)
DTYPE_HINT = (
    "Do not convert with .float() or .double(), and create new tensors with "
    "the input's dtype (torch.zeros_like(x), x.new_tensor(...)); to compute in "
    "a wider type, convert the result back with .to(x.dtype)."
)

# The softmax's own: a stable softmax subtracts the row maximum.
MAX_HINT = (
    "Subtract the row maximum before exp, m = x.max(dim=-1, keepdim=True).values: "
    "then every exponent is <= 0, nothing overflows, and the largest term is "
    "exp(0) = 1, so the sum is never 0."
)

# Masks: True = may attend; a row with nothing to attend gives zeros.
EMPTY_NAN_HINT = (
    "A row whose mask is all False has every score at -inf, so its maximum is -inf and "
    "-inf - (-inf) = nan. Such a row has nothing to attend to: give it zeros, e.g. by "
    "replacing its scores with 0 before the softmax and its weights with 0 after."
)
POLARITY_HINT = (
    "That is the softmax over the entries where the mask is False: the mask "
    "means True = may attend (keep). Use scores.masked_fill(~mask, "
    "float('-inf'))."
)
IGNORED_HINT = (
    "That is the softmax of all the scores, as if there were no mask: masked "
    "entries (mask False) must get weight exactly 0."
)


def rows_sum_hint(got: Tensor, target: float = 1.0, what: str = "rows") -> str:
    """What is wrong with the row sums of ``got``, or "" if they are ``target``."""
    sums = got.sum(dim=-1)
    if bool(close(sums, torch.full_like(sums, target), 1e-6, 1e-6).all()):
        return ""
    if target == 1 and got.dim() > 1 and abs(float(got.sum()) - 1) < 1e-6:
        return (
            "Your whole result sums to 1, not each row: divide each row by its own "
            "sum, e.sum(dim=-1, keepdim=True)."
        )
    return (
        f"The {what} of your result sum to {fmt(sums.reshape(-1), 4)} instead of "
        f"{fmt_number(target)}."
    )


def wrong_shape_hint(got: tuple, want: tuple) -> str:
    """What a result of shape ``got`` instead of ``want`` suggests, or ""."""
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
