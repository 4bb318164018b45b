"""Megatron-LM arguments in, Megatron-LM parallelism arguments out.

Read (unknown arguments are ignored: a real launch line has dozens): tensor / pipeline / context /
expert model-parallel sizes, the rank order (`--use-tp-pp-dp-mapping`), the GPT architecture
(`--num-layers`, `--hidden-size`, `--ffn-hidden-size`, `--num-attention-heads`,
`--group-query-attention` + `--num-query-groups`, `--swiglu`, `--untie-embeddings-and-output-weights`,
`--position-embedding-type`, `--vocab-size`, `--seq-length`), batch sizes, precision, recomputation,
the distributed optimizer, sequence parallelism and an uneven split
(`--decoder-first/last-pipeline-num-layers`). The world size is the launcher's
(`--nnodes x --nproc-per-node` in the same line, or `--world-size`). Megatron-LM puts the
embedding on the first stage and the output layer on the last, beside their blocks.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from chameleon_opt.errors import InputError
from chameleon_opt.interop.common import (MEGATRON_ORDER, ClusterOptions, cluster_document, failure_document,
                                          workload_blocks, workload_document)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag, default in (("--tensor-model-parallel-size", 1), ("--pipeline-model-parallel-size", 1),
                          ("--context-parallel-size", 1), ("--expert-model-parallel-size", 1),
                          ("--micro-batch-size", 1), ("--global-batch-size", None), ("--num-layers", None),
                          ("--hidden-size", None), ("--ffn-hidden-size", None), ("--num-attention-heads", None),
                          ("--num-query-groups", None), ("--seq-length", None), ("--max-position-embeddings", None),
                          ("--vocab-size", None), ("--decoder-first-pipeline-num-layers", None),
                          ("--decoder-last-pipeline-num-layers", None), ("--nnodes", None),
                          ("--nproc-per-node", None), ("--nproc_per_node", None),
                          ("--num-layers-per-virtual-pipeline-stage", None)):
        p.add_argument(flag, type=int, default=default)
    for flag in ("--use-tp-pp-dp-mapping", "--group-query-attention", "--swiglu", "--bf16", "--fp16",
                 "--untie-embeddings-and-output-weights", "--use-distributed-optimizer", "--sequence-parallel"):
        p.add_argument(flag, action="store_true")
    p.add_argument("--position-embedding-type", default="learned_absolute")
    p.add_argument("--recompute-granularity", default=None)
    return p


def read_arguments(args: list[str]) -> list[str]:
    """The argument list; a single existing file (or `@file`) is read as a shell-quoted launch line."""
    if len(args) == 1 and (args[0].startswith("@") or Path(args[0]).is_file()):
        file = Path(args[0].removeprefix("@"))
        try:
            return shlex.split(file.read_text(), comments=True)
        except (OSError, ValueError) as err:
            raise InputError(file, "<file>", f"cannot be read ({err})", "give a file of Megatron-LM arguments") from None
    return list(args)


def _stage_layers(blocks: int, pp: int, first: int | None, last: int | None) -> list[int]:
    """Workload layers per stage: blocks as Megatron-LM assigns them (even, or the first/last stage's
    count given and the rest even), plus the embedding on the first and the head on the last."""
    counts = [0] * pp
    middle = list(range(pp))
    left = blocks
    if first is not None and pp > 1:
        counts[0], left, middle = first, left - first, middle[1:]
    if last is not None and pp > 1:
        counts[-1], left, middle = last, left - last, middle[:-1]
    if middle:
        if left % len(middle):
            raise InputError(None, "--num-layers", f"{left} blocks over {len(middle)} stages", "make them divide evenly")
        for s in middle:
            counts[s] = left // len(middle)
    counts[0] += 1
    counts[-1] += 1
    return counts


def import_megatron(raw: list[str], options: ClusterOptions, failed: list[int], model: str | None = None,
                    name: str = "megatron-job") -> dict[str, Any]:
    """An instance document for the job a Megatron-LM launch line describes."""
    a, _ = _parser().parse_known_args(read_arguments(raw))
    tp, pp = a.tensor_model_parallel_size, a.pipeline_model_parallel_size
    for flag, value in (("--context-parallel-size", a.context_parallel_size),
                        ("--expert-model-parallel-size", a.expert_model_parallel_size)):
        if value != 1:
            raise InputError(None, flag, f"is {value}", "the planner models DP x PP x TP only: use 1")
    per_node = a.nproc_per_node
    world = options.world_size or (a.nnodes * per_node if a.nnodes and per_node else None)
    if world is None:
        raise InputError(None, "--world-size", "unknown", "pass --world-size, or --nnodes and --nproc-per-node")
    if world % (tp * pp):
        raise InputError(None, "--world-size", f"{world} is not a multiple of TP x PP = {tp * pp}",
                         "give the job's world size")
    if per_node:
        options = ClusterOptions(world, per_node, options.device_type, options.intra_node_gbps, options.inter_node_gbps)
    dp = world // (tp * pp)
    if model:
        workload = workload_document(model, "--model")
        blocks = workload_blocks(workload)
    else:
        needed = {"--num-layers": a.num_layers, "--hidden-size": a.hidden_size,
                  "--num-attention-heads": a.num_attention_heads, "--vocab-size": a.vocab_size}
        missing = [flag for flag, value in needed.items() if value is None]
        if missing:
            raise InputError(None, missing[0], "not given", "give it, or pass --model (catalogue name or config.json)")
        hidden = a.hidden_size
        arch = {"layers": a.num_layers, "hidden": hidden, "heads": a.num_attention_heads,
                "kv_heads": a.num_query_groups if a.group_query_attention and a.num_query_groups else None,
                "ffn": a.ffn_hidden_size or (int(8 * hidden / 3) if a.swiglu else 4 * hidden),
                "vocab": a.vocab_size, "seq_len": a.seq_length or a.max_position_embeddings or 2048,
                "gated_mlp": a.swiglu, "tied_embeddings": not a.untie_embeddings_and_output_weights,
                "learned_positions": a.position_embedding_type == "learned_absolute"}
        workload = {"inline": {"name": name, "source": "Megatron-LM arguments",
                               "architecture": {k: v for k, v in arch.items() if v is not None}}}
        blocks = a.num_layers
    layout: dict[str, Any] = {"pipeline_parallel": pp, "data_parallel": dp,
                              "order": "tp-pp-dp" if a.use_tp_pp_dp_mapping else MEGATRON_ORDER}
    if blocks is not None and pp > 1:
        layout["layers_per_stage"] = _stage_layers(blocks, pp, a.decoder_first_pipeline_num_layers,
                                                   a.decoder_last_pipeline_num_layers)
    training: dict[str, Any] = {
        "global_batch": a.global_batch_size or a.micro_batch_size * dp, "micro_batch_size": a.micro_batch_size,
        "precision": "bf16" if a.bf16 else "fp16" if a.fp16 else "fp32",
        "recomputation": a.recompute_granularity or "none", "distributed_optimizer": a.use_distributed_optimizer,
        "sequence_parallel": a.sequence_parallel}
    if a.seq_length:
        training["sequence_length"] = a.seq_length
    return {"format": 1, "name": name,
            "description": "imported from Megatron-LM arguments; device ids are Megatron-LM global ranks",
            "cluster": cluster_document(world, options), "workload": workload, "training": training,
            "plan": {"tensor_parallel": tp, "layout": layout}, "failures": failure_document(failed, world)}
