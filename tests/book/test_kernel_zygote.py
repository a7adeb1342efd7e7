"""The notebooks' kernels forked from a zygote (tests/_kernel_zygote.py) behave as
freshly started ones, and leave nothing running behind them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

jupyter_client = pytest.importorskip("jupyter_client")
ZYGOTE = Path(__file__).resolve().parents[1] / "_kernel_zygote.py"

PROBE = """
import json, os, sys
seen = {"torch": "torch" in sys.modules, "pyplot": "matplotlib.pyplot" in sys.modules}
seen.update(cwd=os.getcwd(), pid=os.getpid(), var=os.environ.get("PROBE"))
seen["dynamo"] = "torch._dynamo" in sys.modules
import matplotlib, matplotlib.pyplot as plt
seen["backend"] = matplotlib.get_backend()
print(json.dumps(seen))
plt.plot([0, 1])
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


@pytest.fixture(scope="module")
def zygote():
    """One zygote for the kernels of this file: ``(process, socket path)``."""
    socket_path = os.path.join(tempfile.mkdtemp(prefix="sb-zygote-test-"), "socket")
    process = subprocess.Popen(
        [sys.executable, str(ZYGOTE), "serve", socket_path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
        yield process, socket_path
    finally:
        process.kill()
        shutil.rmtree(os.path.dirname(socket_path), ignore_errors=True)


@pytest.mark.parametrize("backend", [None, "agg"])
def test_a_forked_kernel_is_a_fresh_kernel_with_torch_imported(
    tmp_path, backend, zygote
):
    import json

    from jupyter_client.kernelspec import KernelSpec
    from jupyter_client.manager import KernelManager

    process, socket_path = zygote
    km = KernelManager()
    km._kernel_spec = KernelSpec(
        argv=[sys.executable, str(ZYGOTE), "launch", "-f", "{connection_file}"],
        language="python",
        display_name="zygote",
    )
    env = dict(os.environ, SOFTMAXBOOK_ZYGOTE=socket_path, PROBE="from the client")
    env.pop("MPLBACKEND", None)
    if backend is not None:  # the client's choice, not the zygote's
        env["MPLBACKEND"] = backend
    km.start_kernel(cwd=str(tmp_path), env=env)
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    printed, images = [], []

    def output(message):
        printed.append(message["content"].get("text", ""))
        images.append("image/png" in message["content"].get("data", {}))

    kc.execute_interactive(PROBE, timeout=60, output_hook=output)
    seen = json.loads("".join(printed))
    kc.stop_channels()
    launcher = km.provisioner.process.pid
    km.shutdown_kernel(now=True)  # as nbval stops a kernel: SIGKILL
    # The kernel got the client's working directory and environment, and the
    # zygote's modules, pyplot with them; its figures show inline, as a fresh
    # kernel's do (the backend is ipykernel's, chosen in the kernel).
    assert seen["cwd"] == str(tmp_path)
    assert seen["var"] == "from the client"
    assert seen["torch"] and seen["pyplot"]
    # torch._dynamo (and Triton) where TRITON_INTERPRET is chosen (tests/conftest.py)
    assert seen["dynamo"] == ("TRITON_INTERPRET" in os.environ)
    assert seen["backend"] == backend or (
        backend is None
        and seen["backend"] == "module://matplotlib_inline.backend_inline"
        and any(images)  # shown inline
    ), seen["backend"]
    assert seen["pid"] not in (launcher, process.pid)
    assert _gone(seen["pid"]), "the kernel outlived its launcher"


def test_the_zygote_ends_with_its_pytest_process(zygote):
    """Last in this file (it ends the zygote the kernels above were forked from)."""
    process, _ = zygote
    assert process.poll() is None  # it served the kernels and still runs
    process.stdin.close()  # the pytest process ended: the zygote ends too
    assert process.wait(timeout=10) == 0
