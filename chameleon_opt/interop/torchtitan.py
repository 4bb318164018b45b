"""torchtitan job configs in (faithfully, or refused with exit 2), complete torchtitan configs out.

Two eras are read, told apart by content rather than by file suffix:

- *toml*: `train_configs/*.toml` (torchtitan <= v0.2.2, before the Feb 2026 config refactor) and
  the JSON that era's `--job.save_config_file` wrote (`[job]`, `[model]` name + flavor, ...);
- *python*: a resolved `Trainer.Config` as `--debug.save_config_file` (or `--debug.print_config`)
  dumps it since a job became a Python function chosen with `--module/--config`: `model_spec`
  {name, flavor}, top-level `hf_assets_path`, and the sections whose keys changed during 2026
  (`training.local_batch_size`/`seq_len` then `num_tokens_per_microbatch_per_dp_rank`/
  `max_context_length`; `parallelism.pipeline_parallel_microbatch_size` then
  `num_pp_microbatches`; `activation_checkpoint.mode` then a policy object).

Every key of the sections that decide time, memory or layer placement (`parallelism`,
`training`, `activation_checkpoint`, `compile`) is either modelled, known not to matter, or
refused; an unknown key there is refused too, since the planner cannot tell what it changes.
The rules reproduced here are torchtitan's own (torchtitan/distributed/pipeline_parallel.py:
`_generate_llm_fqn_per_model_part`, `_get_pipeline_metadata`; models/llama3/infra/parallelize.py:
SequenceParallel on every TP plan, `reshard_after_forward = not pp_enabled` by default;
distributed/utils.py `maybe_enable_amp`), and torch.distributed.pipelining's, which keeps FSDP
parameters and gradients unsharded across a step's micro-batches.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chameleon_opt.errors import InputError
from chameleon_opt.instance.load import MODELS_DIR
from chameleon_opt.instance.schema import torchtitan_always_mixed
from chameleon_opt.interop.common import (TORCHTITAN_ORDER, ClusterOptions, cluster_document, failure_document,
                                          workload_architecture, workload_blocks, workload_document)

SINGLE_STAGE_SCHEDULES = ("1F1B", "GPipe")
MULTI_STAGE_SCHEDULES = ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
MOE_MODELS = ("deepseek_v3", "llama4", "gpt_oss", "kimi_k2_7", "qwen3_5")

_DTYPE_BYTES = {"bfloat16": 2, "float32": 4}

# Keys of each section the planner knows. Modelled keys are read below; the others are known not
# to change time, memory or layer placement (data, logging, timeouts, load-balancer choices for
# parallelisms that must be 1 anyway).
_PARALLELISM_KEYS = {
    "data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
    "tensor_parallel_degree", "enable_sequence_parallel", "disable_loss_parallel", "enable_async_tensor_parallel",
    "pipeline_parallel_degree", "module_fqns_per_model_part", "pipeline_parallel_first_stage_less_layers",
    "pipeline_parallel_last_stage_less_layers", "pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule",
    "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatch_size", "num_pp_microbatches",
    "context_parallel_degree", "expert_parallel_degree", "expert_tensor_parallel_degree", "enable_fsdp_symm_mem",
    # harmless: they configure parallelisms that must be 1, or the SPMD bookkeeping
    "context_parallel_load_balancer", "context_parallel_rotate_method", "context_parallel_ptrr_mask_key",
    "expert_parallel_comm_backend", "pipeline_parallel_expert_parallel_overlap", "spmd_backend",
    "enable_compiled_autograd", "hybridep_non_blocking_expert_capacity_factor",
    # another implementation of the same TP/FSDP sharding (May to August 2026; every dump of then has it)
    "full_dtensor"}
_TRAINING_KEYS = {
    "local_batch_size", "global_batch_size", "seq_len", "num_tokens_per_microbatch_per_dp_rank",
    "num_tokens_per_train_step", "max_context_length", "dtype", "mixed_precision_param", "mixed_precision_reduce",
    "enable_cpu_offload",
    # harmless
    "dataset", "dataset_path", "max_norm", "steps", "gc_freq", "gc_debug", "dataloader", "disable_cuda_graphs",
    "deterministic", "seed"}
_COMPILE_KEYS = {"enable", "components", "backend", "enable_async_tensor_parallel"}
_AC_KEYS = {"mode", "selective_ac_option", "per_op_sac_force_recompute_mm_shapes_by_fqns", "early_stop",
            "memory_budget", "visualize_memory_budget_pareto", "preserve_rng_state", "determinism_check", "debug",
            "force_recompute_mm_shapes_by_fqns"}
_AC_BASE_KEYS = {"preserve_rng_state", "determinism_check", "debug", "early_stop"}


@dataclass
class _Reader:
    """Typed access to a job config, every error naming the file and the dotted key."""

    path: Path
    config: dict[str, Any]
    era: str
    assumptions: list[str] = field(default_factory=list)

    def section(self, name: str, known: set[str] | None = None) -> dict[str, Any]:
        table = self.config.get(name)
        if table is None:
            return {}
        if not isinstance(table, dict):
            raise InputError(self.path, name, f"got {table!r:.40}", "give a table of settings")
        if known is not None:
            unknown = sorted(set(table) - known)
            if unknown:
                raise InputError(self.path, f"{name}.{unknown[0]}", "is not a setting the planner knows, so it "
                                 "cannot tell whether it changes time, memory or layer placement",
                                 "remove it to plan the job as if it were unset, or report it to chameleon_opt")
        return table

    def int(self, table: dict[str, Any], section: str, key: str, default: int) -> int:
        value = table.get(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(self.path, f"{section}.{key}", f"got {value!r:.40}", "give an integer")
        return value

    def refuse(self, key: str, problem: str, fix: str) -> InputError:
        return InputError(self.path, key, problem, fix)


def read_job_config(path: Path) -> tuple[dict[str, Any], str]:
    """The job config (TOML or JSON, whichever parses) and its era: `python` when it is a resolved
    `Trainer.Config` dump (it has `model_spec`), else `toml`."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError(path, "file", "file not found", "check the path") from None
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(path, "file", f"cannot be read ({type(err).__name__})", "give a TOML or JSON job config") \
            from None
    config: Any = None
    errors = []
    readers = (json.loads, tomllib.loads) if path.suffix.lower() == ".json" or text.lstrip().startswith("{") \
        else (tomllib.loads, json.loads)
    for read in readers:
        try:
            config = read(text)
            break
        except (tomllib.TOMLDecodeError, json.JSONDecodeError) as err:
            errors.append(str(err))
    if config is None:
        raise InputError(path, "file", f"neither TOML nor JSON ({errors[0]})",
                         "give a train_configs/*.toml, or the JSON that --debug.save_config_file writes")
    if not isinstance(config, dict):
        raise InputError(path, "<root>", "not a table of sections", "give a torchtitan job config")
    return config, "python" if "model_spec" in config else "toml"


