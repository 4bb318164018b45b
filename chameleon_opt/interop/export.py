"""The chosen plan in the form a trainer runs, one JSON Schema per format (`export-plan --schema`).

- Every format lists every rank of the new job: its new global rank, the device (the old global
  rank) that takes it, its pipeline, stage, TP rank, layer range, module names in the trainer's
  vocabulary and the micro-batches of its pipeline. Survivors restart with these ranks.
- A *uniform* plan (every pipeline the same stages, layer split and micro-batch count) is also
  given as a complete config of the trainer: the imported torchtitan job config (its era's keys,
  its schedule and everything else kept) with degrees, explicit stages and batch sizes replaced,
  or the imported Megatron-LM arguments with the parallelism, split and batch arguments replaced
  (a split Megatron cannot say with --decoder-first/last-pipeline-num-layers, such as a last
  stage holding only the head, becomes --pipeline-model-parallel-layout); new ranks then follow
  that trainer's order (tp-dp-pp).
- An uneven plan cannot be written as degrees: the per-rank module lists (torchtitan's
  `module_fqns_per_model_part` vocabulary) and micro-batch counts are the plan, numbered
  pipeline by pipeline (tp-pp-dp).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt

from chameleon_opt.errors import InputError
from chameleon_opt.instance.load import Instance, rank_of
from chameleon_opt.interop.common import TORCHTITAN_ORDER, module_names
from chameleon_opt.plan import Plan

FORMATS = ("torchtitan", "megatron", "ranks")
VOCABULARY = {"torchtitan": "torchtitan", "megatron": "megatron", "ranks": "torchtitan"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RankWork(_Strict):
    """What one rank of the new job runs."""

    rank: NonNegativeInt = Field(description="global rank in the new job")
    device: NonNegativeInt = Field(description="the device taking it: its global rank in the old job")
    pipeline: NonNegativeInt = Field(description="data-parallel replica")
    stage: NonNegativeInt
    num_stages: PositiveInt = Field(description="stages of this rank's pipeline")
    tp_rank: NonNegativeInt
    tp_group: list[NonNegativeInt] = Field(min_length=1, description="new global ranks of the stage's TP group")
    layers: tuple[NonNegativeInt, NonNegativeInt] = Field(description="workload layers [first, end)")
    modules: list[str] = Field(min_length=1, description="module FQNs of this stage, in the trainer's vocabulary")
    micro_batches: PositiveInt = Field(description="micro-batches per step of this rank's pipeline")
    micro_batch_size: PositiveInt


class TorchtitanParallelism(_Strict):
    """torchtitan's `[parallelism]` keys for a uniform plan."""

    data_parallel_replicate_degree: PositiveInt
    data_parallel_shard_degree: PositiveInt
    tensor_parallel_degree: PositiveInt
    pipeline_parallel_degree: PositiveInt
    pipeline_parallel_microbatch_size: PositiveInt
    module_fqns_per_model_part: list[list[str]] | None = None


class TorchtitanTraining(_Strict):
    """torchtitan's `[training]` batch keys for a uniform plan."""

    local_batch_size: PositiveInt
    global_batch_size: PositiveInt
    seq_len: PositiveInt | None = None


class _Export(_Strict):
    uniform: bool = Field(description="true when the plan is the trainer's parallelism settings")
    world_size: PositiveInt = Field(description="ranks of the new job")
    rank_order: Literal["tp-dp-pp", "tp-pp-dp"] = Field(
        description="how new ranks walk (tp, stage, pipeline), innermost first")
    failed: list[NonNegativeInt] = Field(description="old global ranks that failed")
    policy: str = Field(description="how the plan was chosen (initial, reconfigure, reroute, hybrid)")
    ranks: list[RankWork]


class TorchtitanExport(_Export):
    format: Literal["torchtitan"] = "torchtitan"
    parallelism: TorchtitanParallelism | None = Field(None, description="given when uniform")
    training: TorchtitanTraining | None = Field(None, description="given when uniform")
    config: dict[str, Any] | None = Field(
        None, description="the complete job config, given when uniform: the imported one (same era and keys) with "
        "its parallelism and batch settings replaced, or a TOML-era config of these settings alone")


class MegatronExport(_Export):
    format: Literal["megatron"] = "megatron"
    arguments: list[str] | None = Field(
        None, description="Megatron-LM arguments, given when uniform: the imported script's arguments with the "
        "parallelism, split and batch arguments replaced (or these arguments alone)")
    launcher: list[str] | None = Field(None, description="torchrun's arguments for the new world size, given when "
                                       "uniform")


class RanksExport(_Export):
    format: Literal["ranks"] = "ranks"
    plan: dict[str, Any] = Field(description="the plan as `plan --json` prints it (device ids = old ranks)")


MODELS: dict[str, type[_Export]] = {"torchtitan": TorchtitanExport, "megatron": MegatronExport, "ranks": RanksExport}


def export_schema(fmt: str) -> dict[str, Any]:
    return MODELS[fmt].model_json_schema()


