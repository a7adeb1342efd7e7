"""The grader's end of the student's process: start it, talk to it, end it.

:class:`Process` starts ``python -m coursekit._worker`` in its own process group and
scratch folder, with the protocol on two dedicated pipes (see :mod:`coursekit._worker`)
and the process's own stdout and stderr on a third, read by a thread that keeps the
last MiB. :func:`exit_in_words` says why a process ended.
"""

from __future__ import annotations

import io
import os
import pickle
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from ._worker import HEADER, MAX_FRAME, write_frame

__all__ = ["Died", "Process", "TimedOut", "exit_in_words"]

#: Seconds a fresh process may take to import torch before it counts as broken.
START_TIMEOUT = 120.0
#: The most of the process's own output (fd 1 and 2) kept, and shown per test.
MAX_OUTPUT = 1 << 20
SHOWN_OUTPUT = 1500


class TimedOut(Exception):
    """The process did not reply in time."""


class Died(Exception):
    """The process ended, or replied with something that is not a frame."""


class _Output:
    """Reads the worker's stdout+stderr pipe in a thread, keeping the last MiB."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.data = bytearray()
        self.total = 0
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while True:
            chunk = self.stream.read1(65536)  # type: ignore[attr-defined]
            if not chunk:
                return
            with self.lock:
                self.data += chunk
                self.total += len(chunk)
                if len(self.data) > MAX_OUTPUT:
                    del self.data[: len(self.data) - MAX_OUTPUT // 2]

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


class Process:
    """One student process and its pipes."""

    def __init__(self, extra_paths: Sequence[str]) -> None:
        request_r, self.request_w = os.pipe()
        self.reply_r, reply_w = os.pipe()
        self.scratch = tempfile.TemporaryDirectory(prefix="coursekit-")
        package_root = str(Path(__file__).resolve().parent.parent)
        paths = [*extra_paths, package_root, os.environ.get("PYTHONPATH", "")]
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(p for p in paths if p),
            CUDA_VISIBLE_DEVICES="",  # the grading runs on the CPU
            OMP_NUM_THREADS="1",
            MKL_NUM_THREADS="1",
            PYTHONDONTWRITEBYTECODE="1",
            PYTHONHASHSEED="0",
            PYTHONUNBUFFERED="1",
        )
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "coursekit._worker", str(request_r), str(reply_w)],
            pass_fds=(request_r, reply_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=self.scratch.name,
            env=env,
            start_new_session=True,  # its own process group: killed as a whole
        )
        os.close(request_r)
        os.close(reply_w)
        assert self.popen.stdout is not None
        self.output = _Output(self.popen.stdout)
        self.stack: list[str] = []

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
        if tag not in (b"DATA", b"CHNK", b"ENTR") or length > MAX_FRAME:
            raise Died  # the reply pipe carries something else: treat as a crash
        return tag, self._read_exact(length, deadline)

    def data(self, deadline: float, chunk: list[int] | None = None) -> dict[str, Any]:
        """The next DATA reply, read as plain data; CHNK and ENTR frames noted."""
        import torch

        while True:
            tag, payload = self.frame(deadline)
            if tag == b"CHNK" and chunk is not None:
                chunk.append(int(payload))
            elif tag == b"ENTR":
                self.stack = payload.decode("utf-8", "replace").split("\n")
            elif tag == b"DATA":
                message = torch.load(io.BytesIO(payload), weights_only=True)
                if not isinstance(message, dict):
                    raise Died
                return message

    def kill(self) -> None:
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.popen.kill()
        self.popen.wait()
        for fd in (self.request_w, self.reply_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self.scratch.cleanup()

    def how_it_ended(self) -> str:
        """Why the process is gone, in words."""
        try:
            code = self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
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