def _model(r: _Reader, override: str | None) -> dict[str, Any]:
    """The workload: --model, else the config.json under hf_assets_path, else the catalogue entry
    named `<name>-<flavor>`; mixture-of-experts models are refused."""
    spec = r.config.get("model_spec") if r.era == "python" else r.config.get("model")
    spec = spec if isinstance(spec, dict) else {}
    name, flavor = str(spec.get("name", "")), str(spec.get("flavor", ""))
    where = "model_spec" if r.era == "python" else "model"
    if name in MOE_MODELS or "moe" in flavor.lower() or re.search(r"\d+B-A\d+", flavor):
        raise r.refuse(f"{where}.flavor", f"{name} {flavor} is a mixture-of-experts model, which the planner "
                       "does not model", "plan a dense model (DP x PP x TP)")
    mx = r.config.get("mx")
    if isinstance(mx, dict) and mx.get("enable_mx_linear"):  # before converters existed (torchtitan 2024)
        raise r.refuse("mx.enable_mx_linear", "torchao's MX formats (block-scaled mxfp8 / mxfp4 linears) are not "
                       "modelled", "set it to false to plan the bf16 job")
    if r.era == "python" and (r.config.get("model_converters") or {}).get("converters"):
        raise r.refuse("model_converters.converters", "float8 / MX training is not modelled",
                       "remove the converters to plan the bf16 job")
    if r.era == "python":
        r.assumptions.append("torchtitan: no float8 / MX / NVFP4 linear layers (a resolved config's JSON does not "
                             "show them; the planner models bf16 matmuls)")
    if override:
        return workload_document(override, "--model")
    assets = (r.config.get("hf_assets_path") if r.era == "python" else spec.get("hf_assets_path"))
    for folder in ([r.path.parent / assets, Path(assets)] if assets else []):
        if (folder / "config.json").is_file():
            return workload_document(str(folder), f"{where}.hf_assets_path")
    catalogue = f"{name}-{flavor.lower()}"
    if (MODELS_DIR / f"{catalogue}.json").is_file():
        return {"model": catalogue}
    raise r.refuse(where, f"no catalogue model {catalogue!r} and no config.json under hf_assets_path {assets!r}",
                   "pass --model with a catalogue name or the model's Hugging Face config.json")


_FLOAT8_KEYS = {"enable_float8_linear", "enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp",
                "force_recompute_fp8_weight_in_bwd", "recipe_name", "filter_fqns", "emulate", "scaling_type_input",
                "scaling_type_weight", "scaling_type_grad_output", "moe_fqns_prototype"}
"""The `[float8]` keys of torchtitan's toml era (2024: enable_float8_linear and scaling types; 2025: recipe
names and filters, float8 switched on by model.converters = ["float8"])."""


def _float8_table(r: _Reader) -> tuple[dict[str, Any], str]:
    """The float8 settings and where they are: `[quantize.linear.float8]` (torchtitan v0.2.x) or `[float8]`."""
    quantize = r.config.get("quantize")
    linear = quantize.get("linear") if isinstance(quantize, dict) else None
    if isinstance(linear, dict) and isinstance(linear.get("float8"), dict):
        table, where = linear["float8"], "quantize.linear.float8"
        unknown = sorted(set(table) - _FLOAT8_KEYS)
        if unknown:
            raise r.refuse(f"{where}.{unknown[0]}", "is not a setting the planner knows", "remove it")
        return table, where
    return r.section("float8", _FLOAT8_KEYS), "float8"


