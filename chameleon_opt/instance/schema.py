"""File format of an instance: cluster, workload, training settings, current plan, failures.

`chameleon-solve schema` prints the JSON Schema generated from these models, so the file format
and its documentation cannot drift apart. Unknown fields are errors everywhere.
"""

from __future__ import annotations

from typing import Literal

from pydantic import (BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveFloat,
                      PositiveInt, model_validator)

from chameleon_opt.workload.schema import WorkloadSpec

FORMAT_VERSION = 1


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class DeviceType(Strict):
    """An accelerator model. Compute time of analytic workloads is FLOPs / (peak x efficiency)."""

    name: str
    memory_gib: PositiveFloat
    peak_tflops: PositiveFloat = Field(description="dense bf16/fp16 peak, TFLOP/s")
    efficiency: float = Field(0.5, gt=0, le=1, description="sustained fraction of peak on transformer layers")
    memory_bandwidth_gbps: PositiveFloat = Field(1500.0, description="HBM GB/s, for the optimizer step")
    reserved_gib: NonNegativeFloat = Field(
        2.0, description="memory the framework holds outside the model (CUDA context, kernels, buffers)")


class Network(Strict):
    """Alpha-beta links: a message of n bytes takes latency + n / bandwidth."""

    intra_node_gbps: PositiveFloat = Field(description="per-device GB/s inside a node (NVLink)")
    intra_node_latency_us: NonNegativeFloat = 5.0
    inter_node_gbps: PositiveFloat = Field(description="per-device GB/s between nodes (NIC share)")
    inter_node_latency_us: NonNegativeFloat = 20.0
    p2p_overhead_us: NonNegativeFloat = Field(
        0.0, description="framework cost per pipeline send/receive beyond the link (blocking p2p calls)")


class DeviceOverride(Strict):
    """A different device type for some devices: a heterogeneous cluster."""

    devices: list[NonNegativeInt] = Field(min_length=1)
    device_type: DeviceType | str


class Cluster(Strict):
    nodes: PositiveInt
    devices_per_node: PositiveInt
    device_type: DeviceType | str = Field(description="a DeviceType, or a name from the built-in catalogue")
    network: Network
    overrides: list[DeviceOverride] = Field(default_factory=list)


class WorkloadRef(Strict):
    """Exactly one of: `model` (a catalogue name in models/ or a path) or `inline`."""

    model: str | None = None
    inline: WorkloadSpec | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> "WorkloadRef":
        if (self.model is None) == (self.inline is None):
            raise ValueError("give exactly one of 'model' (a name in models/ or a path) and 'inline'")
        return self


class Optimizer(Strict):
    name: str = "adam"
    state_bytes_per_param: NonNegativeFloat = Field(
        12.0, description="optimizer bytes per parameter (Adam mixed precision: fp32 master + m + v = 12)")


class Training(Strict):
    global_batch: PositiveInt = Field(description="samples per iteration")
    micro_batch_size: PositiveInt
    sequence_length: PositiveInt | None = Field(None, description="default: the workload's seq_len")
    precision: Literal["bf16", "fp16", "fp32"] = "bf16"
    grad_bytes_per_param: PositiveFloat | None = Field(None, description="default: the parameter precision")
    optimizer: Optimizer = Field(default_factory=Optimizer)
    activation_recomputation: bool = False
    distributed_optimizer: bool = Field(
        False, description="shard optimizer state over data-parallel replicas (ZeRO-1, Megatron's distributed optimizer)")

    @property
    def dtype_bytes(self) -> int:
        return 4 if self.precision == "fp32" else 2


class StageSpec(Strict):
    devices: list[NonNegativeInt] = Field(min_length=1, description="the stage's TP group")
    layers: tuple[NonNegativeInt, NonNegativeInt] = Field(description="[first, end_exclusive]")


class PipelineSpec(Strict):
    micro_batches: PositiveInt
    stages: list[StageSpec] = Field(min_length=1)


class Layout(Strict):
    """A compact regular plan: devices are taken in order, TP innermost, then stages, then pipelines."""

    pipeline_parallel: PositiveInt
    data_parallel: PositiveInt
    layers_per_stage: list[PositiveInt] | None = Field(
        None, description="layers of each stage (sum = all layers); default: as even as possible")


class PlanSpec(Strict):
    """The plan now running: explicit `pipelines`, or a regular `layout`."""

    tensor_parallel: PositiveInt = 1
    pipelines: list[PipelineSpec] | None = None
    layout: Layout | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> "PlanSpec":
        if (self.pipelines is None) == (self.layout is None):
            raise ValueError("give exactly one of 'pipelines' (explicit) and 'layout' (regular)")
        return self


class FailureEvent(Strict):
    time_s: NonNegativeFloat = 0.0
    devices: list[NonNegativeInt] = Field(min_length=1)


class Failures(Strict):
    """What failed, and what is known of the next fault (for policy selection)."""

    events: list[FailureEvent] = Field(default_factory=list)
    mtbf_hours_per_device: PositiveFloat | None = Field(None, description="exponential failures per device")
    next_fault_s: PositiveFloat | None = Field(None, description="explicit time to the next fault D")


class InstanceSpec(Strict):
    """A cluster, a workload, its training settings and current plan, and failures."""

    format: Literal[1] = FORMAT_VERSION
    name: str
    description: str = ""
    cluster: Cluster
    workload: WorkloadRef
    training: Training
    plan: PlanSpec
    failures: Failures = Field(default_factory=Failures)
