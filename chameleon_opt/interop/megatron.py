"""Megatron-LM arguments in (faithfully, or refused with exit 2), Megatron-LM arguments out.

Input: the training script's arguments, a file of them, or the bash launch script itself
(interop/shell.py expands its variables and arrays). The rules reproduced are Megatron-LM's own:
megatron/training/arguments.py (`--ffn-hidden-size` default int(4h x 2/3 / 64) x 64 with SwiGLU,
`--kv-channels` default h / heads, fp32 gradient accumulation under bf16 unless
`--grad-reduce-in-bf16`, no sequence parallelism at TP 1, the vocabulary padded to a multiple of
`--make-vocab-size-divisible-by` x TP) and megatron/core/transformer/transformer_block.py
`get_num_layers_to_build` (even split; `--decoder-first/last-pipeline-num-layers` with the rest
even; `--account-for-embedding/loss-in-pipeline-split` counting the embedding / loss as a layer;
`--pipeline-model-parallel-layout`). Interleaved (virtual) pipelines place blocks round-robin
(pipeline rank r of p holds chunks r, r + p, ...), which the planner's contiguous stages cannot
express: they are refused, as are MoE, FP8/FP4, context and expert parallelism and CPU offload.

Arguments the planner reads are listed in _VALUE_FLAGS / _SWITCHES; the refused ones in _REFUSED;
every other argument of a launch line (data, logging, learning rate, checkpoints...) does not
change time, memory or placement. An unknown argument close to one of those read is refused as a
probable misspelling.
"""

from __future__ import annotations

import difflib
import math
import re
import shlex
from pathlib import Path
from typing import Any

from chameleon_opt.errors import InputError
from chameleon_opt.interop.common import (MEGATRON_ORDER, ClusterOptions, cluster_document, failure_document,
                                          workload_blocks, workload_document)
from chameleon_opt.interop.shell import UNSET, read_launch_script, unset_name

_VALUE_FLAGS = (
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
    "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--micro-batch-size", "--global-batch-size",
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--num-query-groups",
    "--kv-channels", "--seq-length", "--max-position-embeddings", "--vocab-size", "--make-vocab-size-divisible-by",
    "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers", "--pipeline-model-parallel-layout",
    "--position-embedding-type", "--recompute-granularity", "--recompute-method", "--recompute-num-layers",
    "--recompute-modules", "--optimizer", "--world-size", "--num-distributed-optimizer-instances",
    "--fp8-format", "--fp8-recipe")
_SWITCHES = (
    "--use-tp-pp-dp-mapping", "--group-query-attention", "--swiglu", "--bf16", "--fp16",
    "--untie-embeddings-and-output-weights", "--use-distributed-optimizer", "--sequence-parallel",
    "--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap", "--grad-reduce-in-bf16",
    "--accumulate-allreduce-grads-in-fp32", "--account-for-embedding-in-pipeline-split",
    "--account-for-loss-in-pipeline-split", "--recompute-activations")
_REFUSED = {
    "--num-layers-per-virtual-pipeline-stage": "an interleaved (virtual) pipeline places blocks round-robin over "
    "the pipeline ranks, which the planner's contiguous stages cannot express",
    "--num-virtual-stages-per-pipeline-rank": "an interleaved (virtual) pipeline places blocks round-robin over "
    "the pipeline ranks, which the planner's contiguous stages cannot express",
    "--num-experts": "a mixture-of-experts model is not modelled",
    "--fp8-param-gather": "fp8 parameters (kept and all-gathered in fp8, no bf16 copy) are not modelled",
    "--fp4-format": "FP4 training is not modelled",
    "--mtp-num-layers": "multi-token-prediction layers are not modelled",
    "--multi-latent-attention": "multi-latent attention is not modelled",
    "--hybrid-layer-pattern": "hybrid (Mamba) models are not modelled",
    "--encoder-num-layers": "encoder-decoder models are not modelled",
    "--cpu-offloading": "activation / weight CPU offload is not modelled",
    "--optimizer-cpu-offload": "optimizer CPU offload is not modelled",
    "--use-torch-fsdp2": "FSDP2 sharding is not modelled for Megatron-LM",
    "--use-megatron-fsdp": "Megatron FSDP sharding is not modelled",
    "--distribute-saved-activations": "activations distributed over the TP group are not modelled",
}
_LAUNCHER_FLAGS = ("--nnodes", "--nproc-per-node", "--nproc_per_node")


