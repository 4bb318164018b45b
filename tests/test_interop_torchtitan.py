"""torchtitan imports that are faithful or refuse, and exports that reproduce the job.

Configs here are written for these tests with the keys of torchtitan's own schemas: the TOML era's
JobConfig (torchtitan/config/job_config.py at v0.2.2) and the Python era's Trainer.Config as
`--debug.save_config_file` dumps it (torchtitan/trainer.py `to_dict`, torchtitan/config/configs.py).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from chameleon_opt.cli import app
from chameleon_opt.comm.lowering import LoweredPlan
from chameleon_opt.errors import InputError
from chameleon_opt.instance.load import build_instance
from chameleon_opt.interop.common import ClusterOptions, locate_rank
from chameleon_opt.interop.export import export_plan
from chameleon_opt.interop.torchtitan import default_split, import_torchtitan

LLAMA70_PP4 = """
[model]
name = "llama3"
flavor = "70B"
[training]
local_batch_size = 8
seq_len = 8192
[parallelism]
data_parallel_shard_degree = -1
tensor_parallel_degree = 8
pipeline_parallel_degree = 4
pipeline_parallel_microbatch_size = 1
pipeline_parallel_schedule = "1F1B"
[activation_checkpoint]
mode = "full"
"""


def _write(tmp_path: Path, text: str, name: str = "job.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _stage_layers(doc: dict) -> list[int]:
    return [s.end - s.first for s in build_instance(doc).plan.pipelines[0].stages]


def test_default_split_is_torchtitans_own():
    """torchtitan's _generate_llm_fqn_per_model_part (distributed/pipeline_parallel.py): the
    embedding and the head weigh one layer each; 80 blocks + 2 over 4 stages is 20 each with 2 left
    over, which go to the *first* stages: effective [21, 21, 20, 20]; stage 0 = embedding + 20
    blocks, stage 3 = 19 blocks + norm/output. As workload layers (embedding, head one each):
    [21, 21, 20, 20]. 32 blocks over 2: [17, 17]; 30 blocks over 4: 32 / 4 = 8 each, so blocks
    [7, 8, 8, 7]; first-stage weight 3 over 4 stages of 16 blocks: 20 / 4 = 5, stage 0 holds 2 blocks."""
    assert default_split(80, 4, 1, 1) == [21, 21, 20, 20]
    assert default_split(32, 2, 1, 1) == [17, 17]
    assert default_split(30, 4, 1, 1) == [8, 8, 8, 8]
    assert default_split(16, 4, 3, 1) == [3, 5, 5, 5]


def test_llama70b_tp8_pp4_places_layers_as_torchtitan_and_uses_sp(tmp_path):
    doc = import_torchtitan(_write(tmp_path, LLAMA70_PP4), ClusterOptions(world_size=64), [])
    assert doc["plan"]["layout"]["layers_per_stage"] == [21, 21, 20, 20]
    training = doc["training"]
    assert training["sequence_parallel"] is True  # torchtitan's TP plan is SequenceParallel on every norm
    assert (training["recomputation"], training["micro_batch_size"], training["global_batch"]) == ("full", 1, 16)
    # FSDP under PP: torch pipelining keeps parameters (bf16, 2 B) and fp32 gradients (4 B) unsharded
    # for the step; the fp32 parameter, gradient and Adam moments (16 B) are sharded: ZeRO-1 totals
    assert (training["zero_stage"], training["grad_bytes_per_param"],
            training["optimizer"]["state_bytes_per_param"]) == (1, 4, 16)
    instance = build_instance(doc)
    # torchtitan's mesh [pp, dp_shard, tp]: rank 8 is stage 0 of replica 1; rank 16 stage 1 of replica 0
    assert (locate_rank(instance, 8).stage, locate_rank(instance, 8).pipeline) == (0, 1)
    assert locate_rank(instance, 16).layers == (21, 42)
    assert locate_rank(instance, 63).layers == (62, 82)


def test_sharding_and_precision_follow_torchtitan(tmp_path):
    """FSDP without PP reshards after forward (ZeRO-3); 'never' keeps parameters (ZeRO-2); DDP keeps
    fp32 parameters under autocast (16 B replicated); TP without FSDP runs in fp32 (maybe_enable_amp)."""
    base = LLAMA70_PP4.replace("pipeline_parallel_degree = 4", "pipeline_parallel_degree = 1")
    fsdp = import_torchtitan(_write(tmp_path, base), ClusterOptions(world_size=64), [])["training"]
    assert (fsdp["zero_stage"], fsdp["precision"], fsdp["grad_bytes_per_param"],
            fsdp["optimizer"]["state_bytes_per_param"]) == (3, "bf16", 4, 10)
    never = base.replace("[parallelism]", "[parallelism]\nfsdp_reshard_after_forward = \"never\"")
    assert import_torchtitan(_write(tmp_path, never), ClusterOptions(world_size=64), [])["training"]["zero_stage"] == 2
    ddp = base.replace("data_parallel_shard_degree = -1", "data_parallel_shard_degree = 1\n"
                       "data_parallel_replicate_degree = 8").replace("tensor_parallel_degree = 8",
                                                                     "tensor_parallel_degree = 1")
    ddp_training = import_torchtitan(_write(tmp_path, ddp), ClusterOptions(world_size=8), [])["training"]
    assert (ddp_training["zero_stage"], ddp_training["precision"]) == (0, "bf16")
    tp_only = base.replace("data_parallel_shard_degree = -1", "data_parallel_shard_degree = 1")
    assert import_torchtitan(_write(tmp_path, tp_only), ClusterOptions(world_size=8), [])["training"][
        "precision"] == "fp32"


def test_interleaved_1f1b_imports_as_virtual_stages_when_each_ranks_stages_are_equal(tmp_path):
    """Interleaved1F1B places stages looped (rank r runs r, r + p, ...): Llama 3 405B's 126 blocks +
    embedding + head over torchtitan's default 2 x 4 stages are 128 / 8 = 16 workload layers each
    (stage 0 = embedding + 15 blocks, stage 7 = 15 blocks + head), so each rank holds 32 layers as 2
    virtual stages; 8 layers a stage gives 16 stages, 4 per rank."""
    text = LLAMA70_PP4.replace('"70B"', '"405B"').replace('"1F1B"', '"Interleaved1F1B"')
    doc = import_torchtitan(_write(tmp_path, text), ClusterOptions(world_size=64), [])
    assert doc["plan"]["layout"]["layers_per_stage"] == [32, 32, 32, 32]
    assert doc["training"]["virtual_stages"] == 2
    assert _stage_layers(doc) == [32, 32, 32, 32]
    four = text.replace("[parallelism]", "[parallelism]\npipeline_parallel_layers_per_stage = 8")
    assert import_torchtitan(_write(tmp_path, four), ClusterOptions(world_size=64), [])["training"][
        "virtual_stages"] == 4
    single = import_torchtitan(_write(tmp_path, text.replace('"Interleaved1F1B"', '"1F1B"')),
                               ClusterOptions(world_size=64), [])["training"]
    assert "virtual_stages" not in single


@pytest.mark.parametrize("edit, key", [
    (("pipeline_parallel_schedule = \"1F1B\"", "pipeline_parallel_schedule = \"LoopedBFS\""),
     "parallelism.pipeline_parallel_schedule"),
    (("pipeline_parallel_schedule = \"1F1B\"", "pipeline_parallel_schedule = \"InterleavedZeroBubble\""),
     "parallelism.pipeline_parallel_schedule"),
    # 80 blocks + embedding + head over 2 x 4 stages: [11, 11, 10, ...]; rank 0 runs stages 0 and 4, 11 + 10
    (("pipeline_parallel_schedule = \"1F1B\"", "pipeline_parallel_schedule = \"Interleaved1F1B\""),
     "parallelism.pipeline_parallel_schedule"),
    # 82 layers at 21 a stage: 4 stages, one per rank, which torchtitan refuses for a multi-stage schedule
    (("pipeline_parallel_schedule = \"1F1B\"", "pipeline_parallel_schedule = \"Interleaved1F1B\"\n"
      "pipeline_parallel_layers_per_stage = 21"), "parallelism.pipeline_parallel_layers_per_stage"),
    (("pipeline_parallel_schedule = \"1F1B\"", "pipeline_parallel_schedule = \"ZBVZeroBubble\""),
     "parallelism.pipeline_parallel_schedule"),
    (("pipeline_parallel_schedule = \"1F1B\"", "pipeline_parallel_schedule = \"GPipe\""),
     "parallelism.pipeline_parallel_schedule"),
    (("data_parallel_shard_degree = -1", "data_parallel_shard_degree = 1\ndata_parallel_replicate_degree = 2\n"
      "context_parallel_degree = 2"), "parallelism.context_parallel_degree"),
    (("data_parallel_shard_degree = -1", "data_parallel_shard_degree = 1\ndata_parallel_replicate_degree = 2"),
     "parallelism"),  # 64 ranks asked, 2 x 8 x 4 = 64 fine; see the HSDP case below
    (("mode = \"full\"", "mode = \"memory_budget\"\nmemory_budget = 0.5"), "activation_checkpoint.memory_budget"),
    (("mode = \"full\"", "mode = \"selective\"\nselective_ac_option = \"2\""),  # PP stages after 41 blocks
     "activation_checkpoint.selective_ac_option"),
    (("mode = \"full\"", "mode = \"selective\"\nselective_ac_option = \"0\""),
     "activation_checkpoint.selective_ac_option"),
    (("flavor = \"70B\"", "flavor = \"70B\"\nconverters = [\"mx\"]"), "model.converters"),
    # float8 is priced as torch.compile runs it (tests/test_torchtitan_float8.py); eager blocks are refused
    (("flavor = \"70B\"", "flavor = \"70B\"\nconverters = [\"float8\"]"), "compile.enable"),
    (("flavor = \"70B\"", "flavor = \"70B\"\n[float8]\nenable_float8_linear = true\n[model2]"), "compile.enable"),
    (("tensor_parallel_degree = 8", "tensor_parallel_degree = 8\nenable_async_tensor_parallel = true"),
     "parallelism.enable_async_tensor_parallel"),  # without compile, which torchtitan refuses too
    (("tensor_parallel_degree = 8", "tensor_parallel_degree = 8\ndisable_loss_parallel = true"),
     "parallelism.disable_loss_parallel"),
    (("tensor_parallel_degree = 8", "tensor_parallel_degree = 8\nenable_magic = true"), "parallelism.enable_magic"),
    (("seq_len = 8192", "seq_len = 8192\nenable_cpu_offload = true"), "training.enable_cpu_offload"),
])
def test_what_the_planner_cannot_model_is_refused(tmp_path, edit, key):
    text = LLAMA70_PP4.replace(*edit)
    world = 32 if "replicate_degree = 2\n" in text and "context" not in text else 64
    if key == "parallelism":  # DDP x TP x PP is modelled: 2 x 8 x 4 = 64 ranks
        assert import_torchtitan(_write(tmp_path, text), ClusterOptions(world_size=64), [])["training"][
            "zero_stage"] == 0
        return
    with pytest.raises(InputError) as err:
        import_torchtitan(_write(tmp_path, text), ClusterOptions(world_size=world), [])
    assert err.value.field == key


def test_layer_selective_checkpointing_is_full_every_kth_block(tmp_path):
    """selective_ac_option = "2": torchtitan's counter wraps blocks 2, 4, ... (counted from 1) in the
    full checkpoint, the planner's full every 2. Priced by hand on Llama 3 70B without PP: blocks
    1, 3, ... (and the embedding and head) cost what they cost without checkpointing, blocks 2, 4, ...
    what they cost fully recomputed, so the stage's activations and time are the two halves' sum."""
    from chameleon_opt.perf.model import PerfModel

    one_stage = LLAMA70_PP4.replace("pipeline_parallel_degree = 4", "pipeline_parallel_degree = 1")
    text = one_stage.replace("mode = \"full\"", "mode = \"selective\"\nselective_ac_option = \"2\"")
    doc = import_torchtitan(_write(tmp_path, text), ClusterOptions(world_size=64), [])
    assert (doc["training"]["recomputation"], doc["training"]["checkpoint_every"]) == ("full", 2)
    assert any("layer-selective" in a for a in doc["training"]["assumptions"])
    full = import_torchtitan(_write(tmp_path, one_stage, "full.toml"), ClusterOptions(world_size=64), [])
    none = json.loads(json.dumps(full))
    none["training"]["recomputation"] = "none"
    mixed, every, kept = (PerfModel(build_instance(d)) for d in (doc, full, none))
    devices, layers = tuple(range(8)), mixed.workload.num_layers
    checkpointed = np.arange(layers) % 2 == 0
    checkpointed[[0, -1]] = False
    for name in ("act", "fwd", "bwd", "tp_bwd"):
        rows = [np.diff(m._tables(m.stage_device(devices), 8)[name]) for m in (mixed, every, kept)]
        assert np.allclose(rows[0], np.where(checkpointed, rows[1], rows[2])), name
    assert checkpointed.sum() == 40
    assert mixed.transient_bytes(8) == every.transient_bytes(8)  # a checkpointed block's backward


def test_layer_selective_checkpointing_under_pp_needs_torchtitans_per_rank_count(tmp_path):
    """Each PP rank counts its own blocks from 1: [21, 21, 20, 20] layers start stages after 20, 41
    and 61 blocks, so with k = 2 stage 2's ranks checkpoint the planner's odd blocks (refused); k = 1
    (every block) and stages after 20 / 40 / 60 blocks (module_fqns_per_model_part) import."""
    text = LLAMA70_PP4.replace("mode = \"full\"", "mode = \"selective\"\nselective_ac_option = \"2\"")
    with pytest.raises(InputError, match="not a multiple of 2") as err:
        import_torchtitan(_write(tmp_path, text), ClusterOptions(world_size=64), [])
    assert err.value.field == "activation_checkpoint.selective_ac_option"
    parts = [["tok_embeddings"] + [f"layers.{i}" for i in range(20)]] + \
        [[f"layers.{i}" for i in range(20 * s, 20 * s + 20)] for s in (1, 2)] + \
        [[f"layers.{i}" for i in range(60, 80)] + ["norm", "output"]]
    even = text.replace("pipeline_parallel_schedule = \"1F1B\"",
                        f"pipeline_parallel_schedule = \"1F1B\"\nmodule_fqns_per_model_part = {json.dumps(parts)}")
    assert import_torchtitan(_write(tmp_path, even, "even.toml"), ClusterOptions(world_size=64), [])[
        "training"]["checkpoint_every"] == 2
    every = text.replace("\"2\"", "\"1\"")
    assert import_torchtitan(_write(tmp_path, every, "one.toml"), ClusterOptions(world_size=64), [])[
        "training"]["checkpoint_every"] == 1


def test_hsdp_is_imported_as_copies_of_each_shard(tmp_path):
    """HSDP: 4 replicate groups x 2-way sharding (torchtitan's mesh [dp_replicate, dp_shard]: DP
    ranks 2i and 2i + 1 shard together), so each FSDP shard has 4 copies and the optimizer state is
    divided by 2, not by DP = 8. Exported back (unchanged plan): the same degrees, and the re-import
    is the same job; a plan with DP 7 has no HSDP form (exit 2)."""
    text = LLAMA70_PP4.replace("data_parallel_shard_degree = -1",
                               "data_parallel_shard_degree = 2\ndata_parallel_replicate_degree = 4")
    doc = import_torchtitan(_write(tmp_path, text), ClusterOptions(world_size=256), [])
    training = doc["training"]
    assert (training["zero_stage"], training["shard_replicas"], doc["plan"]["layout"]["data_parallel"]) == (1, 4, 8)
    assert any("HSDP" in a for a in training["assumptions"])
    instance = build_instance(doc)
    from chameleon_opt.perf.model import PerfModel

    model = PerfModel(instance)
    stage = instance.plan.pipelines[0].stages[1]
    b = model.stage_memory_breakdown(stage.devices, stage.first, stage.end, 1, 4, 8, 0.0, 8)
    per_gpu = float(model.workload.params[stage.first:stage.end].sum()) / 8
    assert b.optimizer == pytest.approx(per_gpu * model.optimizer_bytes / 2)
    out = export_plan(instance, LoweredPlan(instance, instance.plan, None, [], frozenset()), "torchtitan", "initial")
    assert (out["parallelism"]["data_parallel_replicate_degree"], out["parallelism"]["data_parallel_shard_degree"]) \
        == (4, 2)
    again = import_torchtitan(_write(tmp_path, json.dumps(out["config"]), "again.json"),
                              ClusterOptions(world_size=256), [])
    assert again["plan"] == doc["plan"] and again["training"] == doc["training"]
    from chameleon_opt.plan import Plan

    seven = Plan(8, instance.plan.pipelines[:7])
    with pytest.raises(InputError, match="not a multiple of training.shard_replicas = 4"):
        export_plan(instance, LoweredPlan(instance, seven, None, [], frozenset()), "torchtitan", "reconfigure")


PYTHON_ERA = {  # a Trainer.Config dump after August 2026: token budgets, num_pp_microbatches, AC policy
    "model_spec": {"name": "llama3", "flavor": "8B"},
    "hf_assets_path": "./assets/hf/Llama-3.1-8B",
    "training": {"num_tokens_per_microbatch_per_dp_rank": 16384, "num_tokens_per_train_step": -1,
                 "max_context_length": 8192, "max_norm": 1.0, "steps": 1000, "enable_cpu_offload": False,
                 "disable_cuda_graphs": True, "dtype": "float32", "mixed_precision_param": "bfloat16",
                 "mixed_precision_reduce": "float32", "gc_freq": 50, "gc_debug": False},
    "parallelism": {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": -1,
                    "fsdp_reshard_after_forward": "default", "enable_fsdp_symm_mem": False,
                    "tensor_parallel_degree": 2, "enable_sequence_parallel": False, "spmd_backend": "spmd_types",
                    "pipeline_parallel_degree": 2, "module_fqns_per_model_part": None,
                    "pipeline_parallel_first_stage_less_layers": 1, "pipeline_parallel_last_stage_less_layers": 1,
                    "pipeline_parallel_layers_per_stage": None, "pipeline_parallel_schedule": "1F1B",
                    "pipeline_parallel_schedule_csv": "", "num_pp_microbatches": 4, "context_parallel_degree": 1,
                    "context_parallel_load_balancer": "headtail", "context_parallel_ptrr_mask_key": None,
                    "expert_parallel_degree": 1},
    "activation_checkpoint": {"preserve_rng_state": True, "determinism_check": "default", "debug": False},
    "compile": {"enable": False, "enable_async_tensor_parallel": False, "components": ["model", "loss"],
                "backend": "inductor"},
    "debug": {"seed": None, "save_config_file": "job.json"},
}


def test_compiled_job_is_imported_with_fused_blocks_and_loss(tmp_path):
    """compile.enable with the default components (model and loss): the blocks' kernels are
    torchtitan's compiled ones (chains fused) and the loss compiled, both listed as assumptions;
    components = ["model"] leaves the loss eager; a backend other than Inductor or a component the
    planner does not know is refused by name."""
    compiled = {**PYTHON_ERA, "compile": {**PYTHON_ERA["compile"], "enable": True}}
    compiled["compile"].pop("components", None)
    training = import_torchtitan(_write(tmp_path, json.dumps(compiled), "job_config.json"),
                                 ClusterOptions(world_size=16), [])["training"]
    assert (training["kernels"], training["compiled_loss"]) == ("torchtitan-compiled", True)
    assert sum("compile" in a for a in training["assumptions"]) == 2
    blocks = {**compiled, "compile": {**compiled["compile"], "components": ["model"]}}
    training = import_torchtitan(_write(tmp_path, json.dumps(blocks), "blocks.json"),
                                 ClusterOptions(world_size=16), [])["training"]
    assert (training["kernels"], training["compiled_loss"]) == ("torchtitan-compiled", False)
    asynchronous = {**blocks, "parallelism": {**blocks["parallelism"], "enable_async_tensor_parallel": True}}
    training = import_torchtitan(_write(tmp_path, json.dumps(asynchronous), "async.json"),
                                 ClusterOptions(world_size=16), [])["training"]
    assert training["tp_async"] and any("async TP" in a for a in training["assumptions"])
    for key, value in (("backend", "aot_eager"), ("components", ["model", "muon"])):
        other = {**compiled, "compile": {**compiled["compile"], key: value}}
        with pytest.raises(InputError) as err:
            import_torchtitan(_write(tmp_path, json.dumps(other), "other.json"), ClusterOptions(world_size=16), [])
        assert err.value.field == f"compile.{key}" and err.value.exit_code == 2


def test_python_era_dump_is_read_with_its_own_keys(tmp_path):
    path = _write(tmp_path, json.dumps(PYTHON_ERA), "job_config.json")
    doc = import_torchtitan(path, ClusterOptions(world_size=16), [])
    training = doc["training"]
    # 16384 tokens of 8192-token sequences: micro-batches of 2; 4 per step on each of 4 DP ranks
    assert (training["micro_batch_size"], training["global_batch"], training["sequence_length"]) == (2, 32, 8192)
    assert training["sequence_parallel"] is False  # enable_sequence_parallel (since March 2026) is honoured
    assert training["recomputation"] == "full"  # FullAC's config carries only the base fields
    assert doc["plan"]["layout"]["layers_per_stage"] == [17, 17]
    assert any("float8" in a for a in training["assumptions"])  # the dump cannot show quantized linears
    instance = build_instance(doc)
    from chameleon_opt.perf.model import PerfModel

    assert set(training["assumptions"]) <= set(PerfModel(instance).evaluate(instance.plan).assumptions)


def test_python_era_memory_budget_policy_is_refused(tmp_path):
    config = dict(PYTHON_ERA, activation_checkpoint={"memory_budget": 0.5, "visualize_memory_budget_pareto": False,
                                                     "preserve_rng_state": True})
    with pytest.raises(InputError) as err:
        import_torchtitan(_write(tmp_path, json.dumps(config), "j.json"), ClusterOptions(world_size=16), [])
    assert err.value.field == "activation_checkpoint.memory_budget"


def test_qwen3_head_dim_is_counted(tmp_path):
    """Qwen3-32B (its HF config.json dimensions): hidden 5120 but 64 heads of 128, so Q and the output
    projection are 8192 wide: 32.76B parameters (30.5B if head_dim were ignored)."""
    assets = tmp_path / "Qwen3-32B"
    assets.mkdir()
    (assets / "config.json").write_text(json.dumps({
        "model_type": "qwen3", "hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": 64,
        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
        "max_position_embeddings": 40960, "tie_word_embeddings": False}))
    text = ('[model]\nname = "qwen3"\nflavor = "32B"\nhf_assets_path = "Qwen3-32B"\n[training]\nlocal_batch_size = 2\n'
            'seq_len = 4096\n[parallelism]\ndata_parallel_shard_degree = -1\n[activation_checkpoint]\nmode = "full"\n')
    instance = build_instance(import_torchtitan(_write(tmp_path, text), ClusterOptions(world_size=64), []))
    assert instance.workload.unique_params == pytest.approx(32.76e9, rel=2e-3)


def test_unchanged_job_exports_its_own_layout_and_reimports_identically(tmp_path):
    job = _write(tmp_path, LLAMA70_PP4 + "[metrics]\nlog_freq = 10\n")
    runner = CliRunner()
    assert runner.invoke(app, ["import", "torchtitan", str(job), "--world-size", "64", "-o",
                               str(tmp_path / "job.json")]).exit_code == 0
    result = runner.invoke(app, ["export-plan", str(tmp_path / "job.json"), "--format", "torchtitan", "-o",
                                 str(tmp_path / "back.toml")])
    assert result.exit_code == 0, result.output
    back = tomllib.loads((tmp_path / "back.toml").read_text())
    parts = back["parallelism"]["module_fqns_per_model_part"]
    # torchtitan's own default for this job: stage 0 embedding + layers 0-19, stage 1 layers 20-40, ...
    assert parts[0] == ["tok_embeddings"] + [f"layers.{i}" for i in range(20)]
    assert parts[1] == [f"layers.{i}" for i in range(20, 41)]
    assert parts[3] == [f"layers.{i}" for i in range(61, 80)] + ["norm", "output"]
    assert back["parallelism"]["pipeline_parallel_schedule"] == "1F1B"  # kept
    assert back["metrics"] == {"log_freq": 10} and back["activation_checkpoint"] == {"mode": "full"}  # complete
    assert (back["training"]["local_batch_size"], back["training"]["global_batch_size"]) == (8, 16)
    again = import_torchtitan(tmp_path / "back.toml", ClusterOptions(world_size=64), [])
    original = import_torchtitan(job, ClusterOptions(world_size=64), [])
    for key in ("plan", "training"):
        assert again[key] == original[key]


def test_python_era_export_keeps_its_keys(tmp_path):
    doc = import_torchtitan(_write(tmp_path, json.dumps(PYTHON_ERA), "job.json"), ClusterOptions(world_size=16), [])
    instance = build_instance(doc)
    out = export_plan(instance, LoweredPlan(instance, instance.plan, None, [], frozenset()), "torchtitan", "initial")
    config = out["config"]
    assert config["parallelism"]["num_pp_microbatches"] == 4 and "pipeline_parallel_microbatch_size" not in \
        config["parallelism"]
    assert config["training"]["num_tokens_per_microbatch_per_dp_rank"] == 16384
    assert config["parallelism"]["data_parallel_shard_degree"] == 4
    again = import_torchtitan(_write(tmp_path, json.dumps(config), "again.json"), ClusterOptions(world_size=16), [])
    assert again["plan"] == doc["plan"] and again["training"] == doc["training"]


def test_python_era_recipe_dump_as_torchtitan_writes_it(tmp_path):
    """The llama3 debug recipe's shape as torchtitan dumps it in mid-2026 (configs.py fields of
    then, config_registry.py overrides): pipelining off but Interleaved1F1B named, the recipes'
    ChunkedLossWrapper (`loss.num_chunks` 8), `full_dtensor` (May to August 2026) and the
    HybridEP key present, CUDA graphs on. It imports; the loss buffers are one chunk's; an export
    that pipelines it names a one-stage schedule and turns CUDA graphs off, as torchtitan requires."""
    from chameleon_opt.interop.export import TorchtitanParallelism, TorchtitanTraining, torchtitan_config
    from chameleon_opt.perf.model import PerfModel

    parallelism = {**PYTHON_ERA["parallelism"], "tensor_parallel_degree": 1, "pipeline_parallel_degree": 1,
                   "pipeline_parallel_schedule": "Interleaved1F1B", "num_pp_microbatches": 1,
                   "full_dtensor": False, "hybridep_non_blocking_expert_capacity_factor": None}
    training = {**PYTHON_ERA["training"], "disable_cuda_graphs": False}
    dump = {**PYTHON_ERA, "parallelism": parallelism, "training": training,
            "loss": {"num_chunks": 8, "loss_fn": {"global_vocab_size": 128256}}}
    doc = import_torchtitan(_write(tmp_path, json.dumps(dump), "job_config.json"), ClusterOptions(world_size=8), [])
    assert doc["training"]["loss_chunks"] == 8 and "layers_per_stage" not in doc["plan"]["layout"]
    assert any("CUDA graphs" in a for a in doc["training"]["assumptions"])
    chunked = PerfModel(build_instance(doc))
    whole = PerfModel(build_instance({**doc, "training": {**doc["training"], "loss_chunks": 1}}))
    # 14 B per token and vocabulary entry for the whole micro-batch, one eighth with 8 chunks
    assert whole.head_logit_bytes(1) == pytest.approx(14 * 16384 * 128256)
    assert chunked.head_logit_bytes(1) == pytest.approx(whole.head_logit_bytes(1) / 8)
    # at TP 2 loss parallel's 18 B per local entry (activations.LOSS_PARALLEL_LOGIT_BYTES), chunked alike
    assert whole.head_logit_bytes(2) == pytest.approx(18 * 16384 * 128256 / 2)
    assert chunked.head_logit_bytes(2) == pytest.approx(whole.head_logit_bytes(2) / 8)
    pipelined = torchtitan_config(dump, TorchtitanParallelism(
        data_parallel_replicate_degree=1, data_parallel_shard_degree=4, tensor_parallel_degree=1,
        pipeline_parallel_degree=2, pipeline_parallel_microbatch_size=2,
        module_fqns_per_model_part=[["tok_embeddings"], ["lm_head"]]),
        TorchtitanTraining(local_batch_size=8, global_batch_size=32, seq_len=8192), 4)
    assert pipelined["parallelism"]["pipeline_parallel_schedule"] == "1F1B"
    assert pipelined["training"]["disable_cuda_graphs"] is True
    assert pipelined["parallelism"]["num_pp_microbatches"] == 4


def test_toml_debug_config_without_pipelining_ignores_its_schedule(tmp_path):
    """torchtitan v0.2.2's llama3 debug_model.toml names Interleaved1F1B with
    pipeline_parallel_degree = 1: torchtitan builds no schedule, so neither does the import."""
    text = LLAMA70_PP4.replace("pipeline_parallel_degree = 4", "pipeline_parallel_degree = 1").replace(
        '"1F1B"', '"Interleaved1F1B"')
    doc = import_torchtitan(_write(tmp_path, text), ClusterOptions(world_size=64), [])
    assert doc["plan"]["layout"]["pipeline_parallel"] == 1
    with pytest.raises(InputError, match="equal chunks"):
        import_torchtitan(_write(tmp_path, text.replace("pipeline_parallel_degree = 1", "pipeline_parallel_degree = 4"),
                                 "pp4.toml"), ClusterOptions(world_size=64), [])


def test_python_era_mixed_precision_without_sharding(tmp_path):
    """Since June 2026 torchtitan applies FSDP's mixed precision at shard degree 1 too, so TP
    without FSDP computes in bf16; a dump of then carries the model's config under model_spec."""
    parallelism = {**PYTHON_ERA["parallelism"], "data_parallel_shard_degree": 1, "data_parallel_replicate_degree": 4}
    older = {**PYTHON_ERA, "parallelism": parallelism}
    newer = {**older, "model_spec": {**PYTHON_ERA["model_spec"], "model": {"dim": 4096}}}
    assert import_torchtitan(_write(tmp_path, json.dumps(older), "a.json"), ClusterOptions(world_size=16),
                             [])["training"]["precision"] == "fp32"
    assert import_torchtitan(_write(tmp_path, json.dumps(newer), "b.json"), ClusterOptions(world_size=16),
                             [])["training"]["precision"] == "bf16"


def test_interleaved_job_is_not_exported_as_1f1b(tmp_path):
    """The torchtitan export writes one part per rank (1F1B): an interleaved plan is refused by name."""
    job = _write(tmp_path, LLAMA70_PP4.replace('"70B"', '"405B"').replace('"1F1B"', '"Interleaved1F1B"'))
    runner = CliRunner()
    assert runner.invoke(app, ["import", "torchtitan", str(job), "--world-size", "64", "-o",
                               str(tmp_path / "job.json")]).exit_code == 0
    result = runner.invoke(app, ["export-plan", str(tmp_path / "job.json"), "--format", "torchtitan", "-o",
                                 str(tmp_path / "back.toml")])
    assert result.exit_code == 2 and "training.virtual_stages" in result.output
