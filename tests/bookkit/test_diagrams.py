"""bookkit.diagrams: every diagram is phone-legible, writes math as math, and shows
the numbers its own formula gives."""

from __future__ import annotations

import math
import re

import matplotlib

matplotlib.use("Agg")  # no display in tests

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

import softmaxbook as sb
from bookkit.plotting import MIN_FONT_PT

#: The widest a diagram may be: at 6.4 in, 12.5 pt text shown 342 px wide is 9.3 px.
MAX_WIDTH_IN = 6.4
#: Math written as text: d_k, m_old, sqrt(, e^( outside $...$.
MATH_AS_TEXT = re.compile(r"sqrt\(|(?<![\w\\{])[A-Za-z]_(?:\{|[A-Za-z0-9])|\^\(")


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _flex_args():
    doc = sb.document_ids([3, 5, 2], 12)
    packed = sb.document_mask(doc, causal=True)

    def document_mod(b, h, q, k):
        return (doc[q] == doc[k]) & (doc[q] >= 0) & (q >= k)

    n = 12
    hidden = (torch.arange(n)[:, None] >= torch.arange(n)) & ~packed
    some = hidden.any(0)
    lts = torch.where(some, hidden.int().argmax(0), n)
    lte = torch.where(some, n - hidden.flip(0).int().argmax(0), n)
    tiles = sb.block_mask_from_mod(document_mod, 1, 1, n, n, block_size=4)
    return packed, lts, lte, tiles.computed[0, 0], tiles.full[0, 0]


def _diagrams():
    """Every diagram, drawn with the arguments its chapter uses."""
    from bookkit import models_table
    from bookkit.diagrams import (
        backward,
        case_study,
        decoding,
        floats,
        heads,
        hybrid,
        latent,
        layer_patterns,
        lowbit,
        masks,
        output,
        pipeline,
        production,
        routing,
        scaling,
        simplex,
        sinks,
        tiles,
    )

    g = torch.Generator().manual_seed(1)
    h, w = torch.randn(4, generator=g), torch.randn(6, 4, generator=g)
    words = ["the", "a", "cat", "dog", "sat", "ran"]
    return {
        "pipeline": lambda: pipeline.draw_attention_pipeline(mask=sb.causal_mask(4)),
        "floats": lambda: floats.draw_float_ranges(),
        "scaling": lambda: scaling.draw_dot_product_variance(d_k=64),
        "mask_gallery": lambda: masks.draw_mask_gallery(8, documents=(3, 3, 2)),
        "mask_representations": lambda: masks.draw_mask_representations(
            *_flex_args(), block=4
        ),
        "interleaved_layers": lambda: masks.draw_interleaved_layers(
            (["local"] * 5 + ["global"]) * 2, window=1024, context=32 * 1024
        ),
        "backward": lambda: backward.draw_attention_backward(),
        "simplex": lambda: simplex.draw_simplex_maps(),
        "output_layer": lambda: output.draw_output_layer(
            h, w, words, generator=torch.Generator().manual_seed(0)
        ),
        "draft_tree": lambda: output.draw_draft_tree(
            [-1, -1, 0, 0, 1, 2],
            ["cat", "dog", "sat", "ran", "sat", "on"],
            prefix_words=["the", "big", "fat"],
        ),
        "online_softmax_state": lambda: tiles.draw_online_softmax_state(block=4),
        "flash_tiles": lambda: tiles.draw_flash_tiles((64, 64), seq_len=512),
        "ring": lambda: tiles.draw_ring_attention(world_size=4),
        "case_study": lambda: case_study.draw_model(),
        "sinks": lambda: sinks.draw_sinks(_sweep()),
        "kv_eviction": lambda: sinks.draw_kv_eviction(),
        "head_cache": lambda: heads.draw_head_cache(
            ["streaming"] * 5 + ["retrieval"] * 3, n=20, sinks=2, window=5
        ),
        "token_collapse": lambda: heads.draw_token_collapse(
            {
                name: [heads.token_cloud(torch.randn(16, 8, generator=g).numpy())] * 4
                for name in ("pure attention", "skip connection")
            },
            (0, 1, 2, 6),
        ),
        "softmax_bottleneck": lambda: output.draw_softmax_bottleneck(
            32, 4, 32, rank_softmax=5, rank_mixture=32, k=3
        ),
        "split_kv": lambda: decoding.draw_split_kv(
            24, [("alone: 8 chunks", 8), ("in a batch of 4: 2 chunks", 2)]
        ),
        "entropy_quadrants": lambda: decoding.draw_entropy_quadrants(),
        "layer_kinds": lambda: production.draw_layer_kinds(models_table.load_models()),
        "layer_masks": lambda: layer_patterns.draw_layer_masks(
            n=12, window=4, chunk=4, documents=(5, 3, 4)
        ),
        "layer_stacks": lambda: layer_patterns.draw_layer_stacks(
            {
                "gpt-oss": ["banded", "full"] * 6,
                "Gemma 3": (["banded"] * 5 + ["full"]) * 2,
            }
        ),
        "mla_dataflow": lambda: latent.draw_mla_dataflow(
            {
                "dim": 7168,
                "n_layers": 61,
                "n_heads": 128,
                "kv_lora_rank": 512,
                "qk_nope_head_dim": 128,
                "qk_rope_head_dim": 64,
                "v_head_dim": 128,
            }
        ),
        "hybrid_stacks": lambda: hybrid.draw_hybrid_stacks(
            {"3:1": ["linear", "linear", "linear", "softmax"] * 12}
        ),
        "router": lambda: routing.draw_router(),
        "lowbit": lambda: lowbit.draw_lowbit_attention(),
    }


