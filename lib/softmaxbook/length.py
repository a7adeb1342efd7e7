"""Deprecated since 0.2: this module moved to ``softmaxbook.normalizers``.

Each old name still works, with a ``DeprecationWarning`` naming its new home,
until softmaxbook 0.3: use ``sb.<name>`` or ``softmaxbook.normalizers.<name>``.
"""

from ._api import moved_module

__getattr__ = moved_module(
    __name__,
    {
        "scalable_softmax": "softmaxbook.normalizers",
        "yarn_logit_scale": "softmaxbook.normalizers",
        "adaptive_temperature_softmax": "softmaxbook.normalizers",
    },
)
