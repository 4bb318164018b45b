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
    (under 0.1% of a block)."""

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

    def with_attention(self, attention: str) -> "Kernels":
        """The same stack with another attention kernel (the instance's `attention` setting)."""
        if attention == self.attention:
            return self
        return Kernels(**{**self.__dict__, "attention": attention})  # type: ignore[arg-type]


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

TORCHTITAN = Kernels("torchtitan", norm="fused", attention="flash", attention_dropout=False, hidden_dropout=False,
                     mlp="swiglu")
"""torchtitan's Llama: torch's fused RMSNorm (input and statistic), SDPA, no dropout, SwiGLU in
eager ops (w1 output, w3 output, SiLU output, product)."""


def kernels_for(stack: str | None, family: str | None) -> Kernels:
    """The kernels of `stack` running a `family` model: megatron (default), torchtitan, or hf
    (Hugging Face's code; the family must be one whose code is modelled)."""
    if stack in (None, "megatron"):
        return MEGATRON
    if stack == "torchtitan":
        return TORCHTITAN
    if stack == "hf":
        if family not in HF_EAGER:
            raise ValueError(f"no Hugging Face activation model for family {family!r}; "
                             f"known: {', '.join(sorted(HF_EAGER))}")
        return HF_EAGER[family]
    raise ValueError(f"unknown kernel stack {stack!r}: use megatron, torchtitan or hf")


def block_terms(a: Architecture, k: Kernels, s: int, act: float, recompute_core: bool = False
                ) -> dict[str, tuple[float, str]]:
    """Saved bytes per token of one block by name, with how TP divides each ("tp" or "sp").

    `act` is the activation dtype's size, `s` the sequence length (the a*s^2 terms);
    `recompute_core`: selective recomputation, which keeps neither the scores nor the kernel's
    statistics (the attention core is rerun from Q, K and V in the backward)."""
    h, q, kv, f, heads = a.hidden, a.q_dim, a.kv_dim, a.ffn, a.heads
    terms: dict[str, tuple[float, str]] = {}
    norm = {"fused": act * h, "layernorm": act * h, "rmsnorm-fp32": (4.0 + act) * h}[k.norm]
    terms["norm inputs (2 norms)"] = (2.0 * norm, "sp")
    terms["linear inputs (QKV, MLP in)"] = (2.0 * act * h, "sp")
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
    terms["attention output (out-proj input)"] = (act * q, "tp")
    units = {"fused": 3.0 if a.gated_mlp else 2.0, "gelu": 2.0, "gelu-python": 5.0, "relu": 1.0,
             "swiglu": 4.0}[k.mlp]
    if k.mlp in ("gelu", "gelu-python", "relu") and a.gated_mlp:
        raise ValueError(f"kernels {k.name!r} have a non-gated MLP but the architecture is gated")
    if k.mlp == "swiglu" and not a.gated_mlp:
        raise ValueError(f"kernels {k.name!r} have a SwiGLU MLP but the architecture is not gated")
    terms["MLP intermediates"] = (units * act * f, "tp")
    return terms


def block_bytes_per_sample(a: Architecture, k: Kernels, s: int, act: float, tp: int,
                           sequence_parallel: bool = False, recompute_core: bool = False) -> float:
    """One block's saved bytes for one sequence on one TP rank."""
    shard = tp if sequence_parallel else 1
    terms = block_terms(a, k, s, act, recompute_core)
    return s * sum(b / (tp if how == "tp" else shard) for b, how in terms.values())
