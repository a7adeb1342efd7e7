"""tools/student.py: student versions read as plain Markdown, hold no answer, and run.

On a synthetic notebook with every kind of solution and answer the convention allows
(each carrying the word SECRET), and on every page of the book.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
# Every page: the chapters' core pages and their deep-dive pages.
CHAPTERS = sorted(
    p
    for p in (ROOT / "chapters").rglob("*.ipynb")
    if ".ipynb_checkpoints" not in p.parts
)

_spec = importlib.util.spec_from_file_location("student", ROOT / "tools" / "student.py")
student = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(student)
colab_cell = student.colab_cell


def _markdown(text, tags=()):
    cell = nbformat.v4.new_markdown_cell(text)
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def _code(text, tags=(), outputs=(), count=1, **metadata):
    cell = nbformat.v4.new_code_cell(text, execution_count=count)
    cell.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text=o) for o in outputs
    ]
    if tags:
        cell.metadata["tags"] = list(tags)
    cell.metadata.update(metadata)
    return cell


def _glue_output(name, value):
    """What myst-nb's glue(name, value, display=False) stores."""
    prefix = "application/papermill.record/"
    return nbformat.v4.new_output(
        "display_data",
        data={prefix + "text/plain": repr(value)},
        metadata={"scrapbook": {"name": name, "mime_prefix": prefix}},
    )


SOLUTION_CELL = '''import torch


@torch.no_grad()
def my_softmax(
    x,
):
    """Softmax along the last dimension."""
    e = torch.exp(x - x.max(dim=-1, keepdim=True).values)  # SECRET
    return e / e.sum(dim=-1, keepdim=True)


def helper(x): return x + 1  # SECRET


answer = my_softmax(torch.zeros(3))  # SECRET
'''


