"""The grader's end of the student's process: start it, talk to it, end it.

A student process runs :class:`coursekit._worker.Worker` in its own process group
and scratch folder, with the protocol on two dedicated pipes and its own stdout and
stderr on a third, which a thread reads, keeping the last MiB.

On Linux the processes are forked from a **zygote**: one ``python -m coursekit._worker
--zygote`` per grader process, which imports torch once, single-threaded, and forks
a fresh child for each student process (the pipes are passed over a Unix socket).
A fresh process then costs milliseconds instead of a torch import (seconds), which
keeps the restarts after crashes and time-outs cheap. Elsewhere (or with
``COURSEKIT_SPAWN=1``) each process is a new Python (``subprocess``).
:func:`exit_in_words` says why a process ended.
"""

from __future__ import annotations

import atexit
import io
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._worker import HEADER, MAX_FRAME, write_frame

__all__ = ["Died", "Process", "TimedOut", "exit_in_words", "prestart"]

#: Seconds a fresh process may take to import torch before it counts as broken.
START_TIMEOUT = 120.0
#: The most of the process's own output (fd 1 and 2) kept, and shown per test.
MAX_OUTPUT = 1 << 20
SHOWN_OUTPUT = 1500
_LENGTH = struct.Struct(">I")


class TimedOut(Exception):
    """The process did not reply in time."""


class Died(Exception):
    """The process ended, or replied with something that is not a frame (the
    reason, in words, is then the exception's message)."""


_GARBLED = "wrote something other than a reply on the grader's channel"


def _environment() -> dict[str, str]:
    package_root = str(Path(__file__).resolve().parent.parent)
    paths = [package_root, os.environ.get("PYTHONPATH", "")]
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in paths if p),
        CUDA_VISIBLE_DEVICES="",  # the grading runs on the CPU
        OMP_NUM_THREADS="1",  # and single-threaded: no thread pool at fork time
        OPENBLAS_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONHASHSEED="0",
        PYTHONUNBUFFERED="1",
    )


class _Output:
    """Reads the process's stdout+stderr pipe in a thread, keeping the last MiB."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.data = bytearray()
        self.total = 0
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            while True:
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    return
                with self.lock:
                    self.data += chunk
                    self.total += len(chunk)
                    if len(self.data) > MAX_OUTPUT:
                        del self.data[: len(self.data) - MAX_OUTPUT // 2]
        except OSError:
            return
        finally:
            try:
                os.close(self.fd)
            except OSError:
                pass

    def mark(self) -> int:
        with self.lock:
            return self.total

    def since(self, mark: int, limit: int = SHOWN_OUTPUT) -> str:
        self.thread.join(timeout=0.5)  # after a death, let the last bytes arrive
        with self.lock:
            kept = min(self.total - mark, len(self.data))
            text = bytes(self.data[len(self.data) - kept :]).decode("utf-8", "replace")
        text = text.strip()
        return text if len(text) <= limit else "..." + text[-limit:]


class _Zygote:
    """``python -m coursekit._worker --zygote FD``: forks student processes."""

    def __init__(self) -> None:
        self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.popen = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "coursekit._worker",
                "--zygote",
                str(child.fileno()),
            ],
            pass_fds=(child.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=_environment(),
            start_new_session=True,
        )
        child.close()
        self.lock = threading.Lock()

    def _ask(self, request: dict[str, Any], fds: Sequence[int], wait: float) -> Any:
        payload = pickle.dumps(request)
        with self.lock:
            socket.send_fds(self.sock, [_LENGTH.pack(len(payload)) + payload], fds)
            deadline = time.monotonic() + wait
            data = b""
            while (
                len(data) < _LENGTH.size
                or len(data) < _LENGTH.size + _LENGTH.unpack(data[: _LENGTH.size])[0]
            ):
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                    raise TimedOut
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise Died
                data += chunk
        return pickle.loads(data[_LENGTH.size :])

    def fork(self, fds: Sequence[int], paths: Sequence[str], cwd: str) -> int:
        pid: int = self._ask(
            {"kind": "fork", "paths": list(paths), "cwd": cwd}, fds, START_TIMEOUT
        )
        return pid

    def status(self, pid: int, wait: float) -> int | None:
        """The exit code of child ``pid`` (negative: a signal), None if alive."""
        code: int | None = self._ask(
            {"kind": "status", "pid": pid, "wait": wait}, (), wait + 10
        )
        return code

    def sweep(self) -> int:
        """Kill what the student processes left running outside their group."""
        killed: int = self._ask({"kind": "sweep"}, (), 10.0)
        return killed

    def alive(self) -> bool:
        return self.popen.poll() is None

    def close(self) -> None:
        self.sock.close()
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.popen.kill()


_ZYGOTE: list[_Zygote] = []
_ZYGOTE_LOCK = threading.Lock()


def _zygote() -> _Zygote | None:
    """The grader process's zygote, started on first use; None where not used."""
    if (
        sys.platform != "linux"
        or not hasattr(socket, "send_fds")
        or os.environ.get("COURSEKIT_SPAWN") == "1"
    ):
        return None
    with _ZYGOTE_LOCK:
        if _ZYGOTE and not _ZYGOTE[0].alive():
            _ZYGOTE.pop().close()
        if not _ZYGOTE:
            _ZYGOTE.append(_Zygote())
            atexit.register(_close_zygote)
        return _ZYGOTE[0]


def prestart() -> None:
    """Start the zygote now, so it imports torch while the grader imports its own."""
    _zygote()


