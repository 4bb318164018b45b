"""The chosen plan in the form a trainer runs, one JSON Schema per format (`export-plan --schema`).

- Every format lists every rank of the new job: its new global rank, the device (the old global
  rank) that takes it, its pipeline, stage, TP rank and group, pipeline neighbours, layer range,
  module names in the trainer's vocabulary, the micro-batches of its pipeline and, under a
  rerouting, the pieces of a failed stage's micro-batches it computes as well. The rows are
  read off the decision's lowering (`comm.lowering.RankPlan`, the records the runtimes execute),
  so a failed device is never a rank and a survivor the plan gives no work is listed under
  `idle`, not as a rank: launched as one it would join the trainer's world with nothing to run.
  Survivors restart with these ranks.
- New ranks are numbered node by node, because that is how torchrun numbers them: with static
  rendezvous a worker's global rank is the processes of the lower `--node-rank`s plus its local
  rank (torch.distributed.elastic's `_assign_worker_ranks`), so each surviving node's training
  devices take the next block of ranks, in node order and, within a node, by old local rank.
  `nodes` gives each node's torchrun line (`--nnodes`, `--node-rank`, its own `--nproc-per-node`:
  nodes may differ) and the CUDA_VISIBLE_DEVICES that maps its local ranks to its old devices.
- A *uniform* plan (every pipeline the same stages, layer split and micro-batch count) is also
  given as a complete config of the trainer: the imported torchtitan job config (its era's keys,
  its schedule and everything else kept) with degrees, explicit stages and batch sizes replaced,
  or the imported Megatron-LM arguments with the parallelism, split and batch arguments replaced
  (a split Megatron cannot say with --decoder-first/last-pipeline-num-layers, such as a last
  stage holding only the head, becomes --pipeline-model-parallel-layout). The trainer derives
  every rank's stage and TP group from its global rank in its own order (torchtitan's mesh:
  tp-dp-pp; Megatron-LM: tp-dp-pp, or tp-pp-dp with --use-tp-pp-dp-mapping, chosen to fit), so
  the export checks that this order, read on the node-by-node ranks, gives every device the
  stage and TP rank the plan gives it (pipelines may be renumbered: replicas are alike), and
  refuses the format (exit 2) when no order of that trainer does.
- An uneven plan cannot be written as degrees: the per-rank module lists (torchtitan's
  `module_fqns_per_model_part` vocabulary) and micro-batch counts are the plan, placed by the
  rows (`rank_order` null).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveFloat, PositiveInt

from chameleon_opt.comm.lowering import LoweredPlan, RankPlan, WorkPiece
from chameleon_opt.errors import InputError
from chameleon_opt.instance.load import Instance, grid_position
from chameleon_opt.interop.common import MEGATRON_ORDER, TORCHTITAN_ORDER, module_names

FORMATS = ("torchtitan", "megatron", "ranks")
VOCABULARY = {"torchtitan": "torchtitan", "megatron": "megatron", "ranks": "torchtitan"}
TRAINER_ORDERS = {"torchtitan": (TORCHTITAN_ORDER,), "megatron": (MEGATRON_ORDER, "tp-pp-dp"),
                  "ranks": (TORCHTITAN_ORDER, "tp-pp-dp")}
"""The rank orders each format's trainer can be told to use, its default first: torchtitan's mesh
order is fixed; Megatron-LM switches to tp-pp-dp with --use-tp-pp-dp-mapping; the chameleon
runtime reads the rows (an order is only named when one fits)."""
TRAINER_NAMES = {"torchtitan": "torchtitan", "megatron": "Megatron-LM", "ranks": "the chameleon runtime"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Fraction = Annotated[float, Field(ge=0.0, le=1.0)]


class Neighbour(_Strict):
    """The part [lo, hi) of a piece that `rank` computes at the neighbouring stage."""

    rank: NonNegativeInt = Field(description="its global rank in the new job (same TP rank)")
    lo: Fraction
    hi: Fraction


class Piece(_Strict):
    """The samples [lo, hi) of one micro-batch, and who sends and receives its activations."""

    id: NonNegativeInt = Field(description="global micro-batch id: pipeline j owns the next m_j ids, pipeline "
                                           "by pipeline")
    lo: Fraction = Field(description="first fraction of its samples computed here")
    hi: Fraction = Field(description="end fraction of its samples ([0, 1] for a whole one)")
    prev: list[Neighbour] = Field(description="ranks computing it at the owning pipeline's previous stage (none "
                                              "on the first)")
    next: list[Neighbour] = Field(description="ranks computing it at the owning pipeline's next stage (none on "
                                              "the last)")


class ReroutedWork(_Strict):
    """A failed stage's micro-batches this rank computes besides its own pipeline's."""

    pipeline: NonNegativeInt = Field(description="the pipeline that lost this stage and owns the micro-batches")
    stage: NonNegativeInt = Field(description="the stage computed for them: this rank's own, same layers")
    micro_batches: PositiveFloat = Field(description="how many per step, the sum of the pieces' fractions (a "
                                                     "rerouting may cut a micro-batch into sample groups)")
    pieces: list[Piece] = Field(min_length=1)


class RankWork(_Strict):
    """What one rank of the new job runs."""

    rank: NonNegativeInt = Field(description="global rank in the new job")
    device: NonNegativeInt = Field(description="the device taking it: its global rank in the old job")
    pipeline: NonNegativeInt = Field(description="data-parallel replica")
    stage: NonNegativeInt
    num_stages: PositiveInt = Field(description="stages of this rank's pipeline")
    tp_rank: NonNegativeInt
    tp_group: list[NonNegativeInt] = Field(min_length=1, description="new global ranks of the stage's TP group")
    prev_rank: NonNegativeInt | None = Field(None, description="new global rank of the previous stage's rank of "
                                             "this TP rank in this pipeline: null on the first stage, and where that "
                                             "stage was lost and rerouted (see rerouted_neighbours)")
    next_rank: NonNegativeInt | None = Field(None, description="new global rank of the next stage's rank of this "
                                             "TP rank in this pipeline: null on the last stage, and where that stage "
                                             "was lost and rerouted (see rerouted_neighbours)")
    layers: tuple[NonNegativeInt, NonNegativeInt] = Field(description="workload layers [first, end)")
    modules: list[str] = Field(min_length=1, description="module FQNs of this stage, in the trainer's vocabulary")
    micro_batches: PositiveInt = Field(description="micro-batches per step of this rank's pipeline")
    micro_batch_size: PositiveInt
    rerouted: list[ReroutedWork] = Field(default_factory=list, description="a rerouting's extra work: other "
                                         "pipelines' micro-batches of this stage that this rank computes each step "
                                         "(their pipeline lost this stage); empty otherwise")
    rerouted_neighbours: list[Piece] = Field(default_factory=list, description="where a neighbouring stage of "
                                             "this pipeline was lost and rerouted: each of this rank's own "
                                             "micro-batch pieces with the ranks that send its activations (prev) "
                                             "and receive them (next) instead of prev_rank / next_rank; empty "
                                             "otherwise")
    actions: list[str] = Field(default_factory=list, description="a bubble-filled rerouting's order of this "
                               "rank's operations, in torch pipelining's notation: stage, F (forward), I (input "
                               "gradient) or W (weight gradient), global micro-batch id (a piece's id), e.g. "
                               "1F4 1I4 1W4; empty when the trainer orders the work itself")


class TorchtitanParallelism(_Strict):
    """torchtitan's `[parallelism]` keys for a uniform plan."""

    data_parallel_replicate_degree: PositiveInt
    data_parallel_shard_degree: PositiveInt
    tensor_parallel_degree: PositiveInt
    pipeline_parallel_degree: PositiveInt
    pipeline_parallel_microbatch_size: PositiveInt
    module_fqns_per_model_part: list[list[str]] | None = None