def synthetic_notebook():
    """Every form of solution and answer, each with the word SECRET, and MyST markup."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    glue_cell = _code("import bookkit as bk\nbk.glue('ratio', 0.01234)\nratio = 1")
    glue_cell.outputs = [_glue_output("ratio", 0.01234), _glue_output("n", 26800)]
    nb.cells = [
        _markdown("# A chapter\n\nWhat you will learn."),
        _code(
            "import torch\nimport softmaxbook as sb\nprint('setup')",
            outputs=["setup\n"],
        ),
        glue_cell,
        _markdown(
            "(sec-a)=\n## Glued\n\nA ratio of {glue:text}`ratio:.1%` over "
            "{glue:text}`n:,.0f` rows ({glue}`n`), see {term}`the softmax <Softmax>` "
            "and {cite}`vaswani2017attention`; `{term}` in code stays.\n\n"
            ":::{note}\nA *note*.\n:::\n\n"
            "```python\nprint('{glue:text}`kept`')\n```"
        ),
        # a hidden check of the page's claims, before the exercises: it stays
        _code(
            "# Claim: the ratio is one.\nassert ratio == 1",
            tags=["remove-cell"],
            jupyter={"source_hidden": True},
        ),
        # a hidden cell marked as an answer, anywhere on the page: it goes
        _code(
            "# SECRET answer of ex-b, checked early\nassert True",
            tags=["remove-cell"],
            softmaxbook={"answers": "ex-b"},
        ),
        _markdown(
            "## Exercises\n\n:::{exercise}\n:label: ex-a\nDo A.\n:::\n\n"
            "::::{solution} ex-a\n:class: dropdown\nSECRET answer A.\n\n"
            "```python\nprint('SECRET')\n```\n\n:::{note}\nSECRET nested note\n:::\n"
            "::::\n\n"
            ":::{exercise}\n:label: ex-b\nDo B.\n:::\n\n"
            "```{solution} ex-b\nSECRET answer B.\n```\n\n"
            ":::{solution} ex-c\nSECRET answer C.\n:::\nText after the solutions."
        ),
        _markdown(":::{exercise}\n:label: ex-d\nImplement `my_softmax`.\n:::"),
        _code(
            SOLUTION_CELL, tags=["solution", "hide-input"], outputs=["SECRET output\n"]
        ),
        _code(
            "report = sb.checks.check_softmax(my_softmax)\nprint(report)",
            tags=["exercise"],
            outputs=["check_softmax(my_softmax): all checks passed"],
        ),
        _code(
            "custom stub SECRET",
            tags=["solution"],
            softmaxbook={"stub": "def f(x):\n    ...  # your turn\n"},
        ),
        _markdown("SECRET in a whole markdown cell", tags=["solution"]),
        _markdown(
            "Before the gate.\n\n```{solution-start} ex-d\n```\nSECRET gated text"
        ),
        _code("print('SECRET gated code')", outputs=["SECRET\n"]),
        _markdown("SECRET gated markdown"),
        _markdown("SECRET last gated line\n```{solution-end}\n```\nAfter the gate."),
        # hidden checks of an exercise's answer after the exercises (the ex-stability-5
        # leak): they go
        _code(
            "# Claim: the SECRET answer of exercise a is 2.\nassert 1 + 1 == 2",
            tags=["remove-cell"],
        ),
        _code("print(2 + 2)", outputs=["4\n"]),
    ]
    return nb


@pytest.fixture
def converted():
    nb = json.loads(nbformat.writes(synthetic_notebook()))
    out, counts = student.student_version(nb)
    return nb, out, counts


def test_no_solution_remains(converted):
    _, out, counts = converted
    text = json.dumps(out)
    assert "SECRET" not in text
    assert not re.search(r"\{solution", text)
    assert counts["solutions"] == 5 and counts["answers"] == 2
    assert counts["stubs"] == 2 and counts["cleared"] == 1


def test_everything_else_stays(converted):
    original, out, _ = converted
    sources = ["".join(c["source"]) for c in out["cells"]]
    assert sources[0] == "# A chapter\n\nWhat you will learn."
    assert out["cells"][1] == original["cells"][1]  # code and outputs untouched
    # a hidden check of the page's own claim stays
    assert any(s.startswith("# Claim: the ratio is one.") for s in sources)
    exercises = next(s for s in sources if "Do A." in s)
    assert "**Exercise** (ex-a)\n\nDo A." in exercises
    assert "**Exercise** (ex-b)\n\nDo B." in exercises
    assert "Text after the solutions." in exercises
    assert "Before the gate." in sources and "After the gate." in sources
    assert out["cells"][-1] == original["cells"][-1]
    assert out["metadata"]["softmaxbook"] == {"student_version": True}
    nbformat.validate(nbformat.from_dict(out))


def test_myst_becomes_plain_markdown(converted):
    _, out, _ = converted
    glued = next(
        "".join(c["source"]) for c in out["cells"] if "## Glued" in "".join(c["source"])
    )
    assert glued.startswith("## Glued\n\nA ratio of 1.2% over 26,800 rows (26800), ")
    # outside the book there is no bibliography: the key stands for the citation
    assert (
        "see the softmax and (vaswani2017attention); `{term}` in code stays." in glued
    )
    assert "> **Note**\n>\n> A *note*." in glued
    assert "print('{glue:text}`kept`')" in glued  # code blocks are left alone
    assert "(sec-a)=" not in glued


def test_solution_cell_becomes_a_stub(converted):
    _, out, _ = converted
    answer = [c for c in out["cells"] if "answer" in c["metadata"].get("tags", [])]
    assert len(answer) == 2
    source = "".join(answer[0]["source"])
    assert source.startswith(
        "import torch\n\n\n@torch.no_grad()\ndef my_softmax(\n    x,\n):\n"
        '    """Softmax along the last dimension."""\n'
    )
    assert "raise NotImplementedError('write my_softmax')" in source
    assert "def helper(x):\n" in source and "answer =" not in source
    assert answer[0]["outputs"] == [] and answer[0]["execution_count"] is None
    assert answer[0]["metadata"]["tags"] == ["answer"]  # no longer hidden
    namespace = {}
    exec(source, namespace)  # the stub is valid Python and raises when called
    with pytest.raises(NotImplementedError, match="write my_softmax"):
        namespace["my_softmax"](None)
    assert "".join(answer[1]["source"]) == "def f(x):\n    ...  # your turn\n"
    assert "softmaxbook" not in answer[1]["metadata"]


FLASH_SOLUTION = '''import math

import torch

BLOCK = 16
SCALE: float = 1.0
helper_table = [1, 2, 3]  # SECRET: not a constant, part of the answer


def flash_forward(q, k, v, block_q=BLOCK, block_k=BLOCK):
    """(out, lse) of attention, tile by tile."""
    return q * SCALE, q.sum(-1)  # SECRET


class FlashAttention(torch.autograd.Function):
    """Saves q, k, v, out and lse."""

    SAVED = ("q", "k", "v", "out", "lse")

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        out, lse = flash_forward(q, k, v)  # SECRET
        return out

    @staticmethod
    def backward(ctx, grad_out): return grad_out, None, None, None  # SECRET
'''


def test_stubs_keep_classes_and_module_constants():
    """The issue's `NameError: BLOCK`: a default argument names a module constant."""
    source = student.stub(FLASH_SOLUTION)
    assert "SECRET" not in source
    assert "BLOCK = 16\nSCALE: float = 1.0\n" in source
    assert 'SAVED = ("q", "k", "v", "out", "lse")' in source
    namespace = {}
    exec(source, namespace)  # no NameError: BLOCK
    import torch

    cls = namespace["FlashAttention"]
    assert issubclass(cls, torch.autograd.Function)
    assert cls.__doc__ == "Saves q, k, v, out and lse."
    with pytest.raises(NotImplementedError, match="write flash_forward"):
        namespace["flash_forward"](torch.ones(1), None, None)
    with pytest.raises(NotImplementedError, match="write forward"):
        cls.apply(torch.ones(2), torch.ones(2), torch.ones(2))
    with pytest.raises(NotImplementedError, match="write backward"):
        cls.backward(None, None)


