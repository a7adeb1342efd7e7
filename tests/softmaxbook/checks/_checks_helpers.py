"""What the test_checks_* files share: a report's verdicts, and the -inf they fill with.

Imported by its basename (pytest's prepend import mode puts this folder on sys.path).
"""

from __future__ import annotations

NEG_INF = float("-inf")


def _assert_caught(report, fragments):
    text = " ".join(" ".join(report.problems).split())
    assert not report.ok
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in the report:\n{report}"


def _assert_passes(report):
    assert report.ok, str(report)