def read_arguments(args: list[str]) -> tuple[list[str], list[str], Path | None]:
    """(training arguments, launcher arguments, file): a launch script (`.sh`, or a file whose
    text launches torchrun / python), a file of arguments (or `@file`), or the arguments."""
    if len(args) == 1 and (args[0].startswith("@") or Path(args[0]).is_file()):
        file = Path(args[0].removeprefix("@"))
        try:
            text = file.read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise InputError(file, "file", f"cannot be read ({type(err).__name__})",
                             "give a launch script or a file of Megatron-LM arguments") from None
        if file.suffix == ".sh" or text.startswith("#!") or re.search(r"^\s*(torchrun|python\S*)\s", text, re.M):
            launch = read_launch_script(file)
            program = Path(launch.program).name
            if program != "pretrain_gpt.py":
                # pretrain_bert.py, pretrain_t5.py, pretrain_mamba.py, pretrain_vlm.py: other models and losses
                raise InputError(file, program, "trains a model other than Megatron-LM's GPT (decoder-only) "
                                 "model, which the planner does not model", "import a pretrain_gpt.py launch")
            return launch.arguments, launch.launcher, file
        try:
            return shlex.split(text, comments=True), [], file
        except ValueError as err:
            raise InputError(file, "file", f"cannot be read ({err})", "fix the quoting") from None
    return list(args), [], None


class _Args:
    """The arguments the planner reads, with one-line errors naming the file and the flag."""

    def __init__(self, words: list[str], launcher: list[str], file: Path | None) -> None:
        self.file = file
        self.values: dict[str, str] = {}
        self.switches: set[str] = set()
        known = set(_VALUE_FLAGS) | set(_SWITCHES) | set(_REFUSED) | set(_LAUNCHER_FLAGS)
        for source in (launcher, words):
            i = 0
            while i < len(source):
                word = source[i]
                flag, eq, inline = word.partition("=")
                if flag.startswith("--") and flag.replace("_", "-") in _LAUNCHER_FLAGS:
                    flag = flag.replace("_", "-")
                if not flag.startswith("--"):
                    name = unset_name(word)
                    if name is not None:  # an undefined array or variable standing for arguments
                        raise InputError(file, f"${name}", "is not defined in the script, so the arguments it stands "
                                         "for are unknown", "define it in the script or the environment")
                    i += 1
                    continue
                takes_value = flag not in _SWITCHES and not eq and i + 1 < len(source) \
                    and not source[i + 1].startswith("--")
                value = inline if eq else source[i + 1] if takes_value else None
                if flag in known:
                    if flag in _SWITCHES:
                        self.switches.add(flag)
                    elif value is not None:
                        self.values[flag] = value
                    else:
                        self.switches.add(flag)
                elif flag.startswith("--moe-"):
                    raise InputError(file, flag, "a mixture-of-experts setting: MoE is not modelled", "plan a dense model")
                else:
                    close = difflib.get_close_matches(flag, known, n=1, cutoff=0.9)
                    if close:
                        raise InputError(file, flag, "is not a Megatron-LM argument the planner knows",
                                         f"did you mean {close[0]}?")
                if flag == "--recompute-modules" and takes_value:  # nargs='*'
                    j = i + 1
                    while j < len(source) and not source[j].startswith("--"):
                        j += 1
                    self.values[flag] = " ".join(source[i + 1:j])
                    i = j
                    continue
                i += 2 if takes_value else 1
        for flag, problem in _REFUSED.items():
            if flag in self.values or flag in self.switches:
                raise InputError(file, flag, problem, f"remove {flag} to plan the job without it")

    def int(self, flag: str) -> int | None:
        value = self.values.get(flag)
        if value is None:
            return None
        if UNSET in value:
            raise InputError(self.file, flag, f"its value ${unset_name(value)} is not defined in the script",
                             "define it in the script or the environment")
        try:
            return int(value)
        except ValueError:
            raise InputError(self.file, flag, f"got {value!r}", "give an integer") from None

    def text(self, flag: str, default: str | None = None) -> str | None:
        value = self.values.get(flag, default)
        if value is not None and UNSET in value:
            raise InputError(self.file, flag, f"its value ${unset_name(value)} is not defined in the script",
                             "define it in the script or the environment")
        return value

    def has(self, flag: str) -> bool:
        return flag in self.switches