def _sweep():
    from bookkit.studies import sink_study

    return sink_study.load()


DIAGRAMS = list(_diagrams())


def _drawn_texts(fig):
    """The texts a reader sees: titles, labels and ticks of axes that are on,
    texts, legends and the figure's own texts."""
    found = list(fig.texts) + ([fig._suptitle] if fig._suptitle else [])
    for ax in fig.axes:
        found += [ax.title, ax._left_title, ax._right_title, *ax.texts]
        if ax.axison:
            found += [ax.xaxis.label, ax.yaxis.label]
            for axis, (lo, hi) in (
                (ax.xaxis, ax.get_xlim()),
                (ax.yaxis, ax.get_ylim()),
            ):
                lo, hi = min(lo, hi), max(lo, hi)
                found += [
                    tick.label1
                    for tick in axis.get_major_ticks()
                    if lo <= tick.get_loc() <= hi  # ticks out of view are not drawn
                ]
        if ax.get_legend():
            found += ax.get_legend().get_texts()
    return found


@pytest.mark.parametrize("name", DIAGRAMS)
def test_diagram_is_phone_legible_and_writes_math_as_math(name):
    fig = _diagrams()[name]()
    width, _ = fig.get_size_inches()
    assert width <= MAX_WIDTH_IN + 1e-9, f"{name}: {width} in wide"
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    texts = [t for t in _drawn_texts(fig) if t.get_visible() and t.get_text().strip()]
    assert texts, name
    for t in texts:
        s = t.get_text()
        assert t.get_fontsize() >= MIN_FONT_PT, (
            f"{name}: {s!r} at {t.get_fontsize()} pt"
        )
        plain = re.sub(r"\$[^$]*\$", " ", s)
        assert not MATH_AS_TEXT.search(plain), f"{name}: math as text in {s!r}"
        # inside the figure (a text that spills out widens the saved figure)
        ext = t.get_window_extent(renderer)
        assert ext.x0 >= box.x0 - 1 and ext.x1 <= box.x1 + 1, f"{name}: {s!r} spills"


def test_online_softmax_states_follow_their_formula():
    """m is the running maximum, l the running sum of exp(z - m), and alpha =
    exp(m_old - m_new): 0 on the first tile (m_old = -inf), not 1."""
    from bookkit.diagrams.tiles import online_softmax_states

    z = np.array([0.3, 1.2, -0.4, 0.8, 2.1, 0.5, -1.0, 1.6, 0.9, 2.6, 0.1, -0.7])
    states = online_softmax_states(z.tolist(), 4)
    m_old, ell = -math.inf, 0.0
    for t, st in enumerate(states):
        tile = z[4 * t : 4 * t + 4]
        m = max(m_old, tile.max())
        alpha = math.exp(m_old - m)
        ell = alpha * ell + np.exp(tile - m).sum()
        assert (st["start"], st["stop"]) == (4 * t, 4 * t + 4)
        assert st["m"] == pytest.approx(m, abs=1e-12)
        assert st["alpha"] == pytest.approx(alpha, abs=1e-12)
        assert st["l"] == pytest.approx(ell, rel=1e-12)
        m_old = m
    assert states[0]["alpha"] == 0.0
    # the last state is the whole row's: m = max z, l = sum exp(z - max z)
    assert states[-1]["l"] == pytest.approx(np.exp(z - z.max()).sum(), rel=1e-12)


def test_online_softmax_diagram_prints_the_states():
    from bookkit.diagrams import tiles

    fig = tiles.draw_online_softmax_state(block=4)
    drawn = " ".join(t.get_text() for t in fig.findobj(matplotlib.text.Text))
    for st in tiles.online_softmax_states(
        [0.3, 1.2, -0.4, 0.8, 2.1, 0.5, -1.0, 1.6, 0.9, 2.6, 0.1, -0.7], 4
    ):
        for key, symbol in (("m", "$m$"), ("l", r"$\ell$"), ("alpha", r"$\alpha$")):
            assert f"{symbol} = {st[key]:.2f}".replace("-", "\u2212") in drawn


def test_ring_schedule_meets_every_block():
    from bookkit.diagrams.tiles import ring_schedule

    sched = ring_schedule(4)
    assert all(sorted(row) == [0, 1, 2, 3] for row in sched)  # every Q meets every KV
    assert all(sorted(col) == [0, 1, 2, 3] for col in zip(*sched))  # one holder each


def test_float_limits_are_the_formats_own():
    from bookkit.diagrams.floats import float_limits

    lim = float_limits(torch.float16)
    assert lim["max"] == 65504 and lim["normal"] == 2.0**-14
    assert lim["subnormal"] == 2.0**-24
    assert lim["exp_inf_above"] == pytest.approx(math.log(65504))
    assert lim["exp_zero_below"] == pytest.approx(math.log(2.0**-25))


def test_eviction_policies_keep_the_budget():
    from bookkit.diagrams.sinks import eviction_policies

    kept = eviction_policies(n=16, budget=8, sinks=2, heavy=(0, 5, 9))
    assert (kept["full cache"] != "").sum() == 16
    for name in ("sliding window", "StreamingLLM", "H2O"):
        assert (kept[name] != "").sum() == 8, name
    assert list(kept["StreamingLLM"][:2]) == ["sink", "sink"]
