"""What the torchtitan and Megatron-LM importers share: the workload reference, the cluster a job
config does not describe (world size, node size, device type, network: given as options), module
names per workload layer, and where a global rank sits in a plan."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chameleon_opt.errors import InputError
from chameleon_opt.instance.load import MODELS_DIR, Instance, grid_position, load_workload_file, resolve_workload_path
from chameleon_opt.workload.hf import workload_from_hf
from chameleon_opt.workload.schema import Architecture, WorkloadSpec

TORCHTITAN_ORDER = "tp-dp-pp"
"""torchtitan's device mesh ["pp", "dp_replicate", "dp_shard", "cp", "tp"] with CP 1, innermost first."""
MEGATRON_ORDER = "tp-dp-pp"
"""Megatron-LM's default `tp-cp-ep-dp-pp` with CP = EP = 1 (`--use-tp-pp-dp-mapping`: tp-pp-dp)."""


@dataclass(frozen=True)
class ClusterOptions:
    """What a job config leaves to the launcher: sizes, accelerator, links (assumed defaults)."""

    world_size: int | None = None
    devices_per_node: int = 8
    device_type: str = "H100-80"
    intra_node_gbps: float = 300.0
    inter_node_gbps: float = 25.0


def cluster_document(world: int, options: ClusterOptions) -> dict[str, Any]:
    per_node = min(options.devices_per_node, world)
    if world % per_node:
        raise InputError(None, "--devices-per-node", f"{per_node} does not divide the world size {world}",
                         "give the devices of one node (the launcher's --nproc-per-node)")
    return {"nodes": world // per_node, "devices_per_node": per_node, "device_type": options.device_type,
            "network": {"intra_node_gbps": options.intra_node_gbps, "inter_node_gbps": options.inter_node_gbps}}


def workload_document(model: str, field: str) -> dict[str, Any]:
    """`workload` of an instance: a catalogue name, a workload file, or a Hugging Face config.json
    (a file named config.json, or a folder holding one), which becomes an inline workload."""
    path = Path(model)
    if path.is_dir() or path.name == "config.json":
        return {"inline": workload_from_hf(path)}
    if (MODELS_DIR / f"{model}.json").is_file() or path.is_file():
        return {"model": str(path.resolve()) if path.is_file() else model}
    raise InputError(None, field, f"no catalogue model or file {model!r}",
                     "give a name from models/, a workload file, or a Hugging Face config.json (--model)")


def workload_architecture(workload: dict[str, Any]) -> Architecture | None:
    """The architecture of a workload document (None for a workload without one)."""
    if "inline" in workload:
        spec = WorkloadSpec.model_validate(workload["inline"])
    else:
        found = resolve_workload_path(workload["model"], None)
        spec = load_workload_file(found) if found is not None else None
    return spec.architecture if spec is not None else None


def workload_blocks(workload: dict[str, Any]) -> int | None:
    """Transformer blocks of a workload document (None for a workload without an architecture)."""
    if "inline" in workload:
        return int(workload["inline"]["architecture"]["layers"])
    architecture = workload_architecture(workload)
    return architecture.layers if architecture is not None else None


def failure_document(failed: list[int], world: int) -> dict[str, Any]:
    for rank in failed:
        if not 0 <= rank < world:
            raise InputError(None, "--failed", f"rank {rank} is not in the job", f"use ranks 0..{world - 1}")
    return {"events": [{"time_s": 0.0, "devices": sorted(set(failed))}]} if failed else {}


def parse_ranks(text: str | None) -> list[int]:
    """`3,13` or `8-11,13` into rank numbers."""
    ranks: list[int] = []
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        try:
            low, _, high = part.partition("-")
            ranks.extend(range(int(low), int(high or low) + 1))
        except ValueError:
            raise InputError(None, "--failed", f"cannot read {part!r}", "give ranks like 3,13 or 8-11") from None
    return ranks


def module_names(layer: int, num_layers: int, vocabulary: str, head: str = "output") -> list[str]:
    """Module names of workload layer `layer` (0 embedding, 1..L blocks, L+1 final norm + head) in
    a trainer's vocabulary: torchtitan's `module_fqns_per_model_part` (its output projection is
    `head`: `output`, or `lm_head` since April 2026), Megatron-LM's GPTModel, or Hugging Face's
    causal-LM modules."""
    last = num_layers - 1
    if vocabulary == "torchtitan":
        return ["tok_embeddings"] if layer == 0 else ["norm", head] if layer == last else [f"layers.{layer - 1}"]
    if vocabulary == "megatron":
        return ["embedding"] if layer == 0 else ["decoder.final_layernorm", "output_layer"] if layer == last \
            else [f"decoder.layers.{layer - 1}"]
    if vocabulary == "hf":
        return ["model.embed_tokens"] if layer == 0 else ["model.norm", "lm_head"] if layer == last \
            else [f"model.layers.{layer - 1}"]
    raise ValueError(f"unknown vocabulary {vocabulary!r}")


@dataclass(frozen=True)
class RankPlace:
    """Where a global rank sits in a regular layout."""

    rank: int
    pipeline: int
    stage: int
    tp_rank: int
    tp_group: tuple[int, ...]
    layers: tuple[int, int]


def locate_rank(instance: Instance, rank: int) -> RankPlace:
    """Pipeline (DP index), stage (PP index), TP rank and TP group of a global rank, by the
    instance's plan (its device ids are global ranks in `layout.order`)."""
    layout = instance.spec.plan.layout
    for j, pipe in enumerate(instance.plan.pipelines):
        for s, stage in enumerate(pipe.stages):
            if rank in stage.devices:
                if layout is not None:  # the grid position and the expanded plan must agree
                    sizes = {"tp": instance.plan.tensor_parallel, "pp": layout.pipeline_parallel,
                             "dp": layout.data_parallel}
                    assert grid_position(layout.order, sizes, rank) == {"tp": stage.devices.index(rank), "pp": s,
                                                                        "dp": j}
                return RankPlace(rank, j, s, stage.devices.index(rank), stage.devices, (stage.first, stage.end))
    raise InputError(instance.path, "rank", f"rank {rank} runs no stage of the plan",
                     f"give a rank of the plan ({len(instance.plan.devices)} ranks)")
