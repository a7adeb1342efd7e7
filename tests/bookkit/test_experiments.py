"""Chapter 9's stored seed sweep is what bookkit.studies.case_study makes.

``make experiments`` trains every variant of the case study with ten seeds
(minutes on two cores) and stores it in the package (``cs.load()`` reads it);
chapter 9 plots that file and asserts its claims on it. These tests re-run
part of the sweep and compare it with the file, so that the claims are
re-checked against fresh training wherever the tests run.

What is compared, and why. A run is repeatable bit for bit on one machine,
but another CPU, thread count or kernel path adds the same floats in another
order: the curves then differ from the stored ones from about the third
digit on (0.376 against 0.371 for one run here), and a run that is still
climbing when the budget ends, or is in the middle of its jump at an
evaluation, can land on the other side of a threshold (one run here read
0.95 at step 300 on one configuration and 0.88 on another). Comparing every
digit would fail everywhere but on the machine that wrote the file;
comparing the outcome of every run would be flaky. So:

* The file describes the script: the same recipe, variants and seeds.
* The statistics at initialization of *every* run (saturation, entropy,
  exact zeros) come from one forward pass of a seeded model, no training:
  they must agree to 2e-3 (float32 rounding moves them far less; one row
  crossing the saturation level moves the saturation by 1/4000).
* Four runs are re-trained. They cover the outcomes the chapter
  reports: the softmax run the chapter shows (it solves the task), a run
  without the scale and a run at T = 0.1 (both stay on the plateau), and a
  control that the small initialization rescues (it solves the task). They
  were chosen among the runs whose outcome did not change when they were
  repeated under the two other CPU configurations of ``make test-portable``
  (``default:1`` and ``avx2``); there, their accuracies moved by at most
  0.012, and the step at which they reached 95% did not move. Each must
  match the stored run: the first three evaluations (steps 0 to 100, before
  any jump) and the final accuracy within 0.05, the final accuracy on the
  same side of 95%, and the first step at 95% within one evaluation (50
  steps), or never in both. Before any chaos can grow, they must agree
  closely: the held-out loss at step 0 (a forward pass) to 1e-3, and the
  held-out loss and mean attention entropy at step 50 to 0.01 (they agreed
  to 4 digits across the three configurations; another seed moves the loss
  at step 50 by 0.01 to 0.1). A recipe, seed, model or library change made
  without ``make experiments`` fails these; so does a broken training loop.

  The softmax run is trained in full by chapter 9 itself (its seed-1 run,
  under strict nbval in ``make test``), whose claim cell after the training
  ("Seed 1 ends above 99% held-out accuracy, trained here and in the stored
  sweep, ...") asserts the rest on it: final accuracy at least 0.99 there
  and in the stored run (so within 0.05 and on the same side of 95%), the
  first step at 95% within 50 steps of the stored one, and the first four
  accuracies within 0.05. Here it is trained for its first 50 steps only,
  on the full run's learning-rate schedule, for the checks the chapter does
  not make: the held-out loss at steps 0 and 50 and the entropy at step 50.

The outcomes of the runs near a threshold are not re-checked; the chapter
reports them as what its stored sweep shows, and draws its conclusions from
what holds across seeds.
"""

from __future__ import annotations

import inspect

import pytest
import torch

import bookkit as bk
import softmaxbook as sb
from bookkit.studies import case_study as cs
from bookkit.studies import training

# (variant, seed): re-trained in full and compared with the stored run.
# ("softmax", 1) is trained in full by chapter 9: its first 50 steps are checked below.
RERUN = [
    ("unscaled", 1),
    ("T = 0.1", 1),
    ("unscaled, small init", 1),
]


@pytest.fixture(scope="module")
def stored():
    sweep = cs.load()
    return sweep, {(r["variant"], r["seed"]): r for r in sweep["runs"]}


@pytest.fixture(scope="module")
def data():
    return cs.make_data()


@pytest.fixture(autouse=True)
def _one_thread():
    # The sweep trains with one thread and deterministic kernels; so does this.
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)


