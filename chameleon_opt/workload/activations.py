"""What a transformer block keeps for its backward, derived from the code that runs it.

Why per implementation: the bytes a block saves are set by its kernels, not by the architecture
alone. Korthikanti et al.'s count (MLSys'23, Table 2: s*h*34 + 5*a*s^2 at 2-byte activations) is
Megatron-LM's fused kernels; Hugging Face's eager code keeps a float32 softmax (Llama, OPT,
GPT-Neo), float32 copies inside RMSNorm (Llama), GPT-Neo's float32 queries and keys, K and V
repeated to every query head (GQA under eager attention), every intermediate of a GELU written
in Python (GPT-2's gelu_new) and all four tensors of an unfused SwiGLU. A flash / SDPA kernel
keeps Q, K, V, its output and a float32 log-sum-exp instead of the a*s^2 tensors.

Each term below is one saved tensor (or one storage that several saved views share), in bytes per
token of one block, and says how tensor parallelism divides it: "tp" terms live inside the
column/row-parallel region (divided by t), "sp" terms are full-width (divided by t only under
sequence parallelism). tests/test_activations_hf.py builds the Hugging Face models from their
configs, records every tensor autograd saves (torch.autograd.graph.saved_tensors_hooks) and checks
these sums against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from chameleon_opt.workload.schema import Architecture

Norm = Literal["fused", "layernorm", "rmsnorm-fp32"]
Mlp = Literal["fused", "gelu", "gelu-python", "relu", "swiglu"]


@dataclass(frozen=True)
class Kernels:
    """The kernel choices of one stack running one model family: what decides the saved bytes.

    norm: fused (Megatron / Apex / TE: the input, and two float32 statistics per token),
    layernorm (torch LayerNorm: the same), rmsnorm-fp32 (Hugging Face's RMSNorm: the float32 copy
    of the input, the float32 statistic and the normalised tensor before the weight, besides the
    next linear's input). attention: eager (materialised scores) or flash (SDPA / FlashAttention).
    softmax_bytes: bytes of the saved softmax output (4 when computed in float32; None = the
    activation dtype). qk_bytes: bytes of the saved Q and K (GPT-Neo casts them to float32).
    repeat_kv: eager GQA materialises K and V at every query head. attention_dropout /
    hidden_dropout: a dropout with p > 0 on the probabilities / after each sub-layer (1-byte
    masks on CUDA; `mask_bytes` says otherwise: PyTorch's CPU fallback keeps the mask in the
    activation dtype). mlp: fused (Megatron: GEMM-1 output and GEMM-2 input; three tensors when
    gated), gelu (torch's GELU: the same two), gelu-python (GPT-2's tanh GELU in Python ops: four
    intermediates plus GEMM-2's input), relu (its output, shared with GEMM-2's input), swiglu
    (unfused: gate, up, SiLU output and product). count_lse: the flash kernel's float32 log-sum-exp
    (4*a bytes per token) is counted; Korthikanti's table, which MEGATRON reproduces, omits it
    (under 0.1% of a block). selective: what the stack's selective recomputation keeps: "core"
    (Megatron: everything but the attention core) or "op-mm" (torchtitan's per-op policy:
    op_sac_terms). logit_bytes: bytes per token and vocabulary entry the loss holds at the head's
    backward (None: an fp32 logits copy plus the half-precision logits or their gradient).
    loss_parallel_logit_bytes: the same per local vocabulary entry when TP > 1 shards the vocabulary
    and the stack's loss is then a different code path (torchtitan's loss parallel:
    LOSS_PARALLEL_LOGIT_BYTES); None: logit_bytes at every TP degree."""

    name: str
    norm: Norm = "fused"
    attention: Literal["eager", "flash"] = "eager"
    softmax_bytes: int | None = None
    qk_bytes: int | None = None
    repeat_kv: bool = False
    attention_dropout: bool = True
    hidden_dropout: bool = True
    mlp: Mlp = "fused"
    mask_bytes: int = 1
    count_lse: bool = True
    selective: Literal["core", "op-mm"] = "core"
    logit_bytes: float | None = None
    loss_parallel_logit_bytes: float | None = None
    elementwise: Literal["fused", "eager", "rotary"] = "fused"
    """eager: the block's element-wise chains (RMSNorm, rotary, SwiGLU's gate, K/V repeats) run as
    separate PyTorch kernels, each a round trip through HBM (unfused_elementwise_bytes_per_token).
    rotary: every chain fused but the complex rotary embedding's (TORCHTITAN_COMPILED)."""

    def with_attention(self, attention: str) -> "Kernels":
        """The same stack with another attention kernel (the instance's `attention` setting)."""
        if attention == self.attention:
            return self
        return Kernels(**{**self.__dict__, "attention": attention})  # type: ignore[arg-type]


