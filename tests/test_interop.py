"""Rank order and interop: Megatron-LM / torchtitan rank orders, job configs in, plans out."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from chameleon_opt.cli import app
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
    for fmt in ("torchtitan", "megatron", "ranks"):
        doc = export_plan(instance, plan, frozenset({12, 13}), fmt, "reconfigure")
        assert not doc["uniform"] and doc["world_size"] == 14
        _validate(doc, export_schema(fmt), MODELS[fmt])
    doc = export_plan(instance, plan, frozenset({12, 13}), "torchtitan", "reconfigure")
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
