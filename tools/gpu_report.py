"""Compile softmaxbook's Triton kernels ahead of time for real GPUs, on any machine.

    python tools/gpu_report.py            # every kernel, arch, dtype, head dim
    python tools/gpu_report.py --subset   # the representative subset the test uses
    python tools/gpu_report.py --time     # on a CUDA machine: also time them

No GPU is needed to compile: ``triton.compile`` lowers each kernel to PTX and Triton's
own ``ptxas`` assembles it into the cubin that a GPU of that architecture would load.
The report reads that binary: the register count and the shared memory from the
cubin (``cuobjdump -res-usage``) and Triton's metadata, the spills from ``ptxas -v``
run again on the same PTX with Triton's flags (its register count must equal the
cubin's; ``ptxas_same_code`` records whether its SASS is identical, which
ptxas-blackwell does not always reproduce), and instruction counts from the SASS
(``cuobjdump -sass``): tensor-core MMAs (HMMA on sm_80, HGMMA = wgmma on sm_90,
UTC*MMA = tcgen05.mma on sm_100), MUFU.EX2 (the hardware exp2), FFMA, and the
local-memory loads and stores that spills turn into.

Each kernel is compiled exactly as the library launches it: the library's launcher
(``softmaxbook.kernels._triton``) is called on small CPU tensors with the kernel's
``run`` replaced by a recorder, so the block sizes, ``num_warps``, ``num_stages``, the
constexprs and the argument specialization (alignment, strides equal to 1) are the
ones a real launch on contiguous tensors would use.

Writes ``_build/gpu-report.json`` (``--out``) and, with ``--store``, the book's copy
``lib/bookkit/data/gpu_report.json``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

# The kernels must be real JIT functions, not the interpreter's stand-ins.
os.environ.pop("TRITON_INTERPRET", None)

ROOT = Path(__file__).resolve().parents[1]
STORED = ROOT / "lib" / "bookkit" / "data" / "gpu_report.json"
sys.path.insert(0, str(ROOT / "lib"))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

from softmaxbook.kernels import _triton as K  # noqa: E402

ARCHS = (80, 90, 100)
DTYPES = ("float16", "bfloat16", "float32")
HEAD_DIMS = (64, 128)
# The fused row softmax has no head dimension: it is compiled for score rows of these
# lengths (each picks its own BLOCK and num_warps in the launcher).
SOFTMAX_COLS = (1024, 16384)
# The attention kernels for one sequence length (divisible by 16, as most are), causal:
# the variant language models use. ``--variants all`` adds no mask and a boolean mask.
SEQ = 1024
VARIANTS = {
    "causal": {"causal": True, "mask": False},
    "plain": {"causal": False, "mask": False},
    "mask": {"causal": False, "mask": True},
    "causal+mask": {"causal": True, "mask": True},
}
KERNELS = ("softmax", "flash_fwd", "flash_bwd_dkdv", "flash_bwd_dq")
_JIT = {
    "softmax": "_softmax_kernel",
    "flash_fwd": "_flash_attention_kernel",
    "flash_bwd_dkdv": "_flash_attention_dkdv_kernel",
    "flash_bwd_dq": "_flash_attention_dq_kernel",
}

# Shared memory one block may use (opt-in dynamic maximum), in bytes: 163 KiB on
# sm_80 (A100), 227 KiB on sm_90 (H100) and sm_100 (B200). NVIDIA's tuning guides
# for Ampere, Hopper and Blackwell; CUTLASS's cutlass/arch/arch.h writes the last two
# as sm90/sm100_smem_capacity_bytes = 232448.
SHARED_LIMIT = {80: 163 * 1024, 90: 227 * 1024, 100: 227 * 1024}
REGISTER_LIMIT = 255  # per thread, every architecture here

# The subset the test compiles (about a quarter of a minute per record on a slow
# core): the kernel with the most live state (dK and dV for a key block) and the
# forward, at the larger head dimension, fp16, on every architecture; and the float32
# forward at head dim 64 on sm_90, which spilled most (2,808 bytes) with 4 warps, before
# the launcher gave the float32 forward 16 warps.
SUBSET = [
    (k, a, "float16", 128, "causal")
    for k in ("flash_fwd", "flash_bwd_dkdv")
    for a in ARCHS
] + [("flash_fwd", 90, "float32", 64, "causal")]

_BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
_INSTR = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)")
_MMA = re.compile(r"^(HMMA|HGMMA|UTC\w*MMA)")


def _tool(name: str) -> str:
    path = _BIN / name
    if not path.exists():
        raise FileNotFoundError(f"{name} not found in Triton's {_BIN}")
    return str(path)


def _ptxas(arch: int) -> str:
    # Triton's own choice (backends/nvidia/compiler.py: get_ptxas).
    return _tool("ptxas-blackwell" if arch >= 100 else "ptxas")


def _gpu_name(arch: int) -> str:
    return f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"


def capture_launch(kernel: str, dtype: str, head_dim: int, variant: str) -> list:
    """Call the library's launcher on small CPU tensors and record what it passes to
    the kernel named ``kernel``: ``(jit_function, args, kwargs)``."""
    fn = getattr(K, _JIT[kernel])
    jits = [getattr(K, name) for name in _JIT.values()]
    seen: dict = {id(j): [] for j in jits}

    def recorder(jit: Any) -> Any:
        def record(*args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
            seen[id(jit)].append((args, kwargs))

        return record

    dt = getattr(torch, dtype)
    for jit in jits:  # an instance attribute: kernel[grid](...) calls self.run
        jit.run = recorder(jit)
    try:
        if kernel == "softmax":
            K.softmax(torch.zeros(2, head_dim, dtype=dt), -1)
        else:
            spec = VARIANTS[variant]
            q = torch.zeros(1, SEQ, head_dim, dtype=dt)
            keep = torch.ones(1, SEQ, SEQ, dtype=torch.bool) if spec["mask"] else None
            causal = (SEQ, 0) if spec["causal"] else None
            p = K.Flat(q, q.clone(), q.clone(), keep, causal, head_dim**-0.5)
            if kernel == "flash_fwd":
                K.flash_forward(p)
            else:
                lse = torch.zeros(1, SEQ)
                K.flash_backward(p, torch.zeros_like(q), lse, torch.zeros(1, SEQ))
    finally:
        for jit in jits:
            del jit.run
    seen = seen[id(fn)]
    if len(seen) != 1:
        raise RuntimeError(f"{kernel}: the launcher called it {len(seen)} times")
    return [fn, *seen[0]]


def _count(sass: str) -> collections.Counter:
    return collections.Counter(m.group(1) for m in _INSTR.finditer(sass))


def _machine_code(elf: bytes) -> tuple:
    """What ``cuobjdump -sass`` prints of a cubin, as bytes: the ELF header's flags
    (its ``.headerflags``) and each code section (``.text.<kernel>``), by name.
    A cubin is a 64-bit little-endian ELF file."""
    if elf[:5] != b"\x7fELF\x02":
        raise ValueError("not a 64-bit ELF file")

    def number(start: int, length: int) -> int:
        return int.from_bytes(elf[start : start + length], "little")

    shoff, flags, size, count, names = (
        number(40, 8), number(48, 4), number(58, 2), number(60, 2), number(62, 2)
    )  # fmt: skip

    def section(i: int) -> tuple[int, bytes]:
        header = shoff + i * size
        start, length = number(header + 24, 8), number(header + 32, 8)
        return number(header, 4), elf[start : start + length]

    strings = section(names)[1]
    code = []
    for i in range(count):
        offset, body = section(i)
        name = strings[offset : strings.index(b"\0", offset)].decode()
        if name.startswith(".text."):
            code.append((name, body))
    if not code:
        raise ValueError("no code section")
    return flags, sorted(code)


def compile_one(key: tuple) -> dict:
    """Compile one (kernel, arch, dtype, head_dim, variant) and read its binary."""
    kernel, arch, dtype, head_dim, variant = key
    fn, args, kwargs = capture_launch(kernel, dtype, head_dim, variant)
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    kwargs = {**kwargs, "debug": False}
    bound, spec, opts = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(
        backend, kwargs, bound, spec, opts
    )
    src = ASTSource(fn, signature, constexprs, attrs)
    compiled = triton.compile(src, target=target, options=options.__dict__)
    meta = compiled.metadata
    with tempfile.TemporaryDirectory() as tmp:
        ptx, cubin, again = (Path(tmp) / n for n in ("k.ptx", "k.cubin", "k2.cubin"))
        ptx.write_text(compiled.asm["ptx"])
        cubin.write_bytes(compiled.asm["cubin"])
        flags = ["-lineinfo", "-v", "--regAllocOptLevel=2"]
        if not options.enable_fp_fusion:
            flags.append("--fmad=false")
        run = subprocess.run(
            [_ptxas(arch), *flags, f"--gpu-name={_gpu_name(arch)}", str(ptx)]
            + ["-o", str(again)],
            capture_output=True,
            text=True,
            check=True,
        )
        res, sass = (
            subprocess.run(
                [_tool("cuobjdump"), flag, str(cubin)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            for flag in ("-res-usage", "-sass")
        )
        # ptxas-blackwell stamps a few bytes of the cubin per run: compare the machine
        # code, the bytes that the SASS disassembles (disassembling the second binary
        # too took as long as a third of the compile)
        same_binary = _machine_code(cubin.read_bytes()) == _machine_code(
            again.read_bytes()
        )
    log = run.stderr
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    stack = re.search(r"(\d+) bytes stack frame", log)
    regs_log = re.search(r"Used (\d+) registers", log)
    usage = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", res))
    ops = _count(sass)
    mma = {op: n for op, n in ops.items() if _MMA.match(op)}
    registers = int(usage["REG"])
    if regs_log is None or int(regs_log.group(1)) != registers or spill is None:
        raise RuntimeError(f"{key}: ptxas -v disagrees with the cubin:\n{log}")
    cx = {k[0]: v for k, v in constexprs.items()}
    names = list(fn.arg_names)
    const = {names[i]: v for i, v in cx.items() if names[i].isupper()}
    return {
        "kernel": kernel,
        "arch": f"sm_{arch}",
        "dtype": dtype,
        "head_dim": None if kernel == "softmax" else head_dim,
        "n_cols": head_dim if kernel == "softmax" else None,
        "variant": None if kernel == "softmax" else variant,
        "constexprs": const,
        "num_warps": meta.num_warps,
        "num_stages": meta.num_stages,
        "registers": registers,
        "spill_store_bytes": int(spill.group(1)),
        "spill_load_bytes": int(spill.group(2)),
        "spills": int(spill.group(1)) + int(spill.group(2)),
        "stack_bytes": int(stack.group(1)) if stack else 0,
        "shared_bytes": int(meta.shared),
        "static_shared_bytes": int(usage.get("SHARED", 0)),
        "shared_limit_bytes": SHARED_LIMIT[arch],
        "tmem_columns": int(getattr(meta, "tmem_size", 0) or 0),
        "mma": sum(mma.values()),
        "mma_ops": mma,
        "mufu_ex2": ops.get("MUFU.EX2", 0),
        "ffma": sum(n for op, n in ops.items() if op.startswith("FFMA")),
        "local_loads": sum(n for op, n in ops.items() if op.startswith("LDL")),
        "local_stores": sum(n for op, n in ops.items() if op.startswith("STL")),
        "instructions": sum(ops.values()),
        "ptxas_same_code": same_binary,
    }


def all_keys(variants: tuple[str, ...] = ("causal",)) -> list[tuple]:
    keys = [
        ("softmax", a, d, n, None) for a in ARCHS for d in DTYPES for n in SOFTMAX_COLS
    ]
    keys += [
        (k, a, d, h, v)
        for k in KERNELS[1:]
        for a in ARCHS
        for d in DTYPES
        for h in HEAD_DIMS
        for v in variants
    ]
    return keys


def problems(record: dict) -> list[str]:
    """What is wrong with one record: a spill, or shared memory over the limit."""
    out = []
    name = f"{record['kernel']} {record['arch']} {record['dtype']}"
    name += f" head_dim={record['head_dim']} {record['variant']}"
    spilled = record["spills"] or record["local_loads"] or record["local_stores"]
    if spilled:
        out.append(
            f"{name}: spills {record['spill_store_bytes']} B stored, "
            f"{record['spill_load_bytes']} B loaded"
        )
    if record["registers"] > REGISTER_LIMIT:
        out.append(f"{name}: {record['registers']} registers per thread")
    shared = record["shared_bytes"] + record["static_shared_bytes"]
    if shared > record["shared_limit_bytes"]:
        out.append(
            f"{name}: {shared} B of shared memory, over the "
            f"{record['shared_limit_bytes']} B a block may use"
        )
    return out


def _versions() -> dict:
    out = {"triton": triton.__version__, "torch": torch.__version__}
    for arch in (80, 100):
        text = subprocess.run(
            [_ptxas(arch), "--version"], capture_output=True, text=True
        ).stdout
        found = re.search(r"release ([\d.]+), V([\d.]+)", text)
        out[Path(_ptxas(arch)).name] = found.group(2) if found else text.strip()
    return out


def _compile_or_error(key: tuple) -> dict:
    try:
        return compile_one(key)
    except Exception as exc:  # an architecture this Triton cannot target
        return {"key": list(key), "error": f"{type(exc).__name__}: {exc}"[:500]}


def build(keys: list[tuple], jobs: int) -> dict:
    """Compile every key (``jobs`` processes) and assemble the report. A key whose
    compile fails is listed under ``unsupported`` with the error, not dropped."""
    t0 = time.perf_counter()
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            results = list(pool.map(_compile_or_error, keys))
    else:
        results = [_compile_or_error(k) for k in keys]
    failed = [r for r in results if "error" in r]
    bad_archs = sorted({f"sm_{r['key'][1]}" for r in failed})
    return {
        "generated_by": "tools/gpu_report.py (make gpu-report)",
        "versions": _versions(),
        "archs": [f"sm_{a}" for a in ARCHS if f"sm_{a}" not in bad_archs],
        "unsupported_archs": bad_archs,
        "unsupported": failed,
        "shared_limit_bytes": {f"sm_{a}": v for a, v in SHARED_LIMIT.items()},
        "seq_len": SEQ,
        "wall_s": round(time.perf_counter() - t0, 1),
        "records": [r for r in results if "error" not in r],
    }


def _bench_one(dtype: torch.dtype, d: int) -> dict:
    import torch.nn.functional as F
    from triton.testing import do_bench

    B, H, L = 4, 16, 4096
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(B, H, L, d, device="cuda", dtype=dtype, generator=g)
        for _ in range(3)
    )
    flat = K.Flat(*(t.reshape(B * H, L, d) for t in (q, k, v)), None, (L, 0), d**-0.5)
    out, lse = K.flash_forward(flat)
    go = torch.randn_like(out)
    delta = (go.float() * out.float()).sum(-1)
    qr, kr, vr = (t.detach().requires_grad_() for t in (q, k, v))
    o = F.scaled_dot_product_attention(qr, kr, vr, is_causal=True)
    g4 = go.reshape(B, H, L, d)
    x = torch.randn(B * H * 64, L, device="cuda", dtype=dtype)
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "head_dim": d,
        "shape_bhld": [B, H, L, d],
        "flash_fwd_ms": do_bench(lambda: K.flash_forward(flat)),
        "sdpa_fwd_ms": do_bench(
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
        ),
        "flash_bwd_ms": do_bench(lambda: K.flash_backward(flat, go, lse, delta)),
        "sdpa_bwd_ms": do_bench(
            lambda: torch.autograd.grad(o, (qr, kr, vr), g4, retain_graph=True)
        ),
        "softmax_ms": do_bench(lambda: K.softmax(x, -1)),
        "torch_softmax_ms": do_bench(lambda: torch.softmax(x, -1)),
    }


def time_kernels() -> list[dict]:
    """On a CUDA machine: the kernels against torch's SDPA and softmax, measured in
    the same run (median milliseconds of ``triton.testing.do_bench``), causal."""
    return [
        _bench_one(dt, d) for dt in (torch.float16, torch.bfloat16) for d in HEAD_DIMS
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "_build" / "gpu-report.json")
    ap.add_argument("--subset", action="store_true", help="the test's subset only")
    ap.add_argument("--variants", default="causal", help="comma list, or 'all'")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--store", action="store_true", help="also write the book's copy")
    ap.add_argument("--time", action="store_true", help="time the kernels on CUDA")
    a = ap.parse_args(argv)
    variants = tuple(VARIANTS) if a.variants == "all" else tuple(a.variants.split(","))
    keys = SUBSET if a.subset else all_keys(variants)
    report = build(keys, a.jobs)
    if a.time:
        if not torch.cuda.is_available():
            print("--time needs a CUDA device; compiled only", file=sys.stderr)
        else:
            report["device"] = torch.cuda.get_device_name()
            report["timings"] = time_kernels()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=1) + "\n")
    if a.store:  # the book's copy: no timings, so a rerun changes no byte
        book = {k: v for k, v in report.items() if k not in ("wall_s", "timings")}
        STORED.write_text(json.dumps(book, indent=1) + "\n")
    bad = [p for r in report["records"] for p in problems(r)]
    print(
        f"{len(report['records'])} kernels compiled in {report['wall_s']} s -> {a.out}"
    )
    for line in bad:
        print("PROBLEM:", line)
    for r in report["unsupported"]:
        print("NOT COMPILED:", *r["key"], r["error"].splitlines()[0])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
