"""fp8 linear layers (Transformer Engine's delayed scaling, torchao's dynamic scaling): what they change in a
step's time and memory.

Why a mechanism and not a faster device: fp8 runs only the transformer blocks' linear GEMMs on the fp8
tensor cores; the attention core, the element-wise chains, the embedding and the output layer stay in
bf16 (Megatron-LM / NeMo build the output layer as a plain Megatron linear, not a TE one; MPT's tied
head is F.linear on the bf16 embedding), and every fp8 GEMM operand must first be cast, which is
memory-bound traffic a FLOP count does not see. Per block and per TP rank:

    linear GEMMs:  F_lin / (fp8_peak x e_gpu x FP8_GEMM_RATIO)      (bf16: F_lin / (peak x e_gpu))
    casts:         CAST_BYTES_PER_ELEMENT x elements / (HBM bandwidth x ELEMENTWISE_HBM_SHARE)

with F_lin the block's matmul FLOPs (Workload.forward_flops_per_sample less the attention core),
e_gpu the die's bf16 share of its peak, and the cast elements: forward, every linear's input; backward,
every linear's output gradient; the weights once per micro-batch, or once per step where the stack
keeps the cast weights across micro-batches (Megatron-LM's TE layers cast on is_first_microbatch).
Delayed scaling takes each tensor's scale from its amax history and records the new amax in the cast
kernel itself, so a cast reads the bf16 tensor once (2 bytes) and writes the fp8 tensor and its
transpose (1 + 1 bytes: Hopper's fp8 GEMMs take only the TN layout, and TE's cast-transpose writes
both): CAST_BYTES_PER_ELEMENT = 4. Memory: activations as in bf16 (assumed: which fp8 copies a TE
version saves differs, and no published fp8 row states a peak), plus the cached fp8 weights where they
are kept across micro-batches.

torchao's Float8Linear (torchtitan's float8, the tensorwise recipe: dynamic scaling) is priced
by the same GEMM term and FP8_GEMM_RATIO (fitted on Transformer Engine rows, not refitted) with its own
casts (torchao_block_seconds): dynamic scaling needs a tensor's amax before any element is cast, so
each cast is an amax pass and a cast pass, and what each pass moves is torchao's own roofline count
(torchao/testing/training/roofline_utils.py, get_tensor_memory_traffic_ovhd_s, with fusion modelling:
under torch.compile the amax read of a linear's input and output gradient fuses into the op that
produced it, the weight's does not). TORCHAO_CAST_BYTES gives the bytes per element, split into the
forward's and the backward's kernels. Memory: torchao saves a linear's bf16 input, so the activations
are bf16's; torchtitan's per-op checkpointing sees its matmuls as aten.mm and keeps its bf16 saved set
(docs/performance-model.md, torchao float8). torchao's rowwise recipe is not priced (the schema and the
torchtitan importer refuse it): its row-scaled GEMM's rate depends on the shape, and at this GEMM ratio
torchtitan's 4 published rowwise TP runs came out 14-28% fast (docs/performance-model.md).
"""

from __future__ import annotations

import numpy as np

from chameleon_opt.perf.calibration import ELEMENTWISE_HBM_SHARE
from chameleon_opt.workload.model import Workload

CAST_BYTES_PER_ELEMENT = 4.0
"""Delayed scaling's cast-transpose: read bf16 (2 bytes), write the fp8 tensor and its transpose (1 + 1)."""

FP8_CACHE_BYTES_PER_PARAM = 2.0
"""Where cast weights are kept across micro-batches (weight_cast per_step): the fp8 weight and its
transpose, 1 + 1 bytes per linear parameter (TE's cached fp8 weight workspace). Assumed from TE's
behaviour, not measured: no published fp8 row states its memory."""