def test_exercise_outputs_are_cleared(converted):
    _, out, _ = converted
    exercise = [c for c in out["cells"] if "exercise" in c["metadata"].get("tags", [])]
    assert len(exercise) == 1
    assert exercise[0]["outputs"] == [] and exercise[0]["execution_count"] is None
    assert "sb.checks.check_softmax(my_softmax)" in "".join(exercise[0]["source"])


def test_the_input_notebook_is_not_modified():
    nb = json.loads(nbformat.writes(synthetic_notebook()))
    before = copy.deepcopy(nb)
    student.student_version(nb)
    assert nb == before


def test_removing_an_answer_that_a_later_cell_needs_is_an_error():
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        _markdown(":::{exercise}\n:label: ex-a\nDo A.\n:::"),
        _code("helper = 2  # the answer of exercise a", tags=["remove-cell"]),
        _code("print(helper)"),
    ]
    with pytest.raises(ValueError, match=r"uses \['helper'\].*defined only in a cell"):
        student.student_version(json.loads(nbformat.writes(nb)))


@pytest.mark.parametrize(
    "text",
    [
        "::::{solution} x\nunclosed SECRET",
        "````{solution} x\n```python\nSECRET\n```\n````",
        "  :::{solution}\n  SECRET\n  :::",
    ],
)
def test_odd_fences(text):
    out, removed, gated = student.strip_solutions("before\n" + text + "\nafter")
    assert "SECRET" not in out and removed == 1 and not gated
    assert out.startswith("before")


def test_citations_read_as_author_and_year():
    bib = student.load_book(ROOT).bib
    assert student.cite_text("vaswani2017attention", bib) == (
        "[Vaswani et al., 2017](https://arxiv.org/abs/1706.03762)"
    )
    assert student.cite_text("vaswani2017attention", bib, textual=True) == (
        "Vaswani et al. ([2017](https://arxiv.org/abs/1706.03762))"
    )
    two = next(k for k, e in bib.items() if e.get("author", "").count(" and ") == 1)
    assert " and " in student.cite_text(two, bib)
    assert student._surnames(r"R{\'e}, Christopher and Kaiser, {\L}ukasz") == [
        "Ré",
        "Kaiser",
    ]


# ------------------------------------------------------------------ every page


@pytest.fixture(scope="module")
def book(tmp_path_factory):
    """Every page converted once: (original, student version, counts) by page."""
    out_dir = tmp_path_factory.mktemp("student")
    pages = {}
    for chapter in CHAPTERS:
        target, counts = student.write_student_notebook(chapter, out_dir)
        pages[chapter] = (
            json.loads(chapter.read_text()),
            json.loads(target.read_text()),
        )
        pages[chapter] += (counts, target)
    return out_dir, pages


def _prose(nb):
    return "\n".join(
        "".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"
    )


def _page_id(path):
    return str(path.relative_to(ROOT / "chapters"))


