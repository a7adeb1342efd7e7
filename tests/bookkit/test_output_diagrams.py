"""The softmax-bottleneck diagram of chapter 7: legible on a phone, honest about d."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

from bookkit.diagrams import output
from bookkit.plotting import MIN_FONT_PT


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _texts(fig):
    return [t for ax in fig.axes for t in [ax.title, *ax.texts] if t.get_text().strip()]


@pytest.mark.parametrize(("n", "d", "v"), [(48, 4, 32), (12, 1, 40), (64, 16, 64)])
def test_bottleneck_diagram_is_legible_and_inside_the_figure(n, d, v):
    fig = output.draw_softmax_bottleneck(
        n, d, v, rank_softmax=d + 1, rank_mixture=v, k=3
    )
    assert fig.get_size_inches()[0] <= 6.4 + 1e-9
    fig.canvas.draw()
    renderer, box = fig.canvas.get_renderer(), fig.bbox
    texts = _texts(fig)
    assert texts
    for t in texts:
        assert t.get_fontsize() >= MIN_FONT_PT, t.get_text()
        ext = t.get_window_extent(renderer)
        assert box.x0 - 1 <= ext.x0 and ext.x1 <= box.x1 + 1, t.get_text()


def test_bottleneck_diagram_states_the_bound_and_the_measured_ranks():
    fig = output.draw_softmax_bottleneck(
        48, 4, 32, rank_softmax=5, rank_mixture=32, k=3
    )
    drawn = " ".join(t.get_text() for t in _texts(fig))
    assert "4 + 1" in drawn and "48$\\times$32" in drawn
    assert "log \\Pi$: 5" in drawn and "3 softmaxes: 32" in drawn


@pytest.mark.parametrize(("n", "d", "v"), [(48, 0, 32), (8, 9, 32), (48, 40, 32)])
def test_bottleneck_diagram_refuses_a_hidden_size_outside_the_shapes(n, d, v):
    with pytest.raises(ValueError, match="d="):
        output.draw_softmax_bottleneck(n, d, v)