class TorchtitanTraining(_Strict):
    """torchtitan's `[training]` batch keys for a uniform plan."""

    local_batch_size: PositiveInt
    global_batch_size: PositiveInt
    seq_len: PositiveInt | None = None


class NodeLaunch(_Strict):
    """One surviving node's part of the new job: a block of consecutive global ranks, as torchrun
    numbers them (the processes of lower node ranks, plus the local rank)."""

    node_rank: NonNegativeInt = Field(description="torchrun's --node-rank for this node")
    node: NonNegativeInt = Field(description="the physical node: its index in the old job (old rank // devices "
                                             "per node)")
    nproc_per_node: PositiveInt = Field(description="torchrun's --nproc-per-node for this node: its training ranks")
    ranks: tuple[NonNegativeInt, PositiveInt] = Field(description="its new global ranks [first, end): local rank i "
                                                      "is global rank first + i")
    devices: list[NonNegativeInt] = Field(min_length=1, description="the old global rank each local rank takes, "
                                          "in local-rank order")
    cuda_visible_devices: str = Field(description="CUDA_VISIBLE_DEVICES for this node's launch: the old local ranks "
                                      "(the GPU index each ran on under torchrun's default one-GPU-per-local-rank "
                                      "binding), so local rank i runs on old device devices[i]")
    torchrun: list[str] = Field(description="torchrun's arguments for this node (static rendezvous, torchrun's "
                                "default: another backend orders nodes itself)")


