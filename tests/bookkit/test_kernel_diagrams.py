"""bookkit.diagrams.kernels: the kernels page's tiles come from the launcher's rule,
and its figures draw from the stored compile report."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")
pytest.importorskip("matplotlib")

import matplotlib

matplotlib.use("Agg")

from bookkit.diagrams import kernels as kd
from softmaxbook import kernels


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_tiles_are_the_launchers(head_dim, dtype):
    import torch

    t = kd.flash_tiles(head_dim, dtype)
    cfg = kernels.flash_launch_config(head_dim, getattr(torch, dtype))
    assert (t["block_m"], t["block_n"]) == (cfg["BLOCK_M"], cfg["BLOCK_N"])
    rows, cols, nbytes, where = t["tiles"]["acc"]
    assert (rows, cols, where) == (cfg["BLOCK_M"], cfg["BLOCK_DV"], "registers")
    assert nbytes == rows * cols * 4  # the accumulator is float32 whatever the input
    k_rows, k_cols, k_bytes, _ = t["tiles"]["K"]
    size = 2 if dtype == "float16" else 4
    assert k_bytes == t["num_stages"] * k_rows * k_cols * size


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="dtype"):
        kd.flash_tiles(64, "int8")
    with pytest.raises(ValueError, match="head_dim"):
        kd.flash_tiles(0, "float16")


def test_figures_draw():
    import matplotlib.pyplot as plt

    report = kd.load_gpu_report()
    for fig in (kd.draw_kernel_memory(128, "float16"), kd.draw_gpu_report(report)):
        assert fig.get_axes()
        plt.close(fig)
