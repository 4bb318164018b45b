"""torchtitan job configs (TOML) in, torchtitan parallelism settings out.

Read: `[parallelism]` degrees (data_parallel_replicate_degree x data_parallel_shard_degree is the
data-parallel degree, -1 meaning the ranks left over; context and expert parallelism must be 1),
the pipeline split (`module_fqns_per_model_part`, `pipeline_parallel_layers_per_stage`, or
torchtitan's default that counts the embedding and the output as
`pipeline_parallel_first/last_stage_less_layers` layers), `pipeline_parallel_microbatch_size`,
`[training]` batch sizes, sequence length and dtype, `[activation_checkpoint].mode`, and the model
(`[model]` name + flavor as a catalogue name such as llama3-8b, or `hf_assets_path`'s config.json).
The instance numbers devices in torchtitan's mesh order (pp outermost, tp innermost), so a device
id is the rank torchtitan reports.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

from chameleon_opt.errors import InputError
from chameleon_opt.instance.load import MODELS_DIR
from chameleon_opt.interop.common import (TORCHTITAN_ORDER, ClusterOptions, cluster_document, failure_document,
                                          workload_blocks, workload_document)

_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(path, "<file>", "file not found", "check the path") from None
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(path, "<file>", f"cannot be read ({type(err).__name__})", "give a TOML job config") from None
    except tomllib.TOMLDecodeError as err:
        raise InputError(path, "<file>", f"malformed TOML ({err})", "fix the TOML syntax") from None


def _int(table: dict[str, Any], key: str, default: int, path: Path, section: str) -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(path, f"{section}.{key}", f"got {value!r}", "give an integer")
    return value


def _model(config: dict[str, Any], override: str | None, path: Path) -> dict[str, Any]:
    if override:
        return workload_document(override, "--model")
    model = config.get("model", {})
    assets = model.get("hf_assets_path")
    if assets and (path.parent / assets / "config.json").is_file():
        return workload_document(str(path.parent / assets), "model.hf_assets_path")
    if assets and (Path(assets) / "config.json").is_file():
        return workload_document(assets, "model.hf_assets_path")
    name = f"{model.get('name', '')}-{str(model.get('flavor', '')).lower()}"
    if (MODELS_DIR / f"{name}.json").is_file():
        return {"model": name}
    raise InputError(path, "model", f"no catalogue model {name!r} and no config.json under hf_assets_path {assets!r}",
                     "pass --model with a catalogue name or a Hugging Face config.json")


def _layers_of_parts(parts: list[list[str]], path: Path) -> list[int]:
    """Workload layers per stage from module FQNs: embedding and output/norm are layers 0 and L+1."""
    counts = []
    for i, part in enumerate(parts):
        names = set(part)
        unknown = {n for n in names if not (n in ("tok_embeddings", "norm", "output") or n.startswith("layers."))}
        if unknown:
            raise InputError(path, f"parallelism.module_fqns_per_model_part[{i}]", f"unknown modules {sorted(unknown)}",
                             "use tok_embeddings, layers.N, norm and output")
        counts.append(sum(n.startswith("layers.") for n in names) + ("tok_embeddings" in names)
                      + ("output" in names))
    return counts


def _default_split(blocks: int, pp: int, first_less: int, last_less: int) -> list[int]:
    """torchtitan's default: the embedding counts as `first_less` layers and the output as
    `last_less`, the weighted total is spread evenly (the extra on the last stages), and the
    embedding / output stages keep their blocks; returned as workload layers per stage."""
    total = blocks + first_less + last_less
    base, extra = divmod(total, pp)
    weights = [base + (1 if i >= pp - extra else 0) for i in range(pp)]
    weights[0] -= first_less
    weights[-1] -= last_less
    counts = [w + (i == 0) + (i == pp - 1) for i, w in enumerate(weights)]
    return counts


def import_torchtitan(path: Path, options: ClusterOptions, failed: list[int], model: str | None = None,
                      name: str | None = None) -> dict[str, Any]:
    """An instance document for the job a torchtitan TOML describes."""
    config = read_toml(path)
    par, training = config.get("parallelism", {}), config.get("training", {})
    tp = _int(par, "tensor_parallel_degree", 1, path, "parallelism")
    pp = _int(par, "pipeline_parallel_degree", 1, path, "parallelism")
    replicate = _int(par, "data_parallel_replicate_degree", 1, path, "parallelism")
    shard = _int(par, "data_parallel_shard_degree", -1, path, "parallelism")
    for key in ("context_parallel_degree", "expert_parallel_degree"):
        if _int(par, key, 1, path, "parallelism") != 1:
            raise InputError(path, f"parallelism.{key}", "is above 1", "the planner models DP x PP x TP only: set it to 1")
    if shard == -1:
        if options.world_size is None:
            raise InputError(path, "parallelism.data_parallel_shard_degree", "is -1 (the ranks left over)",
                             "pass --world-size (the launcher's nnodes x nproc-per-node)")
        shard = options.world_size // (tp * pp * replicate)
    dp = replicate * shard
    world = tp * pp * dp
    if dp < 1 or (options.world_size is not None and options.world_size != world):
        raise InputError(path, "parallelism", f"degrees give {world} ranks, --world-size is {options.world_size}",
                         "make the degrees multiply to the world size")
    workload = _model(config, model, path)
    local = _int(training, "local_batch_size", _int(training, "batch_size", 8, path, "training"), path, "training")
    global_batch = _int(training, "global_batch_size", -1, path, "training")
    global_batch = local * dp if global_batch == -1 else global_batch
    mbs = _int(par, "pipeline_parallel_microbatch_size", 1, path, "parallelism") if pp > 1 else local
    layout: dict[str, Any] = {"pipeline_parallel": pp, "data_parallel": dp, "order": TORCHTITAN_ORDER}
    parts = par.get("module_fqns_per_model_part")
    if parts:
        if len(parts) != pp:
            raise InputError(path, "parallelism.module_fqns_per_model_part", f"{len(parts)} parts for {pp} ranks",
                             "the planner models one stage per rank: give pipeline_parallel_degree parts")
        layout["layers_per_stage"] = _layers_of_parts(parts, path)
    elif pp > 1:
        per_stage = par.get("pipeline_parallel_layers_per_stage")
        if per_stage is not None:
            raise InputError(path, "parallelism.pipeline_parallel_layers_per_stage", "is given",
                             "give module_fqns_per_model_part instead (the layer count alone needs the model)")
        blocks = workload_blocks(workload)
        if blocks is not None:
            layout["layers_per_stage"] = _default_split(
                blocks, pp, _int(par, "pipeline_parallel_first_stage_less_layers", 1, path, "parallelism"),
                _int(par, "pipeline_parallel_last_stage_less_layers", 1, path, "parallelism"))
    mode = config.get("activation_checkpoint", {}).get("mode", "selective")
    dtype = training.get("mixed_precision_param", training.get("dtype", "bfloat16"))
    train: dict[str, Any] = {"global_batch": global_batch, "micro_batch_size": mbs,
                             "precision": _DTYPES.get(str(dtype), "bf16"),
                             "recomputation": mode if mode in ("none", "selective", "full") else "full",
                             "zero_stage": 3 if shard > 1 else 0}
    if "seq_len" in training:
        train["sequence_length"] = _int(training, "seq_len", 2048, path, "training")
    return {"format": 1, "name": name or path.stem,
            "description": f"imported from torchtitan config {path.name}; device ids are torchtitan global ranks",
            "cluster": cluster_document(world, options), "workload": workload, "training": train,
            "plan": {"tensor_parallel": tp, "layout": layout}, "failures": failure_document(failed, world)}


def settings_toml(parallelism: dict[str, Any], training: dict[str, Any], header: list[str]) -> str:
    """A `[parallelism]` + `[training]` TOML fragment (torchtitan's keys), comments first."""
    lines = [f"# {h}" for h in header]
    for section, table in (("parallelism", parallelism), ("training", training)):
        lines.append(f"\n[{section}]")
        for key, value in table.items():
            if value is not None:
                lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)) and math.isfinite(value):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")