def is_uniform(plan: Plan) -> bool:
    first = plan.pipelines[0]
    split = [(s.first, s.end) for s in first.stages]
    return not plan.rerouted and all(
        [(s.first, s.end) for s in p.stages] == split and p.micro_batches == first.micro_batches for p in plan.pipelines)


def new_ranks(plan: Plan, uniform: bool) -> dict[tuple[int, int, int], int]:
    """(pipeline, stage, tp rank) -> new global rank: the trainer's tp-dp-pp order when uniform,
    else pipeline by pipeline (tp-pp-dp)."""
    tp, out = plan.tensor_parallel, {}
    sizes = {"tp": tp, "pp": len(plan.pipelines[0].stages), "dp": len(plan.pipelines)}
    rank = 0
    for j, pipe in enumerate(plan.pipelines):
        for s, stage in enumerate(pipe.stages):
            for t in range(len(stage.devices)):
                out[(j, s, t)] = rank_of(TORCHTITAN_ORDER, sizes, {"tp": t, "pp": s, "dp": j}) if uniform else rank
                rank += 1
    return out


def torchtitan_head_name(config: dict[str, Any] | None, era: str) -> str:
    """The output projection's module name in the imported job's torchtitan: `output` until
    torchtitan renamed it `lm_head` (April 2026, with ChunkedCELoss), as the job's own
    module_fqns_per_model_part says, or its era (a Python-config dump carrying the model's
    config is from July 2026 or later)."""
    parts = ((config or {}).get("parallelism") or {}).get("module_fqns_per_model_part") or []
    names = {m for part in parts for m in part}
    if "lm_head" in names or "output" in names:
        return "lm_head" if "lm_head" in names else "output"
    return "lm_head" if era == "python" and "model" in ((config or {}).get("model_spec") or {}) else "output"


def torchtitan_config(original: dict[str, Any] | None, parallelism: TorchtitanParallelism,
                      training: TorchtitanTraining, micro_batches: int) -> dict[str, Any]:
    """The complete job config: the imported one with the plan's degrees, explicit stages and
    batch settings in the keys that config uses (the schedule and everything else kept), or a
    TOML-era config of the plan's settings alone."""
    import copy

    config = copy.deepcopy(original) if original is not None else {}
    par = config.setdefault("parallelism", {})
    train = config.setdefault("training", {})
    values = parallelism.model_dump()
    pp = values["pipeline_parallel_degree"]
    new_batch_keys = "num_tokens_per_microbatch_per_dp_rank" in train or "max_context_length" in train
    if "num_pp_microbatches" in par or new_batch_keys:
        values.pop("pipeline_parallel_microbatch_size")
        values["num_pp_microbatches"] = micro_batches if pp > 1 else 1
    for key, value in values.items():
        if value is not None or key in par:
            par[key] = value
    par.pop("pipeline_parallel_layers_per_stage", None)  # the explicit module lists say it all
    if pp == 1:
        par.pop("module_fqns_per_model_part", None)
    if new_batch_keys:
        context = train.get("max_context_length") or training.seq_len
        mbs = training.local_batch_size // (micro_batches if pp > 1 else 1)
        train["num_tokens_per_microbatch_per_dp_rank"] = mbs * context
        train["num_tokens_per_train_step"] = training.global_batch_size * context
        train["max_context_length"] = context
    else:
        train["local_batch_size"] = training.local_batch_size
        train["global_batch_size"] = training.global_batch_size
        if training.seq_len is not None:
            train["seq_len"] = training.seq_len
    return config


def megatron_split(blocks: list[int]) -> dict[str, str]:
    """Megatron-LM's arguments for blocks per stage (embedding on the first, loss on the last):
    none when even; --decoder-first/last-pipeline-num-layers when only the first and last stages
    differ and hold at least one block (Megatron rejects 0 there); otherwise the explicit
    --pipeline-model-parallel-layout ("E" embedding, "t*n" n blocks, "L" loss, "|" between stages).
    Megatron-LM unrolls "x*n" itself (PipelineParallelLayerLayout.parse_str_to_list)."""
    pp = len(blocks)
    if pp == 1 or len(set(blocks)) == 1:
        return {}
    middle = blocks[1:-1]
    if len(set(middle)) <= 1 and blocks[0] > 0 and blocks[-1] > 0:
        even = middle[0] if middle else None
        out = {}
        if blocks[0] != even:
            out["--decoder-first-pipeline-num-layers"] = str(blocks[0])
        if blocks[-1] != even:
            out["--decoder-last-pipeline-num-layers"] = str(blocks[-1])
        return out
    stages = [f"t*{n}" if n > 1 else "t" * n for n in blocks]
    stages[0], stages[-1] = "E" + stages[0], stages[-1] + "L"
    return {"--pipeline-model-parallel-layout": "|".join(stages)}


_SPLIT_FLAGS = ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
                "--pipeline-model-parallel-layout", "--account-for-embedding-in-pipeline-split",
                "--account-for-loss-in-pipeline-split")


