"""The performance model: instance + plan -> step time, memory and the solvers' cost coefficients.

One place computes every time and byte count, so the solvers, the recovery policies and the
`estimate` command can never disagree. Stage costs are sums over contiguous layer ranges and use
prefix sums, so any (device type, TP, layer range) costs O(1) after a first call.

What it covers: per-stage forward/backward compute (profiled, or FLOPs / (peak x efficiency)),
Megatron tensor-parallel all-reduces, blocking point-to-point activation transfers, the 1F1B
schedule (Eq. 9/10/11), the DP gradient all-reduce per group of layers that share replicas (only its
reduce-scatter under Megatron's --overlap-param-gather), ZeRO-3 / FSDP's all-gathers and reduce-scatters
on every micro-batch beside the compute (sharded_collective_times, overlap_sharded), context
parallelism's ring K/V exchanges beside the attention (context_parallel_exposed), the
optimizer step, per-stage memory (Eq. 14 generalised), and rerouted work (Eq. 12/13 generalised).
Schedule options real trainers use (ScheduleOptions; defaults from the instance's training
settings reproduce the plain 1F1B numbers): the gradient all-reduce overlapped with the last
micro-batch's backward, bucket by bucket; interleaved 1F1B with v virtual stages per device;
selective or full activation recomputation. Memory per stage is a sum of named terms
(perf/memory.py: parameters, gradients, optimizer state under ZeRO 0-3, activations by attention
implementation and recomputation, fp32 logits, the backward working set, communication buffers
and the framework's own overhead).
Memory relief per stage (perf/relief.py): each stage's `relief` picks its recomputation mode or
activation offload to host memory (copies over the host link, overlapped with the stage's compute:
an op lasts max(compute, copy)), optionally with the optimizer state and step on the host.
What it leaves out: network contention between concurrent collectives, stragglers, allocator
fragmentation beyond the fitted framework constant, and contention of offload copies with each other.
"""

from __future__ import annotations

import functools
import copy
import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from chameleon_opt.instance.load import Instance
from chameleon_opt.instance.schema import DeviceType
from chameleon_opt.perf.comm import Link, ring_allgather_time, ring_allreduce_time, ring_latency, ring_link_across_nodes
from chameleon_opt.perf.memory import (MemoryBreakdown, TERM_MEANING, head_in_flight_micro_batches,
                                       in_flight_micro_batches, shard_group_size,
                                       shard_groups, zero_shards)
from chameleon_opt.perf.pipeline import one_f_one_b_time
from chameleon_opt.perf.relief_kinds import ReliefCost, parse_relief, relief_options
from chameleon_opt.plan import Pipeline, Plan
from chameleon_opt.perf.calibration import ELEMENTWISE_HBM_SHARE
from chameleon_opt.perf.fp8 import (CAST_BYTES_PER_ELEMENT, FP8_CACHE_BYTES_PER_PARAM, FP8_GEMM_RATIO,
                                    fp8_block_seconds, linear_params, torchao_block_seconds)
from chameleon_opt.workload.activations import (COMPILED_LOSS_LOGIT_BYTES, COMPILED_STACKS,
                                               ELEMENTWISE_BACKWARD_RATIO, kernels_for)

GIB = float(1 << 30)
STAGE_COSTS_KEPT = 200_000  # remembered stage costs per model before the memo starts afresh
ADAM_BYTES_TOUCHED_PER_PARAM = 28.0
"""Mixed-precision Adam reads fp32 master, m, v and the gradient and writes master, m, v and the
half-precision copy: about 28 bytes of memory traffic per parameter (memory-bound step)."""
SHARDED_OVERLAP_INTERFERENCE = 0.701
"""Share of the shorter of (a micro-batch's compute, its ZeRO-3 collectives) that running them side by
side does not hide (overlap_sharded). Why: the collectives' NCCL kernels occupy SMs and HBM bandwidth
the GEMMs need, and FSDP issues a unit's gather only when its hooks run, so the overlapped phase
outlasts the longer of the two; pricing it as max(compute, collectives) left every published FSDP
run fast once the optimizer step was sharded (llm-foundry and torchtitan alike). Fitted on
torchtitan's 8 published FSDP2 runs (least squares in relative error, published.fit_interference, in
bench/validate_perf.py: 0.701 with the Grand Teton H100s at the middle of their stated peak bracket,
912 TFLOP/s, and the full-recompute rows' early stop (Training.recompute_early_stop; 0.710 before it,
0.745 at the SXM's 989); llm-foundry's 209 FSDP1 runs are its leave-one-family-out check (their own fit,
0.680, 0.564 before the early stop, is what prices torchtitan's there). A calibration's
sharded_interference overrides it."""


@dataclass(frozen=True)
class ScheduleOptions:
    """Schedule choices a plan can make; None takes the instance's training setting.

    overlap_grad_reduce: each gradient bucket's all-reduce starts once the last micro-batch's backward
    has produced it. virtual_stages: interleaved 1F1B with v model chunks per device (Narayanan et al.,
    SC'21): bubble (p-1)/(v m), v times the point-to-point sends, more activations in flight.
    recomputation: none / selective / full (Korthikanti et al.)."""

    overlap_grad_reduce: bool | None = None
    virtual_stages: int | None = None
    recomputation: Literal["none", "selective", "full"] | None = None


@dataclass(frozen=True)
class StageCost:
    """Per-micro-batch times of one stage slot and its memory at the peak of 1F1B."""

    forward_s: float          # compute + TP collectives of one micro-batch's forward
    backward_s: float
    compute_s: float          # forward + backward compute alone
    tensor_parallel_s: float  # TP all-reduces of one micro-batch (forward + backward)
    send_forward_s: float     # blocking send of the activation to the next stage
    send_backward_s: float    # blocking send of the gradient to the previous stage
    memory_bytes: float
    memory_capacity_bytes: float
    memory: MemoryBreakdown | None = None  # the terms of memory_bytes
    relief: str = "none"                   # the stage's memory relief (perf/relief.py)
    relief_s: float = 0.0                  # what it adds to one micro-batch's forward + backward
    relief_optimizer_s: float = 0.0        # and to the optimizer step (optimizer offload)
    sharded_s: float = 0.0                 # what ZeRO-3's gathers and reduce-scatters add to forward_s + backward_s
    context_parallel_s: float = 0.0        # ring K/V exchanges attention does not hide (in forward_s + backward_s)

    @property
    def op_forward_s(self) -> float:
        return self.forward_s + self.send_forward_s

    @property
    def op_backward_s(self) -> float:
        return self.backward_s + self.send_backward_s


@dataclass(frozen=True)
class LayerCosts:
    """Per-layer coefficients for the layer-allocation models, on one TP group's device type.

    A stage holding layers [a, b) costs sum(time_s[a:b]) per micro-batch and fits when
    sum(static_bytes[a:b]) + in_flight x sum(activation_bytes[a:b]) + transient_bytes <= capacity_bytes,
    exactly as PerfModel.stage_memory prices it. The head's fp32 logits and loss buffers are folded
    into the last layer's activation_bytes (the last stage holds one micro-batch in flight).
    stage_constant_bytes (framework overhead + communication buffers, the same for every stage on
    this device type and replica count) is already subtracted from capacity_bytes; device_bytes is
    the device's whole memory, so capacity_bytes = device_bytes - stage_constant_bytes."""

    time_s: np.ndarray            # forward + backward incl. TP collectives, one micro-batch
    static_bytes: np.ndarray      # parameters, gradients, optimizer state per device (ZeRO-sharded)
    activation_bytes: np.ndarray  # activations of one in-flight micro-batch per device
    transient_bytes: float        # one block's backward working set (added once per stage)
    capacity_bytes: float         # what the layers may use: device_bytes - stage_constant_bytes
    stage_constant_bytes: float = 0.0
    device_bytes: float = 0.0


@dataclass(frozen=True)
class PipelineEstimate:
    micro_batches: float
    iteration_time_s: float
    stages: tuple[StageCost, ...]
    extra_micro_batches: tuple[float, ...]  # rerouted work each stage takes from failed peers


@dataclass(frozen=True)
class Estimate:
    """Predicted step of a plan: the `estimate` command's JSON is `to_json()`."""

    plan: Plan
    iteration_time_s: float
    global_batch: int
    pipelines: tuple[PipelineEstimate, ...]
    data_parallel_s: float
    optimizer_s: float
    breakdown_s: dict[str, float] = field(default_factory=dict)
    assumptions: tuple[str, ...] = ()  # every constant used that was assumed rather than given or fitted

    @property
    def throughput_samples_per_s(self) -> float:
        return self.global_batch / self.iteration_time_s if self.iteration_time_s > 0 else 0.0

    @property
    def memory_ok(self) -> bool:
        return all(s.memory_bytes <= s.memory_capacity_bytes for p in self.pipelines for s in p.stages)

    def memory_violations(self) -> list[str]:
        """One line per stage over capacity, for infeasibility reasons, naming the dominant term."""
        lines = []
        for j, (pipe, plan_pipe) in enumerate(zip(self.pipelines, self.plan.pipelines)):
            for s, (cost, stage) in enumerate(zip(pipe.stages, plan_pipe.stages)):
                if cost.memory_bytes > cost.memory_capacity_bytes:
                    lines.append(f"pipeline {j} stage {s} (layers {stage.first}-{stage.end - 1}) needs "
                                 f"{cost.memory_bytes / GIB:.1f} GiB > {cost.memory_capacity_bytes / GIB:.1f} GiB"
                                 f"{memory_reason(cost)}")
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "format": 1,
            "iteration_time_s": self.iteration_time_s,
            "throughput_samples_per_s": self.throughput_samples_per_s,
            "memory_ok": self.memory_ok,
            "pipelines": [
                {"micro_batches": pipe.micro_batches, "iteration_time_s": pipe.iteration_time_s,
                 "stages": [{"devices": list(stage.devices), "layers": [stage.first, stage.end],
                             "forward_s": cost.forward_s, "backward_s": cost.backward_s,
                             "memory_bytes": int(cost.memory_bytes),
                             "memory_capacity_bytes": int(cost.memory_capacity_bytes),
                             "relief": cost.relief, "relief_s": cost.relief_s,
                             "relief_optimizer_s": cost.relief_optimizer_s,
                             **({"memory_breakdown_bytes": {k: int(v) for k, v in cost.memory.as_dict().items()}}
                                if cost.memory is not None else {})}
                            for stage, cost in zip(plan_pipe.stages, pipe.stages)]}
                for pipe, plan_pipe in zip(self.pipelines, self.plan.pipelines)],
            "breakdown_s": dict(self.breakdown_s),
            "assumptions": list(self.assumptions),
        }


