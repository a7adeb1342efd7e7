"""The five assignments: their shape, their reference solutions, and what a wrong
submission sees.

Every test of every assignment is run on the reference solution (it must pass), on
the stub (it must fail, naming NotImplementedError) and on an identity and a zeros
submission (they must score 0: points are monotone in correctness). Then typical
wrong solutions, each made by changing one line of a reference solution, must fail
the test meant to catch them with the hint meant for them, while the tests their
mistake does not touch still pass.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from coursekit import incheck
from coursekit._model import Assignment
from coursekit.assignments import ASSIGNMENTS, get_assignment

ROOT = Path(__file__).resolve().parents[2]

# What the issue names: the ids and the module-level names a submission defines.
FUNCTIONS = {
    "softmax": ("softmax", "log_softmax", "cross_entropy"),
    "attention": ("masked_softmax", "scaled_dot_product_attention"),
    "gradients": ("softmax_backward", "attention_backward"),
    "flash-attention": ("flash_forward", "flash_backward", "FlashAttention"),
    "sparse-maps": ("sparsemax", "entmax15"),
}
CASES = [(a.id, t.name) for a in ASSIGNMENTS.values() for t in a.tests]


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    # The tests run many small ops; two threads on a loaded 2-core machine are
    # far slower than one.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def namespace(source: str, filename: str = "<submission>") -> dict[str, Any]:
    ns: dict[str, Any] = {"__name__": "submission"}
    exec(compile(source, filename, "exec"), ns)
    return ns


def failure(assignment_id: str, test_name: str, ns: dict[str, Any]) -> str | None:
    """None when the test passes on ``ns``, else its message (as a student sees it)."""
    try:
        incheck.run_test(assignment_id, test_name, ns)
    except AssertionError as error:
        return " ".join(str(error).split())
    return None


def mutant(assignment_id: str, old: str, new: str) -> dict[str, Any]:
    """The reference solution with ``old`` (which must occur once) replaced."""
    source = get_assignment(assignment_id).reference_source()
    assert source.count(old) == 1, f"{old!r} is not in the reference once"
    return namespace(source.replace(old, new))


def score(assignment: Assignment, ns: dict[str, Any]) -> float:
    return sum(
        t.points for t in assignment.tests if failure(assignment.id, t.name, ns) is None
    )


# --- the registry -------------------------------------------------------------------


def test_the_five_assignments_define_what_the_issue_names() -> None:
    assert list(ASSIGNMENTS) == list(FUNCTIONS)
    for aid, functions in FUNCTIONS.items():
        a = get_assignment(aid)
        assert a.id == aid and a.functions == functions
        assert a.package == aid.replace("-", "_")
        assert sum(t.points for t in a.tests) == a.max_score() > 0


def test_get_assignment_names_the_known_ids() -> None:
    with pytest.raises(ValueError, match="known: softmax, attention, gradients"):
        get_assignment("flash")
    with pytest.raises(
        ValueError, match="has no test 'nope'; its tests: softmax_values"
    ):
        get_assignment("softmax").test("nope")


@pytest.mark.parametrize("aid", FUNCTIONS)
def test_each_assignment_has_visible_and_hidden_tests_for_every_function(
    aid: str,
) -> None:
    a = get_assignment(aid)
    visible = {f for t in a.tests if t.visibility == "visible" for f in t.functions}
    hidden = {f for t in a.tests if t.visibility == "hidden" for f in t.functions}
    assert visible == set(a.functions)
    assert hidden <= set(a.functions) and hidden
    assert len({t.name for t in a.tests}) == len(a.tests)
    assert all(t.points > 0 and t.description for t in a.tests)


@pytest.mark.parametrize("aid", FUNCTIONS)
def test_the_spec_states_the_functions_what_is_forbidden_and_the_points(
    aid: str,
) -> None:
    a = get_assignment(aid)
    for name in a.functions:
        assert f"{name}(" in a.spec or f"class {name}" in a.spec
    assert "What you may not use" in a.spec
    assert f"{a.max_score():g} points in all" in a.spec
    for t in a.tests:  # visible tests by name; hidden ones only counted
        assert (f"`{t.name}`" in a.spec) == (t.visibility == "visible")


def test_the_flash_spec_states_its_causal_alignment() -> None:
    spec = get_assignment("flash-attention").spec
    assert "bottom right" in spec and "j \\le i + S - L" in spec
    assert "top left" in get_assignment("attention").spec


@pytest.mark.parametrize("aid", FUNCTIONS)
def test_inputs_are_deterministic(aid: str) -> None:
    for t in get_assignment(aid).tests:
        first, second = t.make_inputs(), t.make_inputs()
        assert repr(first) == repr(second), t.name


@pytest.mark.parametrize("aid", FUNCTIONS)
def test_a_judge_answers_in_words_whatever_comes_back(aid: str) -> None:
    # The grader may hand a judge nothing (a crash) or something malformed.
    garbage: list[Any] = [None, {}, {"results": [{"value": "x"}]}, {"results": 3}]
    garbage.append({"value": "<an object of type Evil>", "grads": [None]})
    for t in get_assignment(aid).tests:
        inputs = t.make_inputs()
        for outputs in garbage:
            verdict = t.judge(inputs, outputs)
            assert isinstance(verdict, str) and verdict, (t.name, outputs)


# --- the reference solutions --------------------------------------------------------


@pytest.mark.parametrize(("aid", "test_name"), CASES)
def test_the_reference_solution_passes(aid: str, test_name: str) -> None:
    ns = namespace(get_assignment(aid).reference_source())
    assert failure(aid, test_name, ns) is None


def _function_bodies(tree: ast.AST) -> Iterator[tuple[str, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr):  # the docstring
                body = body[1:]
            yield node.name, ast.dump(ast.Module(body=body, type_ignores=[]))


@pytest.mark.parametrize("aid", FUNCTIONS)
def test_the_sources_run_after_any_other_cell(aid: str) -> None:
    # A notebook's cells are joined into one module: a __future__ import after
    # a student's first cell would be a SyntaxError.
    a = get_assignment(aid)
    for source in (a.reference_source(), a.stub_source()):
        namespace("import torch\n\n" + source)


def test_no_reference_solution_copies_a_library_function() -> None:
    library = {
        dump
        for path in (ROOT / "lib" / "softmaxbook").rglob("*.py")
        for _, dump in _function_bodies(ast.parse(path.read_text(encoding="utf-8")))
    }
    for a in ASSIGNMENTS.values():
        source = a.reference_source()
        assert "softmaxbook" not in source and "entmax import" not in source
        for name, dump in _function_bodies(ast.parse(source)):
            assert dump not in library, f"{a.id}: {name} is a library function's body"


# --- stubs, identity and zeros submissions: 0 points ---------------------------------


@pytest.mark.parametrize("aid", FUNCTIONS)
def test_the_stub_fails_every_test_saying_what_to_do(aid: str) -> None:
    a = get_assignment(aid)
    ns = namespace(a.stub_source())
    for t in a.tests:
        message = failure(aid, t.name, ns)
        assert message is not None, t.name
        assert "the stub still raises NotImplementedError" in message, message


def _trivial(aid: str, make: Callable[..., Any]) -> dict[str, Any]:
    ns: dict[str, Any] = dict.fromkeys(FUNCTIONS[aid], make)

    class Trivial:
        apply = staticmethod(make)

    if aid == "flash-attention":
        ns["FlashAttention"] = Trivial
    return ns


@pytest.mark.parametrize("aid", FUNCTIONS)
def test_identity_and_zeros_submissions_score_nothing(aid: str) -> None:
    a = get_assignment(aid)
    assert score(a, _trivial(aid, lambda *args, **kwargs: args[0])) == 0
    assert score(a, _trivial(aid, lambda *a_, **k: torch.zeros_like(a_[0]))) == 0
    assert score(a, namespace(a.stub_source())) == 0


def test_the_stub_keeps_classes_constants_and_docstrings() -> None:
    a = get_assignment("flash-attention")
    stub = a.stub_source()
    ns = namespace(stub)
    assert ns["BLOCK_Q"] == 16 and issubclass(
        ns["FlashAttention"], torch.autograd.Function
    )
    assert '"""Tiled attention: (out (..., L, Dv), lse (..., L))' in stub
    assert "alpha" not in stub and "save_for_backward" not in stub.split("class")[1]
    with pytest.raises(NotImplementedError):
        ns["FlashAttention"].apply(
            torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2)
        )


