"""Deprecated since 0.2: this module moved to ``softmaxbook.normalizers``;
``ignore_gap`` moved to ``softmaxbook.analysis``.

Each old name still works, with a ``DeprecationWarning`` naming its new home,
until softmaxbook 0.3: use ``sb.<name>`` or ``softmaxbook.normalizers.<name>``.
"""

from ._api import moved_module

__getattr__ = moved_module(
    __name__,
    {
        "sink_softmax": "softmaxbook.normalizers",
        "softpick": "softmaxbook.normalizers",
        "clipped_softmax": "softmaxbook.normalizers",
        "relu_attention": "softmaxbook.normalizers",
        "ignore_gap": "softmaxbook.analysis",
    },
)