def non_decreasing(values: list[float]) -> list[float]:
    """The least-squares non-decreasing fit of `values` (pool adjacent violators): measured ratios
    with noise keep their level instead of ratcheting up to their largest."""
    blocks: list[list[float]] = []   # [sum, count]
    for value in values:
        blocks.append([value, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return [total / count for total, count in blocks for _ in range(int(count))]


def memory_reason(cost: StageCost) -> str:
    """`: dominant term <name> X GiB` for an over-capacity stage (empty without a breakdown)."""
    if cost.memory is None:
        return ""
    name = cost.memory.dominant()
    return f": largest term {name} ({TERM_MEANING[name]}) {getattr(cost.memory, name) / GIB:.1f} GiB"



def interleaving_refusal(stages: int, micro_batches: int, virtual: int) -> str | None:
    """Why interleaved 1F1B cannot run this pipeline, None when it can. Megatron-LM's interleaved
    schedule (core/pipeline_parallel/schedules.py) raises unless its micro-batch group size lies in
    [pipeline size, micro-batches], so a pipeline of p > 1 stages needs at least p micro-batches
    (a single group of m covers any m >= p); the model's formula would under-price m < p by 10-33%."""
    if virtual > 1 and stages > 1 and micro_batches < stages:
        return (f"{micro_batches} micro-batches on {stages} stages: interleaved 1F1B (training.virtual_stages = "
                f"{virtual}) needs at least as many micro-batches as stages (Megatron-LM's schedule refuses "
                "fewer); give it more micro-batches or fewer stages, or set virtual_stages to 1")
    return None


def _remember_last(size: int) -> Any:
    """Memo of a model's last `size` evaluations (plans are frozen: an equal plan has an equal
    estimate; comparing is milliseconds where evaluating is 0.1-0.4 s at 16,384 devices).

    One decision evaluates the same plan several times (the search or rerouting that built it,
    the checker's memory check, the candidate's estimate, reliefs stamped again on an equal
    copy), inside the deadline; the model's settings are fixed at construction."""
    def wrap(method: Any) -> Any:
        @functools.wraps(method)
        def evaluate(self: PerfModel, plan: Plan, failed_devices: frozenset[int] = frozenset()) -> Estimate:
            memo: list[tuple[Plan, frozenset[int], Estimate]] = self.__dict__.setdefault("_evaluated", [])
            failed = frozenset(failed_devices)
            for seen, dead, estimate in memo:
                if dead == failed and (seen is plan or seen == plan):
                    return estimate if seen is plan else replace(estimate, plan=plan)
            estimate = method(self, plan, failed)
            memo.insert(0, (plan, failed, estimate))
            del memo[size:]
            return estimate
        return evaluate
    return wrap


class PerfModel:
    """Costs of any plan on one instance; cached per (device type, TP, micro-batch size).

    `options` overrides the instance's schedule settings (see ScheduleOptions); `calibration` is a
    fitted per-device time calibration (perf/calibration.py) used where the workload has no profile
    on a device: default models/calibration/<training.framework>.json."""

    def __init__(self, instance: Instance, options: ScheduleOptions | None = None,
                 calibration: Any = None) -> None:
        self.instance = instance
        self.workload = instance.workload
        training = instance.spec.training
        options = options or ScheduleOptions()
        self.options = ScheduleOptions(
            overlap_grad_reduce=training.overlap_grad_reduce if options.overlap_grad_reduce is None
            else options.overlap_grad_reduce,
            virtual_stages=options.virtual_stages or training.virtual_stages,
            recomputation=options.recomputation or training.recompute)
        self.micro_batch_size = training.micro_batch_size
        self.recompute = self.options.recomputation
        self.checkpoint_every = training.checkpoint_every
        self.recompute_early_stop = training.recompute_early_stop
        self.tp_async = training.tp_async
        self.attention = training.attention
        self.sequence_parallel = training.sequence_parallel
        self.context_parallel = training.context_parallel
        self.zero_stage = training.zero
        self.shard_copies = training.shard_replicas if training.zero >= 1 else 1  # copies of each ZeRO shard
        self.dtype_bytes = training.dtype_bytes
        self.fp8 = training.fp8
        self.torchao_fp8 = training.fp8 is not None and training.fp8.recipe == "tensorwise"
        self.param_bytes = float(training.dtype_bytes)
        self.grad_bytes = float(training.grad_bytes_per_param or training.dtype_bytes)
        self.reduce_bytes = float(training.reduce_bytes_per_param or self.grad_bytes)  # ZeRO-3 reduce-scatter
        self.optimizer_bytes = float(training.optimizer.state_bytes_per_param)
        self.grad_bucket_bytes = training.grad_bucket_mb * 2.0 ** 20
        self.gather_bytes = float(training.gather_bytes_per_param or training.dtype_bytes)
        # bytes each layer's ZeRO-3 all-gather moves per parameter (TP 1): fp8 for the blocks' linear
        # weights under torchao's FSDP float8 all-gather, gather_bytes for the rest
        self.gathered_bytes = self.workload.params * self.gather_bytes
        if training.fp8 is not None and training.fp8.fp8_all_gather and self.workload.architecture is not None:
            self.gathered_bytes = self.gathered_bytes - linear_params(self.workload) * (self.gather_bytes - 1.0)
        self.reshard_after_forward = training.reshard_after_forward
        self.overlap_param_gather = training.overlap_param_gather and 1 <= training.zero <= 2
        self._holders_memo: list[tuple[Plan, dict[int, list[tuple[int, int]]]]] = []
        self.framework_overhead_gib = training.framework_overhead_gib
        if calibration is None and training.framework is not None:
            from chameleon_opt.perf.calibration import load_framework
            calibration = load_framework(training.framework)
        self.calibration = calibration
        architecture = self.workload.architecture
        try:
            stack = calibration.kernels if calibration is not None and calibration.kernels else training.kernels
            if calibration is not None and training.kernels == COMPILED_STACKS.get(calibration.kernels or ""):
                # the job compiles the calibrated stack's blocks: its chains are priced fused
                stack = training.kernels
                self.calibration = calibration = replace(calibration, kernels=stack)
            self.kernels = kernels_for(stack, architecture.family if architecture is not None else None)
            if training.compiled_loss:  # (under TP too: its loss-parallel graph is not derived apart)
                self.kernels = replace(self.kernels, logit_bytes=COMPILED_LOSS_LOGIT_BYTES,
                                       loss_parallel_logit_bytes=None)
            if training.loss_chunks > 1:  # one slice of the tokens' logits alive at a time
                per_entry = self.workload.logit_bytes_per_entry(self.kernels)
                parallel = self.kernels.loss_parallel_logit_bytes
                self.kernels = replace(self.kernels, logit_bytes=per_entry / training.loss_chunks,
                                       loss_parallel_logit_bytes=None if parallel is None
                                       else parallel / training.loss_chunks)
        except ValueError as error:
            from chameleon_opt.errors import InputError
            raise InputError(None, "workload.architecture.family", str(error),
                             "set the workload's family to one listed, or use a framework without Hugging Face "
                             "kernels") from None
        if self.framework_overhead_gib is None and calibration is not None:
            self.framework_overhead_gib = calibration.overhead_gib
        stated = getattr(calibration, "sharded_interference", None)
        self.sharded_interference = SHARDED_OVERLAP_INTERFERENCE if stated is None else float(stated)
        network = instance.spec.cluster.network
        self.intra = Link(network.intra_node_gbps * 1e9, network.intra_node_latency_us * 1e-6)
        self.inter = Link(network.inter_node_gbps * 1e9, network.inter_node_latency_us * 1e-6)
        self.p2p_overhead_s = network.p2p_overhead_us * 1e-6
        self.op_overhead_s = network.schedule_overhead_us * 1e-6
        # the gradient all-reduce's ring inside a node, where measured slower than the link: never
        # faster, so the searches' ring floors over the links stay below what the model charges
        self.collective = Link(min(self.intra.bandwidth, (network.collective_gbps or network.intra_node_gbps) * 1e9),
                               max(self.intra.latency, (network.collective_latency_us or 0.0) * 1e-6))
        self.host_link_bps = network.host_link_gbps * 1e9
        self.host_memory_bps = network.host_memory_gbps * 1e9
        self.relief_options = relief_options(training.reliefs, self.recompute)
        self._prefix: dict[tuple[str, int, str], dict[str, np.ndarray]] = {}
        self._rows: dict[tuple[str, int, str], dict[str, np.ndarray]] = {}  # the same per layer (layer_costs)
        self._transient: dict[tuple[int, str], float] = {}
        self._menus: dict[tuple, list[ReliefCost]] = {}  # relief_menu's answers (the search asks again)
        self.total_params = float(self.workload.params.sum())
        self.time_sources: dict[tuple[str, int], str] = {}  # how each (device, TP)'s times were obtained
        self._stage_devices: dict[tuple[int, ...], DeviceType] = {}
        self._stage_costs: dict[tuple, StageCost] = {}  # stage_costs' answers by what they depend on

    @property
    def shard_optimizer(self) -> bool:
        """Whether some state is sharded over data-parallel replicas (ZeRO stage >= 1)."""
        return self.zero_stage >= 1

    def with_options(self, options: ScheduleOptions) -> "PerfModel":
        """The same instance under other schedule options (unset fields keep this model's)."""
        merged = ScheduleOptions(*(getattr(options, f) if getattr(options, f) is not None else getattr(self.options, f)
                                   for f in ("overlap_grad_reduce", "virtual_stages", "recomputation")))
        return PerfModel(self.instance, merged, self.calibration)

    def relief_of(self, relief: str | None) -> tuple[str, bool]:
        """(activation mode, optimizer offloaded) of a stage's relief; None is the training's global
        recomputation with the optimizer on the device."""
        return parse_relief(relief) if relief is not None else (self.recompute, False)

    # -- per-layer tables as prefix sums -----------------------------------------------------
    def _tables(self, device: DeviceType, tp: int, mode: str | None = None) -> dict[str, np.ndarray]:
        """Prefix sums of per-layer costs under one activation mode (offload keeps every activation:
        the `none` tables; its copies are priced by the callers)."""
        recompute = self.recompute if mode is None else ("none" if mode == "offload" else mode)
        key = (device.name, tp, recompute)
        if key in self._prefix:
            return self._prefix[key]
        table = self._layer_rows(device, tp, recompute)
        if recompute == "full" and self.checkpoint_every > 1:
            # layer-selective checkpointing: blocks k, 2k, ... are fully recomputed, every other layer
            # (the embedding and head included) keeps its activations and runs as without recomputation
            kept = self._layer_rows(device, tp, "none")
            layer = np.arange(self.workload.num_layers)
            plain = (layer % self.checkpoint_every != 0) | (layer == 0) | (layer == self.workload.num_layers - 1)
            table = {name: np.where(plain, kept[name], rows) for name, rows in table.items()}
        prefix = {name: np.concatenate([[0.0], np.cumsum(values)]) for name, values in table.items()}
        self._prefix[key] = prefix
        return prefix

    def _layer_rows(self, device: DeviceType, tp: int, recompute: str) -> dict[str, np.ndarray]:
        """Per-layer costs of one micro-batch with every layer under one recomputation mode."""
        w, mbs = self.workload, self.micro_batch_size
        own = self.calibration is not None and self.calibration.prices_architecture  # no profile borrowed
        profile = None if own else w.profile_table(device.name, mbs, tp)
        transferred = None
        if profile is None and self.calibration is not None:
            transferred = self.calibration.transfer(w, device.name, mbs, tp)
        update = w.params / tp * ADAM_BYTES_TOUCHED_PER_PARAM / (device.memory_bandwidth_gbps * 1e9)
        count_f, count_b = w.tp_allreduce_counts(recompute)
        one = ring_allreduce_time(w.tp_allreduce_bytes_per_sample() * mbs, tp, self.intra)
        if self.torchao_fp8 and self.sequence_parallel and tp > 1:
            # torchao's float8 TP all-gathers in fp8 (the column-parallel inputs forward, the row-parallel
            # output gradients backward) and reduce-scatters in bf16: half of each all-reduce at half the bytes
            one = 0.5 * (one + ring_allreduce_time(w.tp_allreduce_bytes_per_sample() * mbs / 2.0, tp, self.intra))
        fp8_step = np.zeros(w.num_layers)  # fp8 weight casts once per step (not sharded by ZeRO)
        if self.fp8 is not None and (profile is not None or (transferred is not None
                                                              and transferred.includes_collectives)):
            from chameleon_opt.errors import InputError
            raise InputError(None, "training.fp8", f"{w.name} has a measured profile on {device.name}: profiles "
                             "are bf16 measurements, and scaling one to fp8 is not modelled",
                             "drop training.fp8, or describe the workload by its architecture without profiles")
        if profile is not None or transferred is not None:
            table = profile if profile is not None else transferred.table
            fwd, bwd = table.forward_s, table.backward_s
            if self.fp8 is not None:
                fit = self.calibration.devices[device.name]
                fwd, bwd, fp8_step = self._with_fp8(device, tp, fwd, bwd, fit.peak_tflops, fit.compute_efficiency)
            # A profile at this TP (or one scaled from it) already includes its collectives; times
            # from the fitted efficiencies alone do not.
            timed = profile is not None or transferred.includes_collectives
            tp_fwd, tp_bwd = (np.zeros_like(fwd), np.zeros_like(fwd)) if timed else (count_f * one, count_b * one)
            if table.update_s.max() > 0:
                update = table.update_s.max() * w.params / max(self.total_params, 1.0)
            # Profiles are measured without recomputation: add the recomputed forward work (all of
            # each block's under full recomputation, FLOPs or not, less the MLP output projection when
            # the recompute stops early; a part's share of the FLOPs otherwise).
            share = w.checkpointed if recompute == "full" else np.divide(
                w.recomputed_flops_per_sample(recompute, self.kernels), w.forward_flops_per_sample,
                out=np.zeros(w.num_layers), where=w.forward_flops_per_sample > 0)
            bwd = bwd + fwd * share
            if recompute == "full" and self.recompute_early_stop:
                bwd = bwd - self._mlp_output_s(device, tp, fwd, profile is None and not timed and self.fp8 is None)
            if (transferred is not None and not transferred.includes_collectives and recompute == "selective"
                    and self.kernels.selective == "op-mm"):
                # The FLOP share reruns the matmuls; a per-op policy (torchtitan's) reruns every
                # unfused element-wise chain too (it saves only matmul and SDPA outputs).
                eager = self.calibration.elementwise_forward_s(w, device.name, tp) * mbs
                bwd = bwd + eager * (1.0 - share)
            if recompute == "full" and timed:
                tp_bwd = (count_b - w.tp_allreduce_counts("none")[1]) * one
            self.time_sources[(device.name, tp)] = "profile" if profile is not None else transferred.source
        else:
            rate = device.peak_tflops * 1e12 * device.efficiency
            fwd = w.forward_flops_per_sample * mbs / tp / rate
            recomputed = w.recomputed_flops_per_sample(recompute, self.kernels, self.recompute_early_stop)
            bwd = 2.0 * fwd + recomputed * mbs / tp / rate
            if self.fp8 is not None:
                plain = fwd
                fwd, bwd, fp8_step = self._with_fp8(device, tp, fwd, bwd, device.peak_tflops, device.efficiency)
                rerun = np.divide(recomputed - w.attention_core_flops_per_sample, w.forward_flops_per_sample
                                  - w.attention_core_flops_per_sample, out=np.zeros(w.num_layers),
                                  where=recomputed > w.attention_core_flops_per_sample)
                bwd = bwd + (fwd - plain) * np.clip(rerun, 0.0, 1.0)  # recomputed linears run in fp8 too
            # An eager stack's unfused element-wise chains (zero for fused kernels), which a FLOP count
            # does not see: streamed through HBM, forward once, backward twice, rerun by recomputation.
            eager = w.unfused_elementwise_bytes_per_sample(tp, self.kernels) * mbs / (
                device.memory_bandwidth_gbps * 1e9 * ELEMENTWISE_HBM_SHARE)
            rerun = w.checkpointed if recompute == "full" else float(
                recompute == "selective" and self.kernels.selective == "op-mm")
            fwd, bwd = fwd + eager, bwd + eager * (ELEMENTWISE_BACKWARD_RATIO + rerun)
            tp_fwd, tp_bwd = count_f * one, count_b * one
            self.time_sources[(device.name, tp)] = (f"FLOPs at {device.efficiency:g} of {device.name}'s peak "
                                                    "(catalogue efficiency)")
        if self.tp_async and self.sequence_parallel and tp > 1:
            tp_fwd, tp_bwd = self._async_tp_exposed(device, tp, one, tp_fwd, tp_bwd, count_f, count_b)
        elif self.calibration is not None:  # the stack's overlap of TP collectives with its GEMMs
            tp_fwd, tp_bwd = tp_fwd * self.calibration.tp_exposed, tp_bwd * self.calibration.tp_exposed
        # torchao's float8 linears save their bf16 input (matmul_with_hp_or_float8_args), TE's an fp8 copy
        act = w.activation_bytes_per_sample(tp, recompute, self.attention, self.sequence_parallel, self.kernels,
                                            fp8_linears=self.fp8 is not None and not self.torchao_fp8) * mbs
        return {"fwd": fwd, "bwd": bwd, "tp_fwd": tp_fwd, "tp_bwd": tp_bwd, "update": update,
                "params": w.params / tp, "act": act, "fp8_cache": self._fp8_cache_bytes(tp), "fp8_step": fp8_step}

    def _mlp_output_s(self, device: DeviceType, tp: int, fwd: np.ndarray, from_flops: bool) -> np.ndarray:
        """Per-layer seconds of the MLP output projection in one micro-batch's forward: what an
        early-stopping recompute does not rerun (Workload.recomputed_flops_per_sample). Priced as the
        layer times are: at the calibration's fitted GEMM rate when they come from bf16 FLOPs, else
        as the projection's share of the forward's FLOPs (a measured or profile-scaled forward, or
        one whose linears run in fp8)."""
        w = self.workload
        if from_flops:
            fit = self.calibration.devices[device.name]
            rate = fit.peak_tflops * 1e12 * fit.compute_efficiency
            return w.mlp_output_flops_per_sample * self.micro_batch_size / tp / rate
        return fwd * np.divide(w.mlp_output_flops_per_sample, w.forward_flops_per_sample,
                               out=np.zeros(w.num_layers), where=w.forward_flops_per_sample > 0)

    def _async_tp_exposed(self, device: DeviceType, tp: int, one: float, tp_fwd: np.ndarray, tp_bwd: np.ndarray,
                          count_f: np.ndarray, count_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Exposed time of a block's TP collectives under async TP (torchtitan's micro-pipelined
        all-gather + matmul and matmul + reduce-scatter, torch symmetric memory): each of the four
        collectives (half a ring all-reduce each) is split into tp steps, one chunk's transfer running
        beside the previous chunk's matmul, so what shows beyond the matmul is the transfer's excess over
        it plus one step of the shorter (the pipeline's fill): max(c - g, 0) + min(c, g) / tp. The
        backward's collectives pair with the input-gradient matmuls (the same FLOPs); a rerun forward's
        (full recomputation) with the forward's. Blocks only, and only where the collectives are priced
        apart (a profile's measured times keep theirs): the embedding's reduce-scatter stays exposed.
        Without sequence parallelism the collectives are all-reduces, which async TP does not pipeline."""
        w, mbs = self.workload, self.micro_batch_size
        fit = self.calibration.devices.get(device.name) if self.calibration is not None else None
        rate = device.peak_tflops * 1e12 * (fit.compute_efficiency if fit is not None else device.efficiency)
        if self.fp8 is not None and device.fp8_peak_tflops is not None:  # those GEMMs run in fp8
            rate = rate * device.fp8_peak_tflops / device.peak_tflops * self._fp8_ratio()
        gemm = w.tp_collective_gemm_flops_per_sample() * mbs / tp / rate
        half = one / 2.0
        exposed = (np.maximum(half - gemm, 0.0) + np.minimum(half, gemm) / tp).sum(axis=1)
        block = (gemm.sum(axis=1) > 0) & (tp_fwd > 0)
        per_pass = np.divide(count_b, count_f, out=np.zeros_like(count_b), where=count_f > 0)
        return np.where(block, exposed, tp_fwd), np.where(block, exposed * per_pass, tp_bwd)

    def _with_fp8(self, device: DeviceType, tp: int, fwd: np.ndarray, bwd: np.ndarray, peak_tflops: float,
                  efficiency: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(forward, backward, per-step weight casts) per layer with the blocks' linears in fp8 (perf/fp8.py):
        their bf16 GEMM time at `efficiency` of `peak_tflops` replaced by the fp8 one, plus the casts;
        weights cast once per step are charged to the step (optimizer_time, whole: every replica casts
        its full weights). A device without an fp8 peak is refused."""
        if device.fp8_peak_tflops is None:
            from chameleon_opt.errors import InputError
            raise InputError(None, "training.fp8", f"device type {device.name} has no fp8 peak (no fp8 tensor "
                             "cores), so fp8 linears cannot run on it", "drop training.fp8, or give the device "
                             "type its fp8_peak_tflops")
        assert self.fp8 is not None
        if self.torchao_fp8:
            d_f, d_b = torchao_block_seconds(
                self.workload, tp, self.micro_batch_size, peak_tflops, device.fp8_peak_tflops, efficiency,
                device.memory_bandwidth_gbps, self._fp8_ratio(), self.fp8.fp8_all_gather)
            return fwd + d_f, bwd + d_b, np.zeros(self.workload.num_layers)
        d_f, d_b, weights = fp8_block_seconds(
            self.workload, tp, self.micro_batch_size, peak_tflops, device.fp8_peak_tflops, efficiency,
            device.memory_bandwidth_gbps, self._fp8_ratio(), self.fp8.weight_cast == "per_micro_batch")
        return fwd + d_f, bwd + d_b, weights

    def _fp8_ratio(self) -> float:
        """The fp8 GEMM's share of the bf16 efficiency: the calibration's, else FP8_GEMM_RATIO."""
        stated = getattr(self.calibration, "fp8_ratio", None)
        return FP8_GEMM_RATIO if stated is None else float(stated)

    def _fp8_cache_bytes(self, tp: int) -> np.ndarray:
        """Per layer and TP rank: the fp8 weight copies kept across a step's micro-batches (weight_cast
        per_step; perf/fp8.py FP8_CACHE_BYTES_PER_PARAM), else nothing."""
        if self.fp8 is None or self.fp8.weight_cast != "per_step" or self.workload.architecture is None:
            return np.zeros(self.workload.num_layers)
        return linear_params(self.workload) / tp * FP8_CACHE_BYTES_PER_PARAM

    def _range(self, table: dict[str, np.ndarray], name: str, first: int, end: int) -> float:
        values = table[name]
        return float(values[end] - values[first])

    def stage_device(self, devices: tuple[int, ...]) -> DeviceType:
        """A TP group runs at the pace of its slowest member and fits in its smallest memory.
        Remembered per group: every stage's time and memory asks, 50,000 times an evaluation at
        16,384 devices."""
        key = devices if isinstance(devices, tuple) else tuple(devices)  # some callers pass lists
        found = self._stage_devices.get(key)
        if found is None:
            types = [self.instance.device_types[d] for d in key]
            found = self._stage_devices[key] = min(types, key=lambda t: (t.peak_tflops * t.efficiency, t.memory_gib))
        return found

    def link_between(self, a: int, b: int) -> Link:
        return self.intra if self.instance.node_of(a) == self.instance.node_of(b) else self.inter

    def group_link(self, devices: list[int] | tuple[int, ...]) -> Link:
        """The slowest link a gradient all-reduce ring over these devices crosses (inside a node:
        the measured collective ring, `network.collective_gbps`, when given)."""
        nodes = {self.instance.node_of(d) for d in devices}
        return self.inter if len(nodes) > 1 else self.collective

    def attention_core_seconds(self, device: DeviceType, tp: int) -> tuple[np.ndarray, np.ndarray]:
        """(forward, backward) seconds per layer of one micro-batch's attention core on one rank, priced
        as the layer tables price it: the calibration's flash kernel at its utilisation (calibration.
        flash_attention_seconds: the causal half, backward 2.5x), else GEMM FLOPs at the fitted (or
        catalogue) efficiency, backward twice the forward."""
        w, mbs = self.workload, self.micro_batch_size
        core = w.attention_core_flops_per_sample * mbs / tp
        fit = self.calibration.devices.get(device.name) if self.calibration is not None else None
        peak = (fit.peak_tflops if fit is not None else device.peak_tflops) * 1e12
        utilisation = (self.calibration.flash_utilisation(device.name, w.sequence_length)
                       if fit is not None else None)
        if utilisation:
            from chameleon_opt.perf.calibration import flash_attention_seconds
            return flash_attention_seconds(core, peak * utilisation)
        forward = core / (peak * (fit.compute_efficiency if fit is not None else device.efficiency))
        return forward, 2.0 * forward

    def context_parallel_steps(self, plan: Plan, pipeline_index: int, s: int
                               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """One ring step of each block of stage s under context parallelism (cp > 1), one micro-batch:
        (forward message s, backward message s, forward attention s, backward attention s).
        Transformer Engine's AttnFuncWithCPAndKVP2P (context_parallel.py) runs cp steps per block:
        step i computes the local queries against the K/V chunk received at step i - 1 while the next
        chunk is sent to the ring's next rank and received from its previous one (isend / irecv on the
        cp group); its backward passes K, V and their gradients together (twice the bytes). The
        load-balanced split (chunks i and 2cp - 1 - i per rank) makes every step 1 / cp of the rank's
        causal attention. The ring runs over the cp group's link: inside a node when all its ranks
        are on one node, else the per-GPU network share (Megatron numbers cp ranks next to tp, so
        tp x cp <= GPUs per node keeps it inside)."""
        cp = self.context_parallel
        group = pipeline_index - pipeline_index % cp
        stage = plan.pipelines[pipeline_index].stages[s]
        nodes = {self.instance.node_of(plan.pipelines[k].stages[s].devices[0]) for k in range(group, group + cp)}
        link = self.inter if len(nodes) > 1 else self.intra
        device, tp = self.stage_device(stage.devices), len(stage.devices)
        attention_f, attention_b = self.attention_core_seconds(device, tp)
        kv = self.workload.context_parallel_kv_bytes_per_sample(tp)[stage.first:stage.end] * self.micro_batch_size
        blocks = slice(stage.first, stage.end)
        sent = kv > 0
        return (np.where(sent, link.latency + kv / link.bandwidth, 0.0),
                np.where(sent, link.latency + 2.0 * kv / link.bandwidth, 0.0),
                attention_f[blocks] / cp, attention_b[blocks] / cp)

    def context_parallel_exposed(self, plan: Plan, pipeline_index: int, s: int) -> tuple[float, float]:
        """(forward, backward) seconds of one micro-batch's ring-attention exchanges on stage s that its
        attention compute does not hide: each of a block's cp - 1 exchanges shows max(0, message time -
        one step's attention) (context_parallel_steps); a rerun of the forward (full or Megatron's
        selective recomputation) repeats the forward's. (0, 0) without context parallelism."""
        cp = self.context_parallel
        if cp <= 1:
            return 0.0, 0.0
        message_f, message_b, step_f, step_b = self.context_parallel_steps(plan, pipeline_index, s)
        forward = (cp - 1) * float(np.maximum(message_f - step_f, 0.0).sum())
        backward = (cp - 1) * float(np.maximum(message_b - step_b, 0.0).sum())
        mode, _ = self.relief_of(plan.pipelines[pipeline_index].stages[s].relief)
        return forward, backward + (forward if mode in ("full", "selective") else 0.0)

    def stage_times(self, devices: tuple[int, ...], first: int, end: int, relief: str | None = None
                    ) -> tuple[float, float, float, float]:
        """(forward_s, backward_s, compute_s, tensor_parallel_s) of one micro-batch on a stage under
        `relief`. Activation offload copies the micro-batch's activations to the host during its
        forward and back during its backward on a copy stream: each op lasts max(its work, the copy)."""
        device = self.stage_device(devices)
        mode, _ = self.relief_of(relief)
        table = self._tables(device, len(devices), mode)
        tp_f = self._range(table, "tp_fwd", first, end)
        tp_b = self._range(table, "tp_bwd", first, end)
        if len(devices) > 1 and len({self.instance.node_of(d) for d in devices}) > 1:
            scale = self.intra.bandwidth / self.inter.bandwidth  # a TP group across nodes uses the NICs
            tp_f, tp_b = tp_f * scale, tp_b * scale
        scale = self.stage_scale(device, first, end, len(devices))
        fwd = self._range(table, "fwd", first, end) * scale
        bwd = self._range(table, "bwd", first, end) * scale
        if mode == "offload":
            copy = self._range(table, "act", first, end) / self.host_link_bps
            return max(fwd + tp_f, copy), max(bwd + tp_b, copy), fwd + bwd, tp_f + tp_b
        return fwd + tp_f, bwd + tp_b, fwd + bwd, tp_f + tp_b

    def stage_scale(self, device: DeviceType, first: int, end: int, tp: int) -> float:
        """The device's measured stage_scaling at the stage's parameter bytes per device: a
        non-decreasing fit of the points (pooled where they fall) and at least 1, so a stage never
        computes faster than its layers apart and per-layer sums (the searches' floors, layer_costs)
        stay below what the model charges."""
        points = device.stage_scaling
        if not points:
            return 1.0
        nbytes = float(self.workload.params[first:end].sum()) * self.param_bytes / tp
        sizes = np.log([b for b, _ in sorted(points)])
        return max(float(np.interp(np.log(max(nbytes, 1.0)), sizes, non_decreasing([f for _, f in sorted(points)]))), 1.0)

    def boundary_send_time(self, sender: tuple[int, ...], receiver: tuple[int, ...], last_layer: int) -> float:
        """Blocking send of one micro-batch's activation (or its gradient) across a stage boundary:
        every TP rank sends its full copy over its own share of the link."""
        return self.boundary_send_on(self.link_between(sender[0], receiver[0]), last_layer)

    def boundary_send_on(self, link: Link, last_layer: int) -> float:
        """That send over `link` (for bounds that know the link but not the groups)."""
        nbytes = self.workload.boundary_bytes_per_sample[last_layer] * self.micro_batch_size
        if nbytes <= 0:
            return 0.0
        return link.send_time(nbytes) + self.p2p_overhead_s

    def _plan_holders(self, plan: Plan) -> dict[int, list[tuple[int, int]]]:
        """layer_holders of `plan`, remembered for the last few plans (every stage of a ZeRO-3 plan asks)."""
        for seen, holders in self._holders_memo:
            if seen is plan:
                return holders
        holders = self.layer_holders(plan)
        self._holders_memo.insert(0, (plan, holders))
        del self._holders_memo[4:]
        return holders

    def collective_link(self, devices: list[int] | tuple[int, ...]) -> tuple[Link, float]:
        """(per-rank link, start-up latency) of one all-gather or reduce-scatter ring over `devices`: the
        link counts the NICs the ring drives (comm.ring_link_across_nodes), the latency NCCL's ring model
        (comm.ring_latency). Used by the ZeRO-3 collectives; the gradient all-reduce keeps group_link
        (each ring one NIC share, the slowest link's latency at every step)."""
        counts: dict[int, int] = {}
        for d in devices:
            node = self.instance.node_of(d)
            counts[node] = counts.get(node, 0) + 1
        link = ring_link_across_nodes(self.intra, self.inter, list(counts.values()))
        return link, ring_latency(len(devices), len(counts), self.intra, self.inter)

    def sharded_collective_times(self, plan: Plan, j: int, s: int) -> tuple[float, float, float, float]:
        """(forward, backward, one unit's all-gather, one unit's reduce-scatter) seconds of one micro-batch's
        ZeRO-3 collectives on slot (j, s); the last two for the stage's largest layer. Each layer
        (one FSDP unit) has its parameters all-gathered over the slot's shard group before its forward,
        again before its backward unless reshard_after_forward is off (FSDP FULL_SHARD frees them after the
        forward; SHARD_GRAD_OP keeps them), and its gradients reduce-scattered after its backward, on every
        micro-batch: FSDP and DeepSpeed ZeRO-3 synchronise every backward (Composer enters no_sync only for
        DDP modules: composer/trainer/dist_strategy.py, ddp_sync_context). Bytes: parameters per TP rank x
        gather_bytes_per_param (FSDP MixedPrecision.param_dtype; 1 for the linear weights gathered in fp8,
        gathered_bytes) and x the reduce-scatter's precision (reduce_bytes_per_param: FSDP's
        reduce_dtype, by default the gradient precision); ring all-gather / reduce-scatter over
        collective_link, its start-up latency once per layer and collective.
        Zero below ZeRO-3 or with a shard group of one slot."""
        if self.zero_stage < 3:
            return 0.0, 0.0, 0.0, 0.0
        stage = plan.pipelines[j].stages[s]
        holders = self._plan_holders(plan)
        tp = len(stage.devices)
        groups: dict[tuple[tuple[int, int], ...], list[int]] = {}
        for layer in range(stage.first, stage.end):
            slots = holders.get(layer, [])
            if (j, s) not in slots:
                continue
            at = slots.index((j, s))
            for start, end in shard_groups(len(slots), self.shard_copies):
                if start <= at < end:
                    groups.setdefault(tuple(slots[start:end]), []).append(layer)
        forward = backward = unit_gather = unit_reduce = 0.0
        for members, layers in groups.items():
            n = len(members)
            if n < 2:
                continue
            link, latency = self.collective_link([plan.pipelines[a].stages[b].devices[0] for a, b in members])
            params = float(self.workload.params[layers].sum()) / tp
            largest = float(self.workload.params[layers].max()) / tp
            share = (n - 1) / n / link.bandwidth
            gathered = self.gathered_bytes[layers] / tp
            gather = len(layers) * latency + float(gathered.sum()) * share
            reduce = len(layers) * latency + params * self.reduce_bytes * share
            forward += gather
            backward += (gather if self.reshard_after_forward else 0.0) + reduce
            unit_gather = max(unit_gather, latency + float(gathered.max()) * share)
            unit_reduce = max(unit_reduce, latency + largest * self.reduce_bytes * share)
        return forward, backward, unit_gather, unit_reduce

    def overlap_sharded(self, forward: float, backward: float, collectives: tuple[float, float, float, float]
                        ) -> tuple[float, float]:
        """A micro-batch's (forward, backward) on a stage once its ZeRO-3 collectives run beside its compute.
        FSDP and DeepSpeed ZeRO-3 issue them on their own CUDA streams and fetch the next layer's
        parameters while the current layer computes (FSDP's prefetching: the CPU issues the next unit's
        all-gather ahead of the GPU, or forward_prefetch / backward_prefetch; Zhao et al., 'PyTorch FSDP',
        VLDB 2023, Sec. 3.3.1), and reduce-scatter a layer's gradients while the layer before it runs its
        backward: the forward lasts max(compute, all-gathers) plus the first layer's gather, which nothing
        precedes, and the backward max(compute, all-gathers + reduce-scatters) plus the last layer's
        reduce-scatter, which nothing follows (stage-wide sums: layer by layer the same for equal layers).
        The overlap is not free: sharded_interference x the shorter of the two is added to each
        (SHARDED_OVERLAP_INTERFERENCE)."""
        gather, reduce_and_gather, unit_gather, unit_reduce = collectives
        if gather <= 0.0 and reduce_and_gather <= 0.0:
            return forward, backward
        lost = self.sharded_interference
        return (max(forward, gather) + lost * min(forward, gather) + unit_gather,
                max(backward, reduce_and_gather) + lost * min(backward, reduce_and_gather) + unit_reduce)

    def framework_bytes(self, device: DeviceType) -> float:
        """The framework's own per-device memory: the instance's or the calibration's fitted value,
        else the device type's reserved_gib (an assumption unless the instance says otherwise)."""
        gib = self.framework_overhead_gib if self.framework_overhead_gib is not None else device.reserved_gib
        return gib * GIB

    def comm_buffer_bytes(self, replicas: int) -> float:
        """Pipeline receive buffers (one activation and one gradient message of the largest boundary)
        and, with data-parallel replicas, one gradient bucket being reduced. A workload given by
        per-layer bytes (no architecture) states its own memory: nothing is added to it."""
        if self.workload.architecture is None:
            return 0.0
        boundary = float(self.workload.boundary_bytes_per_sample.max(initial=0.0)) * self.micro_batch_size
        return 2.0 * boundary + (self.grad_bucket_bytes if replicas > 1 else 0.0)

    def transient_bytes(self, tp: int, replicas: int = 1, mode: str | None = None,
                        held_params: float = 0.0) -> float:
        """One block's backward working set (the same for every block), plus under ZeRO-3 the two
        layers' full parameters gathered at a time (the one computing and the one prefetched), when
        its shard group has more than one slot; without reshard_after_forward, the `held_params`
        (the stage's parameters per TP rank) stay gathered from forward to backward instead."""
        recompute = self.recompute if mode is None else ("none" if mode == "offload" else mode)
        if (tp, recompute) not in self._transient:
            self._transient[(tp, recompute)] = self.workload.backward_transient_bytes_per_sample(
                tp, recompute, self.attention, self.sequence_parallel, self.kernels) * self.micro_batch_size
        gathered = 0.0
        if self.zero_stage >= 3 and shard_group_size(replicas, self.shard_copies) > 1:
            gathered = (2.0 * float(self.gathered_bytes.max()) / tp if self.reshard_after_forward
                        else held_params * self.gather_bytes)
        return self._transient[(tp, recompute)] + gathered

    def stage_memory_breakdown(self, devices: tuple[int, ...], first: int, end: int, stage: int, stages: int,
                               own_micro_batches: float, extra_micro_batches: float = 0.0,
                               replicas: int = 1, relief: str | None = None) -> MemoryBreakdown:
        """Per-device bytes of a stage slot at its peak, by term: state sharded by TP and by ZeRO over
        the smallest shard group of the stage's `replicas` (all of them unless training.shard_replicas
        keeps several copies of each shard), activations of the micro-batches 1F1B (or interleaved
        1F1B) keeps in flight, the head's logits, one backward working set, buffers and the framework overhead.
        Under `relief`: the recomputation mode's activations; with activation offload only two
        micro-batches stay on the device (the one in compute and the one being copied); with the
        optimizer offloaded no optimizer state."""
        device = self.stage_device(devices)
        tp = len(devices)
        mode, optimizer_offloaded = self.relief_of(relief)
        table = self._tables(device, tp, mode)
        params = self._range(table, "params", first, end)
        p_div, g_div, o_div = zero_shards(self.zero_stage, replicas, self.shard_copies)
        in_flight = in_flight_micro_batches(stage, stages, int(own_micro_batches), extra_micro_batches,
                                            self.options.virtual_stages or 1)
        if mode == "offload":
            in_flight = min(in_flight, 2.0)
        activations = in_flight * self._range(table, "act", first, end)
        head = self.workload.num_layers - 1
        logits = 0.0
        if end > head >= first and self.workload.architecture is not None:
            # The head is in the last rank's last chunk, whose forward Megatron's interleaved order
            # follows at once by that micro-batch's backward: the logits of as many micro-batches
            # are alive as on a plain 1F1B last stage (head_in_flight_micro_batches), not the
            # stage's interleaved count that its other activations take.
            per_micro_batch = float(self.head_logit_bytes(tp))
            held = head_in_flight_micro_batches(stage, stages, int(own_micro_batches), extra_micro_batches)
            held = min(held, in_flight)
            activations -= (in_flight - held) * per_micro_batch
            logits = held * per_micro_batch
        return MemoryBreakdown(
            parameters=params * self.param_bytes / p_div + self._range(table, "fp8_cache", first, end),
            gradients=params * self.grad_bytes / g_div,
            optimizer=0.0 if optimizer_offloaded else params * self.optimizer_bytes / o_div,
            activations=activations - logits, logits=logits,
            transient=self.transient_bytes(tp, replicas, mode, params), comm_buffers=self.comm_buffer_bytes(replicas),
            framework=self.framework_bytes(device))

    def head_logit_bytes(self, tp: int) -> float:
        """The loss's logits buffers of one micro-batch on one TP rank (Workload.logit_bytes_per_entry):
        the part of the head's activations that the breakdown names `logits`."""
        a = self.workload.architecture
        assert a is not None
        return (self.workload.logit_bytes_per_entry(self.kernels, tp) * self.workload.sequence_length * a.vocab / tp
                * self.micro_batch_size)

    def stage_memory(self, devices: tuple[int, ...], first: int, end: int, stage: int, stages: int,
                     own_micro_batches: float, extra_micro_batches: float = 0.0,
                     replicas: int = 1, relief: str | None = None) -> tuple[float, float]:
        """(bytes needed, bytes available) on each device of a stage slot (see stage_memory_breakdown;
        available is the device's whole memory: the framework's share is a term of the need)."""
        breakdown = self.stage_memory_breakdown(devices, first, end, stage, stages, own_micro_batches,
                                                extra_micro_batches, replicas, relief)
        return breakdown.total, self.stage_device(devices).memory_gib * GIB

    def layer_costs(self, devices: tuple[int, ...], replicas: int = 1, relief: str | None = None) -> LayerCosts:
        """Per-layer linear coefficients of time and memory, for solvers that pick layer ranges, under
        `relief` (activation offload is priced as keeping every activation: its two resident
        micro-batches are not linear in the in-flight count, so these rows over-state its memory)."""
        device = self.stage_device(devices)
        mode, optimizer_offloaded = self.relief_of(relief)
        key = (device.name, len(devices), mode)
        if key not in self._rows:  # the searches ask thousands of times (templates: 3,671 on 184 devices)
            rows = {name: np.diff(values) for name, values in self._tables(device, len(devices), mode).items()}
            for values in rows.values():
                values.setflags(write=False)  # shared by every caller: a write would corrupt the others
            self._rows[key] = rows
        per_layer = self._rows[key]
        p_div, g_div, o_div = zero_shards(self.zero_stage, replicas, self.shard_copies)
        static = per_layer["params"] * (self.param_bytes / p_div + self.grad_bytes / g_div
                                        + (0.0 if optimizer_offloaded else self.optimizer_bytes / o_div)) \
            + per_layer["fp8_cache"]
        if self.zero_stage >= 3 and not self.reshard_after_forward and shard_group_size(replicas, self.shard_copies) > 1:
            static = static + per_layer["params"] * self.gather_bytes  # held gathered from forward to backward
        spans_nodes = len(devices) > 1 and len({self.instance.node_of(d) for d in devices}) > 1
        tp_scale = self.intra.bandwidth / self.inter.bandwidth if spans_nodes else 1.0
        time = per_layer["fwd"] + per_layer["bwd"] + (per_layer["tp_fwd"] + per_layer["tp_bwd"]) * tp_scale
        device_bytes = device.memory_gib * GIB
        constant = self.framework_bytes(device) + self.comm_buffer_bytes(replicas)
        return LayerCosts(time, static, per_layer["act"], self.transient_bytes(len(devices), replicas, mode),
                          device_bytes - constant, constant, device_bytes)

    def relief_layer_costs(self, devices: tuple[int, ...], replicas: int = 1) -> LayerCosts:
        """Linear rows that refuse nothing some supported relief admits: per layer the fastest
        relief's time, memory of the lightest (linear solvers' surrogate; the plan's reliefs are
        then chosen exactly by perf/relief.py). With one supported relief: layer_costs."""
        costs = self.layer_costs(devices, replicas, self.lightest_relief)
        if len(self.relief_options) == 1:
            return costs
        fastest = np.min([self.layer_costs(devices, replicas, r).time_s for r in self.relief_options], axis=0)
        return replace(costs, time_s=fastest)

    def restricted_to(self, reliefs: tuple[str, ...]) -> "PerfModel":
        """The same model (tables shared) with only `reliefs` open to the solvers."""
        other = copy.copy(self)
        other.relief_options, other._menus = tuple(reliefs), {}
        return other

    @property
    def fastest_relief(self) -> str:
        """The supported relief that adds least time (keeping activations before offloading them
        before recomputing part or all of them; the optimizer on the device)."""
        order = {"none": 0, "offload": 1, "selective": 2, "full": 3}
        return min(self.relief_options, key=lambda r: (self.relief_of(r)[1], order[self.relief_of(r)[0]]))

    @property
    def lightest_relief(self) -> str:
        """The supported relief with the least memory per layer (full recomputation before selective
        before keeping activations, optimizer offloaded when supported): what linear memory rows
        (templates, rerouting) assume so they never refuse what some relief admits."""
        order = {"full": 0, "selective": 1, "offload": 2, "none": 3}
        return min(self.relief_options, key=lambda r: (not self.relief_of(r)[1], order[self.relief_of(r)[0]]))

    def optimizer_time(self, devices: tuple[int, ...], first: int, end: int, relief: str | None = None,
                       replicas: int = 1) -> float:
        """The optimizer step of a stage: memory-bound on the device, or with the optimizer state
        offloaded, gradients down and parameters back over the host link plus the CPU's step at the
        host's memory bandwidth. Under ZeRO >= 1 (Megatron's distributed optimizer, FSDP, DeepSpeed)
        each of the stage's `replicas` slots steps only its shard: the time divides by the shard
        group (zero_shards), as the optimizer state does. Callers that bound the step from below
        without a plan pass the most replicas a layer can have."""
        table = self._tables(self.stage_device(devices), len(devices))
        shards = self.optimizer_shards(replicas)
        casts = self._range(table, "fp8_step", first, end)  # fp8 weights cast once per step, on the device
        if relief is not None and self.relief_of(relief)[1]:
            params = self._range(table, "params", first, end)
            return casts + params / shards * ((self.grad_bytes + self.param_bytes) / self.host_link_bps
                                              + ADAM_BYTES_TOUCHED_PER_PARAM / self.host_memory_bps)
        return self._range(table, "update", first, end) / shards + casts

    def optimizer_shards(self, replicas: int) -> float:
        """What the optimizer step divides by when each layer has `replicas` live slots: their shard
        group under ZeRO >= 1, else 1 (every replica steps everything). Floors that know a plan's
        pipeline count (each layer then has that many replicas) divide unsharded steps by it."""
        return zero_shards(self.zero_stage, replicas, self.shard_copies)[2]

    def relief_menu(self, pipe: Pipeline, s: int, extra: float = 0.0, replicas: int = 1) -> list[ReliefCost]:
        """Every supported relief that fits stage s of `pipe` in memory, with its forward and
        backward times (sends apart: they do not depend on the relief) and optimizer step."""
        stage, stages = pipe.stages[s], pipe.stages
        key = (stage.devices, stage.first, stage.end, s, len(stages), pipe.micro_batches, extra, replicas)
        if key in self._menus:
            return self._menus[key]
        capacity = self.stage_device(stage.devices).memory_gib * GIB
        menu = []
        for relief in self.relief_options:
            need, _ = self.stage_memory(stage.devices, stage.first, stage.end, s, len(stages), pipe.micro_batches,
                                        extra, replicas, relief)
            if need <= capacity:
                fwd, bwd, _, _ = self.stage_times(stage.devices, stage.first, stage.end, relief)
                menu.append(ReliefCost(relief, fwd, bwd,
                                       self.optimizer_time(stage.devices, stage.first, stage.end, relief, replicas)))
        self._menus[key] = menu
        return menu

    # -- whole plans ----------------------------------------------------------------------------
    def stage_costs(self, plan: Plan, pipeline_index: int, extra: list[float],
                    replicas: dict[int, int] | None = None) -> list[StageCost]:
        """Costs of every stage of one pipeline; `replicas[layer]` counts the live slots holding
        each layer (for the distributed optimizer's sharding)."""
        pipe = plan.pipelines[pipeline_index]
        stages = pipe.stages
        costs = []
        node = self.instance.node_of
        if len(self._stage_costs) > STAGE_COSTS_KEPT:
            self._stage_costs.clear()
        for s, stage in enumerate(stages):
            shards = min(replicas[layer] for layer in range(stage.first, stage.end)) if replicas else 1
            # Everything a stage's cost depends on: its group's device type, size and node span, its
            # layers, place and load, its relief, and the links and boundary layers to its neighbours.
            # At 16,384 devices 2,048 stages share a few dozen keys (an evaluation: 0.25 -> 0.1 s).
            head = stage.devices[0]
            sharded = self.sharded_collective_times(plan, pipeline_index, s)
            ring_f, ring_b = self.context_parallel_exposed(plan, pipeline_index, s)
            key = (ring_f, ring_b, id(self.stage_device(stage.devices)), len(stage.devices),
                   len({node(d) for d in stage.devices}) > 1,
                   stage.first, stage.end, s, len(stages), pipe.micro_batches, extra[s], shards, stage.relief,
                   node(head) == node(stages[s + 1].devices[0]) if s + 1 < len(stages) else None,
                   (node(head) == node(stages[s - 1].devices[0]), stages[s - 1].end) if s > 0 else None,
                   sharded)
            known = self._stage_costs.get(key)
            if known is not None:
                costs.append(known)
                continue
            fwd, bwd, compute, tp_time = self.stage_times(stage.devices, stage.first, stage.end, stage.relief)
            send_f = self.boundary_send_time(stage.devices, stages[s + 1].devices, stage.end - 1) \
                if s + 1 < len(stages) else 0.0
            send_b = self.boundary_send_time(stage.devices, stages[s - 1].devices, stages[s - 1].end - 1) \
                if s > 0 else 0.0
            memory = self.stage_memory_breakdown(stage.devices, stage.first, stage.end, s, len(stages),
                                                 pipe.micro_batches, extra[s], shards, stage.relief)
            have = self.stage_device(stage.devices).memory_gib * GIB
            mode, offloaded = self.relief_of(stage.relief)
            relief_s = relief_opt_s = 0.0
            if mode != "none":
                keep_f, keep_b, _, _ = self.stage_times(stage.devices, stage.first, stage.end, "none")
                relief_s = fwd + bwd - keep_f - keep_b
            if offloaded:
                relief_opt_s = self.optimizer_time(stage.devices, stage.first, stage.end, stage.relief, shards) - \
                    self.optimizer_time(stage.devices, stage.first, stage.end, replicas=shards)
            name = stage.relief if stage.relief is not None else self.recompute
            fwd, bwd = fwd + ring_f, bwd + ring_b
            with_f, with_b = self.overlap_sharded(fwd, bwd, sharded)
            sharded_s = with_f - fwd + with_b - bwd
            # the schedule's own work per operation (network.schedule_overhead_us)
            with_f, with_b = with_f + self.op_overhead_s, with_b + self.op_overhead_s
            costs.append(StageCost(with_f, with_b, compute, tp_time, send_f, send_b, memory.total,
                                   have, memory, name, relief_s, relief_opt_s, sharded_s, ring_f + ring_b))
            self._stage_costs[key] = costs[-1]
        return costs

    @staticmethod
    def layer_holders(plan: Plan, failed_slots: frozenset[tuple[int, int]] = frozenset()
                      ) -> dict[int, list[tuple[int, int]]]:
        """For every layer, the live (pipeline, stage) slots that hold a replica of it."""
        holders: dict[int, list[tuple[int, int]]] = {}
        for j, pipe in enumerate(plan.pipelines):
            for s, stage in enumerate(pipe.stages):
                if (j, s) not in failed_slots:
                    for layer in range(stage.first, stage.end):
                        holders.setdefault(layer, []).append((j, s))
        return holders

    def slot_reduce_times(self, plan: Plan, failed_slots: frozenset[tuple[int, int]] = frozenset()
                          ) -> dict[tuple[int, int], tuple[float, float]]:
        """Per live slot: (time of all its gradient all-reduces, time of its last bucket's). Each layer
        is reduced among the slots that hold it; layers with the same replica set form one group
        (with identical pipelines: one group per stage); a slot reduces its groups one after another.
        With overlap_param_gather (Megatron's distributed optimizer) only the reduce-scatter half is
        left: the parameter all-gather runs behind the next step's forward (Megatron-LM
        core/distributed/param_and_grad_buffer.py: start_param_sync from the forward pre-hook).
        Under ZeRO-3 the gradients were reduce-scattered inside every micro-batch's backward
        (sharded_collective_times): only the all-reduce of each shard across the shard's copies
        (shard_replicas > 1, HSDP) remains."""
        holders = self.layer_holders(plan, failed_slots)
        groups: dict[tuple[tuple[int, int], ...], list[int]] = {}
        for layer, slots in holders.items():
            groups.setdefault(tuple(slots), []).append(layer)
        per_slot: dict[tuple[int, int], tuple[float, float]] = {}
        grad_bytes = self.workload.params * self.grad_bytes / plan.tensor_parallel
        reduce = ring_allgather_time if self.overlap_param_gather else ring_allreduce_time
        for slots, layers in groups.items():
            if len(slots) < 2:
                continue
            ring = [plan.pipelines[j].stages[s].devices[0] for j, s in slots]
            nbytes = float(grad_bytes[layers].sum())
            if self.zero_stage >= 3:
                copies = min(self.shard_copies, len(slots))
                if copies < 2:
                    continue
                nbytes /= shard_group_size(len(slots), self.shard_copies)
                ring = [ring[start] for start, _ in shard_groups(len(slots), self.shard_copies)]
            link = self.group_link(ring)
            time = reduce(nbytes, len(ring), link)
            last = reduce(min(nbytes, self.grad_bucket_bytes or nbytes), len(ring), link)
            for slot in slots:
                total, _ = per_slot.get(slot, (0.0, 0.0))
                per_slot[slot] = (total + time, last)
        return per_slot

    def data_parallel_time(self, plan: Plan, failed_slots: frozenset[tuple[int, int]] = frozenset()) -> float:
        """Gradient all-reduce after the pipeline drains (no overlap): slots run in parallel, the slowest
        counts. (With the distributed optimizer it is a reduce-scatter plus an all-gather: same volume.)"""
        return max((total for total, _ in self.slot_reduce_times(plan, failed_slots).values()), default=0.0)

    def exposed_data_parallel_time(self, plan: Plan, pipelines: list[PipelineEstimate],
                                   failed_slots: frozenset[tuple[int, int]] = frozenset()) -> float:
        """The all-reduce time left after the pipeline ends when each bucket is reduced as soon as the
        last micro-batch's backward has produced it. Slot s of a pipeline finishes that backward while
        the stages before it still run theirs (sum of their op_backward_s: its slack), and its buckets
        fill during its own last backward, so only the last bucket must wait for it to end:
        exposed = max over slots of max(R - B - slack, R_last - slack, 0), R its reductions, B its
        last backward; the step ends when the slowest pipeline and every slot's reductions are done."""
        reduce_times = self.slot_reduce_times(plan, failed_slots)
        longest = max(p.iteration_time_s for p in pipelines)
        exposed = 0.0
        for (j, s), (total, last) in reduce_times.items():
            stages = pipelines[j].stages
            slack = sum(c.op_backward_s for c in stages[:s]) + (longest - pipelines[j].iteration_time_s)
            exposed = max(exposed, total - stages[s].op_backward_s - slack, last - slack)
        return exposed

    def failed_slots(self, plan: Plan, failed_devices: frozenset[int]) -> frozenset[tuple[int, int]]:
        return frozenset((j, s) for j, pipe in enumerate(plan.pipelines) for s, stage in enumerate(pipe.stages)
                         if failed_devices.intersection(stage.devices))

    @_remember_last(4)
    def evaluate(self, plan: Plan, failed_devices: frozenset[int] = frozenset()) -> Estimate:
        """Predict a plan's step. Rerouted work listed in `plan.rerouted` is added to the peers'
        stages (Eq. 12/13 generalised: T_j = T_1F1B,j + sum of rerouted micro-batches x the
        peer stage's per-micro-batch time); failed slots drop out of the gradient all-reduce."""
        extras = [[0.0] * len(p.stages) for p in plan.pipelines]
        for r in plan.rerouted:
            extras[r.to_pipeline][r.stage] += r.micro_batches
        failed = self.failed_slots(plan, failed_devices)
        replicas = {layer: len(slots) for layer, slots in self.layer_holders(plan, failed).items()}
        pipelines, cache = [], {}
        virtual = self.options.virtual_stages or 1
        for j, pipe in enumerate(plan.pipelines):
            costs = self.stage_costs(plan, j, extras[j], replicas)
            key = (tuple((c.op_forward_s, c.op_backward_s) for c in costs), pipe.micro_batches)
            if key not in cache:  # identical pipelines are the common case: schedule them once
                refused = interleaving_refusal(len(costs), pipe.micro_batches, virtual) is not None
                cache[key] = math.inf if refused else self.pipeline_time(costs, pipe.micro_batches, virtual)
            rerouted_s = sum(e * (c.op_forward_s + c.op_backward_s) for e, c in zip(extras[j], costs) if e)
            pipelines.append(PipelineEstimate(pipe.micro_batches, cache[key] + rerouted_s, tuple(costs),
                                              tuple(extras[j])))
        if not all(math.isfinite(p.iteration_time_s) for p in pipelines):
            dp_time = 0.0  # a refused pipeline (interleaving_refusal): the step is infinite, no overlap to price
        elif self.options.overlap_grad_reduce:
            dp_time = self.exposed_data_parallel_time(plan, pipelines, failed)
        else:
            dp_time = self.data_parallel_time(plan, failed)
        opt_time = max((self.optimizer_time(st.devices, st.first, st.end, st.relief,
                                            min(replicas[layer] for layer in range(st.first, st.end)))
                        for j, p in enumerate(plan.pipelines) for s, st in enumerate(p.stages)
                        if (j, s) not in failed), default=0.0)
        slowest = max(range(len(pipelines)), key=lambda j: pipelines[j].iteration_time_s)
        pipeline_time = pipelines[slowest].iteration_time_s
        breakdown = self._breakdown(pipelines[slowest], pipeline_time, dp_time, opt_time)
        return Estimate(plan, pipeline_time + dp_time + opt_time, self.instance.spec.training.global_batch,
                        tuple(pipelines), dp_time, opt_time, breakdown, self.assumptions(plan))

    def assumptions(self, plan: Plan) -> tuple[str, ...]:
        """The constants behind this plan's numbers that nobody measured or gave: defaults of the
        training settings and catalogue values, each with where it comes from."""
        training = self.instance.spec.training
        given = training.model_fields_set
        lines = []
        devices = {self.stage_device(st.devices) for p in plan.pipelines for st in p.stages}
        if self.framework_overhead_gib is None:
            lines += [f"framework overhead {d.reserved_gib:g} GiB on {d.name} (device reserved_gib; set "
                      "training.framework or framework_overhead_gib)" for d in sorted(devices, key=lambda d: d.name)]
        if "attention" not in given:
            lines.append("attention flash (no s^2 activations); set training.attention to eager if not")
        if "grad_bucket_mb" not in given and any(len(p.stages) and len(plan.pipelines) > 1 for p in plan.pipelines):
            lines.append("gradient bucket 25 MiB (PyTorch DDP default)")
        if "optimizer" not in given:
            lines.append("optimizer state 12 bytes/parameter (mixed-precision Adam)")
        for (name, tp), source in sorted(self.time_sources.items()):
            if "catalogue efficiency" in source:
                fitted = " (fitted on Megatron-LM GPT-3 175B)" if name.startswith("A100") else " (assumed)"
                lines.append(f"{name} TP {tp} times: {source}{fitted}")
        if training.fp8 is not None and self.torchao_fp8:
            lines.append(f"fp8 (torchao {training.fp8.recipe} scaling): block linears at {self._fp8_ratio():g} x the "
                         "bf16 efficiency of the fp8 peak (fitted on NeMo's H100 fp8 rows), casts as torchao's roofline "
                         "counts them under torch.compile (perf/fp8.py TORCHAO_CAST_BYTES), output layer in bf16"
                         + (", linear weights all-gathered in fp8" if training.fp8.fp8_all_gather else ""))
        elif training.fp8 is not None:
            ratio = getattr(self.calibration, "fp8_ratio", None) or FP8_GEMM_RATIO
            lines.append(f"fp8 ({training.fp8.recipe} scaling): block linears at {ratio:g} x the bf16 efficiency of the "
                         f"fp8 peak (fitted on NeMo's H100 fp8 rows), casts {CAST_BYTES_PER_ELEMENT:g} bytes an element "
                         "(assumed from Transformer Engine's cast-transpose), attention and output layer in bf16"
                         + (f", cached fp8 weights {FP8_CACHE_BYTES_PER_PARAM:g} bytes a linear parameter (assumed)"
                            if training.fp8.weight_cast == "per_step" else ""))
        lines += training.assumptions  # the importer's mapping of the trainer's own settings
        return tuple(lines)

    @staticmethod
    def pipeline_time(costs: list[StageCost], micro_batches: int, virtual: int = 1) -> float:
        """One pipeline's schedule time. v = 1: the exact 1F1B longest path (Eq. 11), sends blocking.
        v > 1 (interleaved 1F1B, Megatron-LM's forward_backward_pipelining_with_interleaving): each
        device runs v chunks of 1/v of its layers; compute is the 1F1B longest path of the chunk
        operations plus (v - 1)/v of m bottleneck operations, i.e. Narayanan et al.'s
        (m + (p - 1)/v)(t_f + t_b) for identical stages. Megatron overlaps the p2p of interleaving
        with compute (overlap_p2p_comm, on by default whenever virtual stages are set: arguments.py),
        so a send delays only its receiver: what stays exposed is the first micro-batch's forward
        through all p v chunks and the last one's backward, 2 (p v - 1) sends for identical links
        (v sends across each stage boundary and v - 1 from the last device back to the first, priced
        at the slowest boundary's send); an event simulation of Megatron's order gives exactly that
        for identical stages and less where stages' slack hides sends."""
        if virtual <= 1:
            return one_f_one_b_time([c.op_forward_s for c in costs], [c.op_backward_s for c in costs], micro_batches)
        forward = [c.forward_s / virtual for c in costs]
        backward = [c.backward_s / virtual for c in costs]
        compute = one_f_one_b_time(forward, backward, micro_batches) + micro_batches * (virtual - 1) * max(
            f + b for f, b in zip(forward, backward))
        wrap = max((c.send_forward_s for c in costs), default=0.0)
        exposed = virtual * sum(c.send_forward_s + c.send_backward_s for c in costs) + 2 * (virtual - 1) * wrap
        return compute + exposed

    @staticmethod
    def _breakdown(pipe: PipelineEstimate, pipeline_time: float, dp_time: float, opt_time: float) -> dict[str, float]:
        """Split the critical pipeline's time: its bottleneck stage's compute, TP and p2p for every
        micro-batch it runs; the rest of the pipeline time is bubble."""
        loads = [pipe.micro_batches + e for e in pipe.extra_micro_batches]
        s = max(range(len(pipe.stages)),
                key=lambda i: loads[i] * (pipe.stages[i].op_forward_s + pipe.stages[i].op_backward_s))
        cost, load = pipe.stages[s], loads[s]
        compute = load * cost.compute_s
        tensor_parallel = load * cost.tensor_parallel_s
        p2p = load * (cost.send_forward_s + cost.send_backward_s)
        sharded = load * cost.sharded_s  # ZeRO-3 gathers and reduce-scatters inside each micro-batch
        ring = load * cost.context_parallel_s  # ring-attention exchanges attention does not hide
        parts = {"compute": compute,
                 "pipeline_bubble": max(pipeline_time - compute - tensor_parallel - p2p - sharded - ring, 0.0),
                 "p2p": p2p, "tensor_parallel": tensor_parallel, "data_parallel": dp_time + sharded,
                 "optimizer": opt_time, **({"context_parallel": ring} if cost.context_parallel_s > 0 else {})}
        return {name: float(value) for name, value in parts.items()}
