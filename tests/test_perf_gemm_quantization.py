"""bench/gemm_quantization.py's tile and wave factor on hand-worked cases (the experiment the model did not
adopt: docs/performance-model.md, "GEMM tile and wave quantization")."""

from __future__ import annotations

import pytest

from bench.gemm_quantization import TILES, identical_gemm_groups, inflation, linear_shapes, wave_share

LARGE = TILES["large"]


def test_the_guides_a100_example_fills_98_of_108_sms_in_one_wave() -> None:
    # 1792 x 1792 in 256 x 128 tiles: 7 x 14 = 98 tiles, one wave on the A100's 108 SMs
    assert wave_share(1792, 1792, 108, ((256, 128),)) == pytest.approx(98 / 108)


def test_one_tile_past_a_full_wave_costs_a_second_wave() -> None:
    # 109 tiles of 256 x 128 (a 256-row output 109 tiles wide) on 108 SMs: two waves, 109 of 216 slots used
    assert wave_share(256, 128 * 109, 108, ((256, 128),)) == pytest.approx(109 / 216)


def test_the_better_orientation_of_the_two_large_tiles_is_taken() -> None:
    # 128 x 27648: 256 x 128 tiles are half empty and need 216 of them (two waves); 128 x 256 tiles fit
    # it exactly in 108, one full wave
    assert wave_share(128, 256 * 108, 108, ((256, 128),)) == pytest.approx(0.5)
    assert wave_share(128, 256 * 108, 108, LARGE) == pytest.approx(1.0)


def test_a_partial_edge_tile_is_charged_whole() -> None:
    # 257 rows need two 256-row tiles of which the second does one row's work: 257 / 512 of one wave
    assert wave_share(257, 128, 108, ((256, 128),)) == pytest.approx(257 * 128 / (108 * 256 * 128))


def test_split_k_fills_the_sms_a_small_weight_gradient_leaves_idle() -> None:
    # a 768 x 768 weight gradient: 3 x 6 = 18 tiles on 108 SMs; split 6 ways over a 49152-token reduction
    # it fills one wave exactly
    assert wave_share(768, 768, 108, ((256, 128),)) == pytest.approx(18 / 108)
    assert wave_share(768, 768, 108, ((256, 128),), depth=49152) == pytest.approx(1.0)


def test_a_wave_aligned_block_loses_only_in_its_weight_gradients_unless_split() -> None:
    # 27648 tokens = 108 rows of 256: the forward and input-gradient outputs (tokens x a multiple of 128)
    # fill whole waves. The weight gradients (N x K) do not: 3072 x 1024 is 96 tiles (one wave, 96/108
    # used), 1024 x 1024 is 32 (32/108), 4096 x 1024 and 1024 x 4096 are 128 each (two waves, 128/216);
    # FLOP-weighted 3 : 1 : 4 : 4, their time is (3 x 108/96 + 108/32 + 8 x 216/128) / 12 = 1.6875 of
    # unquantized, the backward's (1 + 1.6875) / 2. Split over the 27648-deep reduction they fill the SMs.
    shapes = linear_shapes(hidden=1024, q_dim=1024, kv_dim=1024, ffn=4096, gated=False, tp=1)
    assert shapes == [(1024, 3072), (1024, 1024), (1024, 4096), (4096, 1024)]
    tile = ((256, 128),)
    forward, backward = inflation(tokens=256 * 108, shapes=shapes, sms=108, tiles=tile, split_k=False)
    assert forward == pytest.approx(1.0) and backward == pytest.approx((1 + 1.6875) / 2)
    forward, backward = inflation(tokens=256 * 108, shapes=shapes, sms=108, tiles=tile, split_k=True)
    assert forward == pytest.approx(1.0) and 1.0 <= backward < 1.005


def test_rows_are_grouped_by_model_die_and_tokens_per_micro_batch() -> None:
    published = {"rows": [
        {"id": "a", "source": "llm_foundry", "gpu": "A100-40", "error_lofo": 0.03},
        {"id": "b", "source": "llm_foundry", "gpu": "A100-80", "error_lofo": -0.15},
        {"id": "c", "source": "llm_foundry", "gpu": "H100-80", "error_lofo": 0.0},
        {"id": "d", "source": "megatron_lm", "gpu": "A100-80", "error_lofo": 0.5}]}
    rows = [{"id": i, "batch": {"micro_batch": mbs}, "model": {"name": "MPT-1b", "seq_len": s}}
            for i, mbs, s in (("a", 10, 2048), ("b", 20, 1024), ("c", 10, 2048), ("d", 1, 1))]
    groups = identical_gemm_groups(published, rows)
    assert len(groups) == 1   # a and b share the A100 die and 20480 tokens; c is alone on H100, d is not llm-foundry
    spread, key, members = groups[0]
    assert key == ("MPT-1b", "A100", 20480) and {m["id"] for m in members} == {"a", "b"}
    assert spread == pytest.approx(0.18)