def stage_blocks(a: _Args, blocks: int, pp: int) -> list[int]:
    """Transformer blocks per pipeline rank as Megatron-LM builds them (get_num_layers_to_build)."""
    layout = a.text("--pipeline-model-parallel-layout")
    if layout is not None:
        return _layout_blocks(a, layout, blocks, pp)
    first, last = a.int("--decoder-first-pipeline-num-layers"), a.int("--decoder-last-pipeline-num-layers")
    with_embedding = a.has("--account-for-embedding-in-pipeline-split")
    with_loss = a.has("--account-for-loss-in-pipeline-split")
    if pp == 1:
        return [blocks]
    if first is not None or last is not None:
        if with_embedding or with_loss:
            raise InputError(a.file, "--account-for-embedding-in-pipeline-split", "is not allowed with "
                             "--decoder-first/last-pipeline-num-layers (Megatron-LM refuses it)", "give one or the other")
        for flag, value in (("--decoder-first-pipeline-num-layers", first), ("--decoder-last-pipeline-num-layers", last)):
            if value is not None and value <= 0:
                raise InputError(a.file, flag, f"is {value}; Megatron-LM requires at least 1", "give a positive count")
        left = blocks - (first or 0) - (last or 0)
        stages = pp - (first is not None) - (last is not None)
        if stages and left % stages:
            raise InputError(a.file, "--num-layers", f"{left} blocks left over {stages} middle stages",
                             "Megatron-LM requires them to divide evenly")
        counts = [left // stages if stages else 0] * pp
        if first is not None:
            counts[0] = first
        if last is not None:
            counts[-1] = last
        return counts
    total = blocks + with_embedding + with_loss
    if total % pp:
        raise InputError(a.file, "--num-layers", f"{total} layers (with the embedding / loss counted as asked) over "
                         f"{pp} stages", "Megatron-LM requires them to divide evenly")
    counts = [total // pp] * pp
    counts[0] -= with_embedding
    counts[-1] -= with_loss
    return counts


def _layout_blocks(a: _Args, layout: str, blocks: int, pp: int) -> list[int]:
    """Blocks per stage of --pipeline-model-parallel-layout ("E" embedding, "t" block, "L" loss,
    "|" between stages, "(...)*n" and "x*n" repeats): one stage per pipeline rank only."""
    flat = layout.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        flat = re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), flat)
    stages = flat.split("|")
    flag = "--pipeline-model-parallel-layout"
    if len(stages) != pp:
        raise InputError(a.file, flag, f"{len(stages)} stages for {pp} pipeline ranks: an interleaved placement the "
                         "planner's contiguous stages cannot express", "give one stage per pipeline rank")
    if set(flat) - set("Et|L") or not (stages[0].startswith("E") and stages[-1].endswith("L")) \
            or flat.count("E") != 1 or flat.count("L") != 1 or flat.count("t") != blocks:
        raise InputError(a.file, flag, f"{layout!r} is not E, {blocks} t's and L over the stages",
                         "list the embedding first, every block once, and the loss last")
    return [s.count("t") for s in stages]


def _recomputation(a: _Args, blocks_per_stage: list[int]) -> str:
    """Megatron-LM's recomputation in the planner's modes, or a refusal (partial recomputation)."""
    granularity = a.text("--recompute-granularity") or ("selective" if a.has("--recompute-activations") else None)
    if granularity is None:
        return "none"
    if granularity == "selective":
        modules = (a.text("--recompute-modules") or "core_attn").split()
        if set(modules) != {"core_attn"}:
            raise InputError(a.file, "--recompute-modules", f"{modules} recomputes more than the attention core",
                             "use the default (core_attn), which the planner's selective recomputation is")
        return "selective"
    if granularity != "full":
        raise InputError(a.file, "--recompute-granularity", f"unknown {granularity!r}", "use full or selective")
    method, count = a.text("--recompute-method"), a.int("--recompute-num-layers") or 1
    if method == "uniform" and count == 1:
        return "full"
    if method == "block" and count >= max(blocks_per_stage):
        return "full"
    raise InputError(a.file, "--recompute-num-layers", f"{method} recomputation of {count} layers checkpoints "
                     "some blocks (or groups of blocks) only, which the planner does not model",
                     "use --recompute-method uniform --recompute-num-layers 1 (every block)")


