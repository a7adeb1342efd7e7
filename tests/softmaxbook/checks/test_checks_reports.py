"""softmaxbook.checks, the machinery around the checks: a broken function (one that
raises, returns the wrong type or shape, or is still the stub) never crashes a checker;
the report reads well, raises on request, pickles and shows in IPython; and its
per-check scores can grade (a stub scores zero, each passed check adds its points).

The correct and mistaken student functions come from test_checks_softmax.py and
test_checks_attention.py.
"""

from __future__ import annotations

import doctest
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from _checks_helpers import _assert_caught, _assert_passes
from test_checks_attention import (
    attention_correct,
    entropy_where,
    merge_correct,
    merge_in_place,
    top_p_chapter,
    top_p_in_place,
)
from test_checks_softmax import (
    backward_einsum,
    log_softmax_stable,
    masked_correct,
    softmax_dim0,
    softmax_in_place,
    softmax_naive,
    softmax_no_grad,
    softmax_stable,
    sparsemax_sort,
    sparsemax_unsorted,
)

import softmaxbook as sb
from softmaxbook import checks
from softmaxbook.checks._session import Session

# --------------------------------------------------------------------------------------
# Broken functions never crash a checker

ALL_CHECKERS = [
    checks.check_softmax,
    checks.check_log_softmax,
    checks.check_masked_softmax,
    checks.check_attention,
    checks.check_softmax_backward,
    checks.check_sparsemax,
    checks.check_top_p_filter,
    checks.check_merge_attention_states,
    checks.check_attention_entropy,
]


def _raises(*args, **kwargs):
    raise ZeroDivisionError("division by zero")


def _returns_list(*args, **kwargs):
    return [0.25, 0.25, 0.25, 0.25]


def _returns_none(*args, **kwargs):
    return None


def _wrong_shape(*args, **kwargs):
    return args[0].sum(-1)


def _not_implemented(*args, **kwargs):
    raise NotImplementedError("write your function here")


def _returns_numpy(*args, **kwargs):
    return np.zeros(3)


def _integer(*args, **kwargs):
    return torch.zeros(args[0].shape, dtype=torch.long)


BROKEN = [
    (_raises, "raised ZeroDivisionError: division by zero"),
    (_returns_list, "returned a list; expected a floating-point torch.Tensor"),
    (
        _returns_none,
        "returned None; expected a floating-point torch.Tensor: did you "
        "forget the return statement?",
    ),
    (_wrong_shape, "returned shape"),
    (_not_implemented, "the stub still raises NotImplementedError"),
    (_returns_numpy, "stay in torch"),
    (_integer, "of dtype int64"),
]


@pytest.mark.parametrize("checker", ALL_CHECKERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    "fn, fragment", BROKEN, ids=lambda v: getattr(v, "__name__", "")
)
def test_broken_functions_become_problems(checker, fn, fragment):
    report = checker(fn)
    assert not report.ok and not report
    text = " ".join(" ".join(report.problems).split())
    if (
        checker is checks.check_merge_attention_states
        and fn is not _raises
        and fn is not _not_implemented
    ):
        fragment = "return a pair (out, lse)"  # a single value where a pair is due
    assert fragment in text, text
    # the first input failed: the report shows that problem alone
    assert report.problems[-1] == (
        "The other checks are not reported: fix the problem above first."
    )
    assert report.problems[0].startswith("With ")


def test_a_function_that_fails_only_on_some_inputs_gets_every_other_check():
    def fails_on_half(x):
        if x.dtype == torch.float16:
            raise TypeError("no half for me")
        return torch.softmax(x, dim=-1)

    report = checks.check_softmax(fails_on_half)
    assert len(report.problems) == 1
    assert report.problems[0].startswith(
        "With random scores of shape (3, 7) (float16), "
        "your softmax raised TypeError: no half for me."
    )


@pytest.mark.parametrize(
    "checker, fn",
    [
        (checks.check_softmax, softmax_stable),
        (checks.check_log_softmax, log_softmax_stable),
        (checks.check_masked_softmax, masked_correct),
        (checks.check_attention, attention_correct),
        (checks.check_softmax_backward, backward_einsum),
        (checks.check_sparsemax, sparsemax_sort),
        (checks.check_top_p_filter, top_p_chapter),
        (checks.check_merge_attention_states, merge_correct),
        (checks.check_attention_entropy, entropy_where),
    ],
    ids=lambda v: v.__name__,
)
def test_the_device_check_runs_when_asked(checker, fn, monkeypatch):
    """On a CPU-only machine the device check runs only with an explicit device."""
    calls = []
    original = Session.on_device

    def counted(self, *args, **kwargs):
        calls.append(self.device)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Session, "on_device", counted)
    _assert_passes(checker(fn, device="cpu"))
    assert calls == [torch.device("cpu")]


