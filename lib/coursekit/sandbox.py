"""The grader: a submission runs in its own process, and only its outputs come back.

:func:`grade` imports the submission in a process of its own (on Linux forked from
a zygote that imported torch once, elsewhere a fresh ``python -m coursekit._worker``;
see :mod:`coursekit._process`), which has torch, numpy and the assignment's tests,
never ``softmaxbook``. For each test the grader builds the inputs (``make_inputs``), the
student's process calls the submission (``run``, under the test's forbidden-call
guard) and sends back plain data (``torch.save``, read with
``torch.load(weights_only=True)``), and the grader judges it (``judge``) against
expectations it computed itself. A submission that patches torch or the checkers
patches them in its own process only.

What student code can do to its process costs only the tests it touches:

* a test that runs past ``timeout`` seconds is stopped (the process is killed and a
  fresh one started for the next test); the function that did not return is not
  called again, and later tests of it fail with that reason;
* ``sys.exit``, ``os._exit``, a segfault or an abort in a call fail that test, with
  the exit code or signal in words; the next test gets a fresh process;
* the process may map ``memory_mb`` MiB beyond what torch maps at import; an
  allocation past that fails inside the student's code (a ``MemoryError`` or
  torch's "can't allocate memory"), which fails the test, not the grader;
* an import error, a syntax error or ``sys.exit`` at import fails every test of a
  ``.py`` file (with the error in words); in a notebook it costs only the cell;
* a process the student's code forks ends when it returns into the grader's
  loop, and one it detaches (``setsid`` after a double fork) is killed when the
  grading ends (Linux: the zygote adopts it as a child subreaper);
* the whole run stops starting tests ``total_timeout`` seconds after the first
  student process is ready (starting Python and torch is not the student's time);
  the tests left are reported as skipped.

Whatever happens, :func:`grade` returns a :class:`~coursekit.results.GradeResult`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._model import Assignment, TestCase
from ._process import START_TIMEOUT, Died, Process, TimedOut, sweep
from .results import GradeResult, Status, TestResult
from .submission import Submission, SubmissionError, load_submission

__all__ = ["grade"]


class _Grading:
    """The state of one grading run."""

    def __init__(
        self,
        assignment: Assignment,
        submission: Submission,
        *,
        locator: tuple[str, str, str | None],
        timeout: float,
        import_timeout: float,
        memory_mb: int,
        total_timeout: float,
        extra_paths: Sequence[str],
    ) -> None:
        self.assignment = assignment
        self.submission = submission
        self.files = [c.filename for c in submission.chunks]
        self.locator = locator
        self.timeout = timeout
        self.import_timeout = import_timeout
        self.memory_mb = memory_mb
        # The total limit counts from when the first student process is ready:
        # starting Python and torch is not the student's time.
        self.deadline = math.inf
        self.total_timeout = total_timeout
        self.extra_paths = extra_paths
        self.process: Process | None = None
        self.skip: set[int] = set()
        self.notes: list[str] = list(submission.notes)
        self.load_error: str | None = None
        self.defined: set[str] = set()
        self.tracked: set[str] = set()
        self.timed_out: dict[str, str] = {}  # function -> the test it timed out in
        self.loaded = False  # the submission was imported once (defined is known)
        self.out_of_time = False
        self.block = sorted(
            {p for t in assignment.tests for g in t.forbidden for p in _packages_of(g)}
        )

    # --- the student's process ----------------------------------------------------

    def _drop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process = None

    def ensure_loaded(self) -> bool:
        """A live process with the submission imported; False when that failed."""
        while self.process is None and self.load_error is None:
            if time.monotonic() > self.deadline - 0.5:
                self.out_of_time = True
                return False
            try:
                process = Process(self.extra_paths)
            except OSError as error:  # no process could be made (fork, pipes)
                self.load_error = (
                    "The grading process could not start (this is not your code's "
                    f"fault; tell your instructor): {error}"
                )
                return False
            self.process = process
            try:
                ready = process.data(time.monotonic() + START_TIMEOUT)
                if ready.get("kind") != "ready":
                    raise Died
            except (Died, TimedOut, OSError):
                tail = process.output.since(0)
                self._drop()
                self.load_error = (
                    "The grading process could not start (this is not your code's "
                    f"fault; tell your instructor): {tail or 'no output'}"
                )
                return False
            if self.deadline == math.inf:
                self.deadline = time.monotonic() + self.total_timeout
            self._load(process)
        return self.process is not None

    def _load(self, process: Process) -> None:
        chunks = [(c.source, c.filename) for c in self.submission.chunks]
        started: list[int] = []
        mark = process.output.mark()
        deadline = time.monotonic() + self.import_timeout
        capped = deadline > self.deadline  # the total limit comes first
        deadline = min(deadline, self.deadline)
        try:
            process.send(
                {
                    "kind": "load",
                    "locator": self.locator,
                    "chunks": chunks,
                    "skip": sorted(self.skip),
                    "block": self.block,
                    "memory_mb": self.memory_mb,
                    "all_or_nothing": self.submission.all_or_nothing,
                }
            )
            loaded = process.data(deadline, started)
            if loaded.get("kind") == "broken":
                self._drop()
                self.load_error = (
                    "The grader could not load the assignment's tests (not your "
                    f"code's fault; tell your instructor): {loaded.get('error')}"
                )
                return
            errors = [
                (int(e["index"]), str(e["error"]), str(e["traceback"]))
                for e in loaded["errors"]
            ]
            defined = {str(name) for name in loaded["defined"]}
            tracked = {str(name) for name in loaded["tracked"]}
        except Exception as error:  # it died, timed out, or sent back garbage
            if isinstance(error, TimedOut) and capped:
                self._drop()
                self.out_of_time = True
                return
            if isinstance(error, TimedOut):
                why = (
                    f"did not finish within {self.import_timeout:g} s (an endless "
                    "loop at module level?)"
                )
            elif isinstance(error, Died):
                why = str(error) or process.how_it_ended()
            else:
                why = "sent back a reply the grader could not read"
            # End it first: a process still running (an endless loop) keeps its
            # output pipe open, and reading the output's tail would wait for it.
            self._drop()
            tail = process.output.since(mark)
            where = self._chunk_label(started[-1] if started else None)
            if self.submission.all_or_nothing or not started:
                self.load_error = f"Importing {where} {why}." + _tail(tail, self.files)
            else:
                self.skip.add(started[-1])
                self.notes.append(f"Running {where} {why}; it was skipped.")
            return
        for index, message, traceback in errors:
            where = self._chunk_label(index)
            text = message + (f"\n{traceback}" if traceback else "")
            if self.submission.all_or_nothing:
                self.load_error = f"Your code did not import: {text}"
            else:
                self.notes.append(
                    f"{where[0].upper()}{where[1:]} raised {text}\n"
                    "(the cells after it still ran)."
                )
        self.notes = list(dict.fromkeys(self.notes))
        self.defined = defined
        self.tracked = tracked
        self.loaded = True
        if self.load_error:
            self._drop()

    def _chunk_label(self, index: int | None) -> str:
        if index is None or not 0 <= index < len(self.submission.chunks):
            return "your code"
        chunk = self.submission.chunks[index]
        if self.submission.all_or_nothing:
            return chunk.filename
        return f"{chunk.label} of {Path(self.submission.path).name}"

    # --- one test -------------------------------------------------------------------

    def result(
        self, test: TestCase, status: Status, output: str, seconds: float = 0.0
    ) -> TestResult:
        return TestResult(
            name=test.name,
            score=test.points if status == "passed" else 0.0,
            max_score=test.points,
            visibility=test.visibility,
            output=output,
            status=status,
            description=test.description,
            seconds=round(seconds, 3),
        )

    def run_test(self, test: TestCase) -> TestResult:
        if self.load_error is None and not self.out_of_time:
            self.ensure_loaded()
        if self.load_error is not None:
            return self.result(test, "error", self.load_error)
        missing = [f for f in test.functions if f not in self.defined]
        if missing and self.loaded:
            names = ", ".join(f"`{f}`" for f in missing)
            notes = "\n".join(self.notes)
            return self.result(
                test,
                "error",
                f"Your submission does not define {names} at module level."
                + (f"\n{notes}" if notes else ""),
            )
        stuck = [f for f in test.functions if f in self.timed_out]
        if stuck:
            f = stuck[0]
            return self.result(
                test,
                "timeout",
                f"Not run: `{f}` did not return within {self.timeout:g} s in test "
                f"`{self.timed_out[f]}`, and a function that timed out is not "
                "called again.",
            )
        left = self.deadline - time.monotonic()
        if self.out_of_time or left < 0.5:
            return self.result(
                test,
                "skipped",
                f"Not run: the grading run reached its total limit of "
                f"{self.total_timeout:g} s.",
            )
        try:
            inputs = test.make_inputs()
        except Exception as error:
            return self.result(
                test,
                "error",
                "The grader could not build this test's inputs (a problem in the "
                f"assignment, not in your code): {type(error).__name__}: {error}",
            )
        return self._call(test, inputs, min(self.timeout, left))

    def _call(self, test: TestCase, inputs: dict[str, Any], limit: float) -> TestResult:
        process = self.process
        assert process is not None
        mark = process.output.mark()
        process.stack = []
        start = time.monotonic()
        try:
            process.send(
                {
                    "kind": "run",
                    "test": test.name,
                    "inputs": inputs,
                    "groups": list(test.forbidden),
                }
            )
            reply = process.data(start + limit)
        except TimedOut:
            blamed = self._blame(test, process.stack)
            self._drop()
            names = ", ".join(f"`{f}`" for f in blamed)
            return self.result(
                test,
                "timeout",
                f"{names} did not return within {limit:g} s (an endless loop, or far "
                "too slow); the test was stopped, and "
                + ("it is" if len(blamed) == 1 else "they are")
                + " not called again.",
                time.monotonic() - start,
            )
        except Died as error:
            why = str(error) or process.how_it_ended()
            tail = process.output.since(mark)
            where = f" (in `{process.stack[-1]}`)" if process.stack else ""
            self._drop()
            return self.result(
                test,
                "error",
                f"Your code{where} {why}." + _tail(tail, self.files),
                time.monotonic() - start,
            )
        except Exception as error:  # a reply that is not plain data
            self._drop()
            return self.result(
                test,
                "error",
                "What your code returned could not be read back as plain data "
                f"({type(error).__name__}: {str(error)[:300]}).",
                time.monotonic() - start,
            )
        return self._judge(test, inputs, reply)

    def _blame(self, test: TestCase, stack: list[str]) -> list[str]:
        blamed = [f for f in stack if f in self.assignment.functions]
        blamed += [f for f in test.functions if f not in self.tracked]
        if not blamed:
            blamed = list(test.functions)
        blamed = list(dict.fromkeys(blamed))
        for f in blamed:
            self.timed_out.setdefault(f, test.name)
        return blamed

    def _judge(
        self, test: TestCase, inputs: dict[str, Any], reply: dict[str, Any]
    ) -> TestResult:
        seconds = reply.get("seconds")
        seconds = float(seconds) if isinstance(seconds, int | float) else 0.0
        printed = str(reply.get("printed", ""))
        shown = f"\n\nYour code printed:\n{printed}" if printed.strip() else ""
        if reply.get("forbidden"):
            return self.result(
                test, "forbidden", str(reply["forbidden"]) + shown, seconds
            )
        if reply.get("kind") == "raised":
            where = f"\n{reply['traceback']}" if reply.get("traceback") else ""
            text = self._memory_hint(f"{reply.get('error')}{where}")
            return self.result(test, "error", text + shown, seconds)
        try:
            verdict = test.judge(inputs, reply.get("outputs"))  # type: ignore[arg-type]
        except Exception as error:
            return self.result(
                test,
                "error",
                "What your code returned could not be checked "
                f"({type(error).__name__}: {str(error)[:300]}); check the return "
                "types against the assignment's spec." + shown,
                seconds,
            )
        if verdict is None:
            return self.result(test, "passed", "", seconds)
        return self.result(test, "failed", self._memory_hint(verdict) + shown, seconds)

    def _memory_hint(self, text: str) -> str:
        if "allocate memory" in text or "MemoryError" in text:
            text += (
                f"\n(The grader gives your code {self.memory_mb} MiB of memory beyond "
                "what torch needs.)"
            )
        return text

    def close(self) -> None:
        if self.process is not None:
            try:
                self.process.send({"kind": "quit"})
            except Died:
                pass
            self._drop()


def _packages_of(group: str) -> tuple[str, ...]:
    from .forbidden import GROUPS

    found = GROUPS.get(group)
    return found.packages if found is not None else ()


def _tail(text: str, files: Sequence[str] = ()) -> str:
    """A dead process's last output, its crash report cut to the student's frames.

    Python's fault handler prints every frame (the grader's too, with their paths)
    and the extension modules loaded; a student needs the lines of their own code.
    """
    kept = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith('File "'):
            if not any(stripped.startswith(f'File "{f}"') for f in files):
                continue
        elif stripped.startswith(
            ("Extension modules:", "Current thread ", "Thread 0x")
        ):
            continue
        kept.append(line)
    shown = "\n".join(kept).strip()
    return f"\nIts last output:\n{shown}" if shown else ""


def grade(
    assignment: str | Assignment,
    submission: str | Path,
    *,
    timeout: float = 10.0,
    memory_mb: int = 4096,
    total_timeout: float = 300.0,
    import_timeout: float | None = None,
    locator: tuple[str, str, str | None] | None = None,
    extra_paths: Sequence[str] = (),
) -> GradeResult:
    """Grade ``submission`` (a ``.py`` or ``.ipynb`` file) on ``assignment``.

    Parameters
    ----------
    assignment
        An assignment id (``"softmax"``, ...) or an :class:`~coursekit.Assignment`.
    submission
        The student's file.
    timeout
        Seconds each test may run in the student's process.
    memory_mb
        MiB the student's process may map beyond what torch maps at import.
    total_timeout
        Seconds for the whole run, from when the first student process is ready;
        tests not started by then are skipped.
    import_timeout
        Seconds the submission's module-level code may run (default
        ``max(3 * timeout, 10)``).
    locator
        How the student's process finds an :class:`Assignment` given as an object:
        ``(module, attribute, None)`` for a module attribute, or ``(module,
        function, argument)`` for a function call. Registered assignments need none.
    extra_paths
        Folders added to the student's process's ``sys.path`` (to import
        ``locator``'s module).

    Returns
    -------
    GradeResult
        Always: a submission that cannot be read or imported scores 0, with the
        reason in ``error``.
    """
    from .assignments import get_assignment

    if isinstance(assignment, str):
        assignment = get_assignment(assignment)
        locator = locator or ("coursekit.assignments", "get_assignment", assignment.id)
    elif locator is None:
        raise ValueError("locator: needed when the assignment is given as an object")
    for name, value in (("timeout", timeout), ("total_timeout", total_timeout)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0 seconds, got {value!r}")
    if import_timeout is None:
        import_timeout = max(3 * timeout, 10.0)
    start = time.monotonic()
    try:
        loaded = load_submission(submission)
    except SubmissionError as error:
        message = f"Your submission could not be read: {error}"
        tests = [
            TestResult(
                t.name, 0.0, t.points, t.visibility, message, "error", t.description
            )
            for t in assignment.tests
        ]
        return GradeResult.collect(assignment.id, tests, error=message)
    loaded, early_error = _precompile(loaded)
    grading = _Grading(
        assignment,
        loaded,
        locator=locator,
        timeout=timeout,
        import_timeout=import_timeout,
        memory_mb=memory_mb,
        total_timeout=total_timeout,
        extra_paths=extra_paths,
    )
    grading.load_error = early_error
    try:
        results = [grading.run_test(t) for t in assignment.tests]
    finally:
        grading.close()
        sweep()  # what the student's code detached from its process group
    return GradeResult.collect(
        assignment.id,
        results,
        error=grading.load_error,
        notes=grading.notes,
        seconds=time.monotonic() - start,
    )


def _precompile(submission: Submission) -> tuple[Submission, str | None]:
    """Syntax errors found here, without running anything: a ``.py`` file that does
    not compile fails as a whole; a notebook cell that does not is dropped."""
    kept = []
    notes = list(submission.notes)
    for chunk in submission.chunks:
        try:
            compile(chunk.source, chunk.filename, "exec")
        except (SyntaxError, ValueError) as error:
            line = getattr(error, "lineno", None)
            text = (getattr(error, "text", None) or "").rstrip()
            where = f"line {line} of {chunk.filename}" if line else chunk.filename
            message = (
                f"{type(error).__name__} at {where}: {getattr(error, 'msg', error)}"
            )
            if text:
                message += f"\n    {text.strip()}"
            if submission.all_or_nothing:
                return submission, f"Your code did not compile: {message}"
            notes.append(f"{message}\n(this cell was skipped; the others still ran).")
            continue
        kept.append(chunk)
    return Submission(submission.path, submission.kind, tuple(kept), tuple(notes)), None
