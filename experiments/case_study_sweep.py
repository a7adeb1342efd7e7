"""Re-run chapter 9's seed sweep and store it in the package: ``make experiments``.

Trains every variant of :mod:`bookkit.studies.case_study` with every seed
(minutes on two cores, one thread per worker process) and writes the result
to ``lib/bookkit/data/case_study_sweep.json``, which chapter 9 plots and
asserts on and ``tests/bookkit/test_experiments.py`` partly re-checks. Run it after
any change to the recipe, the model or the training code::

    python experiments/case_study_sweep.py --workers 2
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

import torch

from bookkit.studies import case_study as cs
from bookkit.studies.sweep import dumps
from bookkit.timing import machine_info


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    seeds_help = f"how many of the seeds {cs.SEEDS} (default all)"
    parser.add_argument("--seeds", type=int, default=len(cs.SEEDS), help=seeds_help)
    variants = list(cs.VARIANTS)
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=variants,
        default=variants,
        metavar="NAME",
        help="which variants (default all)",
    )
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--out", type=Path, default=cs.DATA_FILE)
    args = parser.parse_args(argv)
    seeds = cs.SEEDS[: args.seeds]
    runs = cs.sweep(args.variants, seeds, workers=args.workers)
    record = {
        "description": "Chapter 9's seed sweep (bookkit.studies.case_study)",
        "recipe": dict(
            n_pairs=cs.N_PAIRS,
            n_keys=cs.N_KEYS,
            n_values=cs.N_VALUES,
            data_seed=cs.DATA_SEED,
            n_train=cs.N_TRAIN,
            n_test=cs.N_TEST,
            **cs.CONFIG,
            **cs.TRAIN,
            probe=cs.PROBE,
            saturated=cs.SATURATED,
            seeds="model: s, minibatches: s + 1",
        ),
        "variants": {v: cs.VARIANTS[v] for v in args.variants},
        "seeds": list(seeds),
        "steps": list(range(0, cs.TRAIN["steps"] + 1, cs.TRAIN["eval_every"])),
        "machine": {
            "description": machine_info(),
            "torch_cpu_kernels": torch.backends.cpu.get_cpu_capability(),
            "threads_per_run": 1,
            "python": platform.python_version(),
        },
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(dumps(record))
    print(f"wrote {len(runs)} runs to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
