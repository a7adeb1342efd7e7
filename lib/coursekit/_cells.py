"""The notebook JSON the kit writes (student, nbgrader and otter notebooks), built once.

Plain dictionaries in nbformat 4.5's schema, so the kit needs no nbformat to write
them (the ``[course]`` extra's nbformat validates them in the tests), and the
``ast`` helper the stub and solution-region writers share.
"""

from __future__ import annotations

import ast
from typing import Any

KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}


def markdown(text: str) -> dict[str, Any]:
    """A Markdown cell."""
    return {"cell_type": "markdown", "metadata": {}, "source": text}


def raw(text: str) -> dict[str, Any]:
    """A raw cell (otter's ``# BEGIN QUESTION`` markers are raw cells)."""
    return {"cell_type": "raw", "metadata": {}, "source": text}


def code(text: str) -> dict[str, Any]:
    """A code cell, never run."""
    return {
        "cell_type": "code",
        "execution_count": None,
        "metadata": {},
        "outputs": [],
        "source": text,
    }


def notebook(cells: list[dict[str, Any]], id_prefix: str) -> dict[str, Any]:
    """A Python 3 notebook of ``cells``, each given the id nbformat 4.5 requires."""
    for number, cell in enumerate(cells):
        cell["id"] = f"{id_prefix}-{number}"
    return {
        "cells": cells,
        "metadata": {
            "kernelspec": dict(KERNELSPEC),
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def functions(body: list[ast.stmt]) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The functions of a module body, methods of its classes included, in order."""
    found: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.append(node)
        elif isinstance(node, ast.ClassDef):
            found.extend(functions(node.body))
    return found