def test_no_raw_myst_markup_remains(book):
    """What Jupyter shows raw: glued names, directive fences, roles."""
    _, pages = book
    before = after = 0
    for chapter, (original, out, _, _) in pages.items():
        before += sum(student.count_raw_markup(_prose(original)).values())
        prose = _prose(out)
        # roles with their backtick: "\mathrm{doc}(i)" in math is not the {doc} role
        roles = ("{glue", ":::{", "```{", "{term}`", "{cite", "{doc}`", "{ref}`")
        for raw in roles:
            assert raw not in prose, (chapter.name, raw)
        assert not student.count_raw_markup(prose), chapter.name
        after += sum(student.count_raw_markup(prose).values())
    assert before > 1000 and after == 0


def test_glued_values_read_as_myst_nb_formats_them(book):
    """Each {glue:text} is replaced by what the website shows: myst-nb's own
    formatting of the value stored in the notebook."""
    from myst_nb.core.variables import format_plain_text

    _, pages = book
    checked = 0
    for original, out, _, _ in pages.values():
        glued = student.glue_data(original)
        prose = _prose(out)
        for key, spec in re.findall(
            r"\{glue:text\}`([^`:]+):?([^`]*)`", _prose(original)
        ):
            shown = format_plain_text(glued[key]["text/plain"], spec or "s")
            assert shown in prose, (key, spec, shown)
            checked += 1
    assert checked > 400


def test_exercises_are_numbered_per_chapter_as_on_the_website(book):
    _, pages = book
    labels = {}
    for chapter, (original, out, _, _) in pages.items():
        for label in re.findall(r":label:\s*(ex-[\w-]+)", _prose(original)):
            match = re.search(
                rf"\*\*Exercise (\d+)\.(\d+)\*\* \({re.escape(label)}\)", _prose(out)
            )
            assert match, (chapter.name, label)
            labels[label] = (int(match.group(1)), int(match.group(2)))
    assert labels["ex-stability-5"] == (2, 5) and labels["ex-definition-1"] == (1, 1)
    for number in range(1, 12):  # 1, 2, ... within each chapter, over its pages
        seen = sorted(n for c, n in labels.values() if c == number)
        assert seen == list(range(1, len(seen) + 1)) and len(seen) >= 5, number


def test_links_point_to_student_notebooks(book):
    _, pages = book
    links = 0
    for _, out, _, target in pages.values():
        for link in re.findall(r"\]\(([^)\s]+\.ipynb)\)", _prose(out)):
            assert (target.parent / link).resolve().exists(), (target.name, link)
            links += 1
    assert links > 100


def _normalized_code_lines(text):
    """Code lines of some length, without spaces: ruff's formatting does not hide
    a copied line."""
    lines = set()
    for line in text.splitlines():
        squeezed = re.sub(r"\s+", "", line)
        generic = squeezed.startswith(("#", "assert", "print(", "import", "from"))
        # the opening line of a call split over lines says nothing of an answer
        generic = generic or squeezed.endswith(("(", "[", "{"))
        if len(squeezed) >= 20 and not generic:
            lines.add(squeezed)
    return lines


def _solution_code(nb):
    """Code in the prose solutions of a page: fenced blocks inside {solution}."""
    code = []
    for block in _solution_blocks(_prose(nb)):
        code += re.findall(r"^```\w*\n(.*?)^```", block, re.S | re.M)
    return "\n".join(code)


def _leaks(original, student_nb):
    """Lines of a solution's code that a student version shows but the page does not
    show outside its solutions (in visible code or prose)."""
    visible = [
        c
        for c in original["cells"]
        if "remove-cell" not in c["metadata"].get("tags", [])
        and "solution" not in c["metadata"].get("tags", [])
    ]
    shown_anyway = set()
    for cell in visible:
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            for block in _solution_blocks(text):
                text = text.replace(block, "")
        shown_anyway |= _normalized_code_lines(text)
    answers = _normalized_code_lines(_solution_code(original)) - shown_anyway
    shown = set()
    for cell in student_nb["cells"]:
        shown |= _normalized_code_lines("".join(cell["source"]))
    return sorted(answers & shown)