def _workload(a: _Args, model: str | None, tp: int, name: str) -> dict[str, Any]:
    if model:
        return workload_document(model, "--model")
    needed = ("--num-layers", "--hidden-size", "--num-attention-heads", "--vocab-size")
    missing = [flag for flag in needed if a.text(flag) is None]
    if missing == ["--vocab-size"]:
        raise InputError(a.file, "--vocab-size", "not given: Megatron-LM takes the vocabulary from the tokenizer, "
                         "which the planner does not read", "add --vocab-size N, or pass --model (a catalogue name or "
                         "the model's Hugging Face config.json)")
    if missing:
        raise InputError(a.file, missing[0], "not given", "give it, or pass --model (a catalogue name or a Hugging "
                         "Face config.json)")
    hidden, heads = a.int("--hidden-size"), a.int("--num-attention-heads")
    assert hidden is not None and heads is not None
    swiglu = a.has("--swiglu")
    ffn = a.int("--ffn-hidden-size") or (int((4 * hidden * 2 / 3) / 64) * 64 if swiglu else 4 * hidden)
    head_dim = a.int("--kv-channels") or hidden // heads
    groups = a.int("--num-query-groups") if a.has("--group-query-attention") else None
    multiple = (a.int("--make-vocab-size-divisible-by") or 128) * tp
    vocab = a.int("--vocab-size")
    assert vocab is not None
    arch = {"layers": a.int("--num-layers"), "hidden": hidden, "heads": heads, "kv_heads": groups,
            "head_dim": head_dim if head_dim * heads != hidden else None, "ffn": ffn,
            "vocab": math.ceil(vocab / multiple) * multiple,
            "seq_len": a.int("--seq-length") or a.int("--max-position-embeddings") or 2048,
            "gated_mlp": swiglu, "tied_embeddings": not a.has("--untie-embeddings-and-output-weights"),
            "learned_positions": a.text("--position-embedding-type", "learned_absolute") == "learned_absolute"}
    return {"inline": {"name": name, "source": "Megatron-LM arguments (vocabulary padded to a multiple of "
                       f"{multiple} as Megatron-LM pads it)", "architecture": {k: v for k, v in arch.items()
                                                                               if v is not None}}}


FP8_FORMATS = ("hybrid", "e4m3")
"""Megatron-LM's --fp8-format choices (E4M3 everywhere, or E4M3 forward and E5M2 gradients): the same
tensor-core rate and cast bytes, so the same training.fp8."""


def _fp8(a: _Args) -> dict[str, str] | None:
    """training.fp8 for --fp8-format: Megatron-LM's --fp8-recipe defaults to delayed (TE DelayedScaling), the
    one recipe the planner prices; its TE layers keep the cast weights across micro-batches. Other recipes
    (tensorwise, blockwise, mxfp8) are refused by name."""
    fmt = a.text("--fp8-format")
    if fmt is None:
        return None
    if fmt not in FP8_FORMATS:
        raise InputError(a.file, "--fp8-format", f"{fmt!r} is not a Megatron-LM fp8 format", "use hybrid or e4m3")
    recipe = a.text("--fp8-recipe", "delayed")
    if recipe != "delayed":
        raise InputError(a.file, "--fp8-recipe", f"{recipe} scaling is not modelled (training.fp8 prices delayed "
                         "scaling only)", "use --fp8-recipe delayed, or drop --fp8-format to plan the bf16 job")
    return {"recipe": "delayed", "weight_cast": "per_step"}