def _float8(r: _Reader, blocks_compiled: bool, shard: int, workload: dict[str, Any]) -> dict[str, Any] | None:
    """training.fp8 for torchtitan's float8 (torchao's Float8Linear, perf/fp8.py), or None without it.

    On when `float8.enable_float8_linear` (until February 2025) or a float8 converter in `model.converters`
    ("float8", v0.2.x "quantize.linear.float8"). The recipe is `recipe_name` (tensorwise by default:
    dynamic scaling of every operand); torchtitan swaps every nn.Linear whose dims are multiples of 16
    and whose name contains no `filter_fqns` entry: the 2024 switch's converter always skipped `output`,
    the converters' default filter is empty (the Llama train_configs set ["output"]). Refused by name:
    MX or other converters, rowwise and rowwise_with_gw_hp (the row-scaled GEMM's rate is shape-dependent,
    not modelled), delayed or static scaling, emulation, filters that keep a block linear in bf16 or leave
    the output layer in float8 (the automatic small-shape filter too), eager blocks (the casts are priced
    as compiled kernels), and the fp8 all-gather without precomputed scales (an amax all-reduce per linear
    and gather) or with a recipe name (torchtitan refuses it)."""
    spec = r.config.get("model") if isinstance(r.config.get("model"), dict) else {}
    converters = (spec.get("converters") or []) if r.era == "toml" else []
    if not isinstance(converters, list):
        converters = [converters]
    others = [c for c in converters if c not in ("float8", "quantize.linear.float8")]
    if others:
        raise r.refuse("model.converters", f"{others} (MX / other low-precision training) is not modelled "
                       "(float8 is)", "remove them to plan the job without them")
    table, where = _float8_table(r)
    switch = bool(table.get("enable_float8_linear"))
    if not (switch or converters):
        return None
    for key in ("scaling_type_input", "scaling_type_weight", "scaling_type_grad_output"):
        if str(table.get(key, "dynamic")) != "dynamic":
            raise r.refuse(f"{where}.{key}", f"{table[key]!r} scaling is not modelled (torchao's dynamic scaling "
                           "is)", "use dynamic")
    recipe = table.get("recipe_name") or "tensorwise"
    if recipe in ("rowwise", "rowwise_with_gw_hp"):
        raise r.refuse(f"{where}.recipe_name", f"{recipe!r} is not modelled: its row-scaled GEMM's rate depends on "
                       "the shape (torchtitan's published TP runs measured 14-28% slower than a tensorwise-style "
                       "price)" + (", and its weight gradient runs in bf16" if recipe != "rowwise" else ""),
                       "use tensorwise, or drop float8 to plan the bf16 job")
    if recipe != "tensorwise":
        raise r.refuse(f"{where}.recipe_name", f"{recipe!r} is not a torchao float8 recipe the planner knows",
                       "use tensorwise, or drop float8 to plan the bf16 job")
    if table.get("emulate"):
        raise r.refuse(f"{where}.emulate", "emulated float8 runs the matmuls in high precision, which is not "
                       "modelled", "set it to false on a GPU with fp8 tensor cores")
    if table.get("moe_fqns_prototype"):
        raise r.refuse(f"{where}.moe_fqns_prototype", "mixture-of-experts float8 is not modelled", "remove it")
    if not blocks_compiled:
        raise r.refuse("compile.enable", "float8 with eager blocks: torchao's amax and cast run as separate eager "
                       "kernels, which are not modelled (the casts are priced as torch.compile fuses them)",
                       "set compile.enable = true with the model component")
    filters = table.get("filter_fqns")
    if filters is None:
        filters = ["output"] if switch else []
    if isinstance(filters, str):
        filters = [f for f in filters.split(",") if f]
    if not isinstance(filters, list) or "output" not in filters or "auto_filter_small_kn" in filters:
        raise r.refuse(f"{where}.filter_fqns", f"{filters!r:.60} converts the output layer to float8 (or leaves the "
                       "choice to torchao's small-shape filter), which is not modelled (the blocks' linears are)",
                       "set filter_fqns = [\"output\"]")
    architecture = workload_architecture(workload)
    if architecture is None:
        raise r.refuse("float8", "the workload has no architecture, so which linears float8 converts is unknown",
                       "pass --model with an architecture")
    names = [f"layers.{i}.{m}" for i in range(architecture.layers) for m in (
        "attention.wq", "attention.wk", "attention.wv", "attention.wo", "feed_forward.w1", "feed_forward.w2",
        "feed_forward.w3")]
    kept = [f for f in filters if any(f in name for name in names)]  # torchtitan: `filter_fqn in fqn`
    if kept:
        raise r.refuse(f"{where}.filter_fqns", f"{kept} keeps some block linears in bf16, which is not modelled",
                       "filter only \"output\"")
    odd = [d for d in (architecture.hidden, architecture.q_dim, architecture.kv_dim, architecture.ffn) if d % 16]
    if odd:
        raise r.refuse("float8", f"linear dims {odd} are not multiples of 16, so torchtitan keeps those linears in "
                       "bf16, which is not modelled", "plan the bf16 job")
    gather = bool(table.get("enable_fsdp_float8_all_gather")) and shard > 1
    if gather and table.get("recipe_name"):
        raise r.refuse(f"{where}.enable_fsdp_float8_all_gather", "together with recipe_name (torchtitan refuses it)",
                       "drop recipe_name (tensorwise is the default) or the fp8 all-gather")
    if gather and not table.get("precompute_float8_dynamic_scale_for_fsdp"):
        raise r.refuse(f"{where}.precompute_float8_dynamic_scale_for_fsdp", "is off with the fp8 all-gather: each "
                       "linear's gather then all-reduces its amax, which is not modelled",
                       "set it to true (torchtitan's recommendation)")
    r.assumptions.append(f"torchtitan float8 ({recipe}, torchao Float8Linear on every block linear, output bf16): "
                         "GEMMs at the fp8 GEMM ratio fitted on Transformer Engine rows, casts as torchao's roofline "
                         "counts them" + (", weights all-gathered in fp8" if gather else "")
                         + ("; force_recompute_fp8_weight_in_bwd: no memory change under activation checkpointing"
                            if table.get("force_recompute_fp8_weight_in_bwd") else ""))
    return {"recipe": recipe, "fp8_all_gather": gather}