@pytest.mark.parametrize("aid", FUNCTIONS)
def test_the_stub_gives_no_answer_away(aid: str) -> None:
    # The solution's workings live in comments and private helpers, which the stub
    # leaves out; what it keeps (signatures, docstrings) is the spec.
    a = get_assignment(aid)
    stub, source = a.stub_source(), a.reference_source()
    comments = [
        line.strip() for line in source.splitlines() if line.strip().startswith("# ")
    ]
    assert comments and not any(c in stub for c in comments)
    assert "\ndef _" not in stub  # private helpers are left out
    assert stub.count("raise NotImplementedError") == len(
        [n for n in ast.walk(ast.parse(stub)) if isinstance(n, ast.FunctionDef)]
    )


# --- the student notebook -----------------------------------------------------------


@pytest.mark.parametrize("aid", FUNCTIONS)
def test_the_student_notebook_checks_the_visible_tests_only(aid: str) -> None:
    nbformat = pytest.importorskip("nbformat")
    a = get_assignment(aid)
    nb = a.student_notebook()
    nbformat.validate(nbformat.from_dict(nb))
    text = "\n".join(cell["source"] for cell in nb["cells"])
    for t in a.tests:
        assert (f"run_test({aid!r}, {t.name!r}" in text) == (t.visibility == "visible")
    code = [cell["source"] for cell in nb["cells"] if cell["cell_type"] == "code"]
    assert code[0] == a.stub_source()
    # Run it as a student would: with the stub every check fails, with the
    # reference every check passes.
    for solution, passes in ((a.stub_source(), False), (a.reference_source(), True)):
        ns = namespace(solution)
        for source in code[1:]:
            try:
                exec(source, ns)
                passed = True
            except AssertionError:
                passed = False
            if "run_test" in source:
                assert passed == passes, source


