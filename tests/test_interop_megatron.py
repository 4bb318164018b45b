"""Megatron-LM imports that are faithful or refuse, launch scripts, and exports Megatron accepts.

Arguments and scripts here are written for these tests with Megatron-LM's own flags
(megatron/training/arguments.py, megatron/core/transformer/transformer_config.py) and the
structure of its example launch scripts (examples/gpt3/train_gpt3_175b_distributed.sh,
examples/llama/train_llama3_8b_h100_fp8.sh: variables, arrays, if-blocks, torchrun line).
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from chameleon_opt.cli import app
from chameleon_opt.comm.lowering import LoweredPlan
from chameleon_opt.errors import InputError
from chameleon_opt.instance.load import build_instance
from chameleon_opt.interop.common import ClusterOptions, locate_rank
from chameleon_opt.interop.export import export_plan, megatron_split
from chameleon_opt.interop.megatron import import_megatron

GPT = ["--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads", "32", "--vocab-size", "50257",
       "--seq-length", "2048", "--micro-batch-size", "1", "--global-batch-size", "64", "--bf16",
       "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "4", "--lr", "1e-4"]

SCRIPT = """#!/bin/bash
export CUDA_DEVICE_MAX_CONNECTIONS=1
GPUS_PER_NODE=8
NUM_NODES=2
WORLD_SIZE=$(($GPUS_PER_NODE*$NUM_NODES))
CHECKPOINT_PATH=$1 #<Specify path>
TP_SIZE=${TP_SIZE:-2}
DTYPE="bf16"

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
    --master_addr localhost
)
MODEL_ARGS=(
    --num-layers 32
    --hidden-size 4096
    --ffn-hidden-size 14336
    --num-attention-heads 32
    --group-query-attention
    --num-query-groups 8
    --kv-channels 128
    --seq-length 8192
    --max-position-embeddings 8192
    --position-embedding-type rope
    --swiglu
    --untie-embeddings-and-output-weights
    --attention-backend fused # flash/fused/unfused/local
)
TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 128
    --lr 0.00015
)
if [[ "$DTYPE" == "fp8" ]]; then
    TRAINING_ARGS+=(--fp8-format hybrid)
elif [[ "$DTYPE" == "bf16" ]]; then
    TRAINING_ARGS+=(--bf16)
fi
DDP_ARGS=(
    --use-distributed-optimizer
    --overlap-grad-reduce
)
TRAINING_ARGS+=("${DDP_ARGS[@]}")
MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size $TP_SIZE
    --pipeline-model-parallel-size 2
    --sequence-parallel
)
torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \\
    ${MODEL_ARGS[@]} \\
    ${TRAINING_ARGS[@]} \\
    ${MODEL_PARALLEL_ARGS[@]} \\
    --vocab-size 128256 \\
    --save $CHECKPOINT_PATH