def test_the_file_describes_the_script(stored):
    sweep, runs = stored
    assert sweep["variants"] == cs.VARIANTS
    assert sweep["seeds"] == list(cs.SEEDS) and len(cs.SEEDS) >= 5
    every = cs.TRAIN["eval_every"]
    assert sweep["steps"] == list(range(0, cs.TRAIN["steps"] + 1, every))
    recipe = sweep["recipe"]
    assert all(recipe[k] == v for k, v in {**cs.CONFIG, **cs.TRAIN}.items())
    assert (recipe["n_pairs"], recipe["n_keys"], recipe["n_values"]) == (
        cs.N_PAIRS,
        cs.N_KEYS,
        cs.N_VALUES,
    )
    assert (recipe["data_seed"], recipe["n_train"], recipe["n_test"]) == (
        cs.DATA_SEED,
        cs.N_TRAIN,
        cs.N_TEST,
    )
    assert set(runs) == {(v, s) for v in cs.VARIANTS for s in cs.SEEDS}
    for run in runs.values():
        n_records = len(sweep["steps"])
        assert len(run["accuracy"]) == len(run["entropy"]) == n_records


def test_initial_statistics_of_every_run(stored, data):
    _, runs = stored
    tokens = data[1][0]
    for (variant, seed), run in runs.items():
        fresh = cs.init_statistics(variant, seed, tokens)
        for key in ("init_saturation", "init_entropy", "init_zeros"):
            assert fresh[key] == pytest.approx(run[key], abs=2e-3), (variant, seed, key)


@pytest.mark.parametrize("variant, seed", RERUN)
def test_a_rerun_agrees_with_the_stored_run(stored, data, variant, seed):
    _, runs = stored
    old, new = runs[variant, seed], cs.run(variant, seed, data)
    # Step 0 is a forward pass; after 50 steps the float differences between
    # CPUs have not grown yet (they agreed to 4 digits), while another seed
    # or recipe moves the held-out loss by 0.01 to 0.1.
    assert new["loss"][0] == pytest.approx(old["loss"][0], abs=1e-3)
    assert new["loss"][1] == pytest.approx(old["loss"][1], abs=0.01)
    assert new["entropy"][1] == pytest.approx(old["entropy"][1], abs=0.01)
    early = zip(new["accuracy"][:3], old["accuracy"][:3])
    assert max(abs(a - b) for a, b in early) <= 0.05, (new["accuracy"], old["accuracy"])
    assert new["final_accuracy"] == pytest.approx(old["final_accuracy"], abs=0.05)
    assert (new["final_accuracy"] >= cs.SOLVED) == (old["final_accuracy"] >= cs.SOLVED)
    if old["step95"] is None:
        assert new["step95"] is None
    else:
        assert new["step95"] is not None
        assert abs(new["step95"] - old["step95"]) <= 50


class _Stopped(Exception):
    pass


def _after_first_steps(variant, seed, data, steps):
    """The model ``cs.run(variant, seed, data)`` trains, after its first ``steps``
    optimizer steps: the run is stopped there, not shortened, so the learning rate
    follows the full run's schedule."""
    model = cs.new_model(seed, **cs.VARIANTS[variant])
    calls = 0

    def stop_before_the_next_step(module, args):
        nonlocal calls
        if module.training and torch.is_grad_enabled():  # a training step's forward
            calls += 1
            if calls > steps:
                raise _Stopped

    handle = model.register_forward_pre_hook(stop_before_the_next_step)
    with pytest.raises(_Stopped):
        cs.fit(model, data, seed)
    handle.remove()
    return model


def test_the_first_steps_of_the_chapters_run_agree_with_the_stored_run(stored, data):
    """Chapter 9's run (softmax, seed 1), which the chapter trains in full and checks
    against the stored one, here at steps 0 and 50 as the re-trained runs above."""
    _, runs = stored
    old = runs["softmax", 1]
    fresh = cs.new_model(1, **cs.VARIANTS["softmax"])
    test = data[1]
    assert bk.evaluate(fresh, test)["loss"] == pytest.approx(old["loss"][0], abs=1e-3)
    every = cs.TRAIN["eval_every"]
    model = _after_first_steps("softmax", 1, data, every)
    assert bk.evaluate(model, test)["loss"] == pytest.approx(old["loss"][1], abs=0.01)
    # The entropy fit records: on its probe, the first held-out sequences.
    probe = inspect.signature(training.train).parameters["probe_size"].default
    model.eval()
    with torch.no_grad():
        _, weights = model(test[0][:probe], return_weights=True)
    entropy = float(sb.attention_entropy(weights).mean())
    assert entropy == pytest.approx(old["entropy"][1], abs=0.01)