FP8_GEMM_RATIO = 0.943
"""Share of the bf16 efficiency an fp8 GEMM reaches against the fp8 peak: e_fp8 = FP8_GEMM_RATIO x e_gpu.
Fitted on NeMo's 4 priceable H100 FP8 rows alone (Llama 2 7B, 4-16 GPUs, s 4k-16k; least squares in
relative step-time error, the bf16 efficiencies fitted on the bf16 published families:
bench/validate_perf.py, fp8 section); held out on llm-foundry's 7 amp_fp8 rows: median 3.1%, worst 7.3%
(llm-foundry's own fit, 0.965, gives NeMo's rows median 1.5%, worst 3.5%)."""


def linear_forward_flops_per_sample(workload: Workload) -> np.ndarray:
    """Forward FLOPs per sequence and layer (TP 1) of the GEMMs fp8 runs: the blocks' linears.
    The embedding (a lookup) and the output layer (kept in bf16) run none."""
    flops = workload.forward_flops_per_sample - workload.attention_core_flops_per_sample
    flops = flops.copy()
    flops[0] = flops[-1] = 0.0
    return flops


def cast_elements_per_token(workload: Workload, tp: int) -> tuple[float, float]:
    """(forward input, backward output-gradient) elements one TP rank casts per token and block.
    Column-parallel linears (QKV, MLP up and gate) take the whole hidden state and give 1/tp of their
    outputs; row-parallel ones (attention out, MLP down) take 1/tp and give the whole hidden state.
    A gated MLP's gate and up projections share one cast input (TE's LayerNormMLP fuses them)."""
    a = workload.architecture
    assert a is not None
    h, f = a.hidden, a.ffn
    inputs = h + a.q_dim / tp + h + f / tp
    gradients = (a.q_dim + 2 * a.kv_dim) / tp + h + (2 if a.gated_mlp else 1) * f / tp + h
    return float(inputs), float(gradients)


def linear_params(workload: Workload) -> np.ndarray:
    """Elements of the linear weights per layer (TP 1): the blocks' matmul parameters."""
    a = workload.architecture
    assert a is not None
    per_block = 2 * a.hidden * a.q_dim + 2 * a.hidden * a.kv_dim + (3 if a.gated_mlp else 2) * a.hidden * a.ffn
    return np.array([0.0] + [float(per_block)] * a.layers + [0.0])


