"""fp8 linear layers (Transformer Engine's delayed scaling): what they change in a step's time and memory.

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
both): CAST_BYTES_PER_ELEMENT = 4. Dynamic (tensorwise, rowwise) scaling reads the tensor once more
for its amax first; it is not modelled (no held-out row can check it) and the schema refuses it.
Memory: activations as in bf16 (assumed: which fp8 copies a TE version saves differs, and no published
fp8 row states a peak), plus the cached fp8 weights where they are kept across micro-batches.
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
