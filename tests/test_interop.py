"""Rank order and interop: Megatron-LM / torchtitan rank orders, job configs in, plans out."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from chameleon_opt.cli import app
from chameleon_opt.comm.lowering import LoweredPlan
from chameleon_opt.instance.load import build_instance, load_instance
from chameleon_opt.interop.common import ClusterOptions, locate_rank, module_names
from chameleon_opt.interop.export import MODELS, export_plan, export_schema
from chameleon_opt.interop.megatron import import_megatron
from chameleon_opt.interop.torchtitan import import_torchtitan
from chameleon_opt.plan import Pipeline, Plan, Stage

MEGATRON_ARGS = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "4", "--num-layers", "8",
                 "--hidden-size", "256", "--num-attention-heads", "8", "--vocab-size", "1000", "--seq-length", "128",
                 "--micro-batch-size", "1", "--global-batch-size", "16", "--bf16", "--lr", "1e-4"]

TITAN_TOML = """
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
module_fqns_per_model_part = [["tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3", "layers.4",
  "layers.5", "layers.6", "layers.7", "layers.8", "layers.9", "layers.10", "layers.11", "layers.12", "layers.13",
  "layers.14"], ["layers.15", "layers.16", "layers.17", "layers.18", "layers.19", "layers.20", "layers.21",
  "layers.22", "layers.23", "layers.24", "layers.25", "layers.26", "layers.27", "layers.28", "layers.29",
  "layers.30", "layers.31", "norm", "output"]]
