"""The release as an instructor installs it: an sdist and a wheel that ``twine check``
accepts, whose required dependencies are torch and numpy alone, and whose wheel
installs and imports in a fresh virtual environment, away from this repository.

Built once per session with ``python -m build --no-isolation`` (nothing is
downloaded: the build backend is the one already installed). The fresh
environment gets torch and numpy from this environment's site-packages through a
path entry, not from the repository, so the import below can only find the
package the wheel installed.
"""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
import venv
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # Without --sdist/--wheel, build makes the sdist, then the wheel from the sdist:
    # so the wheel also proves the sdist holds everything it needs.
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), "."],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    return out


def _one(dist: Path, pattern: str) -> Path:
    found = sorted(dist.glob(pattern))
    assert len(found) == 1, f"expected one {pattern} in {dist}, found {found}"
    return found[0]


def test_twine_accepts_the_sdist_and_the_wheel(dist: Path) -> None:
    files = [_one(dist, "*.tar.gz"), _one(dist, "*.whl")]
    done = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, files)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("PASSED") == 2, done.stdout


def test_the_wheel_requires_torch_and_numpy_only(dist: Path) -> None:
    import softmaxbook

    wheel = _one(dist, "*.whl")
    assert f"-{softmaxbook.__version__}-" in wheel.name
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(zf.read(meta).decode())
        names = zf.namelist()
    required = sorted(
        re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0]
        for r in metadata.get_all("Requires-Dist") or []
        if "extra ==" not in r
    )
    assert required == ["numpy", "torch"], required
    # The package data an installed library needs: type hints, the stored sweeps.
    for needed in (
        "softmaxbook/py.typed",
        "bookkit/data/case_study_sweep.json",
        "bookkit/data/sink_sweep.json",
    ):
        assert needed in names, f"{needed} is missing from the wheel"


def test_the_wheel_installs_and_imports_in_a_fresh_environment(
    dist: Path, tmp_path: Path
) -> None:
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
         "--no-deps", "--no-index", str(_one(dist, "*.whl"))],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    # torch and numpy from this environment: a path entry, processed after the fresh
    # environment's own site-packages, so softmaxbook resolves to the installed wheel.
    ask = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = subprocess.run(
        [str(python), "-c", ask], check=True, capture_output=True, text=True
    ).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]
    Path(site, "deps-from-test-env.pth").write_text(ours + "\n")
    probe = (
        "import softmaxbook as sb, torch, coursekit, bookkit\n"
        "print(sb.__file__)\n"
        "p = sb.softmax(torch.tensor([1.0, 2.0, 3.0]))\n"
        "assert abs(float(p.sum()) - 1.0) < 1e-6\n"
        "print(sb.__version__)\n"
    )
    done = subprocess.run(
        [str(python), "-c", probe], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    where, version = done.stdout.split()
    assert Path(where).is_relative_to(env), f"imported {where}, not the wheel's copy"
    assert not Path(where).is_relative_to(ROOT)
    import softmaxbook

    assert version == softmaxbook.__version__
    # The console script the wheel declares runs.
    cli = subprocess.run(
        [str(env / "bin" / "softmaxbook-course"), "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 0 and "grade" in cli.stdout, cli.stderr
