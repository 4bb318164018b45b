"""Time calibration that transfers across models and devices (catalogue profiles only: no data folder)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from chameleon_opt.instance.load import MODELS_DIR
from chameleon_opt.perf.calibration import FrameworkCalibration, load_framework
from chameleon_opt.perf.sailor_fit import calibrate_sailor
from chameleon_opt.workload.model import Workload
from chameleon_opt.workload.schema import WorkloadSpec


def opt350(drop: str | None = None) -> Workload:
    spec = json.loads((MODELS_DIR / "opt-350m.json").read_text())
    spec["profiles"] = [p for p in spec["profiles"] if p["device_type"] != drop]
    return Workload(WorkloadSpec.model_validate(spec), None, 2)


@pytest.fixture(scope="module")
def withheld() -> FrameworkCalibration:
    return calibrate_sailor(None, {("opt-350m", "GH-96")})


def test_gh200_fitted_without_opt350_data(withheld):
    gh = withheld.devices["GH-96"]
    assert not any(label.startswith("opt-350m") for label in gh.fitted_on)
    assert any(label.startswith("opt-30b") for label in gh.fitted_on)
    assert not any("llama3-8b" in label and "tp1" not in label for d in withheld.devices.values() for label in d.fitted_on)
    assert 0 < gh.compute_efficiency <= 1 and 0 < withheld.memory_efficiency <= 1


def test_opt350_on_gh200_from_other_devices_within_15_percent_at_tp4(withheld):
    """The measured plans run TP 4: the transferred per-micro-batch time (all layers) is within 15%
    of OPT-350M's own GH200 profile, which the calibration never saw."""
    reduced, full = opt350("GH-96"), opt350()
    errors = []
    for mbs in (1, 2, 4, 8):
        moved = withheld.transfer(reduced, "GH-96", mbs, 4)
        own = full.profile_table("GH-96", mbs, 4)
        assert moved is not None and "scaled by the fitted device ratio" in moved.source
        errors.append((moved.table.forward_s + moved.table.backward_s).sum() / (own.forward_s + own.backward_s).sum() - 1)
    assert np.median(np.abs(errors)) <= 0.15, errors


def test_without_any_profile_falls_back_to_fitted_efficiencies(withheld):
    spec = json.loads((MODELS_DIR / "gpt3-1.7b.json").read_text())
    workload = Workload(WorkloadSpec.model_validate(spec), None, 2)
    moved = withheld.transfer(workload, "GH-96", 1, 1)
    assert moved is not None and "fitted efficiencies" in moved.source
    assert (moved.table.forward_s[1:-1] > 0).all()
    assert withheld.transfer(workload, "H100-80", 1, 1) is None  # not calibrated: no transfer


def test_catalogue_calibration_round_trips():
    stored = load_framework("sailor")
    assert stored.overhead_gib is not None and len(stored.overhead_fitted_on) == 9
    again = FrameworkCalibration.from_json("sailor", stored.to_json())
    assert again == stored