def _parts_layers(r: _Reader, parts: Any, pp: int, looped: bool) -> list[int]:
    """Workload layers per stage from `module_fqns_per_model_part`: one part per stage (one per PP
    rank, or a multiple of pp, at least 2 per rank, when `looped`), blocks in order without gaps, the
    embedding alone at the front and the norm + output at the end."""
    key = "parallelism.module_fqns_per_model_part"
    if not isinstance(parts, list) or not all(isinstance(p, list) for p in parts):
        raise r.refuse(key, "is not a list of lists of module names", "give one list of module FQNs per stage")
    if not looped and len(parts) != pp:
        raise r.refuse(key, f"{len(parts)} parts for {pp} pipeline ranks and a single-stage schedule (torchtitan "
                       "refuses this job)", "give pipeline_parallel_degree parts (one stage per rank)")
    if looped and (len(parts) % pp or len(parts) < 2 * pp):
        raise r.refuse(key, f"{len(parts)} parts for {pp} pipeline ranks: Interleaved1F1B needs at least 2 stages "
                       "per rank and the same number on each (torchtitan refuses this job)",
                       f"give a multiple of {pp} parts, at least {2 * pp}")
    flat = [m for part in parts for m in part]
    blocks = [m for m in flat if isinstance(m, str) and re.fullmatch(r"layers\.\d+", m)]
    expected = ["tok_embeddings"] + [f"layers.{i}" for i in range(len(blocks))]
    tail = flat[len(expected):]
    if flat[:len(expected)] != expected or tail not in (["norm", "output"], ["norm", "lm_head"]) \
            or parts[-1][-2:] != tail:
        raise r.refuse(key, "the parts are not tok_embeddings, layers.0..N-1 in order, then norm and output "
                       "(or lm_head) in the last part", "list each module once, in model order")
    counts = [len(part) - (i == len(parts) - 1) for i, part in enumerate(parts)]  # norm + output: one head layer
    if 0 in counts:
        raise r.refuse(key, "a stage without modules", "give every stage at least one module")
    return counts


def default_split(blocks: int, stages: int, input_weight: int, output_weight: int) -> list[int]:
    """torchtitan's `_generate_llm_fqn_per_model_part`: the embedding counts as `input_weight`
    layers and norm + output as `output_weight`; the weighted total is spread evenly with the
    remainder on the *first* stages; the first stage then holds the embedding and its remaining
    count of blocks, the last stage its blocks and the head. Returned as workload layers per stage
    (embedding and head each one layer). Llama 3 70B over 4 stages: [21, 21, 20, 20]."""
    if stages == 1:
        return [blocks + 2]
    effective = blocks + input_weight + output_weight
    base, extra = divmod(effective, stages)
    per_stage = [base + (1 if s < extra else 0) for s in range(stages)]
    per_stage[0] = per_stage[0] - input_weight + 1
    per_stage[-1] = per_stage[-1] - output_weight + 1
    return per_stage


def _split(r: _Reader, par: dict[str, Any], pp: int, workload: dict[str, Any]) -> tuple[list[int] | None, int]:
    """Layers per PP rank as torchtitan places them and the stages each rank runs (the planner's
    `virtual_stages`), or a refusal for what the planner cannot place. Without pipelining torchtitan
    builds no schedule, so its schedule settings are not read (the debug configs name
    Interleaved1F1B with pipeline_parallel_degree = 1).

    Interleaved1F1B places stages looped, rank r running stages r, r + p, r + 2p, ... (torchtitan's
    `stage_ids_this_rank`, style "loop"), which is Megatron-LM's interleaved placement, so it is the
    planner's interleaved 1F1B with v = stages / p chunks per rank: v from
    pipeline_parallel_layers_per_stage (or the parts of module_fqns_per_model_part), else the 2 stages
    per rank torchtitan builds for a multi-stage schedule (`generate_split_points` in December 2024,
    `_generate_llm_fqn_per_model_part` since). The planner prices each rank's chunks as 1/v of its
    layers, so the rank's chunks must hold equal layer counts (the embedding and the head one layer each)."""
    if pp == 1:
        return None, 1
    schedule = str(par.get("pipeline_parallel_schedule", "1F1B"))
    if par.get("pipeline_parallel_schedule_csv"):
        raise r.refuse("parallelism.pipeline_parallel_schedule_csv", "a custom schedule is not modelled",
                       "use pipeline_parallel_schedule = \"1F1B\"")
    if schedule in MULTI_STAGE_SCHEDULES and schedule != "Interleaved1F1B":
        placement = "V-shaped: rank r holds stages r and 2p-1-r" if "V" in schedule else \
            "looped: rank r holds stages r, r+p, r+2p, ..."
        what = "zero-bubble split backward" if "ZeroBubble" in schedule or "DualPipe" in schedule else \
            "all forwards before all backwards"
        raise r.refuse("parallelism.pipeline_parallel_schedule", f"{schedule} runs several stages per rank "
                       f"({placement}) with an order the planner does not model ({what})",
                       "use Interleaved1F1B or 1F1B to plan the job")
    if schedule == "GPipe":
        raise r.refuse("parallelism.pipeline_parallel_schedule", "GPipe keeps every micro-batch's activations, "
                       "which the planner (1F1B) does not model", "use 1F1B")
    if schedule not in SINGLE_STAGE_SCHEDULES + ("Interleaved1F1B",):
        raise r.refuse("parallelism.pipeline_parallel_schedule", f"unknown schedule {schedule!r}",
                       f"use one of {', '.join(SINGLE_STAGE_SCHEDULES + ('Interleaved1F1B',))}")
    looped = schedule == "Interleaved1F1B"
    parts = par.get("module_fqns_per_model_part")
    if parts:
        stages = _parts_layers(r, parts, pp, looped)
    else:
        stages = _default_stages(r, par, pp, workload, schedule, looped)
    virtual = len(stages) // pp
    if virtual == 1:
        return stages, 1
    chunks = [stages[rank::pp] for rank in range(pp)]  # rank r: stages r, r + p, ...
    uneven = [c for c in chunks if len(set(c)) > 1]
    if uneven:
        raise r.refuse("parallelism.pipeline_parallel_schedule", f"Interleaved1F1B gives a rank stages of "
                       f"{uneven[0]} layers: the planner prices a rank's {virtual} stages as equal chunks",
                       "give layers per stage (or module parts) that put equal layer counts on each rank's "
                       "stages, or use 1F1B")
    r.assumptions.append(f"torchtitan Interleaved1F1B: {virtual} looped stages per rank ({len(stages)} stages of "
                         f"{stages} layers), priced as interleaved 1F1B (training.virtual_stages = {virtual})")
    return [sum(c) for c in chunks], virtual


