"""Published measured training runs (a folder of `<source>.json` row lists; docs/performance-model.md
gives the row format) as instances to predict.

Why: Sailor's plans are one model family on one stack. The published tables (Megatron-LM,
llm-foundry, DeepSpeed, NeMo) cover other families, sizes, layouts and GPUs, so a constant fitted
on one family can be reported on the others. Each row becomes an instance (the architecture, a
uniform TP x PP x DP plan on its GPU type, its batch and recomputation) and a measured step time in
seconds, derived from the row's own metric: the step time where printed, else tokens per second,
else its TFLOP/s under the FLOP formula its `metric_definition` names (Megatron 2021 and
DeepSpeed count the recompute forward, Megatron 2024 counts model FLOPs). A row whose setting the
model does not price is refused with the setting named (MoE, CPU offload, LoRA, fp8 without fp8
tensor cores, an unknown GPU, missing dimensions): it is never priced as something else.
Context-parallel rows (parallel.cp) are priced with training.context_parallel (each rank s / cp
tokens, the K/V ring beside the attention: PerfModel.context_parallel_exposed). fp8 rows carry their
stack's recipe (FP8_RECIPES, perf/fp8.py) and form their own families.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chameleon_opt.perf.calibration import FrameworkCalibration

SOURCES = ("megatron_lm", "llm_foundry", "deepspeed", "nemo")

NETWORKS = {  # per GPU: NCCL bus bandwidth inside a node, and the node's NICs shared per GPU
    "H100-80": {"intra_node_gbps": 360.0, "intra_node_latency_us": 5.0, "inter_node_gbps": 45.0,
                "inter_node_latency_us": 10.0},   # DGX H100: NVLink4, 8 x 400 Gb/s
    "A100-80": {"intra_node_gbps": 230.0, "intra_node_latency_us": 5.0, "inter_node_gbps": 22.0,
                "inter_node_latency_us": 10.0},   # DGX A100: NVLink3, 8 x 200 Gb/s
    "A100-40": {"intra_node_gbps": 230.0, "intra_node_latency_us": 5.0, "inter_node_gbps": 22.0,
                "inter_node_latency_us": 10.0},
    "V100-32": {"intra_node_gbps": 120.0, "intra_node_latency_us": 5.0, "inter_node_gbps": 10.0,
                "inter_node_latency_us": 10.0},   # DGX-1/2 V100: NVLink2, 100 Gb/s per GPU
    # DGX B200: NVLink5, 1.8 TB/s a GPU (900 GB/s each way: twice NVLink4's, at the H100 row's NCCL share),
    # and the DGX H100's 8 x 400 Gb/s ConnectX-7 (DGX B200 data sheet)
    "B200-180": {"intra_node_gbps": 720.0, "intra_node_latency_us": 5.0, "inter_node_gbps": 45.0,
                 "inter_node_latency_us": 10.0},
}
"""Assumed from the DGX data sheets at typical NCCL efficiency: the rows do not state their links."""


class Refused(Exception):
    """A row the model does not price, with the setting that makes it so."""


@dataclass(frozen=True)
class PublishedRun:
    id: str
    source: str          # file stem: megatron_lm, llm_foundry, deepspeed, nemo
    family: str          # model family and stack, the unit of leave-one-family-out
    gpu: str             # catalogue device type
    label: str
    document: dict[str, Any]  # the instance
    measured_step_s: float
    metric: str          # how measured_step_s was derived
    tp_comm_overlap: bool = False  # Megatron's --tp-comm-overlap stated
    attention_kernel: str | None = None  # the stack's flash-attention kernel (ATTENTION_UTILISATION); None: eager
    measured_memory_gib: float | None = None  # the row's peak memory, where it states one


class TimeRefused(Refused):
    """A row whose step time is refused while its instance and stated memory peak stand (its memory is
    still checked): `run` is the instance, its measured_step_s the converted time that is not priced."""

    def __init__(self, reason: str, run: PublishedRun) -> None:
        super().__init__(reason)
        self.run = run


def load_rows(directory: Path) -> list[dict[str, Any]]:
    rows = []
    for source in SOURCES:
        path = directory / f"{source}.json"
        if path.is_file():
            rows += [{**row, "_source": source} for row in json.loads(path.read_text())]
    return rows


A100_80GB_ANNOUNCED = "2020-11-16"
"""NVIDIA announced the A100 80 GB on 2020-11-16 (SC20); before it every A100 (DGX A100 included) had 40 GB."""


def _earliest_date(row: dict[str, Any]) -> str | None:
    """The earliest ISO date in the row's `source.file_date` (when its table was shown): the run is older."""
    import re
    found = re.findall(r"\d{4}-\d{2}-\d{2}", str(row.get("source", {}).get("file_date") or ""))
    return min(found) if found else None


def _gpu(row: dict[str, Any]) -> str:
    """The catalogue type. An A100 without a stated memory size is the 80 GB part, unless the table that
    reports it was published before that part existed: Megatron-LM's 2020 DGX-A100 rows (images/tables.tex,
    committed 2020-09-11 in 5281919) ran on 40 GB A100s. The die (and the fitted compute efficiency) is
    the same; the HBM bandwidth the memory-traffic term uses is 1555 instead of 2039 GB/s."""
    name = row["hardware"]["gpu"]
    if "H100" in name:
        return "H100-80"
    if "A100" in name:
        if "40GB" in name.replace(" ", ""):
            return "A100-40"
        if "80GB" not in name.replace(" ", "") and (_earliest_date(row) or "9999") < A100_80GB_ANNOUNCED:
            return "A100-40"
        return "A100-80"
    if "V100" in name:
        return "V100-32"
    if "B200" in name and "GB200" not in name:
        return "B200-180"  # the HGX / DGX B200 part (a GB200's B200 runs at another power and clock)
    raise Refused(f"hardware.gpu {name!r}: not in the device catalogue")


def _family(row: dict[str, Any]) -> str:
    name, source = row["model"]["name"] or "", row["_source"]
    if source == "llm_foundry":
        return "MPT (llm-foundry FSDP)"
    if source == "megatron_lm":
        if "GPT-2 style" in name:
            return "GPT-2 (Megatron 2020)"
        return "GPT (Megatron 2024, H100)" if "H100" in row["hardware"]["gpu"] else "GPT (Megatron 2021, A100)"
    if source == "deepspeed":
        return "GPT (Megatron-DeepSpeed)"
    return "NeMo"


def _attention(row: dict[str, Any]) -> tuple[str, str | None]:
    """(training.attention, flash kernel) of the row's stack. Megatron-LM's 2020 and 2021 runs predate
    FlashAttention (Dao et al., May 2022): their attention core is two batched GEMMs around Megatron's
    fused scale-mask-softmax and a dropout, which keep and re-read the a*s^2 scores (eager).
    Megatron-LM 2024 runs Transformer Engine's attention: on Hopper its fused (cuDNN) backend
    ("te-fused"). llm-foundry's benchmark sweep sets attn_impl 'triton'
    (scripts/train/benchmarking/submit_benchmarks.py): the Triton port of FlashAttention v1 (MPT's
    flash_attn_triton)."""
    source, definition = row["_source"], row["metric_definition"]
    if source == "megatron_lm" and ("2021 formula" in definition or "counted activation recompute" in definition):
        return "eager", None
    if source == "llm_foundry":
        return "flash", "flash-v1"
    if source == "deepspeed":
        return _deepspeed_attention(row)
    if CHIP[_gpu(row)] in ("H100", "B200"):
        # Transformer Engine's DotProductAttention prefers its FusedAttention (cuDNN) backend over
        # FlashAttention on Hopper and later (get_attention_backend: "Select FusedAttention for performance",
        # compute capability >= 9.0; B200 is 10.0): the cuDNN of those runs, not the FlashAttention-2 measured here
        return "flash", "te-fused"
    return "flash", "flash-v2"


