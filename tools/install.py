"""Install requirements into the project's virtual environment, fast.

Usage (the Makefile's setup step; the venv's own python runs it)::

    .venv/bin/python tools/install.py -r requirements.txt

``uv pip install`` does in about 35 s on two cores what ``pip install`` does in about
100 s (pip unpacks and compiles one wheel at a time; uv in parallel). Both compile every
module's bytecode at install: uv only when asked (``--compile-bytecode``), and it must
be, since with ``PYTHONDONTWRITEBYTECODE`` set (as on CI machines) nothing is cached at
import and every process would compile torch, pandas and the Jupyter stack again (it
doubled the course-kit tests' time). A fresh clone's ``make test`` pays for the
install, so it is worth the difference.

uv does not read pip's configuration, and the machine's pip settings are what keep a
CPU-only torch from being replaced by a CUDA build from PyPI. So the settings pip
itself reports (``pip config list``: its configuration files and the ``PIP_*``
variables) are passed on: ``find-links``, ``index-url``, ``extra-index-url``,
``constraint``, ``no-index``. Where uv cannot be installed or fails, pip installs
the same requirements as before.

The venv is made without pip (``python -m venv --without-pip``): ``ensurepip``,
upgrading the pip it installs and installing uv with that pip took 10 s of CPU before
uv started. uv is installed into the venv by the pip of the Python the venv was made
from (``pip --python``), and installs pip beside the requirements, so the venv has one
for later use. Where that pip is missing or cannot, the venv gets its own pip first
(``ensurepip``), as before.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

# pip's setting -> uv's option (a setting may hold several values, space-separated).
OPTIONS = {
    "find-links": "--find-links",
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "constraint": "--constraint",
}


# The pip that runs, as a command: the base Python's (installing into this venv with
# --python) until the venv has its own.
PIP = [getattr(sys, "_base_executable", sys.executable), "-m", "pip"]


def run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True)


def pip(*args: str) -> subprocess.CompletedProcess:
    return run(*PIP, *args)


def own_pip() -> None:
    """Give the venv its own pip (a no-op where it has one) and use it."""
    if run(sys.executable, "-m", "pip", "--version").returncode != 0:
        run(sys.executable, "-m", "ensurepip", "--upgrade")
        run(sys.executable, "-m", "pip", "install", "--quiet", "--upgrade", "pip")
    PIP[:] = [sys.executable, "-m", "pip"]


def pip_settings() -> dict[str, str]:
    """``{setting: value}`` from ``pip config list`` (``global.x='v'`` and
    ``:env:.x='v'`` lines; an environment variable wins over a file, as in pip)."""
    settings: dict[str, str] = {}
    lines = pip("config", "list").stdout.splitlines()
    # Files first, then the environment, so the environment overrides.
    for line in sorted(lines, key=lambda line: line.startswith(":env:")):
        key, sep, value = line.partition("=")
        if sep and key.split(".")[0] in ("global", "install", ":env:"):
            settings[key.split(".", 1)[1]] = shlex.split(value)[0] if value else ""
    return settings


def uv_options(settings: dict[str, str]) -> list[str]:
    options = []
    for name, option in OPTIONS.items():
        for value in settings.get(name, "").split():
            options += [option, value]
    if settings.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        options.append("--no-index")
    return options


def install_uv() -> bool:
    """uv in this venv, by the base Python's pip, else by the venv's own."""
    if pip("--python", sys.executable, "install", "--quiet", "uv").returncode == 0:
        return True
    own_pip()
    return pip("install", "--quiet", "uv").returncode == 0


def main(argv: list[str]) -> int:
    if sys.prefix == getattr(sys, "base_prefix", sys.prefix):
        print("tools/install.py: run it with the venv's python", file=sys.stderr)
        return 2
    if install_uv():
        settings = pip_settings()
        # pip takes the best version from all of its indexes together; uv, by
        # default, only from the first index that has the package.
        command = [sys.executable, "-m", "uv", "pip", "install", "--quiet"]
        command += ["--index-strategy", "unsafe-best-match", "--compile-bytecode"]
        command += ["--python", sys.executable, *uv_options(settings), "pip", *argv]
        env = dict(os.environ)
        if settings.get("cert"):  # pip's certificate bundle, for uv's downloads too
            env.setdefault("SSL_CERT_FILE", settings["cert"])
        if subprocess.run(command, env=env).returncode == 0:
            return 0
        print("tools/install.py: uv failed; installing with pip", file=sys.stderr)
    own_pip()
    pip_command = [sys.executable, "-m", "pip", "install", "--quiet", *argv]
    return subprocess.run(pip_command).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