"""


def _layers(doc: dict) -> list[int]:
    return doc["plan"]["layout"]["layers_per_stage"]


def test_split_rules_are_megatrons_own():
    """get_num_layers_to_build (megatron/core/transformer/transformer_block.py): 32 blocks over 4 is 8
    each; first 5 / last 6 given: the 21 left over 2 middle stages do not divide (Megatron asserts),
    first 6 / last 10: 16 over 2 = 8; --account-for-embedding/loss: 34 over 4 = 8.5 (refused), over
    2 = 17, the first stage then builds 16 blocks and the last 16. Workload layers add the embedding
    to the first stage and the head to the last."""
    world = ClusterOptions(world_size=16)
    assert _layers(import_megatron(GPT, world, [])) == [9, 8, 8, 9]
    assert _layers(import_megatron(GPT + ["--decoder-first-pipeline-num-layers", "6",
                                          "--decoder-last-pipeline-num-layers", "10"], world, [])) == [7, 8, 8, 11]
    with pytest.raises(InputError, match="divide evenly"):
        import_megatron(GPT + ["--decoder-first-pipeline-num-layers", "5",
                               "--decoder-last-pipeline-num-layers", "6"], world, [])
    two = [w if w != "4" else "2" for w in GPT]
    assert _layers(import_megatron(two + ["--account-for-embedding-in-pipeline-split",
                                          "--account-for-loss-in-pipeline-split"], ClusterOptions(world_size=8),
                                   [])) == [17, 17]
    assert _layers(import_megatron(GPT + ["--pipeline-model-parallel-layout", "Et*9|t*8|t*8|t*7L"], world,
                                   [])) == [10, 8, 8, 8]
    with pytest.raises(InputError) as err:  # head-only last stage is what the layout can say, 0 cannot
        import_megatron(GPT + ["--decoder-last-pipeline-num-layers", "0"], world, [])
    assert err.value.field == "--decoder-last-pipeline-num-layers"


@pytest.mark.parametrize("extra, flag", [
    (["--num-layers-per-virtual-pipeline-stage", "2"], "--num-layers-per-virtual-pipeline-stage"),
    (["--num-virtual-stages-per-pipeline-rank", "4"], "--num-virtual-stages-per-pipeline-rank"),
    (["--pipeline-model-parallel-layout", "Et*4|t*4|t*4|t*4|t*4|t*4|t*4|t*4L"], "--pipeline-model-parallel-layout"),
    (["--num-experts", "8"], "--num-experts"),
    (["--moe-router-topk", "2"], "--moe-router-topk"),
    (["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"], "--fp8-recipe"),
    (["--fp8-format", "hybrid", "--fp8-param-gather"], "--fp8-param-gather"),
    (["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "2"],
     "--recompute-num-layers"),
    (["--recompute-granularity", "selective", "--recompute-modules", "core_attn", "mlp"], "--recompute-modules"),
    (["--context-parallel-size", "2"], "--context-parallel-size"),
    (["--tensor-model-paralel-size", "2"], "--tensor-model-paralel-size"),
    (["--optimizer", "sgd"], "--optimizer"),
])
def test_what_the_planner_cannot_model_is_refused(extra, flag):
    with pytest.raises(InputError) as err:
        import_megatron(GPT + extra, ClusterOptions(world_size=16), [])
    assert err.value.field == flag


def test_recomputation_and_precision_as_megatron_runs_them():
    world = ClusterOptions(world_size=16)
    full = import_megatron(GPT + ["--recompute-granularity", "full", "--recompute-method", "uniform",
                                  "--recompute-num-layers", "1"], world, [])["training"]
    assert full["recomputation"] == "full"
    block = import_megatron(GPT + ["--recompute-granularity", "full", "--recompute-method", "block",
                                   "--recompute-num-layers", "8"], world, [])["training"]
    assert block["recomputation"] == "full"  # 8 >= the 8 blocks of every stage
    assert import_megatron(GPT + ["--recompute-activations"], world, [])["training"]["recomputation"] == "selective"
    # bf16: gradients accumulated and reduced in fp32 unless --grad-reduce-in-bf16 (arguments.py)
    assert full["grad_bytes_per_param"] == 4
    assert import_megatron(GPT + ["--grad-reduce-in-bf16"], world, [])["training"]["grad_bytes_per_param"] == 2
    tp1 = [w if w != "2" else "1" for w in GPT] + ["--sequence-parallel"]
    assert import_megatron(tp1, ClusterOptions(world_size=8), [])["training"]["sequence_parallel"] is False


def test_launch_script_is_expanded_like_bash(tmp_path):
    script = tmp_path / "train_llama3_8b.sh"
    script.write_text(SCRIPT)
    doc = import_megatron([str(script)], ClusterOptions(), [])
    arch = doc["workload"]["inline"]["architecture"]
    assert (arch["layers"], arch["kv_heads"], arch["ffn"], arch["vocab"]) == (32, 8, 14336, 128256)
    assert "head_dim" not in arch  # --kv-channels 128 = 4096 / 32
    training = doc["training"]
    assert (training["precision"], training["distributed_optimizer"], training["overlap_grad_reduce"],
            training["sequence_parallel"], training["global_batch"]) == ("bf16", True, True, True, 128)
    assert doc["cluster"]["nodes"] == 2 and doc["plan"]["tensor_parallel"] == 2  # $((8*2)) ranks, ${TP_SIZE:-2}
    assert _layers(doc) == [17, 17]
    assert doc["trainer"]["launcher"][:2] == ["--nproc_per_node", "8"]


def test_launch_script_errors_are_one_line(tmp_path, monkeypatch):
    runner = CliRunner()
    undefined = tmp_path / "undefined.sh"
    undefined.write_text(SCRIPT.replace("--pipeline-model-parallel-size 2", "--pipeline-model-parallel-size $PP"))
    monkeypatch.delenv("PP", raising=False)
    result = runner.invoke(app, ["import", "megatron", str(undefined)])
    assert result.exit_code == 2 and "$PP" in result.output and len(result.output.strip().splitlines()) == 1
    monkeypatch.setenv("PP", "2")  # the environment is read for what the script does not set
    assert runner.invoke(app, ["import", "megatron", str(undefined)]).exit_code == 0
    fp8 = tmp_path / "fp8.sh"
    fp8.write_text(SCRIPT.replace('DTYPE="bf16"', 'DTYPE="fp8"').replace("--fp8-format hybrid",
                                                                        "--fp8-format hybrid --fp8-recipe mxfp8"))
    result = runner.invoke(app, ["import", "megatron", str(fp8)])
    assert result.exit_code == 2 and "--fp8-recipe" in result.output
    no_vocab = tmp_path / "no_vocab.sh"
    no_vocab.write_text(SCRIPT.replace("--vocab-size 128256", "--tokenizer-type HuggingFaceTokenizer"))
    result = runner.invoke(app, ["import", "megatron", str(no_vocab)])
    assert result.exit_code == 2 and "--model" in result.output and len(result.output.strip().splitlines()) == 1


def test_virtual_pipeline_placement_is_not_silently_contiguous():
    """Megatron vp=4 over PP 2 with 16 blocks: rank 1 holds blocks 2-3, 6-7, 10-11, 14-15
    (transformer_block.py's comment); the planner cannot say that, so it refuses."""
    with pytest.raises(InputError, match="round-robin"):
        import_megatron(GPT + ["--num-layers-per-virtual-pipeline-stage", "2"], ClusterOptions(world_size=16), [])


def test_megatron_split_export_never_writes_zero_layers():
    assert megatron_split([8, 8, 8, 8]) == {}
    assert megatron_split([6, 8, 8, 10]) == {"--decoder-first-pipeline-num-layers": "6",
                                            "--decoder-last-pipeline-num-layers": "10"}
    assert megatron_split([11, 11, 10, 0]) == {"--pipeline-model-parallel-layout": "Et*11|t*11|t*10|L"}
    assert megatron_split([7, 9, 8, 8]) == {"--pipeline-model-parallel-layout": "Et*7|t*9|t*8|t*8L"}
    assert megatron_split([1, 2, 3, 1]) == {"--pipeline-model-parallel-layout": "Et|t*2|t*3|tL"}


def test_unchanged_job_exports_its_own_arguments_and_reimports_identically(tmp_path):
    args = GPT + ["--decoder-first-pipeline-num-layers", "6", "--decoder-last-pipeline-num-layers", "10",
                  "--use-distributed-optimizer"]
    doc = import_megatron(args, ClusterOptions(world_size=16), [])
    instance = build_instance(doc)
    out = export_plan(instance, LoweredPlan(instance, instance.plan, None, [], frozenset()), "megatron", "initial")
    assert "--lr" in out["arguments"] and "--use-distributed-optimizer" in out["arguments"]  # complete
    again = import_megatron(out["arguments"], ClusterOptions(world_size=16), [])
    assert again["plan"] == doc["plan"] and again["training"] == doc["training"]
    # a head-only last stage comes back through --pipeline-model-parallel-layout
    from chameleon_opt.plan import Pipeline, Plan, Stage

    stages = (Stage((0, 1), 0, 12), Stage((2, 3), 12, 23), Stage((4, 5), 23, 33), Stage((6, 7), 33, 34))
    plan = Plan(2, (Pipeline(stages, 32),))
    small = build_instance(import_megatron(args, ClusterOptions(world_size=8), []))
    out = export_plan(small, LoweredPlan(small, plan, None, [], frozenset()), "megatron", "reconfigure")
    assert "--decoder-last-pipeline-num-layers" not in out["arguments"]
    back = import_megatron(out["arguments"], ClusterOptions(world_size=8), [])
    assert _layers(back) == [12, 11, 10, 1]
    assert locate_rank(build_instance(back), 7).layers == (33, 34)


def test_distributed_optimizer_instances_are_copies_of_each_shard():
    """--num-distributed-optimizer-instances 2 on 32 ranks at TP 2 x PP 4: DP 4 in 2 instances of 2
    consecutive DP ranks, each sharding the optimizer state over itself: 2 copies of each shard, the
    state divided by 2, not 4. It must divide DP (Megatron-LM asserts it); without the distributed
    optimizer nothing is sharded. Exported back: the flag is kept, and the re-import is the same job."""
    args = GPT + ["--use-distributed-optimizer", "--num-distributed-optimizer-instances", "2"]
    doc = import_megatron(args, ClusterOptions(world_size=32), [])
    training = doc["training"]
    assert (training["distributed_optimizer"], training["shard_replicas"], doc["plan"]["layout"]["data_parallel"]) \
        == (True, 2, 4)
    instance = build_instance(doc)
    from chameleon_opt.perf.model import PerfModel

    model = PerfModel(instance)
    stage = instance.plan.pipelines[0].stages[1]
    b = model.stage_memory_breakdown(stage.devices, stage.first, stage.end, 1, 4, 16, 0.0, 4)
    per_gpu = float(model.workload.params[stage.first:stage.end].sum()) / 2
    assert b.optimizer == pytest.approx(per_gpu * model.optimizer_bytes / 2)
    out = export_plan(instance, LoweredPlan(instance, instance.plan, None, [], frozenset()), "megatron", "initial")
    words = out["arguments"]
    assert words[words.index("--num-distributed-optimizer-instances") + 1] == "2"
    again = import_megatron(words, ClusterOptions(world_size=32), [])
    assert again["plan"] == doc["plan"] and again["training"] == doc["training"]
    with pytest.raises(InputError) as err:
        import_megatron(GPT + ["--use-distributed-optimizer", "--num-distributed-optimizer-instances", "3"],
                        ClusterOptions(world_size=32), [])
    assert err.value.field == "--num-distributed-optimizer-instances"
    plain = import_megatron(GPT + ["--num-distributed-optimizer-instances", "2"], ClusterOptions(world_size=32), [])
    assert "shard_replicas" not in plain["training"]



def test_launch_script_reads_megatrons_own_example_idioms(tmp_path):
    """What examples/llama/train_llama3_8b_h100_fp8.sh does (Megatron-LM, 2026): array elements
    quoted with their value ("--vocab-size 128256"), which the unquoted ${A[@]} splits again, a
    `[ ! -f "$PRETRAIN_SCRIPT_PATH" ]` guard that exits, and "$PRETRAIN_SCRIPT_PATH" as the
    program. Quoted elements are read as bash passes them, so a quoted fp8 setting is read
    rather than lost; a script that trains another model (pretrain_bert.py) is refused."""
    idioms = SCRIPT.replace("    --vocab-size 128256 \\\n", "    ${DATA_ARGS[@]} \\\n").replace(
        "torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py", 'torchrun ${DISTRIBUTED_ARGS[@]} "$PRETRAIN_SCRIPT_PATH"'
    ).replace("MODEL_PARALLEL_ARGS=(", 'PRETRAIN_SCRIPT_PATH="pretrain_gpt.py"\nDATA_ARGS=()\n'
              'DATA_ARGS+=(\n    "--mock-data"\n    "--vocab-size 128256"\n)\n'
              'if [ ! -f "$PRETRAIN_SCRIPT_PATH" ]; then\n    echo "not found"\n    exit 1\nfi\nMODEL_PARALLEL_ARGS=(')
    script = tmp_path / "train.sh"
    script.write_text(idioms)
    doc = import_megatron([str(script)], ClusterOptions(), [])
    assert doc["workload"]["inline"]["architecture"]["vocab"] == 128256 and _layers(doc) == [17, 17]
    assert "--vocab-size" in doc["trainer"]["arguments"]
    script.write_text(idioms.replace("TRAINING_ARGS+=(--fp8-format hybrid)", 'TRAINING_ARGS+=("--fp8-format hybrid")')
                      .replace('DTYPE="bf16"', 'DTYPE="fp8"'))
    doc = import_megatron([str(script)], ClusterOptions(), [])  # the quoted element is split again, not lost
    assert doc["training"]["fp8"] == {"recipe": "delayed", "weight_cast": "per_step"}
    script.write_text(idioms.replace('PRETRAIN_SCRIPT_PATH="pretrain_gpt.py"', 'PRETRAIN_SCRIPT_PATH="pretrain_bert.py"'))
    with pytest.raises(InputError) as err:
        import_megatron([str(script)], ClusterOptions(), [])
    assert err.value.field == "pretrain_bert.py" and err.value.exit_code == 2


def test_fp8_format_imports_as_delayed_scaling_fp8_linears(tmp_path):
    """--fp8-format hybrid (Megatron-LM's default --fp8-recipe delayed) is training.fp8 with the weights
    cast once per step, named among the assumptions; the estimate prices it (faster than the bf16 job)."""
    from chameleon_opt.instance.load import build_instance
    from chameleon_opt.perf.model import PerfModel
    script = tmp_path / "fp8.sh"
    script.write_text(SCRIPT.replace('DTYPE="bf16"', 'DTYPE="fp8"'))
    doc = import_megatron([str(script)], ClusterOptions(device_type="H100-80"), [])
    assert doc["training"]["fp8"] == {"recipe": "delayed", "weight_cast": "per_step"}
    assert any("--fp8-format hybrid" in line for line in doc["training"]["assumptions"])
    bf16 = tmp_path / "bf16.sh"
    bf16.write_text(SCRIPT)
    plain = import_megatron([str(bf16)], ClusterOptions(device_type="H100-80"), [])
    assert "fp8" not in plain["training"]
    times = {}
    for name, document in (("fp8", doc), ("bf16", plain)):
        instance = build_instance(document, f"<{name}>")
        times[name] = PerfModel(instance).evaluate(instance.plan).iteration_time_s
    assert times["fp8"] < times["bf16"]