def fp8_block_seconds(workload: Workload, tp: int, micro_batch_size: int, peak_tflops: float,
                      fp8_peak_tflops: float, efficiency: float, bandwidth_gbps: float, ratio: float,
                      weights_per_micro_batch: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(forward change, backward change, per-step weight casts) in seconds per layer when the blocks'
    linears of one micro-batch run in fp8 instead of bf16 at `efficiency` of `peak_tflops`: the GEMM
    time at fp8 less the bf16 time, plus the casts. The forward change includes the weights' casts
    when they are cast every micro-batch; otherwise they are the third term, once per step."""
    gemm = linear_forward_flops_per_sample(workload) * micro_batch_size / tp
    bf16 = gemm / (peak_tflops * 1e12 * efficiency)
    fp8 = gemm / (fp8_peak_tflops * 1e12 * efficiency * ratio)
    stream = bandwidth_gbps * 1e9 * ELEMENTWISE_HBM_SHARE
    blocks = (gemm > 0).astype(float)
    inputs, gradients = cast_elements_per_token(workload, tp)
    tokens = workload.sequence_length * micro_batch_size
    cast_f = blocks * inputs * tokens * CAST_BYTES_PER_ELEMENT / stream
    cast_b = blocks * gradients * tokens * CAST_BYTES_PER_ELEMENT / stream
    weights = linear_params(workload) / tp * CAST_BYTES_PER_ELEMENT / stream
    forward = fp8 - bf16 + cast_f + (weights if weights_per_micro_batch else 0.0)
    backward = 2.0 * (fp8 - bf16) + cast_b
    return forward, backward, (np.zeros_like(weights) if weights_per_micro_batch else weights)


TORCHAO_CAST_BYTES: dict[str, tuple[float, float]] = {
    # input and output gradient: one kernel reads bf16 (2; the amax read fused into the producer) and
    # writes fp8 in row- and column-major layout (1 + 1) for the two GEMMs that use it; weight: an amax
    # read (2, not fusable: the weight is not produced in the block), a cast for the forward GEMM (2 + 1)
    # and another for the backward's (2 + 1)
    "input": (4.0, 0.0), "weight": (5.0, 3.0), "grad_output": (0.0, 4.0),
}
"""Bytes per element and micro-batch (forward kernels, backward kernels) of torchao's tensorwise casts by
GEMM operand, derived from torchao's roofline (module docstring). The forward's kernels rerun with a
recomputed forward."""

FP8_GATHERED_WEIGHT_BYTES: tuple[float, float] = (0.0, 2.0)
"""tensorwise with FSDP's fp8 all-gather: the weight arrives cast (its local shard was cast before the
gather, 1/shards of the work, neglected), so the forward casts nothing and the backward's input-gradient
GEMM needs its column-major copy (read 1, write 1: Float8Tensor's mm makes the layout contiguous)."""


def torchao_cast_elements(workload: Workload, tp: int) -> tuple[float, float]:
    """(input, output-gradient) elements one TP rank casts per token and block under torchtitan's float8.
    The linears wq, wk, wv share one input (the attention norm's output) and w1, w3 another (the MLP
    norm's): under torch.compile their identical casts are one. torchao's float8 TP
    (Float8ColwiseParallel, PrepareFloat8ModuleInput, Float8RowwiseParallel, which torchtitan applies
    with the tensorwise recipe) casts the sequence-sharded input of the column-parallel linears before
    its all-gather and the row-parallel linears' output gradient before the backward's all-gather, so
    both are cast on h / tp elements."""
    a = workload.architecture
    assert a is not None
    shared = a.hidden / tp
    inputs = 2 * shared + (a.q_dim + a.ffn) / tp
    gradients = (a.q_dim + 2 * a.kv_dim) / tp + (2 if a.gated_mlp else 1) * a.ffn / tp + 2 * shared
    return float(inputs), float(gradients)


def torchao_block_seconds(workload: Workload, tp: int, micro_batch_size: int, peak_tflops: float,
                          fp8_peak_tflops: float, efficiency: float, bandwidth_gbps: float, ratio: float,
                          fp8_all_gather: bool) -> tuple[np.ndarray, np.ndarray]:
    """(forward change, backward change) in seconds per layer when the blocks' linears of one micro-batch
    run torchao's Float8Linear (the tensorwise recipe) instead of bf16: the GEMMs at the fp8
    rate (as fp8_block_seconds) plus the casts of TORCHAO_CAST_BYTES (the weights' per
    FP8_GATHERED_WEIGHT_BYTES when FSDP gathers them in fp8)."""
    gemm = linear_forward_flops_per_sample(workload) * micro_batch_size / tp
    bf16 = gemm / (peak_tflops * 1e12 * efficiency)
    fp8 = gemm / (fp8_peak_tflops * 1e12 * efficiency * ratio)
    stream = bandwidth_gbps * 1e9 * ELEMENTWISE_HBM_SHARE
    inputs, gradients = torchao_cast_elements(workload, tp)
    tokens = workload.sequence_length * micro_batch_size
    blocks = (gemm > 0).astype(float)
    weight = FP8_GATHERED_WEIGHT_BYTES if fp8_all_gather else TORCHAO_CAST_BYTES["weight"]
    weights = linear_params(workload) / tp
    cast = [blocks * (inputs * TORCHAO_CAST_BYTES["input"][k] + gradients * TORCHAO_CAST_BYTES["grad_output"][k])
            * tokens + weights * weight[k] for k in (0, 1)]
    return fp8 - bf16 + cast[0] / stream, 2.0 * (fp8 - bf16) + cast[1] / stream
