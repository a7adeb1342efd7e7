"""No stored output prints a difference or an error at float64 rounding level.

The website shows the outputs stored in the notebooks, and strict nbval compares
them with a fresh run on whatever CPU runs the tests. A difference that is exactly
``0.0e+00`` on one CPU is ``2.2e-16`` on another (another SIMD width, another order
of a sum), so a page may print such a difference only as a bound (``< 1e-12``) or a
verdict (``True``, "agree"), never as its digits. This test reads every stored
output of every chapter notebook (``chapters/**/*.ipynb``): stream text, the
``text/plain`` and ``text/markdown`` of results and displays, and every glued value.

The rule, line by line (``rounding_noise``), flags a number when it is not printed as
a bound, i.e. no ``<``, ``<=``, ``≤``, "within", "below", "under", "at most", "less
than" or "tolerance" stands in the 30 characters before it on its line, and

1. it is an exact zero in scientific notation (``0e+00``, ``0.0e+00``, ``0.00E-00``)
   anywhere: a computed zero that the writer chose to print with an exponent is a
   difference whose digits are rounding noise (a p-value or a total variation that
   underflows to zero reads the same way; print ``< 1e-12``); or
2. it is a negative zero (``-0.0``, ``-0.00``): its sign is rounding noise; or
3. the line is a *difference line* and the number is an exact zero written as a
   Python or torch float (``0.0``, ``0.``) or a nonzero number with
   ``1e-30 <= |x| < 1e-13``. A difference line names a comparison: "diff",
   "difference", "differ", "error"/"err", "deviation", "residual", "discrepancy",
   "mismatch", "agree", "vs", "versus", "against", "total variation", or an
   absolute difference ``|a - b|``; for a glued value, the glue's name counts too
   (``max_abs_err``); or
4. the output is one bare scalar (a result cell showing ``2.2e-16``,
   ``tensor(0.)``, ``np.float64(1e-17)``) that is a float zero or lies in the band
   of rule 3: a bare scalar at that size is a check's difference.

Why the band ``[1e-30, 1e-13)``: float64 rounding noise in a difference of two
quantities of size ``q`` is about ``q * 1e-16``; the book compares quantities from
about ``1e-14`` up, so its noise lies in the band. A number below ``1e-30`` is not
noise but a value of its own that every machine computes the same way: the
``1.4e-87`` that float32's softmax loses by underflow (chapter 2's absolute error),
a subnormal in a table of dtypes. Numbers that are not differences (probabilities,
a Jacobian's norm of ``5e-21``, float64's epsilon ``2.22e-16`` in a dtype table) do
not stand on a difference line and are not flagged. A zero written with two or more
decimals (``0.00``) states its precision and is allowed; a difference rounded to
``0.0`` should say ``< 0.05``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted(
    p
    for p in (ROOT / "chapters").rglob("*.ipynb")
    if ".ipynb_checkpoints" not in p.parts
)
GLUE_MIME = "application/papermill.record/text/plain"
TEXT_MIMES = ("text/plain", "text/markdown", GLUE_MIME)

# A number as printed: an optional sign, digits with or without a point, an exponent.
NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?(?![\w.])")
BOUND = re.compile(
    r"<|≤|\b(within|below|under|at most|less than|tolerance)\b", re.IGNORECASE
)
DIFFERENCE = re.compile(
    r"diff|\berr(or)?s?\b|deviation|residual|discrepanc|mismatch|\bagree"
    r"|\bvs\b|\bversus\b|\bagainst\b|total variation|\|[^|\n]*\s[-−]\s[^|\n]*\|",
    re.IGNORECASE,
)
# A bare scalar: a number, or one wrapped as tensor(...), np.float64(...), array(...).
BARE_SCALAR = re.compile(
    r"\s*(?:(?:tensor|np\.float\d+|np\.float_|array|float)\()?\s*"
    r"(?P<number>[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)"
    r"(?:,\s*dtype=[\w.]+)?(?:,\s*requires_grad=True)?\)?\s*"
)
LOW, HIGH = 1e-30, 1e-13


def _is_float_zero(text: str) -> bool:
    return float(text) == 0 and bool(re.search(r"[.eE]", text))


def _scientific(text: str) -> bool:
    return "e" in text.lower()


def _in_band(value: float) -> bool:
    return LOW <= abs(value) < HIGH


def rounding_noise(text: str, name: str = "") -> list[str]:
    """The numbers in ``text`` that print a difference at float64 rounding level.

    ``name`` is a glued value's name (``max_abs_err``), read as part of every line.
    Returns the offending numbers as printed, with their line; empty if none.
    """
    found = []
    name_is_difference = bool(name) and bool(DIFFERENCE.search(name.replace("_", " ")))
    bare = BARE_SCALAR.fullmatch(text) if not name else None
    if bare:
        number = bare.group("number")
        value = float(number)
        if _is_float_zero(number) or _in_band(value):
            return [f"{number!r} in {text.strip()!r}"]
    for line in text.splitlines():
        difference_line = name_is_difference or bool(DIFFERENCE.search(line))
        for match in NUMBER.finditer(line):
            number = match.group()
            if BOUND.search(line[max(0, match.start() - 30) : match.start()]):
                continue
            value = float(number)
            zero = _is_float_zero(number)
            flagged = (
                (zero and _scientific(number))
                or (zero and number.startswith("-"))
                or (
                    difference_line
                    and (
                        (zero and re.fullmatch(r"[-+]?0\.0?(e.*)?", number))
                        or _in_band(value)
                    )
                )
            )
            if flagged:
                found.append(f"{number!r} in {line.strip()!r}")
    return found


def stored_texts(notebook: dict) -> Iterator[tuple[int, str, str]]:
    """Every stored output text: (cell index, glue name or "", text)."""
    for index, cell in enumerate(notebook["cells"]):
        for output in cell.get("outputs", []):
            if "text" in output:
                yield index, "", "".join(output["text"])
            data = output.get("data", {})
            for mime in TEXT_MIMES:
                if mime in data:
                    value = data[mime]
                    text = "".join(value) if isinstance(value, list) else str(value)
                    name = ""
                    if mime == GLUE_MIME:
                        scrapbook = output.get("metadata", {}).get("scrapbook", {})
                        name = scrapbook.get("name", "") or "glued"
                    yield index, name, text


def offenders(notebook: dict) -> list[str]:
    return [
        f"cell {index}{f' (glue {name})' if name else ''}: {hit}"
        for index, name, text in stored_texts(notebook)
        for hit in rounding_noise(text, name)
    ]


@pytest.mark.parametrize(
    "notebook", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT / "chapters"))
)
def test_no_stored_output_prints_rounding_noise(notebook):
    found = offenders(json.loads(notebook.read_text()))
    assert not found, (
        f"{notebook.relative_to(ROOT)} prints differences at float64 rounding level "
        "(print a bound such as '< 1e-12' or a verdict):\n" + "\n".join(found)
    )


# ---------------------------------------------------------------- the rule itself


@pytest.mark.parametrize(
    "text",
    [
        # chapter 7's speculative-decoding page before issue 27, and what AMD printed
        "largest difference, tree mask vs one branch at a time: 0.0e+00",
        "largest difference, tree mask vs one branch at a time: 2.2e-16",
        "GQA against repeated heads, max |diff|: 0e+00",
        "total variation to the target: matched 4e-18, target settings left out 0.165,",
        "simulated, mixed up: p-value vs the formula 0.156, vs the target 0.0e+00",
        "max |library - torch|:        0.0",
        "right convention, max |difference|: 0.0",
        "float64 error 1.1e-16",
        "sum of the weights - 1: -0.00",
        "tensor(2.2204e-16, dtype=torch.float64)",
        "tensor(0.)",
        "np.float64(5.551115123125783e-17)",
        "an exact zero anywhere printed as 0.00e+00",
    ],
)
def test_the_rule_flags_rounding_noise(text):
    assert rounding_noise(text), text


@pytest.mark.parametrize(
    "text",
    [
        "largest difference, tree mask vs one branch at a time: < 1e-12",
        "tree mask = one branch at a time (max |diff| < 1e-12): True",
        "float64   = torch.softmax, within 8 eps (1.8e-15) of the float64 reference",
        "max |difference| <= 2.2e-16",
        "max |difference| ≤ 2.2e-16",
        "float64   64      53  1.8e+308  2.23e-308   4.94e-324  2.22e-16",
        "float64 softmax: [1, 1.3839e-87]",
        "alpha= 31.62  top weight 1.000000  ||J||_2 5.02e-21  gradient norm 7.10e-22",
        "max |packed - alone|, causal mask only: [0.00, 1.43, 1.46]",
        "FA4's polynomial, max relative error on [0, 1): 8.8e-05",
        "the error of float16: 0.00049",
        "tensor(0.5000)",
        "differences in 0 of 100 rows",
        "exp(-800) in float64: 0.0",
    ],
)
def test_the_rule_passes_bounds_verdicts_and_small_values_that_are_not_noise(text):
    assert not rounding_noise(text), rounding_noise(text)


def test_the_rule_reads_glued_values_by_their_name():
    assert rounding_noise("2.2e-16", "max_abs_err")
    assert rounding_noise("0.0", "largest_diff")
    assert not rounding_noise("1.384e-87", "underflow_abs_err")  # a value, not noise
    assert not rounding_noise("2.22e-16", "eps64")  # float64's epsilon, not an error
    assert not rounding_noise("1.401e-45", "fp32_sub")


def test_the_old_speculative_decoding_output_fails_the_page_test():
    cell = {
        "cell_type": "code",
        "outputs": [
            {
                "output_type": "stream",
                "name": "stdout",
                "text": [
                    "largest difference, tree mask vs one branch at a time: 0.0e+00\n"
                ],
            }
        ],
    }
    assert offenders({"cells": [cell]}) == [
        "cell 0: '0.0e+00' in 'largest difference, tree mask vs one branch at a "
        "time: 0.0e+00'"
    ]
