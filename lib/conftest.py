"""pytest's settings for the docstrings' examples of lib/ (``make doctest``).

Triton reads ``TRITON_INTERPRET`` once, when it is first imported, and
``--doctest-modules`` imports every module (``softmaxbook.kernels._triton``
imports Triton) before the first example runs. Setting it here, before
collection, lets the kernels' examples run on CPU tensors in Triton's
interpreter on any machine, as ``kernels.enable_interpreter()`` does in a
fresh Python. The tests set it the same way (tests/conftest.py).

Every example starts from the same random state, as every test does
(tests/conftest.py): the examples print booleans and rounded values, so the
seed only makes a rare tie at a rounding boundary reproducible.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _seed() -> Iterator[None]:
    import numpy as np
    import torch

    torch.manual_seed(0)
    np.random.seed(0)
    yield