[activation_checkpoint]
mode = "selective"
selective_ac_option = "op"
"""


def test_megatron_rank_13_maps_to_its_stage_and_tp_group():
    """Hand-worked, Megatron-LM's default order tp-cp-ep-dp-pp with TP 2, PP 4, 16 ranks (DP 2):
    TP groups are consecutive pairs, so rank 13 is TP rank 1 of [12, 13]; DP groups pair ranks 2
    apart ([12, 14], [13, 15]), so 13 is replica 0; PP groups stride TP x DP = 4 ([1, 5, 9, 13]),
    so 13 is stage 3, which holds blocks 6-7 and the head: layers [7, 10)."""
    instance = build_instance(import_megatron(MEGATRON_ARGS, ClusterOptions(world_size=16), [13]))
    assert instance.spec.plan.layout.order == "tp-dp-pp"
    place = locate_rank(instance, 13)
    assert (place.pipeline, place.stage, place.tp_rank, place.tp_group, place.layers) == (0, 3, 1, (12, 13), (7, 10))
    assert [locate_rank(instance, r).stage for r in (1, 5, 9, 13)] == [0, 1, 2, 3]  # one PP group
    # --use-tp-pp-dp-mapping: stages vary before replicas; 13 = tp 1 + 2 x (stage 2 + 4 x replica 1)
    mapped = build_instance(import_megatron(MEGATRON_ARGS + ["--use-tp-pp-dp-mapping"],
                                            ClusterOptions(world_size=16), [13]))
    place = locate_rank(mapped, 13)
    assert (place.pipeline, place.stage, place.tp_rank, place.tp_group) == (1, 2, 1, (12, 13))


def test_default_order_is_unchanged_and_torchtitan_mesh_order_holds():
    paper = load_instance("paper-32")  # TP 2, PP 4, DP 4 in the default tp-pp-dp order
    assert paper.spec.plan.layout.order == "tp-pp-dp"
    assert paper.plan.pipelines[1].stages[2].devices == (12, 13)
    doc = import_torchtitan(_toml(TITAN_TOML), ClusterOptions(), [])
    instance = build_instance(doc)
    tp, dp = 2, 2
    for j, pipe in enumerate(instance.plan.pipelines):  # torchtitan: rank = (pp x DP + dp) x TP + tp
        for s, stage in enumerate(pipe.stages):
            assert stage.devices == tuple((s * dp + j) * tp + t for t in range(tp))


def _toml(text: str, folder: Path | None = None) -> Path:
    import tempfile

    path = Path(tempfile.mkdtemp(dir=folder)) / "job.toml"
    path.write_text(text)
    return path


def test_torchtitan_round_trip_through_the_cli(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(TITAN_TOML)
    runner = CliRunner()
    result = runner.invoke(app, ["import", "torchtitan", str(job), "--device-type", "A100-80", "-o",
                                 str(tmp_path / "job.json")])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["export-plan", str(tmp_path / "job.json"), "--format", "torchtitan", "-o",
                                 str(tmp_path / "plan.toml")])
    assert result.exit_code == 0, result.output
    original, back = tomllib.loads(TITAN_TOML), tomllib.loads((tmp_path / "plan.toml").read_text())
    for key, value in original["parallelism"].items():
        assert back["parallelism"][key] == value, key
    assert back["training"]["local_batch_size"] == original["training"]["local_batch_size"]
    assert back["training"]["seq_len"] == original["training"]["seq_len"]
    # the output rule: never over an existing file without --force
    again = runner.invoke(app, ["export-plan", str(tmp_path / "job.json"), "--format", "torchtitan", "-o",
                                str(tmp_path / "plan.toml")])
    assert again.exit_code == 2


def test_recovery_plan_for_a_failed_rank_in_two_commands(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(TITAN_TOML)
    runner = CliRunner()
    assert runner.invoke(app, ["import", "torchtitan", str(job), "--device-type", "A100-80", "--failed", "5",
                               "-o", str(tmp_path / "job.json")]).exit_code == 0
    result = runner.invoke(app, ["export-plan", str(tmp_path / "job.json"), "--format", "ranks",
                                 "-o", str(tmp_path / "plan.json")])
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "plan.json").read_text())
    MODELS["ranks"].model_validate(doc)
    assert doc["failed"] == [5] and 5 not in [r["device"] for r in doc["ranks"]]
    assert sorted(r["rank"] for r in doc["ranks"]) == list(range(doc["world_size"]))


def test_uneven_plan_exports_per_rank_module_lists_that_fit_the_schema():
    instance = build_instance(import_megatron(MEGATRON_ARGS, ClusterOptions(world_size=16), []))
    # two pipelines of different depth and micro-batch counts, TP 2 (14 of 16 ranks)
    plan = Plan(2, (Pipeline((Stage((0, 1), 0, 3), Stage((2, 3), 3, 6), Stage((4, 5), 6, 8), Stage((6, 7), 8, 10)), 9),
                    Pipeline((Stage((8, 9), 0, 4), Stage((10, 11), 4, 7), Stage((14, 15), 7, 10)), 7)))
    lowered = LoweredPlan(instance, plan, None, [], frozenset({12, 13}))
    for fmt in ("torchtitan", "megatron", "ranks"):
        doc = export_plan(instance, lowered, fmt, "reconfigure")
        assert not doc["uniform"] and doc["world_size"] == 14
        _validate(doc, export_schema(fmt), MODELS[fmt])
    doc = export_plan(instance, lowered, "torchtitan", "reconfigure")
    assert doc["parallelism"] is None
    for pipe in (0, 1):  # each pipeline's module lists cover the model once, in order
        stages = sorted({(r["stage"], tuple(r["modules"])) for r in doc["ranks"] if r["pipeline"] == pipe})
        modules = [m for _, mods in stages for m in mods]
        assert modules == [m for layer in range(10) for m in module_names(layer, 10, "torchtitan")]
    assert {r["micro_batches"] for r in doc["ranks"] if r["pipeline"] == 1} == {7}
    assert next(r for r in doc["ranks"] if r["device"] == 14)["modules"] == ["layers.6", "layers.7", "norm", "output"]


def _validate(doc: dict, schema: dict, model: type) -> None:
    """Against the JSON Schema itself when jsonschema is installed, else by the model it came from."""
    try:
        import jsonschema
    except ImportError:
        model.model_validate(doc)
    else:
        jsonschema.validate(doc, schema)


def test_hf_config_and_megatron_argument_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 64,
        "tie_word_embeddings": True}))
    args = tmp_path / "args.txt"
    args.write_text("--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2  # comment\n"
                    "--micro-batch-size 2 --global-batch-size 8 --nnodes 1 --nproc-per-node 4\n")
    doc = import_megatron([str(args)], ClusterOptions(), [], model=str(tmp_path / "config.json"))
    instance = build_instance(doc)
    arch = instance.workload.architecture
    assert (arch.layers, arch.kv_heads, arch.gated_mlp, arch.tied_embeddings) == (4, 2, True, True)
    assert [s.end - s.first for s in instance.plan.pipelines[0].stages] == [3, 3]  # 2 blocks + embedding / head
    assert instance.num_devices == 4


@pytest.mark.parametrize("args, fix", [(["--context-parallel-size", "2"], "DP x PP x TP"),
                                       ([], "--world-size")])
def test_unsupported_megatron_jobs_are_one_line_errors(args, fix):
    runner = CliRunner()
    extra = [] if fix == "--world-size" else ["--world-size", "16"]
    result = runner.invoke(app, ["import", "megatron", *extra, "--", *MEGATRON_ARGS, *args])
    assert result.exit_code == 2 and fix in result.output


def test_runtime_orders_in_torch_action_notation():
    """The project's scheduler (rerouted plans run on it) prints torch's notation; on a regular plan
    its order is exactly torch's Schedule1F1B for a 2-stage pipeline of 4 micro-batches."""
    import dataclasses

    from chameleon_opt.api import Planner
    from chameleon_opt.comm.allreduce import schedule_allreduce
    from chameleon_opt.comm.lowering import lower_plan
    from chameleon_opt.perf.model import PerfModel
    from chameleon_opt.runtime.schedule import order_operations, torch_actions
    from chameleon_opt.solve.deadline import Deadline
    instance = dataclasses.replace(load_instance("runtime-cpu-4"), failed_devices=frozenset())
    rounds = schedule_allreduce(PerfModel(instance), instance.plan, frozenset(), Deadline.after(1.0)).rounds
    plans = lower_plan(instance, instance.plan, None, rounds, frozenset())
    orders = order_operations(plans, instance.micro_batch_size)
    assert torch_actions(plans[0], orders[0]) == ["0F0", "0F1", "0B0", "0F2", "0B1", "0F3", "0B2", "0B3"]
    assert torch_actions(plans[1], orders[1]) == ["1F0", "1B0", "1F1", "1B1", "1F2", "1B2", "1F3", "1B3"]
    decision = Planner(instance, policy="reroute").on_failure([1])
    orders = order_operations(decision.rank_plans, instance.micro_batch_size)
    for device, ops in orders.items():
        actions = torch_actions(decision.rank_plans[device], ops)
        forwards = sorted(a.replace("F", "?") for a in actions if "F" in a)
        assert forwards == sorted(a.replace("B", "?") for a in actions if "B" in a)  # every F has its B


