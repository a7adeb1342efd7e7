"""Stands in for the installed ``rfc3987_syntax`` in the real tools' processes.

Importing it fails, so jsonschema (imported by nbformat in every otter and nbgrader
process, and in otter's kernels) leaves out its two "iri" format checkers, as it does
when the package is not installed: the package builds a Lark grammar at import, about
2.4 s of CPU per process, for checks that no notebook schema asks for.
tests/book/test_student.py blocks it the same way.
"""

raise ImportError("rfc3987_syntax is left out of the course-kit tool tests")
