"""tools/student.py: student versions keep everything but the solutions, and still run.

On a synthetic notebook with every kind of solution the convention allows (each
carrying the word SECRET), and on every real chapter.
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

ROOT = Path(__file__).resolve().parents[1]
# Every page: the chapters' core pages and their deep-dive pages.
CHAPTERS = sorted(
    p
    for p in (ROOT / "chapters").rglob("*.ipynb")
    if ".ipynb_checkpoints" not in p.parts
)

_spec = importlib.util.spec_from_file_location("student", ROOT / "tools" / "student.py")
student = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(student)


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
    """Every form of solution, each with the word SECRET, and things that must stay."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells = [
        _markdown("# A chapter\n\nWhat you will learn."),
        _code(
            "import torch\nimport softmaxbook as sb\nprint('setup')",
            outputs=["setup\n"],
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
    assert counts == {"solutions": 5, "stubs": 2, "cleared": 1}


def test_everything_else_stays(converted):
    original, out, _ = converted
    sources = ["".join(c["source"]) for c in out["cells"]]
    assert sources[0] == "# A chapter\n\nWhat you will learn."
    assert out["cells"][1] == original["cells"][1]  # code and outputs untouched
    exercises = sources[2]
    for kept in (
        ":::{exercise}\n:label: ex-a\nDo A.\n:::",
        ":label: ex-b",
        "Text after the solutions.",
    ):
        assert kept in exercises
    assert "Before the gate." in sources and "After the gate." in sources
    assert out["cells"][-1] == original["cells"][-1]
    assert out["metadata"]["softmaxbook"] == {"student_version": True}
    nbformat.validate(nbformat.from_dict(out))


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


def _prose(nb):
    return "\n".join(
        "".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"
    )


def _page_id(path):
    return str(path.relative_to(ROOT / "chapters"))


@pytest.mark.parametrize("chapter", CHAPTERS, ids=_page_id)
def test_every_chapter(chapter, tmp_path):
    target, counts = student.write_student_notebook(chapter, tmp_path)
    original = json.loads(chapter.read_text())
    out = json.loads(target.read_text())
    nbformat.validate(nbformat.from_dict(out))

    # prose solutions in dropdowns, and gated solutions around the code of an
    # "implement it yourself" exercise: every one is removed
    n_solutions = len(re.findall(r"\{solution\}", _prose(original)))
    n_gated = len(re.findall(r"\{solution-start\}", _prose(original)))
    assert counts["solutions"] == n_solutions + n_gated
    assert not re.search(r"\{solution", _prose(out))
    assert _prose(out).count("{exercise}") == _prose(original).count("{exercise}")
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
    # code cells keep their place, source and outputs; only answers and exercises change
    code_in = [c for c in original["cells"] if c["cell_type"] == "code"]
    code_out = [c for c in out["cells"] if c["cell_type"] == "code"]
    assert len(code_in) == len(code_out)
    for before, after in zip(code_in, code_out):
        tags = before["metadata"].get("tags", [])
        if "solution" in tags:
            assert "answer" in after["metadata"]["tags"] and after["outputs"] == []
        elif "exercise" in tags:
            assert after["source"] == before["source"] and after["outputs"] == []
        else:
            assert after == before
    assert len(out["cells"]) == len(original["cells"]) - _solution_only_cells(original)


@pytest.mark.parametrize("number", range(1, 11))
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


def _solution_only_cells(nb):
    """Markdown cells that hold nothing but solutions."""
    count = 0
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        text = "".join(cell["source"])
        for block in _solution_blocks(text):
            text = text.replace(block, "")
        # the fences that open and close a gated solution stand in cells of their own
        text = re.sub(
            r"^(`{3,}|:{3,})\{solution-(start|end)\}.*?^\1[ \t]*$",
            "",
            text,
            flags=re.S | re.M,
        )
        count += "solution" in cell["metadata"].get("tags", []) or not text.strip()
    return count


def test_command_line(tmp_path):
    chapter = CHAPTERS[0]
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "student.py"),
            "--out",
            str(tmp_path),
            str(chapter),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert (tmp_path / chapter.name).exists()
    assert (
        f"{chapter.name} -> " in result.stdout
        and "solution(s) removed" in result.stdout
    )


@pytest.mark.slow
def test_student_notebooks_run_top_to_bottom(tmp_path):
    """The synthetic notebook (a stub, its checker) and chapter 1 run without error."""
    from nbclient import NotebookClient

    nb = json.loads(nbformat.writes(synthetic_notebook()))
    nb["cells"] = [c for c in nb["cells"] if "custom stub" not in "".join(c["source"])]
    path = tmp_path / "synthetic.ipynb"
    path.write_text(json.dumps(nb))
    for source in (path, ROOT / "chapters" / "01_definition.ipynb"):
        target, _ = student.write_student_notebook(source, tmp_path / "student")
        notebook = nbformat.read(target, as_version=4)
        NotebookClient(
            notebook,
            timeout=600,
            kernel_name="python3",
            resources={"metadata": {"path": str(tmp_path)}},
        ).execute()
        if source == path:
            feedback = [
                c for c in notebook.cells if "exercise" in c.metadata.get("tags", [])
            ]
            text = " ".join(
                "".join(o.get("text", "") for o in feedback[0].outputs).split()
            )
            assert "check_softmax(my_softmax): 2 problems" in text
            assert "the stub still raises NotImplementedError" in text