class _Export(_Strict):
    uniform: bool = Field(description="true when the plan is the trainer's parallelism settings")
    world_size: PositiveInt = Field(description="ranks of the new job")
    rank_order: Literal["tp-dp-pp", "tp-pp-dp"] | None = Field(
        description="the trainer's rank order (innermost first) that reads every new rank's (tp, stage, pipeline) "
        "off its global rank: the order the exported settings use; null when none does (an uneven plan, or a "
        "ranks export placed by its rows)")
    nnodes: PositiveInt = Field(description="nodes the new job runs on (torchrun's --nnodes)")
    nodes: list[NodeLaunch] = Field(min_length=1, description="each node's launch, in node-rank order: new ranks "
                                    "are consecutive per node, in node order, then by old local rank")
    failed: list[NonNegativeInt] = Field(description="old global ranks that failed")
    idle: list[NonNegativeInt] = Field(description="old global ranks of surviving devices the plan gives no work "
                                       "(a rerouted stage's survivors, spares a reconfiguration leaves out, devices "
                                       "that only send state before training resumes): not ranks of the new job, "
                                       "so launch without them or keep them as spares")
    policy: str = Field(description="how the plan was chosen (initial, reconfigure, reroute, hybrid)")
    ranks: list[RankWork]


class TorchtitanExport(_Export):
    format: Literal["torchtitan"] = "torchtitan"
    parallelism: TorchtitanParallelism | None = Field(None, description="given when uniform")
    training: TorchtitanTraining | None = Field(None, description="given when uniform")
    config: dict[str, Any] | None = Field(
        None, description="the complete job config, given when uniform: the imported one (same era and keys) with "
        "its parallelism and batch settings replaced, or a TOML-era config of these settings alone")


class MegatronExport(_Export):
    format: Literal["megatron"] = "megatron"
    arguments: list[str] | None = Field(
        None, description="Megatron-LM arguments, given when uniform: the imported script's arguments with the "
        "parallelism, split and batch arguments replaced (or these arguments alone)")
    launcher: list[str] | None = Field(None, description="torchrun's arguments common to every node, given when "
                                       "uniform: the imported launcher's with --nnodes set (and --nproc-per-node "
                                       "when every node runs as many ranks); each node adds its line from `nodes`")


class RanksExport(_Export):
    format: Literal["ranks"] = "ranks"
    plan: dict[str, Any] = Field(description="the plan as `plan --json` prints it (device ids = old ranks)")


MODELS: dict[str, type[_Export]] = {"torchtitan": TorchtitanExport, "megatron": MegatronExport, "ranks": RanksExport}


def export_schema(fmt: str) -> dict[str, Any]:
    return MODELS[fmt].model_json_schema()