def test_a_result_on_another_device_is_a_problem():
    report = checks.check_softmax(lambda x: torch.softmax(x, -1).to("meta"))
    _assert_caught(
        report,
        [
            "given tensors on cpu, your softmax returned a tensor on meta",
            "do not move the result",
        ],
    )


def test_an_in_place_change_does_not_leak_into_the_next_check():
    """fn gets copies: after its in-place change the other inputs are still right."""
    report = checks.check_top_p_filter(top_p_in_place)
    assert len(report.problems) == 1, str(report)
    assert "changed its argument logits in place" in report.problems[0]
    report = checks.check_merge_attention_states(merge_in_place)
    assert [p.split(",")[0] for p in report.problems] == [
        "With parts over keys 0-1 and 2-5 of random q (2",  # the in-place change
        "With parts over keys 0-1 and 2-5 of random q (2",  # autograd refuses it
    ], str(report)


def test_not_callable_is_an_error_of_the_caller():
    with pytest.raises(TypeError, match="fn must be a callable"):
        checks.check_softmax("softmax")
    with pytest.raises(TypeError, match="numpy must be True or False"):
        checks.check_softmax(softmax_stable, numpy="yes")


# --------------------------------------------------------------------------------------
# The report


def test_report_api():
    good = checks.check_softmax(softmax_stable)
    assert good.ok and bool(good) and good.problems == []
    assert str(good).startswith("check_softmax(softmax_stable): all checks passed.")
    assert "overflow [1000, 0]" in str(good)
    good.raise_if_failed()  # does not raise

    bad = checks.check_softmax(softmax_naive)
    assert not bad.ok and not bool(bad)
    assert str(bad).startswith(
        "check_softmax(softmax_naive): 1 problem\n 1. With scores"
    )
    with pytest.raises(AssertionError) as raised:
        bad.raise_if_failed()
    assert str(raised.value) == str(bad)
    for problem in bad.problems:
        assert " ".join(problem.split()) in " ".join(str(raised.value).split())


# --------------------------------------------------------------------------------------
# Scores: per-check results that a grade can be built on

CORRECT = [
    (checks.check_softmax, softmax_stable),
    (checks.check_log_softmax, log_softmax_stable),
    (checks.check_masked_softmax, masked_correct),
    (checks.check_attention, attention_correct),
    (checks.check_softmax_backward, backward_einsum),
    (checks.check_sparsemax, sparsemax_sort),
    (checks.check_top_p_filter, top_p_chapter),
    (checks.check_merge_attention_states, merge_correct),
    (checks.check_attention_entropy, entropy_where),
    (checks.check_sink_softmax, sb.sink_softmax),
]


def _identity(*args, **kwargs):
    return args[0]


def _names(report):
    return [r.name for r in report.results]


@pytest.mark.parametrize("checker, correct", CORRECT, ids=lambda v: v.__name__)
def test_every_function_gets_the_same_checks_and_a_stub_scores_zero(checker, correct):
    good = checker(correct)
    assert good.ok and good.max_score >= 6
    assert good.score == good.max_score and all(r.passed for r in good.results)
    assert all(r.message == "" for r in good.results)
    stub = checker(_not_implemented)
    assert stub.score == 0 and not any(r.passed for r in stub.results)
    for fn in (_not_implemented, _identity, _raises, _returns_none, _wrong_shape):
        report = checker(fn)
        # the same checks, whatever the function does: a fixed max_score
        assert _names(report) == _names(good), fn.__name__
        assert 0 <= report.score < report.max_score == good.max_score
        for result in report.results:
            assert result.passed == (result.message == ""), result
    assert len(set(_names(good))) == len(good.results)


def test_the_stub_no_longer_beats_the_identity():
    # Counted as problems, an untouched stub (2: its exception, "not reported")
    # looked better than the identity (3 or more); scored, it is never above.
    stub, identity = (checks.check_softmax(f) for f in (_not_implemented, _identity))
    assert len(stub.problems) == 2 < len(identity.problems)  # the old measure
    assert stub.score == 0 == identity.score
    for checker in (checks.check_attention, checks.check_softmax_backward):
        stub, identity = checker(_not_implemented), checker(_identity)
        assert stub.score == 0 <= identity.score < identity.max_score
    # each passed check adds its points: a stable softmax > a naive one > identity
    naive = checks.check_softmax(softmax_naive)
    stable = checks.check_softmax(softmax_stable)
    identity = checks.check_softmax(_identity)
    assert identity.score < naive.score < stable.score == stable.max_score
    failed = [r.name for r in naive.results if not r.passed]
    assert failed and all(
        "overflow" in n or "underflow" in n or "different scales" in n for n in failed
    ), failed

    # a function that fails only on float16 loses that one check
    def fails_on_half(x):
        if x.dtype == torch.float16:
            raise TypeError("no half for me")
        return torch.softmax(x, dim=-1)

    half = checks.check_softmax(fails_on_half)
    assert half.score == half.max_score - 1
    (lost,) = [r for r in half.results if not r.passed]
    assert lost.name == "random scores of shape (3, 7) (float16)"
    assert lost.message == half.problems[0]


