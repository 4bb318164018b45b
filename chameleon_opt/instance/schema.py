"""File format of an instance: cluster, workload, training settings, current plan, failures.

`chameleon-solve schema` prints the JSON Schema generated from these models, so the file format
and its documentation cannot drift apart. Unknown fields are errors everywhere.
"""

from __future__ import annotations

from typing import Any, Literal

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
    fp8_peak_tflops: PositiveFloat | None = Field(
        None, description="dense fp8 tensor-core peak, TFLOP/s (training.fp8 needs it); none: the device has no "
        "fp8 tensor cores (A100, V100), so fp8 training on it is refused")
    efficiency: float = Field(0.5, gt=0, le=1, description="sustained fraction of peak on transformer layers")
    memory_bandwidth_gbps: PositiveFloat = Field(1500.0, description="HBM GB/s, for the optimizer step")
    reserved_gib: NonNegativeFloat = Field(
        2.0, description="memory the framework holds outside the model (CUDA context, kernels, buffers); "
        "used when training.framework_overhead_gib is not given. Default 2.0 is assumed, not measured")
    stage_scaling: tuple[tuple[PositiveFloat, PositiveFloat], ...] = Field(
        (), description="(a stage's parameter bytes per device, factor) points: a stage computes its layers' "
        "profiled times summed x the factor at its bytes (interpolated on log bytes, made non-decreasing and at "
        "least 1). Measured where layers profiled alone keep their weights in cache and a stage's layers evict "
        "each other's (runtime.profile.stage_compute_ratio); empty: 1")


class Network(Strict):
    """Alpha-beta links: a message of n bytes takes latency + n / bandwidth."""

    intra_node_gbps: PositiveFloat = Field(description="per-device GB/s inside a node (NVLink)")
    intra_node_latency_us: NonNegativeFloat = 5.0
    inter_node_gbps: PositiveFloat = Field(description="per-device GB/s between nodes (NIC share)")
    inter_node_latency_us: NonNegativeFloat = 20.0
    p2p_overhead_us: NonNegativeFloat = Field(
        0.0, description="framework cost per pipeline send/receive beyond the link (blocking p2p calls)")
    schedule_overhead_us: NonNegativeFloat = Field(
        0.0, description="framework cost per forward and per backward of a micro-batch on a stage beyond its "
        "layers' compute: the pipeline schedule's own work (measured for the HF runtime by "
        "runtime.profile.measure_schedule_overhead)")
    collective_gbps: PositiveFloat | None = Field(
        None, description="per-rank GB/s of the gradient all-reduce's ring inside a node when it is slower than "
        "the link (measured: gloo on CPU also sums and copies the buffers, runtime.profile.measure_allreduce); "
        "None: the intra-node link's")
    collective_latency_us: NonNegativeFloat | None = Field(
        None, description="seconds (us) per step of that ring, measured with collective_gbps; None: the link's")
    host_link_gbps: PositiveFloat = Field(
        25.0, description="per-device GB/s each way between a device and its host's memory (PCIe 4.0 x16 "
        "delivers about 25); prices activation and optimizer-state offload (assumed unless given)")
    host_memory_gbps: PositiveFloat = Field(
        50.0, description="per-device share of the host's memory bandwidth, GB/s: the CPU optimizer step "
        "of offloaded optimizer state (assumed unless given)")
    checkpoint_read_gbps: PositiveFloat = Field(
        2.0, description="per-device GB/s reading model state from the last step's checkpoint: prices a "
        "re-plan that changes the TP degree (every device loads its new shards, torch.distributed.checkpoint's "
        "re-shard; planning option tp_degrees). Assumed unless given")


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


Recomputation = Literal["none", "selective", "full"]
Relief = Literal["none", "selective", "full", "offload", "opt-offload"]