def _train_plans(lowered: Mapping[int, RankPlan]) -> list[RankPlan]:
    """The lowering's `train` records in slot order (pipeline, stage, TP rank)."""
    return sorted((rp for rp in lowered.values() if rp.role == "train"),
                  key=lambda rp: (rp.pipeline, rp.stage, rp.tp_rank))


def _own_micro_batches(rp: RankPlan) -> int:
    """The micro-batches of the rank's own pipeline it computes: all of them (only a failed
    stage's are rerouted, `check.py`), so the pipeline's count."""
    return round(sum(p.hi - p.lo for p in rp.micro_batches if p.pipeline == rp.pipeline))


def is_uniform(train: list[RankPlan]) -> bool:
    """Every pipeline the same layer split and micro-batch count, and nothing rerouted."""
    shapes: dict[int, list[Any]] = {}
    for rp in train:
        if any(p.pipeline != rp.pipeline for p in rp.micro_batches):
            return False
        if rp.tp_rank == 0:
            shapes.setdefault(rp.pipeline, [_own_micro_batches(rp)]).append(rp.layers)
    return len({tuple(shape) for shape in shapes.values()}) <= 1


def new_ranks(train: list[RankPlan]) -> dict[int, int]:
    """Device -> new global rank, node by node as torchrun numbers them: the training devices in
    old-rank order (node-major, so node order and, within a node, old local rank order)."""
    return {device: rank for rank, device in enumerate(sorted(rp.rank for rp in train))}


def node_launches(instance: Instance, ranks: dict[int, int]) -> list[NodeLaunch]:
    """Each node holding ranks: its torchrun line and its local ranks' old devices (`ranks` from
    new_ranks, so each node's ranks are consecutive)."""
    per_node = instance.devices_per_node
    by_node: dict[int, list[int]] = {}
    for device in sorted(ranks, key=ranks.__getitem__):
        by_node.setdefault(instance.node_of(device), []).append(device)
    out = []
    for node_rank, (node, devices) in enumerate(by_node.items()):
        first = ranks[devices[0]]
        assert [ranks[d] for d in devices] == list(range(first, first + len(devices))), "ranks not node by node"
        out.append(NodeLaunch(node_rank=node_rank, node=node, nproc_per_node=len(devices),
                              ranks=(first, first + len(devices)), devices=devices,
                              cuda_visible_devices=",".join(str(d - node * per_node) for d in devices),
                              torchrun=["--nnodes", str(len(by_node)), "--node-rank", str(node_rank),
                                        "--nproc-per-node", str(len(devices)), "--rdzv-backend", "static"]))
    return out


def _misplaced(train: list[RankPlan], ranks: dict[int, int], order: str) -> tuple[RankPlan, dict[str, int]] | None:
    """The first device whose new rank `order` reads as another slot than the plan's (another
    stage or TP rank, or a pipeline sharing another's data-parallel index) with its position, or
    None when the order reads every rank as the plan places it."""
    first = train[0]
    assert first.tensor_parallel is not None and first.num_stages is not None
    sizes = {"tp": first.tensor_parallel, "pp": first.num_stages, "dp": len({rp.pipeline for rp in train})}
    replica: dict[int, int] = {}
    for rp in sorted(train, key=lambda rp: ranks[rp.rank]):
        position = grid_position(order, sizes, ranks[rp.rank])
        if (position["tp"], position["pp"]) != (rp.tp_rank, rp.stage) or \
                replica.setdefault(rp.pipeline, position["dp"]) != position["dp"] or \
                list(replica.values()).count(position["dp"]) > 1:
            return rp, position
    return None


def trainer_order(train: list[RankPlan], ranks: dict[int, int], orders: tuple[str, ...]) -> str | None:
    """The first of `orders` in which the trainer, reading each new global rank, puts every device
    on the stage and TP rank the plan gives it, one data-parallel index per pipeline (a uniform
    plan's replicas are alike, so their numbering is free); None when none does."""
    return next((order for order in orders if _misplaced(train, ranks, order) is None), None)


