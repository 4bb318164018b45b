"""Per-device memory of a pipeline stage (the paper's Eq. 14, generalised)."""

from __future__ import annotations

from dataclasses import dataclass


def stage_memory_eq14(stage: int, stages: int, layers: int, param_bytes: float, grad_bytes: float,
                      optimizer_bytes: float, activation_bytes: float) -> tuple[float, float]:
    """Eq. 14 for uniform layers: (static, activations) with
    static = L_i (m_p + m_g + m_o) and activations = (N_pp - i) L_i m_a, stage i 0-based:
    under 1F1B stage i keeps N_pp - i micro-batches in flight."""
    static = layers * (param_bytes + grad_bytes + optimizer_bytes)
    activations = (stages - stage) * layers * activation_bytes
    return static, activations


def in_flight_micro_batches(stage: int, stages: int, own: int, extra: float = 0.0, virtual: int = 1) -> float:
    """Micro-batches whose activations a stage holds at its peak under 1F1B: N_pp - s, at most
    the micro-batches it runs. Interleaved 1F1B with v chunks per device (Megatron's schedule: stage
    s warms up 2(N_pp - s - 1) + (v - 1) N_pp chunk micro-batches, each 1/v of its layers) holds
    (2(N_pp - s - 1) + (v - 1) N_pp + 1) / v, i.e. N_pp (1 + (N_pp - 1)/(N_pp v)) on the first stage as
    in Korthikanti et al. Sec. 4.2.2. Rerouted work (`extra`) is assumed to interleave into the
    schedule in proportion to the stage's own load, so it raises the peak by the same ratio."""
    depth = float(stages - stage)
    if virtual > 1:
        depth = (2.0 * (stages - stage - 1) + (virtual - 1) * stages + 1) / virtual
    base = min(depth, own) if own > 0 else 0
    if extra <= 0 or own <= 0:
        return float(base if own > 0 else min(depth, extra))
    return min(base * (own + extra) / own, own + extra)


def head_in_flight_micro_batches(stage: int, stages: int, own: int, extra: float = 0.0) -> float:
    """Micro-batches whose head logits the stage holding the head keeps at its peak, interleaved or
    not: the plain 1F1B count. Megatron's interleaved order (schedules.py, get_schedule_table,
    get_model_chunk_id and the steady loop's forward_k = k + warm-up, backward_k = k) warms the last
    rank up with chunks 0..v-2 only, and each steady step that runs the last chunk's forward (the
    head's) runs that same micro-batch's last-chunk backward next, so one micro-batch's logits are
    alive at a time, as on a plain 1F1B last stage."""
    return in_flight_micro_batches(stage, stages, own, extra, virtual=1)


MEMORY_TERMS = ("parameters", "gradients", "optimizer", "activations", "logits", "transient",
                "comm_buffers", "framework")
"""The terms of a stage's per-device memory, in the order `estimate` prints them."""

TERM_MEANING = {
    "parameters": "parameters",
    "gradients": "gradients",
    "optimizer": "optimizer state",
    "activations": "activations of the micro-batches in flight",
    "logits": "fp32 logits and loss of the head",
    "transient": "backward working set (recomputation, eager attention, ZeRO-3 gathers)",
    "comm_buffers": "communication buffers (pipeline receives, gradient bucket)",
    "framework": "framework overhead (CUDA context, NCCL, allocator)",
}


@dataclass(frozen=True)
class MemoryBreakdown:
    """Per-device bytes of one stage slot at its peak, by term (see TERM_MEANING)."""

    parameters: float
    gradients: float
    optimizer: float
    activations: float
    logits: float
    transient: float
    comm_buffers: float
    framework: float

    @property
    def total(self) -> float:
        return sum(self.as_dict().values())

    def as_dict(self) -> dict[str, float]:
        return {name: float(getattr(self, name)) for name in MEMORY_TERMS}

    def dominant(self) -> str:
        """The largest term's name: what an infeasibility reason points at."""
        terms = self.as_dict()
        return max(terms, key=terms.__getitem__)


def shard_group_size(replicas: int, copies: int = 1) -> int:
    """Slots sharing one copy of a layer's ZeRO shards: `replicas` data-parallel slots split into
    `copies` consecutive groups (shard_groups) of at least floor(replicas / copies) slots; the
    smallest group, whose members hold the largest shards, so memory is never under-stated."""
    return max(max(replicas, 1) // max(copies, 1), 1)


def shard_groups(replicas: int, copies: int = 1) -> list[tuple[int, int]]:
    """Positions [start, end) of each shard group among a layer's `replicas` slots in plan order:
    min(copies, replicas) consecutive runs of floor or ceil(replicas / copies) slots (Megatron-LM's
    distributed-optimizer instances and torchtitan's HSDP shard groups are consecutive
    data-parallel ranks; a plan's pipelines are its data-parallel ranks in order)."""
    groups = max(min(copies, replicas), 1)
    return [(replicas * i // groups, replicas * (i + 1) // groups) for i in range(groups)]


def zero_shards(zero_stage: int, replicas: int, copies: int = 1) -> tuple[float, float, float]:
    """Divisors of (parameters, gradients, optimizer state) under ZeRO stage 0-3 over `replicas`
    data-parallel copies (Rajbhandari et al., SC'20): stage 1 shards the optimizer state, 2 also the
    gradients, 3 also the parameters, each over a shard group of the replicas (`copies` copies of
    each shard: HSDP, Megatron's distributed-optimizer instances), not over all of them."""
    d = float(shard_group_size(replicas, copies))
    return (d if zero_stage >= 3 else 1.0, d if zero_stage >= 2 else 1.0, d if zero_stage >= 1 else 1.0)