class Fp8(Strict):
    """fp8 linear layers (perf/fp8.py): the blocks' linear GEMMs on the fp8 tensor cores, master weights,
    attention and element-wise work in higher precision."""

    recipe: Literal["delayed", "tensorwise"] = Field(
        description="the scaling recipe: delayed (Transformer Engine's DelayedScaling, amax history; what NeMo, "
        "Megatron-LM and llm-foundry's amp_fp8 run); tensorwise (torchao's Float8Linear with dynamic scaling, one "
        "scale per tensor, under torch.compile: what torchtitan's float8 runs by default). torchao's rowwise is "
        "not modelled: its scaled GEMM's rate depends on the shape (torchtitan's TP runs measured 14-28% slower "
        "than a tensorwise-style price)")
    weight_cast: Literal["per_micro_batch", "per_step"] = Field(
        "per_micro_batch", description="per_step: the cast weights are kept across a step's micro-batches "
        "(Megatron-LM's TE layers, is_first_microbatch), costing their fp8 copies in memory; per_micro_batch: "
        "cast again on every forward (torchao always)")
    fp8_all_gather: bool = Field(
        False, description="tensorwise under zero_stage 3: FSDP all-gathers the linear weights in fp8, cast from "
        "their shards with scales precomputed once per step (torchao enable_fsdp_float8_all_gather with "
        "precompute_float8_dynamic_scale_for_fsdp)")

    @model_validator(mode="after")
    def _recipe_settings(self) -> "Fp8":
        if self.recipe != "delayed" and self.weight_cast != "per_micro_batch":
            raise ValueError(f"weight_cast per_step is Transformer Engine's; torchao's {self.recipe} scaling casts "
                             "the weights on every forward")
        if self.fp8_all_gather and self.recipe != "tensorwise":
            raise ValueError("fp8_all_gather needs the tensorwise recipe (torchao gathers tensorwise-scaled "
                             "weights only)")
        return self