def _deepspeed_attention(row: dict[str, Any]) -> tuple[str, str | None]:
    """Megatron-DeepSpeed runs flash attention only where its script passes a flash flag: the row label
    says so ('with FlashAttention 1.0.4', 'FlashAttention-2') or the script the row was inferred from
    sets --use-flash-attn-triton (the Triton port of FlashAttention v1). Otherwise (the V100 rebase
    scripts, which set no flash flag: FlashAttention needs Turing or later; 'without FlashAttention')
    the core is Megatron's eager softmax path."""
    label = str(row["source"].get("row_label") or "").lower()
    script = " ".join(str(v) for v in (row.get("inferred") or {}).values()).lower()
    if "without flashattention" in label:
        return "eager", None
    if "flashattention-2" in label:
        return "flash", "flash-v2"
    if "flashattention" in label or "flash-attn" in script:
        return "flash", "flash-v1"
    return "eager", None


def _layers_per_stage(layers: int, pp: int) -> list[int] | None:
    """Megatron-LM's split over pp stages: layers / pp transformer blocks each (it requires the
    division to be exact without its uneven-split options), the embedding on the first stage and
    the output layer on the last (megatron/core/transformer/transformer_block.py
    get_num_layers_to_build; the model's layer list is embedding, blocks, head)."""
    if pp <= 1 or layers % pp:
        return None
    counts = [layers // pp] * pp
    counts[0] += 1
    counts[-1] += 1
    return counts


GPT3_SIZES = {  # size: (layers, hidden, heads, global batch)
    "125M": (12, 768, 12, 256), "350M": (24, 1024, 16, 256), "760M": (24, 1536, 16, 256),
    "1.3B": (24, 2048, 16, 512), "2.7B": (32, 2560, 32, 512), "6.7B": (32, 4096, 32, 1024),
    "13B": (40, 5120, 40, 1024), "175B": (96, 12288, 96, 1536)}
"""The 'GPT-3 XXX' blocks Megatron-DeepSpeed's rebase scripts list (examples_deepspeed/rebase/
ds_pretrain_gpt_125M_flashattn.sh at c08e2cc2, lines 19-96; the GPT-3 paper's Table 2.1), one of which a
run uncomments: each block sets num_layers, hidden_size, num_attn_heads and global_batch_size (the
micro-batch, layout and ZeRO stage are set once, below the blocks)."""
GPT2_BPE_VOCAB = 50257
"""The GPT-2 BPE vocabulary (gpt2-vocab.json) those scripts download; Megatron pads it (_padded_vocab)."""


def _with_gpt3_dimensions(row: dict[str, Any]) -> dict[str, Any]:
    """A Megatron-DeepSpeed row that names a 'GPT-3 <size>' model but leaves its dimensions blank, with the
    configuration of that size in the script it ran. Why: the rebase README's 2.7B pair ('scaling up the
    model to 2.7B using the same script') states no dimensions, but that script lists the 2.7B block
    (32 layers, hidden 2560, 32 heads; Megatron's default FFN of 4 x hidden, the GPT-2 vocabulary). The
    block also sets global_batch_size 512 (and a later uncommented block overrides an earlier one), so a
    global batch the row only carries over from another run ('same', the 125M's 256) is the block's;
    Megatron-DeepSpeed's printed TFLOP/s counts that batch (utils.py throughput_calculator: micro-batch
    x micro-batches x DP), so the step time it converts to doubles. Every other row is returned as it is."""
    m = row["model"]
    found = re.fullmatch(r"GPT-3 (\S+)", str(m.get("name") or ""))
    if row["_source"] != "deepspeed" or not found or found.group(1) not in GPT3_SIZES or m.get("layers"):
        return row
    layers, hidden, heads, global_batch = GPT3_SIZES[found.group(1)]
    model = {**m, "layers": layers, "hidden": hidden, "heads": heads, "ffn_hidden": 4 * hidden,
             "vocab": m.get("vocab") or GPT2_BPE_VOCAB}
    batch = row["batch"]
    if "batch.global_batch" in (row.get("inferred") or {}) or not batch.get("global_batch"):
        batch = {**batch, "global_batch": global_batch}
    return {**row, "model": model, "batch": batch}


DEEPSPEED_CHECKPOINTING_AB = "Notes/TODOs"
"""The section of Megatron-DeepSpeed's rebase README (examples_deepspeed/rebase/README.md at c08e2cc2,
'Notes/TODOs', Aug 2023 update) whose sentence compares DeepSpeed's and Megatron-LM's activation
checkpointing on one DGX-2 (GPT-3 1.3B, 16 V100, TP2 DP8, micro-batch 2): 'older 23.11 TFLOPs newer
17.26 TFLOPs', 'older max allocated 15241 MB, newer 12924 MB'. Its memory peaks confirm the layout
(14.88 / 12.62 GiB against 14.35 predicted) and its two TFLOP/s are one step time (23.11 / 17.26 = 4/3,
_megatron_deepspeed_passes), but that step is not the stack's speed on that setting: the same team's
GPT-3 1.3B baseline, same stack, script and data (examples_deepspeed/data_efficiency/gpt/pretrain/
ds_pretrain_gpt_1.3B_dense_base_script.sh: fp16, --checkpoint-activations, the Pile from the same blob
path with num_workers 0, optimizer-state logging; TP1 ZeRO-1 DP64, micro-batch 8, global batch 512),
took 260 h for 300B tokens on 64 V100 (microsoft/DeepSpeed docs/_posts/2022-12-12-data-efficiency.md,
Table 7): at least 5008 tokens/s a GPU, 59.6 TFLOP/s under the same printed formula, against the A/B's
1943 tokens/s (23.11): 2.58x faster for 260 hours, evaluations and checkpoints included. The README's
13B on the same DGX-2s prints 55.6, Megatron-LM's 2020 V100 table 52-72. The model prices the A/B's
setting at 57.5 TFLOP/s and the 260-hour run's at 53.2 (at least 12% slow); nothing in the two A/B scripts (one
through DeepSpeed's engine, one through Megatron-LM alone, equal to 0.4%) costs a factor of 2.5, and no
log of them is published. A relative comparison whose absolute speed the stack's own long run
contradicts is not a measurement of the setting."""


def _refuse_unsupported(row: dict[str, Any]) -> None:
    p = row["parallel"]
    section = str(row["source"].get("section") or "")
    label = str(row["source"].get("row_label") or "")
    if "lora" in label.lower():
        raise Refused("LoRA fine-tuning: only the adapters train (no weight gradients or optimizer state for the "
                      "base model), which the model does not price")
    if row["_source"] == "nemo" and section.lower().startswith("finetuning"):
        raise Refused("NeMo fine-tuning on SQuAD packed to the sequence length: attention runs over each packed "
                      "sample, whose lengths the row does not state, so a full causal sequence would misprice it")
    if (p.get("ep") or 1) > 1 or "mixtral" in (row["model"]["name"] or "").lower():
        raise Refused("mixture of experts (parallel.ep / Mixtral): not modelled")
    notes = " ".join(str(x) for x in (p.get("notes"), row.get("activation_checkpointing"), row.get("notes")))
    if "offload" in notes.lower() and "activation_cpu_offload=false" not in notes.lower().replace(" ", ""):
        raise Refused("CPU offload of ZeRO-3 state / activations: not validated")
    if row["measured"].get("oom"):
        raise Refused("measured.oom: the run ran out of memory, so there is no step time to price")
    m = row["model"]
    missing = [k for k in ("layers", "hidden", "ffn_hidden", "vocab", "seq_len") if not m.get(k)]
    if missing:
        raise Refused(f"model.{missing[0]} not stated")
    layout = {k: str(v) for k, v in (row.get("inferred") or {}).items() if k in ("parallel.tp", "parallel.pp")}
    if any(v.lower().startswith("assumed same") for v in layout.values()):
        # Megatron-LM's 2024 strong-scaling endpoints (96 and 4608 GPUs at one batch): the layout is what
        # such a sweep changes, and the source states none (transcribed as the 177B weak-scaling row's).
        raise Refused("parallel.tp/pp assumed from another row: the source states no layout for this run")
    if "model.name" in (row.get("inferred") or {}):
        # The source names no model (DeepSpeed4Science's long-sequence table): its dimensions are a
        # transcriber's match to a script, so an error would measure the guess, not the model.
        raise Refused("model.name inferred: the source names no model, its dimensions are a guess")


FP8_RECIPES = {
    # NeMo 24.07's GPT / Llama configs: fp8 with fp8_hybrid (E4M3 forward, E5M2 gradients) through
    # Transformer Engine's DelayedScaling (amax history); Megatron-core's TE layers keep the cast weights
    # across micro-batches (is_first_microbatch).
    "nemo": {"recipe": "delayed", "weight_cast": "per_step"},
    # Megatron-LM's Llama 3 FP8 examples: --fp8-format hybrid, the delayed recipe (its default), the same TE layers.
    "megatron_lm": {"recipe": "delayed", "weight_cast": "per_step"},
    # Composer's amp_fp8 wraps the forward in TE's fp8_autocast with a DelayedScaling(HYBRID) recipe; MPT's
    # TE linears are called without is_first_microbatch, so the weights are cast on every forward (assumed
    # from Composer's and llm-foundry's code: neither passes it).
    "llm_foundry": {"recipe": "delayed", "weight_cast": "per_micro_batch"},
}
"""The fp8 recipe each source's stack runs (perf/fp8.py models delayed scaling only)."""


NEMOTRON_VOCAB = 256000
"""Nemotron's SentencePiece vocabulary: nemotron/nemotron_340b.yaml (NeMo-Framework-Launcher tag 24.07) names
nemotron_2_256k.model; the 8B and 22B configs leave the tokenizer model to the user, and the NeMo rows' own cells
pin it: Model TFLOP/s / tokens/s is NeMo's model FLOPs per token, 51.41 G (Nemotron-8B) and 130.33 G (22B),
which Megatron 2024's formula (not gated) gives with 256,000 (51.39 G, 130.23 G) and not with GPT-2's 50,257
(44.9 G, 124.0 G)."""


STACK_CONFIGS = {
    # NeMo 24.07's pretraining table (docs/source/performance/performance_summary.md) ran NeMo-Framework-Launcher's
    # training configs (launcher_scripts/conf/training/ at 1a7171d7, 2024-07-17), whose TP / PP / VP / micro-batch
    # are the rows': llama/llama2_70b.yaml (TP4 PP4 VP20) sets sequence_parallel and ub_tp_comm_overlap (TE
    # userbuffers); llama/llama2_13b.yaml (TP1 PP4 VP10) neither; gpt3/175b.yaml (TP4 PP8 VP6, micro-batch 1)
    # sequence_parallel only; gpt3/175b_mlperf.yaml (121c975d, 2024-07-18: 64 nodes, micro-batch 2, the 512-GPU row
    # whose cell links to MLPerf) both. The GPT-3 configs tokenize with Megatron's GPT2BPETokenizer (the GPT-2
    # vocabulary the rows leave blank). Every one of them sets overlap_p2p_comm (the model's interleaved pricing).
    ("nemo", "Pretraining (NeMo 24.07", "LLAMA2-70B", 1): {"sequence_parallel": True, "tp_comm_overlap": True},
    ("nemo", "Pretraining (NeMo 24.07", "LLAMA2-13B", 1): {"sequence_parallel": False, "tp_comm_overlap": False},
    # llama/llama3_70b.yaml (TP4 PP4 CP2) sets both in every version from 1a7171d7 (where VP is 10) to 3dd35614
    # (VP 5, the row's); llama/llama3_8b.yaml (TP1 CP2) neither.
    ("nemo", "Pretraining (NeMo 24.07", "LLAMA3-70B", 1): {"sequence_parallel": True, "tp_comm_overlap": True},
    ("nemo", "Pretraining (NeMo 24.07", "LLAMA3-8B", 1): {"sequence_parallel": False, "tp_comm_overlap": False},
    # Sizes the rows name without dimensions take their launcher config's (tag 24.07,
    # launcher_scripts/conf/training/): gpt3/5b.yaml (24 layers, hidden 4096, 32 heads, FFN 4 x hidden, micro-batch 4,
    # TP1) and gpt3/20b.yaml (44, 6144, 48, 4 x hidden; micro-batch 2, TP2, sequence_parallel, ub_tp_comm_overlap):
    # GPT2BPETokenizer, learned positions, GeLU. nemotron/nemotron_8b.yaml (32, 4096, 32 heads, FFN 16384) and
    # nemotron_22b.yaml (40, 6144, 48, 24576; overlap_p2p_comm): squared-ReLU MLP (two matrices, not gated), RoPE,
    # untied embeddings, sequence_parallel and ub_tp_comm_overlap. The Nemotron configs' micro-batches (2, 1) are
    # not the rows' (4, 2): the launcher's fp8 examples (examples/training/nemotron/h100/nemotron_{8b,22b}_fp8.sh)
    # override only the batch sizes, node count and fp8 flags, so the config's other settings stand.
    ("nemo", "Pretraining (NeMo 24.07", "GPT3-5B", 4): {
        "sequence_parallel": False, "tp_comm_overlap": False,
        "model": {"layers": 24, "hidden": 4096, "heads": 32, "ffn_hidden": 16384, "vocab": GPT2_BPE_VOCAB}},
    ("nemo", "Pretraining (NeMo 24.07", "GPT3-20B", 2): {
        "sequence_parallel": True, "tp_comm_overlap": True,
        "model": {"layers": 44, "hidden": 6144, "heads": 48, "ffn_hidden": 24576, "vocab": GPT2_BPE_VOCAB}},
    ("nemo", "Pretraining (NeMo 24.07", "Nemotron-8B", 4): {
        "sequence_parallel": True, "tp_comm_overlap": True, "rope": True,
        "model": {"layers": 32, "hidden": 4096, "heads": 32, "ffn_hidden": 16384, "vocab": NEMOTRON_VOCAB}},
    ("nemo", "Pretraining (NeMo 24.07", "Nemotron-22B", 2): {
        "sequence_parallel": True, "tp_comm_overlap": True, "rope": True,
        "model": {"layers": 40, "hidden": 6144, "heads": 48, "ffn_hidden": 24576, "vocab": NEMOTRON_VOCAB}},
    # nemotron/nemotron_340b.yaml sets overlap_p2p_comm False beside its interleaved schedule (and PP12 VP8, not
    # the row's PP8 VP12): its pipeline sends block, which the model's interleaved pricing does not model.
    ("nemo", "Pretraining (NeMo 24.07", "Nemotron-340B", 1): {
        "refused": "Nemotron-340B: its launcher config (nemotron/nemotron_340b.yaml, tag 24.07) runs the interleaved "
                   "schedule with overlap_p2p_comm False (blocking sends), which the model does not price"},
    ("nemo", "Pretraining (NeMo 24.07", "GPT3-175B", 1): {"sequence_parallel": True, "tp_comm_overlap": False,
                                                          "vocab": GPT2_BPE_VOCAB},
    ("nemo", "Pretraining (NeMo 24.07", "GPT3-175B", 2): {"sequence_parallel": True, "tp_comm_overlap": True,
                                                          "vocab": GPT2_BPE_VOCAB},
    # Megatron-LM's Llama 3 FP8 table "follows NeMo Framework's performance scripts" (examples/llama/README.md):
    # NeMo's scripts/performance/llm/pretrain_llama3_70b.py asserts the comm-overlap callback ("Required for
    # performance") and gives it TE userbuffers for H100 fp8 TP4 (userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192);
    # Megatron's tp_comm_overlap requires sequence parallelism.
    ("megatron_lm", "FP8 Performance", "LLAMA3-70B", 1): {"sequence_parallel": True, "tp_comm_overlap": True},
}
"""Settings a row does not state but its stack's own configuration for that model, layout and micro-batch does,
keyed by (source, section prefix, model name, micro-batch size): also the dimensions of a model the row names
without them ("model"), RoPE instead of learned positions ("rope"), or why the stack's setting is refused."""


def _stack_config(row: dict[str, Any]) -> dict[str, Any]:
    """The row's STACK_CONFIGS entry, {} where none applies."""
    section = str(row["source"].get("section") or "")
    mbs = row["batch"].get("micro_batch") or 1
    return next((v for (source, prefix, name, micro), v in STACK_CONFIGS.items()
                 if row["_source"] == source and section.startswith(prefix) and row["model"]["name"] == name
                 and mbs == micro), {})


def _fp8(row: dict[str, Any], gpu: str) -> dict[str, str] | None:
    """The row's training.fp8, None for a bf16 row; Refused where fp8 runs on a device without fp8 tensor
    cores or through a recipe the model does not price."""
    if "fp8" not in str(row["precision"] or "").lower():
        return None
    from chameleon_opt.instance.devices import CATALOGUE
    if CATALOGUE[gpu].fp8_peak_tflops is None:
        raise Refused(f"precision {row['precision']!r} on {gpu}: the device has no fp8 tensor cores")
    recipe = FP8_RECIPES.get(row["_source"])
    if recipe is None:
        raise Refused(f"precision {row['precision']!r}: the stack's fp8 recipe is not known")
    return recipe


def _flops_2021(b: int, s: int, layers: int, h: int, vocab: int, passes: int = 4) -> float:
    """Megatron-LM 2021 (SC'21 Eq. 3, Narayanan et al.): 24 * passes * B*s*l*h^2 * (1 + s/6h + V/16lh).
    passes = 4 (forward, recompute forward, backward counted as two) when every block is checkpointed,
    3 without recomputation: 96 = 24 * 4 is the paper's full-recompute case."""
    return 24.0 * passes * b * s * layers * h * h * (1 + s / (6 * h) + vocab / (16 * layers * h))


def _padded_vocab(vocab: int, tp: int, divisible_by: int = 128) -> int:
    """Megatron pads the vocabulary to a multiple of 128 x TP (--make-vocab-size-divisible-by 128, its
    default) so the output layer splits evenly; Megatron-DeepSpeed's printed TFLOP/s uses the padded size."""
    step = divisible_by * tp
    return -(-vocab // step) * step


def _megatron_deepspeed_passes(row: dict[str, Any]) -> int:
    """Passes Megatron-DeepSpeed's printed TFLOP/s counts: 4 under --checkpoint-activations (DeepSpeed's
    checkpointing, its scripts' default), 3 otherwise. Its 2023 throughput calculation tests that flag
    (and selective granularity), not Megatron-LM's --recompute-granularity full, so a run recomputing
    through the Megatron-LM flags is printed at 3 passes although it recomputes: the rebase README's
    1.3B pair, same plan, prints 23.11 (DeepSpeed checkpointing) and 17.26 (--recompute-granularity
    full) TFLOP/s, a ratio of 1.339 = 4/3 to 0.4%: the same step time."""
    ac = str(row.get("activation_checkpointing") or "none").lower()
    if "--recompute-granularity full" in ac:
        return 3
    return 4 if ac.startswith(("full", "selective", "activation")) else 3


def _flops_2024(b: int, s: int, m: dict[str, Any]) -> float:
    """Megatron-LM 2024 num_floating_point_operations: model FLOPs, no recompute term."""
    h, layers, heads = m["hidden"], m["layers"], m["heads"]
    kv = m.get("kv_heads") or heads
    gated = 1.5 if _gated(m) else 1.0
    return 12.0 * b * s * layers * h * h * ((1 + kv / heads + s / h) + m["ffn_hidden"] / h * gated
                                            + m["vocab"] / (2 * layers * h))


H100_DENSE_BF16_TFLOPS = 989.4
"""NVIDIA H100 SXM data sheet: dense BF16 tensor-core peak (1979 with sparsity)."""


def _gated(m: dict[str, Any]) -> bool:
    return "llama" in (m.get("name") or "").lower()


def _measured(row: dict[str, Any], global_batch: int, gpus: int) -> tuple[float, str]:
    me, m, s = row["measured"], row["model"], row["model"]["seq_len"]
    if me.get("step_time_s"):
        return float(me["step_time_s"]), "step time printed"
    if me.get("tokens_per_s_per_gpu"):
        return global_batch * s / (me["tokens_per_s_per_gpu"] * gpus), "tokens/s/GPU"
    tflops = me.get("tflops_per_gpu")
    definition = row["metric_definition"]
    if tflops and "96*B*s*l*h^2" in definition.replace(" ", ""):
        flops = _flops_2021(global_batch, s, m["layers"], m["hidden"], m["vocab"])
        return flops / (tflops * 1e12 * gpus), "TFLOP/s, Megatron 2021 formula (recompute counted)"
    if tflops and "printed by megatron-deepspeed" in definition.lower():
        tp = int(row["parallel"].get("tp") or 1)
        flops = _flops_2021(global_batch, s, m["layers"], m["hidden"], _padded_vocab(m["vocab"], tp),
                            _megatron_deepspeed_passes(row))
        return flops / (tflops * 1e12 * gpus), "TFLOP/s, Megatron-DeepSpeed formula (padded vocab)"
    nemo = row["_source"] == "nemo" and any(k in definition.lower() for k in ("analytical model-flops formula",
                                                                            "nemo model flops"))
    if tflops and ("num_floating_point_operations" in definition or nemo):
        # NeMo's model FLOPs are Megatron 2024's (its Llama 2 7B pretraining row: 780 TFLOP/s at 16,934
        # tokens/s is 46.06 GFLOP per token; the formula gives 46.08).
        return _flops_2024(global_batch, s, m) / (tflops * 1e12 * gpus), "TFLOP/s, Megatron 2024 model FLOPs"
    if me.get("mfu_pct") and "num_floating_point_operations" in definition and "H100 bf16 dense peak" in definition:
        # Megatron-LM's 2024 strong-scaling rows state only an MFU (whole percent) of the same model FLOPs
        # against the H100's dense bf16 peak, which its weak-scaling rows pin (408.8 TFLOP/s = 41%).
        achieved = me["mfu_pct"] / 100 * H100_DENSE_BF16_TFLOPS
        return _flops_2024(global_batch, s, m) / (achieved * 1e12 * gpus), "MFU, Megatron 2024 model FLOPs"
    raise Refused(f"metric: no step time, tokens/s or TFLOP/s with a stated formula ({definition[:60]}...)")


def _torch_early_stop(row: dict[str, Any]) -> bool:
    """Whether an llm-foundry row's activation checkpointing stops its recompute early
    (Training.recompute_early_stop). Every benchmark run checkpoints through torch's non-reentrant
    checkpoint (mosaicml/llm-foundry scripts/train/benchmarking/submit_benchmarks.py at 300cc5c58 sets
    fsdp_config.activation_checkpointing_reentrant False; from b2a43a147 the yamls/pretrain/mpt-*.yaml
    do; Composer's own default is reentrant), whose early stop exists from torch 2.1 (pytorch#96866,
    default on). The README's Precision cell tells the two sweeps apart: "bf16" (with PURE) rows are
    the May 2023 sweep (sweep.sh at 300cc5c58: image mosaicml/pytorch:1.13.1), "amp_bf16" / "amp_fp8"
    (with DEFAULT) rows the October 2023 and January 2024 sweeps (b2a43a147, 5e85bd62d:
    mosaicml/pytorch:2.1.0)."""
    precision = str((row.get("raw") or {}).get("Precision") or row.get("precision") or "")
    return precision.startswith("amp_")


FOUNDRY_FP32_REDUCE_SECTIONS = ("H100 80GB BF16 (Large Scale",)
"""llm-foundry README tables (section prefixes) whose DEFAULT-mode runs reduce-scatter their gradients in fp32.
Composer's get_mixed_precision (composer/trainer/mosaic_fsdp_utils.py) gives DEFAULT param_dtype = the autocast
precision and, up to 0.16.3, no reduce_dtype (torch's MixedPrecision then reduces in param_dtype, bf16);
mosaicml/composer d745fcb1b ('patch default', 2023-10-10, first released in 0.16.4 on 2023-10-11) sets
reduce_dtype = torch.float32. The Large Scale table (5e85bd62d, 2024-01-06) ran llm-foundry's main branch
with its gpu-flash2 extra (submit_benchmarks.py run_config: git_branch 'main', pip_install '.[gpu-flash2]'),
which main has from ba6b88037 (2023-10-10) on, pinning mosaicml>=0.16.3,<0.17 (0.16.4, the newest such,
from 2023-10-11), >=0.16.4 by 2023-10-20 and >=0.17 from v0.4.0 (2023-11-21): fp32. The October 2023
tables (b2a43a147: H100 80GB BF16 / FP8, A100 80GB amp_bf16) ran the v0.3.0 tag, which mosaicml>=0.16.3,<0.17: 0.16.3 or 0.16.4 by the day of the run, which no source states, so they keep the
parameter dtype (docs/performance-model.md gives them both ways). PURE (the May 2023 rows) reduces in bf16."""


def _foundry_reduce_bytes(row: dict[str, Any]) -> float | None:
    """Bytes per parameter of an llm-foundry row's gradient reduce-scatter where it differs from the parameter
    precision (FOUNDRY_FP32_REDUCE_SECTIONS: 4 for fp32), else None."""
    mode = str((row.get("raw") or {}).get("MP Mode") or "").upper()
    section = str(row["source"].get("section") or "")
    if mode == "DEFAULT" and section.startswith(FOUNDRY_FP32_REDUCE_SECTIONS):
        return 4.0
    return None


def _table(row: dict[str, Any]) -> tuple[str, str, str]:
    """(source, source.path, source.section): the published table a row belongs to, as the table sets
    (NEMO_2_TABLES, DISTRIBUTED_OPTIMIZER_TABLES, STATED_LAYOUT_TABLES) name it."""
    cited = row["source"]
    return row["_source"], str(cited.get("path") or ""), str(cited.get("section") or "")


NEMO_2_TABLES = frozenset({("nemo", "docs/source/performance/performance_long_sequence.md", "LLAMA3-8B (FP8) - B200")})
"""Published NeMo tables run on NeMo 2.0 (Megatron-Core's optimizer and DDP, not NeMo 1.x's Apex optimizer)."""
NEMO_2_GRAD_BYTES = 4.0
"""Gradient bytes per parameter of NeMo 2.0's Llama 3 recipes: their DistributedDataParallelConfig sets
grad_reduce_in_fp32=True (nemo/collections/llm/recipes/llama3_8b.py at 19fadb67), so Megatron-Core keeps the
main gradients in fp32 and reduce-scatters them in fp32; its optimizer state stays Megatron's 12 bytes."""


DISTRIBUTED_OPTIMIZER_TABLES: frozenset[tuple[str, str, str]] = frozenset({
    # (source, source.path, source.section) of tables every row of which ran such a recipe. Each shards
    # the fp32 master weights and Adam moments over the data-parallel x context-parallel group and
    # overlaps the parameter all-gather with the next forward.
    #
    # NVIDIA/NeMo-Framework-Launcher tag 24.07, launcher_scripts/conf/training/<family>/<model>.yaml:
    # optim.name distributed_fused_adam, overlap_param_sync true (llama/llama3_8b.yaml lines 147, 155;
    # llama/llama2_7b.yaml 150, 158; the same in gpt3/{5b,20b,175b}, nemotron/*, llama2_13b/70b,
    # llama3_70b); its examples/training/llama/h100/*_fp8.sh run those configs.
    ("nemo", "docs/source/performance/performance_summary.md", "Pretraining (NeMo 24.07 container, DGX-H100, FP8)"),
    # NeMo 24.03.01 container: NeMo-Framework-Launcher tag 24.03.01,
    # launcher_scripts/conf/training/llama/llama2_7b.yaml lines 143 (distributed_fused_adam), 151
    # (overlap_param_sync true).
    ("nemo", "docs/source/performance/performance_long_sequence.md", "LLAMA2-7B (FP8) - H100"),
    # NVIDIA/Megatron-LM at d98e8a64: LLAMA3-8B's script examples/llama/train_llama3_8b_h100_fp8.sh
    # lines 126-128: --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
    # (arguments.py: --use-distributed-optimizer is store_true, off unless given). The 70B and 405B
    # rows have no script; the README (line 101) says the table follows NeMo's scripts/performance,
    # whose pretrain_llama3_70b.py / pretrain_llama31_405b.py (NVIDIA/NeMo at 1b458635, line 57) run
    # pretrain_recipe(performance_mode=True): recipes/llama3_70b.py line 194 and llama31_405b.py
    # line 201 take distributed_fused_adam_with_cosine_annealing (recipes/optim/adam.py line 47:
    # use_distributed_optimizer=True), overlap_param_gather=True (lines 120, 128).
    ("megatron_lm", "examples/llama/README.md", "FP8 Performance"),
    # NeMo 2.0 (the B200 table's NeMo25.04.rc2 container): NVIDIA/NeMo at 19fadb67 (the table's own commit),
    # nemo/collections/llm/recipes/llama3_8b.py: pretrain_recipe's optim is
    # distributed_fused_adam_with_cosine_annealing (recipes/optim/adam.py line 47: use_distributed_optimizer=True),
    # its trainer's DistributedDataParallelConfig overlap_grad_reduce and overlap_param_gather True.
    ("nemo", "docs/source/performance/performance_long_sequence.md", "LLAMA3-8B (FP8) - B200"),
})
"""Published tables whose runs used Megatron's distributed optimizer (NeMo 1.x: its
MegatronDistributedFusedAdam, nemo/core/optim/distributed_adam.py, shards over
get_data_parallel_group(with_context_parallel=True)), by the source's recipe, not the row's notes."""


NEMO_1X_OPTIMIZER_BYTES = 10.0
"""Optimizer bytes per parameter of NeMo 1.x's distributed Adam on a bf16 model (NeMo 24.03 / 24.07 launcher
configs: distributed_fused_adam, megatron_amp_O2, no fp8_params): nemo/collections/nlp/models/language_modeling/
megatron_base_model.py (v1.23.0 lines 744-752, v2.0.0rc0 784-792) sets store_params False and
store_param_remainders True when the optimizer is fp32 and the model bf16, so Apex's DistributedFusedAdam
keeps the fp32 moments (4 + 4) and the low 16 bits of each fp32 master weight (2), whose high half is the
bf16 parameter itself: 10, not Megatron's 12."""


def _optimizer_bytes(row: dict[str, Any]) -> dict[str, Any]:
    """Optimizer-state bytes of a row with the distributed optimizer where its stack's code sets them
    ({} keeps the default 12: Megatron-Core's fp32 master weights and moments). NeMo 1.x on a bf16 model:
    parameter remainders (NEMO_1X_OPTIMIZER_BYTES). Its gradients stay in bf16 (the default): every H100
    fp8 example script of the launcher (examples/training/{llama,gpt}/h100/*_fp8.sh at tags 24.03.01 and
    24.07) passes +training.model.optim.grad_sync_dtype=bf16, without which Apex's DistributedFusedAdam
    keeps its contiguous gradient buffer in the fp32 optimizer dtype. NeMo 2.0 (NEMO_2_TABLES): Megatron-Core's
    12 bytes, fp32 gradients (NEMO_2_GRAD_BYTES)."""
    precision = str(row.get("precision") or "bf16").lower().split()[0]
    if _table(row) in NEMO_2_TABLES:
        return {"grad_bytes_per_param": NEMO_2_GRAD_BYTES}
    if row["_source"] == "nemo" and _distributed_optimizer(row) and precision in ("bf16", "fp8"):
        return {"optimizer": {"state_bytes_per_param": NEMO_1X_OPTIMIZER_BYTES}}
    return {}


def _distributed_optimizer(row: dict[str, Any]) -> bool:
    """Whether the row's run used Megatron's distributed optimizer with the parameter all-gather
    overlapped (DISTRIBUTED_OPTIMIZER_TABLES), or its notes name --overlap-param-gather, which
    Megatron-LM accepts only with --use-distributed-optimizer (arguments.py)."""
    if "--overlap-param-gather" in str(row["parallel"].get("notes") or ""):
        return True
    return _table(row) in DISTRIBUTED_OPTIMIZER_TABLES


STATED_LAYOUT_TABLES: frozenset[tuple[str, str, str]] = frozenset({
    # NVIDIA/NeMo docs/source/performance/performance_long_sequence.md: the B200 table's first version
    # (14d427f5, 2025-04-28) printed '# of GPUs' 2, 4, 8, ..., 256, each = TP x CP x DP of its row; the next
    # (19fadb67, 2025-05-08: "Add without CP numbers for B200") printed 8, 16, ..., 1024 beside the same TP,
    # CP, DP, batch and with-CP TFLOPS / GPU cells, so every row's layout covers a quarter of its GPU count.
    ("nemo", "docs/source/performance/performance_long_sequence.md", "LLAMA3-8B (FP8) - B200"),
})
"""(source, source.path, source.section) of tables whose rows state a data-parallel size contradicting their
GPU count where an earlier version of the same table printed a GPU count equal to the stated layout: their
runs are priced on TP x PP x CP x DP GPUs (the layout as stated). Any other row whose stated DP contradicts
its GPU count is refused. Why not the GPU count: DP is what both versions print; a per-GPU rate of one layout
hardly depends on DP (PP 1: only the gradient reduction's share of the step), which validate_perf checks
by pricing these rows both ways."""


def _layout_gpus(row: dict[str, Any], tp: int, pp: int, cp: int) -> int:
    """The GPUs the row's run used: hardware.num_gpus, or TP x PP x CP x DP where its stated DP contradicts
    that and its table is in STATED_LAYOUT_TABLES (Refused where it is not)."""
    p, gpus = row["parallel"], int(row["hardware"]["num_gpus"] or 0)
    stated = None if p.get("fsdp") or "parallel.dp" in (row.get("inferred") or {}) else p.get("dp")
    if not stated or not gpus or int(stated) * tp * pp * cp == gpus:
        return gpus
    if _table(row) in STATED_LAYOUT_TABLES:
        return int(stated) * tp * pp * cp
    raise Refused(f"parallel.dp {stated}: TP x PP x CP x DP = {int(stated) * tp * pp * cp} GPUs, not "
                  f"hardware.num_gpus {gpus} (the row's layout contradicts its GPU count)")


def to_run(row: dict[str, Any]) -> PublishedRun:
    """The row as an instance and a measured step time (Refused when it cannot be priced faithfully)."""
    row = _with_gpt3_dimensions(row)
    stack = _stack_config(row)
    if stack.get("refused"):
        raise Refused(stack["refused"])
    if stack.get("vocab") and not row["model"].get("vocab"):
        row = {**row, "model": {**row["model"], "vocab": stack["vocab"]}}
    if stack.get("model"):
        row = {**row, "model": {**row["model"], **{k: v for k, v in stack["model"].items() if not row["model"].get(k)}}}
    _refuse_unsupported(row)
    gpu = _gpu(row)
    fp8 = _fp8(row, gpu)
    m, p, b, hw = row["model"], row["parallel"], row["batch"], row["hardware"]
    tp, pp, cp = int(p.get("tp") or 1), int(p.get("pp") or 1), int(p.get("cp") or 1)
    gpus = _layout_gpus(row, tp, pp, cp)
    if not gpus or gpus % (tp * pp * cp):
        raise Refused("hardware.num_gpus not a multiple of TP x PP x CP")
    dp = gpus // (tp * pp * cp)  # Megatron: world = tp x cp x pp x dp
    mbs = b.get("micro_batch") or 1
    global_batch = b.get("global_batch") or mbs * dp * (b.get("grad_accum") or 1)
    if global_batch % (mbs * dp):
        raise Refused("batch.global_batch not a whole number of micro-batches per replica")
    vp = int(p.get("vp") or 1)
    if vp > 1 and (global_batch // (mbs * dp)) % pp:
        # Megatron-LM's interleaved schedule runs micro-batches in groups of PP (microbatch_group_size_per_vp_stage's
        # default) and raises unless the count is a multiple of it (schedules.py, forward_backward_pipelining_with_interleaving)
        raise Refused(f"parallel.vp {vp}: micro-batches per replica not a multiple of parallel.pp {pp}, which "
                      "Megatron's interleaved schedule refuses at its default group size (the row states none)")
    if vp > 1 and m["layers"] % (pp * vp):
        # the model splits each device's layers evenly over its v chunks, as Megatron's
        # --num-layers-per-virtual-pipeline-stage does (arguments.py asserts the division)
        raise Refused(f"parallel.vp {vp}: model.layers {m['layers']} not a multiple of pp x vp, so the chunks are "
                      "uneven (a pipeline layout the row does not state)")
    ac = str(row.get("activation_checkpointing") or "none").lower()
    source = row["_source"]
    definition = row["metric_definition"]
    if source == "megatron_lm" and ("2021 formula" in definition or "counted activation recompute" in definition):
        ac = "full" if ac == "none" else ac  # the 2020/2021 Megatron runs checkpoint every block
    recomputation = "full" if ac.startswith("full") or ac.startswith("activation") else (
        "selective" if ac.startswith("selective") else "none")
    zero = p.get("zero_stage") or 0
    notes = str(p.get("notes") or "")
    sharded: dict[str, Any] = {}
    if source == "llm_foundry":
        # PyTorch FSDP shards parameters, gradients and optimizer state under both strategies;
        # SHARD_GRAD_OP keeps the gathered parameters from forward to backward (torch FSDP docs).
        # Mixed precision: DEFAULT and PURE gather bf16 parameters (2 bytes, the parameter precision); the
        # gradients' reduce dtype depends on the Composer release (_foundry_reduce_bytes).
        zero = 3
        sharded["reshard_after_forward"] = p.get("sharding_strategy") != "SHARD_GRAD_OP"
        reduce = _foundry_reduce_bytes(row)
        if reduce is not None:
            sharded["reduce_bytes_per_param"] = reduce
        sharded["recompute_early_stop"] = _torch_early_stop(row)
        sharded["kernels"] = "llm-foundry"  # MPT's saved tensors and fused loss (activations.LLM_FOUNDRY)
    elif _distributed_optimizer(row):
        zero = max(zero, 1)
        sharded["overlap_param_gather"] = True
        sharded.update(_optimizer_bytes(row))
    attention, kernel = _attention(row)
    per_node = min(int(hw.get("gpus_per_node") or 8), gpus)
    gated = _gated(m)
    # Heads unstated (Megatron's 2021 table): h / 128, which changes no FLOP and, under flash
    # attention, no byte the model counts beyond the log-sum-exp.
    heads = m.get("heads") or max(m["hidden"] // 128, 1)
    architecture = {"layers": m["layers"], "hidden": m["hidden"], "heads": heads, "ffn": m["ffn_hidden"],
                    "vocab": m["vocab"], "seq_len": m["seq_len"], "gated_mlp": gated,
                    "learned_positions": not gated and not stack.get("rope"), **({"kv_heads": m["kv_heads"]} if m.get("kv_heads") else {})}
    from chameleon_opt.instance.devices import CATALOGUE
    device = CATALOGUE[gpu]
    overlap = "--tp-comm-overlap" in notes or stack.get("tp_comm_overlap", False)
    # Megatron-LM refuses --tp-comm-overlap without --sequence-parallel (training/arguments.py, r0.8.0 at
    # 8a78edd line 203: "Tensor parallel communication/GEMM overlap can happen only when sequence
    # parallelism is enabled"), so a row that states the overlap ran sequence parallel.
    sequence_parallel = bool(p.get("sequence_parallel") or stack.get("sequence_parallel") or overlap) and tp > 1
    # DeepSpeed's engine all-reduces (ZeRO-0) or reduce-scatters (ZeRO-1 without overlap_comm, its
    # default) the gradients at the accumulation boundary, after the last backward: not overlapped.
    document = {
        "format": 1, "name": row["id"],
        "cluster": {"nodes": gpus // per_node, "devices_per_node": per_node,
                    "device_type": {"name": gpu, "memory_gib": device.memory_gib, "peak_tflops": device.peak_tflops,
                                    "fp8_peak_tflops": device.fp8_peak_tflops,
                                    "efficiency": device.efficiency,
                                    "memory_bandwidth_gbps": device.memory_bandwidth_gbps},
                    "network": NETWORKS[gpu]},
        "workload": {"inline": {"name": row["id"], "architecture": architecture}},
        "training": {"global_batch": global_batch, "micro_batch_size": mbs, "sequence_length": m["seq_len"],
                     "recomputation": recomputation, "zero_stage": zero, "attention": attention,
                     "sequence_parallel": sequence_parallel,
                     "context_parallel": cp, "overlap_grad_reduce": source != "deepspeed", "virtual_stages": vp,
                     **sharded, **({"fp8": fp8} if fp8 else {})},
        "plan": {"tensor_parallel": tp, "layout": {"pipeline_parallel": pp, "data_parallel": dp}},
    }
    # Megatron-DeepSpeed's GPTModelPipe partitions by 'type:transformer' (blocks evenly, the embedding
    # with the first and the tied head with the last): the same split as Megatron-LM's.
    split = _layers_per_stage(m["layers"], pp) if source in ("megatron_lm", "nemo", "deepspeed") else None
    if split is not None:
        document["plan"]["layout"]["layers_per_stage"] = split
    measured, metric = _measured(row, global_batch, gpus)
    label = (f"{m['name']} {gpu} {gpus}g TP{tp} PP{pp} DP{dp}" + (f" CP{cp}" if cp > 1 else "")
             + (f" VP{vp}" if vp > 1 else "") + f" s{m['seq_len']} mbs{mbs} {recomputation}")
    memory = row["measured"].get("peak_mem_gib")
    family = _family(row) + (" FP8" if fp8 else "")
    run = PublishedRun(row["id"], source, family, gpu, label + (" fp8" if fp8 else ""), document, measured, metric,
                       overlap, kernel, float(memory) if memory else None)
    cited = row["source"]
    if (source == "deepspeed" and str(cited.get("path") or "").endswith("rebase/README.md")
            and str(cited.get("section") or "").startswith(DEEPSPEED_CHECKPOINTING_AB)):
        raise TimeRefused("Megatron-DeepSpeed's checkpointing A/B (rebase README Notes/TODOs): its 1.3B V100 step is "
                          "2.6x slower than the same stack's 260-hour 1.3B run on V100, not the setting's speed", run)
    return run


def predict_step(run: PublishedRun, efficiency: float) -> float:
    """The model's step time for a run with the GPU's sustained efficiency set to `efficiency`."""
    from chameleon_opt.instance.load import build_instance
    from chameleon_opt.perf.model import PerfModel
    document = json.loads(json.dumps(run.document))
    document["cluster"]["device_type"]["efficiency"] = efficiency
    instance = build_instance(document, f"<{run.id}>")
    return PerfModel(instance).evaluate(instance.plan).iteration_time_s


TP_OVERLAP_EXPOSED = 0.0
"""Exposed share of TP collectives under Megatron's --tp-comm-overlap (stated in the rows' notes):
assumed fully hidden behind the GEMMs it is pipelined with; fitted on nothing (only one family uses it)."""


def tp_exposed(run: PublishedRun) -> float:
    return TP_OVERLAP_EXPOSED if run.tp_comm_overlap else 1.0


FLASH_V1_A100 = 0.325
"""FlashAttention (v1) reaches 25-40% of an A100's peak (FlashAttention-2, Dao 2023, abstract): the middle."""
FLASH_V2_A100 = 0.615
"""FlashAttention-2 reaches 50-73% of an A100's peak (same abstract): the middle."""
FLASH_V2_H100 = 0.35
"""FlashAttention-2 reaches 35% of an H100's peak (FlashAttention-3, Shah et al. 2024, abstract)."""
FLASH_V2_H100_MEASURED = ((4096, 0.229), (8192, 0.282), (16384, 0.315), (32768, 0.327))
"""PyTorch's FlashAttention-2 SDPA backend (torch 2.11, sdpa_kernel(FLASH_ATTENTION)) measured on one H200
(the H100's GH100 die at the same clocks; attention is compute-bound): causal, 32 heads of 128, batch 1,
forward + backward FLOPs as the model counts them (the causal half, backward 2.5x) over the time, per
sequence length, as a share of 989 TFLOP/s (bench/device/sdpa_gemm_probe.py, bench/data/h200_sdpa_gemm.jsonl).
The FlashAttention-3 paper's 35% headline is its long-sequence forward."""
CUDNN_H100_MEASURED = ((4096, 0.413), (8192, 0.511), (16384, 0.532), (32768, 0.559))
"""cuDNN's fused attention (torch 2.11's SDPA default on Hopper: sdpa_kernel(CUDNN_ATTENTION) and the
default ran at the same rates), measured as FLASH_V2_H100_MEASURED is."""
ATTENTION_UTILISATION = {
    ("flash-v1", "A100-40"): FLASH_V1_A100, ("flash-v1", "A100-80"): FLASH_V1_A100,
    ("flash-v2", "A100-40"): FLASH_V2_A100, ("flash-v2", "A100-80"): FLASH_V2_A100,
    ("flash-v2", "H100-80"): FLASH_V2_H100_MEASURED, ("flash-v2", "H200-141"): FLASH_V2_H100_MEASURED,
    # Transformer Engine's fused (cuDNN) attention in 2024 runs: its rate then is not measured here
    # (cuDNN's attention kernels changed release to release; CUDNN_H100_MEASURED is torch 2.11's), so
    # the FlashAttention-3 paper's FlashAttention-2-class figure stands for it
    ("te-fused", "H100-80"): FLASH_V2_H100, ("te-fused", "H200-141"): FLASH_V2_H100,
    ("cudnn", "H100-80"): CUDNN_H100_MEASURED, ("cudnn", "H200-141"): CUDNN_H100_MEASURED,
    # No attention rate of B200 is measured or published for the cuDNN of NeMo 25.04's runs: its proxy die's
    # (PROXY_DIE) share of the peak, against B200's own bf16 peak (assumed, fitted on nothing)
    ("te-fused", "B200-180"): FLASH_V2_H100,
    # Not published for v1 on H100. Pre-Hopper kernels (mma.sync, no TMA or wgmma) lose the same share
    # of the peak on H100 as FlashAttention-2 does: v1's A100 share x FlashAttention-2's H100 / A100.
    ("flash-v1", "H100-80"): FLASH_V1_A100 * FLASH_V2_H100 / FLASH_V2_A100,
}
"""Share of peak a stack's flash-attention kernel sustains on the FLOPs it executes, per (kernel, GPU):
published kernel figures, fitted on none of these rows (calibration.flash_attention_seconds)."""


def attention_utilisation(run: PublishedRun) -> dict[str, float]:
    found = ATTENTION_UTILISATION.get((run.attention_kernel, run.gpu)) if run.attention_kernel else None
    return {run.gpu: found} if found else {}


def efficiency_calibration(compute: dict[str, float], memory_efficiency: float, exposed: float = 1.0,
                           attention: dict[str, float] | None = None, kind: str = "flash",
                           interference: float | None = None, fp8_ratio: float | None = None
                           ) -> "FrameworkCalibration":
    """A calibration pricing a block as FLOPs / (peak x e_gpu) + activation bytes / (bandwidth x e_mem)
    (perf/calibration.py's form, no profiles): the second term is what makes small models slower than
    their FLOPs say, and its bytes follow the attention `kind` (eager adds the a*s^2 scores). `attention`:
    per GPU, the flash kernel's utilisation (its attention core priced apart, at the FLOPs it executes).
    `interference`: the ZeRO-3 overlap's cost (PerfModel.overlap_sharded; None: the model's constant).
    `fp8_ratio`: fp8 GEMM efficiency as a share of the bf16 one (perf/fp8.py; None: FP8_GEMM_RATIO)."""
    from chameleon_opt.instance.devices import CATALOGUE
    from chameleon_opt.perf.calibration import DeviceFit, FrameworkCalibration
    devices = {gpu: DeviceFit(CATALOGUE[gpu].peak_tflops, CATALOGUE[gpu].memory_bandwidth_gbps, e, ())
               for gpu, e in compute.items()}
    return FrameworkCalibration("published", kind, memory_efficiency, devices, tp_exposed=exposed,
                                attention_utilisation=dict(attention or {}), sharded_interference=interference,
                                fp8_ratio=fp8_ratio)


def predict_calibrated(run: PublishedRun, compute: float, memory_efficiency: float,
                       interference: float | None = None, fp8_ratio: float | None = None) -> float:
    """The run's step time under efficiency_calibration."""
    from chameleon_opt.instance.load import build_instance
    from chameleon_opt.perf.model import PerfModel
    instance = build_instance(run.document, f"<{run.id}>")
    calibration = efficiency_calibration({run.gpu: compute}, memory_efficiency, tp_exposed(run),
                                         attention_utilisation(run), run.document["training"]["attention"],
                                         interference, fp8_ratio)
    return PerfModel(instance, calibration=calibration).evaluate(instance.plan).iteration_time_s


def is_fp8(run: PublishedRun) -> bool:
    """Whether the run's linears run in fp8 (its own families: no bf16 fit uses it)."""
    return "fp8" in run.document["training"]


def step_terms(run: PublishedRun, interference: float | None = None) -> tuple[float, float, float]:
    """(a, b, c) with step time ~ a / e_gpu + b / e_mem + c: the model evaluated at three points
    (exactly linear while the bottleneck stage and the exposed communication stay the same)."""
    base = predict_calibrated(run, 0.5, 0.05, interference)
    a = (predict_calibrated(run, 0.25, 0.05, interference) - base) / 2.0
    b = (predict_calibrated(run, 0.5, 0.025, interference) - base) / 20.0
    return a, b, base - 2.0 * a - 20.0 * b


def fit_interference(measured: list[float], at_zero: list[float], at_one: list[float]) -> float:
    """The ZeRO-3 overlap interference x (PerfModel.overlap_sharded) minimising the squared relative
    step-time errors of runs predicted at x = 0 and x = 1: a step is linear in x (x scales the
    shorter of compute and collectives, which x does not change), so least squares is closed-form.
    Clipped to [0, 1]: the overlap neither speeds the pair up nor costs more than running them apart."""
    import numpy as np
    m, t0, t1 = (np.asarray(v, dtype=float) for v in (measured, at_zero, at_one))
    slope, miss = (t1 - t0) / m, 1.0 - t0 / m
    if not (slope > 0).any():
        return 0.0
    return float(np.clip((slope * miss).sum() / (slope * slope).sum(), 0.0, 1.0))


CHIP = {"A100-40": "A100", "A100-80": "A100", "H100-80": "H100", "H200-141": "H100", "V100-32": "V100",
        "B200-180": "B200"}
"""The compute die of each catalogue GPU: A100 40 GB and 80 GB are the same GA100 (108 SMs, 312 TFLOP/s
dense bf16; NVIDIA A100 data sheet) and differ in HBM, which the memory-traffic term prices by its own
bandwidth; H200 is the H100's GH100 (989 TFLOP/s dense bf16, NVIDIA H200 data sheet) with 141 GB at
4.8 TB/s. The compute efficiency is fitted per die, so a family on one A100 is predicted from the other
(no published family runs on H200: torchtitan's Trainy rows are priced at the H100's fit)."""


PROXY_DIE = {"V100": "A100", "B200": "H100"}
"""A die with no rows in a fit takes the compute efficiency fitted for its proxy die. Why: V100 appears
in one family only (Megatron-LM 2020), so leave-one-family-out can never fit it, and the catalogue's
0.45 (assumed) left its rows 15-34% slow. Rule (assumed, fitted on no V100 row): the pre-Hopper dies
(Volta, Ampere: warp-level mma.sync tensor cores) sustain the same share of their rated peak; Hopper is
fitted apart because its fitted share is lower (about 0.63 against the A100's 0.77: its 989 TFLOP/s
need wgmma kernels and a boost clock it does not hold under dense GEMM load). The V100 rows are the
check; where they are fitted (other folds) V100 comes out 0.85-0.87, so the rule errs slow.
B200 (Blackwell) has no bf16 row in any table, so no fit ever measures it: it takes the H100's fitted share
of its own (2.3x higher) peak. Rule (assumed, fitted on no B200 row): Blackwell's tensor cores, like
Hopper's, need asynchronous warpgroup-level kernels fed by TMA to reach their peak, so a stack that
sustains a share of Hopper's sustains that share of Blackwell's. NeMo's 8 B200 rows are the check."""


@dataclass(frozen=True)
class EfficiencyFit:
    compute: dict[str, float]   # per GPU type
    memory_efficiency: float
    fitted_on: tuple[str, ...]  # families
    borrowed: tuple[str, ...] = ()  # GPU types whose efficiency is their PROXY_DIE's (no rows of theirs fitted)


def fit_efficiencies(runs: list[PublishedRun], terms: dict[str, tuple[float, float, float]]) -> EfficiencyFit:
    """Per-die compute efficiency (CHIP) and one shared memory efficiency minimising the squared relative
    step-time errors of `runs` (least squares in 1/e, non-negative, compute efficiencies at most 1);
    `compute` names every catalogue GPU on a fitted die."""
    import numpy as np
    from chameleon_opt.perf.calibration import _nonnegative_lstsq
    chips = sorted({CHIP[r.gpu] for r in runs})
    design = np.zeros((len(runs), len(chips) + 1))
    target = np.zeros(len(runs))
    for i, r in enumerate(runs):
        a, b, c = terms[r.id]
        design[i, chips.index(CHIP[r.gpu])] = a / r.measured_step_s
        design[i, -1] = b / r.measured_step_s
        target[i] = 1.0 - c / r.measured_step_s
    # No die sustains more than its peak: 1/e >= 1. A die whose free fit asks for more is held at its
    # peak and the rest refitted (the other terms then absorb what its rows cannot).
    at_peak = np.zeros(len(chips) + 1, dtype=bool)
    while True:
        free = ~at_peak
        coef = np.ones(len(chips) + 1)
        coef[free] = _nonnegative_lstsq(design[:, free], target - design[:, at_peak].sum(axis=1))
        over = free[:-1] & (coef[:-1] < 1.0)
        if not over.any():
            break
        at_peak[:-1] |= over
    compute = {g: float(1.0 / coef[chips.index(chip)]) if coef[chips.index(chip)] > 0 else 1.0
               for g, chip in CHIP.items() if chip in chips}
    borrowed = tuple(g for g, chip in CHIP.items()
                     if chip not in chips and PROXY_DIE.get(chip) in chips)
    for g in borrowed:
        proxy = next(other for other, c in CHIP.items() if c == PROXY_DIE[CHIP[g]])
        compute[g] = compute[proxy]
    return EfficiencyFit(compute, float(1.0 / coef[-1]) if coef[-1] > 0 else 1e9,
                         tuple(sorted({r.family for r in runs})), borrowed)
