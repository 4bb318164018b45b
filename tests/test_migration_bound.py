"""The migration's size bound from layer ranges (issue 21: a migration that cannot be cut in the
time left is declared before its shards are listed, and before a re-mapping is paid for)."""

from __future__ import annotations

import random

import pytest

from chameleon_opt.comm import migration as migration_module
from chameleon_opt.comm.migration import schedule_migration
from chameleon_opt.comm.state import missing_state, moved_pairs_at_least
from chameleon_opt.errors import UnrecoverableError
from chameleon_opt.instance.load import build_instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.plan import Pipeline, Plan, Stage
from chameleon_opt.solve.deadline import Deadline, DeadlinePassed


def job(devices: int, zero: int, tp: int = 1, pp: int = 1, copies: int = 1, failed: list[int] | None = None) -> dict:
    """GPT-3 1.7B on nodes of 8 A100-80GB, `devices` of them as TP x PP x DP."""
    return {"format": 1, "name": "bound", "cluster": {"nodes": devices // 8, "devices_per_node": 8,
                                                       "device_type": "A100-80",
                                                       "network": {"intra_node_gbps": 230, "inter_node_gbps": 25}},
            "workload": {"model": "gpt3-1.7b"},
            "training": {"global_batch": 8 * devices, "micro_batch_size": 1, "sequence_length": 2048,
                         "precision": "bf16", "recomputation": "full", "zero_stage": zero, "shard_replicas": copies},
            "plan": {"tensor_parallel": tp, "layout": {"pipeline_parallel": pp, "data_parallel": devices // tp // pp}},
            "failures": {"events": [{"time_s": 0, "devices": failed}]} if failed else {}}


def listed(model: PerfModel, old: Plan, new: Plan, failed: frozenset[int]) -> tuple[int, int]:
    """(pairs, receivers) as `schedule_migration` counts them after the listing."""
    needs = [n for n in missing_state(model, old, new, failed) if n.nbytes > 0]
    return sum(len(n.layers) for n in needs), len({n.dst for n in needs})


def test_fsdp_over_8_resharded_over_7_is_counted_exactly() -> None:
    """Hand-worked: FSDP (ZeRO-3, one stage of all L layers) over devices 0-7, then over 0-6. Each
    layer's shard range grows from S / 8 to S / 7, so each of the 7 devices lists every layer:
    7 L pairs, 7 receivers, which is what the listing finds."""
    instance = build_instance(job(8, zero=3))
    model = PerfModel(instance)
    layers = model.workload.num_layers
    new = Plan(1, tuple(Pipeline((Stage((k,), 0, layers),), 8) for k in range(7)))
    assert moved_pairs_at_least(model, instance.plan, new, frozenset()) == (7 * layers, 7)
    assert listed(model, instance.plan, new, frozenset()) == (7 * layers, 7)


def test_remapped_bound_takes_the_best_old_range_for_every_slot() -> None:
    """Hand-worked, no ZeRO: 8 devices as 2 stages [0, m) and [m, L) x 4 pipelines, re-planned as
    4 single-stage pipelines of all L layers on devices 0-3. As placed, devices 0 and 2 (stage 0)
    lack L - m layers and 1 and 3 (stage 1) lack m. Re-mapped, every slot could at best get a
    device that held the larger stage: 4 x (L - max(m, L - m)) pairs."""
    instance = build_instance(job(8, zero=0, pp=2))
    model = PerfModel(instance)
    layers = model.workload.num_layers
    held = {s.devices[0]: (s.first, s.end) for p in instance.plan.pipelines for s in p.stages}
    new = Plan(1, tuple(Pipeline((Stage((k,), 0, layers),), 8) for k in range(4)))
    as_placed = sum(layers - (held[k][1] - held[k][0]) for k in range(4))
    assert moved_pairs_at_least(model, instance.plan, new, frozenset()) == (as_placed, 4)
    assert listed(model, instance.plan, new, frozenset())[0] >= as_placed
    biggest = max(end - first for first, end in held.values())
    assert moved_pairs_at_least(model, instance.plan, new, frozenset(), remapped=True) == (4 * (layers - biggest), 4)


@pytest.mark.parametrize("seed", range(4))
def test_bound_never_exceeds_the_listing(seed: int) -> None:
    """Random plans over random ZeRO stages, shard copies, TP degrees and failures: the bound (as
    placed, and over every re-mapping) is at most what the listing finds."""
    rng = random.Random(seed)
    checked = 0
    for _ in range(6):
        zero, tp = rng.choice([0, 1, 2, 3]), rng.choice([1, 2])
        copies = rng.choice([1, 2, 3]) if zero else 1
        devices = rng.choice([8, 16])
        pp = rng.choice([p for p in (1, 2, 4) if devices // tp % p == 0])
        failed = sorted(rng.sample(range(devices), rng.randint(0, 2)))
        instance = build_instance(job(devices, zero, tp, pp, copies, failed))
        model, dead = PerfModel(instance), frozenset(failed)
        layers = model.workload.num_layers
        groups = [g for g in (tuple(range(a, a + tp)) for a in range(0, devices, tp)) if dead.isdisjoint(g)]
        rng.shuffle(groups)
        stages = rng.randint(1, min(4, len(groups)))
        pipelines = []
        for i in range(len(groups) // stages):
            cuts = [0, *sorted(rng.sample(range(1, layers), stages - 1)), layers]
            pipelines.append(Pipeline(tuple(Stage(groups[i * stages + s], cuts[s], cuts[s + 1])
                                            for s in range(stages)), 1))
        new = Plan(tp, tuple(pipelines))
        try:
            pairs, receivers = listed(model, instance.plan, new, dead)
        except UnrecoverableError:
            continue
        placed = moved_pairs_at_least(model, instance.plan, new, dead)
        remapped = moved_pairs_at_least(model, instance.plan, new, dead, remapped=True)
        assert remapped[0] <= placed[0] <= pairs and remapped[1] <= placed[1] <= receivers
        checked += pairs > 0
    assert checked >= 3


def test_a_migration_too_large_for_the_time_left_is_declared_before_its_listing(monkeypatch) -> None:
    """1,040 devices of FSDP re-sharded over 1,039: every device gathers part of every layer, so at
    least 1,039 L transfers to 1,039 devices, far more than 0 s allows: DeadlinePassed before
    `missing_state` runs (it would list 1,039 needs of every layer first)."""
    instance = build_instance(job(1040, zero=3))
    model = PerfModel(instance)
    layers = model.workload.num_layers
    new = Plan(1, tuple(Pipeline((Stage((k,), 0, layers),), 1) for k in range(1039)))

    def listing(*args, **kwargs):
        raise AssertionError("listed before the bound was checked")

    monkeypatch.setattr(migration_module, "missing_state", listing)
    with pytest.raises(DeadlinePassed, match="shards to move") as stopped:
        schedule_migration(model, instance.plan, new, frozenset(), Deadline.after(10.0), abandon=Deadline.after(0.0))
    assert stopped.value.needed_s == pytest.approx(1039 * layers * migration_module.FINISH_S_PER_TRANSFER)


def test_when_no_solver_can_start_the_greedy_split_is_priced_by_its_own_transfers() -> None:
    """1,040 devices of FSDP in 2 shard copies re-sharded over 1,039: each gathered run has a holder
    in each copy, so an LP could split it (up to one more transfer a shard), but with no time for a
    solver the greedy split sends each run from one holder: one transfer per layer of each shard.
    Given time for those and not for the LP's worst case, the migration is scheduled, not abandoned."""
    instance = build_instance(job(1040, zero=3, copies=2))
    model = PerfModel(instance)
    layers = model.workload.num_layers
    new = Plan(1, tuple(Pipeline((Stage((k,), 0, layers),), 1) for k in range(1039)))
    needs = [n for n in missing_state(model, instance.plan, new, frozenset()) if n.nbytes > 0]
    at_least = sum(len(n.layers) for n in needs)
    at_most = at_least + sum(len(n.holders) for n in needs) - len(needs)
    assert at_most > at_least
    between = (at_least + at_most) / 2 * migration_module.FINISH_S_PER_TRANSFER
    migration = schedule_migration(model, instance.plan, new, frozenset(), Deadline.after(0.0),
                                   abandon=Deadline.after(between, deterministic=True))
    assert migration.solve.backend == "greedy" and len(migration.transfers) <= at_least
