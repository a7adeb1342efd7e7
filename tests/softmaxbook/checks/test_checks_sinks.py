"""softmaxbook.checks.check_sink_softmax: the mistakes of a softmax with a sink logit
are caught with the message a student needs, and every correct version passes.

The mistakes: no shift (overflow), a shift by the largest score alone (overflow
when the sink is far above the scores, nan on a row of removed keys), the sink
left out (plain softmax), taken as 0 (softmax-off-by-one), with the wrong sign,
its weight returned, cut off from autograd, the dtype changed, the input
modified in place. Chapter 10's "implement it yourself" exercise uses this
checker.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import softmaxbook as sb
from softmaxbook import checks
from softmaxbook.checks._session import Session


def sink_correct(scores, sink):
    m = torch.maximum(scores.amax(dim=-1, keepdim=True), sink)
    e = torch.exp(scores - m)
    return e / (torch.exp(sink - m) + e.sum(dim=-1, keepdim=True))


def sink_by_concatenation(scores, sink):
    # The definition: softmax over [scores, sink], the sink's weight dropped.
    shape = torch.broadcast_shapes(scores.shape[:-1] + (1,), sink.shape)
    b = sink.expand(shape)
    s = scores.expand(*shape[:-1], scores.shape[-1])
    return torch.softmax(torch.cat([s, b], dim=-1), dim=-1)[..., :-1]


def sink_detached_shift(scores, sink):
    # Correct: the weights do not depend on the shift, so its gradient is not needed.
    m = torch.maximum(scores.amax(dim=-1, keepdim=True), sink).detach()
    e = torch.exp(scores - m)
    return e / (torch.exp(sink - m) + e.sum(dim=-1, keepdim=True))


def sink_numpy(scores, sink):
    m = np.maximum(scores.max(axis=-1, keepdims=True), sink)
    e = np.exp(scores - m)
    return e / (np.exp(sink - m) + e.sum(axis=-1, keepdims=True))


def sink_naive(scores, sink):
    e = torch.exp(scores)
    return e / (torch.exp(sink) + e.sum(dim=-1, keepdim=True))


def sink_shift_by_scores(scores, sink):
    m = scores.amax(dim=-1, keepdim=True)
    e = torch.exp(scores - m)
    return e / (torch.exp(sink - m) + e.sum(dim=-1, keepdim=True))


def sink_ignored(scores, sink):
    return torch.softmax(scores, dim=-1)


def sink_as_one(scores, sink):
    return sink_correct(scores, torch.zeros_like(sink))


def sink_negated(scores, sink):
    return sink_correct(scores, -sink)


def sink_weight_kept(scores, sink):
    b = sink.expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, b], dim=-1), dim=-1)


def sink_detached(scores, sink):
    return sink_correct(scores, sink.detach())


def sink_float32(scores, sink):
    return sink_correct(scores.float(), sink.float())


def sink_in_place(scores, sink):
    scores -= scores.amax(dim=-1, keepdim=True).clamp_min(0)
    return sink_correct(scores, sink)


SINK_MISTAKES = [
    (sink_naive, ["(overflow)", "[nan, 0, 0]", "m = max(b, max_j x_j)"]),
    (sink_shift_by_scores, ["row 1 all removed", "[nan, nan", "-inf - (-inf) = nan"]),
    (sink_ignored, ["the sink is missing", "e^b belongs in the denominator"]),
    (sink_as_one, ["softmax-off-by-one's weights", "as if every sink were 0"]),
    (sink_negated, ["the weights of the sink -b"]),
    (sink_weight_kept, ["returned shape (3, 5); expected (3, 4)", "sink's weight"]),
    (sink_detached, ["its gradient with respect to sink is missing"]),
    (sink_float32, ["returned float32; keep the input's dtype"]),
    (sink_in_place, ["changed its argument scores in place"]),
]


@pytest.mark.parametrize(
    "fn, fragments", SINK_MISTAKES, ids=lambda v: getattr(v, "__name__", "")
)
def test_sink_softmax_mistakes_are_caught(fn, fragments):
    report = checks.check_sink_softmax(fn)
    text = " ".join(" ".join(report.problems).split())
    assert not report.ok and not report
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in the report:\n{report}"


@pytest.mark.parametrize(
    "fn",
    [sb.sink_softmax, sink_correct, sink_by_concatenation, sink_detached_shift],
    ids=lambda v: v.__name__,
)
def test_correct_sink_softmaxes_pass(fn):
    report = checks.check_sink_softmax(fn)
    assert report.ok, str(report)
    assert "the gradients with respect to the scores and the sink" in str(report)


def test_numpy_sink_softmax():
    report = checks.check_sink_softmax(sink_numpy, numpy=True)
    assert report.ok, str(report)
    assert (
        report.checked[-1] == "not checked with numpy=True: the gradient and the device"
    )
    assert "bfloat16" not in str(report)


def test_the_gradient_check_can_be_left_out():
    report = checks.check_sink_softmax(sink_detached, gradient=False)
    assert report.ok, str(report)
    assert "autograd" not in str(report)


def _raises(*args):
    raise ZeroDivisionError("division by zero")


def _not_implemented(*args):
    raise NotImplementedError("write your function here")


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (_raises, "raised ZeroDivisionError: division by zero"),
        (lambda s, b: [0.25] * 4, "returned a list"),
        (lambda s, b: None, "did you forget the return statement?"),
        (lambda s, b: s.sum(-1), "returned shape (3,); expected (3, 4)"),
        (_not_implemented, "the stub still raises NotImplementedError"),
        (lambda s, b: torch.zeros(s.shape, dtype=torch.long), "of dtype int64"),
    ],
)
def test_broken_functions_become_problems(fn, fragment):
    report = checks.check_sink_softmax(fn)
    text = " ".join(" ".join(report.problems).split())
    assert fragment in text, text
    assert report.problems[-1] == (
        "The other checks are not reported: fix the problem above first."
    )


def test_the_device_check_runs_when_asked(monkeypatch):
    calls = []
    original = Session.on_device

    def counted(self, *args, **kwargs):
        calls.append(self.device)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Session, "on_device", counted)
    assert checks.check_sink_softmax(sink_correct, device="cpu").ok
    assert calls == [torch.device("cpu")]
    report = checks.check_sink_softmax(lambda s, b: sink_correct(s, b).to("meta"))
    assert "returned a tensor on meta" in " ".join(report.problems)


def test_reports_fit_a_notebook_and_repeat():
    state = torch.get_rng_state()
    for fn, _ in SINK_MISTAKES:
        report = checks.check_sink_softmax(fn)
        assert report.problems == checks.check_sink_softmax(fn).problems
        for line in str(report).splitlines():
            assert len(line) <= 76, line
    assert torch.equal(torch.get_rng_state(), state)


def test_public_api():
    assert "check_sink_softmax" in checks.__all__
    assert "Examples" in checks.check_sink_softmax.__doc__
    assert sb.checks.check_sink_softmax is checks.check_sink_softmax