def megatron_arguments(original: list[str] | None, settings: dict[str, str]) -> list[str]:
    """The imported arguments with `settings` replacing their flags (and any old split flag
    dropped), or `settings` alone."""
    out: list[str] = []
    items = list(original or [])
    i = 0
    while i < len(items):
        flag = items[i].split("=", 1)[0].replace("_", "-")
        takes_value = "=" not in items[i] and i + 1 < len(items) and not items[i + 1].startswith("--")
        if flag in settings or flag in _SPLIT_FLAGS:
            i += 2 if takes_value and flag not in _SPLIT_FLAGS[3:] else 1
            continue
        out.append(items[i])
        i += 1
    for flag, value in settings.items():
        out += [flag, value]
    return out


def megatron_launcher(original: list[str] | None, nodes: int, per_node: int) -> list[str]:
    """torchrun's arguments for the new job: --nnodes and --nproc-per-node set, the rest kept."""
    return megatron_arguments(original, {"--nnodes": str(nodes), "--nproc-per-node": str(per_node)}) \
        if original else ["--nnodes", str(nodes), "--nproc-per-node", str(per_node)]


def export_plan(instance: Instance, plan: Plan, failed: frozenset[int], fmt: str, policy: str) -> dict[str, Any]:
    """The document of format `fmt` (validated by its own schema before it is returned)."""
    if plan.rerouted and fmt != "ranks":
        raise InputError(instance.path, "--policy", f"the chosen plan reroutes work, which {fmt} cannot run",
                         "use --policy reconfigure, or --format ranks for the chameleon runtime")
    uniform = is_uniform(plan)
    ranks = new_ranks(plan, uniform)
    mbs, num_layers = instance.micro_batch_size, instance.workload.num_layers
    vocabulary = VOCABULARY[fmt]
    work = []
    for j, pipe in enumerate(plan.pipelines):
        for s, stage in enumerate(pipe.stages):
            group = [ranks[(j, s, t)] for t in range(len(stage.devices))]
            modules = [m for layer in range(stage.first, stage.end) for m in module_names(layer, num_layers, vocabulary)]
            for t, device in enumerate(stage.devices):
                work.append(RankWork(rank=ranks[(j, s, t)], device=device, pipeline=j, stage=s,
                                     num_stages=len(pipe.stages), tp_rank=t, tp_group=group,
                                     layers=(stage.first, stage.end), modules=modules,
                                     micro_batches=pipe.micro_batches, micro_batch_size=mbs))
    work.sort(key=lambda w: w.rank)
    common: dict[str, Any] = {"uniform": uniform, "world_size": len(work), "failed": sorted(failed),
                              "rank_order": TORCHTITAN_ORDER if uniform else "tp-pp-dp", "policy": policy,
                              "ranks": work}
    tp, pp, dp = plan.tensor_parallel, len(plan.pipelines[0].stages), len(plan.pipelines)
    seq = instance.spec.training.sequence_length or instance.workload.sequence_length
    source = instance.spec.trainer
    if fmt == "torchtitan":
        doc: _Export = TorchtitanExport(**common)
        if uniform:
            fsdp = instance.spec.training.zero >= 1
            original = source.config if source is not None and source.name == "torchtitan" else None
            head = torchtitan_head_name(original, source.era if source is not None else "toml")
            parts = [[m for layer in range(s.first, s.end)
                      for m in module_names(layer, num_layers, "torchtitan", head)]
                     for s in plan.pipelines[0].stages] if pp > 1 else None
            micro_batches = plan.pipelines[0].micro_batches
            local = micro_batches * mbs if pp > 1 else mbs
            parallelism = TorchtitanParallelism(
                data_parallel_replicate_degree=1 if fsdp else dp, data_parallel_shard_degree=dp if fsdp else 1,
                tensor_parallel_degree=tp, pipeline_parallel_degree=pp, pipeline_parallel_microbatch_size=mbs,
                module_fqns_per_model_part=parts)
            training = TorchtitanTraining(local_batch_size=local, global_batch_size=micro_batches * mbs * dp,
                                          seq_len=seq)
            doc = TorchtitanExport(**common, parallelism=parallelism, training=training,
                                   config=torchtitan_config(original, parallelism, training, micro_batches))
    elif fmt == "megatron":
        args, launcher = None, None
        if uniform:
            stages = plan.pipelines[0].stages
            blocks = [s.end - s.first - (s.first == 0) - (s.end == num_layers) for s in stages]
            settings = {"--tensor-model-parallel-size": str(tp), "--pipeline-model-parallel-size": str(pp),
                        "--micro-batch-size": str(mbs),
                        "--global-batch-size": str(plan.pipelines[0].micro_batches * mbs * dp),
                        **megatron_split(blocks)}
            original = source if source is not None and source.name == "megatron" else None
            args = megatron_arguments(original.arguments if original else None, settings)
            per_node = min(instance.spec.cluster.devices_per_node, len(work))
            launcher = megatron_launcher(original.launcher if original else None, len(work) // per_node, per_node)
        doc = MegatronExport(**common, arguments=args, launcher=launcher)
    elif fmt == "ranks":
        doc = RanksExport(**common, plan=plan.to_json())
    else:
        raise InputError(None, "--format", f"unknown format {fmt!r}", f"use one of {', '.join(FORMATS)}")
    return doc.model_dump(mode="json")
