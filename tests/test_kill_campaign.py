"""bench/kill_campaign.py on a fixed seed (one scenario, runtime-cpu-4): a hybrid's switch hit by a
kill (every replica of a stage killed is test_runtime.py's lost-layers cases, kills in different steps
its three failures; the campaign itself runs more in bench/kill_campaign.py: the suite's time). The run goes
through `chameleon-solve demo --json` in its own session and must end as the planner predicts
(exit 0 with failure-free losses, or exit 5 naming the lost layers), without hanging and without
leaving a process behind. And, without a process, the HF replay's reading of the HF controller
after a rerouting and a hybrid (the HF scenarios themselves run in bench/kill_campaign.py only:
the suite's time)."""

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


def test_fixed_seed_passes() -> None:
    module = campaign_module()
    lines: list[str] = []
    results = module.campaign([4], 1, lines.append)
    assert [row["scenario"].split()[3] for row in results["runs"]] == ["hybrid-switch"]
    assert results["passed"] == results["scenarios"] == 1, "\n".join(lines)
    assert {row["exit"] for row in results["runs"]} <= {0, 5}


def test_hf_replay_plans_as_the_hf_controller() -> None:
    """No process: after a rerouting the replay keeps the layout (its reroutes stripped) and
    counts the dead device's idled TP peer out without reporting it dead; under auto with the
    campaign's MTBF a hybrid starts its rerouting, then its reconfigured plan without the dead
    device."""
    module = campaign_module()
    rerouted = module.Scenario(0, 0, "single", "llama-dp2-tp2", "reroute", [(1, 2)], runtime="hf")
    expected = module.replay(rerouted)
    assert (expected.exit_code, expected.dead) == (0, (1,))
    assert sorted(expected.layouts[0].devices) == [0, 1, 2, 3] and not expected.layouts[0].rerouted
    assert expected.working == [frozenset({2, 3})]       # device 0 idles: its TP peer died
    hybrid = module.Scenario(0, 1, "single", "llama-pp2-dp2", "auto", [(0, 2)], runtime="hf")
    assert "--mtbf-hours=1" in hybrid.args()
    expected = module.replay(hybrid)
    assert (expected.exit_code, expected.dead) == (0, (0,))
    assert sorted(expected.layouts[0].devices) == [0, 1, 2, 3]   # the interim rerouting's layout
    assert 0 not in expected.layouts[1].devices                  # then the switch's reconfigured plan