def test_a_scored_report_keeps_its_public_path_and_pickles():
    # an autograder may store reports: their classes keep the public path
    report = checks.check_softmax(softmax_naive)
    assert type(report.results[0]) is checks.CheckResult
    assert repr(report.results[0]).startswith("CheckResult(name='scores [1, 0.5")
    assert checks.CheckResult.__module__ == "softmaxbook.checks"
    again = pickle.loads(pickle.dumps(report))
    assert again == report and again.score == report.score < again.max_score
    assert checks.CheckResult("x", False, 2.5).score == 0
    assert checks.CheckResult("x", True, 2.5).score == 2.5


def test_a_stopped_check_still_scores_the_inputs_it_passes():
    # Wrong on the first, simplest input alone: the report shows that problem,
    # and the score counts every other check, which still ran.
    def fails_on_vectors(x):
        if x.dim() == 1:
            raise IndexError("tuple index out of range")
        return torch.softmax(x, dim=-1)

    report = checks.check_softmax(fails_on_vectors)
    assert len(report.problems) == 2 and report.checked == []
    assert report.problems[1] == (
        "The other checks are not reported: fix the problem above first."
    )
    failed = {r.name for r in report.results if not r.passed}
    assert failed == {
        "scores [1, 0.5, 2.5, -0.1] (float64)",
        "random scores of shape (6,) (float64)",
        "scores [1000, 0] (float64, overflow)",
        "scores [1000, 0] (float32, overflow)",
        "scores [-1000, -1000] (float64, underflow)",
        "scores [-1000, -1000] (float32, underflow)",
        "scores [0, -inf, 1] (float64, a score of -inf)",
        "scores [0, -inf, 1] (float32, a score of -inf)",
    }
    assert report.score == report.max_score - len(failed) > 0


def test_a_wrong_forward_fails_the_gradient_check_too():
    report = checks.check_softmax(softmax_dim0)
    gradient = next(r for r in report.results if r.name.endswith(": the gradient"))
    assert not gradient.passed
    assert "the gradient of your softmax was not checked" in gradient.message
    assert gradient.message not in report.problems  # a verdict, not a problem
    report = checks.check_softmax(softmax_no_grad)
    (lost,) = [r for r in report.results if not r.passed]
    assert lost.name.endswith(": the gradient")
    assert "not connected to its inputs in autograd" in lost.message


def test_report_lines_fit_a_notebook():
    """76 columns: a code cell of the website shows 77 at 1280 px."""
    for fn in (softmax_naive, softmax_in_place, softmax_dim0, softmax_stable):
        for line in str(checks.check_softmax(fn)).splitlines():
            assert len(line) <= 76, line


def test_the_instructors_page_names_the_checkers_as_they_are():
    """Each checker the instructors' page names exists, and so do the report's
    attributes it tells instructors to read."""
    page = (
        Path(__file__).resolve().parents[3] / "chapters" / "instructors.md"
    ).read_text()
    named = set(re.findall(r"`(check_\w+)`", page))
    assert named, "the page names no checker"
    assert named <= set(checks.__all__), sorted(named - set(checks.__all__))
    report = checks.check_softmax(softmax_stable)
    for attribute in re.findall(r"`report\.(\w+)", page):
        assert hasattr(report, attribute), attribute


def test_report_shows_readably_in_ipython():
    from IPython.lib.pretty import pretty

    report = checks.check_softmax(softmax_naive)
    assert pretty(report) == str(report)


def test_checkers_are_deterministic_and_leave_the_global_rng_alone():
    state = torch.get_rng_state()
    np_state = np.random.get_state()[1].copy()
    for fn in (softmax_naive, softmax_dim0, sparsemax_unsorted):
        checker = (
            checks.check_sparsemax if fn is sparsemax_unsorted else checks.check_softmax
        )
        first, second = checker(fn), checker(fn)
        assert first.problems == second.problems
    assert torch.equal(torch.get_rng_state(), state)
    assert np.array_equal(np.random.get_state()[1], np_state)


def test_the_lambda_gets_a_name():
    assert checks.check_softmax(lambda x: torch.softmax(x, -1)).function == "a lambda"


def test_public_api():
    for name in checks.__all__:
        assert getattr(sb.checks, name).__doc__
    assert "checks" in sb.__all__
    for name in checks.__all__:
        if name.startswith("check_"):
            assert "Examples" in getattr(checks, name).__doc__, name


def test_docstring_examples():
    failures, tried = doctest.testmod(checks, optionflags=doctest.ELLIPSIS)
    assert tried > 10 and failures == 0
