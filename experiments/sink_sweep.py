"""Re-run chapter 10's attention-sink sweep and store it in the package.

Trains every variant of :mod:`bookkit.studies.sink_study` with every seed
(minutes on two cores, one thread per worker process) and writes the result
to ``lib/bookkit/data/sink_sweep.json``, which chapter 10 plots and
asserts on and ``tests/bookkit/test_sink_sweep.py`` partly re-checks. Run it after any
change to the task, the recipe, the model or the training code
(``make experiments`` runs it with chapter 9's sweep)::

    python experiments/sink_sweep.py --workers 2
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

import torch

from bookkit.studies import sink_study as ss
from bookkit.studies.sweep import dumps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--out", type=Path, default=ss.DATA_FILE)
    variants = list(ss.VARIANTS)
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=variants,
        default=variants,
        metavar="NAME",
        help="which variants (default all)",
    )
    args = parser.parse_args(argv)
    runs = ss.sweep(args.variants, ss.SEEDS, workers=args.workers)
    record = {
        "description": "Chapter 10's attention-sink experiment "
        "(experiments/sink_sweep.py)",
        "task": {
            "keys": ss.K,
            "values": ss.V,
            "tokens": ss.T,
            "p_store": ss.P_STORE,
            "data_seed": ss.DATA_SEED,
            "n_train": ss.N_TRAIN,
            "n_test": ss.N_TEST,
        },
        "model": ss.CONFIG,
        "recipe": {**ss.TRAIN, "seeds": "model: s, minibatches: s + 1"},
        "variants": {v: ss.VARIANTS[v] for v in args.variants},
        "seeds": list(ss.SEEDS),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "torch_cpu_kernels": torch.backends.cpu.get_cpu_capability(),
            "threads_per_run": 1,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "cores": os.cpu_count(),
        },
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(dumps(record))
    print(f"wrote {len(runs)} runs to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