def _default_stages(r: _Reader, par: dict[str, Any], pp: int, workload: dict[str, Any], schedule: str,
                    looped: bool) -> list[int]:
    """Workload layers of each of torchtitan's stages (pp of them, or pp x stages per rank when
    `looped`) by its default split."""
    blocks = workload_blocks(workload)
    if blocks is None:
        raise r.refuse("model", "the workload has no architecture, so torchtitan's split cannot be reproduced",
                       "pass --model with an architecture, or give module_fqns_per_model_part")
    first = r.int(par, "parallelism", "pipeline_parallel_first_stage_less_layers", 1)
    last = r.int(par, "parallelism", "pipeline_parallel_last_stage_less_layers", 1)
    effective = blocks + first + last
    total = 2 * pp if looped else pp
    if par.get("pipeline_parallel_layers_per_stage") is not None:
        total = math.ceil(effective / r.int(par, "parallelism", "pipeline_parallel_layers_per_stage", 1))
        if (total != pp and not looped) or (looped and (total % pp or total < 2 * pp)):
            need = f"{pp} stages" if not looped else f"a multiple of {pp} stages, at least {2 * pp}"
            raise r.refuse("parallelism.pipeline_parallel_layers_per_stage", f"gives {total} stages for {pp} ranks "
                           f"and {schedule} needs {need} (torchtitan refuses this job)",
                           f"give layers per stage making a multiple of {pp} stages, at least {2 * pp}" if looped else
                           f"give at least {math.ceil(effective / pp)} layers per stage")
    if total > effective or first > effective // total or last > effective // total:
        raise r.refuse("parallelism.pipeline_parallel_degree", f"{total} stages for {blocks} blocks with first/last "
                       f"weights {first}/{last} (torchtitan refuses this split)", "use fewer pipeline stages")
    return default_split(blocks, total, first, last)


def _recomputation(r: _Reader) -> tuple[str, int]:
    """The planner's recomputation mode for torchtitan's activation checkpointing and the block
    period it applies to (`training.checkpoint_every`), or a refusal.

    Full checkpointing of every block is the planner's `full`; torchtitan's per-op selective
    policy (saves matmul, attention and collective outputs except every second matmul) is the
    planner's `selective` under the torchtitan kernels (`training.kernels`, set by the importer:
    workload/activations.py prices its saved set and the matmuls it reruns). Layer-selective
    checkpointing (`selective_ac_option` = k) wraps a block in the full checkpoint when a counter
    incremented per block reaches a multiple of k (models/llama3/infra/parallelize.py
    `_apply_ac_to_transformer_block`: blocks k, 2k, ... counted from 1), the planner's `full` every k."""
    ac = r.config.get("activation_checkpoint", {} if r.era == "toml" else None)
    where = "activation_checkpoint"
    if ac is None:
        return "none", 1
    if not isinstance(ac, dict):
        raise r.refuse(where, f"got {ac!r:.40}", "give a table of activation-checkpoint settings")
    r.section(where, _AC_KEYS)
    if "mode" in ac or r.era == "toml":  # toml era and the python era until June 2026
        mode = str(ac.get("mode", "selective"))
        option = str(ac.get("selective_ac_option", "2"))
    elif "memory_budget" in ac:
        mode = "memory_budget"
        option = ""
    elif "force_recompute_mm_shapes_by_fqns" in ac:
        mode, option = "selective", "op"
    elif set(ac) <= _AC_BASE_KEYS:
        mode = "full"
        option = ""
    else:
        raise r.refuse(where, "an activation-checkpoint policy the planner does not recognise",
                       "use the none, full or selective policy")
    if mode == "none":
        return "none", 1
    if mode == "full":
        return "full", 1
    if mode == "memory_budget":
        raise r.refuse(f"{where}.memory_budget", "the compiler's memory-budget checkpointing saves what its "
                       "partitioner chooses, which the planner cannot predict", "use mode full or selective (op)")
    if mode != "selective":
        raise r.refuse(f"{where}.mode", f"unknown mode {mode!r}", "use none, full or selective")
    if option == "op":
        return "selective", 1
    if not option.isdigit() or int(option) < 1:
        raise r.refuse(f"{where}.selective_ac_option", f"{option!r} is neither \"op\" nor a positive block "
                       "period (torchtitan refuses it)", "use \"op\" or a positive integer")
    every = int(option)
    if every > 1:
        r.assumptions.append(f"torchtitan layer-selective activation checkpointing: blocks {every}, {2 * every}, "
                             "... of each stage fully recomputed, the others keep all their activations")
    return "full", every