ELEMENTWISE_BACKWARD_RATIO = 2.0
"""HBM bytes of an element-wise chain's backward per byte of its forward: each op's backward reads
its output gradient and its saved input(s) and writes its input gradient(s). Counted op by op on
the chains of unfused_elementwise_bytes_per_token (decomposed RMSNorm: about 76 h bytes backward
against 36 h forward; SiLU x up: 18 f against 10 f; a copy's backward is one copy): 1.8-2.1, so 2.
Derived from the op list, fitted on nothing."""


def unfused_elementwise_bytes_per_token(a: Architecture, k: Kernels, act: float) -> float:
    """Forward HBM bytes per token of one block that an eager stack's element-wise chains move beyond
    their fused equivalents (one read of the inputs, one write of the output), at TP 1.

    Why: Megatron-LM (Apex / Transformer Engine) fuses the norm, the rotary embedding, the gated
    activation and bias-dropout-add into single kernels; MPT under llm-foundry runs one torch kernel
    per op (F.layer_norm, GELU, the residual add), which is the fused count too. torchtitan's Llama
    without torch.compile (models/llama/model.py and models/norms.py at 9dec370, the 2024 benchmarks'
    commit) decomposes them, and every extra kernel is a full pass over HBM that the per-layer
    activation proxy of the fitted memory term (calibration.py, fitted on the fused stacks) does not
    see. Per element, `act` bytes in the activation dtype, 4 in fp32:
    - RMSNorm (two per block, width h): x.float() (act + 4), pow(2) (4 + 4), mean (4),
      x * rsqrt (4 + 4), type_as (4 + act), * weight (act + act); fused: act + act.
    - rotary on Q and K (widths q and kv): x.float() (act + 4), complex multiply (4 + 4),
      type_as (4 + act); fused: act + act.
    - SwiGLU (width f): silu(w1 x) (act + act), * w3 x (2 act + act); fused: 2 act + act.
    - grouped-query K and V repeated to every query head before SDPA (repeat_kv: read kv, write q,
      twice) and the attention output's transpose(1, 2).contiguous() copy (act q + act q).
    Not counted: the loss's fp32 cast of the logits (Megatron's cross-entropy casts too) and the
    residual adds (one kernel in both stacks)."""
    if k.elementwise == "fused":
        return 0.0
    h, q, kv, f = a.hidden, a.q_dim, a.kv_dim, a.ffn
    fp32 = 4.0
    norm_chain = (act + fp32) + 2 * fp32 + fp32 + 2 * fp32 + (fp32 + act) + 2 * act
    rotary_chain = (act + fp32) + 2 * fp32 + (fp32 + act)
    swiglu_chain = 2 * act + 3 * act
    norm = norm_chain - 2 * act              # 32 B per element in bf16
    rotary = rotary_chain - 2 * act          # 16
    swiglu = (swiglu_chain - 3 * act) if a.gated_mlp else 0.0   # 4
    repeat = 2 * act * (kv + q) if q != kv else 0.0
    transpose = 2 * act * q
    if k.elementwise == "rotary":  # under torch.compile: Inductor's complex fallback (TORCHTITAN_COMPILED)
        return rotary * (q + kv)
    return 2 * norm * h + rotary * (q + kv) + swiglu * f + repeat + transpose


MEGATRON = Kernels("megatron", count_lse=False)
"""Megatron-LM's fused kernels at the instance's attention setting: Korthikanti et al.'s count."""