def test_no_answer_leaks_into_a_student_notebook(book):
    """No line of an exercise's solution code reaches the student, through a hidden
    verification cell or otherwise."""
    _, pages = book
    for chapter, (original, out, _, _) in pages.items():
        assert not _leaks(original, out), (chapter.name, _leaks(original, out))
    # the two leaks the issue names, by the names their hidden checks define
    stability = pages[ROOT / "chapters" / "02_stability.ipynb"][1]
    masking = pages[ROOT / "chapters" / "04_masking.ipynb"][1]
    assert "blockwise_state" not in json.dumps(stability)
    assert "guarded_where" not in json.dumps(masking)


def test_the_leak_check_finds_the_leaks_of_hidden_cells():
    """The check above fails on a student version that keeps the hidden cells (what
    the tool did before): ex-stability-5's and ex-masking-2's answers are in them."""
    for page, answer in [
        ("02_stability.ipynb", "st=merge(st,(mb,sum(math.exp(v-mb)forvinblk)))"),
        ("04_masking.ipynb", "returntorch.where(total>0,e/total,torch.zeros_like(e))"),
    ]:
        original = json.loads((ROOT / "chapters" / page).read_text())
        kept_hidden = copy.deepcopy(original)
        for cell in kept_hidden["cells"]:
            if cell["cell_type"] == "markdown":
                text = student.strip_solutions("".join(cell["source"]))[0]
                cell["source"] = text
        assert answer in _leaks(original, kept_hidden), page


def test_hidden_checks_left_to_students_are_claims_of_the_page(book):
    """The leak rule: no hidden verification cell after a page's first exercise, or
    naming an exercise, is left; the hidden checks before the exercises stay."""
    _, pages = book
    kept = removed = 0
    for chapter, (_, out, counts, _) in pages.items():
        cells = out["cells"]
        first = next(
            (i for i, c in enumerate(cells) if "**Exercise" in "".join(c["source"])),
            len(cells),
        )
        for i, cell in enumerate(cells):
            if "remove-cell" in cell["metadata"].get("tags", []):
                source = "".join(cell["source"])
                assert i < first, chapter.name
                assert not re.search(r"ex-[\w-]+|exercise", source, re.I), chapter.name
                kept += 1
        removed += counts["answers"]
    assert removed >= 3 and kept > 100


@pytest.mark.parametrize("chapter", CHAPTERS, ids=_page_id)
def test_every_chapter(chapter, book):
    _, pages = book
    original, out, counts, _ = pages[chapter]
    nbformat.validate(nbformat.from_dict(out))

    # prose solutions in dropdowns, and gated solutions around the code of an
    # "implement it yourself" exercise: every one is removed
    n_solutions = len(re.findall(r"\{solution\}", _prose(original)))
    n_gated = len(re.findall(r"\{solution-start\}", _prose(original)))
    assert counts["solutions"] == n_solutions + n_gated
    assert not re.search(r"\{solution", _prose(out))
    assert _prose(out).count("**Exercise") == _prose(original).count("{exercise}")
    # every line of a solution is gone (unless the same line is also outside solutions)
    outside = set(_prose(out).splitlines())
    for block in _solution_blocks(_prose(original)):
        for line in block.splitlines():
            if len(line) > 20 and not line.startswith(("```", ":")):
                assert line not in outside or _appears_outside(line, original), line

    # no line of an answer's body survives in the student's code (unless the page's
    # own code outside the answers has the same line)
    def code_lines(nb, answers=True):
        return {
            line
            for c in nb["cells"]
            if c["cell_type"] == "code"
            and (answers or "solution" not in c["metadata"].get("tags", []))
            for line in "".join(c["source"]).splitlines()
        }

    elsewhere = code_lines(original, answers=False)
    student_code = code_lines(out)
    for cell in original["cells"]:
        if "solution" in cell["metadata"].get("tags", []):
            source = "".join(cell["source"])
            kept = set(student.stub(source).splitlines())
            body = [
                line
                for line in source.splitlines()
                if line.strip() and line not in kept and len(line.strip()) > 8
            ]
            assert body, "an answer with no body to hide"
            leaked = [
                line for line in body if line in student_code and line not in elsewhere
            ]
            assert not leaked, f"{chapter.name}: answer lines left in: {leaked}"
    # code cells keep their order, source and outputs; only answers and exercises
    # change, hidden answers go, and the first cell gains the Colab preamble
    removed = student.answer_cells(original)
    code_in = [
        c
        for i, c in enumerate(original["cells"])
        if c["cell_type"] == "code"
        and not (
            i in removed
            and not {"solution", "exercise"} & set(c["metadata"].get("tags", []))
        )
    ]
    code_out = [c for c in out["cells"] if c["cell_type"] == "code"]
    assert len(code_in) == len(code_out) and counts["answers"] == len(removed)
    first = "".join(code_out[0]["source"])
    version = colab_cell.release_ref(ROOT)
    assert first.startswith("import importlib.util\n") and f"@{version}" in first
    # (a chapter with the default-branch preamble gets the pinned one instead)
    assert colab_cell.strip_preamble(first) == colab_cell.strip_preamble(
        "".join(code_in[0]["source"])
    )
    for before, after in zip(code_in[1:], code_out[1:]):
        tags = before["metadata"].get("tags", [])
        if "solution" in tags:
            assert "answer" in after["metadata"]["tags"] and after["outputs"] == []
        elif "exercise" in tags:
            assert after["source"] == before["source"] and after["outputs"] == []
        else:
            assert after["source"] == before["source"]
            assert after["outputs"] == before["outputs"]
            if "hide-input" in tags:  # the website hides it: JupyterLab collapses it
                assert after["metadata"]["jupyter"]["source_hidden"] is True
    # a figure's caption follows it, numbered
    for i, cell in enumerate(out["cells"]):
        figure = cell["metadata"].get("mystnb", {}).get("figure", {})
        if cell["cell_type"] == "code" and figure.get("caption"):
            caption = "".join(out["cells"][i + 1]["source"])
            assert out["cells"][i + 1]["cell_type"] == "markdown"
            assert re.match(r"\*\*Fig\. \d+\.\d+\.\*\* ", caption) or not figure.get(
                "name"
            )


