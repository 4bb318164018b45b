"""Plans a target trainer runs as they are (issue 23): the uniform space of solve/target.py against a
brute force written apart from it, which also tries every choice and order of the TP groups (the
search takes them in survivor order); the decision with --target has no rerouting and prices the
restriction; export-plan's default space is its format's trainer."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import pytest
from typer.testing import CliRunner

from chameleon_opt.cli import app
from chameleon_opt.errors import InputError
from chameleon_opt.instance.load import build_instance, load_instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.plan import Pipeline, Plan, Stage
from chameleon_opt.planning import PlanningOptions, plan_recovery
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.solve.groups import survivor_groups
from chameleon_opt.solve.target import TRAINER_ORDERS, even_split, uniform_plans
from tests.helpers import tiny_instance

runner = CliRunner()


def readable(plan: Plan, order: str) -> bool:
    """Whether a trainer whose global ranks walk `order` (TP innermost) reads every stage of `plan`
    where the plan puts it, with the used devices numbered in device order as torchrun numbers them
    node by node (pipelines may be renumbered: replicas are alike)."""
    devices = sorted(d for p in plan.pipelines for st in p.stages for d in st.devices)
    rank = {d: r for r, d in enumerate(devices)}
    tp, stages, replicas = plan.tensor_parallel, len(plan.pipelines[0].stages), len(plan.pipelines)
    seen = set()
    for pipe in plan.pipelines:
        slots = [rank[st.devices[0]] // tp for st in pipe.stages]
        if any(rank[d] != rank[st.devices[0]] + t for st in pipe.stages for t, d in enumerate(st.devices)):
            return False
        if order == "tp-dp-pp":   # slot = pp x DP + dp
            dps = {slot - s * replicas for s, slot in enumerate(slots)}
        else:                     # tp-pp-dp: slot = dp x PP + pp
            dps = {(slot - s) / stages for s, slot in enumerate(slots)}
        if len(dps) != 1:
            return False
        seen |= dps
    return seen == set(range(replicas))


def brute_force_uniform(instance, failed: frozenset[int], orders: tuple[str, ...] | None = None) -> float:
    """Least step over every uniform plan: stage count, replica count dividing the micro-batches,
    every composition of the layers, every ordered choice of the surviving TP groups (with
    `orders`, only those a trainer with one of these rank orders reads)."""
    model = PerfModel(instance)
    tp, total, layers = instance.plan.tensor_parallel, instance.global_micro_batches, instance.workload.num_layers
    groups = survivor_groups(instance, failed, tp)
    best = math.inf
    for stages in range(1, min(layers, len(groups)) + 1):
        cuts = [(0,) + c + (layers,) for c in itertools.combinations(range(1, layers), stages - 1)]
        for replicas in range(1, len(groups) // stages + 1):
            if total % replicas:
                continue
            for chosen in itertools.permutations(groups, replicas * stages):
                for bounds in cuts:
                    plan = Plan(tp, tuple(Pipeline(tuple(Stage(chosen[j * stages + s], bounds[s], bounds[s + 1])
                                                         for s in range(stages)), total // replicas)
                                          for j in range(replicas)))
                    if orders is not None and not any(readable(plan, order) for order in orders):
                        continue
                    estimate = model.evaluate(plan, failed)
                    if estimate.memory_ok:
                        best = min(best, estimate.iteration_time_s)
    return best


@pytest.mark.parametrize("seed", range(8))
def test_uniform_search_equals_the_brute_force(seed: int) -> None:
    spec = tiny_instance(seed, nodes=2, per_node=2, blocks=3, micro_batches=4,
                         memory_gib=[100.0, 0.5, 0.3][seed % 3])
    instance = build_instance(spec, f"tiny-{seed}")
    failed = frozenset({seed % 4})
    plan, step, _, complete = uniform_plans(instance, failed, PerfModel(instance), Deadline.after(60))
    expected = brute_force_uniform(instance, failed)
    assert complete
    if math.isinf(expected):
        assert plan is None
    else:
        assert step == pytest.approx(expected, rel=1e-9)
        assert len({tuple((st.first, st.end) for st in p.stages) for p in plan.pipelines}) == 1  # one split
        assert len({p.micro_batches for p in plan.pipelines}) == 1  # equal micro-batches


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("target", ["megatron", "torchtitan"])
def test_trainer_space_equals_the_brute_force_over_what_the_trainer_reads(seed: int, target: str) -> None:
    """With a trainer's rank orders the search keeps only placements that trainer reads from
    node-by-node ranks (torchrun's numbering), and is exact over them."""
    spec = tiny_instance(seed, nodes=2, per_node=2, blocks=3, micro_batches=4,
                         memory_gib=[100.0, 0.5, 0.3][seed % 3])
    instance = build_instance(spec, f"tiny-{seed}")
    failed = frozenset({seed % 4})
    plan, step, _, complete = uniform_plans(instance, failed, PerfModel(instance), Deadline.after(60),
                                            TRAINER_ORDERS[target])
    expected = brute_force_uniform(instance, failed, TRAINER_ORDERS[target])
    assert complete
    if math.isinf(expected):
        assert plan is None
    else:
        assert step == pytest.approx(expected, rel=1e-9)
        assert any(readable(plan, order) for order in TRAINER_ORDERS[target])


def test_even_split_gives_the_first_stages_the_extra_layers() -> None:
    assert even_split(82, 4) == (0, 21, 42, 62, 82)  # torchtitan's default: [21, 21, 20, 20]


def test_decision_with_a_target_is_uniform_and_prices_the_restriction() -> None:
    instance = load_instance("paper-32")
    failed = frozenset(d for e in instance.spec.failures.events for d in e.devices)
    decision = plan_recovery(instance, failed, PlanningOptions(time_limit_s=10, target="megatron"))
    assert [c.policy for c in decision.candidates] == ["reconfigure"]  # Megatron cannot reroute
    assert decision.interim is None
    plan = decision.plan
    assert len({tuple((st.first, st.end) for st in p.stages) for p in plan.pipelines}) == 1
    assert len({p.micro_batches for p in plan.pipelines}) == 1
    assert all(st.relief in (None, instance.spec.training.recompute) for p in plan.pipelines for st in p.stages)
    assert "the restriction to megatron costs" in decision.candidates[0].reason or "as fast as" in \
        decision.candidates[0].reason
    with pytest.raises(InputError, match="cannot run a rerouting"):
        plan_recovery(instance, failed, PlanningOptions(policy="reroute", target="megatron"))


def test_export_plan_defaults_to_its_trainers_space(tmp_path) -> None:
    out = tmp_path / "megatron.json"
    done = runner.invoke(app, ["export-plan", "paper-32", "--format", "megatron", "-o", str(out), "--time-limit", "5"])
    assert done.exit_code == 0, done.output
    assert json.loads(out.read_text())["uniform"] is True


def test_torchtitan_recovery_keeps_a_shard_degree_its_release_trains_in_bf16() -> None:
    """HSDP with 2 copies: a torchtitan release before June 2026 runs a data-parallel shard degree
    of 1 as DDP in fp32, not as priced. Over 2 nodes of 4 with a device lost (7 survivors) and no
    room for the whole model on one device, the free uniform space's best is 2 replicas of 3
    stages (shard degree 1); the torchtitan restriction of such a release proves that no plan it
    trains as priced is left, and a dump of a later release (model config in model_spec) keeps
    the 2 replicas."""
    spec = tiny_instance(0, nodes=2, per_node=4, blocks=4, micro_batches=4, memory_gib=1.2)
    spec["training"].update({"zero_stage": 1, "shard_replicas": 2})
    spec["plan"]["layout"] = {"pipeline_parallel": 2, "data_parallel": 4}
    instance = build_instance(spec, "tiny-hsdp")
    failed = frozenset({0})
    model = PerfModel(instance)
    free, _, _, _ = uniform_plans(instance, failed, model, Deadline.after(60))
    assert (len(free.pipelines), len(free.pipelines[0].stages)) == (2, 3)   # shard degree 1: the case at stake
    kept, _, _, complete = uniform_plans(instance, failed, model, Deadline.after(60), sharded_precision=True)
    assert complete and kept is None
    source = {"name": "torchtitan", "era": "python", "config": {"model_spec": {"model": {"dim": 8}}}}
    later = build_instance({**spec, "trainer": source}, "tiny-hsdp-2026")
    decided = plan_recovery(dataclasses.replace(later, failed_devices=failed), failed,
                            PlanningOptions("reconfigure", 10.0, target="torchtitan"))
    assert len(decided.plan.pipelines) == 2


def test_megatron_target_prices_full_recomputation_as_a_whole_rerun() -> None:
    """An instance imported from a stack whose checkpoint stops early (recompute_early_stop, e.g.
    `import torchtitan`) planned for Megatron-LM: Megatron's own CheckpointFunction reruns the whole
    block, so the plan it gets is priced without the early stop; torchtitan keeps it."""
    from chameleon_opt.solve.target import as_run_by

    data = {"format": 1, "name": "early-stop",
            "cluster": {"nodes": 1, "devices_per_node": 4, "device_type": "H100-80",
                        "network": {"intra_node_gbps": 300, "inter_node_gbps": 25}},
            "workload": {"inline": {"name": "toy", "architecture": {
                "layers": 4, "hidden": 1024, "heads": 8, "ffn": 4096, "vocab": 1024, "seq_len": 1024}}},
            "training": {"global_batch": 8, "micro_batch_size": 1, "recomputation": "full",
                         "recompute_early_stop": True},
            "plan": {"tensor_parallel": 1, "layout": {"pipeline_parallel": 2, "data_parallel": 2}}}
    instance = build_instance(data)
    whole = build_instance({**data, "training": {**data["training"], "recompute_early_stop": False}})
    assert as_run_by(instance, "torchtitan") is instance and as_run_by(instance, "any") is instance
    megatron = as_run_by(instance, "megatron")
    assert megatron.spec.training.recompute_early_stop is False
    early_s = PerfModel(instance).evaluate(instance.plan).iteration_time_s
    whole_s = PerfModel(whole).evaluate(instance.plan).iteration_time_s
    assert PerfModel(megatron).evaluate(instance.plan).iteration_time_s == whole_s > early_s
    failed = frozenset({3})
    decision = plan_recovery(instance, failed, PlanningOptions(time_limit_s=2, target="megatron"))
    assert decision.estimate.iteration_time_s == PerfModel(whole).evaluate(decision.plan, failed).iteration_time_s
