"""The five assignments of the course kit, by id.

Each lives in its own folder (``softmax/``, ``attention/``, ``gradients/``,
``flash_attention/``, ``sparse_maps/``): ``spec.md`` (what to implement),
``solution.py`` (the reference solution, for instructors) and ``tests.py`` (the
:class:`~coursekit._model.TestCase` objects and the
:class:`~coursekit._model.Assignment`).

Importing this package imports torch and the standard library only: the student's
process imports it too, to find a test's ``run``. The float64 references the tests
compare with (``_refs``, which uses :mod:`softmaxbook.reference`) are imported inside
``make_inputs`` and ``judge`` only, in the grader's process.
"""

from __future__ import annotations

from .._model import Assignment
from .attention.tests import ASSIGNMENT as _ATTENTION
from .flash_attention.tests import ASSIGNMENT as _FLASH
from .gradients.tests import ASSIGNMENT as _GRADIENTS
from .softmax.tests import ASSIGNMENT as _SOFTMAX
from .sparse_maps.tests import ASSIGNMENT as _SPARSE

__all__ = ["ASSIGNMENTS", "get_assignment"]

#: The assignments by id, in the order a course meets them.
ASSIGNMENTS: dict[str, Assignment] = {
    a.id: a for a in (_SOFTMAX, _ATTENTION, _GRADIENTS, _FLASH, _SPARSE)
}


def get_assignment(id: str) -> Assignment:
    """The assignment ``id``; ``ValueError`` naming the known ids otherwise."""
    try:
        return ASSIGNMENTS[id]
    except (KeyError, TypeError):
        known = ", ".join(ASSIGNMENTS)
        raise ValueError(f"unknown assignment id {id!r}; known: {known}") from None