def sweep() -> None:
    """End the processes student code detached (``setsid`` after a double fork),
    which killing a student process's group misses; where the zygote is used."""
    with _ZYGOTE_LOCK:
        zygote = _ZYGOTE[0] if _ZYGOTE and _ZYGOTE[0].alive() else None
    if zygote is not None:
        try:
            zygote.sweep()
        except (OSError, TimedOut, Died, EOFError, pickle.PickleError):
            pass


def _close_zygote() -> None:
    with _ZYGOTE_LOCK:
        while _ZYGOTE:
            _ZYGOTE.pop().close()


class Process:
    """One student process: its pipes, its output, and how to end it."""

    def __init__(self, extra_paths: Sequence[str]) -> None:
        request_r, self.request_w = os.pipe()
        self.reply_r, reply_w = os.pipe()
        output_r, output_w = os.pipe()
        self.scratch = tempfile.TemporaryDirectory(prefix="coursekit-")
        self.popen: subprocess.Popen[bytes] | None = None
        self.zygote = _zygote()
        try:
            if self.zygote is not None:
                try:
                    self.pid = self.zygote.fork(
                        (request_r, reply_w, output_w), extra_paths, self.scratch.name
                    )
                except (OSError, TimedOut, Died, EOFError, pickle.PickleError):
                    self.zygote = None  # fall back to a new Python
            if self.zygote is None:
                self.popen = self._spawn(request_r, reply_w, output_w, extra_paths)
                self.pid = self.popen.pid
        finally:
            for fd in (request_r, reply_w, output_w):
                os.close(fd)
        self.output = _Output(output_r)
        self.stack: list[str] = []
        self.code: int | None = None

    def _spawn(
        self, request_r: int, reply_w: int, output_w: int, extra_paths: Sequence[str]
    ) -> subprocess.Popen[bytes]:
        env = _environment()
        env["PYTHONPATH"] = os.pathsep.join([*extra_paths, env["PYTHONPATH"]])
        return subprocess.Popen(
            [sys.executable, "-m", "coursekit._worker", str(request_r), str(reply_w)],
            pass_fds=(request_r, reply_w),
            stdin=subprocess.DEVNULL,
            stdout=output_w,
            stderr=output_w,
            cwd=self.scratch.name,
            env=env,
            start_new_session=True,  # its own process group: killed as a whole
        )

    def send(self, request: dict[str, Any]) -> None:
        try:
            write_frame(self.request_w, b"PICK", pickle.dumps(request, protocol=4))
        except OSError as error:  # BrokenPipeError: it is gone
            raise Died from error

    def _read_exact(self, n: int, deadline: float) -> bytes:
        data = bytearray()
        while len(data) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimedOut
            ready, _, _ = select.select([self.reply_r], [], [], left)
            if not ready:
                raise TimedOut
            chunk = os.read(self.reply_r, min(n - len(data), 1 << 20))
            if not chunk:
                raise Died
            data += chunk
        return bytes(data)

    def frame(self, deadline: float) -> tuple[bytes, bytes]:
        tag, length = HEADER.unpack(self._read_exact(HEADER.size, deadline))
        if tag not in (b"DATA", b"CHNK", b"ENTR"):
            raise Died(_GARBLED)
        if length > MAX_FRAME:
            raise Died(f"sent back more than {MAX_FRAME >> 20} MiB")
        return tag, self._read_exact(length, deadline)

    def data(self, deadline: float, chunk: list[int] | None = None) -> dict[str, Any]:
        """The next DATA reply, read as plain data; CHNK and ENTR frames noted."""
        import torch

        while True:
            tag, payload = self.frame(deadline)
            if tag == b"CHNK" and chunk is not None:
                if not payload.isdigit():
                    raise Died(_GARBLED)
                chunk.append(int(payload))
            elif tag == b"ENTR":
                self.stack = payload.decode("utf-8", "replace").split("\n")
            elif tag == b"DATA":
                message = torch.load(io.BytesIO(payload), weights_only=True)
                if not isinstance(message, dict):
                    raise Died(_GARBLED)
                return message

    def _wait(self, wait: float) -> int | None:
        if self.code is None:
            if self.popen is not None:
                try:
                    self.code = self.popen.wait(timeout=wait)
                except subprocess.TimeoutExpired:
                    return None
            elif self.zygote is not None:
                try:
                    self.code = self.zygote.status(self.pid, wait)
                except (OSError, TimedOut, Died, EOFError):
                    return None
        return self.code

    def kill(self) -> None:
        """End the process and everything it started (its process group)."""
        if self._wait(0) is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                try:
                    os.kill(self.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            self._wait(10)
        for fd in (self.request_w, self.reply_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self.scratch.cleanup()

    def how_it_ended(self) -> str:
        """Why the process is gone, in words (it may take a moment to be gone)."""
        code = self._wait(5)
        if code is None:
            return "stopped answering the grader"
        return exit_in_words(code)


def exit_in_words(code: int) -> str:
    """``-11`` -> ``crashed with a segmentation fault (SIGSEGV) ...``."""
    if code >= 0:
        return (
            f"ended the grading process with exit code {code} (os._exit, or "
            "something that exits the interpreter)"
        )
    number = -code
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    why = {
        "SIGSEGV": "crashed with a segmentation fault (SIGSEGV): native code read "
        "memory it does not own (ctypes, a C extension, an unchecked index)",
        "SIGBUS": "crashed with a bus error (SIGBUS)",
        "SIGABRT": "aborted (SIGABRT), e.g. a failed check inside a C library",
        "SIGKILL": "was killed (SIGKILL), most likely by the system for using too "
        "much memory",
        "SIGFPE": "crashed with an arithmetic error (SIGFPE)",
        "SIGILL": "crashed with an illegal instruction (SIGILL)",
    }.get(name, f"was ended by {name}")
    return why
