"""Per-layer sizes, FLOPs and measured times of a workload: the raw material of the performance model.

Layer l is 0 (embedding), 1..L (transformer blocks) or L+1 (final norm and head). Every array has
one entry per layer, so a stage's cost is a sum over a contiguous slice, and the performance model
keeps prefix sums to make any range O(1).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from chameleon_opt.workload.activations import (MEGATRON, Kernels, block_bytes_per_sample,
                                               op_sac_recomputed_flops_per_token,
                                               unfused_elementwise_bytes_per_token)
from chameleon_opt.workload.schema import Architecture, Profile, WorkloadSpec


@dataclass(frozen=True)
class LayerTable:
    """Per-layer times (seconds, one micro-batch) measured or fitted for one (device type, mbs, tp)."""

    forward_s: np.ndarray
    backward_s: np.ndarray
    update_s: np.ndarray
    fitted: bool


def fit_profile_times(profile: Profile, micro_batch_size: int, tp: int) -> LayerTable | None:
    """Per-layer times at `micro_batch_size` from an affine fit t(b) = a + c*b over the profiled sizes.

    Why a fit and not the raw entry: measured profiles at small micro-batches are dominated by launch
    and hook overhead and are noisy (Sailor's OPT-350 GH-96 TP4 profile is slower at micro-batch 1
    than at 2). A least-squares line per layer over all measured micro-batch sizes, weighted by
    1/t so each point counts by its relative error, smooths that noise and also interpolates sizes
    that were never measured. With a single measured size the raw entry is used (scaled linearly
    when the size differs). Returns None when the profile has no entry for `tp`.
    """
    points = sorted(
        (int(mbs), per_tp[str(tp)]) for mbs, per_tp in profile.times.items() if str(tp) in per_tp)
    if not points:
        return None
    sizes = np.array([mbs for mbs, _ in points], dtype=float)
    times = np.array([per_layer for _, per_layer in points], dtype=float)  # [n_sizes, layers, 3]
    if len(points) == 1:
        scaled = times[0] * (micro_batch_size / sizes[0])
        return LayerTable(scaled[:, 0], scaled[:, 1], times[0][:, 2], fitted=False)
    design = np.stack([np.ones_like(sizes), sizes], axis=1)
    fitted = np.empty(times.shape[1:])
    for layer in range(times.shape[1]):
        for column in range(2):
            observed = times[:, layer, column]
            weight = 1.0 / np.maximum(observed, 1e-9)
            coef, *_ = np.linalg.lstsq(design * weight[:, None], observed * weight, rcond=None)
            fitted[layer, column] = max(coef[0] + coef[1] * micro_batch_size, 0.0)
    update = times[:, :, 2].mean(axis=0)  # the optimizer step does not depend on the micro-batch
    return LayerTable(fitted[:, 0], fitted[:, 1], update, fitted=True)


def _recompute_mode(recompute: bool | str) -> str:
    """The legacy boolean (True = full recomputation) or a mode name."""
    if isinstance(recompute, bool):
        return "full" if recompute else "none"
    return recompute


class Workload:
    """A workload with its derived per-layer quantities, for one sequence length and precision."""

    def __init__(self, spec: WorkloadSpec, sequence_length: int | None, dtype_bytes: int,
                 context_parallel: int = 1) -> None:
        """`context_parallel` (cp): each rank holds s / cp of every sequence (Megatron-LM / Transformer
        Engine context parallelism), so every per-sample quantity here is one rank's share: the
        linears, element-wise work, activations and messages of s / cp tokens, and the attention core
        of those s / cp queries against all s keys (the s^2 terms divided by cp, not cp^2)."""
        self.spec = spec
        self.name = spec.name
        self.architecture: Architecture | None = spec.architecture
        arch_seq = self.architecture.seq_len if self.architecture else None
        self.context_parallel = context_parallel
        self.sequence_length = (sequence_length or arch_seq or 0) // context_parallel  # one rank's tokens
        self.dtype_bytes = dtype_bytes
        self._tables: dict[tuple[str, int, int], LayerTable | None] = {}

    @cached_property
    def num_layers(self) -> int:
        """Total layers including embedding and head."""
        if self.architecture is not None:
            return self.architecture.layers + 2
        if self.spec.layer_bytes is not None:
            return len(self.spec.layer_bytes.params)
        per_layer = next(iter(next(iter(self.spec.profiles[0].times.values())).values()))
        return len(per_layer)

    @cached_property
    def checkpointed(self) -> np.ndarray:
        """1 for the rows full recomputation reruns, 0 for those it leaves alone: trainers checkpoint
        the transformer blocks, never the embedding or the head (Megatron-LM's recompute loops over
        its transformer layers, torchtitan's apply_ac wraps each of model.layers, Composer checkpoints
        llm-foundry's MPTBlock modules, Hugging Face's gradient checkpointing its decoder layers). Rows
        are [embedding, blocks..., head] in every workload (a profile's too)."""
        rows = np.ones(self.num_layers)
        if self.num_layers >= 3:
            rows[0] = rows[-1] = 0.0
        return rows

    def profile_for(self, device_type: str) -> Profile | None:
        return next((p for p in self.spec.profiles if p.device_type == device_type), None)

    # -- sizes -------------------------------------------------------------------------------
    @cached_property
    def params(self) -> np.ndarray:
        """Parameters per layer (elements), from the architecture (Megatron's counting) or the file."""
        if self.spec.layer_bytes is not None:
            return np.array(self.spec.layer_bytes.params, dtype=float)
        if self.architecture is None:
            return np.zeros(self.num_layers)
        a = self.architecture
        h, f = a.hidden, a.ffn
        q_dim, kv_dim = a.q_dim, a.kv_dim
        attention = 2 * h * q_dim + 2 * h * kv_dim
        mlp = (3 if a.gated_mlp else 2) * h * f
        biases_and_norms = 2 * h if a.gated_mlp else (2 * h + 2 * kv_dim + h + f + h + 4 * h)
        block = attention + mlp + biases_and_norms
        embedding = a.vocab * h + (a.seq_len * h if a.learned_positions else 0)
        # Tied or not, the head holds a full vocab x hidden matrix: under pipeline parallelism
        # Megatron keeps a copy of the tied word embedding (with its gradients and optimizer state)
        # on the last stage. `unique_params` counts the shared matrix once.
        head = 2 * h + a.vocab * h
        return np.array([embedding] + [block] * a.layers + [head], dtype=float)

    @cached_property
    def unique_params(self) -> float:
        """The model's parameter count (a tied embedding counted once)."""
        tied = self.architecture is not None and self.architecture.tied_embeddings
        return float(self.params.sum()) - (self.architecture.vocab * self.architecture.hidden if tied else 0.0)

    @cached_property
    def forward_flops_per_sample(self) -> np.ndarray:
        """Forward FLOPs of one sequence per layer at TP 1 (Narayanan et al., SC'21, Eq. 2's terms):
        2 FLOPs per parameter per token for the matrix multiplies plus 4*s^2*q for attention scores
        and values in every block (q = heads x head width: h unless head_dim says otherwise); 2*s*h*V for the head's logits; the embedding is a lookup (0)."""
        if self.architecture is None:
            return np.zeros(self.num_layers)
        a, s = self.architecture, self.sequence_length
        h = a.hidden
        matmul_params = 2 * h * a.q_dim + 2 * h * a.kv_dim + (3 if a.gated_mlp else 2) * h * a.ffn
        block = 2.0 * s * matmul_params + 4.0 * s * (s * self.context_parallel) * a.q_dim
        head = 2.0 * s * h * a.vocab
        return np.array([0.0] + [block] * a.layers + [head])

    @cached_property
    def attention_core_flops_per_sample(self) -> np.ndarray:
        """Forward FLOPs of the attention core (Q K^T and attention x V: 4*s^2*q per block): what
        selective recomputation repeats in the backward. Under context parallelism one rank's s / cp
        queries against the whole sequence's s keys: 4*(s/cp)*s*q."""
        if self.architecture is None:
            return np.zeros(self.num_layers)
        a, s = self.architecture, self.sequence_length
        return np.array([0.0] + [4.0 * s * (s * self.context_parallel) * a.q_dim] * a.layers + [0.0])

    def activation_bytes_per_sample(self, tp: int, recompute: bool | str, attention: str = "flash",
                                    sequence_parallel: bool = False, kernels: Kernels | None = None,
                                    fp8_linears: bool = False) -> np.ndarray:
        """Activation bytes one in-flight sample keeps per layer until its backward, per TP rank.

        Blocks: the saved tensors of the code that runs them (workload/activations.py; `kernels`,
        default Megatron-LM's fused kernels, which is Korthikanti et al.'s count, MLSys'23 Table 2:
        s*h*(10 + 24/t) + 5*a*s^2/t for MHA and a 4h GeLU MLP under eager attention, everything
        divided by t with sequence parallelism), under `attention` (eager keeps the a*s^2 scores,
        flash its Q, K, V, output and log-sum-exp). Selective recomputation keeps the block without
        the attention core's scores; full recomputation keeps the block input (2*s*h). fp8_linears:
        the blocks' linears save fp8 inputs (activations.block_terms). Embedding:
        its dropout mask (s*h bytes) where the stack's kernels have a hidden dropout (none at p = 0).
        Head: final-norm and projection inputs (4*s*h) and the loss's logits buffers
        (logit_bytes_per_entry * s*V/t, vocab-parallel: by default fp32 logits and the half-precision
        logits or their gradient that coexist with them at the loss; the head is on the last stage,
        which holds one micro-batch in flight, so this transient is folded in here).
        """
        mode = _recompute_mode(recompute)
        if self.spec.layer_bytes is not None:
            values = np.array(self.spec.layer_bytes.activation_bytes_per_sample, dtype=float)
            return values / tp if mode != "full" else np.minimum(values, self.boundary_bytes_per_sample)
        if self.architecture is None:
            return np.zeros(self.num_layers)
        a, s = self.architecture, self.sequence_length
        h, scale = a.hidden, self.dtype_bytes / 2.0
        shard = tp if sequence_parallel else 1
        chosen = (kernels or MEGATRON).with_attention(attention)
        if mode == "full":
            block = 2.0 * s * h / shard * scale
        else:
            block = block_bytes_per_sample(a, chosen, s, float(self.dtype_bytes), tp, sequence_parallel,
                                           recompute_core=mode == "selective", fp8_linears=fp8_linears)
        embedding = s * h / shard * chosen.mask_bytes if chosen.hidden_dropout else 0.0
        head = 4.0 * s * h / shard * scale + self.logit_bytes_per_entry(kernels, tp) * s * a.vocab / tp
        return np.array([embedding] + [block] * a.layers + [head])

    def unfused_elementwise_bytes_per_sample(self, tp: int, kernels: Kernels | None) -> np.ndarray:
        """Forward HBM bytes per layer and sequence, per TP rank, of the element-wise kernels an eager
        stack runs beyond their fused equivalents (activations.unfused_elementwise_bytes_per_token;
        zero for fused stacks). Divided by t: torchtitan's TP shards the norms' sequence too."""
        chosen = kernels or MEGATRON
        if self.architecture is None or chosen.elementwise == "fused":
            return np.zeros(self.num_layers)
        a = self.architecture
        block = self.sequence_length * unfused_elementwise_bytes_per_token(a, chosen, float(self.dtype_bytes)) / tp
        return np.array([0.0] + [block] * a.layers + [0.0])

    def logit_bytes_per_entry(self, kernels: Kernels | None, tp: int = 1) -> float:
        """Bytes per token and (local) vocabulary entry the loss holds at the head's backward: the
        stack's (workload/activations.py Kernels.logit_bytes; under TP its loss_parallel_logit_bytes
        where the stack's vocabulary-parallel loss runs other code), else fp32 logits plus the
        half-precision logits or their gradient."""
        chosen = kernels or MEGATRON
        if tp > 1 and chosen.loss_parallel_logit_bytes is not None:
            return chosen.loss_parallel_logit_bytes
        return chosen.logit_bytes if chosen.logit_bytes is not None else 4.0 + self.dtype_bytes

    @cached_property
    def mlp_output_flops_per_sample(self) -> np.ndarray:
        """Forward FLOPs of each block's MLP output projection (2*s*f*h: GEMM-2, or a gated MLP's w2):
        the block's last op that saves a tensor for the backward (its input), so the part of a block
        that an early-stopping recompute does not rerun (recomputed_flops_per_sample)."""
        if self.architecture is None:
            return np.zeros(self.num_layers)
        a = self.architecture
        return np.array([0.0] + [2.0 * self.sequence_length * a.ffn * a.hidden] * a.layers + [0.0])

    def recomputed_flops_per_sample(self, recompute: bool | str, kernels: Kernels | None = None,
                                    early_stop: bool = False) -> np.ndarray:
        """Forward FLOPs per layer that recomputation reruns in the backward: each block's whole
        forward (full; not the embedding's or the head's: `checkpointed`), the attention core
        (selective, Megatron's kind) or the matmuls torchtitan's per-op policy does not keep
        (selective under its kernels), nothing otherwise.

        early_stop (full only): torch's non-reentrant checkpoint (torch >= 2.1) stops the rerun once
        it has regenerated as many saved tensors as the forward saved (torch/utils/checkpoint.py,
        `_StopRecomputationError` in the recompute's pack hook). Autograd saves an op's inputs before
        running its kernel, and the last op of a pre-norm block that saves anything is the MLP's
        output projection (its input; the residual add saves nothing, nor does a dropout at p = 0,
        MPT's resid_pdrop; one at p > 0 after it would save a mask and keep the GEMM in the rerun),
        so the rerun stops before that GEMM: a block's recompute is its forward less
        mlp_output_flops_per_sample."""
        mode = _recompute_mode(recompute)
        if mode == "full":
            if early_stop:
                return (self.forward_flops_per_sample - self.mlp_output_flops_per_sample) * self.checkpointed
            return self.forward_flops_per_sample * self.checkpointed
        if mode != "selective":
            return np.zeros(self.num_layers)
        if (kernels or MEGATRON).selective == "op-mm" and self.architecture is not None:
            per_block = self.sequence_length * op_sac_recomputed_flops_per_token(self.architecture)
            return np.array([0.0] + [per_block] * self.architecture.layers + [0.0])
        return self.attention_core_flops_per_sample

    def backward_transient_bytes_per_sample(self, tp: int, recompute: bool | str, attention: str = "flash",
                                            sequence_parallel: bool = False, kernels: Kernels | None = None
                                            ) -> float:
        """Working set of one block's backward beyond its stored activations, per sample and TP rank:
        only one block is in backward at a time, so a stage adds this once.

        The largest op's input and output gradients are alive together: the softmax backward under
        eager attention (2 tensors of a*s^2/t at the softmax's precision: 4*a*s^2/t in half
        precision, 8 when the stack computes the softmax in float32) or the MLP activation's
        (4*s*f/t). Selective
        recomputation first rematerialises the attention core (5*a*s^2/t under eager attention, a
        flash kernel's working set otherwise); full recomputation rematerialises the whole block."""
        mode = _recompute_mode(recompute)
        if self.architecture is None:
            if mode != "full":
                return 0.0
            return float(self.activation_bytes_per_sample(tp, False).max())
        a, s = self.architecture, self.sequence_length
        scale = self.dtype_bytes / 2.0
        scores = a.heads * s * s / tp * scale
        softmax = float((kernels or MEGATRON).softmax_bytes or self.dtype_bytes) / self.dtype_bytes
        working = max(4.0 * softmax * scores if attention == "eager" else 0.0, 4.0 * s * a.ffn / tp * scale)
        if mode == "selective" and attention == "eager":
            working += 5.0 * scores
        if mode == "full":
            working += float(self.activation_bytes_per_sample(tp, "none", attention, sequence_parallel, kernels)[
                1:-1].max(initial=0.0))
        return working

    @cached_property
    def boundary_bytes_per_sample(self) -> np.ndarray:
        """Bytes of each layer's output activation per sample: what crosses a stage boundary."""
        if self.spec.layer_bytes is not None:
            return np.array(self.spec.layer_bytes.boundary_bytes_per_sample, dtype=float)
        if self.architecture is None:
            return np.zeros(self.num_layers)
        s, h = self.sequence_length, self.architecture.hidden
        values = np.full(self.num_layers, float(s * h * self.dtype_bytes))
        values[-1] = 0.0
        return values

    def tp_allreduce_counts(self, recompute: bool | str) -> tuple[np.ndarray, np.ndarray]:
        """All-reduces of one s*h activation per layer in forward and in backward under Megatron TP:
        two per block each way (attention and MLP outputs), one for the vocab-parallel embedding;
        full recomputation repeats the blocks' forward ones during backward (selective recomputes only
        the attention core, inside the TP region: no extra collective)."""
        forward = np.zeros(self.num_layers)
        if self.architecture is None:
            return forward, forward.copy()
        forward[1:-1] = 2.0
        forward[0] = 1.0
        backward = forward.copy()
        backward[0] = 0.0
        if _recompute_mode(recompute) == "full":
            backward += forward * self.checkpointed
        return forward, backward

    def tp_collective_gemm_flops_per_sample(self) -> np.ndarray:
        """Forward FLOPs per sample (TP 1) of the matmuls next to a block's four sequence-parallel
        collectives, which async TP pipelines with them: the all-gather feeding wq, wk, wv; wo feeding
        a reduce-scatter; the all-gather feeding w1 (and w3 when gated); w2 feeding a reduce-scatter.
        Rows: blocks (the embedding's and head's are zero: no such pair); one column per collective."""
        pairs = np.zeros((self.num_layers, 4))
        if self.architecture is None:
            return pairs
        a, s = self.architecture, self.sequence_length
        up = (2 if a.gated_mlp else 1) * a.hidden * a.ffn
        pairs[1:-1] = 2.0 * s * np.array([a.hidden * (a.q_dim + 2 * a.kv_dim), a.q_dim * a.hidden, up,
                                          a.ffn * a.hidden])
        return pairs

    def context_parallel_kv_bytes_per_sample(self, tp: int) -> np.ndarray:
        """Bytes of one ring step's K and V message per layer and sample on one rank (context
        parallelism): the rank's s / cp tokens of K and V, kv heads split over TP. Transformer Engine's
        AttnFuncWithCPAndKVP2P sends this each forward step and K, V and their gradients (twice this)
        each backward step (its p2p_comm_buffers hold (2, *kv.shape))."""
        if self.architecture is None or self.context_parallel <= 1:
            return np.zeros(self.num_layers)
        kv = 2.0 * self.sequence_length * self.architecture.kv_dim / tp * self.dtype_bytes
        return np.array([0.0] + [kv] * self.architecture.layers + [0.0])

    def tp_allreduce_bytes_per_sample(self) -> float:
        if self.architecture is None:
            return 0.0
        return float(self.sequence_length * self.architecture.hidden * self.dtype_bytes)

    def profile_table(self, device_type: str, micro_batch_size: int, tp: int) -> LayerTable | None:
        """Fitted per-layer times for this device type, or None when it was not profiled at `tp`."""
        key = (device_type, micro_batch_size, tp)
        if key not in self._tables:
            profile = self.profile_for(device_type)
            self._tables[key] = None if profile is None else fit_profile_times(profile, micro_batch_size, tp)
        return self._tables[key]
