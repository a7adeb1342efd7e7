"""One compiled function for many cases: the harness of the compile tests.

Compiling each case alone spends most of a test's time in the compiler; one
``fullgraph=True`` function that runs every case is traced, differentiated and
lowered once. The cases share no tensor, so each case's results are those it
would have compiled alone.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
import torch._dynamo
import torch._inductor.config

# For these tests only (patched around each compile, never for users): inductor
# generates scalar C++ loops, not AVX vector code, and compiles them without
# line tables. The graphs, their lowering, fusion and scheduling are inductor's
# as a user gets them; generating and compiling the vector loops (and their
# tails) as well took a third of the tests' CPU on a 2-core machine, and the
# vector code is torch's to test, not this library's.
INDUCTOR_TEST_CONFIG = {
    "cpp.vec_isa_ok": False,
    "aot_inductor.enable_line_tables": False,
}


def selected(names: Sequence[Any]) -> list[Any]:
    """``names``, or those named in ``COMPILE_CASES`` (comma-separated)."""
    chosen = os.environ.get("COMPILE_CASES")
    return [n for n in names if chosen is None or n in chosen.split(",")]


def compile_together(
    every_case: Callable[..., Any],
    run: Callable[[Callable[..., Any]], Any],
    backend: str,
    cases: Sequence[Any],
    alone: Callable[[Any], None],
) -> tuple[Any, torch.fx.GraphModule]:
    """``run(torch.compile(every_case, fullgraph=True, backend=backend))`` and the
    one graph dynamo made. If it does not compile (a graph break fails
    ``fullgraph=True``), each case is compiled alone (``alone(case)``) and the
    test fails naming those that fail."""
    graphs: list[torch.fx.GraphModule] = []

    def recording(gm, example_inputs):  # type: ignore[no-untyped-def]
        graphs.append(gm)
        return torch._dynamo.lookup_backend(backend)(gm, example_inputs)

    torch._dynamo.reset()
    try:
        with torch._inductor.config.patch(INDUCTOR_TEST_CONFIG):
            compiled = run(torch.compile(every_case, fullgraph=True, backend=recording))
    except Exception as error:
        if len(cases) == 1:
            raise
        broken = []
        for case in cases:  # which case(s) fail to compile alone
            try:
                alone(case)
            except Exception:  # any failure names the case
                broken.append(case)
        pytest.fail(f"{backend} fails to compile {broken or list(cases)}: {error}")
    finally:
        torch._dynamo.reset()
    assert len(graphs) == 1  # fullgraph: one graph holds every case
    return compiled, graphs[0]