def _refusal(instance: Instance, fmt: str, train: list[RankPlan], ranks: dict[int, int]) -> InputError:
    """Why the trainer of `fmt` cannot run this plan launched node by node, on one concrete rank."""
    order = TRAINER_ORDERS[fmt][0]
    found = _misplaced(train, ranks, order)
    assert found is not None
    rp, position = found
    per_node = instance.devices_per_node
    orders = " or ".join(TRAINER_ORDERS[fmt])
    also = ""
    if fmt == "torchtitan" and trainer_order(train, ranks, ("tp-pp-dp",)):
        also = ", or --format megatron (its --use-tp-pp-dp-mapping order runs it)"
    return InputError(instance.path, "--format", f"torchrun numbers ranks node by node, so old rank {rp.rank} (node "
                      f"{instance.node_of(rp.rank)}, local rank {rp.rank % per_node}) becomes new rank "
                      f"{ranks[rp.rank]}, which {TRAINER_NAMES[fmt]}'s rank order ({orders}) puts on stage "
                      f"{position['pp']}, TP rank {position['tp']}, but the plan runs it on stage {rp.stage}, TP rank "
                      f"{rp.tp_rank} of pipeline {rp.pipeline}: no launch of {TRAINER_NAMES[fmt]} runs this plan",
                      f"use --format ranks (each rank placed by its row, for the chameleon runtime){also}")


def _piece(p: WorkPiece, ranks: dict[int, int]) -> Piece:
    return Piece(id=p.id, lo=p.lo, hi=p.hi, prev=[Neighbour(rank=ranks[n.device], lo=n.lo, hi=n.hi) for n in p.prev],
                 next=[Neighbour(rank=ranks[n.device], lo=n.lo, hi=n.hi) for n in p.next])


def rank_work(rp: RankPlan, ranks: dict[int, int], num_layers: int, vocabulary: str, mbs: int) -> RankWork:
    """One `train` record as the export's row: devices renamed to new ranks, modules in the
    trainer's vocabulary, the pieces of other pipelines grouped by owner, and the own pieces'
    links where a neighbouring stage was lost (no static neighbour to name)."""
    assert rp.layers is not None and rp.stage is not None and rp.pipeline is not None
    extra: dict[int, list[WorkPiece]] = {}
    for p in rp.micro_batches:
        if p.pipeline != rp.pipeline:
            extra.setdefault(p.pipeline, []).append(p)
    rerouted = [ReroutedWork(pipeline=owner, stage=rp.stage, micro_batches=sum(p.hi - p.lo for p in pieces),
                             pieces=[_piece(p, ranks) for p in pieces])
                for owner, pieces in sorted(extra.items())]
    lost = (rp.prev_device is None and rp.stage > 0) or (rp.next_device is None and rp.stage + 1 != rp.num_stages)
    relinked = [_piece(p, ranks) for p in rp.micro_batches if p.pipeline == rp.pipeline] if lost else []
    first, end = rp.layers
    return RankWork(rank=ranks[rp.rank], device=rp.rank, pipeline=rp.pipeline, stage=rp.stage,
                    num_stages=rp.num_stages, tp_rank=rp.tp_rank, tp_group=[ranks[d] for d in rp.tp_group],
                    prev_rank=None if rp.prev_device is None else ranks[rp.prev_device],
                    next_rank=None if rp.next_device is None else ranks[rp.next_device],
                    layers=(first, end),
                    modules=[m for layer in range(first, end) for m in module_names(layer, num_layers, vocabulary)],
                    micro_batches=_own_micro_batches(rp), micro_batch_size=mbs, rerouted=rerouted,
                    rerouted_neighbours=relinked, actions=rp.torch_actions())


