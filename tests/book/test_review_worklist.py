"""tools/review_worklist.py: every checkable sentence lands on the reviewer's list.

The held-back errors of the last review rounds were each one sentence with a number, a
paper, another project or an "only" in it. Each is on the list, with its reason, and a
sentence that states nothing checkable is not (the list stays short enough to finish).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "review_worklist", ROOT / "tools" / "review_worklist.py"
)
assert _spec is not None and _spec.loader is not None
worklist = importlib.util.module_from_spec(_spec)
sys.modules["review_worklist"] = worklist  # dataclasses look their module up
_spec.loader.exec_module(worklist)

# Sentences of the kind an outside review found wrong, with the reasons each must carry.
HELD_BACK = [
    ("The Triton backward does one more matrix product per tile.", {"source"}),
    (
        "One logsumexp per row is what FlashAttention {cite}`dao2022flashattention` "
        "keeps.",
        {"source"},
    ),
    ("In ring attention a process holds two K/V blocks at a time.", {"number"}),
    ("The unscaled gradient is larger up to d_k = 64 in all 10 seeds.", {"number"}),
    ("The bound holds in every dtype.", {"absolute"}),
    ("Its largest number is 448, about 2^8.8.", {"number"}),
    ("sb.flash_attention agrees with torch's SDPA on masked rows.", {"comparison"}),
]


@pytest.mark.parametrize(("sentence", "reasons"), HELD_BACK)
def test_held_back_errors_are_on_the_list(sentence, reasons):
    assert reasons <= set(worklist.reasons_for(sentence))


@pytest.mark.parametrize(
    "sentence",
    [
        "The softmax turns scores into weights.",
        "Read the previous section first.",
        "This is the idea behind the rest of the page.",
    ],
)
def test_sentences_without_a_checkable_statement_are_left_off(sentence):
    assert worklist.reasons_for(sentence) == ()


def test_a_page_yields_its_sentences_and_skips_code_and_math(tmp_path):
    page = tmp_path / "page.ipynb"
    cells = [
        {
            "cell_type": "markdown",
            "metadata": {},
            "source": "# Title\n\nIt always sums to 1. Nothing here.\n\n"
            "$$\\sum_i p_i = 1$$\n\n```python\nx = 3\n```\n",
        },
        {"cell_type": "code", "metadata": {}, "source": "assert 1 == 1", "outputs": []},
    ]
    page.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4}))
    rows = worklist.worklist(page)
    assert [r.sentence for r in rows] == ["# Title It always sums to 1."]
    assert rows[0].reasons == ("number", "absolute")
    assert rows[0].where == "cell 0"


def test_a_module_yields_its_public_docstrings_without_doctests(tmp_path):
    module = tmp_path / "mod.py"
    module.write_text(
        '"""Module."""\n\n'
        "def f(x):\n"
        '    """Never returns NaN.\n\n'
        "    Examples\n    --------\n    >>> f(0.5)\n    0.25\n"
        '    """\n\n'
        "def _private(x):\n"
        '    """Only here: 3 rows."""\n'
    )
    rows = worklist.worklist(module)
    assert [(r.where, r.sentence) for r in rows] == [("f", "Never returns NaN.")]


def test_the_command_writes_one_checklist_per_file(tmp_path):
    page = ROOT / "chapters" / "01_definition.ipynb"
    assert worklist.main([str(page), "--out", str(tmp_path)]) == 0
    text = (tmp_path / "01_definition.md").read_text()
    assert "| # | where | why | sentence | verdict |" in text
    assert text.count("\n| ") > 20


def test_a_markdown_page_is_read_as_prose_and_other_files_are_refused(tmp_path):
    page = tmp_path / "glossary.md"
    page.write_text("# Glossary\n\nQK-norm bounds every score by 8.\n\nA term.\n")
    rows = worklist.worklist(page)
    assert [(r.where, r.sentence) for r in rows] == [
        ("paragraph 2", "QK-norm bounds every score by 8.")
    ]
    with pytest.raises(ValueError, match=r"expected a \.ipynb, \.md or \.py file"):
        worklist.worklist(tmp_path / "data.json")
