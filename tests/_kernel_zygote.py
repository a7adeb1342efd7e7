"""Notebook kernels forked from a process that has already imported torch.

nbval starts a fresh Jupyter kernel for every notebook, and each kernel spends
about two seconds of CPU importing torch, numpy and IPython, and two more on the
first ``bk.glue`` (myst-nb imports nbformat, whose jsonschema builds an IRI grammar
when it is imported): over the book's 55 notebooks, about a third of what strict
nbval costs. Here one *zygote* per
pytest worker imports them once, and every kernel is a ``fork`` of it: a fresh
process (its own memory, modules, random state and working directory) that runs
ipykernel exactly as ``python -m ipykernel_launcher -f CONNECTION_FILE`` would,
with the modules already in ``sys.modules``. matplotlib and pyplot are imported
ahead too (another 0.7 s per notebook), as a kernel would import them: with the
backend that ipykernel sets before any cell runs (``MPLBACKEND``, its inline backend
when unset), re-read in the kernel from the kernel's own environment and working
directory. The inline backend itself is left to the kernel: on import it hooks
into the running IPython, which the zygote has not.

Two programs in this file:

- ``python _kernel_zygote.py serve SOCKET`` is the zygote: it imports, then for
  each request on the Unix socket forks a kernel with the request's argv, working
  directory and environment.
- ``python _kernel_zygote.py launch -f CONNECTION_FILE`` is what Jupyter starts as
  "the kernel process": it asks the zygote (``$SOFTMAXBOOK_ZYGOTE``) for a kernel,
  passes SIGINT and SIGTERM on to it, and exits when it exits. When the launcher is
  killed (SIGKILL, as ``shutdown_kernel(now=True)`` does) the kernel sees its end
  of the socket close and exits too.

tests/conftest.py starts the zygote and points nbval's kernel at the launcher;
``SOFTMAXBOOK_ZYGOTE=0`` turns all of this off.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import threading


def _kernel(conn: socket.socket, request: dict, stdio: list[int]) -> None:
    """In the forked child: become the kernel the request describes."""
    os.setsid()  # its own process group, as Jupyter starts kernels
    for fd, target in zip(stdio, (0, 1, 2), strict=True):
        os.dup2(fd, target)  # the launcher's stdin, stdout and stderr
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # sys.path as ipykernel_launcher leaves it: without its first entry (here this
    # file's folder; there the working directory, which IPython adds back as "").
    del sys.path[0]
    sys.argv = ["ipykernel_launcher", *request["argv"]]
    _matplotlib_as_imported_here()
    if _TRITON_MODE and os.environ.get("TRITON_INTERPRET") != _TRITON_MODE[0]:
        sys.stderr.write(
            f"this kernel's TRITON_INTERPRET is not the zygote's ({_TRITON_MODE[0]}), "
            "which Triton read when it was imported: run with SOFTMAXBOOK_ZYGOTE=0\n"
        )
        os._exit(1)

    def watch() -> None:  # the launcher gone (killed): so is the kernel
        conn.recv(1)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()
    from ipykernel import kernelapp

    kernelapp.launch_new_instance()
    os._exit(0)


# What ipykernel sets MPLBACKEND to when it is unset, before the first cell.
_INLINE = "module://matplotlib_inline.backend_inline"
# The matplotlibrc the zygote's matplotlib read: a kernel elsewhere may find another.
_RC_FILE: list[str] = []


def _import_matplotlib() -> None:
    """pyplot and Agg imported, and the fonts and the math parser a first figure
    loads, as a kernel that ipykernel has started would import them."""
    os.environ.setdefault("MPLBACKEND", _INLINE)
    import matplotlib
    import matplotlib.pyplot  # (its backend is resolved at first use)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    _RC_FILE.append(matplotlib.matplotlib_fname())
    figure = Figure()  # no pyplot: the backend stays unresolved
    figure.add_subplot().set_title(r"$\sqrt{d_k}$ text")
    FigureCanvasAgg(figure).draw()


def _matplotlib_as_imported_here() -> None:
    """In the kernel: rcParams as ``import matplotlib`` would read them in this
    working directory and environment, the backend as ipykernel would set it."""
    if not _RC_FILE:
        return
    import matplotlib

    rc_file = matplotlib.matplotlib_fname()
    if rc_file != _RC_FILE[0]:
        matplotlib.rc_file(rc_file)
    matplotlib.rcParams["backend"] = os.environ.get("MPLBACKEND") or _INLINE


# The TRITON_INTERPRET Triton read when the zygote imported it (empty: not imported).
_TRITON_MODE: list[str] = []


def _import_dynamo() -> None:
    """torch._dynamo, which an optimizer's first step, flex attention and
    ``torch.nn.attention.bias`` import (1.7 s of CPU in every such notebook). It
    imports Triton, which reads ``TRITON_INTERPRET`` once: so only where that is set
    here (tests/conftest.py sets it without CUDA), and each kernel checks that it
    asks for the same."""
    mode = os.environ.get("TRITON_INTERPRET")
    if mode is None or "triton" in sys.modules:
        return
    import torch._dynamo  # noqa: F401

    _TRITON_MODE.append(mode)


def serve(path: str) -> None:
    import ipykernel.kernelapp  # noqa: F401  (IPython, zmq, tornado)
    import numpy  # noqa: F401
    import torch  # noqa: F401

    try:  # bookkit.glue's myst-nb: nbformat's jsonschema builds a grammar (2 s)
        import myst_nb.ext.glue  # noqa: F401
    except ImportError:
        pass
    try:  # what the chapters' first cells import
        _import_matplotlib()
        import bookkit  # noqa: F401
        import softmaxbook  # noqa: F401
    except ImportError:
        pass
    _import_dynamo()

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the OS
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    print("ready", flush=True)
    while True:
        # stdin is a pipe from the pytest process: at its end (pytest exited, even
        # killed) the zygote ends too. No thread waits for it: fork copies only the
        # thread that calls it, so the zygote keeps to one.
        ready, _, _ = select.select([server, sys.stdin], [], [])
        if sys.stdin in ready:
            return
        conn, _ = server.accept()
        _, stdio, _, _ = socket.recv_fds(conn, 1, 3)
        request = json.loads(conn.makefile("r").readline())
        pid = os.fork()
        if pid == 0:
            server.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            try:
                _kernel(conn, request, stdio)
            finally:
                os._exit(1)
        for fd in stdio:
            os.close(fd)
        conn.sendall(f"{pid}\n".encode())
        conn.close()  # the kernel holds the other copy


def launch(argv: list[str]) -> int:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(os.environ["SOFTMAXBOOK_ZYGOTE"])
    request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}
    socket.send_fds(conn, [b"."], [0, 1, 2])  # the kernel gets this process's stdio
    conn.sendall((json.dumps(request) + "\n").encode())
    reply = conn.makefile("r")
    pid = int(reply.readline())

    def forward(signum: int, frame: object) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
        if signum == signal.SIGTERM:
            os._exit(0)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, forward)
    reply.read()  # returns when the kernel exits and its end of the socket closes
    return 0


if __name__ == "__main__":
    mode, *rest = sys.argv[1:]
    if mode == "serve":
        serve(rest[0])
    else:
        sys.exit(launch(rest))