def test_reroute_ranks_export_lists_no_failed_rank_and_carries_the_rerouted_pieces(tmp_path):
    """Regression (issue 22): the rows came from the plan, so a rerouting listed the failed devices
    as ranks and none of the micro-batches their peers run for the lost stage."""
    out = tmp_path / "plan.json"
    done = CliRunner().invoke(app, ["export-plan", "paper-32", "--failed", "1", "--policy", "reroute", "--format",
                                    "ranks", "-o", str(out)])
    assert done.exit_code == 0, done.output
    doc = json.loads(out.read_text())
    _validate(doc, export_schema("ranks"), MODELS["ranks"])
    plan = doc["plan"]
    assert doc["policy"] == "reroute" and doc["failed"] == [1, 13] and plan["rerouted"]
    devices = [r["device"] for r in doc["ranks"]]
    assert not set(devices) & {1, 13} and doc["idle"] == [0, 12]  # the lost stages' surviving TP peers idle
    assert sorted(r["rank"] for r in doc["ranks"]) == list(range(doc["world_size"])) and doc["world_size"] == 28
    lost = sorted({(r["from_pipeline"], r["stage"]) for r in plan["rerouted"]})
    assert lost == [(0, 0), (1, 2)]
    offsets = [sum(p["micro_batches"] for p in plan["pipelines"][:j]) for j in range(len(plan["pipelines"]))]
    for j, s in lost:
        owed = plan["pipelines"][j]["micro_batches"]
        for t in range(plan["tensor_parallel"]):
            extra = [w for r in doc["ranks"] if r["tp_rank"] == t for w in r["rerouted"]
                     if (w["pipeline"], w["stage"]) == (j, s)]
            assert extra and abs(sum(w["micro_batches"] for w in extra) - owed) < 1e-6
            covered: dict[int, float] = {}
            for piece in (p for w in extra for p in w["pieces"]):
                covered[piece["id"]] = covered.get(piece["id"], 0.0) + piece["hi"] - piece["lo"]
            assert sorted(covered) == list(range(offsets[j], offsets[j] + owed))  # j's own ids, each once
            assert all(abs(share - 1.0) < 1e-6 for share in covered.values())
    # the stage after the lost one receives its activations from the peers that computed them
    after = next(r for r in doc["ranks"] if (r["pipeline"], r["stage"], r["tp_rank"]) == (0, 1, 0))
    assert after["prev_rank"] is None and after["rerouted_neighbours"]
    senders = {n["rank"] for p in after["rerouted_neighbours"] for n in p["prev"]}
    assert senders == {r["rank"] for r in doc["ranks"]
                       if r["tp_rank"] == 0 and any(w["pipeline"] == 0 for w in r["rerouted"])}


