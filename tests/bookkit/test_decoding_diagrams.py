"""The decoding diagrams: split-K chunks and the entropy sign rule."""

from __future__ import annotations

from itertools import pairwise

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

from bookkit.diagrams import decoding
from bookkit.plotting import MIN_FONT_PT


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.mark.parametrize(
    ("S", "splits"), [(24, 8), (24, 5), (1000, 4), (1001, 4), (3, 7)]
)
def test_split_bounds_cover_the_keys_in_near_equal_chunks(S, splits):
    bounds = decoding.split_bounds(S, splits)
    assert len(bounds) == min(splits, S)
    assert bounds[0][0] == 0 and bounds[-1][1] == S
    assert all(a[1] == b[0] for a, b in pairwise(bounds))
    lengths = [hi - lo for lo, hi in bounds]
    assert min(lengths) >= 1 and max(lengths) - min(lengths) <= 1


def test_split_bounds_of_a_multiple_are_fixed_size():
    assert decoding.split_bounds(1024, 4) == [
        (0, 256),
        (256, 512),
        (512, 768),
        (768, 1024),
    ]


def test_split_bounds_reject_empty_input():
    with pytest.raises(ValueError, match="splits"):
        decoding.split_bounds(10, 0)


@pytest.mark.parametrize(
    "draw",
    [
        lambda: decoding.draw_split_kv(24, [("alone: 8 chunks", 8), ("batch: 2", 2)]),
        decoding.draw_entropy_quadrants,
    ],
)
def test_decoding_diagrams_are_phone_legible(draw):
    fig = draw()
    assert fig.get_size_inches()[0] <= 6.4 + 1e-9
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = [t for ax in fig.axes for t in ax.texts if t.get_text().strip()]
    assert texts
    for t in texts:
        assert t.get_fontsize() >= MIN_FONT_PT
        ext = t.get_window_extent(renderer)
        assert ext.x0 >= fig.bbox.x0 - 1 and ext.x1 <= fig.bbox.x1 + 1, t.get_text()
