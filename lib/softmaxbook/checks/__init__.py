r"""Checkers for a student's own implementation, with feedback a student can act on.

Each ``check_<name>(fn)`` calls a student's function ``fn`` on inputs chosen to
reveal the usual mistakes, compares every result with a float64 reference, and
returns a :class:`CheckReport`: truthy when every check passes, with one
message per problem otherwise. A message says which input revealed the
problem, what was expected, what came back, and what to change:

.. code-block:: text

    With scores [1000, 0] (float64, overflow), your softmax returned [nan, 0];
    expected [1, 0]. Subtract the row maximum before exp, ...

The same mistake seen on several inputs is one message, which lists them.

What the checkers promise:

- **They never crash on a broken function.** An exception inside ``fn``, a
  result of the wrong type or shape, ``nan``: each becomes a problem message
  naming the input. If ``fn`` fails on the first, simplest input, the report
  shows that problem alone (and says so): fix that first.
- **They grade.** Each input ``fn`` is called on (and the gradient on it) is
  one check of :attr:`CheckReport.results`; :attr:`CheckReport.score` counts
  the passed ones out of :attr:`CheckReport.max_score`. The checks are the
  same for every function (they all run even when the first input fails), so
  a stub scores 0, each passed check adds its points, and a correct function
  scores full marks.
- **They are deterministic.** Inputs come from a fixed seed and a private
  ``torch.Generator`` (the global random state is never touched), so the same
  function gets the same messages on every run.
- **They check behaviour, not code**: values against the reference on several
  shapes and batch dimensions, the extreme inputs where textbook formulas break
  (overflow, underflow, ``-inf``, fully masked rows), that dtype and device are
  kept (float64, float32, float16, bfloat16), that no input is modified in
  place, and, by autograd through ``fn``, the gradient.

Conventions, those of the library:

- ``fn`` takes and returns ``torch.Tensor`` and works along the last dimension.
  With ``numpy=True`` it takes and returns NumPy arrays instead (the gradient
  and device checks are then left out, and the report says so).
- Boolean masks are **True where a query may attend**; a row with nothing to
  attend to gets all-zero weights (and a zero output), never ``nan``.
- :func:`check_softmax_backward` expects ``fn(s, grad_output)`` with ``s`` the
  softmax *output*, as :func:`softmaxbook.softmax_backward` does.
- Every result must be on the device of the inputs. The device check also
  runs ``fn`` on float32 inputs on :func:`softmaxbook.get_device` (CUDA,
  then Apple MPS) when that is not the CPU, or on the ``device`` passed.

For an autograder, ``check_softmax(fn).raise_if_failed()`` raises an
``AssertionError`` listing every problem, which pytest shows as the failure.
"""

from ._report import CheckReport, CheckResult
from .analysis import check_attention_entropy
from .attention import check_attention
from .flash import check_flash_backward, check_flash_forward, check_flash_function
from .gradients import check_softmax_backward
from .masking import check_masked_softmax
from .online import check_merge_attention_states, check_online_softmax
from .sampling import check_top_p_filter
from .sinks import check_sink_softmax
from .softmax import check_log_softmax, check_softmax
from .sparsemax import check_sparsemax

__all__ = [
    "CheckReport",
    "CheckResult",
    "check_softmax",
    "check_log_softmax",
    "check_masked_softmax",
    "check_attention",
    "check_softmax_backward",
    "check_sparsemax",
    "check_top_p_filter",
    "check_merge_attention_states",
    "check_attention_entropy",
    "check_sink_softmax",
    "check_flash_forward",
    "check_flash_backward",
    "check_flash_function",
    "check_online_softmax",
]

# The report's class keeps its public path, softmaxbook.checks.CheckReport, in
# its repr, in help() and in pickled reports (an autograder may store them), not
# the path of the private module that defines it and may move.
CheckReport.__module__ = CheckResult.__module__ = __name__

# doctest.testmod(softmaxbook.checks) runs the examples of every public name,
# although each is defined in a submodule.
__test__ = {name: globals()[name] for name in __all__}
