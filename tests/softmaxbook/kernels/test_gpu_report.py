"""The Triton kernels compiled ahead of time for real GPUs (``make gpu-report``).

The stored report (``lib/bookkit/data/gpu_report.json``, what the kernels page shows)
must cover every kernel, architecture, dtype and head dimension and show no register
spill and no block over its architecture's shared memory; and a fresh compile of a
representative subset, here and now, must give the same binaries' figures, so the
stored report cannot drift from the kernels. The compile runs in a subprocess: it
needs Triton's real compiler, while this process runs the kernels in Triton's
interpreter.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
STORED = ROOT / "lib" / "bookkit" / "data" / "gpu_report.json"
TOOL = ROOT / "tools" / "gpu_report.py"

ARCHS = ("sm_80", "sm_90", "sm_100")
DTYPES = ("float16", "bfloat16", "float32")
HEAD_DIMS = (64, 128)
ATTENTION = ("flash_fwd", "flash_bwd_dkdv", "flash_bwd_dq")
# Shared memory one block may use (bytes): 163 KiB on A100 (sm_80), 227 KiB on H100
# (sm_90) and B200 (sm_100), as NVIDIA's tuning guides and CUTLASS's arch.h state.
SHARED_LIMIT = {"sm_80": 163 * 1024, "sm_90": 227 * 1024, "sm_100": 227 * 1024}
# What a fresh compile must reproduce exactly.
# (Not the total instruction count: ptxas-blackwell's scheduling of the same PTX can
# differ slightly between runs, as the report's ptxas_same_code field shows.)
COMPARED = ("registers", "spills", "shared_bytes", "mma", "mufu_ex2")


def _nvidia_tools() -> bool:
    spec = importlib.util.find_spec("triton")
    if spec is None or spec.origin is None:
        return False
    bin_dir = Path(spec.origin).parent / "backends" / "nvidia" / "bin"
    return all((bin_dir / t).exists() for t in ("ptxas", "cuobjdump"))


needs_compiler = pytest.mark.skipif(
    not _nvidia_tools(), reason="needs Triton with its NVIDIA backend (ptxas)"
)


def _key(r: dict) -> tuple:
    return (r["kernel"], r["arch"], r["dtype"], r["head_dim"] or r["n_cols"])


def _problems(records: list[dict]) -> list[str]:
    out = []
    for r in records:
        name = " ".join(str(x) for x in _key(r))
        if r["spills"] or r["local_loads"] or r["local_stores"]:
            out.append(f"{name}: spills {r['spills']} bytes")
        shared = r["shared_bytes"] + r["static_shared_bytes"]
        if shared > SHARED_LIMIT[r["arch"]]:
            out.append(f"{name}: {shared} bytes of shared memory")
        if r["registers"] > 255:
            out.append(f"{name}: {r['registers']} registers")
    return out


@pytest.fixture(scope="module")
def stored() -> dict:
    return json.loads(STORED.read_text())


def test_stored_report_covers_every_kernel(stored):
    keys = {_key(r) for r in stored["records"]}
    archs = [a for a in ARCHS if a not in stored.get("unsupported_archs", [])]
    assert archs[:2] == ["sm_80", "sm_90"]
    for arch in archs:
        for dtype in DTYPES:
            for d in HEAD_DIMS:
                for kernel in ATTENTION:
                    assert (kernel, arch, dtype, d) in keys
            assert any(k[:3] == ("softmax", arch, dtype) for k in keys)


def test_stored_report_has_no_spill_and_fits_shared_memory(stored):
    assert stored["shared_limit_bytes"] == SHARED_LIMIT
    assert _problems(stored["records"]) == []


def test_half_precision_runs_on_the_tensor_cores(stored):
    """float16 and bfloat16 products are tensor-core MMAs on every architecture;
    float32 (launched with exact "ieee" products) uses none."""
    expected = {"sm_80": "HMMA", "sm_90": "HGMMA", "sm_100": "UTC"}
    for r in stored["records"]:
        if r["kernel"] == "softmax":
            assert r["mma"] == 0
        elif r["dtype"] == "float32":
            assert r["mma"] == 0 and r["ffma"] > 0
        else:
            assert r["mma"] > 0
            assert all(op.startswith(expected[r["arch"]]) for op in r["mma_ops"])
        assert r["mufu_ex2"] > 0  # the exponentials run on the special-function unit


def test_checker_catches_a_spill_and_a_full_block():
    ok = {
        "kernel": "flash_fwd", "arch": "sm_80", "dtype": "float16", "head_dim": 128,
        "n_cols": None, "registers": 200, "spills": 0, "local_loads": 0,
        "local_stores": 0, "shared_bytes": 160 * 1024, "static_shared_bytes": 0,
    }  # fmt: skip
    assert _problems([ok]) == []
    assert _problems([{**ok, "spills": 8, "local_stores": 1}])
    assert _problems([{**ok, "shared_bytes": 164 * 1024}])
    assert _problems([{**ok, "arch": "sm_90", "shared_bytes": 164 * 1024}]) == []
    # float32 too: its exact products on the FMA units may not spill either
    assert _problems([{**ok, "dtype": "float32", "spills": 8, "local_loads": 1}])
    assert _problems([{**ok, "dtype": "float32", "local_stores": 1}])


@needs_compiler
def test_fresh_compile_matches_the_stored_report(stored, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")  # compile, do not reuse
    out = tmp_path / "subset.json"
    run = subprocess.run(
        [sys.executable, str(TOOL), "--subset", "--jobs", "1", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    fresh = json.loads(out.read_text())
    assert fresh["versions"] == stored["versions"], (
        "Triton or ptxas changed since the report was stored: `make gpu-report`"
    )
    assert _problems(fresh["records"]) == []
    by_key = {_key(r): r for r in stored["records"]}
    assert len(fresh["records"]) >= 7
    assert any(r["dtype"] == "float32" for r in fresh["records"])
    for r in fresh["records"]:
        old = by_key[_key(r)]
        assert {f: r[f] for f in COMPARED} == {f: old[f] for f in COMPARED}, (
            f"{_key(r)} compiles differently from the stored report: `make gpu-report`"
        )


def test_launch_config_states_what_the_report_compiled(stored):
    """What ``flash_launch_config`` tells a diagram (the forward kernel's launch, or
    with ``backward=True`` the backward kernels') is what the report compiled."""
    import torch

    from softmaxbook import kernels

    pytest.importorskip("triton")
    for r in stored["records"]:
        if r["kernel"] == "softmax":
            continue
        config = kernels.flash_launch_config(
            r["head_dim"],
            getattr(torch, r["dtype"]),
            backward=r["kernel"] != "flash_fwd",
        )
        name = " ".join(str(x) for x in _key(r))
        assert config["num_stages"] == r["num_stages"], name
        assert config["num_warps"] == r["num_warps"], name