@pytest.mark.parametrize("number", range(1, 12))
def test_every_chapter_has_exercises_with_solutions(number):
    """At least five exercises per chapter, over its core and deep-dive pages, each
    answered in a dropdown or, for "implement it yourself", in a gated answer cell."""
    pages = [p for p in CHAPTERS if _page_id(p).startswith(f"{number:02d}_")]
    text = "\n".join(_prose(json.loads(p.read_text())) for p in pages)
    exercises = text.count("{exercise}")
    answered = len(re.findall(r"\{solution(-start)?\}", text))
    assert exercises >= 5 and answered >= 5, (number, exercises, answered)


def _solution_blocks(text):
    """Solution blocks found independently of the tool: fence to matching fence."""
    blocks = []
    for match in re.finditer(
        r"^(:{3,}|`{3,})\{solution\}.*?^\1[ \t]*$", text, re.S | re.M
    ):
        blocks.append(match.group(0))
    return blocks


def _appears_outside(line, nb):
    text = "\n".join("".join(c["source"]) for c in nb["cells"])
    without = text
    for block in _solution_blocks(text):
        without = without.replace(block, "")
    return line in without


def test_command_line_needs_only_nbformat(tmp_path):
    """The tool runs with nbformat alone: no myst-nb, Sphinx, YAML or torch.

    Nor rfc3987_syntax, which jsonschema (under nbformat) imports when it is
    installed and otherwise does without: it builds a grammar at import, 2.4 s of
    this test's 3.3."""
    chapter = ROOT / "chapters" / "02_stability.ipynb"
    blocked = ["myst_nb", "sphinx", "yaml", "torch", "numpy", "softmaxbook", "bookkit"]
    blocked.append("rfc3987_syntax")
    program = (
        "import sys, runpy\n"
        f"for name in {blocked!r}:\n"
        "    sys.modules[name] = None  # importing it raises ImportError\n"
        f"sys.argv = ['student.py', '--out', {str(tmp_path)!r}, {str(chapter)!r}]\n"
        f"runpy.run_path({str(ROOT / 'tools' / 'student.py')!r}, run_name='__main__')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / chapter.name).exists()
    assert f"{chapter.name} -> " in result.stdout
    assert "1 hidden answer cell(s) removed" in result.stdout


@pytest.mark.slow
def test_student_notebooks_run_top_to_bottom(tmp_path):
    """The synthetic notebook (a stub, its checker) and chapters 2 and 4 (stubs, and
    hidden answer cells removed) run without error.

    One kernel runs the three, one after the other, each from an empty namespace
    (``%reset -f``, checked): a name that a removed cell defined is a NameError as in
    a fresh kernel, and torch, matplotlib and the book's library are imported once
    (a kernel per notebook took twice as long)."""
    from nbclient import NotebookClient

    nb = json.loads(nbformat.writes(synthetic_notebook()))
    nb["cells"] = [c for c in nb["cells"] if "custom stub" not in "".join(c["source"])]
    path = tmp_path / "synthetic.ipynb"
    path.write_text(json.dumps(nb))
    sources = [
        path,
        ROOT / "chapters" / "02_stability.ipynb",
        ROOT / "chapters" / "04_masking.ipynb",
    ]
    targets = [
        student.write_student_notebook(s, tmp_path / "student")[0] for s in sources
    ]
    empty = nbformat.v4.new_notebook()
    empty.cells = [
        nbformat.v4.new_code_cell(
            '%reset -f\nassert not [n for n in globals() if n[0] != "_" and n not in '
            '("In", "Out", "get_ipython", "exit", "quit", "open")], sorted(globals())'
        )
    ]
    client = NotebookClient(
        empty,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path / "student")}},
    )
    with client.setup_kernel():
        for source, target in zip(sources, targets):
            client.nb = empty
            client.execute_cell(empty.cells[0], 0)
            notebook = client.nb = nbformat.read(target, as_version=4)
            for index, cell in enumerate(notebook.cells):
                client.execute_cell(cell, index)
            feedback = [
                c for c in notebook.cells if "exercise" in c.metadata.get("tags", [])
            ]
            text = " ".join(
                "".join(o.get("text", "") for o in feedback[0].outputs).split()
            )
            assert "NotImplementedError" in text, source.name
            if source == path:
                assert "check_softmax(my_softmax): 2 problems" in text


