"""Mutation testing by hand: break the library on purpose, check that a test fails.

Each mutant below is a small, plausible bug (a removed upcast, a flipped mask, a
dropped gradient term, a skipped max subtraction, an off-by-one threshold, a wrong
scale ...). For each, this script edits the library file, runs the tests that
should catch it (`pytest -x -m "not slow"`), records the first failing test, and
restores the file. A mutant that no test catches is reported as SURVIVED.

    .venv/bin/python tests/mutants.py          # every mutant (about 10 minutes)
    .venv/bin/python tests/mutants.py 1 13     # only mutants 1 and 13

Not collected by pytest (the name does not start with test_); run it after
changing a test's tolerance or a module's numerics.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
L = "lib/softmaxbook/"
B = "lib/bookkit/"  # the book's harness
FAST = ["-p", "no:nbval", "-o", "addopts=", "-q", "-x", "-m", "not slow"]

# (what the bug is, file, original text, mutated text, tests that should catch it)
M = [
    (
        "remove the float32 upcast of the normalizers' shared policy",
        L + "normalizers/_policy.py",
        "    elif upcast and x.dtype in HALF:",
        "    elif False:",
        ["test_normalizer_contract.py"],
    ),
    (
        "off-by-one in the sparse threshold (support counted from 0)",
        L + "normalizers/sparse.py",
        "    rho = torch.arange(1, v.shape[-1] + 1, dtype=v.dtype, device=v.device)  # (k,)",
        "    rho = torch.arange(0, v.shape[-1], dtype=v.dtype, device=v.device)  # (k,)",
        ["test_alternatives.py"],
    ),
    (
        "drop a term of the sparse maps' gradient",
        L + "normalizers/sparse.py",
        "    return wg - q * weight",
        "    return wg",
        ["test_alternatives.py"],
    ),
    (
        "skip the max subtraction in the NumPy reference softmax",
        L + "reference.py",
        "    e = np.exp(x - m)",
        "    e = np.exp(x)",
        ["test_reference.py"],
    ),
    (
        "temperature multiplies instead of divides",
        L + "normalizers/exponential.py",
        "    return x if temperature == 1.0 else x / temperature",
        "    return x if temperature == 1.0 else x * temperature",
        ["test_softmax.py"],
    ),
    (
        "off-by-one causal mask (a query cannot see itself)",
        L + "masking.py",
        "    return cols <= rows  # (L, S)",
        "    return cols < rows  # (L, S)",
        ["test_masking.py"],
    ),
    (
        "flip the mask in masked_softmax",
        L + "masking.py",
        '        scores = scores.masked_fill(~keep, float("-inf"))',
        '        scores = scores.masked_fill(keep, float("-inf"))',
        ["test_masking.py"],
    ),
    (
        "empty rows not zeroed after the normalizer",
        L + "_validate.py",
        "    return normalize(scores.masked_fill(empty, 0.0)).masked_fill(empty, 0.0)",
        "    return normalize(scores.masked_fill(empty, 0.0))",
        ["test_masking.py"],
    ),
    (
        "mask broadcast check removed",
        L + "_validate.py",
        "    if shape != scores.shape:",
        "    if shape is None:",
        ["test_checks_softmax.py", "test_masking.py"],
    ),
    (
        "wrong attention scale (scores scaled twice)",
        L + "attention/sdpa.py",
        "    scores = (q @ k.transpose(-2, -1)) * args.scale  # (..., L, S)",
        "    scores = (q @ k.transpose(-2, -1)) * args.scale**2  # (..., L, S)",
        ["test_attention.py"],
    ),
    (
        "online softmax forgets to rescale the running sum",
        L + "attention/online.py",
        "        d = d * alpha + p.sum(dim=-1, keepdim=True)",
        "        d = d + p.sum(dim=-1, keepdim=True)",
        ["test_online.py"],
    ),
    (
        "FlashAttention forward forgets to rescale the output",
        L + "attention/flash/_tiles.py",
        "            o.mul_(alpha).baddbmm_(pt, v[h0:h1, k0:k1])",
        "            o.baddbmm_(pt, v[h0:h1, k0:k1])",
        ["test_flash_forward.py"],
    ),
    (
        "drop the s.g term of the softmax VJP",
        L + "gradients.py",
        "    return (s_ * (g_ - dot)).to(out_dtype)",
        "    return (s_ * g_).to(out_dtype)",
        ["test_gradients.py"],
    ),
    (
        "remove the float32 upcast of softmax_backward",
        L + "gradients.py",
        "    work = torch.float32 if out_dtype in _LOW_PRECISION else out_dtype",
        "    work = out_dtype",
        ["test_gradients.py"],
    ),
    (
        "nucleus off by one token (mass counted inclusive)",
        L + "sampling/decoding.py",
        "mass_before = torch.cumsum(probs, dim=-1) - probs",
        "mass_before = torch.cumsum(probs, dim=-1)",
        ["test_sampling.py"],
    ),
    (
        "sample divides before upcasting",
        L + "sampling/decoding.py",
        "    z = logits.to(acc_dtype(logits.dtype))",
        "    z = logits",
        ["test_sampling.py"],
    ),
    (
        "ECE bins left-closed instead of right-closed",
        L + "sampling/calibration.py",
        "    idx = (torch.ceil(conf * n_bins) - 1).clamp(0, n_bins - 1).long()",
        "    idx = torch.floor(conf * n_bins).clamp(0, n_bins - 1).long()",
        ["test_sampling.py"],
    ),
    (
        "attention distance with the offset's sign flipped",
        L + "analysis.py",
        "    queries = torch.arange(L, device=weights.device, dtype=weights.dtype) + offset",
        "    queries = torch.arange(L, device=weights.device, dtype=weights.dtype) - offset",
        ["test_analysis.py"],
    ),
    (
        "recall targets taken from the wrong pair",
        L + "models/data.py",
        "    query, targets = keys[rows, which], values[rows, which]",
        "    query, targets = keys[rows, which], values[rows, (which + 1) % n_pairs]",
        ["test_models.py"],
    ),
    (
        "model temperature multiplies the scores",
        L + "models/transformer.py",
        '        self.score_scale = base / check_positive(temperature, "temperature")',
        '        self.score_scale = base * check_positive(temperature, "temperature")',
        ["test_models.py"],
    ),
    (
        "loss scored at the first position instead of the last",
        B + "studies/training.py",
        "        logits = logits[:, -1]  # (N, V)",
        "        logits = logits[:, 0]  # (N, V)",
        ["test_training.py"],
    ),
    (
        "dispatch sends gradient-needing softmax calls to the forward-only kernel",
        L + "kernels/dispatch.py",
        '    if needs_grad and op == "softmax":',
        "    if False:",
        ["test_dispatch.py"],
    ),
    (
        "Triton softmax kernel skips the max subtraction",
        L + "kernels/_triton.py",
        "    x = x - tl.max(x, axis=0)  # the stable shift: every exponent is <= 0",
        "    x = x",
        ["test_kernels.py"],
    ),
    (
        "Triton FlashAttention kernel's causal mask off by one",
        L + "kernels/_triton.py",
        "        keep = cols[None, :] < S\n        if IS_CAUSAL:\n"
        "            keep = keep & (cols[None, :] <= last[:, None])",
        "        keep = cols[None, :] < S\n        if IS_CAUSAL:\n"
        "            keep = keep & (cols[None, :] < last[:, None])",
        ["test_kernels.py"],
    ),
    (
        "get_device prefers MPS over CUDA",
        L + "device.py",
        '    if torch.cuda.is_available():\n        return torch.device("cuda")\n    if _mps_available():\n        return torch.device("mps")',
        '    if _mps_available():\n        return torch.device("mps")\n    if torch.cuda.is_available():\n        return torch.device("cuda")',
        ["test_device.py"],
    ),
    (
        "glue rounds to decimals instead of significant digits",
        B + "notebook.py",
        '    return float(f"{value:.{digits}g}")',
        '    return float(f"{value:.{digits}f}")',
        ["test_notebook.py"],
    ),
    (
        "heatmap drawn transposed",
        B + "plotting.py",
        "        m, cmap=cmap, vmin=vmin, vmax=vmax,",
        "        m.T, cmap=cmap, vmin=vmin, vmax=vmax,",
        ["test_plotting.py"],
    ),
    (
        "FlashAttention backward drops delta = rowsum(dO o O) from dS",
        L + "attention/flash/_tiles.py",
        "ds = dp.sub_(delta[h0:h1, r0:r1, None]).mul_(pt)",
        "ds = dp.mul_(pt)",
        ["test_flash_backward.py"],
    ),
    (
        "FlashAttention's lazy loop never rescales a tile whose weights overflow",
        L + "attention/flash/_tiles.py",
        "        if not float(total.max()) <= TILE_SUM_LIMIT:  # rare: a large rise, or nan",
        "        if False:",
        ["test_tiles.py"],
    ),
    (
        "sparse maps: rows with too many candidates are not sorted in full",
        L + "normalizers/sparse.py",
        "    redo = (full | (t < bound).squeeze(-1)).nonzero().squeeze(-1)",
        "    redo = (t < bound).squeeze(-1).nonzero().squeeze(-1)",
        ["test_alternatives.py"],
    ),
    (
        "attention's fused path trusts a non-finite output (a masked nan leaks)",
        L + "attention/sdpa.py",
        "        if torch.compiler.is_compiling() or _finite(out):\n            return out",
        "        return out",
        ["test_attention.py"],
    ),
    (
        "sink softmax leaves the shift out of the sink's exponential",
        L + "normalizers/sinks.py",
        "total = torch.exp(sink - m) + e.sum(dim, keepdim=True)",
        "total = torch.exp(sink) + e.sum(dim, keepdim=True)",
        ["test_sinks.py"],
    ),
    (
        "sink softmax shifts by the scores' maximum only (a large sink overflows)",
        L + "normalizers/sinks.py",
        "m = torch.maximum(x.amax(dim, keepdim=True), sink).detach()",
        "m = x.amax(dim, keepdim=True).detach()",
        ["test_sinks.py"],
    ),
    (
        "softpick's numerator not rectified (negative weights)",
        L + "normalizers/sinks.py",
        "numerator = torch.relu(shifted)",
        "numerator = shifted",
        ["test_sinks.py"],
    ),
    (
        "the attention resolver ignores a float (additive) mask",
        L + "attention/_args.py",
        "                scores = scores + self.mask",
        "                scores = scores",
        ["test_attention_vocabulary.py"],
    ),
    (
        "the attention resolver reads is_causal='bottom_right' as top-left",
        L + "attention/_args.py",
        '    if causal == "bottom_right" and L == S:',
        '    if causal == "bottom_right":',
        ["test_attention_vocabulary.py"],
    ),
]


def locate(path: str, old: str) -> Path | None:
    """The file that holds ``old`` once: ``path`` if it still does, else the one
    file of the same package (lib/softmaxbook or lib/bookkit) that does, so a
    mutant survives a module moving or splitting."""
    file = ROOT / path
    if file.exists() and file.read_text().count(old) == 1:
        return file
    package = ROOT / "/".join(path.split("/")[:2])
    hits = [f for f in package.rglob("*.py") if f.read_text().count(old) == 1]
    return hits[0] if len(hits) == 1 else None


def test_files(names: list[str]) -> list[str]:
    """Test files named by their basename (unique under tests/), wherever they live."""
    found = []
    for name in names:
        paths = sorted((ROOT / "tests").rglob(name))
        if len(paths) != 1:
            raise SystemExit(
                f"{name}: expected one file under tests/, found {len(paths)}"
            )
        found.append(str(paths[0].relative_to(ROOT)))
    return found


def main(only: list[str]) -> int:
    survived = 0
    for number, (what, path, old, new, names) in enumerate(M, 1):
        if only and str(number) not in only:
            continue
        tests = test_files(names)
        file = locate(path, old)
        if file is None:
            print(
                f"#{number} {what}: the original text is not in one file of {path}'s package"
            )
            survived += 1
            continue
        path = str(file.relative_to(ROOT))
        source = file.read_text()
        line = source[: source.index(old)].count("\n") + 1
        file.write_text(source.replace(old, new))
        try:
            start = time.time()
            done = subprocess.run(
                [sys.executable, "-m", "pytest", *tests, *FAST],
                cwd=ROOT,
                capture_output=True,
                text=True,
            )
        finally:
            file.write_text(source)
        failed = [
            row.split(" ")[1]
            for row in done.stdout.splitlines()
            if row.startswith(("FAILED ", "ERROR "))
        ]
        caught = done.returncode != 0
        survived += not caught
        verdict = f"caught by {failed[0] if failed else '?'}" if caught else "SURVIVED"
        print(
            f"#{number} | {what} | {path}:{line} | {verdict} ({time.time() - start:.0f} s)",
            flush=True,
        )
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