class Training(Strict):
    """Training settings. Memory-related defaults are assumptions, named as such in each description
    and in `estimate`'s output; set them to what the trainer really does."""

    global_batch: PositiveInt = Field(description="samples per iteration")
    micro_batch_size: PositiveInt
    sequence_length: PositiveInt | None = Field(None, description="default: the workload's seq_len")
    precision: Literal["bf16", "fp16", "fp32"] = "bf16"
    fp8: Fp8 | None = Field(
        None, description="fp8 linear layers and their scaling recipe (perf/fp8.py); none: every GEMM in `precision`")
    grad_bytes_per_param: PositiveFloat | None = Field(
        None, description="default: the parameter precision (Megatron with fp32 gradient accumulation: 4)")
    optimizer: Optimizer = Field(default_factory=Optimizer)
    activation_recomputation: bool = Field(
        False, description="legacy switch for full recomputation; prefer `recomputation`")
    recomputation: Recomputation | None = Field(
        None, description="none: keep every activation; selective: recompute the attention core "
        "(Korthikanti et al. 2022); full: keep only each block's input. Default: full if "
        "activation_recomputation else none")
    checkpoint_every: PositiveInt = Field(
        1, description="full recomputation checkpoints only every k-th transformer block (blocks k, 2k, ... "
        "counted from 1; torchtitan's layer-selective activation checkpointing, selective_ac_option = k) and "
        "the others keep all their activations. Counted over the whole model, which is torchtitan's per-rank "
        "count when every stage starts after a multiple of k blocks. 1: every block")
    recompute_early_stop: bool = Field(
        False, description="full recomputation reruns each checkpointed block only up to the last tensor its "
        "backward reads, so not the MLP's output projection when no dropout (p > 0) follows it: PyTorch's "
        "non-reentrant torch.utils.checkpoint "
        "from torch 2.1 (early stop on by default), which torchtitan and llm-foundry's Composer FSDP runs use. "
        "false: the whole block forward is rerun (Megatron-LM's checkpointing, reentrant torch checkpoint, "
        "torch 2.0 and older; plans for --target megatron are priced so). `import torchtitan` sets it, and the "
        "HF runtime's instances where its blocks stop early (runtime.hf.checkpoint_early_stops)")
    tp_async: bool = Field(
        False, description="TP collectives micro-pipelined with the matmuls next to them (torchtitan async TP): "
        "under sequence parallelism each all-gather / reduce-scatter shows only its excess over its matmul plus "
        "one pipeline step (PerfModel._async_tp_exposed); without it nothing is hidden. `import torchtitan` sets it")
    attention: Literal["flash", "eager"] = Field(
        "flash", description="flash keeps no s^2 attention tensors; eager keeps the scores, softmax and "
        "dropout (5 a s^2 bytes per sample and layer, Korthikanti et al. Table 2). Default assumes flash")
    sequence_parallel: bool = Field(
        False, description="Megatron sequence parallelism: layer norms and dropouts sharded over TP")
    context_parallel: PositiveInt = Field(
        1, description="context parallelism (Megatron-LM --context-parallel-size, Transformer Engine's ring "
        "attention with the load-balanced causal split): cp ranks share every sequence, s / cp tokens each, and "
        "exchange K and V over a ring in each block's attention; the plan's pipelines then come in groups of cp "
        "consecutive ones (a layout's ranks: cp next to tp, Megatron's order) whose micro-batch counts are equal, "
        "and the gradients are reduced over dp x cp. Priced by `estimate`; the planner's searches refuse it. "
        "Needs flash attention, a workload architecture without profiles, and a sequence divisible by 2 x cp")
    distributed_optimizer: bool = Field(
        False, description="shard optimizer state over data-parallel replicas (ZeRO-1, Megatron's distributed "
        "optimizer); the same as zero_stage 1")
    zero_stage: Literal[0, 1, 2, 3] | None = Field(
        None, description="0: replicate all state; 1: shard optimizer state; 2: also gradients; 3: also "
        "parameters (each over the stage's data-parallel replicas, one copy of each shard: a failed device's "
        "shard is lost, so its failure needs a checkpoint restart, exit 5, unless shard_replicas > 1). Default: 1 "
        "if distributed_optimizer else 0")
    shard_replicas: PositiveInt = Field(
        1, description="copies of each ZeRO shard (torchtitan HSDP's data_parallel_replicate_degree, Megatron-LM's "
        "--num-distributed-optimizer-instances): the D data-parallel slots holding a layer, in plan order "
        "(consecutive pipelines: consecutive data-parallel ranks, as both trainers group them), form this many "
        "consecutive shard groups of D / shard_replicas slots (sizes differing by at most one when D is not a "
        "multiple), and each group shards the state over itself, so per-device sharded state is divided by the "
        "group size and a shard is lost only when every group's holder of it failed. 1: one copy (plain ZeRO / "
        "FSDP); needs zero_stage >= 1 when above 1")
    gather_bytes_per_param: PositiveFloat | None = Field(
        None, description="bytes per parameter of the ZeRO-3/FSDP all-gathers (FSDP MixedPrecision.param_dtype); "
        "default: the parameter precision")
    reduce_bytes_per_param: PositiveFloat | None = Field(
        None, description="bytes per parameter of the ZeRO-3/FSDP gradient reduce-scatter (FSDP "
        "MixedPrecision.reduce_dtype: Composer's DEFAULT mode reduces in fp32 from 0.16.4 on, 4); the gradients "
        "kept afterwards stay grad_bytes_per_param. Default: grad_bytes_per_param")
    reshard_after_forward: bool = Field(
        True, description="under zero_stage 3: free the gathered parameters after each layer's forward and gather "
        "them again for its backward (FSDP FULL_SHARD, DeepSpeed ZeRO-3); false keeps them from forward to backward "
        "(FSDP SHARD_GRAD_OP, FSDP2 reshard_after_forward=False): one all-gather per micro-batch, the stage's "
        "parameters held whole in between")
    overlap_param_gather: bool = Field(
        False, description="under zero_stage 1-2 (Megatron's distributed optimizer): the updated parameters' "
        "all-gather runs behind the next step's forward (Megatron-LM --overlap-param-gather), so only the "
        "gradient reduce-scatter is left at the step's end")
    grad_bucket_mb: NonNegativeFloat = Field(
        25.0, description="gradient all-reduce bucket held while reducing (assumed: PyTorch DDP's bucket_cap_mb "
        "default 25); counted on stages with data-parallel replicas")
    overlap_grad_reduce: bool = Field(
        False, description="launch each gradient bucket's all-reduce as soon as the last micro-batch's backward "
        "has produced it (DDP, Megatron overlap_grad_reduce); plans may override")
    virtual_stages: PositiveInt = Field(
        1, description="interleaved 1F1B: model chunks per device (Megatron virtual pipeline); plans may override")
    framework_overhead_gib: NonNegativeFloat | None = Field(
        None, description="per-device memory the framework holds outside the model (CUDA context, NCCL, "
        "allocator); fitted values are in models/calibration/. Default: the device type's reserved_gib")
    reliefs: list[Relief] | None = Field(
        None, description="memory reliefs the trainer can apply per stage, for the solver to choose among: "
        "none / selective / full recomputation, offload (activations to host memory over the host link, "
        "overlapped with compute), opt-offload (optimizer state and step on the host; combines with the "
        "others). Default: only `recomputation`, the same on every stage")
    framework: str | None = Field(
        None, description="a framework calibrated in models/calibration/<name>.json: its fitted memory overhead and "
        "per-device time calibration are used. Default: none (catalogue values, marked assumed)")
    kernels: Literal["megatron", "torchtitan", "torchtitan-compiled", "llm-foundry"] | None = Field(
        None, description="the stack whose kernels the activations, loss buffers and selective recomputation "
        "follow (workload/activations.py): megatron (Korthikanti et al.'s counts), torchtitan (fp32 RMSNorm "
        "input, flash attention, per-op selective checkpointing, fp32 loss buffers, unfused element-wise "
        "chains) or torchtitan-compiled (its blocks under torch.compile: chains fused but the complex rotary's, "
        "which Inductor runs as an ATen fallback) or llm-foundry (MPT under Composer: no dropout masks, Triton "
        "flash attention, fused cross-entropy on bf16 logits); `import torchtitan` sets it. Default: the "
        "framework calibration's, else megatron; a compiled form of the calibration's stack is kept")
    compiled_loss: bool = Field(
        False, description="torch.compile compiles the loss (torchtitan compile.components \"loss\"): the "
        "fused cross-entropy holds the half-precision logits and their gradient only "
        "(activations.COMPILED_LOSS_LOGIT_BYTES); `import torchtitan` sets it")
    loss_chunks: PositiveInt = Field(
        1, description="the loss computes the head and its loss over this many slices of a micro-batch's tokens in "
        "turn (torchtitan's ChunkedLossWrapper, `loss.num_chunks`), so its logits buffers hold one slice; "
        "`import torchtitan` sets it")
    assumptions: list[str] = Field(
        default_factory=list, description="how the trainer's own settings were mapped where the model is an "
        "approximation (written by `chameleon-solve import`); listed with every estimate's assumptions")

    @model_validator(mode="after")
    def _consistent_switches(self) -> "Training":
        if self.context_parallel > 1 and self.attention == "eager":
            raise ValueError("context_parallel above 1 runs Transformer Engine's flash / fused attention only "
                             "(no eager softmax path): set attention to flash or context_parallel to 1")
        if self.recomputation is not None and self.activation_recomputation and self.recomputation != "full":
            raise ValueError(f"activation_recomputation is true but recomputation is {self.recomputation!r}: "
                             "drop activation_recomputation")
        if self.checkpoint_every > 1 and self.recompute != "full" and "full" not in (self.reliefs or []):
            raise ValueError(f"checkpoint_every is {self.checkpoint_every} but no block is fully recomputed "
                             f"(recomputation {self.recompute!r}): set recomputation full, or drop checkpoint_every")
        if self.zero_stage == 0 and self.distributed_optimizer:
            raise ValueError("distributed_optimizer is true but zero_stage is 0: drop distributed_optimizer")
        if self.overlap_param_gather and self.zero == 0:
            raise ValueError("overlap_param_gather is true but no state is sharded (zero_stage 0): Megatron-LM's "
                             "--overlap-param-gather needs the distributed optimizer; set zero_stage 1")
        if self.shard_replicas > 1 and self.zero == 0:
            raise ValueError(f"shard_replicas is {self.shard_replicas} but no state is sharded (zero_stage 0): set "
                             "zero_stage (or distributed_optimizer), or drop shard_replicas")
        return self

    @property
    def dtype_bytes(self) -> int:
        return 4 if self.precision == "fp32" else 2

    @property
    def recompute(self) -> Recomputation:
        """The effective recomputation mode (the legacy boolean folded in)."""
        return self.recomputation or ("full" if self.activation_recomputation else "none")

    @property
    def zero(self) -> int:
        """The effective ZeRO stage (the legacy distributed_optimizer folded in)."""
        return self.zero_stage if self.zero_stage is not None else (1 if self.distributed_optimizer else 0)