def test_a_bubble_filled_rerouting_exports_each_ranks_action_list(tmp_path):
    """The ranks export of a bubble-filled rerouting carries every rank's order in torch's
    notation (F, I = input gradient, W = weight gradient): each of its micro-batches once per kind,
    the lost stage's (pipeline 0's ids 0-3) on the peer that hosts them."""
    out = tmp_path / "plan.json"
    done = CliRunner().invoke(app, ["export-plan", "runtime-cpu-4", "--failed", "1", "--policy", "reroute",
                                    "--format", "ranks", "--time-limit", "2", "-o", str(out)])
    assert done.exit_code == 0, done.output
    doc = json.loads(out.read_text())
    _validate(doc, export_schema("ranks"), MODELS["ranks"])
    for row in doc["ranks"]:
        hosted = sum(w["micro_batches"] for w in row["rerouted"])
        ids = {a[2:] for a in row["actions"]}
        assert len(ids) == row["micro_batches"] + hosted  # its own micro-batches and the hosted ones
        assert sorted(row["actions"]) == sorted(f"{row['stage']}{kind}{mb}" for kind in "FIW" for mb in ids)
    host = next(r for r in doc["ranks"] if r["device"] == 3)
    assert {f"1{kind}{k}" for kind in "FIW" for k in range(4)} <= set(host["actions"])


@pytest.mark.parametrize("policy", ["reroute", "reconfigure"])
def test_every_exported_rank_is_the_rank_plan_the_runtime_gets(policy):
    """export-plan's rows are the decision's lowering renamed to new ranks: the same slot, layers,
    micro-batch pieces and peers as `for_rank`, which the runtimes execute; every other device is
    failed or idle there too."""
    from chameleon_opt.api import Planner

    planner = Planner("paper-32", policy=policy, time_limit_s=5)
    decision = planner.on_failure([1])
    doc = export_plan(planner.instance, decision.rank_plans, "ranks", decision.policy)
    _validate(doc, export_schema("ranks"), MODELS["ranks"])
    new = {r["device"]: r["rank"] for r in doc["ranks"]}

    def links(items) -> list:
        return [(new[n.device], n.lo, n.hi) for n in items]

    def pieces(items) -> list:
        return [(p.id, p.lo, p.hi, links(p.prev), links(p.next)) for p in items]

    def exported(items) -> list:
        return [(p["id"], p["lo"], p["hi"], [(n["rank"], n["lo"], n["hi"]) for n in p["prev"]],
                 [(n["rank"], n["lo"], n["hi"]) for n in p["next"]]) for p in items]

    for row in doc["ranks"]:
        rp = decision.for_rank(row["device"])
        assert rp.role == "train"
        assert (row["pipeline"], row["stage"], row["num_stages"], row["tp_rank"], tuple(row["layers"])) == \
            (rp.pipeline, rp.stage, rp.num_stages, rp.tp_rank, rp.layers)
        assert row["tp_group"] == [new[d] for d in rp.tp_group]
        assert (row["prev_rank"], row["next_rank"]) == \
            tuple(None if d is None else new[d] for d in (rp.prev_device, rp.next_device))
        own = [p for p in rp.micro_batches if p.pipeline == rp.pipeline]
        assert row["micro_batches"] == decision.plan.pipelines[rp.pipeline].micro_batches == \
            round(sum(p.hi - p.lo for p in own))
        assert exported(p for w in row["rerouted"] for p in w["pieces"]) == \
            pieces(p for p in rp.micro_batches if p.pipeline != rp.pipeline)
        if row["rerouted_neighbours"]:
            assert exported(row["rerouted_neighbours"]) == pieces(own)
        else:  # the static neighbours are every own piece's only peers
            for p in own:
                assert links(p.prev) == ([] if rp.prev_device is None else [(row["prev_rank"], p.lo, p.hi)])
                assert links(p.next) == ([] if rp.next_device is None else [(row["next_rank"], p.lo, p.hi)])
    others = set(range(planner.instance.num_devices)) - set(new)
    assert others == set(doc["failed"]) | set(doc["idle"]) and not set(doc["failed"]) & set(doc["idle"])
    for device in others:  # no work: failed, an idle spare, or a source that only sends state before training
        rp = decision.for_rank(device)
        assert rp.role == "failed" if device in doc["failed"] else rp.role in ("idle", "source")
        assert rp.micro_batches == ()
