"""The what-ships data file of chapter 11 and its loader (bookkit.models_table)."""

from __future__ import annotations

import copy
import json

import pytest

from bookkit import models_table as mt


@pytest.fixture(scope="module")
def raw():
    with open(mt.DATA_FILE, encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def rows():
    return mt.load_models()


def test_at_least_twelve_models_released_2024_to_2026(rows):
    assert len(rows) >= 12
    assert len({r.model for r in rows}) == len(rows)
    assert all(2024 <= r.released <= 2026 for r in rows)


def test_every_cell_has_a_value_or_not_found_and_a_source(raw):
    for row in raw["models"]:
        assert set(mt.COLUMNS) <= set(row["cells"]), row["model"]
        for col in mt.COLUMNS:
            cell = row["cells"][col]
            assert cell["value"] not in (None, ""), (row["model"], col)
            src = cell["source"]
            assert src["repo"].count("/") == 1 and src["path"] and src["field"], (
                row["model"],
                col,
            )


def test_known_vocabulary(rows):
    for r in rows:
        for col, vocab in (
            ("attention", mt.ATTENTION_KINDS),
            ("normalizer", mt.NORMALIZERS),
            ("router", mt.ROUTERS),
        ):
            assert r.values[col] in vocab | {mt.NOT_FOUND}, (r.model, col)


def test_not_found_cells_carry_no_value(raw):
    # "not found" is the whole value, never a guess beside it
    for row in raw["models"]:
        for col, cell in row["cells"].items():
            if isinstance(cell["value"], str) and "not found" in cell["value"]:
                assert cell["value"] == mt.NOT_FOUND, (row["model"], col)


def _broken(raw, model_index, column, **change):
    data = copy.deepcopy(raw)
    cell = data["models"][model_index]["cells"][column]
    cell.update(change)
    return data


@pytest.mark.parametrize(
    ("column", "change", "message"),
    [
        ("attention", {"value": "softmax-free"}, "attention"),
        ("normalizer", {"value": "sparsemax"}, "normalizer"),
        ("router", {"value": "argmax"}, "router"),
        ("q_heads", {"value": 0}, "positive integer"),
        ("kv_heads", {"value": ""}, "not found"),
        ("context", {"source": {"repo": "x/y", "path": "", "field": "f"}}, "path"),
        (
            "sinks",
            {"source": {"repo": "noslash", "path": "p", "field": "f"}},
            "owner/name",
        ),
    ],
)
def test_malformed_row_raises_a_clear_error(raw, column, change, message):
    data = _broken(raw, 0, column, **change)
    with pytest.raises(ValueError, match=message) as err:
        mt.validate(data)
    assert raw["models"][0]["model"] in str(err.value)
    assert column in str(err.value)


def test_missing_column_and_bad_year_are_named(raw):
    data = copy.deepcopy(raw)
    del data["models"][1]["cells"]["softcap"]
    with pytest.raises(ValueError, match="softcap"):
        mt.validate(data)
    data = copy.deepcopy(raw)
    data["models"][2]["released"]["value"] = 2019
    with pytest.raises(ValueError, match="released"):
        mt.validate(data)
    with pytest.raises(ValueError, match="models"):
        mt.validate({"models": []})


def test_kv_cache_bytes_per_token(rows):
    by = {r.model: r for r in rows}
    # MLA: one latent of kv_lora_rank + qk_rope_head_dim = 576 per layer, 61 layers
    assert mt.kv_cache_bytes_per_token(by["DeepSeek-V3"]) == 61 * 576 * 2
    # GQA: key and value, 8 heads of 64, on the 18 full layers of 36
    assert mt.kv_cache_bytes_per_token(by["gpt-oss"]) == 18 * 8 * 64 * 2 * 2
    # a needed cell not found gives None, never a guess
    assert mt.kv_cache_bytes_per_token(by["MiniMax-Text-01"]) is None
    with pytest.raises(ValueError, match="bytes_per_value"):
        mt.kv_cache_bytes_per_token(by["gpt-oss"], bytes_per_value=0)


def test_markdown_table_and_count(rows):
    table = mt.markdown_table(rows, ["attention", "kv_heads"])
    lines = table.splitlines()
    assert len(lines) == len(rows) + 2
    assert lines[0] == "| model | attention | kv_heads |"
    with pytest.raises(ValueError, match="columns"):
        mt.markdown_table(rows, ["nope"])
    assert mt.count(rows, "attention", lambda v: v == "GQA") >= 1
    with pytest.raises(ValueError, match="column"):
        mt.count(rows, "nope", bool)