def torchtitan_head_name(config: dict[str, Any] | None, era: str) -> str:
    """The output projection's module name in the imported job's torchtitan: `output` until
    torchtitan renamed it `lm_head` (April 2026, with ChunkedCELoss), as the job's own
    module_fqns_per_model_part says, or its era (a Python-config dump carrying the model's
    config is from July 2026 or later)."""
    parts = ((config or {}).get("parallelism") or {}).get("module_fqns_per_model_part") or []
    names = {m for part in parts for m in part}
    if "lm_head" in names or "output" in names:
        return "lm_head" if "lm_head" in names else "output"
    return "lm_head" if era == "python" and "model" in ((config or {}).get("model_spec") or {}) else "output"


def torchtitan_config(original: dict[str, Any] | None, parallelism: TorchtitanParallelism,
                      training: TorchtitanTraining, micro_batches: int) -> dict[str, Any]:
    """The complete job config: the imported one with the plan's degrees, explicit stages and
    batch settings in the keys that config uses (the schedule and everything else kept), or a
    TOML-era config of the plan's settings alone."""
    import copy

    config = copy.deepcopy(original) if original is not None else {}
    par = config.setdefault("parallelism", {})
    train = config.setdefault("training", {})
    values = parallelism.model_dump()
    pp = values["pipeline_parallel_degree"]
    new_batch_keys = "num_tokens_per_microbatch_per_dp_rank" in train or "max_context_length" in train
    if "num_pp_microbatches" in par or new_batch_keys:
        values.pop("pipeline_parallel_microbatch_size")
        values["num_pp_microbatches"] = micro_batches if pp > 1 else 1
    for key, value in values.items():
        if value is not None or key in par:
            par[key] = value
    par.pop("pipeline_parallel_layers_per_stage", None)  # the explicit module lists say it all
    if pp == 1:
        par.pop("module_fqns_per_model_part", None)
    else:
        # a job that did not pipeline may name a looped schedule (torchtitan's debug configs do), which
        # with one part per rank torchtitan refuses; and torchtitan's CUDA graphs refuse pipelining
        if str(par.get("pipeline_parallel_schedule", "1F1B")) not in ("1F1B", "GPipe"):
            par["pipeline_parallel_schedule"] = "1F1B"
        if "disable_cuda_graphs" in train:
            train["disable_cuda_graphs"] = True
    if new_batch_keys:
        context = train.get("max_context_length") or training.seq_len
        mbs = training.local_batch_size // (micro_batches if pp > 1 else 1)
        train["num_tokens_per_microbatch_per_dp_rank"] = mbs * context
        train["num_tokens_per_train_step"] = training.global_batch_size * context
        train["max_context_length"] = context
    else:
        train["local_batch_size"] = training.local_batch_size
        train["global_batch_size"] = training.global_batch_size
        if training.seq_len is not None:
            train["seq_len"] = training.seq_len
    return config


def megatron_split(blocks: list[int]) -> dict[str, str]:
    """Megatron-LM's arguments for blocks per stage (embedding on the first, loss on the last):
    none when even; --decoder-first/last-pipeline-num-layers when only the first and last stages
    differ and hold at least one block (Megatron rejects 0 there); otherwise the explicit
    --pipeline-model-parallel-layout ("E" embedding, "t*n" n blocks, "L" loss, "|" between stages).
    Megatron-LM unrolls "x*n" itself (PipelineParallelLayerLayout.parse_str_to_list)."""
    pp = len(blocks)
    if pp == 1 or len(set(blocks)) == 1:
        return {}
    middle = blocks[1:-1]
    if len(set(middle)) <= 1 and blocks[0] > 0 and blocks[-1] > 0:
        even = middle[0] if middle else None
        out = {}
        if blocks[0] != even:
            out["--decoder-first-pipeline-num-layers"] = str(blocks[0])
        if blocks[-1] != even:
            out["--decoder-last-pipeline-num-layers"] = str(blocks[-1])
        return out
    stages = [f"t*{n}" if n > 1 else "t" * n for n in blocks]
    stages[0], stages[-1] = "E" + stages[0], stages[-1] + "L"
    return {"--pipeline-model-parallel-layout": "|".join(stages)}


_SPLIT_FLAGS = ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
                "--pipeline-model-parallel-layout", "--account-for-embedding-in-pipeline-split",
                "--account-for-loss-in-pipeline-split")