# --- what a wrong submission sees ---------------------------------------------------

# (assignment, the change to the reference, the test that must fail, words of its
#  hint, a test that must still pass, or None where every test calls what changed)
WRONG = [
    # softmax
    (
        "softmax",
        ("e = torch.exp(x - m)", "e = torch.exp(x)"),
        "softmax_large_scores",
        "Subtract the row maximum before exp",
        "softmax_values",
    ),
    (
        "softmax",
        (
            "return shifted - torch.log(torch.exp(shifted).sum(dim=dim, keepdim=True))",
            "return torch.log(softmax(x, dim))",
        ),
        "log_softmax_large_scores",
        "That is log(softmax(x))",
        "log_softmax_values",
    ),
    (
        "softmax",
        ("-picked.mean()", "-picked.sum()"),
        "cross_entropy_values",
        "That is the sum over rows",
        "softmax_values",
    ),
    (
        "softmax",
        ("e / e.sum(dim=dim, keepdim=True)", "e / e.sum()"),
        "softmax_values",
        "Your whole result sums to 1",
        "log_softmax_values",
    ),
    (
        "softmax",
        (
            "m = x.amax(dim=dim, keepdim=True)\n    e = torch.exp(x - m)",
            "m = x.amax(dim=-1, keepdim=True)\n    e = torch.exp(x - m)\n    dim = -1",
        ),
        "softmax_dim",
        "normalize along the dim you are given",
        "softmax_values",
    ),
    # attention
    (
        "attention",
        (
            "e = torch.exp(filled - m.masked_fill(empty, 0.0))",
            "e = torch.exp(filled - m)",
        ),
        "masked_softmax_empty_row",
        "-inf - (-inf) = nan",
        "masked_softmax_values",
    ),
    (
        "attention",
        (
            "filled = scores.masked_fill(~keep, -math.inf)",
            "filled = scores.masked_fill(keep, -math.inf)",
        ),
        "masked_softmax_values",
        "the mask means True = may attend",
        None,
    ),
    (
        "attention",
        (
            "filled = scores.masked_fill(~keep, -math.inf)",
            "filled = scores.masked_fill(~keep, -1e9)",
        ),
        "masked_softmax_empty_row",
        "finite fill such as -1e9",
        "masked_softmax_values",
    ),
    (
        "attention",
        ("/ math.sqrt(q.shape[-1])", ""),
        "sdpa_values",
        "Scale the scores by 1 / sqrt(D)",
        "masked_softmax_values",
    ),
    (
        "attention",
        ("keep = keep.tril()", "keep = keep.triu()"),
        "sdpa_causal",
        "the wrong way round",
        "sdpa_mask",
    ),
    (
        "attention",
        ("keep = keep.tril()", "keep = keep.tril(S - L)"),
        "sdpa_causal_rectangular",
        "That is the bottom-right alignment",
        "sdpa_causal",
    ),
    # gradients
    (
        "gradients",
        (
            "return s * (grad_output - (s * grad_output).sum(dim=dim, keepdim=True))",
            "return s * grad_output",
        ),
        "softmax_backward_values",
        "That is s * g",
        None,
    ),
    (
        "gradients",
        ("ds = softmax_backward(p, dp)", "ds = p * dp"),
        "attention_backward_values",
        "rowsum(dO * O)",
        "softmax_backward_values",
    ),
    (
        "gradients",
        ("dq = ds @ k * scale", "dq = ds @ k"),
        "attention_backward_values",
        "multiply by 1 / sqrt(D)",
        "softmax_backward_values",
    ),
    (
        "gradients",
        (
            "(s * grad_output).sum(dim=dim, keepdim=True)",
            "(s * grad_output).sum(dim=-1, keepdim=True)",
        ),
        "softmax_backward_dim",
        "You summed along dim=",
        "softmax_backward_values",
    ),
    # flash-attention
    (
        "flash-attention",
        ("acc = acc * alpha + p @", "acc = acc + p @"),
        "flash_forward_values",
        "without the rescale",
        "flash_backward_values",
    ),
    (
        "flash-attention",
        ("lses.append(lse.squeeze(-1))", "lses.append(lse.squeeze(-1) / math.log(2))"),
        "flash_forward_values",
        "in base 2",
        "flash_backward_values",
    ),
    (
        "flash-attention",
        ("lse = (m_safe + torch.log(", "lse = (torch.log("),
        "flash_forward_values",
        "add the running maximum back",
        "flash_backward_values",
    ),
    (
        "flash-attention",
        (
            "ds = p * (doi @ vj.transpose(-2, -1) - delta[..., i0:i1, :])",
            "ds = p * (doi @ vj.transpose(-2, -1))",
        ),
        "flash_backward_values",
        "rowsum(dO * O)",
        "flash_forward_values",
    ),
    (
        "flash-attention",
        ("offset = S - L  # bottom-right alignment", "offset = 0"),
        "flash_forward_causal_rectangular",
        "That is the top-left alignment",
        "flash_forward_causal",
    ),
    (
        "flash-attention",
        ("outs.append(acc / l.masked_fill(empty, 1.0))", "outs.append(acc / l)"),
        "flash_forward_fully_masked_rows",
        "exp(-inf - (-inf)) is nan",
        "flash_forward_values",
    ),
    (
        "flash-attention",
        (
            "return torch.cat(outs, dim=-2).to(q.dtype), torch.cat(lses, dim=-1)",
            "return torch.cat(outs, dim=-2).to(q.dtype)",
        ),
        "flash_forward_values",
        "expected a tuple (out, lse)",
        "flash_backward_values",
    ),
    # sparse-maps
    (
        "sparse-maps",
        (
            "return torch.clamp(z - tau, min=0).movedim(-1, dim)",
            "return (torch.exp(z) / torch.exp(z).sum(-1, keepdim=True))"
            ".movedim(-1, dim)",
        ),
        "sparsemax_values",
        "That is softmax",
        "entmax15_values",
    ),
    (
        "sparse-maps",
        (
            "tau = (cumsum.gather(-1, support - 1) - 1) / support",
            "tau = (cumsum[..., -1:] - 1) / z.shape[-1]",
        ),
        "sparsemax_values",
        "uses every entry",
        "entmax15_values",
    ),
    (
        "sparse-maps",
        (
            "return (torch.clamp(z - tau_star, min=0) ** 2)",
            "return (torch.clamp(z - tau_star, min=0))",
        ),
        "entmax15_values",
        "sum to 1",
        "sparsemax_values",
    ),
    (
        "sparse-maps",
        ("z, zs, k = _sorted_rows(x / 2, dim)", "return sparsemax(x / 2, dim)"),
        "entmax15_values",
        "You forgot the square",
        "sparsemax_values",
    ),
    (
        "sparse-maps",
        ("z, zs, k = _sorted_rows(x / 2, dim)", "z, zs, k = _sorted_rows(x, dim)"),
        "entmax15_values",
        "halves the scores first",
        "sparsemax_values",
    ),
]


