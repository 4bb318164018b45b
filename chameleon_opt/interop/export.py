"""The chosen plan in the form a trainer runs, one JSON Schema per format (`export-plan --schema`).

- Every format lists every rank of the new job: its new global rank, the device (the old global
  rank) that takes it, its pipeline, stage, TP rank, layer range, module names in the trainer's
  vocabulary and the micro-batches of its pipeline. Survivors restart with these ranks.
- A *uniform* plan (every pipeline the same stages, layer split and micro-batch count) is also
  given as the trainer's own parallelism settings: torchtitan's `[parallelism]` / `[training]`
  keys, Megatron-LM's arguments; new ranks then follow that trainer's order (tp-dp-pp).
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


class MegatronExport(_Export):
    format: Literal["megatron"] = "megatron"
    arguments: list[str] | None = Field(None, description="Megatron-LM parallelism arguments, given when uniform")


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
    seq = instance.spec.training.sequence_length
    if fmt == "torchtitan":
        doc: _Export = TorchtitanExport(**common)
        if uniform:
            fsdp = instance.spec.training.zero == 3
            parts = [[m for layer in range(s.first, s.end) for m in module_names(layer, num_layers, "torchtitan")]
                     for s in plan.pipelines[0].stages] if pp > 1 else None
            local = plan.pipelines[0].micro_batches * mbs
            doc = TorchtitanExport(**common, parallelism=TorchtitanParallelism(
                data_parallel_replicate_degree=1 if fsdp else dp, data_parallel_shard_degree=dp if fsdp else 1,
                tensor_parallel_degree=tp, pipeline_parallel_degree=pp, pipeline_parallel_microbatch_size=mbs,
                module_fqns_per_model_part=parts), training=TorchtitanTraining(
                local_batch_size=local, global_batch_size=local * dp, seq_len=seq))
    elif fmt == "megatron":
        args = None
        if uniform:
            blocks = [s.end - s.first - (s.first == 0) - (s.end == num_layers) for s in plan.pipelines[0].stages]
            args = ["--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp),
                    "--micro-batch-size", str(mbs),
                    "--global-batch-size", str(plan.pipelines[0].micro_batches * mbs * dp)]
            middle = blocks[1:-1]
            if len(set(middle)) > 1:
                raise InputError(instance.path, "--format", f"blocks per stage {blocks} have uneven middle stages",
                                 "Megatron-LM splits its middle stages evenly: use --format ranks")
            even = middle[0] if middle else blocks[0] if blocks[0] == blocks[-1] else None
            if pp > 1 and blocks[0] != even:
                args += ["--decoder-first-pipeline-num-layers", str(blocks[0])]
            if pp > 1 and blocks[-1] != even:
                args += ["--decoder-last-pipeline-num-layers", str(blocks[-1])]
        doc = MegatronExport(**common, arguments=args)
    elif fmt == "ranks":
        doc = RanksExport(**common, plan=plan.to_json())
    else:
        raise InputError(None, "--format", f"unknown format {fmt!r}", f"use one of {', '.join(FORMATS)}")
    return doc.model_dump(mode="json")