_SWITCHES = ("--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
             "--use-tp-pp-dp-mapping", "--standalone")
"""Flags without a value among those the export replaces or drops (the rest take one)."""


def megatron_arguments(original: list[str] | None, settings: Mapping[str, str | None],
                       drop: tuple[str, ...] = ()) -> list[str]:
    """The imported arguments with `settings` replacing their flags (a None value is a switch,
    written alone), any old split flag and the `drop` switches removed; or `settings` alone."""
    out: list[str] = []
    items = list(original or [])
    switches = set(_SWITCHES) | {flag for flag, value in settings.items() if value is None}
    i = 0
    while i < len(items):
        flag = items[i].split("=", 1)[0].replace("_", "-")
        takes_value = "=" not in items[i] and i + 1 < len(items) and not items[i + 1].startswith("--")
        if flag in settings or flag in _SPLIT_FLAGS or flag in drop:
            i += 2 if takes_value and flag not in switches else 1
            continue
        out.append(items[i])
        i += 1
    for flag, value in settings.items():
        out += [flag] if value is None else [flag, value]
    return out


def megatron_launcher(original: list[str] | None, nodes: list[NodeLaunch]) -> list[str]:
    """torchrun's arguments common to every node of the new job: the imported ones (when given)
    with --nnodes set, --nproc-per-node set when every node runs as many ranks (else each node's
    line in `nodes` gives its own), static rendezvous where another backend was named (it would
    order the nodes itself), and --node-rank, which differs per node, left to `nodes`."""
    settings: dict[str, str | None] = {"--nnodes": str(len(nodes))}
    counts = {n.nproc_per_node for n in nodes}
    if len(counts) == 1:
        settings["--nproc-per-node"] = str(counts.pop())
    words = [w.split("=", 1)[0].replace("_", "-") for w in original or []]
    if "--rdzv-backend" in words:
        settings["--rdzv-backend"] = "static"
    drop = ("--node-rank", "--nproc-per-node") + (("--standalone",) if len(nodes) > 1 else ())
    return megatron_arguments(original, settings, drop)


