"""The student's process: ``python -m coursekit._worker REQUEST_FD REPLY_FD``.

The grader (:mod:`coursekit.sandbox`) starts this module in a fresh Python, then sends
requests on one pipe and reads replies on another; the student's ``print`` and
everything written to file descriptors 1 and 2 go to a third pipe the grader reads
separately, so nothing the student writes can be taken for a reply.

A frame is a header (4-byte tag, 8-byte length, big-endian) and a payload:

* ``PICK``: grader to worker, a pickled request (the grader is trusted);
* ``DATA``: worker to grader, a ``torch.save`` payload the grader reads with
  ``torch.load(weights_only=True)``: plain data only, so a reply cannot carry an
  object that runs code or lies about its value in the grader's process;
* ``CHNK``: worker to grader, the index of the piece of code about to run (so a
  crash while importing can be pinned on a notebook cell);
* ``ENTR``: worker to grader, the stack of the submission's functions being called
  (so a time-out can be pinned on the function that did not return).

Requests: ``load`` (import the assignment's tests and run the submission's code),
``run`` (one test's ``run`` under its forbidden-call guard), ``quit``.
"""

from __future__ import annotations

import faulthandler
import functools
import importlib
import io
import linecache
import os
import pickle
import struct
import sys
import time
import traceback
import types
from collections.abc import Callable
from typing import Any

HEADER = struct.Struct(">4sQ")
#: The largest reply read back (outputs are tensors of a few small test inputs).
MAX_FRAME = 256 * 2**20
#: The most of the student's printed text kept per test or per import.
MAX_PRINTED = 4000


def write_frame(fd: int, tag: bytes, payload: bytes) -> None:
    """Write one frame to ``fd`` (blocking, whole)."""
    data = memoryview(HEADER.pack(tag, len(payload)) + payload)
    while data:
        written = os.write(fd, data)
        data = data[written:]


