"""bench/kill_campaign.py on three fixed seeds (one scenario each, runtime-cpu-4): a hybrid's
switch hit by a kill, kills in three different steps, and every replica of a stage. Each run goes
through `chameleon-solve demo --json` in its own session and must end as the planner predicts
(exit 0 with failure-free losses, or exit 5 naming the lost layers), without hanging and without
leaving a process behind. And one HF rejoin scenario (`--runtime hf`): a device back whose admitting
transition a survivor's death aborts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.multiprocess
CAMPAIGN = Path(__file__).resolve().parents[1] / "bench" / "kill_campaign.py"


def campaign_module() -> Any:
    spec = importlib.util.spec_from_file_location("kill_campaign", CAMPAIGN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module       # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_fixed_seeds_pass() -> None:
    module = campaign_module()
    lines: list[str] = []
    results = module.campaign([4, 6, 13], 1, lines.append)
    assert [row["scenario"].split()[3] for row in results["runs"]] == ["hybrid-switch", "different-steps",
                                                                       "every-replica"]
    assert results["passed"] == results["scenarios"] == 3, "\n".join(lines)
    assert {row["exit"] for row in results["runs"]} <= {0, 5}
