"""Several copies of each ZeRO shard (`training.shard_replicas`): torchtitan's HSDP and Megatron-LM's
--num-distributed-optimizer-instances.

With c copies the D data-parallel slots holding a layer, in plan order, form c consecutive shard
groups; each group shards the layer's sharded bytes over itself (position k of g keeps
[kS/g, (k+1)S/g)). So per-device sharded state is S / (D / c), a failed device's bytes live on in
the other groups, and only bytes whose every group's holder failed are lost (exit 5)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from chameleon_opt.cli import app
from chameleon_opt.comm.migration import schedule_migration
from chameleon_opt.comm.rounds import check_release_safety
from chameleon_opt.comm.state import missing_state, shard_copies_lost, shard_range, state_bytes
from chameleon_opt.decision import lost_layers
from chameleon_opt.errors import InputError, UnrecoverableError
from chameleon_opt.bundled import bundled_instance
from chameleon_opt.instance.load import build_instance, load_instance
from chameleon_opt.perf.memory import shard_group_size, shard_groups, zero_shards
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.plan import Pipeline, Plan, Stage
from chameleon_opt.solve.deadline import Deadline

runner = CliRunner()
GIB = 2 ** 30


def hsdp_job(copies: int = 2, failed: list[int] | None = None, zero: int = 3) -> dict:
    """GPT-3 1.7B, FSDP over devices 0-7 of two 8-GPU A100-80GB nodes (devices 8-15 spare), with
    `copies` copies of each shard: at 2, devices 0-3 and 4-7 are the two shard groups."""
    return {"format": 1, "name": f"hsdp{copies}-8",
            "cluster": {"nodes": 2, "devices_per_node": 8, "device_type": "A100-80",
                        "network": {"intra_node_gbps": 230, "inter_node_gbps": 25}},
            "workload": {"model": "gpt3-1.7b"},
            "training": {"global_batch": 56, "micro_batch_size": 1, "sequence_length": 2048, "precision": "bf16",
                         "recomputation": "full", "zero_stage": zero, "shard_replicas": copies},
            "plan": {"tensor_parallel": 1,
                     "pipelines": [{"micro_batches": 7, "stages": [{"devices": [k], "layers": [0, 26]}]}
                                   for k in range(8)]},
            "failures": {"events": [{"time_s": 0, "devices": failed}]} if failed else {}}


def fsdp_over(devices: list[int], layers: int, micro_batches: int) -> Plan:
    return Plan(1, tuple(Pipeline((Stage((d,), 0, layers),), micro_batches) for d in devices))


def received(needs) -> dict[tuple[int, tuple[int, ...]], int]:
    """(receiver, its holders) -> bytes."""
    out: dict[tuple[int, tuple[int, ...]], int] = {}
    for n in needs:
        out[(n.dst, n.holders)] = out.get((n.dst, n.holders), 0) + n.nbytes
    return out


def test_shard_groups_are_consecutive_runs_and_memory_takes_the_smallest() -> None:
    """8 slots, 2 copies: positions 0-3 and 4-7 (Megatron's instance i holds DP ranks
    [i D / c, (i + 1) D / c)); 7 slots: 3 and 4, so a device holds up to a third: divisor 3; fewer
    slots than copies: each slot its own group, nothing sharded (divisor 1)."""
    assert shard_groups(8, 2) == [(0, 4), (4, 8)]
    assert shard_groups(7, 2) == [(0, 3), (3, 7)]
    assert shard_groups(1, 2) == [(0, 1)]
    assert [shard_group_size(d, 2) for d in (1, 2, 3, 7, 8, 128)] == [1, 1, 1, 3, 4, 64]
    assert zero_shards(1, 128, 2) == (1.0, 1.0, 64.0)
    assert zero_shards(3, 8, 2) == (4.0, 4.0, 4.0)
    assert zero_shards(3, 8) == (8.0, 8.0, 8.0)


def test_memory_per_device_divides_the_sharded_terms_by_the_shard_group() -> None:
    """Hand computation. GPT-3 1.7B has P = 1,770,250,752 parameters; ZeRO-3 over 8 in 2 copies
    shards over groups of 4: parameters 2P/4 = 885.1 MB (one copy: 2P/8 = 442.6 MB), gradients the
    same, Adam's 12 bytes 12P/4 = 5.31 GB (one copy 2.66 GB); the activations, logits, working set,
    buffers and framework do not depend on the copies."""
    one = PerfModel(build_instance(hsdp_job(1)))
    two = PerfModel(build_instance(hsdp_job(2)))
    params = float(two.workload.params.sum())
    assert params == 1_770_250_752
    a = one.stage_memory_breakdown((0,), 0, 26, 0, 1, 7, 0.0, 8).as_dict()
    b = two.stage_memory_breakdown((0,), 0, 26, 0, 1, 7, 0.0, 8).as_dict()
    assert b["parameters"] == pytest.approx(2 * params / 4) == pytest.approx(885.1e6, rel=1e-4)
    assert b["gradients"] == pytest.approx(2 * params / 4)
    assert b["optimizer"] == pytest.approx(12 * params / 4) == pytest.approx(5.311e9, rel=1e-3)
    assert a["optimizer"] == pytest.approx(12 * params / 8)
    for term in ("activations", "logits", "transient", "comm_buffers", "framework"):
        assert a[term] == b[term]
    assert sum(b.values()) - sum(a.values()) == pytest.approx(16 * params / 8)  # a second copy of the 16P/8


def test_llama3_405b_16k_memory_with_two_optimizer_copies() -> None:
    """The bundled 16k job: TP 8 x PP 16 x DP 128 with the distributed optimizer in 2 copies (groups
    of 64 pipelines). A middle stage holds 8 of the 126 blocks, P_s / 8 parameters per GPU; its 12
    bytes of Adam state per parameter are divided by 64 instead of 128, and the job fits on its
    80 GB GPUs."""
    instance = load_instance("llama3-405b-16k")
    model = PerfModel(instance)
    assert model.shard_copies == 2
    estimate = model.evaluate(instance.plan)
    assert estimate.memory_ok
    stage = instance.plan.pipelines[0].stages[5]
    per_gpu = float(model.workload.params[stage.first:stage.end].sum()) / 8
    b = model.stage_memory_breakdown(stage.devices, stage.first, stage.end, 5, 16, 16, 0.0, 128)
    assert b.optimizer == pytest.approx(12 * per_gpu / 64)
    assert b.parameters == pytest.approx(2 * per_gpu)  # ZeRO-1: parameters whole
    assert b.total < 80e9


def test_a_failed_devices_shard_is_gathered_from_its_copy() -> None:
    """Hand-worked. Devices 0-3 and 4-7 are the two shard groups; position k of each holds quarter
    k, [kS/4, (k+1)S/4), of every layer's S sharded bytes (ZeRO-3: all 14 bytes a parameter). Device
    1 fails and spare device 8 takes its place (pipeline 1): it needs quarter 1, which device 1 held
    in group 0 and device 5 holds in group 1, so it gathers exactly S/4 per layer from device 5
    (6.2 GB of GPT-3 1.7B's 24.8 GB) and nobody else moves anything."""
    instance = build_instance(hsdp_job(2))
    model = PerfModel(instance)
    _, sharded = state_bytes(model, 1)
    layers = model.workload.num_layers
    replaced = fsdp_over([0, 8, 2, 3, 4, 5, 6, 7], layers, 7)
    got = received(missing_state(model, instance.plan, replaced, frozenset({1})))
    quarter = sum(shard_range(int(s), 1, 4)[1] - shard_range(int(s), 1, 4)[0] for s in sharded)
    assert got == {(8, (5,)): quarter}
    assert round(quarter / 1e9, 1) == 6.2
    migration = schedule_migration(model, instance.plan, replaced, frozenset({1}), Deadline.after(10))
    assert migration.total_bytes == quarter
    assert {(t.src, t.dst) for t in migration.transfers} == {(5, 8)}
    assert not check_release_safety(instance.plan, replaced, frozenset({1}), migration)


def test_seven_survivors_reshard_each_group_from_either_copy() -> None:
    """Hand-worked. Device 1 fails and the 7 survivors re-shard: groups of 3 (devices 0, 2, 3:
    thirds) and 4 (devices 4-7: the same quarters as before, nothing moves). In units of S:
    device 0 needs [0, 1/3), holds [0, 1/4): gathers [1/4, 1/3), 1/12, whose holders were device 1
    (failed) and device 5: from 5. Device 2 needs [1/3, 2/3), holds [1/2, 3/4): gathers
    [1/3, 1/2), 1/6, also quarter 1: from 5. Device 3 needs [2/3, 1), holds [3/4, 1): gathers
    [2/3, 3/4), 1/12, quarter 2, held by device 2 in group 0 and device 6 in group 1: from either
    (the solver splits it). S/3 per layer in all."""
    instance = build_instance(hsdp_job(2))
    model = PerfModel(instance)
    _, sharded = state_bytes(model, 1)
    layers = model.workload.num_layers
    seven = fsdp_over([0, 2, 3, 4, 5, 6, 7], layers, 8)
    got = received(missing_state(model, instance.plan, seven, frozenset({1})))
    expected = {(0, (5,)): 0, (2, (5,)): 0, (3, (2, 6)): 0}
    for size in (int(s) for s in sharded):
        third = [shard_range(size, k, 3) for k in range(3)]
        quarter = [shard_range(size, k, 4) for k in range(4)]
        expected[(0, (5,))] += third[0][1] - quarter[0][1]
        expected[(2, (5,))] += quarter[1][1] - third[1][0]
        expected[(3, (2, 6))] += quarter[2][1] - third[2][0]
    assert got == expected
    total = sum(got.values())
    assert total == pytest.approx(int(sharded.sum()) / 3, abs=3 * layers)
    migration = schedule_migration(model, instance.plan, seven, frozenset({1}), Deadline.after(10))
    assert migration.total_bytes == total
    assert {t.src for t in migration.transfers if t.dst == 3} <= {2, 6}
    assert not check_release_safety(instance.plan, seven, frozenset({1}), migration)


def test_both_holders_of_a_shard_failed_means_a_checkpoint_restart(tmp_path) -> None:
    """Devices 1 and 5 held quarter 1 in the two groups: with both gone it has no copy (exit 5,
    naming them); devices 1 and 6 held different quarters, so every byte still has a copy."""
    instance = build_instance(hsdp_job(2))
    model = PerfModel(instance)
    layers = model.workload.num_layers
    assert shard_copies_lost(instance.plan, frozenset({1, 5}), 2) == (list(range(layers)), [1, 5])
    assert shard_copies_lost(instance.plan, frozenset({1, 6}), 2) == ([], [])
    assert shard_copies_lost(instance.plan, frozenset({1, 6}), 1) == (list(range(layers)), [1, 6])
    assert lost_layers(instance, frozenset({1, 5})) and not lost_layers(instance, frozenset({1, 6}))
    six = fsdp_over([0, 2, 3, 4, 6, 7], layers, 10)
    with pytest.raises(UnrecoverableError, match=r"keeps 2 copies .*failed devices \[1, 5\] held every copy"):
        missing_state(model, instance.plan, six, frozenset({1, 5}))
    assert received(missing_state(model, instance.plan, fsdp_over([0, 2, 3, 4, 5, 7], layers, 10),
                                  frozenset({1, 6})))
    path = tmp_path / "hsdp.json"
    path.write_text(json.dumps(hsdp_job(2, [1, 5])))
    done = runner.invoke(app, ["plan", str(path), "--time-limit", "5"])
    assert done.exit_code == 5, done.output
    assert "failed devices [1, 5] held every copy" in done.output and "restart from the last checkpoint" in done.output
    path.write_text(json.dumps(hsdp_job(2, [1, 6])))
    done = runner.invoke(app, ["plan", str(path), "--time-limit", "5", "--json"])
    assert done.exit_code == 0, done.output


def test_copies_need_sharded_state() -> None:
    with pytest.raises(InputError, match="shard_replicas"):
        build_instance(hsdp_job(2, zero=0))


def test_16k_drop_plan_reshards_only_the_damaged_shard_group() -> None:
    """Re-planning changes the data-parallel size, so the groups re-form and re-shard. Device 9000
    is in pipeline 70 (128 GPUs a pipeline), of group 1 (pipelines 64-127). The local plan drops
    it: 127 pipelines, groups of 63 then 64. The local plans keep the old groups whole
    (solve/local.py `in_old_order`): group 1's 63 survivors first, then group 0's 64 pipelines in
    their old order, so group 0 keeps every position and range and moves nothing, while every
    member of group 1 changes range (S/63 instead of S/64): 63 x 128 = 8,064 receivers, 2.02 TB.
    (Appending in plan order shifted pipeline 63 into group 1 too: 8,960 receivers, 2.97 TB.)
    Keeping the layout (rerouting pipeline 70's stage 5) re-forms only the groups of stage 5's
    layers, the same way: 186 GB to the stage 5 GPUs of pipelines 0-69, 70 x 8 = 560."""
    from chameleon_opt.solve.local import local_plans

    instance = load_instance("llama3-405b-16k")
    failed = frozenset({9000})
    model = PerfModel(instance)
    found = local_plans(instance, failed, model, Deadline.after(60))
    drop = next(c for c in found if c.how.startswith("drop"))
    needs = missing_state(model, instance.plan, drop.plan, failed)
    receivers = {n.dst for n in needs}
    assert receivers == set(range(64 * 128, 128 * 128)) - set(range(70 * 128, 71 * 128))
    assert round(sum(n.nbytes for n in needs) / 1e12, 2) == 2.02
    # one pipeline re-cut from pipeline 70's 15 surviving groups, in its place: only they receive
    recut = next(c for c in found if c.how.endswith("as 1 pipeline(s) of 15 stage(s)"))
    assert recut.receiving == sum(len(st.devices) * (st.end - st.first) for st in recut.plan.pipelines[70].stages)
    needs = missing_state(model, instance.plan, recut.plan, failed)
    assert {n.dst for n in needs} <= set(range(70 * 128, 71 * 128)) - failed
    kept = missing_state(model, instance.plan, instance.plan, failed)
    assert {n.dst for n in kept} == {128 * j + 40 + r for j in range(70) for r in range(8)}
    assert round(sum(n.nbytes for n in kept) / 1e9) == 186


@pytest.mark.parametrize("args", [["--failed-node", "3"], []])
def test_bundled_16k_job_recovers_from_its_failures_with_two_optimizer_copies(args: list[str]) -> None:
    """As bundled (distributed optimizer in 2 copies) the 16k job's failure event and a whole node's
    failure are planned (exit 0), not a checkpoint restart."""
    assert json.loads(bundled_instance("llama3-405b-16k").read_text())["training"]["shard_replicas"] == 2
    done = runner.invoke(app, ["plan", "llama3-405b-16k", "--time-limit", "3", *args])
    assert done.exit_code == 0, done.output


def test_bundled_131k_job_keeps_a_copy_of_every_shard() -> None:
    """The 131k job (DP 1024 in 2 groups of 512) fits and loses no shard to its failure event or to
    a node; its full plan (`plan llama3-405b-131k --time-limit 30`, exit 0 in 27 s) is timed by
    bench/time_limit.py, not here (a 30 s decision in a suite kept under 10 minutes)."""
    instance = load_instance("llama3-405b-131k")
    assert instance.spec.training.shard_replicas == 2
    assert PerfModel(instance).evaluate(instance.plan).memory_ok
    assert not lost_layers(instance, frozenset({9000}))
    assert not lost_layers(instance, frozenset(range(24, 32)))
