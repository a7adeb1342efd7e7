"""time_call and machine_info: what a chapter's timing cell prints."""

from __future__ import annotations

import os
import time

import pytest
import torch

import bookkit as bk


def test_time_call_measures_the_call_not_the_warmup():
    calls = []

    def work(seconds):
        calls.append(seconds)
        time.sleep(seconds)

    elapsed = bk.time_call(work, 0.02, repeats=3, warmup=2)
    assert len(calls) == 2 + 1 + 3  # warm-up, the estimate of one call, the runs
    assert 0.015 < elapsed < 0.5  # a 20 ms sleep, on any machine


def test_time_call_statistics():
    durations = iter([0.0, 0.03, 0.03, 0.01, 0.05])  # warm-up, estimate, three runs
    fast = bk.time_call(
        lambda: time.sleep(next(durations)), repeats=3, statistic="min", min_seconds=0
    )
    assert 0.005 < fast < 0.025


def test_time_call_passes_arguments():
    seen = {}
    bk.time_call(lambda a, b: seen.update(a=a, b=b), 1, 2, repeats=1, min_seconds=0)
    assert seen == {"a": 1, "b": 2}


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"repeats": 0}, ValueError, "repeats"),
        ({"repeats": 2.0}, TypeError, "repeats"),
        ({"warmup": -1}, ValueError, "warmup"),
        ({"warmup": True}, TypeError, "warmup"),
        ({"statistic": "mean"}, ValueError, "statistic"),
        ({"threads": 0}, ValueError, "threads"),
        ({"min_seconds": -1.0}, ValueError, "min_seconds"),
        ({"min_seconds": "1"}, TypeError, "min_seconds"),
    ],
)
def test_time_call_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        bk.time_call(lambda: None, **kwargs)


def test_time_call_repeats_fast_calls_within_a_run():
    calls = []
    per_call = bk.time_call(
        lambda: calls.append(1), repeats=2, warmup=0, min_seconds=0.005
    )
    assert len(calls) > 100  # each run lasted about 5 ms of tiny calls
    assert per_call < 1e-4


def test_time_call_sets_and_restores_threads():
    before = torch.get_num_threads()
    seen = []
    bk.time_call(lambda: seen.append(torch.get_num_threads()), threads=1, min_seconds=0)
    assert set(seen) == {1} and torch.get_num_threads() == before


def test_time_call_needs_a_callable():
    with pytest.raises(TypeError, match="fn must be callable"):
        bk.time_call(torch.ones(2))


def test_machine_info_names_cores_and_threads():
    line = bk.machine_info()
    assert f"{os.cpu_count()} logical cores" in line
    assert f"torch {torch.__version__}" in line
    assert f"{torch.get_num_threads()} thread" in line