def export_plan(instance: Instance, lowered: LoweredPlan, fmt: str, policy: str) -> dict[str, Any]:
    """The document of format `fmt` for the decision lowered as `lowered` (its `rank_plans`:
    the rows are its records, not a second lowering), validated by the format's schema."""
    plan, failed = lowered.plan, lowered.failed
    if plan.rerouted and fmt != "ranks":
        raise InputError(instance.path, "--policy", f"the chosen plan reroutes work, which {fmt} cannot run",
                         "use --policy reconfigure, or --format ranks for the chameleon runtime")
    if fmt not in FORMATS:
        raise InputError(None, "--format", f"unknown format {fmt!r}", f"use one of {', '.join(FORMATS)}")
    train = _train_plans(lowered)
    uniform = is_uniform(train)
    ranks = new_ranks(train)
    source = instance.spec.trainer
    orders = TRAINER_ORDERS[fmt]
    layout = instance.spec.plan.layout
    if fmt == "megatron" and source is not None and source.name == "megatron" and layout is not None:
        orders = tuple(sorted(orders, key=lambda o: o != layout.order))  # the imported job's order first
    order = trainer_order(train, ranks, orders) if uniform else None
    if uniform and order is None and fmt != "ranks":
        raise _refusal(instance, fmt, train, ranks)
    mbs, num_layers = instance.micro_batch_size, instance.workload.num_layers
    work = sorted((rank_work(rp, ranks, num_layers, VOCABULARY[fmt], mbs) for rp in train), key=lambda w: w.rank)
    idle = sorted(set(range(instance.num_devices)) - failed - ranks.keys())
    nodes = node_launches(instance, ranks)
    common: dict[str, Any] = {"uniform": uniform, "world_size": len(work), "failed": sorted(failed), "idle": idle,
                              "rank_order": order, "nnodes": len(nodes), "nodes": nodes, "policy": policy,
                              "ranks": work}
    # A uniform plan's settings, read off pipeline 0's TP-rank-0 rows (every pipeline is the same).
    stages = sorted(w.layers for w in work if w.pipeline == work[0].pipeline and w.tp_rank == 0)
    tp, pp, dp = len(work[0].tp_group), len(stages), len({w.pipeline for w in work})
    micro_batches = work[0].micro_batches
    seq = instance.spec.training.sequence_length or instance.workload.sequence_length
    copies = instance.spec.training.shard_replicas if instance.spec.training.zero >= 1 else 1
    if uniform and fmt != "ranks" and dp % copies:
        groups = "HSDP" if fmt == "torchtitan" else "distributed-optimizer instances"
        raise InputError(instance.path, "--format", f"the plan has {dp} data-parallel replicas, not a multiple of "
                         f"training.shard_replicas = {copies}: {TRAINER_NAMES[fmt]} splits its data-parallel ranks "
                         f"into {copies} equal shard groups ({groups}) and refuses this one",
                         f"plan with --target {fmt} (its replicas a multiple of {copies}), or use --format ranks")
    if fmt == "torchtitan" and uniform and pp > 1 and instance.spec.training.virtual_stages > 1:
        # the export writes one part per rank and the 1F1B schedule, not the looped stages priced
        raise InputError(instance.path, "training.virtual_stages", f"is {instance.spec.training.virtual_stages}: "
                         "the torchtitan export writes one stage per rank (1F1B), not the interleaved schedule "
                         "the plan was priced with", "set virtual_stages to 1 and plan again, or use --format ranks")
    if fmt == "torchtitan":
        doc: _Export = TorchtitanExport(**common)
        if uniform:
            fsdp = instance.spec.training.zero >= 1
            original = source.config if source is not None and source.name == "torchtitan" else None
            head = torchtitan_head_name(original, source.era if source is not None else "toml")
            parts = [[m for layer in range(first, end) for m in module_names(layer, num_layers, "torchtitan", head)]
                     for first, end in stages] if pp > 1 else None
            local = micro_batches * mbs if pp > 1 else mbs
            parallelism = TorchtitanParallelism(
                data_parallel_replicate_degree=copies if fsdp else dp,  # HSDP: `copies` groups of dp / copies
                data_parallel_shard_degree=dp // copies if fsdp else 1,
                tensor_parallel_degree=tp, pipeline_parallel_degree=pp, pipeline_parallel_microbatch_size=mbs,
                module_fqns_per_model_part=parts)
            training = TorchtitanTraining(local_batch_size=local, global_batch_size=micro_batches * mbs * dp,
                                          seq_len=seq)
            doc = TorchtitanExport(**common, parallelism=parallelism, training=training,
                                   config=torchtitan_config(original, parallelism, training, micro_batches))
    elif fmt == "megatron":
        args, launcher = None, None
        if uniform:
            blocks = [end - first - (first == 0) - (end == num_layers) for first, end in stages]
            settings: dict[str, str | None] = {
                "--tensor-model-parallel-size": str(tp), "--pipeline-model-parallel-size": str(pp),
                "--micro-batch-size": str(mbs), "--global-batch-size": str(micro_batches * mbs * dp),
                **megatron_split(blocks)}
            if copies > 1:  # its distributed optimizer's instances: dp / copies consecutive DP ranks each
                settings["--num-distributed-optimizer-instances"] = str(copies)
            mapping = "--use-tp-pp-dp-mapping"
            if order == "tp-pp-dp":
                settings[mapping] = None
            original = source if source is not None and source.name == "megatron" else None
            drop = ((mapping,) if order != "tp-pp-dp" else ()) + (
                ("--num-distributed-optimizer-instances",) if copies == 1 else ())  # nothing sharded in copies
            args = megatron_arguments(original.arguments if original else None, settings, drop=drop)
            launcher = megatron_launcher(original.launcher if original else None, nodes)
        doc = MegatronExport(**common, arguments=args, launcher=launcher)
    else:
        doc = RanksExport(**common, plan=plan.to_json())
    return doc.model_dump(mode="json")
