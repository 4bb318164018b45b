"""Exports torchrun can launch node by node (issue 23).

torchrun (static rendezvous) gives the workers of node rank k the global ranks after those of node
ranks 0..k-1, in local-rank order (torch.distributed.elastic's `_assign_worker_ranks`), and the
trainer then reads each rank's stage and TP group off its global rank in its own order. So an
export is launchable only when (1) each node's new ranks are one consecutive block of
`nproc_per_node` ranks and (2) the trainer's order, applied to those ranks with the exported
degrees, puts every device on the stage and TP group the plan gives it. Both are checked here from
the exported document alone, and (2) once more by re-importing the exported settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from chameleon_opt.cli import app
from chameleon_opt.comm.lowering import LoweredPlan
from chameleon_opt.errors import InputError
from chameleon_opt.instance.load import build_instance, grid_position
from chameleon_opt.interop.common import ClusterOptions, locate_rank
from chameleon_opt.interop.export import export_plan, megatron_launcher
from chameleon_opt.interop.megatron import import_megatron
from chameleon_opt.interop.torchtitan import import_torchtitan, settings_toml
from chameleon_opt.plan import Pipeline, Plan, Stage

runner = CliRunner()

MEGATRON_ARGS = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "4", "--num-layers", "8",
                 "--hidden-size", "256", "--num-attention-heads", "8", "--vocab-size", "1000", "--seq-length", "128",
                 "--micro-batch-size", "1", "--global-batch-size", "16", "--bf16"]

TITAN_DDP = """
[model]
name = "llama3"
flavor = "8B"
[training]
local_batch_size = 8
seq_len = 4096
[parallelism]
data_parallel_replicate_degree = 2
data_parallel_shard_degree = 1
tensor_parallel_degree = 2
pipeline_parallel_degree = 2
pipeline_parallel_microbatch_size = 2
[activation_checkpoint]
mode = "full"
"""


def check_node_by_node(doc: dict, per_node: int) -> None:
    """Every node's ranks are consecutive, in node order, then by old local rank; its count is its
    --nproc-per-node; CUDA_VISIBLE_DEVICES names its old local ranks; together they are the world."""
    rows = {r["rank"]: r for r in doc["ranks"]}
    assert sorted(rows) == list(range(doc["world_size"]))
    assert doc["nnodes"] == len(doc["nodes"])
    following = 0
    for k, node in enumerate(doc["nodes"]):
        first, end = node["ranks"]
        assert node["node_rank"] == k and first == following and end - first == node["nproc_per_node"]
        assert node["devices"] == [rows[r]["device"] for r in range(first, end)]
        assert node["devices"] == sorted(node["devices"])  # local order: old local rank
        assert {d // per_node for d in node["devices"]} == {node["node"]}
        assert node["cuda_visible_devices"] == ",".join(str(d % per_node) for d in node["devices"])
        torchrun = node["torchrun"]
        for flag, value in (("--nnodes", doc["nnodes"]), ("--node-rank", k), ("--nproc-per-node", end - first)):
            assert torchrun[torchrun.index(flag) + 1] == str(value)
        following = end
    assert following == doc["world_size"]
    assert [n["node"] for n in doc["nodes"]] == sorted(n["node"] for n in doc["nodes"])


def trainer_view(doc: dict) -> tuple[str, dict[str, int]]:
    """The rank order and degrees the trainer reads from the exported settings."""
    if doc["format"] == "megatron":
        args = doc["arguments"]
        tp = int(args[args.index("--tensor-model-parallel-size") + 1])
        pp = int(args[args.index("--pipeline-model-parallel-size") + 1])
        order = "tp-pp-dp" if "--use-tp-pp-dp-mapping" in args else "tp-dp-pp"
    else:
        par = doc["parallelism"]
        tp, pp, order = par["tensor_parallel_degree"], par["pipeline_parallel_degree"], "tp-dp-pp"
        assert par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] * tp * pp == doc["world_size"]
    assert doc["rank_order"] == order
    return order, {"tp": tp, "pp": pp, "dp": doc["world_size"] // (tp * pp)}


def check_trainer_reads_the_plan(doc: dict, plan: Plan) -> None:
    """Each exported rank, read in the trainer's order with the exported degrees, is on the stage,
    TP rank and TP group the plan gives its device; one data-parallel index per pipeline."""
    order, sizes = trainer_view(doc)
    new = {r["device"]: r["rank"] for r in doc["ranks"]}
    replica: dict[int, int] = {}
    for j, pipe in enumerate(plan.pipelines):
        for s, stage in enumerate(pipe.stages):
            for t, device in enumerate(stage.devices):
                where = grid_position(order, sizes, new[device])
                assert (where["pp"], where["tp"]) == (s, t), (device, where)
                assert replica.setdefault(j, where["dp"]) == where["dp"]
                group = [r for r in range(doc["world_size"])
                         if {k: v for k, v in grid_position(order, sizes, r).items() if k != "tp"} ==
                         {"pp": s, "dp": where["dp"]}]
                assert group == [new[d] for d in stage.devices]
    assert len(set(replica.values())) == len(plan.pipelines)


def _decided(instance: str, failed: list[int], fmt: str, policy: str = "auto", limit_s: float = 5) -> tuple[dict, Plan]:
    from chameleon_opt.api import Planner

    target = fmt if fmt != "ranks" else "any"
    planner = Planner(instance, policy=policy, time_limit_s=limit_s, target=target)
    decision = planner.on_failure(failed)
    return export_plan(planner.instance, decision.rank_plans, fmt, decision.policy), decision.plan


def test_paper_32_megatron_export_is_launched_node_by_node() -> None:
    """Regression: the new ranks followed tp-dp-pp over a plan laid out pipeline by pipeline, so
    new ranks 0-1 were on node 0, 2-3 on node 2, 4-5 on node 0 again (torchrun cannot start
    that), and the launcher said 3 nodes x 8 for 28 ranks on 4 nodes of 6, 6, 8 and 8."""
    doc, plan = _decided("paper-32", [1, 13], "megatron")  # the file's failure and one more
    check_node_by_node(doc, 8)
    counts = [n["nproc_per_node"] for n in doc["nodes"]]
    assert counts == [len(n["devices"]) for n in doc["nodes"]] and sum(counts) == doc["world_size"]
    assert doc["launcher"][:2] == ["--nnodes", str(len(doc["nodes"]))]
    # one --nproc-per-node for all only when every node runs the same count (else each node's own line)
    assert ("--nproc-per-node" in doc["launcher"]) == (len(set(counts)) == 1)
    check_trainer_reads_the_plan(doc, plan)


@pytest.mark.parametrize("fmt", ["megatron", "torchtitan"])
def test_a_lost_node_exports_whole_nodes(fmt: str) -> None:
    # torchtitan's uniform space is enumerated after the free search: at 1.7x load 5 s found no plan
    # in it ("about 10 s would likely suffice"); the export is under test here, not the search's speed
    doc, plan = _decided("paper-32", list(range(8, 16)), fmt, limit_s=12 if fmt == "torchtitan" else 5)
    check_node_by_node(doc, 8)
    assert [n["node"] for n in doc["nodes"]] == [0, 2, 3] and {n["nproc_per_node"] for n in doc["nodes"]} == {8}
    check_trainer_reads_the_plan(doc, plan)
    if fmt == "megatron":
        assert doc["launcher"] == ["--nnodes", "3", "--nproc-per-node", "8"]


def test_uneven_ranks_export_is_numbered_node_by_node() -> None:
    doc, _ = _decided("paper-32", [1, 13], "ranks", policy="reconfigure")
    check_node_by_node(doc, 8)
    if not doc["uniform"]:
        assert doc["rank_order"] is None


# A Megatron-LM job imported with --use-tp-pp-dp-mapping, 4 nodes of 4; node 3 (ranks 12-15) lost.
# 12 survivors as PP 3 x DP 2 x TP 2, blocks [3, 3, 2] (layers [0, 4), [4, 7), [7, 10)), laid out
# pipeline by pipeline (a pipeline's stages on neighbouring ranks) or stage by stage.
SPLIT = ((0, 4), (4, 7), (7, 10))
BY_PIPELINE = Plan(2, tuple(Pipeline(tuple(Stage((6 * j + 2 * s, 6 * j + 2 * s + 1), *SPLIT[s]) for s in range(3)), 8)
                            for j in range(2)))
BY_STAGE = Plan(2, tuple(Pipeline(tuple(Stage((4 * s + 2 * j, 4 * s + 2 * j + 1), *SPLIT[s]) for s in range(3)), 8)
                         for j in range(2)))


def _mapped_job():
    return build_instance(import_megatron(MEGATRON_ARGS + ["--use-tp-pp-dp-mapping"],
                                          ClusterOptions(world_size=16, devices_per_node=4), []))


@pytest.mark.parametrize("plan, mapped", [(BY_PIPELINE, True), (BY_STAGE, False)])
def test_megatron_export_picks_the_rank_order_that_runs_the_plan(plan: Plan, mapped: bool) -> None:
    """Megatron-LM numbers tp-dp-pp, or tp-pp-dp with --use-tp-pp-dp-mapping: the export keeps,
    adds or drops the switch so that the node-by-node ranks read as the plan; re-importing the
    exported arguments (the importer reads Megatron-LM's order) puts every rank on its row's slot."""
    instance = _mapped_job()
    doc = export_plan(instance, LoweredPlan(instance, plan, None, [], frozenset(range(12, 16))), "megatron",
                      "reconfigure")
    check_node_by_node(doc, 4)
    assert ("--use-tp-pp-dp-mapping" in doc["arguments"]) is mapped
    assert doc["rank_order"] == ("tp-pp-dp" if mapped else "tp-dp-pp")
    check_trainer_reads_the_plan(doc, plan)
    back = build_instance(import_megatron(doc["arguments"], ClusterOptions(world_size=12, devices_per_node=4), []))
    for row in doc["ranks"]:
        place = locate_rank(back, row["rank"])
        assert (place.stage, place.tp_rank, place.layers) == (row["stage"], row["tp_rank"], tuple(row["layers"]))
        assert [r for r in place.tp_group] == row["tp_group"]


def test_torchtitan_refuses_a_plan_its_mesh_order_cannot_launch() -> None:
    """torchtitan's mesh is tp-dp-pp whatever the config says: a plan laid out pipeline by
    pipeline cannot be launched node by node, so the export says so on one line (exit 2) instead
    of writing ranks that land on other stages; the layout its order reads is exported."""
    instance = _mapped_job()
    lowered = LoweredPlan(instance, BY_PIPELINE, None, [], frozenset(range(12, 16)))
    with pytest.raises(InputError) as refused:
        export_plan(instance, lowered, "torchtitan", "reconfigure")
    message = str(refused.value)
    assert "\n" not in message and "node by node" in message and "old rank 2" in message
    assert "--format megatron" in message and refused.value.exit_code == 2
    ranks = export_plan(instance, lowered, "ranks", "reconfigure")  # the chameleon runtime reads the rows
    assert ranks["rank_order"] == "tp-pp-dp"
    check_node_by_node(ranks, 4)
    doc = export_plan(instance, LoweredPlan(instance, BY_STAGE, None, [], frozenset(range(12, 16))), "torchtitan",
                      "reconfigure")
    check_node_by_node(doc, 4)
    check_trainer_reads_the_plan(doc, BY_STAGE)


def test_torchtitan_round_trip_of_a_recovery_reads_back_every_rank(tmp_path: Path) -> None:
    """A DDP torchtitan job (2 nodes of 4) that lost rank 5: the exported config, re-imported
    (the importer reads torchtitan's mesh order), puts every new rank on its row's stage."""
    job = tmp_path / "job.toml"
    job.write_text(TITAN_DDP)
    document = import_torchtitan(job, ClusterOptions(world_size=8, devices_per_node=4, device_type="A100-80"), [5])
    doc, plan = _decided(document, [5], "torchtitan")
    check_node_by_node(doc, 4)
    check_trainer_reads_the_plan(doc, plan)
    back = tmp_path / "back.toml"
    back.write_text(settings_toml(doc["config"], []))
    options = ClusterOptions(world_size=doc["world_size"], devices_per_node=1)
    again = build_instance(import_torchtitan(back, options, []))
    for row in doc["ranks"]:
        place = locate_rank(again, row["rank"])
        assert (place.stage, place.tp_rank, place.layers) == (row["stage"], row["tp_rank"], tuple(row["layers"]))


def test_megatron_launcher_keeps_the_common_arguments_and_leaves_each_node_its_own() -> None:
    from chameleon_opt.interop.export import NodeLaunch

    def node(k: int, n: int) -> NodeLaunch:
        return NodeLaunch(node_rank=k, node=k, nproc_per_node=n, ranks=(0, n), devices=list(range(n)),
                          cuda_visible_devices="", torchrun=[])

    original = ["--nnodes", "4", "--nproc_per_node", "8", "--node_rank", "$NODE_RANK", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", "host:29500", "--max-restarts", "0"]
    assert megatron_launcher(original, [node(0, 6), node(1, 8)]) == [
        "--rdzv-endpoint", "host:29500", "--max-restarts", "0", "--nnodes", "2", "--rdzv-backend", "static"]
    assert megatron_launcher(["--standalone", "--nproc-per-node", "8"], [node(0, 8), node(1, 8)]) == [
        "--nnodes", "2", "--nproc-per-node", "8"]
    assert megatron_launcher(None, [node(0, 4)]) == ["--nnodes", "1", "--nproc-per-node", "4"]


def test_the_toml_export_says_how_to_launch_each_node(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text(TITAN_DDP)
    assert runner.invoke(app, ["import", "torchtitan", str(job), "--device-type", "A100-80", "--world-size", "8",
                               "--devices-per-node", "4", "--failed", "5", "-o",
                               str(tmp_path / "job.json")]).exit_code == 0
    done = runner.invoke(app, ["export-plan", str(tmp_path / "job.json"), "--format", "torchtitan", "--time-limit",
                               "5", "-o", str(tmp_path / "plan.toml")])
    assert done.exit_code == 0, done.output
    text = (tmp_path / "plan.toml").read_text()
    assert "# launch node by node" in text  # rank 5 (node 1, local 1) failed: node 1 runs local ranks 0 and 2
    assert "node 1: CUDA_VISIBLE_DEVICES=0,2 torchrun --nnodes 2 --node-rank 1 --nproc-per-node 2" in text
