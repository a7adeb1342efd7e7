"""pytest's settings for the docstrings' examples of lib/ (``make doctest``).

Triton reads ``TRITON_INTERPRET`` once, when it is first imported, and
``--doctest-modules`` imports every module (``softmaxbook.kernels._triton``
imports Triton) before the first example runs. Setting it here, before
collection, lets the kernels' examples run on CPU tensors in Triton's
interpreter on any machine, as ``kernels.enable_interpreter()`` does in a
fresh Python. The tests set it the same way (tests/test_kernels.py).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
