"""The performance model: instance + plan -> step time, memory and the solvers' cost coefficients.

One place computes every time and byte count, so the solvers, the recovery policies and the
`estimate` command can never disagree. Stage costs are sums over contiguous layer ranges and use
prefix sums, so any (device type, TP, layer range) costs O(1) after a first call.

What it covers: per-stage forward/backward compute (profiled, or FLOPs / (peak x efficiency)),
Megatron tensor-parallel all-reduces, blocking point-to-point activation transfers, the 1F1B
schedule (Eq. 9/10/11), the DP gradient all-reduce per group of layers that share replicas, the
optimizer step, per-stage memory (Eq. 14 generalised), and rerouted work (Eq. 12/13 generalised).
What it leaves out: overlap of the gradient all-reduce with backward, ZeRO sharding, interleaved
schedules, network contention between concurrent collectives, and stragglers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chameleon_opt.instance.load import Instance
from chameleon_opt.instance.schema import DeviceType
from chameleon_opt.perf.comm import Link, ring_allreduce_time
from chameleon_opt.perf.memory import in_flight_micro_batches
from chameleon_opt.perf.pipeline import one_f_one_b_time
from chameleon_opt.plan import Plan, Stage

GIB = float(1 << 30)
ADAM_BYTES_TOUCHED_PER_PARAM = 28.0
"""Mixed-precision Adam reads fp32 master, m, v and the gradient and writes master, m, v and the
half-precision copy: about 28 bytes of memory traffic per parameter (memory-bound step)."""


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

    @property
    def op_forward_s(self) -> float:
        return self.forward_s + self.send_forward_s

    @property
    def op_backward_s(self) -> float:
        return self.backward_s + self.send_backward_s


@dataclass(frozen=True)
class LayerCosts:
    """Per-layer coefficients for the layer-allocation models, on one TP group's device type.

    A stage holding layers [a, b) costs sum(time_s[a:b]) per micro-batch and needs
    sum(static_bytes[a:b]) + in_flight x sum(activation_bytes[a:b]) + transient_bytes."""

    time_s: np.ndarray            # forward + backward incl. TP collectives, one micro-batch
    static_bytes: np.ndarray      # parameters, gradients, optimizer state per device
    activation_bytes: np.ndarray  # activations of one in-flight micro-batch per device
    transient_bytes: float        # recomputation's working set (0 without recomputation)
    capacity_bytes: float


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

    @property
    def throughput_samples_per_s(self) -> float:
        return self.global_batch / self.iteration_time_s if self.iteration_time_s > 0 else 0.0

    @property
    def memory_ok(self) -> bool:
        return all(s.memory_bytes <= s.memory_capacity_bytes for p in self.pipelines for s in p.stages)

    def memory_violations(self) -> list[str]:
        """One line per stage over capacity, for infeasibility reasons."""
        lines = []
        for j, (pipe, plan_pipe) in enumerate(zip(self.pipelines, self.plan.pipelines)):
            for s, (cost, stage) in enumerate(zip(pipe.stages, plan_pipe.stages)):
                if cost.memory_bytes > cost.memory_capacity_bytes:
                    lines.append(f"pipeline {j} stage {s} (layers {stage.first}-{stage.end - 1}) needs "
                                 f"{cost.memory_bytes / GIB:.1f} GiB > {cost.memory_capacity_bytes / GIB:.1f} GiB")
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
                             "memory_capacity_bytes": int(cost.memory_capacity_bytes)}
                            for stage, cost in zip(plan_pipe.stages, pipe.stages)]}
                for pipe, plan_pipe in zip(self.pipelines, self.plan.pipelines)],
            "breakdown_s": dict(self.breakdown_s),
        }


class PerfModel:
    """Costs of any plan on one instance; cached per (device type, TP, micro-batch size)."""

    def __init__(self, instance: Instance) -> None:
        self.instance = instance
        self.workload = instance.workload
        training = instance.spec.training
        self.micro_batch_size = training.micro_batch_size
        self.recompute = training.activation_recomputation
        self.dtype_bytes = training.dtype_bytes
        self.param_bytes = float(training.dtype_bytes)
        self.grad_bytes = float(training.grad_bytes_per_param or training.dtype_bytes)
        self.optimizer_bytes = float(training.optimizer.state_bytes_per_param)
        self.shard_optimizer = training.distributed_optimizer
        network = instance.spec.cluster.network
        self.intra = Link(network.intra_node_gbps * 1e9, network.intra_node_latency_us * 1e-6)
        self.inter = Link(network.inter_node_gbps * 1e9, network.inter_node_latency_us * 1e-6)
        self.p2p_overhead_s = network.p2p_overhead_us * 1e-6
        self._prefix: dict[tuple[str, int], dict[str, np.ndarray]] = {}
        self.total_params = float(self.workload.params.sum())

    # -- per-layer tables as prefix sums -----------------------------------------------------
    def _tables(self, device: DeviceType, tp: int) -> dict[str, np.ndarray]:
        key = (device.name, tp)
        if key in self._prefix:
            return self._prefix[key]
        w, mbs = self.workload, self.micro_batch_size
        profile = w.profile_table(device.name, mbs, tp)
        if profile is not None:
            fwd, bwd = profile.forward_s, profile.backward_s
            tp_fwd = tp_bwd = np.zeros_like(fwd)  # a profile at this TP already includes its collectives
            update = profile.update_s.max() * w.params / max(self.total_params, 1.0)
        else:
            rate = device.peak_tflops * 1e12 * device.efficiency
            fwd = w.forward_flops_per_sample * mbs / tp / rate
            bwd = 2.0 * fwd + (fwd if self.recompute else 0.0)
            count_f, count_b = w.tp_allreduce_counts(self.recompute)
            one = ring_allreduce_time(w.tp_allreduce_bytes_per_sample() * mbs, tp, self.intra)
            tp_fwd, tp_bwd = count_f * one, count_b * one
            update = w.params / tp * ADAM_BYTES_TOUCHED_PER_PARAM / (device.memory_bandwidth_gbps * 1e9)
        act = w.activation_bytes_per_sample(tp, self.recompute) * mbs
        table = {
            "fwd": fwd, "bwd": bwd, "tp_fwd": tp_fwd, "tp_bwd": tp_bwd, "update": update,
            "params": w.params / tp, "act": act,
        }
        prefix = {name: np.concatenate([[0.0], np.cumsum(values)]) for name, values in table.items()}
        self._prefix[key] = prefix
        return prefix

    def _range(self, table: dict[str, np.ndarray], name: str, first: int, end: int) -> float:
        values = table[name]
        return float(values[end] - values[first])

    def stage_device(self, devices: tuple[int, ...]) -> DeviceType:
        """A TP group runs at the pace of its slowest member and fits in its smallest memory."""
        types = [self.instance.device_types[d] for d in devices]
        return min(types, key=lambda t: (t.peak_tflops * t.efficiency, t.memory_gib))

    def link_between(self, a: int, b: int) -> Link:
        return self.intra if self.instance.node_of(a) == self.instance.node_of(b) else self.inter

    def group_link(self, devices: list[int] | tuple[int, ...]) -> Link:
        """The slowest link a ring over these devices crosses."""
        nodes = {self.instance.node_of(d) for d in devices}
        return self.inter if len(nodes) > 1 else self.intra

    def stage_times(self, devices: tuple[int, ...], first: int, end: int) -> tuple[float, float, float, float]:
        """(forward_s, backward_s, compute_s, tensor_parallel_s) of one micro-batch on a stage."""
        device = self.stage_device(devices)
        table = self._tables(device, len(devices))
        tp_f = self._range(table, "tp_fwd", first, end)
        tp_b = self._range(table, "tp_bwd", first, end)
        if len(devices) > 1 and len({self.instance.node_of(d) for d in devices}) > 1:
            scale = self.intra.bandwidth / self.inter.bandwidth  # a TP group across nodes uses the NICs
            tp_f, tp_b = tp_f * scale, tp_b * scale
        fwd = self._range(table, "fwd", first, end)
        bwd = self._range(table, "bwd", first, end)
        return fwd + tp_f, bwd + tp_b, fwd + bwd, tp_f + tp_b

    def boundary_send_time(self, sender: tuple[int, ...], receiver: tuple[int, ...], last_layer: int) -> float:
        """Blocking send of one micro-batch's activation (or its gradient) across a stage boundary:
        every TP rank sends its full copy over its own share of the link."""
        nbytes = self.workload.boundary_bytes_per_sample[last_layer] * self.micro_batch_size
        if nbytes <= 0:
            return 0.0
        return self.link_between(sender[0], receiver[0]).send_time(nbytes) + self.p2p_overhead_s

    def stage_memory(self, devices: tuple[int, ...], first: int, end: int, stage: int, stages: int,
                     own_micro_batches: float, extra_micro_batches: float = 0.0,
                     replicas: int = 1) -> tuple[float, float]:
        """(bytes needed, bytes available) on each device of a stage slot: Eq. 14 generalised to
        per-layer sizes, TP sharding, mixed-precision state, optimizer state sharded over the
        `replicas` of the stage when the distributed optimizer is on, and 1F1B's in-flight count."""
        device = self.stage_device(devices)
        table = self._tables(device, len(devices))
        params = self._range(table, "params", first, end)
        optimizer = self.optimizer_bytes / max(replicas, 1) if self.shard_optimizer else self.optimizer_bytes
        static = params * (self.param_bytes + self.grad_bytes + optimizer)
        in_flight = in_flight_micro_batches(stage, stages, int(own_micro_batches), extra_micro_batches)
        activations = in_flight * self._range(table, "act", first, end)
        if self.recompute:  # the block being recomputed materialises its full activations once
            full = self.workload.activation_bytes_per_sample(len(devices), False) * self.micro_batch_size
            activations += float(full[first:end].max())
        capacity = (device.memory_gib - device.reserved_gib) * GIB
        return static + activations, capacity

    def layer_costs(self, devices: tuple[int, ...], replicas: int = 1) -> LayerCosts:
        """Per-layer linear coefficients of time and memory, for solvers that pick layer ranges."""
        device = self.stage_device(devices)
        table = self._tables(device, len(devices))
        per_layer = {name: np.diff(values) for name, values in table.items()}
        optimizer = self.optimizer_bytes / max(replicas, 1) if self.shard_optimizer else self.optimizer_bytes
        static = per_layer["params"] * (self.param_bytes + self.grad_bytes + optimizer)
        transient = 0.0
        if self.recompute:
            full = self.workload.activation_bytes_per_sample(len(devices), False) * self.micro_batch_size
            transient = float(full.max())
        spans_nodes = len(devices) > 1 and len({self.instance.node_of(d) for d in devices}) > 1
        tp_scale = self.intra.bandwidth / self.inter.bandwidth if spans_nodes else 1.0
        time = per_layer["fwd"] + per_layer["bwd"] + (per_layer["tp_fwd"] + per_layer["tp_bwd"]) * tp_scale
        capacity = (device.memory_gib - device.reserved_gib) * GIB
        return LayerCosts(time, static, per_layer["act"], transient, capacity)

    def optimizer_time(self, devices: tuple[int, ...], first: int, end: int) -> float:
        table = self._tables(self.stage_device(devices), len(devices))
        return self._range(table, "update", first, end)

    # -- whole plans ----------------------------------------------------------------------------
    def stage_costs(self, plan: Plan, pipeline_index: int, extra: list[float],
                    replicas: dict[int, int] | None = None) -> list[StageCost]:
        """Costs of every stage of one pipeline; `replicas[layer]` counts the live slots holding
        each layer (for the distributed optimizer's sharding)."""
        pipe = plan.pipelines[pipeline_index]
        stages = pipe.stages
        costs = []
        for s, stage in enumerate(stages):
            fwd, bwd, compute, tp_time = self.stage_times(stage.devices, stage.first, stage.end)
            send_f = self.boundary_send_time(stage.devices, stages[s + 1].devices, stage.end - 1) \
                if s + 1 < len(stages) else 0.0
            send_b = self.boundary_send_time(stage.devices, stages[s - 1].devices, stages[s - 1].end - 1) \
                if s > 0 else 0.0
            shards = min(replicas[layer] for layer in range(stage.first, stage.end)) if replicas else 1
            need, have = self.stage_memory(stage.devices, stage.first, stage.end, s, len(stages),
                                           pipe.micro_batches, extra[s], shards)
            costs.append(StageCost(fwd, bwd, compute, tp_time, send_f, send_b, need, have))
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

    def data_parallel_time(self, plan: Plan, failed_slots: frozenset[tuple[int, int]] = frozenset()) -> float:
        """Gradient all-reduce: each layer is reduced among the stage slots that hold it; layers
        with the same replica set form one bucket (with identical pipelines: one group per stage).
        A slot reduces its buckets one after another; slots run in parallel; the slowest counts.
        (With the distributed optimizer it is a reduce-scatter plus an all-gather: same volume.)"""
        holders = self.layer_holders(plan, failed_slots)
        buckets: dict[tuple[tuple[int, int], ...], list[int]] = {}
        for layer, slots in holders.items():
            buckets.setdefault(tuple(slots), []).append(layer)
        per_slot: dict[tuple[int, int], float] = {}
        grad_bytes = self.workload.params * self.grad_bytes / plan.tensor_parallel
        for slots, layers in buckets.items():
            if len(slots) < 2:
                continue
            ring = [plan.pipelines[j].stages[s].devices[0] for j, s in slots]
            time = ring_allreduce_time(float(grad_bytes[layers].sum()), len(slots), self.group_link(ring))
            for slot in slots:
                per_slot[slot] = per_slot.get(slot, 0.0) + time
        return max(per_slot.values(), default=0.0)

    def failed_slots(self, plan: Plan, failed_devices: frozenset[int]) -> frozenset[tuple[int, int]]:
        return frozenset((j, s) for j, pipe in enumerate(plan.pipelines) for s, stage in enumerate(pipe.stages)
                         if failed_devices.intersection(stage.devices))

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
        for j, pipe in enumerate(plan.pipelines):
            costs = self.stage_costs(plan, j, extras[j], replicas)
            key = (tuple((c.op_forward_s, c.op_backward_s) for c in costs), pipe.micro_batches)
            if key not in cache:  # identical pipelines are the common case: schedule them once
                cache[key] = one_f_one_b_time([c.op_forward_s for c in costs], [c.op_backward_s for c in costs],
                                              pipe.micro_batches)
            rerouted_s = sum(e * (c.op_forward_s + c.op_backward_s) for e, c in zip(extras[j], costs) if e)
            pipelines.append(PipelineEstimate(pipe.micro_batches, cache[key] + rerouted_s, tuple(costs),
                                              tuple(extras[j])))
        dp_time = self.data_parallel_time(plan, failed)
        opt_time = max((self.optimizer_time(st.devices, st.first, st.end)
                        for j, p in enumerate(plan.pipelines) for s, st in enumerate(p.stages)
                        if (j, s) not in failed), default=0.0)
        slowest = max(range(len(pipelines)), key=lambda j: pipelines[j].iteration_time_s)
        pipeline_time = pipelines[slowest].iteration_time_s
        breakdown = self._breakdown(pipelines[slowest], pipeline_time, dp_time, opt_time)
        return Estimate(plan, pipeline_time + dp_time + opt_time, self.instance.spec.training.global_batch,
                        tuple(pipelines), dp_time, opt_time, breakdown)

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
        parts = {"compute": compute, "pipeline_bubble": max(pipeline_time - compute - tensor_parallel - p2p, 0.0),
                 "p2p": p2p, "tensor_parallel": tensor_parallel, "data_parallel": dp_time, "optimizer": opt_time}
        return {name: float(value) for name, value in parts.items()}
