"""The performance model against real measurements (Sailor's GH200 plans, Megatron-LM's GPT-3 runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.validate_perf import megatron_validation, sailor_validation

SAILOR = Path(__file__).resolve().parents[2] / "shared" / "data" / "sailor"


@pytest.mark.skipif(not SAILOR.is_dir(), reason="third-party measurements not present beside the checkout")
def test_sailor_measured_plans_are_predicted_within_target():
    result = sailor_validation(SAILOR)
    assert len(result["rows"]) == 9
    for key in ("error_uncalibrated", "error", "error_loo"):
        assert result["summary"][key]["median_abs"] <= 0.10, key
        assert result["summary"][key]["worst_abs"] <= 0.20, key


def test_megatron_gpt3_175b_scaling_is_predicted_from_one_run():
    result = megatron_validation()
    assert 0.3 < result["efficiency_fitted_on_dp4"] < 0.95
    assert result["worst_abs_error_unseen"] <= 0.15
    assert abs(result["rows"][0]["error"]) <= 0.01
