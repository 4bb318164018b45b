"""Published measured runs as instances: refused settings are named, measured times follow each row's
metric (skips without ../shared/data/published)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chameleon_opt.perf.published import Refused, load_rows, to_run
from chameleon_opt.workload.activations import kernels_for

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "published"


@pytest.fixture(scope="module")
def rows() -> dict[str, dict]:
    if not DATA.is_dir():
        pytest.skip(f"published tables absent ({DATA})")
    return {r["id"]: r for r in load_rows(DATA)}


def test_fp8_cp_and_moe_rows_are_refused_by_name(rows: dict[str, dict]) -> None:
    reasons = {}
    for key in ("nemo-001", "megatron-038", "megatron-041"):
        with pytest.raises(Refused) as refused:
            to_run(rows[key])
        reasons[key] = str(refused.value)
    assert "fp8" in reasons["nemo-001"] and "fp8" in reasons["megatron-038"]
    assert "mixture of experts" in reasons["megatron-041"] or "fp8" not in reasons["megatron-041"]


def test_megatron_2021_row_time_from_its_recompute_formula(rows: dict[str, dict]) -> None:
    """GPT-3 175B-class row: TFLOP/s under 96*B*s*l*h^2*(1+s/6h+V/16lh) back to seconds per step."""
    run = to_run(rows["megatron-021"])  # 1T, 3072 A100s, 163 TFLOP/s
    b, s, l, h, v = 3072, 2048, 128, 25600, 51200
    flops = 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    assert run.measured_step_s == pytest.approx(flops / (163e12 * 3072))
    assert run.document["training"]["recomputation"] == "full"
    assert run.document["plan"]["layout"] == {"pipeline_parallel": 64, "data_parallel": 6}


def test_unknown_hugging_face_family_is_refused() -> None:
    with pytest.raises(ValueError, match="no Hugging Face activation model for family 'bloom'"):
        kernels_for("hf", "bloom")
