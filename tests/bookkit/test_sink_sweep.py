"""Chapter 10's stored attention-sink sweep is what bookkit.studies.sink_study makes.

``make experiments`` (the script ``experiments/sink_sweep.py``) trains five
attention variants with five seeds each (minutes on two cores) and stores them
in the package (``ss.load()`` reads ``bookkit/data/sink_sweep.json``);
chapter 10 reads that file and asserts its claims on it. These tests check
that the file still describes the module, that the task and the measurements
do what they say, that the script stores what ``load()`` reads, and re-train
runs to compare them with the file.

What is compared, and why. A run repeats bit for bit on one machine, but
another CPU adds the same floats in another order, and training amplifies the
difference: after 1000 steps the weights on ``<bos>`` agree to about two
digits. So every stored run is checked where no training has happened yet (the
held-out loss of the freshly initialized model, to 1e-3), and two runs are
re-trained in full (``slow``): the softmax run with seed 1 and its control
without ``<bos>``. They must reproduce the stored accuracies within 0.05 and
the weight of the sink head on the first token within 0.1, and each must keep
the claim the chapter makes of it (a sink head above 0.3; none above 0.1).
A change to the recipe, the task, the model or the library made without
re-running the script fails these.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import tomllib
from pathlib import Path

import pytest
import torch

import bookkit as bk
from bookkit.studies import sink_study as ss
from bookkit.studies.sweep import dumps

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stored():
    sweep = ss.load()
    return sweep, {(r["variant"], r["seed"]): r for r in sweep["runs"]}


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the threads the script trains with
    yield
    torch.set_num_threads(threads)


def test_the_file_describes_the_script(stored):
    sweep, runs = stored
    assert sweep["model"] == ss.CONFIG
    assert {k: v for k, v in sweep["recipe"].items() if k != "seeds"} == ss.TRAIN
    assert sweep["variants"] == ss.VARIANTS
    assert sweep["seeds"] == list(ss.SEEDS)
    assert sweep["task"]["keys"] == ss.K and sweep["task"]["tokens"] == ss.T
    assert set(runs) == {(v, s) for v in ss.VARIANTS for s in ss.SEEDS}


def test_the_task_answers_every_query():
    tokens, targets = ss.make_task(300, torch.Generator().manual_seed(3))
    assert (tokens[:, 0] == ss.BOS).all() and (targets[:, 0] == ss.IGNORE).all()
    for row, answers in zip(tokens.tolist(), targets.tolist()):
        stored_values = {}
        for token, target in zip(row[1:], answers[1:]):
            if token < ss.QUERY0:  # a store token: key and value
                key, value = divmod(token - 1, ss.V)
                assert stored_values.get(key, value) == value  # one value per key
                stored_values[key] = value
                assert target == ss.IGNORE
            else:
                key = token - ss.QUERY0
                expected = stored_values.get(key)
                assert target == (
                    ss.NONE if expected is None else ss.ANSWER0 + expected
                )
    none = targets == ss.NONE
    assert 0.3 < none.sum() / (targets >= 0).sum() < 0.9  # both kinds are common
    first, _ = ss.make_task(50, torch.Generator().manual_seed(3), bos=False)
    assert ((first[:, 0] > ss.BOS) & (first[:, 0] < ss.QUERY0)).all()


@pytest.mark.parametrize("variant", list(ss.VARIANTS))
def test_the_written_out_forward_pass_is_the_models(variant):
    model = ss.new_model(1, **ss.VARIANTS[variant])
    tokens, _ = ss.make_task(8, torch.Generator().manual_seed(4))
    ss.check_forward(model, tokens)  # raises if they differ
    # The ablations change what they say they change.
    with torch.no_grad():
        _, weights, _, _ = ss._forward(model, tokens)
        _, evicted, _, _ = ss._forward(model, tokens, "evict")
        zeroed = ss._forward(model, tokens, "zero value")[0]
    assert (evicted[:, :, 1:, 0] == 0).all() and (weights[:, :, 1:, 0] > 0).any()
    assert not torch.allclose(zeroed, model(tokens))
    with pytest.raises(ValueError, match="unknown ablation"):
        ss._forward(model, tokens, "drop")


def test_measure_reads_what_it_documents():
    model = ss.new_model(1, sinks=True)
    data = ss.make_task(64, torch.Generator().manual_seed(5))
    result = ss.measure(model, data)
    with torch.no_grad():
        _, weights = model(data[0], return_weights=True)
    none = data[1] == ss.NONE
    expected = weights[:, 0, 1][..., 0][none].mean()  # head 1, first token
    assert abs(result["bos_none"][1] - float(expected)) <= 1e-3 * float(expected)
    assert result["sink_logit"] == [0.0, 0.0]
    assert all(t < 1 for t in result["total_none"])  # the sink keeps some weight


def test_every_stored_run_starts_where_the_script_starts(stored):
    _, runs = stored
    data = {bos: ss.make_data(bos)[1] for bos in (True, False)}
    for (variant, seed), run in runs.items():
        model = ss.new_model(seed, **ss.VARIANTS[variant])
        held_out = data[ss.VARIANTS[variant].get("bos", True)]
        loss = bk.evaluate(model, held_out)["loss"]
        assert abs(loss - run["loss"][0]) < 1e-3, (variant, seed)


def _sink(run):
    return max(run["bos_none"])


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["softmax", "softmax, no <bos>"])
def test_a_retrained_run_matches_the_stored_one(stored, variant):
    _, runs = stored
    fresh, old = ss.run(variant, 1), runs[variant, 1]
    for key in ("accuracy_none", "accuracy_match"):
        assert abs(fresh[key] - old[key]) < 0.05, key
    assert abs(_sink(fresh) - _sink(old)) < 0.1
    if variant == "softmax":
        assert _sink(fresh) > 0.3
    else:
        assert _sink(fresh) < 0.1


def _script():
    path = ROOT / "experiments" / "sink_sweep.py"
    spec = importlib.util.spec_from_file_location("sink_sweep_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_script_writes_what_load_reads(stored, tmp_path, monkeypatch):
    """The command line stores the runs sweep() returns, in the stored format."""
    sweep, _ = stored
    script = _script()
    asked = []

    def fake_sweep(variants, seeds, workers):
        asked.append((tuple(variants), tuple(seeds), workers))
        return [r for r in sweep["runs"] if r["variant"] in variants]

    monkeypatch.setattr(ss, "sweep", fake_sweep)
    out = tmp_path / "sweep.json"
    assert script.main(["--workers", "1", "--out", str(out)]) == 0
    assert asked == [(tuple(ss.VARIANTS), ss.SEEDS, 1)]
    written = ss.load(out)
    assert {k: v for k, v in written.items() if k != "machine"} == {
        k: v for k, v in sweep.items() if k != "machine"
    }
    # The stored file is in the script's format, byte for byte (one run a line).
    assert dumps(sweep) == ss.DATA_FILE.read_text()
    script.main(["--workers", "1", "--out", str(out), "--variants", "gated"])
    assert {r["variant"] for r in ss.load(out)["runs"]} == {"gated"}
    assert list(ss.load(out)["variants"]) == ["gated"]


def test_the_sweep_ships_with_the_package():
    """pyproject's package data carries the file: chapter 10 runs installed."""
    assert ss.DATA_FILE.parent.name == "data"
    assert ss.DATA_FILE.parent.parent == Path(bk.__file__).resolve().parent
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["bookkit"]
    name = ss.DATA_FILE.relative_to(ss.DATA_FILE.parents[1]).as_posix()
    assert any(fnmatch.fnmatch(name, pattern) for pattern in patterns), patterns