HF_EAGER = {
    # model_type -> the Hugging Face modelling code's eager attention path (transformers 4.5x)
    "gpt2": Kernels("hf-gpt2", norm="layernorm", mlp="gelu-python"),
    "opt": Kernels("hf-opt", norm="layernorm", softmax_bytes=4, attention_dropout=False, mlp="relu"),
    "gpt_neo": Kernels("hf-gpt-neo", norm="layernorm", softmax_bytes=4, qk_bytes=4, attention_dropout=False,
                       hidden_dropout=False, mlp="gelu-python"),
    "llama": Kernels("hf-llama", norm="rmsnorm-fp32", softmax_bytes=4, repeat_kv=True, attention_dropout=False,
                     hidden_dropout=False, mlp="swiglu"),
}
for _alias in ("mistral", "qwen2", "qwen3"):
    HF_EAGER[_alias] = HF_EAGER["llama"]

LOSS_PARALLEL_LOGIT_BYTES = 18.0
"""Bytes per token and local vocabulary entry torchtitan's eager loss holds under TP (loss parallel:
on by default whenever TP > 1, `disable_loss_parallel`, which the importer refuses with TP; train.py
at 9dec370 runs the loss inside `torch.distributed.tensor.parallel.loss_parallel()`). There
`cross_entropy` on the vocabulary-sharded fp32 logits does not reach the fused log-softmax kernels:
DTensor's custom handlers (torch/distributed/tensor/parallel/loss.py, 2024) decompose it, and the
backward of nll_loss and log_softmax runs as one Python expression,
`(torch.zeros_like(x) scattered + torch.exp(x)) * grad_output` (`_nll_loss_and_log_softmax_backward`),
so at its peak four fp32 tensors of the local logits' size are alive together: the saved
log-probabilities x, the zero-filled scatter, exp(x) and their sum (the product then takes exp's
freed block): 16 bytes, where the fused log_softmax backward holds the saved output, its incoming
gradient and the gradient it writes (12). The bf16 logits' 2 bytes stay as in the eager count
(TORCHTITAN.logit_bytes: a freed block the fp32 tensors do not fit, or, under pipelining, the
stage's output kept for the step's merge). Its forward (fp32 input, `shifted`, exp(shifted), bf16
logits: 14) peaks lower. Derived from the code, fitted on nothing; checked against the published
70B FSDP 32 x TP 8 peaks (docs/performance-model.md, torchtitan's loss parallel)."""

TORCHTITAN = Kernels("torchtitan", norm="rmsnorm-fp32", attention="flash", attention_dropout=False,
                     hidden_dropout=False, mlp="swiglu", selective="op-mm", logit_bytes=14.0,
                     loss_parallel_logit_bytes=LOSS_PARALLEL_LOGIT_BYTES, elementwise="eager")
"""torchtitan's Llama (torchtitan/models/llama/model.py and models/norms.py at 9dec370, the 2024
benchmarks' commit): the default `rmsnorm` normalises an fp32 copy of its input (saved: that copy
and the normalised tensor before the weight), SDPA (flash: Q, K, V, output, log-sum-exp), no
dropout, SwiGLU in eager ops (w1 output, w3 output, SiLU output, product). Selective means the
per-op policy (op_sac_terms). Loss: `cross_entropy(pred.flatten(0, 1).float(), labels)` (train.py);
at the log-softmax backward the saved fp32 log-softmax output, its incoming fp32 gradient and the
fp32 gradient it produces are alive together (12 bytes per token and vocabulary entry), and the
caching allocator keeps the bf16 logits' freed block (`del pred` before backward), which none of
those fp32 tensors fits, reserved: 2 more. Measured (bench/device/torchtitan_probe.py, H200,
torch 2.11, Llama 3 8B widths, 4-8 blocks, 8-16k tokens, expandable segments): the allocated peak
is parameters + Adam state + activations + 12 B x tokens x vocab + the gathered root within 0.5%,
and the reserved peak this model gives (gradients counted, 14 B) within 2.1% on five runs."""