class StageSpec(Strict):
    devices: list[NonNegativeInt] = Field(min_length=1, description="the stage's TP group")
    layers: tuple[NonNegativeInt, NonNegativeInt] = Field(description="[first, end_exclusive]")
    relief: str | None = Field(None, description="the stage's memory relief (e.g. full, offload+opt-offload); "
                               "default: the training's recomputation")


class PipelineSpec(Strict):
    micro_batches: PositiveInt
    stages: list[StageSpec] = Field(min_length=1)


RankOrder = Literal["tp-pp-dp", "tp-dp-pp", "pp-tp-dp", "pp-dp-tp", "dp-tp-pp", "dp-pp-tp"]
"""Dimensions from the fastest-varying (innermost) to the outermost, Megatron-LM's notation."""


class Layout(Strict):
    """A compact regular plan: device ids are numbered by `order` (default: TP innermost, then
    stages, then pipelines), so that a device id can be the trainer's own global rank."""

    pipeline_parallel: PositiveInt
    data_parallel: PositiveInt
    order: RankOrder = Field(
        "tp-pp-dp", description="how device ids (global ranks) walk the grid, innermost dimension first: "
        "tp-pp-dp (the default: TP, then stages, then pipelines; Megatron-LM with --use-tp-pp-dp-mapping); "
        "tp-dp-pp (Megatron-LM's default order tp-cp-ep-dp-pp with CP = EP = 1, and torchtitan's device mesh "
        "[pp, dp_replicate, dp_shard, cp, tp]: rank = (pp x DP + dp) x TP + tp)")
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