def import_megatron(raw: list[str], options: ClusterOptions, failed: list[int], model: str | None = None,
                    name: str = "megatron-job") -> dict[str, Any]:
    """An instance document for the job a Megatron-LM launch describes (device ids = its ranks)."""
    words, launcher, file = read_arguments(raw)
    a = _Args(words, launcher, file)
    tp = a.int("--tensor-model-parallel-size") or 1
    pp = a.int("--pipeline-model-parallel-size") or 1
    for flag in ("--context-parallel-size", "--expert-model-parallel-size", "--expert-tensor-parallel-size"):
        value = a.int(flag)
        if value not in (None, 1):
            raise InputError(file, flag, f"is {value}", "the planner models DP x PP x TP only: use 1")
    if a.text("--optimizer", "adam") != "adam":
        raise InputError(file, "--optimizer", f"{a.text('--optimizer')} is not modelled (Adam's state is)", "use adam")
    per_node = a.int("--nproc-per-node")
    nodes = a.int("--nnodes")
    world = options.world_size or a.int("--world-size") or (nodes * per_node if nodes and per_node else None)
    if world is None:
        raise InputError(file, "--world-size", "unknown", "pass --world-size, or --nnodes and --nproc-per-node")
    if world % (tp * pp):
        raise InputError(file, "--world-size", f"{world} is not a multiple of TP x PP = {tp * pp}",
                         "give the job's world size")
    if per_node:
        options = ClusterOptions(world, per_node, options.device_type, options.intra_node_gbps, options.inter_node_gbps)
    dp = world // (tp * pp)
    workload = _workload(a, model, tp, name)
    blocks = workload_blocks(workload)
    layout: dict[str, Any] = {"pipeline_parallel": pp, "data_parallel": dp,
                              "order": "tp-pp-dp" if a.has("--use-tp-pp-dp-mapping") else MEGATRON_ORDER}
    per_stage = [blocks] if pp == 1 or blocks is None else stage_blocks(a, blocks, pp)
    if pp > 1 and blocks is not None:
        counts = list(per_stage)
        counts[0] += 1
        counts[-1] += 1  # Megatron-LM: the embedding on the first stage, the output layer and loss on the last
        layout["layers_per_stage"] = counts
    bf16, fp16 = a.has("--bf16"), a.has("--fp16")
    fp32_grads = (bf16 and not a.has("--grad-reduce-in-bf16")) or a.has("--accumulate-allreduce-grads-in-fp32")
    assumptions = []
    if a.has("--tp-comm-overlap"):
        assumptions.append("Megatron-LM --tp-comm-overlap: TP collectives timed as not overlapped with matmuls")
    if a.has("--overlap-param-gather"):
        assumptions.append("Megatron-LM --overlap-param-gather: the distributed optimizer's all-gather timed as "
                           "not overlapped")
    batch_schedule = next((f for f in ("--rampup-batch-size", "--step-batch-size-schedule") if f in words), None)
    if batch_schedule:
        assumptions.append(f"Megatron-LM {batch_schedule}: planned at the full --global-batch-size")
    micro = a.int("--micro-batch-size") or 1
    training: dict[str, Any] = {
        "global_batch": a.int("--global-batch-size") or micro * dp, "micro_batch_size": micro,
        "precision": "bf16" if bf16 else "fp16" if fp16 else "fp32",
        "grad_bytes_per_param": 4 if fp32_grads or not (bf16 or fp16) else 2,
        "recomputation": _recomputation(a, per_stage if blocks is not None else [1]),
        "distributed_optimizer": a.has("--use-distributed-optimizer"),
        "overlap_grad_reduce": a.has("--overlap-grad-reduce"),
        "sequence_parallel": a.has("--sequence-parallel") and tp > 1,  # Megatron-LM turns it off at TP 1
        "assumptions": assumptions}
    instances = a.int("--num-distributed-optimizer-instances") or 1
    if instances < 1 or dp % instances:
        raise InputError(file, "--num-distributed-optimizer-instances", f"{instances} does not divide the "
                         f"data-parallel size {dp} (Megatron-LM refuses it)", f"give a divisor of {dp}")
    if instances > 1 and training["distributed_optimizer"]:
        # each instance shards the optimizer state over its dp / instances consecutive DP ranks
        training["shard_replicas"] = instances
        assumptions.append(f"Megatron-LM --num-distributed-optimizer-instances {instances}: gradients timed as one "
                           "all-reduce over the data-parallel group (not reduce-scatter within each instance plus "
                           "all-reduce across them)")
    elif instances > 1:
        assumptions.append("Megatron-LM --num-distributed-optimizer-instances without --use-distributed-optimizer: "
                           "nothing is sharded, so it changes nothing the planner models")
    if a.int("--seq-length"):
        training["sequence_length"] = a.int("--seq-length")
    fp8 = _fp8(a)
    if fp8 is not None:
        training["fp8"] = fp8
        assumptions.append(f"Megatron-LM --fp8-format {a.text('--fp8-format')}: Transformer Engine's delayed scaling, "
                           "block linears in fp8, weights cast once per step (is_first_microbatch); fp8 GEMM ratio "
                           "fitted on NeMo's H100 fp8 rows (perf/fp8.py)")
    return {"format": 1, "name": name,
            "description": "imported from Megatron-LM arguments; device ids are Megatron-LM global ranks",
            "cluster": cluster_document(world, options), "workload": workload, "training": training,
            "plan": {"tensor_parallel": tp, "layout": layout}, "failures": failure_document(failed, world),
            "trainer": {"name": "megatron", "file": file.name if file else "", "era": "args", "arguments": words,
                        "launcher": launcher}}