TORCHTITAN_COMPILED = Kernels("torchtitan-compiled", norm="fused", attention="flash", attention_dropout=False,
                              hidden_dropout=False, mlp="fused", selective="op-mm", logit_bytes=14.0,
                              loss_parallel_logit_bytes=LOSS_PARALLEL_LOGIT_BYTES, elementwise="rotary")
"""torchtitan's Llama with its blocks under torch.compile (compile.components "model": each
TransformerBlock compiled whole, fullgraph, apply_compile in parallelize_llama.py). Inductor fuses
every element-wise chain between two matmuls (or SDPA) into one kernel, so the chains cost what a
fused stack's do, except the rotary embedding's: torchtitan's Llama rotates Q and K by a complex
multiply (view_as_complex(x.float()) * freqs_cis, view_as_real, type_as), and Inductor generates no
code for complex dtypes: it runs the multiply as an ATen fallback kernel (torch/_inductor/lowering.py,
unsupported_input_tensor: "Torchinductor does not support code generation for complex operators";
torchtitan issue #15 reports it for this rotary), so the fp32 cast before it and the bf16 cast after it
are kernels of their own, each a round trip through HBM: the eager count of that chain (16 B per
element of Q and K beyond a fused rotary; elementwise "rotary"). Its partitioner saves the chains' inputs,
not their fp32 intermediates, and recomputes them in the backward: RMSNorm keeps its bf16 input as
Megatron's fused norm does, SwiGLU the two matmul outputs and the product that w2 reads (the fused
gated count; the partitioner may recompute the product, so an upper count). Not measured on a
compiled run: the published compile rows use per-op checkpointing, whose saved set (op_sac_terms) the
policy fixes under compile too. The loss is outside the blocks: see COMPILED_LOSS_LOGIT_BYTES."""

COMPILED_LOSS_LOGIT_BYTES = 4.0
"""Bytes per token and vocabulary entry at the loss when torch.compile compiles it (compile.components
"loss"): Inductor fuses `cross_entropy(pred.float(), labels)` into a forward reduction that keeps the
bf16 logits and a per-token log-sum-exp, and a backward kernel that writes the bf16 logits' gradient
directly (the fp32 cast's backward folded in), so the bf16 logits and their bf16 gradient (2 + 2) are
what is alive, against eager's 14 (TORCHTITAN.logit_bytes). Derived from the fused graph, not measured:
torchtitan's December 2024 code did not compile the loss (train.py: "compiling loss function causes
CUDA errors"), and no later published row states memory."""

LLM_FOUNDRY = Kernels("llm-foundry", norm="layernorm", attention="flash", attention_dropout=False,
                      hidden_dropout=False, mlp="gelu", count_lse=True, logit_bytes=4.0)
"""llm-foundry's MPT under Composer, as its published benchmarks ran it (mosaicml/llm-foundry: the May
2023 sweep at 300cc5c58, MosaicGPT, and the October 2023 / January 2024 sweeps at b2a43a147 / 5e85bd62d,
MPT; scripts/train/benchmarking/submit_benchmarks.py sets attn_impl triton and low_precision_layernorm).
Per block: LPLayerNorm (F.layer_norm on the bf16 input with autocast off: its input and output, as a
fused norm), Wqkv, the Triton flash kernel (flash-attn 1.0.3's flash_attn_triton.py, lines 809-813, and
llm-foundry's copy at b2a43a147, lines 812-816: q, k, v, which stay views of the Wqkv output, its
output and a float32 log-sum-exp per head and token), out_proj, a torch GELU MLP (the
up-projection's output and the GELU's output); attn_pdrop, resid_pdrop and emb_pdrop default to 0
(configuration_mosaic_gpt.py / configuration_mpt.py) and no yaml of the sweeps sets them, and a
dropout at p = 0 returns its input and saves no mask. So 32 bytes per token at width h against
Korthikanti's 34 (no dropout masks), and no embedding mask. Loss: loss_fn defaults to
fused_crossentropy (mosaic_gpt.py line 510 at 300cc5c58, modeling_mpt.py line 724 at b2a43a147),
flash-attn 1.0.x's xentropy kernel (setup.py pins flash-attn 1.0.3.post0 / 1.0.9): it saves the bf16
logits and a float32 log-sum-exp per token (cross_entropy.py, save_for_backward) and its backward
writes the gradient into a new tensor of the logits' dtype (xentropy_kernel.cu, empty_like(logits));
Composer keeps the model's outputs (the logits) until the step ends. So 2 + 2 bytes per token and
vocabulary entry at the head's backward, against the default's float32 copy plus the bf16 logits (6)."""