def torchtitan_always_mixed(era: str, config: dict[str, Any] | None) -> bool:
    """Whether this torchtitan release computes in its mixed precision even without FSDP sharding.
    Since June 2026 parallelize.py always applies FSDP (and its MixedPrecisionPolicy), and its
    config dumps carry the model's config in `model_spec`; before, a job whose data-parallel shard
    degree is 1 got DDP or nothing, which trains in the parameters' dtype (fp32)."""
    return era == "python" and "model" in ((config or {}).get("model_spec") or {})


class TrainerSource(Strict):
    """The trainer job an instance was imported from, kept so that `export-plan` writes a complete
    config of that trainer (the original with its parallelism settings replaced), not a fragment."""

    name: Literal["torchtitan", "megatron"]
    file: str = Field("", description="the file imported (for the export's header)")
    era: str = Field("", description="torchtitan: toml (train_configs/*.toml) or python (a resolved Trainer.Config "
                     "dump); megatron: args")
    config: dict[str, Any] | None = Field(None, description="torchtitan: the job config as read")
    arguments: list[str] | None = Field(None, description="megatron: the training script's arguments")
    launcher: list[str] | None = Field(None, description="megatron: the launcher's arguments (torchrun ...)")


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
    trainer: TrainerSource | None = Field(None, description="the trainer job this instance was imported from")