# ------------------------------------------------------------ the instructors page

INSTRUCTORS = ROOT / "chapters" / "instructors.md"


def test_instructors_page_lists_every_exercise_of_every_chapter():
    """Its homework, exam and implement-it-yourself tables: each exercise once."""
    page = INSTRUCTORS.read_text()
    tables = page[page.index("## Homework or exam?") :]
    listed = re.findall(r"\{ref\}`(ex-[\w-]+)`", tables.split("Other exercises")[0])
    labels = {
        label
        for chapter in CHAPTERS
        for label in re.findall(
            r":label:\s*(ex-[\w-]+)", _prose(json.loads(chapter.read_text()))
        )
    }
    assert len(labels) >= 70 and any(label.startswith("ex-sinks") for label in labels)
    assert sorted(set(listed)) == sorted(labels)
    assert len(listed) == len(set(listed))  # in one table only


def test_instructors_page_pins_this_version():
    import softmaxbook

    page = INSTRUCTORS.read_text()
    version = softmaxbook.__version__
    assert f'softmax-in-attention@v{version}"' in page
    assert 'python -c "import softmaxbook; print(softmaxbook.__version__)"' in page
    assert f'print(softmaxbook.__version__)"   # {version}' in page
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in page
    # the CPU build comes first, then the package
    assert page.index("download.pytorch.org/whl/cpu") < page.index("@v" + version)
    stale = re.findall(r"@v(\d+\.\d+\.\d+)|__version__ == \"([\d.]+)\"", page)
    assert {v for pair in stale for v in pair if v} == {version}


def test_instructors_page_assignment_table_matches_the_course_kit():
    from coursekit.assignments import ASSIGNMENTS as assignments

    page = INSTRUCTORS.read_text()
    rows = re.findall(
        r"^\| `([\w-]+)` \| (.*) \| (\d+) \| (\d+) \| (\d+) \|$", page, re.M
    )
    assert [row[0] for row in rows] == list(assignments)
    for aid, functions, visible, hidden, total in rows:
        assignment = assignments[aid]
        points = {"visible": 0.0, "hidden": 0.0}
        for test in assignment.tests:
            points[test.visibility] += test.points
        assert (float(visible), float(hidden)) == (points["visible"], points["hidden"])
        assert float(total) == assignment.max_score()
        for name in assignment.functions:
            assert f"`{name}" in functions, (aid, name)