COMPILED_STACKS = {"torchtitan": "torchtitan-compiled"}
"""A stack's kernels when the job compiles its blocks (the importer sets training.kernels to these)."""


def kernels_for(stack: str | None, family: str | None) -> Kernels:
    """The kernels of `stack` running a `family` model: megatron (default), torchtitan (eager or
    compiled blocks), llm-foundry (MPT under Composer), or hf (Hugging Face's code; the family must be
    one whose code is modelled)."""
    if stack in (None, "megatron"):
        return MEGATRON
    if stack == "torchtitan":
        return TORCHTITAN
    if stack == "torchtitan-compiled":
        return TORCHTITAN_COMPILED
    if stack == "llm-foundry":
        return LLM_FOUNDRY
    if stack == "hf":
        if family not in HF_EAGER:
            raise ValueError(f"no Hugging Face activation model for family {family!r}; "
                             f"known: {', '.join(sorted(HF_EAGER))}")
        return HF_EAGER[family]
    raise ValueError(f"unknown kernel stack {stack!r}: use megatron, torchtitan, torchtitan-compiled, llm-foundry "
                     "or hf")


FP8_SAVED_BYTES = 1.0
"""Bytes an element of a linear's input saved for its weight gradient when the linear runs in fp8
(see block_terms' fp8_linears)."""


def block_terms(a: Architecture, k: Kernels, s: int, act: float, recompute_core: bool = False,
                fp8_linears: bool = False) -> dict[str, tuple[float, str]]:
    """Saved bytes per token of one block by name, with how TP divides each ("tp" or "sp").

    `act` is the activation dtype's size, `s` the sequence length (the a*s^2 terms);
    `recompute_core`: selective recomputation, which keeps neither the scores nor the kernel's
    statistics (the attention core is rerun from Q, K and V in the backward).

    `fp8_linears` (training.fp8): Transformer Engine's linears save the fp8 cast of their input for
    the weight gradient, not the bf16 input (TE 1.x linear.py `_Linear.forward`: saved_inputmat is
    the fp8 `inputmat` or its fp8 transpose `inputmat_t` under fp8, `inputmat_no_fp8` only without;
    TE 2.x layernorm_linear.py: the quantised `ln_out`, row- or column-wise usage only, with the bf16
    norm input kept for the norm's backward). So a tensor that only a linear saves (the norm outputs
    feeding QKV and the MLP's first GEMM, GEMM-2's input, eager attention's context) is kept at
    FP8_SAVED_BYTES, and one that another op also saves in bf16 (a flash kernel's output, which it
    needs for its backward; ReLU's output) gains an fp8 copy beside it."""
    lin = FP8_SAVED_BYTES if fp8_linears else act
    h, q, kv, f, heads = a.hidden, a.q_dim, a.kv_dim, a.ffn, a.heads
    terms: dict[str, tuple[float, str]] = {}
    norm = {"fused": act * h, "layernorm": act * h, "rmsnorm-fp32": (4.0 + act) * h}[k.norm]
    terms["norm inputs (2 norms)"] = (2.0 * norm, "sp")
    terms["linear inputs (QKV, MLP in)"] = (2.0 * lin * h, "sp")
    if k.hidden_dropout:
        terms["dropout masks (2)"] = (2.0 * k.mask_bytes * h, "sp")
    if k.attention == "eager":
        qk = k.qk_bytes or act
        width = q if k.repeat_kv else kv
        terms["Q, K, V"] = (qk * q + qk * width + act * width, "tp")
        softmax = k.softmax_bytes or act
        scores = softmax
        if softmax != act or k.attention_dropout:
            scores += act  # the probabilities the PV matmul saves (cast or dropout output)
        if k.attention_dropout:
            scores += k.mask_bytes
        if not recompute_core:
            terms["attention scores (a*s per token)"] = (scores * heads * s, "tp")
    else:
        terms["Q, K, V"] = (act * (q + 2 * kv), "tp")
        if k.count_lse and not recompute_core:
            terms["flash log-sum-exp"] = (4.0 * heads, "tp")
    # A flash kernel keeps its output for its own backward: the out-projection's saved input is that
    # tensor in bf16, or an fp8 copy beside it. Eager attention's backward needs its probabilities and
    # V, not its output.
    kept_by_core = act if k.attention == "flash" and fp8_linears else 0.0
    terms["attention output (out-proj input)"] = ((lin + kept_by_core) * q, "tp")
    units = {"fused": 3.0 if a.gated_mlp else 2.0, "gelu": 2.0, "gelu-python": 5.0, "relu": 1.0,
             "swiglu": 4.0}[k.mlp]
    if k.mlp in ("gelu", "gelu-python", "relu") and a.gated_mlp:
        raise ValueError(f"kernels {k.name!r} have a non-gated MLP but the architecture is gated")
    if k.mlp == "swiglu" and not a.gated_mlp:
        raise ValueError(f"kernels {k.name!r} have a SwiGLU MLP but the architecture is not gated")
    mlp = units * act
    if fp8_linears:  # the last unit is GEMM-2's input, which ReLU's backward keeps too (its output)
        mlp += lin - (0.0 if k.mlp == "relu" else act)
    terms["MLP intermediates"] = (mlp * f, "tp")
    return terms


