"""The deprecation table: every deprecated spelling goes in the version it names.

``softmaxbook._api.DEPRECATIONS`` lists each deprecated module path, keyword and
dispatch path name with the version that removes it. These tests fail once a
spelling outlives that version (``softmaxbook.__version__`` is read, so bumping
the version is what makes them fail), and they check that each kind of shim in
the library is in the table.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil

import pytest

import softmaxbook as sb
from softmaxbook import _api
from softmaxbook.kernels import dispatch


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:2])


VERSION = _version(sb.__version__)
TABLE = _api.DEPRECATIONS


def test_the_table_is_well_formed():
    assert TABLE, "the table is empty: then these tests check nothing"
    for entry in TABLE:
        assert entry.kind in {"module", "keyword", "path"}, entry
        assert _version(entry.since) < _version(entry.removed_in), entry
    olds = [(entry.kind, entry.old) for entry in TABLE]
    assert len(olds) == len(set(olds)), "an old spelling is listed twice"


@pytest.mark.parametrize("entry", TABLE, ids=lambda entry: entry.old)
def test_no_spelling_outlives_its_removal_version(entry):
    # Once softmaxbook reaches entry.removed_in, the shim must be gone: remove it
    # and its table entry (and say so in the CHANGELOG).
    assert VERSION < _version(entry.removed_in), (
        f"{entry.old} was to be removed in {entry.removed_in}, and this is "
        f"{sb.__version__}: remove the shim and its entry in _api.DEPRECATIONS"
    )


@pytest.mark.parametrize(
    "entry", [e for e in TABLE if e.kind == "module"], ids=lambda e: e.old
)
def test_a_moved_module_imports_as_its_new_home(entry):
    assert importlib.import_module(entry.old) is importlib.import_module(entry.new)


def test_every_keyword_shim_is_in_the_table():
    # renamed_keywords refuses a keyword missing from the table; every entry of
    # kind "keyword" is in use (a removed shim leaves no entry behind).
    keywords = {e.old for e in TABLE if e.kind == "keyword"}
    assert set(_api.APPLIED_KEYWORDS) == keywords
    with pytest.raises(LookupError, match=r"not in softmaxbook\._api\.DEPRECATIONS"):
        _api.renamed_keywords(old="new")(lambda *, new=None: new)


def test_every_old_path_name_is_in_the_table():
    paths = {e.old for e in TABLE if e.kind == "path"}
    assert paths == set(dispatch.OLD_PATH_NAMES)
    for old, new in dispatch.OLD_PATH_NAMES.items():
        assert new <= set(dispatch.PATHS), old


def test_the_0_2_shim_modules_are_gone():
    # The CHANGELOG of 0.2 promised their removal in 0.3: they shared their names
    # with the modules of softmaxbook.normalizers.
    for old in ("alternatives", "sinks", "length", "stickbreaking"):
        assert importlib.util.find_spec(f"softmaxbook.{old}") is None
    assert not hasattr(_api, "moved_module")


def test_no_other_shim_mechanism_in_the_library():
    # One table, two readers (renamed_keywords, alias_moved_modules): no other
    # module of the library issues a DeprecationWarning of its own.
    for info in pkgutil.walk_packages(sb.__path__, prefix="softmaxbook."):
        if info.name == "softmaxbook._api":
            continue
        source = inspect.getsource(importlib.import_module(info.name))
        assert "DeprecationWarning," not in source, info.name