def _read_exact(fd: int, n: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = os.read(fd, min(n - len(chunks), 1 << 20))
        if not chunk:
            raise EOFError("the grader closed the pipe")
        chunks += chunk
    return bytes(chunks)


class _Printed(io.TextIOBase):
    """A bounded stand-in for ``sys.stdout`` and ``sys.stderr``."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.size = 0
        self.dropped = 0

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        text = str(text)
        room = MAX_PRINTED - self.size
        if room > 0:
            kept = text[:room]
            self.parts.append(kept)
            self.size += len(kept)
            # Also to the process's own stdout, which the grader reads: if the
            # process dies, this text is all that is left to explain it.
            try:
                os.write(1, kept.encode("utf-8", "replace"))
            except OSError:
                pass
        self.dropped += max(0, len(text) - max(room, 0))
        return len(text)

    def text(self) -> str:
        body = "".join(self.parts)
        if self.dropped:
            body += f"\n... ({self.dropped} more characters not kept)"
        return body


def _describe(error: BaseException, files: set[str]) -> dict[str, str]:
    """The error in words, and the traceback's frames in the student's files."""
    if isinstance(error, SystemExit):
        first = f"SystemExit: your code called sys.exit({error.code!r})"
    elif isinstance(error, KeyboardInterrupt):
        first = "KeyboardInterrupt: your code raised KeyboardInterrupt"
    else:
        text = str(error).strip().splitlines()
        message = text[0][:300] if text else ""
        first = (
            f"{type(error).__name__}: {message}" if message else type(error).__name__
        )
        if isinstance(error, SyntaxError) and error.lineno:
            first += f" (line {error.lineno})"
    frames = [
        f for f in traceback.extract_tb(error.__traceback__) if f.filename in files
    ]
    where = "".join(traceback.format_list(frames[-4:])).rstrip()
    return {"error": first, "traceback": where}


class Worker:
    """The loop of the student's process (one instance per process)."""

    def __init__(self, request_fd: int, reply_fd: int) -> None:
        self.request_fd = request_fd
        self.reply_fd = reply_fd
        self.module: types.ModuleType | None = None
        self.assignment: Any = None
        self.files: set[str] = set()
        self.stack: list[str] = []
        self.sent_stack: tuple[str, ...] = ()
        self.pid = os.getpid()

    def _leave_if_forked(self) -> None:
        """End a process the student's code forked, as soon as it is back here.

        A child of ``os.fork()`` that returns (or raises ``SystemExit``) into the
        worker would otherwise read the next requests and answer them beside its
        parent, and the grader would pin one test's outputs on another.
        """
        if os.getpid() != self.pid:
            os._exit(0)

    # --- frames ---------------------------------------------------------------------

    def receive(self) -> dict[str, Any]:
        tag, length = HEADER.unpack(_read_exact(self.request_fd, HEADER.size))
        if tag != b"PICK":
            raise ValueError(f"unexpected frame {tag!r}")
        request: dict[str, Any] = pickle.loads(_read_exact(self.request_fd, length))
        return request

    def reply(self, message: dict[str, Any]) -> None:
        import torch

        buffer = io.BytesIO()
        torch.save(message, buffer)
        write_frame(self.reply_fd, b"DATA", buffer.getvalue())

    def _enter(self, name: str) -> None:
        self.stack.append(name)
        stack = tuple(self.stack)
        if stack != self.sent_stack:
            self.sent_stack = stack
            write_frame(self.reply_fd, b"ENTR", "\n".join(stack).encode())

    def _track(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def tracked(*args: Any, **kwargs: Any) -> Any:
            self._enter(name)
            try:
                return fn(*args, **kwargs)
            finally:
                self.stack.pop()

        return tracked

    # --- requests -------------------------------------------------------------------

    def load(self, request: dict[str, Any]) -> None:
        """Import the assignment, block forbidden imports, run the student's code."""
        module_name, attribute, argument = request["locator"]
        try:
            found = getattr(importlib.import_module(module_name), attribute)
            self.assignment = found(argument) if argument is not None else found
        except Exception as error:  # the grader's side: say so, and stop
            message = f"{type(error).__name__}: {error}"
            self.reply({"kind": "broken", "error": message[:500]})
            return
        from .forbidden import ImportBlocker

        blocked = tuple(request["block"])
        for name in list(sys.modules):
            if name.split(".")[0] in blocked:
                del sys.modules[name]  # so `import softmaxbook` reaches the blocker
        ImportBlocker(blocked).install()
        _limit_memory(int(request["memory_mb"]))

        module = types.ModuleType("submission")
        module.__file__ = request["chunks"][0][1] if request["chunks"] else "submission"
        sys.modules["submission"] = module
        if not request["all_or_nothing"]:  # a notebook, where display() is built in
            module.__dict__["display"] = _display
        self.module = module
        errors = []
        printed = _Printed()
        skip = set(request["skip"])
        for index, (source, filename) in enumerate(request["chunks"]):
            if index in skip:
                continue
            self.files.add(filename)
            lines = source.splitlines(keepends=True)
            linecache.cache[filename] = (len(source), None, lines, filename)
            write_frame(self.reply_fd, b"CHNK", str(index).encode())
            stdout, stderr = sys.stdout, sys.stderr
            sys.stdout = sys.stderr = printed
            try:
                exec(compile(source, filename, "exec"), module.__dict__)
            except BaseException as error:  # the student's code, whatever it raised
                errors.append({"index": index, **_describe(error, self.files)})
                if request["all_or_nothing"]:
                    break
            finally:
                self._leave_if_forked()
                sys.stdout, sys.stderr = stdout, stderr
        defined = []
        for name in self.assignment.functions:
            value = module.__dict__.get(name)
            if value is None:
                continue
            defined.append(name)
            if callable(value) and not isinstance(value, type):
                module.__dict__[name] = self._track(name, value)
        self.reply(
            {
                "kind": "loaded",
                "errors": errors,
                "defined": defined,
                "tracked": [
                    n for n in defined if not isinstance(module.__dict__[n], type)
                ],
                "printed": printed.text(),
            }
        )

    def run(self, request: dict[str, Any]) -> None:
        """One test's ``run`` on the submission's functions, under its guard."""
        from .forbidden import guard

        assert self.module is not None
        test = self.assignment.test(request["test"])
        functions = {
            name: self.module.__dict__[name]
            for name in self.assignment.functions
            if name in self.module.__dict__
        }
        printed = _Printed()
        self.stack.clear()
        self.sent_stack = ()
        outputs: Any = None
        raised: dict[str, str] | None = None
        stdout, stderr = sys.stdout, sys.stderr
        start = time.perf_counter()
        record = guard(request["groups"], student_files=self.files)
        sys.stdout = sys.stderr = printed
        try:
            with record:
                outputs = test.run(functions, request["inputs"])
        except BaseException as error:  # the student's code, whatever it raised
            raised = _describe(error, self.files)
        finally:
            self._leave_if_forked()
            sys.stdout, sys.stderr = stdout, stderr
        seconds = time.perf_counter() - start
        message = {
            "forbidden": record.message(),
            "printed": printed.text(),
            "seconds": seconds,
        }
        if raised is None:
            try:
                self.reply({"kind": "result", "outputs": outputs, **message})
                return
            except Exception as error:
                raised = {
                    "error": "the test's outputs could not be sent back to the grader "
                    f"({type(error).__name__}: {str(error)[:200]})",
                    "traceback": "",
                }
        self.reply({"kind": "raised", **raised, **message})

    def serve(self) -> None:
        import torch

        torch.set_num_threads(1)  # deterministic, and fair to a shared machine
        self.reply({"kind": "ready", "pid": os.getpid()})
        while True:
            try:
                request = self.receive()
            except EOFError:
                return
            if request["kind"] == "load":
                self.load(request)
            elif request["kind"] == "run":
                self.run(request)
            else:
                return


def _display(*objects: Any, **options: Any) -> None:
    """IPython's ``display``, as a notebook's cells call it: printed, as text."""
    for value in objects:
        print(repr(value))


def _vm_size_mb() -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        return None
    return None


def _limit_memory(memory_mb: int) -> None:
    """Limit the address space to what is mapped now plus ``memory_mb`` MiB.

    torch maps several hundred MiB at import (libraries, allocator arenas), so the
    limit is relative to the process as it stands before the student's code runs.
    Where the address space cannot be measured or limited (not Linux), the data
    segment is limited instead, if at all.
    """
    try:
        import resource
    except ImportError:  # not POSIX
        return
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash writes no core file
    if memory_mb <= 0:
        return
    base = _vm_size_mb()
    kind = resource.RLIMIT_AS if base is not None else resource.RLIMIT_DATA
    limit = ((base or 0) + memory_mb) * 2**20
    try:
        resource.setrlimit(kind, (limit, limit))
    except (ValueError, OSError):
        pass


def _preload() -> None:
    """What every student process needs, imported once by the zygote."""
    import numpy  # noqa: F401
    import torch
    import torch.nn.functional

    # What torch imports lazily on first use, which a fresh child would otherwise
    # import again (a second): backward(gradient) imports sympy through this.
    try:
        import torch.fx.experimental.symbolic_shapes
    except ImportError:
        pass

    from . import forbidden  # noqa: F401

    torch.set_num_threads(1)
    try:
        from . import assignments  # noqa: F401
    except Exception:  # the child imports (and reports) it again
        pass


def _send(sock: Any, value: Any) -> None:
    payload = pickle.dumps(value)
    sock.sendall(struct.pack(">I", len(payload)) + payload)


def _receive(sock: Any) -> tuple[dict[str, Any], list[int]]:
    import socket

    data, fds, _, _ = socket.recv_fds(sock, 65536, 8)
    if not data:
        raise EOFError
    while len(data) < 4 or len(data) < 4 + struct.unpack(">I", data[:4])[0]:
        more = sock.recv(65536)
        if not more:
            raise EOFError
        data += more
    request: dict[str, Any] = pickle.loads(data[4:])
    return request, list(fds)


def _child(sock: Any, fds: list[int], request: dict[str, Any]) -> None:
    """In a freshly forked child: become a student process, never return."""
    code = 1
    try:
        sock.close()
        os.setsid()  # its own process group, which the grader kills as a whole
        request_fd, reply_fd, output_fd = fds
        os.dup2(output_fd, 1)
        os.dup2(output_fd, 2)
        os.close(output_fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.chdir(request["cwd"])
        sys.path[:0] = request["paths"]
        faulthandler.enable()
        Worker(request_fd, reply_fd).serve()
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def _become_subreaper() -> None:
    """Adopt the orphans of the student processes (Linux's child subreaper).

    A student process that forks twice and calls ``setsid`` leaves its own process
    group, so killing the group misses it; orphaned, it becomes the zygote's child
    instead of init's, and :func:`_sweep` ends it.
    """
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(
            36, 1, 0, 0, 0
        )  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def _children() -> list[int]:
    """The pids whose parent is this process (from ``/proc``)."""
    me, found = os.getpid(), []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                data = stat.read()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == me:
            found.append(int(entry))
    return found


def _sweep(forked: set[int]) -> int:
    """Kill (and reap) every child that is not a student process forked here: the
    adopted orphans of student code. Returns how many were killed."""
    import signal

    killed = 0
    for _ in range(100):
        strays = [pid for pid in _children() if pid not in forked]
        if not strays:
            break
        for pid in strays:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        time.sleep(0.01)
        for pid in strays:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
    return killed


def zygote(fd: int) -> int:
    """Fork student processes on request, each with torch already imported.

    Requests arrive on the Unix socket ``fd``: ``fork`` (with the child's three
    pipe ends attached) answers the child's pid; ``status`` answers a child's exit
    code (negative for a signal) or None while it runs.
    """
    import socket

    sock = socket.socket(fileno=fd)
    _become_subreaper()
    _preload()
    ended: dict[int, int] = {}
    forked: set[int] = set()
    while True:
        try:
            request, fds = _receive(sock)
        except (EOFError, OSError):
            return 0
        if request["kind"] == "fork":
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(sock, fds, request)
            for child_fd in fds:
                os.close(child_fd)
            forked.add(pid)
            _send(sock, pid)
        elif request["kind"] == "sweep":
            _send(sock, _sweep(forked))
        elif request["kind"] == "status":
            pid = int(request["pid"])
            deadline = time.monotonic() + float(request["wait"])
            while pid not in ended:
                try:
                    done, status = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    break
                if done:
                    ended[pid] = os.waitstatus_to_exitcode(status)
                elif time.monotonic() >= deadline:
                    break
                else:
                    time.sleep(0.02)
            _send(sock, ended.get(pid))


def main(argv: list[str]) -> int:
    """Serve the grader on the file descriptors given in ``argv``."""
    if argv[1] == "--zygote":
        return zygote(int(argv[2]))
    faulthandler.enable()  # a crash prints the Python stack to the captured stderr
    worker = Worker(int(argv[1]), int(argv[2]))
    worker.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