def op_sac_terms(a: Architecture, act: float) -> dict[str, tuple[float, str]]:
    """Saved bytes per token of one block under torchtitan's per-op selective checkpointing
    (`_apply_ac_to_transformer_block`, parallelize_llama.py at 9dec370): the checkpoint's input,
    and the outputs of the ops in its `_save_list` except every second `aten.mm` of the block. A
    Llama block's matmuls run wq, wk, wv, wo, w1, w3, w2 (Attention.forward, FeedForward.forward),
    so wq, wv, w1 and w2 are kept and wk, wo, w3 recomputed; the flash SDPA's output and log-sum-exp
    are kept. Under TP with sequence parallelism w2's local matmul output is the full sequence (a
    partial sum before its reduce-scatter), and both reduce-scatters' outputs are kept too."""
    h, q, kv, f, heads = a.hidden, a.q_dim, a.kv_dim, a.ffn, a.heads
    return {"block input": (act * h, "sp"), "wq, wv outputs": (act * (q + kv), "tp"),
            "SDPA output and log-sum-exp": (act * q + 4.0 * heads, "tp"), "w1 output": (act * f, "tp"),
            "w2 output": (act * h, "full")}


def op_sac_recomputed_flops_per_token(a: Architecture) -> float:
    """Forward FLOPs per token torchtitan's per-op policy reruns in a block's backward: the
    matmuls it does not keep (wk, wo, w3)."""
    return 2.0 * (a.hidden * a.kv_dim + a.q_dim * a.hidden + a.hidden * a.ffn)


def block_bytes_per_sample(a: Architecture, k: Kernels, s: int, act: float, tp: int,
                           sequence_parallel: bool = False, recompute_core: bool = False,
                           fp8_linears: bool = False) -> float:
    """One block's saved bytes for one sequence on one TP rank (fp8_linears: Transformer Engine's fp8 linears,
    see block_terms; the per-op policy's terms are its bf16 ones under torchao's float8, whose linears the
    policy sees as `aten.mm`: perf/fp8.py)."""
    shard = tp if sequence_parallel else 1
    if recompute_core and k.selective == "op-mm":
        terms = op_sac_terms(a, act)
        if tp > 1 and sequence_parallel:
            terms["reduce-scatter outputs (2)"] = (2.0 * act * a.hidden, "sp")
    else:
        terms = block_terms(a, k, s, act, recompute_core, fp8_linears)
    divisor = {"tp": tp, "sp": shard, "full": 1}
    return s * sum(b / divisor[how] for b, how in terms.values())
