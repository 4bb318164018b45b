"""The memory model against torchtitan-style Llama steps measured on one H200 (bench/data/h200_probe.json,
from bench/device/probe_h200.sh): 21 runs of Llama 3 8B / 70B widths, 2-8 blocks, 4k-32k tokens, no,
per-op or full checkpointing, eager or compiled blocks, SDPA's default (cuDNN) or forced backends.
Priced as a user's import gets them (memory: nothing fitted on any measurement): the predicted peak
against the allocator's measured max_reserved."""

from __future__ import annotations

import pytest

from bench.torchtitan_runs import probe_runs
from chameleon_opt.instance.load import build_instance
from chameleon_opt.perf.model import GIB, PerfModel

RUNS = probe_runs()


def test_the_probe_covers_both_widths_every_checkpointing_mode_and_compile() -> None:
    assert len(RUNS) == 21
    assert {r.attention_kernel for r in RUNS} == {"cudnn", "flash-v2"}   # SDPA's default (cuDNN) and forced FA2
    assert {r.document["workload"]["inline"]["architecture"]["hidden"] for r in RUNS} == {4096, 8192}
    assert {r.document["training"]["recomputation"] for r in RUNS} == {"none", "selective", "full"}
    assert {r.document["training"]["kernels"] for r in RUNS} == {"torchtitan", "torchtitan-compiled"}


@pytest.mark.parametrize("run", RUNS, ids=[r.id for r in RUNS])
def test_reserved_peak_is_predicted_within_eight_percent(run) -> None:
    instance = build_instance(run.document, f"<{run.id}>")
    found = PerfModel(instance).evaluate(instance.plan)
    peak = max(c.memory_bytes for p in found.pipelines for c in p.stages) / GIB
    # measured on 2026-11-28: -1.4% .. +2.5% on 16 runs, +6.8% on the 32k-token full-checkpointing run
    assert abs(peak / run.measured_memory_gib - 1) < 0.08, (peak, run.measured_memory_gib)


def test_a_measured_kernel_table_is_read_in_log_sequence_length() -> None:
    from chameleon_opt.perf.calibration import utilisation_at
    from chameleon_opt.perf.published import FLASH_V2_H100_MEASURED
    assert utilisation_at(FLASH_V2_H100_MEASURED, 8192) == 0.282
    # halfway in log2 between 4096 and 8192: the mean of the two points
    assert utilisation_at(FLASH_V2_H100_MEASURED, 5793) == pytest.approx((0.229 + 0.282) / 2, abs=1e-4)
    assert utilisation_at(FLASH_V2_H100_MEASURED, 1024) == 0.229        # the end values beyond the points
    assert utilisation_at(FLASH_V2_H100_MEASURED, 131072) == 0.327


def test_transformer_engine_on_hopper_is_priced_as_its_fused_attention_not_torchs_flash() -> None:
    """TE prefers its fused (cuDNN) attention on compute capability 9.0 (get_attention_backend), so a
    Megatron-LM 2024 H100 row gets the te-fused kernel; an A100 row keeps FlashAttention-2's figure and
    torch's FlashAttention-2 on H100 its measured table."""
    from chameleon_opt.perf.published import ATTENTION_UTILISATION, FLASH_V2_H100, FLASH_V2_H100_MEASURED, _attention
    row = {"_source": "megatron_lm", "metric_definition": "MFU", "hardware": {"gpu": "NVIDIA H100"}}
    assert _attention(row) == ("flash", "te-fused")
    assert _attention({**row, "hardware": {"gpu": "NVIDIA A100 80GB"}}) == ("flash", "flash-v2")
    assert ATTENTION_UTILISATION[("te-fused", "H100-80")] == FLASH_V2_H100
    assert ATTENTION_UTILISATION[("flash-v2", "H100-80")] == FLASH_V2_H100_MEASURED