@pytest.mark.parametrize(
    ("aid", "change", "fails", "hint", "passes"),
    WRONG,
    ids=[f"{w[0]}:{w[2]}:{w[3][:24]}" for w in WRONG],
)
def test_a_typical_mistake_fails_its_test_with_its_hint(
    aid: str, change: tuple[str, str], fails: str, hint: str, passes: str | None
) -> None:
    ns = mutant(aid, *change)
    message = failure(aid, fails, ns)
    assert message is not None and hint in message, message
    if passes is not None:  # what the mistake does not touch still earns its points
        assert failure(aid, passes, ns) is None


def test_every_assignment_has_three_typical_mistakes() -> None:
    for aid in FUNCTIONS:
        assert sum(w[0] == aid for w in WRONG) >= 3, aid


FULL_SCORES_FORWARD = """
import math
import torch


def flash_forward(q, k, v, is_causal=False, block_q=16, block_k=16):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # all (L, S) scores at once
    L, S = s.shape[-2:]
    if is_causal:
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(S - L), -math.inf)
    m = s.amax(-1, keepdim=True)
    m = m.masked_fill(torch.isneginf(m), 0.0)
    e = torch.exp(s - m)
    l = e.sum(-1, keepdim=True)
    return (e @ v) / l.masked_fill(l == 0, 1.0), (m + torch.log(l)).squeeze(-1)
"""

