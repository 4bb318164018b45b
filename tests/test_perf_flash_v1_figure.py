"""bench/flash_v1_figure.py's conversion of the FlashAttention-2 paper's Figure 4 bars (the experiment the
model did not adopt: docs/performance-model.md, "FlashAttention v1 per sequence length")."""

from __future__ import annotations

import numpy as np
import pytest

from bench.flash_v1_figure import nearest_head_dim, shares
from chameleon_opt.perf.calibration import flash_attention_seconds, utilisation_at


def test_a_bar_over_the_peak_prices_the_figures_own_flops_in_its_time() -> None:
    """Figure 4 (c), head dim 64, causal, s2048: batch 8 x 32 heads at 77 TFLOP/s on the paper's count
    (4 b s^2 h d, halved causal, x 3.5 forward + backward). The model's core at the table's share takes
    that time: the two FLOP conventions agree."""
    b, s, heads, d = 8, 2048, 32, 64
    figure_s = 3.5 * (4 * b * s**2 * heads * d / 2) / 77e12
    share = utilisation_at(shares("cuda")[64], s)
    forward, backward = flash_attention_seconds(np.array([4.0 * b * s**2 * heads * d]), 312e12 * share)
    assert float(forward[0] + backward[0]) == pytest.approx(figure_s, rel=1e-12)
    assert float(backward[0] / forward[0]) == pytest.approx(2.5)


def test_lengths_past_the_figure_keep_its_end_bars_and_head_dims_read_the_nearest() -> None:
    assert utilisation_at(shares("cuda")[128], 65536) == pytest.approx(83 / 312)
    assert utilisation_at(shares("triton")[64], 256) == pytest.approx(59 / 312)
    tables = shares("cuda")
    assert (nearest_head_dim(tables, 64), nearest_head_dim(tables, 80), nearest_head_dim(tables, 96),
            nearest_head_dim(tables, 128)) == (64, 64, 128, 128)   # log2(96) is 6.58: nearer 128
