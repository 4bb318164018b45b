"""State migration under ZeRO / FSDP sharding (issue 23).

Under ZeRO stage z >= 1 a layer's optimizer state (z = 1, 2), and at z = 3 its parameters too, are
sharded over the layer's data-parallel group: the slot in position k of the D slots holding the
layer keeps bytes [floor(k S / D), floor((k + 1) S / D)) of the layer's S sharded bytes, and there
is one copy of each range. Before this, the migration treated every device as holding whole layers,
so a pure-FSDP job re-planned with pipelines reported `migration: 0.0 GB`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from chameleon_opt.cli import app
from chameleon_opt.comm.migration import schedule_migration
from chameleon_opt.comm.rounds import check_release_safety
from chameleon_opt.comm.state import missing_state, shard_range, state_bytes, tensor_bytes
from chameleon_opt.errors import UnrecoverableError
from chameleon_opt.instance.load import build_instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.plan import Pipeline, Plan, Stage
from chameleon_opt.solve.deadline import Deadline

runner = CliRunner()


def fsdp_job(zero: int = 3, failed: list[int] | None = None) -> dict:
    """GPT-3 1.7B on one node of 8 A100-80GB, data parallel over all 8 (FSDP at ZeRO-3)."""
    return {"format": 1, "name": f"zero{zero}-8",
            "cluster": {"nodes": 1, "devices_per_node": 8, "device_type": "A100-80",
                        "network": {"intra_node_gbps": 230, "inter_node_gbps": 25}},
            "workload": {"model": "gpt3-1.7b"},
            "training": {"global_batch": 56, "micro_batch_size": 1, "sequence_length": 2048, "precision": "bf16",
                         "recomputation": "full", "zero_stage": zero},
            "plan": {"tensor_parallel": 1, "layout": {"pipeline_parallel": 1, "data_parallel": 8}},
            "failures": {"events": [{"time_s": 0, "devices": failed}]} if failed else {}}


def received(model: PerfModel, old: Plan, new: Plan, failed: frozenset[int] = frozenset()
             ) -> dict[tuple[int, int], int]:
    """(receiver, sender) -> bytes, over every need (each sharded need has its one holder)."""
    out: dict[tuple[int, int], int] = {}
    for need in missing_state(model, old, new, failed):
        assert len(need.holders) == 1
        out[(need.dst, need.holders[0])] = out.get((need.dst, need.holders[0]), 0) + need.nbytes
    return out


def test_fsdp_over_8_resharded_over_7_gathers_each_new_shard_from_one_neighbour() -> None:
    """Hand-worked. FSDP over devices 0-7, then over 0-6 (device 7 leaves alive, e.g. drained).
    Take a layer's sharded bytes S = 56u: device k held [7k, 7k + 7)u and now needs [8k, 8k + 8)u.
    It keeps their overlap [8k, 7k + 7)u, 7 - k units, so it gathers the other k + 1 units,
    [7k + 7, 8k + 8)u, which lie inside device k + 1's old range [7k + 7, 7k + 14)u (8k + 8 <=
    7k + 14 for k <= 6): device 0 gets 1u from device 1, device 1 2u from device 2, ..., device 6
    7u from device 7 (all it had). In all 1 + 2 + ... + 7 = 28u = S / 2 moves, per layer: 12.4 GB
    of GPT-3 1.7B's 24.8 GB of ZeRO-3 state (u = 0.44 GB over its 26 layers). With
    floors where 56 does not divide S: device k gets floor((k+1)S/7) - max(floor(kS/7),
    floor((k+1)S/8)) bytes from device k + 1."""
    instance = build_instance(fsdp_job())
    model = PerfModel(instance)
    old = instance.plan
    new = Plan(1, tuple(Pipeline((Stage((k,), 0, model.workload.num_layers),), 8) for k in range(7)))
    _, sharded = state_bytes(model, 1)
    got = received(model, old, new)
    expected: dict[tuple[int, int], int] = {}
    for size in (int(s) for s in sharded):
        for k in range(7):
            nbytes = shard_range(size, k, 7)[1] - max(shard_range(size, k, 7)[0], shard_range(size, k, 8)[1])
            if nbytes:
                expected[(k, k + 1)] = expected.get((k, k + 1), 0) + nbytes
    assert got == expected
    total = sum(got.values())
    assert round(total / 1e9, 1) == 12.4
    assert abs(total - int(sharded.sum()) / 2) <= 8 * len(sharded)  # S / 2 per layer, up to the floors
    units = int(sharded.sum()) / 56
    for k in range(7):
        assert got[(k, k + 1)] == pytest.approx((k + 1) * units, abs=2 * len(sharded))


@pytest.mark.parametrize("zero", [1, 3])
def test_fsdp_replanned_as_two_stages_moves_half_of_the_sharded_state(zero: int) -> None:
    """Hand-worked. FSDP over 8 devices re-planned as PP 2 x DP 4, pipeline j on devices 2j (stage
    0, layers [0, m)) and 2j + 1 (stage 1, [m, L)), nothing failed. A stage-0 layer's group is now
    devices 0, 2, 4, 6: device 2j (position j of 4) needs [2j, 2j + 2) eighths of S and held the
    eighth [2j, 2j + 1), so it gathers eighth 2j + 1 from device 2j + 1; on a stage-1 layer device
    2j + 1 gathers eighth 2j from device 2j. So each device receives S / 8 per layer of its stage,
    8 x S / 8 = S / 2 of every layer in all: at ZeRO-3 12.4 GB of GPT-3 1.7B's 24.8 GB (14 bytes a
    parameter: bf16 weights and 12 bytes of Adam state); at ZeRO-1 only the optimizer state is
    sharded, 10.6 of 21.2 GB, and every device already holds all bf16 weights, which do not move.
    Before: 0 bytes, every device "kept" its layers whole."""
    instance = build_instance(fsdp_job(zero))
    model = PerfModel(instance)
    layers = model.workload.num_layers
    m = layers // 2
    new = Plan(1, tuple(Pipeline((Stage((2 * j,), 0, m), Stage((2 * j + 1,), m, layers)), 14) for j in range(4)))
    replicated, sharded = state_bytes(model, 1)
    assert (replicated + sharded == tensor_bytes(model, 1)).all()
    if zero >= 3:
        assert not replicated.any()
    else:
        assert (sharded == np.rint(model.workload.params * 12).astype(np.int64)).all()
    eighth = {(layer, e): shard_range(int(sharded[layer]), e, 8) for layer in range(layers) for e in range(8)}
    expected: dict[tuple[int, int], int] = {}
    for layer in range(layers):
        for j in range(4):
            dst, src, e = (2 * j, 2 * j + 1, 2 * j + 1) if layer < m else (2 * j + 1, 2 * j, 2 * j)
            lo, hi = eighth[(layer, e)]
            expected[(dst, src)] = expected.get((dst, src), 0) + hi - lo
    assert received(model, instance.plan, new) == expected
    assert sum(expected.values()) == pytest.approx(sharded.sum() / 2, abs=8 * layers)
    assert round(sum(expected.values()) / 1e9, 1) == (12.4 if zero >= 3 else 10.6)
    migration = schedule_migration(model, instance.plan, new, frozenset(), Deadline.after(10))
    assert migration.total_bytes == sum(expected.values()) > 0
    assert not check_release_safety(instance.plan, new, frozenset(), migration)
    for t in migration.transfers:  # every byte from the one device holding that part of the shard
        assert t.src == (t.dst + 1 if t.layer < m else t.dst - 1)


def test_a_failed_fsdp_shard_is_lost_and_the_plan_says_restart_from_a_checkpoint(tmp_path) -> None:
    """FSDP over 8, device 3 fails: the only copy of its eighth of every layer's state is gone, so
    no re-plan (7-way, or with pipelines) can restore it: exit 5, as for a layer that lost every
    replica. Before: the re-plan reported 0 bytes to move."""
    instance = build_instance(fsdp_job(failed=[3]))
    model = PerfModel(instance)
    layers = model.workload.num_layers
    seven = Plan(1, tuple(Pipeline((Stage((k,), 0, layers),), 8) for k in range(8) if k != 3))
    with pytest.raises(UnrecoverableError, match=r"ZeRO stage 3 .*failed devices \[3\]"):
        missing_state(model, instance.plan, seven, frozenset({3}))
    from chameleon_opt.api import Planner

    with pytest.raises(UnrecoverableError) as planned:
        Planner(fsdp_job(), time_limit_s=5).on_failure([3])
    assert "failed devices [3] held the only copy" in str(planned.value)
    assert "stale" not in str(planned.value)  # no survivor ever held that shard
    path = tmp_path / "fsdp.json"
    path.write_text(json.dumps(fsdp_job(failed=[3])))
    for args in (["plan", str(path), "--policy", "reconfigure", "--json"],
                 ["plan", str(path), "--json"],
                 ["export-plan", str(path), "--format", "torchtitan"]):
        done = runner.invoke(app, [*args, "--time-limit", "5"])
        assert done.exit_code == 5, done.output
        assert "restart from the last checkpoint" in done.output and "ZeRO stage 3" in done.output


def test_distributed_optimizer_with_pipelines_loses_the_failed_devices_optimizer_shard() -> None:
    """Megatron's distributed optimizer (ZeRO-1) over the replicas of each stage: a failed device's
    parameters have replicas, its optimizer shard has none."""
    from chameleon_opt.decision import lost_layers, sharded_layers_lost
    from chameleon_opt.instance.load import load_instance

    paper = load_instance("paper-32")  # no ZeRO: device 13's layers live on in the other pipelines
    assert not lost_layers(paper, frozenset({13}))
    spec = json.loads(json.dumps(fsdp_job(1)))
    spec["plan"] = {"tensor_parallel": 1, "layout": {"pipeline_parallel": 2, "data_parallel": 4}}
    instance = build_instance(spec)
    stage = next(st for p in instance.plan.pipelines for st in p.stages if 5 in st.devices)
    assert sharded_layers_lost(instance, frozenset({5})) == list(range(stage.first, stage.end))
    assert lost_layers(instance, frozenset({5})) == list(range(stage.first, stage.end))


def test_without_sharding_nothing_changes() -> None:
    """ZeRO-0 (every replica holds its layers whole): the same re-plan moves nothing, as before, and
    paper-32's reconfiguration needs whole tensors from any replica, as before."""
    instance = build_instance(fsdp_job(0))
    model = PerfModel(instance)
    layers = model.workload.num_layers
    new = Plan(1, tuple(Pipeline((Stage((2 * j,), 0, layers // 2), Stage((2 * j + 1,), layers // 2, layers)), 14)
                        for j in range(4)))
    replicated, sharded = state_bytes(model, 1)
    assert not sharded.any() and (replicated == tensor_bytes(model, 1)).all()
    assert missing_state(model, instance.plan, new, frozenset()) == []
    from chameleon_opt.api import Planner
    from chameleon_opt.instance.load import load_instance

    decision = Planner("paper-32", policy="reconfigure", time_limit_s=5).on_failure([13])
    paper = PerfModel(load_instance("paper-32"))
    needs = missing_state(paper, load_instance("paper-32").plan, decision.plan, frozenset({13}))
    whole = tensor_bytes(paper, 2)
    assert needs and all(n.sizes is None and n.nbytes == int(whole[list(n.layers)].sum()) for n in needs)