SAVES_WEIGHTS = """
import math
import torch


class FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        p = torch.exp(s - s.amax(-1, keepdim=True))
        p = p / p.sum(-1, keepdim=True)
        ctx.save_for_backward(q, k, v, p)
        return p @ v

    @staticmethod
    def backward(ctx, grad_output):
        q, k, v, p = ctx.saved_tensors
        dp = grad_output @ v.transpose(-2, -1)
        ds = p * (dp - (dp * p).sum(-1, keepdim=True)) / math.sqrt(q.shape[-1])
        return ds @ k, ds.transpose(-2, -1) @ q, p.transpose(-2, -1) @ grad_output, None
"""


def test_a_forward_pass_holding_the_full_scores_loses_the_memory_points() -> None:
    ns = namespace(FULL_SCORES_FORWARD)
    assert failure("flash-attention", "flash_forward_values", ns) is None
    assert failure("flash-attention", "flash_forward_fully_masked_rows", ns) is None
    message = failure("flash-attention", "flash_forward_memory", ns)
    assert message is not None
    assert "made a tensor of 32768 entries" in message  # (2, 128, 128)
    assert "never to hold the (L, S) scores" in message


def test_a_function_saving_the_weights_loses_the_saved_tensors_points() -> None:
    ns = namespace(SAVES_WEIGHTS)
    message = failure("flash-attention", "flash_autograd_saves", ns)
    assert message is not None
    # Its output was right (the value is judged first): the saved weights cost it.
    assert "saves a tensor of shape (2, 24, 20): the (L, S) weights" in message


def test_the_autograd_function_names_its_forward_passs_mistake() -> None:
    ns = mutant("flash-attention", "acc = acc * alpha + p @", "acc = acc + p @")
    for test in ("flash_autograd_saves", "flash_autograd_gradients"):
        message = failure("flash-attention", test, ns)
        assert message is not None and "without the rescale" in message, message
