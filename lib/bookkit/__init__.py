"""The book's harness: what only *Softmax in Attention* needs, not a course.

``softmaxbook`` is the library instructors reuse; ``bookkit`` holds what the
book's pages need beside it: the drawn diagrams (:mod:`bookkit.diagrams`) and
the claims ledger's reader (:mod:`bookkit.claims`). ``bookkit`` imports
``softmaxbook``; ``softmaxbook`` never imports ``bookkit``.
"""

__all__: list[str] = []