def _batches(r: _Reader, training: dict[str, Any], par: dict[str, Any], pp: int, dp: int) -> dict[str, Any]:
    """global_batch, micro_batch_size and sequence_length in samples of one sequence."""
    if "num_tokens_per_microbatch_per_dp_rank" in training or "max_context_length" in training:
        context = r.int(training, "training", "max_context_length", 2048)
        tokens = r.int(training, "training", "num_tokens_per_microbatch_per_dp_rank", 16384)
        if tokens % context:
            raise r.refuse("training.num_tokens_per_microbatch_per_dp_rank", f"{tokens} tokens is not a whole number "
                           f"of {context}-token sequences (max_context_length)",
                           "make it a multiple of max_context_length")
        mbs = tokens // context
        per_step = r.int(par, "parallelism", "num_pp_microbatches", 1) if pp > 1 else 1
        step_tokens = r.int(training, "training", "num_tokens_per_train_step", -1)
        step_tokens = tokens * per_step * dp if step_tokens == -1 else step_tokens
        if step_tokens % (tokens * per_step * dp):
            raise r.refuse("training.num_tokens_per_train_step", "not a multiple of the tokens of one accumulation "
                           "step (torchtitan refuses it)", f"give a multiple of {tokens * per_step * dp}")
        return {"global_batch": step_tokens // context, "micro_batch_size": mbs, "sequence_length": context}
    local = r.int(training, "training", "local_batch_size", 8)
    global_batch = r.int(training, "training", "global_batch_size", -1)
    global_batch = local * dp if global_batch == -1 else global_batch
    if global_batch % (local * dp):
        raise r.refuse("training.global_batch_size", f"{global_batch} is not a multiple of local_batch_size x DP = "
                       f"{local * dp}", "torchtitan requires it: fix the batch sizes")
    mbs = local
    if pp > 1:
        if "num_pp_microbatches" in par:
            count = r.int(par, "parallelism", "num_pp_microbatches", 1)
            if local % count:
                raise r.refuse("parallelism.num_pp_microbatches", f"does not divide local_batch_size {local}",
                               "give a divisor of local_batch_size")
            mbs = local // count
        else:
            mbs = r.int(par, "parallelism", "pipeline_parallel_microbatch_size", 1)
            if local % mbs:
                raise r.refuse("parallelism.pipeline_parallel_microbatch_size", f"does not divide local_batch_size "
                               f"{local}", "give a divisor of local_batch_size")
    return {"global_batch": global_batch, "micro_batch_size": mbs,
            "sequence_length": r.int(training, "training", "seq_len", 2048)}


def _state(r: _Reader, training: dict[str, Any], par: dict[str, Any], tp: int, pp: int, shard: int) -> dict[str, Any]:
    """Precision, ZeRO stage and bytes per parameter of torchtitan's state, in the planner's terms.

    torchtitan keeps parameters, gradients and Adam's two moments in `training.dtype` (fp32 by
    default) and computes in `mixed_precision_param` through FSDP, or through autocast under
    DDP / one device; with TP or PP and no FSDP it runs without mixed precision (maybe_enable_amp).
    FSDP reshards after forward unless PP is on (the default) or the job says never; under PP,
    torch.distributed.pipelining keeps parameters unsharded and accumulates unsharded fp32
    gradients until the last micro-batch. The planner's ZeRO stage and bytes per parameter are
    chosen so that each case's total is torchtitan's."""
    dtype = str(training.get("dtype", "float32"))
    compute = str(training.get("mixed_precision_param", "bfloat16"))
    for key, value in (("dtype", dtype), ("mixed_precision_param", compute)):
        if value not in _DTYPE_BYTES:
            raise r.refuse(f"training.{key}", f"unknown dtype {value!r}", "use bfloat16 or float32")
    if training.get("enable_cpu_offload"):
        raise r.refuse("training.enable_cpu_offload", "FSDP CPU offload of parameters, gradients and optimizer "
                       "state is not modelled", "set it to false")
    stored = _DTYPE_BYTES[dtype]
    total = 4 * stored  # parameter, gradient, Adam's two moments
    fsdp = shard > 1
    # since June 2026 (parallelize.py: "Always run apply_fsdp_to_decoder") torchtitan wraps the model in
    # FSDP's mixed precision even at shard degree 1; dumps of then carry the model's config in model_spec
    always_mixed = torchtitan_always_mixed(r.era, r.config)
    c = _DTYPE_BYTES[compute] if fsdp or always_mixed or (tp == 1 and pp == 1) else stored
    grads = stored
    adam = 2 * stored
    reshard = str(par.get("fsdp_reshard_after_forward", "default"))
    if reshard not in ("default", "always", "never"):
        raise r.refuse("parallelism.fsdp_reshard_after_forward", f"unknown policy {reshard!r}",
                       "use default, always or never")
    if not fsdp:
        zero, optimizer = 0, stored + adam - c
        how = "replicated"
    elif pp > 1:
        zero, grads, optimizer = 1, 4, stored + grads + adam
        how = ("FSDP under PP: parameters and fp32 gradients unsharded for the step (torch pipelining), "
               "sharded fp32 state")
    elif reshard == "never":
        zero, optimizer = 2, stored + adam
        how = "FSDP without reshard after forward: parameters unsharded, the rest sharded"
    else:
        zero, optimizer = 3, stored + adam - c
        how = "FSDP: all state sharded"
    r.assumptions.append(f"torchtitan state {total} bytes/parameter ({dtype} parameters, gradients and Adam moments; {how})")
    return {"precision": "bf16" if c == 2 else "fp32", "zero_stage": zero, "grad_bytes_per_param": grads,
            "optimizer": {"name": "adam", "state_bytes_per_param": optimizer}}


def _optimizer(r: _Reader) -> None:
    """Only Adam / AdamW is modelled (two moments per parameter)."""
    opt = r.config.get("optimizer")
    if not isinstance(opt, dict):
        return
    names = [opt["name"]] if "name" in opt else []
    names += [g.get("optimizer_name") for g in opt.get("param_groups") or [] if isinstance(g, dict)]
    for name in names:
        if name not in ("Adam", "AdamW", None):
            raise r.refuse("optimizer", f"{name} is not modelled (Adam's two moments per parameter are)",
                           "use Adam or AdamW")
    if opt.get("implementation") == "fused_opt_states_bf16":
        raise r.refuse("optimizer.implementation", "bf16 optimizer states are not modelled", "use fused")
    if opt.get("early_step_in_backward"):
        raise r.refuse("optimizer.early_step_in_backward", "the optimizer step inside backward is not modelled",
                       "set it to false")


def _loss_chunks(r: _Reader) -> int:
    """How many token slices torchtitan's loss runs the head over (ChunkedLossWrapper, the
    recipes' loss since mid-2026: `loss.num_chunks`, 8 by default), 1 for a plain loss. Its
    slices' logits are alive one at a time, which the planner prices as 1/num_chunks of the
    measured whole-batch loss buffers."""
    loss = r.config.get("loss")
    if not isinstance(loss, dict) or "num_chunks" not in loss:
        return 1
    chunks = r.int(loss, "loss", "num_chunks", 1)
    if chunks < 1:
        raise r.refuse("loss.num_chunks", f"got {chunks}", "give a positive number of chunks")
    if chunks > 1:
        r.assumptions.append(f"torchtitan chunked loss: the head and loss run over {chunks} token slices in turn; "
                             f"loss buffers priced as 1/{chunks} of the whole micro-batch's (not measured)")
    return chunks


def _compiled(r: _Reader, compile_: dict[str, Any]) -> tuple[bool, bool]:
    """(blocks compiled, loss compiled) under torch.compile: `compile.components` (default model and
    loss, torchtitan's Compile config) with Inductor, which fuses the element-wise chains but the
    complex rotary's (activations.TORCHTITAN_COMPILED, COMPILED_LOSS_LOGIT_BYTES); another backend does not fuse."""
    if not compile_.get("enable"):
        return False, False
    components = compile_.get("components", ["model", "loss"])
    if not isinstance(components, list) or not set(components) <= {"model", "loss"}:
        raise r.refuse("compile.components", f"{components!r:.60} compiles more than the model's blocks and the "
                       "loss, which the planner does not model", "compile [\"model\", \"loss\"] or a part of it")
    backend = str(compile_.get("backend", "inductor"))
    if backend != "inductor":
        raise r.refuse("compile.backend", f"{backend!r} does not fuse kernels as Inductor does",
                       "use backend = \"inductor\", or compile.enable = false")
    if "model" in components:
        r.assumptions.append("torch.compile of the blocks (Inductor): their element-wise chains timed as fused "
                             "kernels but the complex rotary's (an ATen fallback: its eager casts kept); without per-op checkpointing their saved set is the fused kernels' (norm "
                             "input, both SwiGLU matmul outputs and their product; not measured)")
    if "loss" in components:
        r.assumptions.append("compiled loss: the half-precision logits and their gradient at the loss, 4 bytes "
                             "per token and vocabulary entry (derived from the fused graph, not measured)")
    return "model" in components, "loss" in components


def import_torchtitan(path: Path, options: ClusterOptions, failed: list[int], model: str | None = None,
                      name: str | None = None) -> dict[str, Any]:
    """An instance document for the job a torchtitan config describes (device ids = its ranks)."""
    config, era = read_job_config(path)
    r = _Reader(path, config, era)
    par = r.section("parallelism", _PARALLELISM_KEYS)
    training = r.section("training", _TRAINING_KEYS)
    compile_ = r.section("compile", _COMPILE_KEYS)
    tp = r.int(par, "parallelism", "tensor_parallel_degree", 1)
    pp = r.int(par, "parallelism", "pipeline_parallel_degree", 1)
    replicate = r.int(par, "parallelism", "data_parallel_replicate_degree", 1)
    shard = r.int(par, "parallelism", "data_parallel_shard_degree", -1)
    if r.int(par, "parallelism", "context_parallel_degree", 1) != 1:
        # PyTorch's context-parallel attention (torch.distributed.tensor.experimental._attention, default
        # all-gather rotation) priced from its code came out 14-42% fast on torchtitan's 6 published CP
        # rows, growing with the degree (docs/performance-model.md, "torchtitan context parallelism")
        raise r.refuse("parallelism.context_parallel_degree", "is above 1: torchtitan's context parallelism "
                       "(PyTorch's experimental context-parallel attention) priced from its code is 14-42% fast "
                       "on torchtitan's published runs, so it is not priced (training.context_parallel prices "
                       "Transformer Engine's K/V ring), and the planner plans DP x PP x TP only", "set it to 1")
    for key in ("expert_parallel_degree", "expert_tensor_parallel_degree"):
        if r.int(par, "parallelism", key, 1) != 1:
            raise r.refuse(f"parallelism.{key}", "is above 1", "the planner models DP x PP x TP only: set it to 1")
    if shard == -1:
        if options.world_size is None:
            raise r.refuse("parallelism.data_parallel_shard_degree", "is -1 (the ranks left over)",
                           "pass --world-size (the launcher's nnodes x nproc-per-node, NGPU)")
        shard = options.world_size // (tp * pp * replicate)
    dp = replicate * shard
    world = tp * pp * dp
    if dp < 1 or (options.world_size is not None and options.world_size != world):
        raise r.refuse("parallelism", f"degrees give {world} ranks, --world-size is {options.world_size}",
                       "make the degrees multiply to the world size")
    if tp > 1 and par.get("disable_loss_parallel"):
        raise r.refuse("parallelism.disable_loss_parallel", "gathers the full logits on every TP rank, which the "
                       "planner (vocab-parallel loss) does not model", "set it to false")
    if par.get("full_dtensor"):
        r.assumptions.append("torchtitan full DTensor mode: timed as the default TP / FSDP implementation")
    if era == "python" and pp == 1 and "disable_cuda_graphs" in training and not training["disable_cuda_graphs"]:
        r.assumptions.append("torchtitan CUDA graphs (training.disable_cuda_graphs = false): kernel launches timed "
                             "as eager, graph memory pools not counted")
    if par.get("enable_fsdp_symm_mem"):
        r.assumptions.append("torchtitan FSDP symmetric memory: collectives timed as NCCL's")
    _optimizer(r)
    workload = _model(r, model)
    blocks_compiled, loss_compiled = _compiled(r, compile_)
    fp8 = _float8(r, blocks_compiled, shard, workload)
    tp_async = False
    for where, table in (("parallelism", par), ("compile", compile_)):
        if table.get("enable_async_tensor_parallel") and tp > 1:
            if not blocks_compiled:
                raise r.refuse(f"{where}.enable_async_tensor_parallel", "async TP without the blocks compiled "
                               "(torchtitan refuses it: the micro-pipelining is an Inductor pass)",
                               "set compile.enable = true with the model component, or async TP false")
            tp_async = True
    if tp_async:
        r.assumptions.append("torchtitan async TP: each TP collective micro-pipelined with the matmul next to it, "
                             "only its excess over that matmul and one pipeline step exposed (derived, not fitted)")
    layout: dict[str, Any] = {"pipeline_parallel": pp, "data_parallel": dp, "order": TORCHTITAN_ORDER}
    split, virtual = _split(r, par, pp, workload)
    if split is not None:
        layout["layers_per_stage"] = split
    state = _state(r, training, par, tp, pp, shard)
    if replicate > 1 and shard > 1:
        # HSDP: the mesh [dp_replicate, dp_shard] makes each run of `shard` consecutive data-parallel ranks
        # one FSDP group, and `replicate` of them hold copies of its shards
        state["shard_replicas"] = replicate
        r.assumptions.append(f"torchtitan HSDP: {replicate} copies of each FSDP shard, {shard}-way within each; "
                             "gradients timed as one all-reduce over the data-parallel group")
    recompute, every = _recomputation(r)
    if every > 1 and split is not None:
        starts = [sum(split[:s]) for s in range(1, len(split))]  # the stages' first workload layers
        if any((start - 1) % every for start in starts):
            # torchtitan counts blocks on each rank from its stage's first; the planner over the model
            raise r.refuse("activation_checkpoint.selective_ac_option", f"a stage starts after a number of blocks "
                           f"that is not a multiple of {every} (stages of {split} layers), so its ranks checkpoint "
                           "other blocks than the planner's count over the whole model",
                           f"give stages whose block counts before each are multiples of {every}, or mode full")
    train: dict[str, Any] = {**_batches(r, training, par, pp, dp), **state,
                             "recomputation": recompute, "checkpoint_every": every,
                             **({"virtual_stages": virtual} if virtual > 1 else {}),
                             # ptd_checkpoint_wrapper's default, torch's non-reentrant checkpoint (torch >= 2.1)
                             "recompute_early_stop": recompute == "full",
                             "kernels": "torchtitan-compiled" if blocks_compiled else "torchtitan",
                             # models/calibration/torchtitan.json: efficiencies fitted on other stacks' runs
                             "framework": "torchtitan",
                             "compiled_loss": loss_compiled, "tp_async": tp_async,
                             "loss_chunks": _loss_chunks(r), **({"fp8": fp8} if fp8 else {}),
                             "sequence_parallel": tp > 1 and (era == "toml" or bool(par.get("enable_sequence_parallel",
                                                                                               True))),
                             "assumptions": r.assumptions}
    return {"format": 1, "name": name or path.stem,
            "description": f"imported from torchtitan config {path.name} ({era} era); device ids are torchtitan "
                           "global ranks",
            "cluster": cluster_document(world, options), "workload": workload, "training": train,
            "plan": {"tensor_parallel": tp, "layout": layout}, "failures": failure_document(failed, world),
            "trainer": {"name": "torchtitan", "file": path.name, "era": era, "config": config}}


def settings_toml(document: dict[str, Any], header: list[str]) -> str:
    """A complete TOML job config: sections of tables in order, comments first."""
    lines = [f"# {h}" for h in header]
    _toml_table(document, [], lines)
    return "\n".join(lines).lstrip("\n") + "\n"


def _toml_table(table: dict[str, Any], prefix: list[str], lines: list[str]) -> None:
    scalars = {k: v for k, v in table.items() if not isinstance(v, dict) and v is not None}
    if prefix and (scalars or not table):
        lines.append(f"\n[{'.'.join(prefix)}]")
    for key, value in scalars.items():
        lines.append(f"{key} = {_toml_value(value)}")
    for key, value in table.items():
        if isinstance(value, dict):
            _toml_table(value, prefix + [key], lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)) and math.isfinite(value):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value if v is not None) + "]"
    raise TypeError(f"no TOML form for {value!r}")
