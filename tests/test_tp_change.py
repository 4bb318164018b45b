"""Re-plans that change the TP degree (PlanningOptions.tp_degrees): searched per degree, priced as a
re-shard from the checkpoint, chosen by Eq. 8 only when asked for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from chameleon_opt.check import check_plan
from chameleon_opt.cli import app
from chameleon_opt.decision import GROUP_REBUILD_S
from chameleon_opt.errors import InputError
from chameleon_opt.instance.load import Instance, build_instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.planning import PlanningOptions, plan_recovery
from chameleon_opt.workload.hf import workload_from_hf

TINY_LLAMA = Path(__file__).resolve().parents[1] / "models" / "hf" / "tiny-llama" / "config.json"


def job() -> dict:
    """TP2 x DP2 on one node of 4 slow devices training tiny-llama (4 heads, 2 KV heads): when device
    3 dies, TP 2 keeps one group of 2 and idles device 2, TP 1 trains on all 3."""
    return {"format": 1, "name": "tp-change",
            "cluster": {"nodes": 1, "devices_per_node": 4,
                        "device_type": {"name": "cpu-core", "memory_gib": 4.0, "peak_tflops": 0.05,
                                        "reserved_gib": 0.1},
                        "network": {"intra_node_gbps": 2, "inter_node_gbps": 1, "intra_node_latency_us": 50}},
            "workload": {"inline": workload_from_hf(TINY_LLAMA)},
            "training": {"global_batch": 8, "micro_batch_size": 1, "sequence_length": 16, "precision": "fp32"},
            "plan": {"tensor_parallel": 2, "layout": {"pipeline_parallel": 1, "data_parallel": 2}}}


def instance() -> Instance:
    return build_instance(job())


def test_a_tp_change_is_chosen_only_when_allowed_and_priced_as_a_reshard():
    tiny, failed = instance(), frozenset({3})
    kept = plan_recovery(tiny, failed, PlanningOptions("reconfigure", 5.0))
    same = plan_recovery(tiny, failed, PlanningOptions("reconfigure", 5.0, tp_degrees=(2,)))
    assert kept.plan.tensor_parallel == 2 and kept.reshard is None and same.plan == kept.plan
    assert [s.stage for s in kept.stages] == [s.stage for s in same.stages]  # the job's degree only: no extra search
    changed = plan_recovery(tiny, failed, PlanningOptions("reconfigure", 5.0, tp_degrees=(1, 2)))
    assert changed.plan.tensor_parallel == 1 and changed.tensor_parallel_changed
    assert changed.iteration_time_s < kept.iteration_time_s * 0.5  # strictly better by the model
    assert check_plan(tiny, changed.plan, failed).ok
    assert sorted(changed.plan.devices) == [0, 1, 2]
    # every survivor reads the whole model's state at TP 1 (no ZeRO), nothing moves peer to peer
    model = PerfModel(tiny)
    whole = int(round(float(model.workload.params.sum()) * (model.param_bytes + model.optimizer_bytes)))
    reshard = changed.reshard
    assert (reshard.from_tp, reshard.to_tp) == (2, 1)
    assert reshard.bytes_per_device == {d: pytest.approx(whole, abs=8) for d in (0, 1, 2)}
    assert changed.migration is not None and not changed.migration.transfers
    chosen = next(c for c in changed.candidates if c.policy == "reconfigure")
    assert chosen.groups_rebuilt > 0 and chosen.rebuild_s == GROUP_REBUILD_S
    assert chosen.transition_s >= GROUP_REBUILD_S + reshard.read_s
    assert chosen.bytes_moved == reshard.total_bytes and chosen.devices_touched == 3
    assert chosen.to_json()["tensor_parallel_change"]["to"] == 1
    assert "TP 1 (was 2)" in chosen.reason and "scores lower" in chosen.reason
    assert any(s.stage == "search (TP 1)" for s in changed.stages)


def test_a_slow_checkpoint_read_keeps_the_degree():
    """The re-shard's read is in the transition: with a checkpoint read at 1 MB/s (2.6 s for the
    model's 2.6 MB) the TP-1 plan, 6x faster per step, pauses 7.6 s, more than it wins back before a
    fault 8 s away."""
    data = job()
    data["cluster"]["network"]["checkpoint_read_gbps"] = 0.001
    tiny = build_instance(data)
    decision = plan_recovery(tiny, frozenset({3}), PlanningOptions("reconfigure", 5.0, next_fault_s=8.0,
                                                                   tp_degrees=(1, 2)))
    assert decision.plan.tensor_parallel == 2 and decision.reshard is None
    assert "TP 1 plan" in decision.candidates[0].reason and "scores lower" in decision.candidates[0].reason


def test_tp_degrees_must_fit_the_node_and_the_heads():
    with pytest.raises(InputError, match="kv_heads 2"):
        plan_recovery(instance(), frozenset({3}), PlanningOptions("reconfigure", 5.0, tp_degrees=(4,)))
    with pytest.raises(InputError, match="target"):
        PlanningOptions("reconfigure", 5.0, tp_degrees=(1,), target="megatron")


def test_cli_says_the_tp_degree_changed(tmp_path):
    path = tmp_path / "tp.json"
    path.write_text(json.dumps(job()))
    result = CliRunner().invoke(app, ["plan", str(path), "--failed", "3", "--policy", "reconfigure",
                                      "--tp-degrees", "1,2", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["plan"]["tensor_parallel"] == 1
    assert out["tensor_parallel_change"]["from"] == 2 and out["tensor_parallel_change"]["to"] == 1
    text = CliRunner().invoke(app, ["plan", str(path), "--failed", "3", "--policy", "reconfigure",
                                    "--tp-degrees", "1,2"])
    assert text.exit_code == 0 and "TP degree changes 2 -> 1" in text.output
    plain = CliRunner().invoke(app, ["plan", str(path), "--failed", "3", "--policy", "reconfigure", "--json"])
    assert json.loads(plain.output)["plan"]["tensor_parallel"] == 2
    assert "tensor_parallel_change" not in json.loads(plain.output)


def test_the_planner_api_takes_tp_degrees():
    """`api.Planner(tp_degrees=...)` plans as `PlanningOptions.tp_degrees` does and refuses a degree
    no plan can use when it is built, before any failure."""
    from chameleon_opt.api import Planner

    decision = Planner(job(), policy="reconfigure", time_limit_s=5.0, tp_degrees=(1, 2)).on_failure([3])
    assert decision.plan.tensor_parallel == 1 and decision.tensor_parallel_changed
    assert Planner(job(), policy="reconfigure", time_limit_s=5.0).on_failure([3]).plan.tensor_parallel == 2
    with pytest.raises(InputError, match="kv_heads 2"):
        Planner(job(), tp_degrees=(4,))
    with pytest.raises(InputError, match="not a TP degree"):
        Planner(job(), tp_degrees=("2",))
