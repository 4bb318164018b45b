"""The runtime on Hugging Face model families: DTensor tensor parallelism inside each stage,
`torch.distributed.pipelining` between stages, recovery by reconfiguration, rerouting or both.

One process per device (gloo on CPU, one thread each). A generation is one plan: every pipeline
of it runs one `PipelineStage` per (stage, TP rank) on a `Schedule1F1B` of its own micro-batch
count (pipelines may differ in depth, split and micro-batches: reconfigured plans do); the TP
group of a stage is a 1-D DeviceMesh over which its blocks are sharded (`runtime.hf`), and the
pipeline of TP rank t links the t-th ranks of its stages, as torchtitan does. Gradients are
summed over every holder of a parameter shard (data-parallel replicas, and a tied embedding's
head copy), one flat all-reduce per holder set in one global order (deadlock-free). AdamW runs on
the local shards (exactly torch's AdamW, element-wise), so a shard's state is plain tensors that
can move.

Each stage runs its plan's memory relief (`Stage.relief`, None: the training's recomputation;
perf/relief_kinds.py): its activation mode in the stage's forward (`hf.Stage.set_activation_mode`:
block or attention-core checkpointing, or activations copied to host memory) and, with
`+opt-offload`, its optimizer state and step in a host buffer (`offload.HostAdamW`). The planner
chooses reliefs among the instance's `training.reliefs`, so a recovery that only fits with one runs
it; every worker reports the relief it built (`PipelinedReport.reliefs`).

On a failure the controller asks the planner (`planning.plan_recovery`, the controller's policy:
reconfigure by default, reroute or auto; the plan keeps the TP degree unless `tp_degrees` allows
others) for a plan over the survivors, from the layout the state is in.

A rerouting keeps the layout: a lost stage's micro-batches run on the same stage of data-parallel
peers (the planner reroutes only between stages of the same layers, so a host needs no other
weights and nothing moves). Torch's schedules cannot run it (one pipeline, a fixed rank per stage),
so every live rank runs its rank plan (`comm.lowering.RankPlan`: pieces of micro-batches with the
ranks that feed them and that they feed) itself on its `hf.Stage` (`Worker._run_operations`):
forwards and backwards in the order the plan fixes (a bubble-filled rerouting's action lists,
`RankPlan.actions`, with the backward split into B, the input gradient, and W, the weight
gradient, `runtime.split_backward`) or else in the runtime's 1F1B list order
(`runtime.schedule.order_operations`, full backward), activations exchanged point to point over
one group of the generation's ranks (non-blocking sends, blocking receives, so that those orders
cannot deadlock). The loss is divided by the global batch and gradients are summed over the live
holders, as with torch's schedule. A stage that lost a device drops out: a live TP peer there idles
and drops its shards, and the planner counts it out until a plan no longer lists it (`_stale`).
The layout the state is in is the rerouted plan without its rerouting, which a later failure
plans from. A hybrid (policy auto) runs its interim rerouting at once and switches
to its reconfigured plan after the next committed step, migrating from the layout the state is
in then; a failure in that switch is recovered from as any other.

A reconfiguration comes with its migration schedule, and each shard a device lacks is sent by the
planned peer-to-peer transfers (a layer's shard state flattened, the schedule's byte shares cut
into element ranges). `restore="checkpoint"` instead re-shards from a `torch.distributed.checkpoint`
written after every committed step, keyed by parameter names (the baseline the migration must
beat); `verify=True` migrates and also loads the checkpoint, and checks that both give the same
state. A plan of another TP degree (`tp_degrees`) is always restored from the checkpoint, as the
planner prices it (comm/reshard.py): the transfers move shards of one degree only. The stored
global tensors do not depend on the degree (GPT-2's fused q/k/v rows, laid out per degree, are
stored as their q, k and v parts: `_pieces`). A step commits in two phases (every rank ready, then the
optimizer steps), so the step a failure interrupts is redone whole. A transition keeps the old
state until every rank is ready (`go`), so a failure during it (the planner is asked again from the
same layout with one more device gone) loses nothing; when some layer has no live holder left the
job ends with UnrecoverableError (exit 5) naming the layers. A worker that hangs alive is found by
its heartbeat (`replies.Heartbeats`), SIGKILLed and recovered from as a dead one. A failed device
can come back as a fresh worker holding no state (`controller.Rejoin`): `rejoin.plan_join` decides
its return and the next generation gives it its state by the planned transfers; a failure during
that transition leaves it out again.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import gc
import os
import resource
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.nn.functional  # noqa: F401  before any group: chameleon_opt/runtime/__init__.py says why

from chameleon_opt.comm import communication_plan
from chameleon_opt.comm.lowering import RankPlan, state_shares
from chameleon_opt.decision import with_stale_copies
from chameleon_opt.errors import UnrecoverableError
from chameleon_opt.instance.load import Instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.perf.relief_kinds import parse_relief, relief_name
from chameleon_opt.plan import Plan
from chameleon_opt.planning import PlanningOptions, plan_recovery
from chameleon_opt.rejoin import plan_join
from chameleon_opt.runtime import hf
from chameleon_opt.runtime.cores import start_worker
from chameleon_opt.runtime.executable import refuse_unexecuted
from chameleon_opt.runtime.offload import HostAdamW
from chameleon_opt.runtime.p2p import allreduce_flat, receive_piece, send_piece
from chameleon_opt.runtime.phases import PhaseTimer, runqueue_wait_s
from chameleon_opt.runtime.replies import SILENT_S, Heartbeats, collect_replies, start_heartbeat, step_loss
from chameleon_opt.runtime.schedule import order_operations, planned_operations, work_items
from chameleon_opt.runtime.split_backward import split_backward
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.workload.schema import WorkloadSpec

LEARNING_RATE = 3e-3
WEIGHT_DECAY = 0.01
STATE_PARTS = ("param", "exp_avg", "exp_avg_sq")
ABANDON_AFTER_S = 0.25   # a step still running this long after an abort's shut sockets is left behind
GROUP_NAMES_PER_GENERATION = 1000   # group names a generation may use (it forms one per holder set, TP and PP group)
STRAGGLER_S = 1.5   # survivors silent this long after a death get their stacks dumped (a diagnosis)


@dataclass(frozen=True)
class JobSpec:
    """What every worker of one job shares."""

    hf_config: str
    seed: int
    global_batch: int
    micro_batch_size: int
    seq_len: int
    tensor_parallel: int
    dtype: str
    group_timeout_s: float       # the generation's world group: forming groups, migration, checkpoints
    step_timeout_s: float        # the step's groups (TP, pipeline, gradients): how long a rank waits on a
                                 # peer that gave up before gloo fails it (an abort does not reach it)
    checkpoint_dir: str | None   # written after every committed step when set
    phase_timers: bool = False   # each step's reply carries its phases' wall and CPU times (runtime/phases.py)


# ---- worker -------------------------------------------------------------------------------------

class Worker:
    """One device: its shard state between generations, its stage and schedule within one."""

    def __init__(self, device: int, job: JobSpec, store_port: int, conn: Connection,
                 heartbeat_slots: Any = None) -> None:
        self.device, self.job, self.conn = device, job, conn
        self.heartbeat_slots = heartbeat_slots
        self.dtype = getattr(torch, job.dtype)
        self.config = hf.load_config(job.hf_config)
        self.tied = bool(getattr(self.config, "tie_word_embeddings", False))
        self.store_port = store_port
        self.store = dist.TCPStore("127.0.0.1", store_port, None, False,
                                   timeout=timedelta(seconds=job.group_timeout_s))
        self.state: dict[str, dict[str, torch.Tensor]] = {}   # name -> local shard of param + moments
        self.layers: tuple[int, int] | None = None
        self.tp_rank = 0
        self.tp_degree = job.tensor_parallel   # of the shards in `state`
        self.steps_done = 0
        self.stage: hf.Stage | None = None
        self.pending: dict[str, Any] | None = None
        self.groups: dict[tuple[int, ...], Any] = {}
        self.timer = PhaseTimer(job.phase_timers)
        self.received = 0.0   # when the step message arrived (the timers' dispatch phase)

    # the stage of a generation ----------------------------------------------------------------
    def _build_stage(self, first: int, end: int, tp: int, tp_group: Any, generation: int, activation_mode: str
                     ) -> tuple[hf.Stage, dict[str, torch.Tensor]]:
        """The stage module (sharded over its TP group of `tp` when TP > 1, running
        `activation_mode`) and each parameter's local shard, by name."""
        model = hf.build_model(self.config, self.job.seed, self.dtype, tp)
        stage = hf.Stage(model, self.config, first, end)
        if tp > 1:
            from torch.distributed.device_mesh import DeviceMesh

            # a mesh equal to an earlier generation's (same ranks) would hit DTensor's caches, which
            # hold that mesh and its destroyed group: a name per generation keeps them apart
            hf.shard_stage(stage, DeviceMesh.from_group(tp_group, "cpu", mesh_dim_names=(f"tp{generation}",)))
        stage.set_activation_mode(activation_mode)
        return stage, {name: _local(p) for name, p in _named_params(stage)}

    def _layer_names(self, stage: hf.Stage, layer: int) -> list[str]:
        return sorted(n for n, _ in _named_params(stage) if stage.layer_of(n) == layer)

    def _flat(self, state: dict[str, dict[str, torch.Tensor]], names: list[str]) -> torch.Tensor:
        return torch.cat([state[n][part].reshape(-1) for part in STATE_PARTS for n in names])

    def generation(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Form the groups, build the new stage, move state (migration or checkpoint); the old
        state stays until `go`."""
        t0 = time.perf_counter()
        rank_of = {int(d): r for d, r in msg["rank_of"].items()}
        self._shutdown()
        from torch.distributed import distributed_c10d

        # group names (and their store keys) are this counter, which destroy_process_group resets: set
        # the same on every rank, a device back included, and never to a name an earlier generation
        # used (an old group freed later unregisters its name)
        distributed_c10d._world.group_count = msg["group_base"]
        dist.init_process_group("gloo", store=dist.PrefixStore(f"gen{msg['name']}/", self.store),
                                rank=rank_of[self.device], world_size=len(rank_of),
                                timeout=timedelta(seconds=self.job.group_timeout_s))
        groups: dict[tuple[int, ...], Any] = {}
        for ranks in msg["groups"]:  # every rank creates every group, in the same order
            group = dist.new_group(ranks, timeout=timedelta(seconds=self.job.group_timeout_s))
            if rank_of[self.device] in ranks:
                groups[tuple(ranks)] = group
        role = msg["role"]
        t1 = time.perf_counter()
        if msg.get("die_in_transition"):
            self._die(False)
        new_state: dict[str, dict[str, torch.Tensor]] = {}
        stage = None
        relief = None
        if role is not None:
            first, end = role["layers"]
            mode, optimizer_offloaded = parse_relief(role["relief"])
            tp = len(role["tp_group"])
            stage, shards = self._build_stage(first, end, tp, groups.get(tuple(role["tp_group"])), msg["generation"],
                                              mode)
            relief = relief_name(stage.activation_mode, optimizer_offloaded)
            for name, shard in shards.items():
                same = self.tp_rank == role["tp_rank"] and self.tp_degree == tp  # the same shard of the same cut
                held = self.state.get(name) if same else None
                if held is not None and self.layers is not None and self.layers[0] <= stage.layer_of(name) < self.layers[1]:
                    new_state[name] = {part: held[part].clone() for part in STATE_PARTS}
                elif msg["generation"] == 0:
                    new_state[name] = {"param": shard.clone(), "exp_avg": torch.zeros_like(shard),
                                       "exp_avg_sq": torch.zeros_like(shard)}
        t_built = time.perf_counter()
        if msg["restore"] in ("migration", "verify"):
            self._migrate(msg["transfers"], stage, new_state, rank_of)
        if msg["restore"] in ("checkpoint", "verify"):
            restored = self._load_checkpoint(msg["checkpoint"], stage, role)
            if msg["restore"] == "verify":
                for name, parts in restored.items():
                    for part in STATE_PARTS:
                        if not torch.equal(parts[part], new_state[name][part]):
                            raise AssertionError(f"device {self.device}: migrated {name}.{part} differs from the "
                                                 "checkpoint's re-shard")
            new_state = restored
        t2 = time.perf_counter()
        if role is not None:
            missing = set(shards) - set(new_state)
            if missing:
                raise AssertionError(f"device {self.device} lacks {sorted(missing)[:3]} after the transition")
        self.pending = {"state": new_state, "stage": stage, "role": role, "groups": groups, "rank_of": rank_of,
                        "steps_done": msg["steps_done"], "rank_plan": msg.get("rank_plan"), "ops": msg.get("ops"),
                        "p2p_group": msg.get("p2p_group")}
        return {"event": "ready", "device": self.device, "group_s": t1 - t0, "build_s": t_built - t1,
                "restore_s": t2 - t_built, "relief": relief}

    def _migrate(self, transfers: list[dict[str, Any]], stage: hf.Stage | None,
                 new_state: dict[str, dict[str, torch.Tensor]], rank_of: dict[int, int]) -> None:
        """The planned transfers round by round; a transfer carries the fraction [lo, hi) of one
        layer's flattened shard state (params, then first, then second moments)."""
        buffers: dict[int, torch.Tensor] = {}
        shapes: dict[int, list[tuple[str, torch.Size]]] = {}
        if stage is not None:
            locals_ = dict((n, _local(p)) for n, p in _named_params(stage))
            for t in transfers:
                if t["dst"] == self.device and t["layer"] not in buffers:
                    names = self._layer_names(stage, t["layer"])
                    shapes[t["layer"]] = [(n, locals_[n].shape) for n in names]
                    buffers[t["layer"]] = torch.empty(3 * sum(locals_[n].numel() for n in names), dtype=self.dtype)
        flats: dict[int, torch.Tensor] = {}
        for rnd in sorted({t["round"] for t in transfers}):
            works = []
            for t in (t for t in transfers if t["round"] == rnd):
                if t["src"] == self.device:
                    if t["layer"] not in flats:
                        flats[t["layer"]] = self._flat(self.state, self.names_of_layer[t["layer"]])
                    flat = flats[t["layer"]]
                    lo, hi = round(t["lo"] * flat.numel()), round(t["hi"] * flat.numel())
                    if hi > lo:
                        works.append(dist.isend(flat[lo:hi].contiguous(), rank_of[t["dst"]], tag=t["tag"]))
                elif t["dst"] == self.device:
                    buf = buffers[t["layer"]]
                    lo, hi = round(t["lo"] * buf.numel()), round(t["hi"] * buf.numel())
                    if hi > lo:
                        works.append(dist.irecv(buf[lo:hi], rank_of[t["src"]], tag=t["tag"]))
            for w in works:
                w.wait()
        for layer, buf in buffers.items():
            sizes = [s.numel() for _, s in shapes[layer]]
            chunks = torch.split(buf, sizes * 3)
            n = len(sizes)
            for i, (name, shape) in enumerate(shapes[layer]):
                new_state[name] = {part: chunks[k * n + i].view(shape).clone() for k, part in enumerate(STATE_PARTS)}

    # checkpoint --------------------------------------------------------------------------------
    def _dcp_state(self, stage: hf.Stage, state: dict[str, dict[str, torch.Tensor]]) -> dict[str, Any]:
        """Shard state as DTensors keyed by parameter name (`blocks.3.mlp.up_proj.weight.exp_avg`):
        DCP stores global tensors, so any stage split, replica or TP degree can load any of them."""
        from torch.distributed.tensor import DTensor

        out: dict[str, Any] = {}
        for name, p in _named_params(stage):
            for part in STATE_PARTS:
                for key, local in _pieces(stage, name, state[name][part]):
                    out[f"{key}.{part}"] = DTensor.from_local(local, p.device_mesh, p.placements, run_check=False) \
                        if isinstance(p, DTensor) else local
        return out

    def save_checkpoint(self, folder: str) -> float:
        """Every rank of the generation takes part (DCP plans collectively); replicas dedupe."""
        import torch.distributed.checkpoint as dcp

        t0 = time.perf_counter()
        state = self._dcp_state(self.stage, self.state) if self.stage is not None else {}
        dcp.save(state, checkpoint_id=folder)
        return time.perf_counter() - t0

    def _load_checkpoint(self, folder: str, stage: hf.Stage | None, role: dict[str, Any] | None
                         ) -> dict[str, dict[str, torch.Tensor]]:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.tensor import DTensor

        if stage is None:
            dcp.load({}, checkpoint_id=folder)
            return {}
        empty = {n: {part: torch.empty_like(_local(p)) for part in STATE_PARTS}
                 for n, p in _named_params(stage)}
        target = self._dcp_state(stage, empty)
        dcp.load(target, checkpoint_id=folder)

        def loaded(key: str) -> torch.Tensor:
            value = target[key]
            return value.to_local() if isinstance(value, DTensor) else value

        return {n: {part: torch.cat([loaded(f"{key}.{part}") for key, _ in _pieces(stage, n, empty[n][part])])
                    for part in STATE_PARTS} for n in empty}

    def go(self) -> None:
        """Adopt the transition: the new stage, its schedule and its state."""
        assert self.pending is not None
        if self.heartbeat_slots is not None:
            # from the job's start on: before it, imports hold the GIL for up to 0.6 s at a time
            start_heartbeat(self.heartbeat_slots, self.device)
            self.heartbeat_slots = None
        p, self.pending = self.pending, None
        self.state, self.stage, self.groups, self.rank_of = p["state"], p["stage"], p["groups"], p["rank_of"]
        self.steps_done = p["steps_done"]   # a device back starts from none: AdamW's bias correction needs it
        role = p["role"]
        self.role = role
        self.rank_plan, self.ops = p["rank_plan"], p["ops"]
        if role is None:
            self.layers, self.schedule = None, None
            return
        self.layers, self.tp_rank, self.tp_degree = tuple(role["layers"]), role["tp_rank"], len(role["tp_group"])
        for name, param in _named_params(self.stage):
            with torch.no_grad():
                _local(param).copy_(self.state[name]["param"])
        self.holders = [_local(param).detach() for _, param in _named_params(self.stage)]
        self.names = [n for n, _ in _named_params(self.stage)]
        self.names_of_layer = {layer: self._layer_names(self.stage, layer) for layer in range(*self.layers)}
        self.host_optimizer = None
        if parse_relief(role["relief"])[1]:  # the state moves into the host buffer, the step runs there
            self.host_optimizer = HostAdamW(
                self.holders, [(self.state[n]["exp_avg"], self.state[n]["exp_avg_sq"]) for n in self.names],
                self.steps_done, LEARNING_RATE, WEIGHT_DECAY)
            self.state = {name: self.host_optimizer.state(i) for i, name in enumerate(self.names)}
        else:
            self.optimizer = torch.optim.AdamW(self.holders, lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY, foreach=False)
            for name, holder in zip(self.names, self.holders):
                st = self.state[name]
                self.state[name] = {"param": holder, "exp_avg": st["exp_avg"], "exp_avg_sq": st["exp_avg_sq"]}
                self.optimizer.state[holder] = {"step": torch.tensor(float(self.steps_done)),
                                                "exp_avg": st["exp_avg"], "exp_avg_sq": st["exp_avg_sq"]}
        for group in self.groups.values():  # built and loaded: from now on a wait is a failure
            group.set_timeout(timedelta(seconds=self.job.step_timeout_s))
        self.recorded: list[torch.Tensor] = []
        if self.ops is not None:  # a rerouted plan: this rank's pieces in its planned order (`_run_operations`)
            self.schedule = None
            self.p2p = self.groups[tuple(p["p2p_group"])]
            return
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B

        pipe_stage = PipelineStage(self.stage, role["stage"], role["num_stages"], torch.device("cpu"),
                                   group=self.groups[tuple(role["pp_group"])])
        # the chunks' compute and pipelining's bookkeeping around it, apart from the schedule's own work
        pipe_stage.forward_one_chunk = self.timer.wrap("forward", pipe_stage.forward_one_chunk)
        pipe_stage.backward_one_chunk = self.timer.wrap("backward", pipe_stage.backward_one_chunk)
        self.schedule = Schedule1F1B(pipe_stage, role["micro_batches"], loss_fn=self._loss, scale_grads=False)

    def _loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with self.timer.span("loss"):
            per_sample = hf.sample_losses(logits, targets)
            self.recorded.append(per_sample.detach())
            return per_sample.sum() / self.job.global_batch

    # steps ------------------------------------------------------------------------------------
    def _run_step(self, msg: dict[str, Any], token: int) -> None:
        """The step thread: run it and answer, unless an `abort` abandoned it meanwhile."""
        reply = self.step(msg, token)
        with self.lock:
            if token == self.step_token:
                self.step_token += 1   # answered: nothing left to abandon
                self.conn.send(reply)

    def step(self, msg: dict[str, Any], token: int | None = None) -> dict[str, Any]:
        """One step on this rank; with the phase timers, its reply carries the step's phases (and
        the previous commit's, which ran before it)."""
        if not self.timer.enabled:
            return self._step(msg, token)
        self.timer.add("dispatch", time.perf_counter() - self.received, 0.0)
        process = time.process_time()   # every thread of the process: gloo's, the heartbeat's
        kernel = resource.getrusage(resource.RUSAGE_THREAD)
        queued = runqueue_wait_s()
        with self.timer.span("step"):
            reply = self._step(msg, token)
        self.timer.add("process", 0.0, time.process_time() - process)
        self.timer.add("runqueue", runqueue_wait_s() - queued, 0.0)   # the step thread kept off its core
        after = resource.getrusage(resource.RUSAGE_THREAD)
        # the step thread's kernel CPU and minor page faults (as calls): a fresh thread per step
        # faults its allocations in again (5x a reused thread's faults, +2-4% CPU, 2-core machine)
        self.timer.add("kernel", 0.0, after.ru_stime - kernel.ru_stime, after.ru_minflt - kernel.ru_minflt)
        reply["phases"] = self.timer.take()
        return reply

    def _step(self, msg: dict[str, Any], token: int | None = None) -> dict[str, Any]:
        role = self.role
        hang = bool(msg.get("hang"))
        if role is None:
            if msg.get("die_after_forwards") is not None:  # no forward to count: at once
                self._die(hang)
            return {"event": "ready", "device": self.device, "losses": {}}
        job = self.job
        tokens = hf.batch_tokens(self.config.vocab_size, job.seq_len, job.seed, msg["step"], job.global_batch)
        lo = role["sample_offset"]
        rows = tokens[lo:lo + role["micro_batches"] * job.micro_batch_size]
        hook = None
        if msg.get("die_after_forwards") is not None:
            hook = self._arm_kill(msg["die_after_forwards"], hang)
        self.recorded = []
        losses: dict[int, float] | None = None
        try:
            with self.timer.span("schedule"):
                if self.ops is not None:
                    losses = self._run_operations(tokens)
                else:
                    first, last = role["stage"] == 0, role["stage"] == role["num_stages"] - 1
                    args = (rows[:, :-1],) if first else ()
                    kwargs = {"target": rows[:, 1:], "losses": []} if last else {}
                    self.schedule.step(*args, **kwargs)
            with self.timer.span("allreduce"):
                self._allreduce()
        except Exception as error:
            with self.lock:
                if token is not None and token != self.step_token:
                    # abandoned by an `abort`: the worker has moved on (its sockets and gradients
                    # may be the next generation's by now); touch nothing
                    return {"event": "abandoned", "device": self.device}
                # a peer died: fail fast, so peers waiting on us fail too (the groups are
                # destroyed at the controller's `abort`)
                sever_peer_sockets(self.store_port)
                for h in self.holders:
                    h.grad = None
                if hook is not None:  # a victim whose step stopped before its forward: it dies in its step
                    self._die(hang)
            return {"event": "aborted", "device": self.device, "error": _short(error), "t": time.time()}
        if hook is not None:  # fewer forwards than asked for (a small pipeline): it dies in its step
            self._die(hang)
        if role["tp_rank"] != 0:
            losses = {}   # every TP rank scores the same samples: one answers
        elif losses is None:
            # a generation's first step also scores a shape-inference forward first: keep the real ones
            values = torch.cat(self.recorded[-role["micro_batches"]:]).tolist() if self.recorded else []
            losses = {lo + k: v for k, v in enumerate(values)}
        return {"event": "ready", "device": self.device, "losses": losses}

    def _run_operations(self, tokens: torch.Tensor) -> dict[int, float]:
        """A rerouted plan's step on this rank: its rank plan's pieces (`schedule.work_items`,
        some of them a lost peer's, on this rank's own stage: a rerouting keeps every stage's
        layers) in the controller's order (`self.ops`), activations and their gradients exchanged
        point to point with the pieces' neighbours (non-blocking sends, blocking receives: the
        order cannot deadlock, runtime/schedule.py). With a W in the order the backward is split
        (`split_backward`): B sends the input gradient at once, W accumulates the weight gradients
        later, bitwise what a full backward gives. The loss is divided by the global batch, as in
        the torch schedule. Returns the losses of the samples whose loss it computed."""
        assert self.stage is not None and self.rank_plan is not None and self.ops is not None
        job, stage = self.job, self.stage
        items = work_items(self.rank_plan, job.micro_batch_size)
        params = list(stage.parameters())
        split = any(kind == "W" for kind, _ in self.ops)
        shape = (job.seq_len, self.config.hidden_size)
        saved: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}
        deferred: dict[int, Callable[[], None]] = {}   # piece -> its W
        sends: list[Any] = []
        losses: dict[int, float] = {}
        for kind, i in self.ops:
            item = items[i]
            assert item is not None   # an ordered op always has samples
            if kind == "F":
                x = None if stage.has_embedding else receive_piece(
                    item.receive_from, shape, self.dtype, self.rank_of, False, self.p2p).requires_grad_(True)
                with self.timer.span("forward"):
                    out = stage(tokens[item.start:item.stop, :-1] if x is None else x)
                if stage.has_head:
                    with self.timer.span("loss"):
                        per_sample = hf.sample_losses(out, tokens[item.start:item.stop, 1:])
                    losses.update({item.start + k: v for k, v in enumerate(per_sample.detach().tolist())})
                    out = per_sample.sum() / job.global_batch
                else:
                    sends += send_piece(item.send_to, item, out.detach(), self.rank_of, False, self.p2p)
                saved[i] = (x, out)
            elif kind == "B":
                x, out = saved.pop(i)
                grad = None if stage.has_head else receive_piece(
                    item.send_to, shape, self.dtype, self.rank_of, True, self.p2p)
                with self.timer.span("backward"):
                    if split:
                        x_grad, deferred[i] = split_backward(out, x, grad, params)
                    else:
                        out.backward(grad)
                        x_grad = None if x is None else x.grad
                if x_grad is not None:
                    sends += send_piece(item.receive_from, item, x_grad, self.rank_of, True, self.p2p)
            else:
                with self.timer.span("backward"):
                    deferred.pop(i)()
        for work in sends:
            work.wait()
        return losses

    def _arm_kill(self, forwards: int, hang: bool = False) -> Any:
        """Failure injection: SIGKILL (SIGSTOP with `hang`) this process after its stage's
        `forwards`-th forward; the hook's handle."""
        count = [0]

        def hook(*_: Any) -> None:
            count[0] += 1
            if count[0] >= forwards:
                self._die(hang)

        return self.stage.register_forward_hook(hook)

    def _die(self, hang: bool) -> None:
        """Tell the controller when (its latency clock), then SIGKILL this process, or SIGSTOP it:
        alive and silent, its connections open, until the heartbeat watchdog kills it."""
        self.conn.send({"event": "dying", "device": self.device, "t": time.time()})
        os.kill(os.getpid(), signal.SIGSTOP if hang else signal.SIGKILL)

    def _allreduce(self) -> None:
        """Sum each shard's gradient over its holders: one flat all-reduce per holder set, the sets
        in one global order (sorted rank lists), so no two ranks wait on each other crosswise. A
        tied embedding and head on this stage are summed here first and reduced once."""
        grads = {n: _local(p.grad) for n, p in self.stage.named_parameters()}
        both = self.tied and "embed.weight" in grads and "head.weight" in grads
        if both:
            grads["embed.weight"].add_(grads["head.weight"])
        by_group: dict[tuple[int, ...], list[str]] = {}
        for name in sorted(grads):
            tied = self.tied and name in ("embed.weight", "head.weight")
            if both and name == "head.weight":
                continue
            ranks = self.role["grad_groups"].get("tied" if tied else str(self.stage.layer_of(name)))
            if ranks is not None and len(ranks) > 1:
                by_group.setdefault(tuple(ranks), []).append(name)
        for ranks in sorted(by_group):
            allreduce_flat([grads[n] for n in by_group[ranks]], self.groups[ranks])
        if both:
            grads["head.weight"].copy_(grads["embed.weight"])

    def commit(self) -> None:
        with self.timer.span("commit"):   # reported with the next step, which waits for it
            self._commit()

    def _commit(self) -> None:
        if self.host_optimizer is not None:
            self.host_optimizer.step([_local(param.grad) for _, param in _named_params(self.stage)])
        else:
            for holder, (_, param) in zip(self.holders, _named_params(self.stage)):
                holder.grad = _local(param.grad)
            self.optimizer.step()
        self.stage.zero_grad(set_to_none=True)
        for h in self.holders:
            h.grad = None
        self.steps_done += 1

    def _shutdown(self) -> None:
        """Destroy the generation's groups and drop every object holding one (schedule, stage and
        its DTensor meshes). Their connections are shut down first (`sever_peer_sockets`: gloo's
        `abort` is a no-op, and a group is only closed once nothing refers to it), so peers blocked
        on this rank fail at once instead of waiting for a timeout. The shard state is plain
        tensors and stays."""
        if not self.groups and self.stage is None and self.pending is None and not dist.is_initialized():
            return  # nothing held (a second abort, or the generation after one)
        held = list(self.groups.values())  # alive until their sockets are severed and the world destroyed
        self.groups, self.schedule, self.stage, self.pending = {}, None, None, None
        if dist.is_initialized():
            sever_peer_sockets(self.store_port)
            try:
                dist.destroy_process_group()   # resets the group-name counter: `generation` sets it
            except Exception:
                pass
        del held
        # no gc.collect() here: it took 0.13-0.27 s per rank (7 ranks on 2 cores) on the recovery's
        # critical path, and the connections no longer wait on it (severed above or by the abort);
        # the old generation's objects go with the next automatic collection

    def _abandon_step(self) -> None:
        """A step thread still running after its sockets were shut down waits for a receive that
        gloo fails only at its timeout, not with the closed pair (seen in about 1 of 7 aborted
        DP2 x TP2 steps, in DTensor's all-reduce: "unbound_buffer.cc Timed out"; likely a message
        the closure cut off mid-read, not confirmed). It is left to time out on its own (it holds
        the old groups) and answered for here: `aborted`."""
        with self.lock:
            if self.stepping is None or not self.stepping.is_alive() or self.step_token != self.stepping_token:
                return   # it answered meanwhile
            self.step_token += 1
            self.conn.send({"event": "aborted", "device": self.device, "t": time.time(),
                            "error": f"step abandoned {ABANDON_AFTER_S:g} s after its sockets were shut down"})
        for h in self.holders:
            h.grad = None
        self.abandoned.append(self.stepping)
        self.stepping = None

    def _join_step(self) -> None:
        if self.stepping is not None:
            self.stepping.join()
            self.stepping = None

    def serve(self) -> None:
        self.role, self.schedule, self.holders = None, None, []
        self.rank_plan, self.ops = None, None
        self.stepping: threading.Thread | None = None
        self.lock = threading.Lock()   # the step thread's reply and clean-up against an abandonment
        self.step_token = 0            # the step running now; moves on when it answers or is abandoned
        self.abandoned: list[threading.Thread] = []
        while True:
            msg = self.conn.recv()
            cmd = msg["cmd"]
            try:
                if cmd == "generation":
                    self._join_step()
                    self.conn.send(self.generation(msg))
                elif cmd == "go":
                    self.go()
                elif cmd == "discard":
                    self.pending = None
                    self._shutdown()
                elif cmd == "step":
                    # in a thread, so that an `abort` can reach a rank blocked on a peer that
                    # itself gave up (gloo would only notice at its timeout)
                    self.received = time.perf_counter()
                    self.step_token += 1
                    self.stepping_token = self.step_token
                    self.stepping = threading.Thread(target=self._run_step, args=(msg, self.step_token), daemon=True)
                    self.stepping.start()
                elif cmd == "commit":
                    self._join_step()
                    if self.role is not None:
                        self.commit()
                    else:
                        self.steps_done += 1
                    if msg.get("checkpoint"):
                        self.conn.send({"event": "saved", "save_s": self.save_checkpoint(msg["checkpoint"])})
                elif cmd == "abort":
                    if self.stepping is not None and self.stepping.is_alive():
                        # gloo's abort is a no-op for collectives: a rank blocked on a live peer
                        # (itself blocked) would wait out step_timeout_s. Shutting the generation's
                        # peer sockets down fails every pending operation at once, here and at the
                        # peers (they read EOF), and the step thread replies `aborted`
                        sever_peer_sockets(self.store_port)
                        self.stepping.join(ABANDON_AFTER_S)
                        self._abandon_step()
                    self._join_step()
                    self._shutdown()
                elif cmd == "dump":
                    self.conn.send({"event": "state", "state": {n: {k: v.double().reshape(-1).tolist()
                                                                    for k, v in s.items()}
                                                                for n, s in self.state.items()}})
                elif cmd == "stop":
                    for thread in self.abandoned:
                        # gloo's threads must not outlive the interpreter (it would abort the
                        # process): an abandoned step ends at its groups' timeout
                        thread.join(self.job.step_timeout_s + 1.0)
                    self._shutdown()
                    return
            except Exception as error:
                if cmd == "generation":
                    self._shutdown()
                    self.conn.send({"event": "failed", "device": self.device, "error": _short(error)})
                else:
                    raise


def sever_peer_sockets(store_port: int) -> int:
    """Shut down (SHUT_RDWR) every connected TCP socket of this process except its connection to
    the job's store: the process groups' gloo pairs. Every operation pending on them fails at once
    (gloo reads EOF, as from a dead peer), here and at the other end, so a whole generation stops
    within milliseconds of the first rank that does this. The descriptors stay open (the groups
    own them and close them when destroyed). Returns how many sockets were shut down."""
    import socket

    severed = 0
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=fd)
        except OSError:
            continue
        try:
            if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
                peer = sock.getpeername()  # OSError for a listening socket
                if peer[1] != store_port:
                    sock.shutdown(socket.SHUT_RDWR)
                    severed += 1
        except OSError:
            pass
        finally:
            sock.detach()  # the fd stays its owner's
    return severed


def _pieces(stage: hf.Stage, name: str, local: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """A parameter's local shard as the checkpoint's keys and tensors. GPT-2's fused attention
    projection holds rows [q_r k_r v_r] on TP rank r (hf._linearise_gpt2: a layout per degree), so
    it is stored as its q, k and v parts (`...c_attn.weight.q`), each rank's part a row shard of
    the unfused projection: global tensors whose layout no TP degree changes. Others: as they are."""
    if stage.kind == "gpt2" and ".attn.c_attn." in name:
        return [(f"{name}.{part}", rows) for part, rows in zip("qkv", local.chunk(3, dim=0))]
    return [(name, local)]


def _named_params(stage: hf.Stage) -> list[tuple[str, torch.nn.Parameter]]:
    return list(stage.named_parameters())


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t._local_tensor if isinstance(t, DTensor) else t


def _short(error: BaseException) -> str:
    """The error's type and first non-empty line (gloo's start with a newline), and its cause's
    (torch pipelining wraps the communication error)."""
    parts = []
    while error is not None and len(parts) < 3:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        parts.append(f"{type(error).__name__}: {lines[0][:200] if lines else ''}")
        error = error.__cause__ or error.__context__
    return " <- ".join(parts)


WORKER_IMPORTS = ("chameleon_opt.runtime.pipelined", "torch.distributed.pipelining", "torch.distributed.tensor.parallel",
                  "transformers.modeling_utils")
"""What a worker imports, preloaded by the fork server (`cores.start_worker`)."""


def worker_main(device: int, job: JobSpec, store_port: int, conn: Connection, heartbeat_slots: Any = None) -> None:
    """Process entry: one compute thread per worker (they share the machine's cores), and from
    its first generation on a heartbeat into `heartbeat_slots[device]` when given."""
    torch.set_num_threads(1)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the controller's diagnosis of stragglers
    try:
        worker = Worker(device, job, store_port, conn, heartbeat_slots)
        gc.freeze()  # torch's and transformers' objects: no collection need ever walk them
        worker.serve()
    except (EOFError, KeyboardInterrupt):
        pass
    except Exception:
        conn.send({"event": "crashed", "device": device, "error": traceback.format_exc(limit=4)})
        raise


# ---- controller ---------------------------------------------------------------------------------

@dataclass
class Recovery:
    """One failure, from the kill (or hang) to the next committed step."""

    step: int
    dead: tuple[int, ...]
    restore: str                # migration, checkpoint or verify: what restored the state; none: rerouted
    detection_s: float = 0.0    # kill or hang -> every survivor stopped the step and reported
    planning_s: float = 0.0     # every decision (one more after each aborted transition)
    group_s: float = 0.0        # slowest rank forming the generation's groups
    build_s: float = 0.0        # slowest rank building and sharding its new stage
    restore_s: float = 0.0      # slowest rank migrating (or loading from the checkpoint)
    first_step_s: float = 0.0
    total_s: float = 0.0
    plan: Plan | None = None
    aborted_transitions: int = 0
    hung: tuple[int, ...] = ()  # devices the heartbeat watchdog found silent and killed
    reliefs: dict[int, str] = field(default_factory=dict)  # device -> the relief its new stage runs
    tensor_parallel: tuple[int, int] | None = None  # (from, to) when the plan changed the TP degree
    policy: str = ""            # the decision's: reroute, reconfigure or hybrid
    switched_before_step: int | None = None   # a hybrid: its reconfigured plan ran from this step on
    switch_s: float = 0.0       # a hybrid: its switch's transition (plan, groups, build, migration)
    schedule: str = ""          # what ran the plan: Schedule1F1B, or (rerouted) bubble-filled or 1F1B


@dataclass
class Rejoined:
    """Failed devices back before a step as fresh workers: the planner's decision (`plan_join`)
    and, when admitted, what their transition took, to the next committed step."""

    step: int
    devices: tuple[int, ...]
    policy: str                 # keep-running (they stay out), or scale-up
    reason: str
    restore: str = ""           # how the newcomers got their state: migration, checkpoint or verify
    planning_s: float = 0.0
    group_s: float = 0.0
    build_s: float = 0.0
    restore_s: float = 0.0
    first_step_s: float = 0.0
    total_s: float = 0.0        # the decision's start -> the next committed step
    plan: Plan | None = None
    aborted: bool = False       # a failure during its transition: the newcomers are out again


@dataclass
class PipelinedReport:
    losses: list[float]
    samples_exactly_once: list[bool]
    recoveries: list[Recovery]
    plans: list[Plan]
    step_times_s: list[float]
    checkpoint_save_s: list[float] = field(default_factory=list)
    dead: tuple[int, ...] = ()
    heartbeat_longest_s: float = 0.0   # longest silence of a live worker the watchdog saw
    reliefs: list[dict[int, str]] = field(default_factory=list)  # per plan: device -> relief its worker built
    rejoins: list[Rejoined] = field(default_factory=list)
    phases: list[dict[int, dict[str, dict[str, float]]]] = field(default_factory=list)
    # per committed step with `phase_timers`: device -> its phases (runtime/phases.py)


def generation_message(plan: Plan, live: list[int], instance: Instance, transfers: list[dict[str, Any]],
                       failed: frozenset[int] = frozenset(), rank_plans: Mapping[int, RankPlan] | None = None,
                       orders: Mapping[int, list[tuple[str, int]]] | None = None) -> dict[int, dict[str, Any]]:
    """Per live device: ranks, the groups every rank creates (same order everywhere) and its role.
    Ranks follow the plan pipeline by pipeline, stage by stage, TP innermost, so the t-th ranks of
    a pipeline's stages ascend with the stage (a group's ranks are sorted: stage s is group rank s).
    A role's relief is its stage's, the training's recomputation where the plan names none.

    A rerouted plan (`rank_plans`, the decision's lowering, and `orders`, each rank's operations)
    keeps the stages that lost a device (`failed`): they get no role (a live TP peer there idles
    and drops its shards, which would go stale) and hold no gradient; every other rank runs its
    rank plan in its order, exchanging activations over one group of every rank (`p2p_group`)
    instead of a per-pipeline torch schedule. The TP ranks of a slot run one order (its first
    rank's), so that their collectives meet."""
    order = [d for pipe in plan.pipelines for stage in pipe.stages for d in stage.devices if d in live]
    order += [d for d in live if d not in order]
    rank_of = {d: r for r, d in enumerate(order)}
    num_layers = instance.workload.num_layers
    lost = {d for pipe in plan.pipelines for stage in pipe.stages if failed.intersection(stage.devices)
            for d in stage.devices}
    holders: dict[tuple[str, int], set[int]] = {}
    for pipe in plan.pipelines:
        for stage in pipe.stages:
            if lost.intersection(stage.devices):
                continue
            for t, d in enumerate(stage.devices):
                for layer in range(stage.first, stage.end):
                    holders.setdefault((str(layer), t), set()).add(rank_of[d])
                    if layer in (0, num_layers - 1):
                        holders.setdefault(("tied", t), set()).add(rank_of[d])
    groups: set[tuple[int, ...]] = {tuple(sorted(h)) for h in holders.values()}
    roles: dict[int, dict[str, Any]] = {}
    offset = 0
    mbs = instance.micro_batch_size
    recompute = instance.spec.training.recompute
    rerouted = rank_plans is not None
    if rerouted:
        groups.add(tuple(range(len(order))))
    for pipe in plan.pipelines:
        if not rerouted:
            for t in range(plan.tensor_parallel):
                groups.add(tuple(rank_of[stage.devices[t]] for stage in pipe.stages))
        for s, stage in enumerate(pipe.stages):
            if lost.intersection(stage.devices):
                continue
            tp_group = [rank_of[d] for d in stage.devices]
            groups.add(tuple(tp_group))
            for t, d in enumerate(stage.devices):
                roles[d] = {"layers": [stage.first, stage.end], "stage": s, "num_stages": len(pipe.stages),
                            "tp_rank": t, "tp_group": tp_group, "micro_batches": pipe.micro_batches,
                            "relief": stage.relief if stage.relief is not None else recompute,
                            "sample_offset": offset * mbs,
                            "pp_group": None if rerouted else [rank_of[st.devices[t]] for st in pipe.stages],
                            "grad_groups": {key: sorted(h) for (key, tt), h in holders.items() if tt == t}}
        offset += pipe.micro_batches
    ordered = sorted(groups, key=lambda g: (len(g), g))
    out = {d: {"rank_of": rank_of, "groups": [list(g) for g in ordered], "role": roles.get(d),
               "transfers": transfers} for d in live}
    if rank_plans is not None and orders is not None:
        first_of = {d: stage.devices[0] for pipe in plan.pipelines for stage in pipe.stages for d in stage.devices}
        for d in roles:
            out[d].update(rank_plan=rank_plans[d], ops=list(orders.get(first_of[d], [])),
                          p2p_group=list(range(len(order))))
    return out


def _check_same_layers(plan: Plan) -> None:
    """A host runs a rerouted piece on its own stage: the planner reroutes only between stages of
    the same layers (solve/reroute.py), said here since the workers build no other."""
    for r in plan.rerouted:
        lost, host = plan.pipelines[r.from_pipeline].stages[r.stage], plan.pipelines[r.to_pipeline].stages[r.stage]
        if (lost.first, lost.end) != (host.first, host.end):
            raise ValueError(f"pipeline {r.from_pipeline} stage {r.stage} (layers {lost.first}-{lost.end - 1}) is "
                             f"rerouted to a stage of other layers ({host.first}-{host.end - 1})")


def ran_reliefs(replies: Mapping[int, dict[str, Any]]) -> dict[int, str]:
    """Device -> the relief its worker built for the generation (devices without a stage left out)."""
    return {d: r["relief"] for d, r in sorted(replies.items()) if r.get("relief") is not None}


def as_failures(kills: Mapping[int, tuple[int, int]] | Sequence[Any] | None) -> list[Any]:
    """`kills` as `controller.Failure`s: a mapping step -> (device, forwards) is read as one
    SIGKILL of that device after its stage's n-th forward in that step."""
    from chameleon_opt.runtime.controller import Failure

    if kills is None:
        return []
    if isinstance(kills, Mapping):
        return [Failure(step, (device,), after_ops=forwards) for step, (device, forwards) in kills.items()]
    return list(kills)


class PipelinedController:
    """Runs `steps` global batches of an HF model on the instance's plan, killing (or stopping)
    workers in given steps or transitions and recovering as the planner decides under `policy`
    (reconfigure, the default: planned migration or a checkpoint re-shard; reroute; auto: Eq. 8
    among both and the hybrid). `bubble_filling` (on by default) lets a rerouting be placed into
    the peers' idle time, run as the plan's action lists with the backward split. `tp_degrees`: TP degrees a recovery may move to (PlanningOptions'); a
    change is restored from the checkpoint of the last committed step whatever `restore` says, so
    it needs `checkpoint_dir` (a checkpoint is then saved after every step: the measured
    `checkpoint_save_s`), and none is planned before the first step has committed. `phase_timers`:
    every committed step's phases per device in `PipelinedReport.phases` (runtime/phases.py)."""

    def __init__(self, instance: Instance, hf_config: str | Path, *, seed: int = 0, dtype: str = "float64",
                 restore: str = "migration", checkpoint_dir: str | Path | None = None,
                 time_limit_s: float = 5.0, group_timeout_s: float = 30.0, step_timeout_s: float = 2.0,
                 silent_s: float = SILENT_S, cores: Sequence[int] | None = None,
                 tp_degrees: Sequence[int] = (), policy: str = "reconfigure", bubble_filling: bool = True,
                 phase_timers: bool = False) -> None:
        if restore not in ("migration", "checkpoint", "verify"):
            raise ValueError(f"restore must be migration, checkpoint or verify, not {restore!r}")
        if restore != "migration" and checkpoint_dir is None:
            raise ValueError("a checkpoint restore needs checkpoint_dir")
        if tp_degrees and checkpoint_dir is None:
            raise ValueError("a TP change is restored from the checkpoint: tp_degrees needs checkpoint_dir")
        refuse_unexecuted(instance, relief=True, early_stop=hf.checkpoint_early_stops(hf.load_config(hf_config)))
        for stage in (st for pipe in instance.plan.pipelines for st in pipe.stages if st.relief is not None):
            parse_relief(stage.relief)  # one the workers can execute, said before any starts
        self.instance, self.restore = instance, restore
        arch = instance.workload.architecture
        assert arch is not None
        self.job = JobSpec(str(hf_config), seed, instance.spec.training.global_batch, instance.micro_batch_size,
                           instance.spec.training.sequence_length or arch.seq_len, instance.plan.tensor_parallel,
                           dtype, group_timeout_s, step_timeout_s, None if checkpoint_dir is None else str(checkpoint_dir),
                           phase_timers)
        # other TP degrees only when allowed (restored from the checkpoint)
        self.options = PlanningOptions(policy, time_limit_s, bubble_filling=bubble_filling,
                                       tp_degrees=tuple(tp_degrees))
        self.silent_s = silent_s
        self.cores = cores                   # cores[device]: its own core (runtime/cores.py)
        self.plan = instance.plan            # the layout the state is in
        self.running = instance.plan         # the plan running now: the layout and its rerouting
        self.schedule = "Schedule1F1B"       # what runs it (`_generation`)
        self.rank_plans: Mapping[int, RankPlan] | None = None   # its lowering, when rerouted
        # a hybrid's reconfiguration waiting for the next committed step: (decision, the layout it
        # planned from, its recovery)
        self.pending_switch: tuple[Any, Plan, Recovery] | None = None
        self.layouts: list[Plan] = [self.plan]
        self.failed: frozenset[int] = frozenset()
        self.checkpoint: str | None = None
        self.kill_time: float | None = None
        self.hung: set[int] = set()
        self.generations = 0
        self.pending_transition_kills: list[Any] = []

    def _spawn(self) -> None:
        self.store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=self.job.group_timeout_s),
                                   wait_for_workers=False)
        self.procs: dict[int, Any] = {}
        self.conns: dict[int, Connection] = {}
        self.heartbeats = Heartbeats(self.instance.num_devices, self.silent_s)
        for d in sorted(self.plan.devices):
            self._start_worker(d)

    def _start_worker(self, device: int) -> None:
        """One worker process holding no state (its first generation gives it its stage and state);
        a device back reuses its heartbeat slot, cleared so that its start-up is not watched."""
        self.heartbeats.reset(device)
        self.procs[device], self.conns[device] = start_worker(
            worker_main, (device, self.job, self.store.port), self.heartbeats.slots,
            None if self.cores is None else self.cores[device], preload=WORKER_IMPORTS)

    def _collect(self, expect: set[int], abort_on_death: bool = False) -> tuple[dict[int, dict[str, Any]], set[int]]:
        """Replies of `expect` and the devices that died meanwhile (a hung one is killed by the
        heartbeat watchdog and counts as dead); with `abort_on_death` every live worker is told
        at the first death, so none waits on a peer that gave up."""

        def told(_: int, first: bool) -> None:
            if abort_on_death and first:
                for other in sorted(self.procs):
                    self._send(other, {"cmd": "abort"})

        def straggling(devices: list[int]) -> None:
            print(f"devices {devices} have not answered {STRAGGLER_S:g} s after a death: their stacks follow",
                  file=sys.stderr, flush=True)
            for d in devices:
                if d in self.procs:
                    os.kill(self.procs[d].pid, signal.SIGUSR1)   # faulthandler: every thread's stack on stderr

        got = collect_replies(self.conns, self.procs, expect, timeout_s=max(120.0, 4 * self.job.group_timeout_s),
                              on_death=told, heartbeats=self.heartbeats,  # the timeout is generous: start-up is slow
                              straggler_s=STRAGGLER_S, on_straggler=straggling)
        self.hung |= set(got.hung)
        if got.kill_time is not None:
            self.kill_time = self.kill_time or got.kill_time
        elif got.hung:  # a hang nobody injected: it started at the last beat
            self.kill_time = self.kill_time or min(got.hung.values())
        return got.replies, got.dead

    def _send(self, d: int, msg: dict[str, Any]) -> None:
        try:
            self.conns[d].send(msg)
        except (BrokenPipeError, OSError, KeyError):
            pass

    def _generation(self, plan: Plan, migration: Any, restore: str, step: int, transition: bool = True,
                    rank_plans: Mapping[int, RankPlan] | None = None) -> tuple[dict[int, dict[str, Any]], set[int]]:
        """Start `plan`: groups, stages, state. Every rank ready: `go`, and the plan (its rerouting
        stripped, as the tiny runtime keeps it) is the layout the state is in. A rerouted plan
        runs its lowering `rank_plans` in the order it fixes (`planned_operations`: a bubble-filled
        rerouting's action lists) or else in the runtime's 1F1B list order (`order_operations`);
        any other plan runs torch's `Schedule1F1B` per pipeline. A death meanwhile: the survivors
        `discard` the transition (their old state stands) and the devices that died are returned.
        A kill injected `in_transition` at or before `step` strikes here (not in the job's start)."""
        live = sorted(self.procs)
        victims: set[int] = set()
        if transition:
            victims = {d for f in self.pending_transition_kills if f.step <= step for d in f.devices}
            self.pending_transition_kills = [f for f in self.pending_transition_kills if f.step > step]
        orders = None
        schedule = "Schedule1F1B"
        if plan.rerouted:
            if rank_plans is None:
                raise ValueError("a rerouted plan runs its lowering: give its rank_plans")
            _check_same_layers(plan)
            orders = planned_operations(rank_plans)
            schedule = "1F1B" if orders is None else "bubble-filled"
            if orders is None:
                orders = order_operations(rank_plans, self.job.micro_batch_size)
        messages = generation_message(plan, live, self.instance,
                                      [dataclasses.asdict(share) for share in state_shares(migration)],
                                      self.failed, rank_plans if plan.rerouted else None, orders)
        name = self.generations   # every attempt a new name: an aborted one's store keys are not reused
        self.generations += 1
        assert len(messages[live[0]]["groups"]) < GROUP_NAMES_PER_GENERATION - 1
        for d in live:
            self._send(d, {"cmd": "generation", "name": name, "generation": name, "restore": restore,
                           "checkpoint": self.checkpoint, "die_in_transition": d in victims, "steps_done": step,
                           "group_base": GROUP_NAMES_PER_GENERATION * name, **messages[d]})
        replies, dead = self._collect(set(live))
        bad = {d: r for d, r in replies.items() if r["event"] != "ready"}
        if dead and transition:
            for d in sorted(self.procs):
                self._send(d, {"cmd": "discard"})
            return replies, dead
        if dead or bad:
            raise RuntimeError(f"transition failed: dead {sorted(dead)}, "
                               + "; ".join(f"{d}: {r.get('error')}" for d, r in bad.items()))
        for d in live:
            self._send(d, {"cmd": "go"})
        self.running, self.schedule, self.rank_plans = plan, schedule, rank_plans
        self.plan = dataclasses.replace(plan, rerouted=())
        self.layouts.append(self.plan)
        return replies, set()

    def run(self, steps: int, kills: Mapping[int, tuple[int, int]] | Sequence[Any] | None = None,
            rejoins: Sequence[Any] = ()) -> PipelinedReport:
        """`kills`: `controller.Failure`s (in a step: the victim dies, or hangs with `hang`, after
        its stage's `after_ops`-th forward, 1 if None; or `in_transition`), or a mapping step ->
        (device, forwards): that device dies after its stage's n-th forward in that step.
        `rejoins`: `controller.Rejoin`s, failed devices back before a step (`_rejoin`)."""
        failures = as_failures(kills)
        self.pending_transition_kills = [f for f in failures if f.in_transition]
        in_step = [f for f in failures if not f.in_transition]
        self._spawn()
        report = PipelinedReport([], [], [], [self.plan], [])
        pending: list[tuple[Recovery | Rejoined, float]] = []   # each timed from its start to the next commit
        try:
            replies, _ = self._generation(self.plan, None, "initial", 0, transition=False)
            report.reliefs.append(ran_reliefs(replies))
            step = 0
            rejoined_at = -1   # the last step whose rejoins were run (a step redone after a kill runs none)
            while step < steps:
                if rejoined_at < step:
                    rejoined_at = step
                    for back in [r for r in rejoins if r.step == step]:
                        pending += self._rejoin(step, tuple(back.devices), report)
                victims: dict[int, tuple[int, bool]] = {}
                for f in [f for f in in_step if f.step == step]:
                    in_step.remove(f)
                    for d in f.devices:
                        if d in self.procs:   # a kill of a device already dead is no failure
                            victims[d] = (f.after_ops or 1, f.hang)
                t0 = time.perf_counter()
                for d in sorted(self.procs):
                    forwards, hang = victims.get(d, (None, False))
                    self._send(d, {"cmd": "step", "step": step, "die_after_forwards": forwards, "hang": hang})
                replies, dead = self._collect(set(self.procs), abort_on_death=True)
                if dead or any(r["event"] != "ready" for r in replies.values()):
                    if not dead:
                        raise RuntimeError(f"step {step} failed without a dead worker: "
                                           + "; ".join(f"{d}: {r.get('error')}" for d, r in replies.items()))
                    for d in sorted(self.procs):
                        self._send(d, {"cmd": "abort"})
                    kill_at, self.kill_time = self.kill_time or time.perf_counter(), None
                    recovery = self._recover(step, tuple(sorted(dead)), kill_at)
                    report.recoveries.append(recovery)
                    report.plans.append(self.running)
                    report.reliefs.append(recovery.reliefs)
                    pending.append((recovery, kill_at))
                    continue
                folder = None
                if self.job.checkpoint_dir is not None:
                    folder = str(Path(self.job.checkpoint_dir) / f"step{step}")
                for d in sorted(self.procs):
                    self._send(d, {"cmd": "commit", "checkpoint": folder})
                elapsed = time.perf_counter() - t0
                for opened, started in pending:
                    opened.first_step_s = elapsed
                    opened.total_s = time.perf_counter() - started
                pending = []
                if folder is not None:
                    saved, _ = self._collect(set(self.procs))
                    report.checkpoint_save_s.append(max(r["save_s"] for r in saved.values()))
                    self.checkpoint = folder
                loss, exactly_once = step_loss(replies, self.job.global_batch)
                report.samples_exactly_once.append(exactly_once)
                report.losses.append(loss)
                report.step_times_s.append(elapsed)
                if self.job.phase_timers:
                    report.phases.append({d: r["phases"] for d, r in replies.items() if "phases" in r})
                step += 1
                if self.pending_switch is not None and step < steps:
                    pending += self._switch(step, report)
        finally:
            self._stop()
        report.dead = tuple(sorted(self.failed))
        report.heartbeat_longest_s = self.heartbeats.longest_s
        return report

    def _stale(self) -> frozenset[int]:
        """Live devices of a stage that lost a device, idle while the running plan reroutes its
        work: they dropped their shards (stale once a step commits without them), so the planner
        counts them out like failed devices until the layout no longer lists them (then they are
        spares); never failed themselves (`self.failed`, `dead`)."""
        if not self.running.rerouted:
            return frozenset()
        return frozenset(d for pipe in self.plan.pipelines for stage in pipe.stages
                         if self.failed.intersection(stage.devices) for d in stage.devices) - self.failed

    def _recover(self, step: int, dead: tuple[int, ...], kill_at: float) -> Recovery:
        """Plan from the layout the state is in with every device failed so far and start the
        plan; a death during that transition aborts it and plans again (one recovery). A hybrid
        starts its interim rerouting, and its reconfigured plan waits for the next committed step
        (`_switch`); a switch still pending was planned before this failure and is dropped."""
        now = time.perf_counter()
        recovery = Recovery(step, dead, self.restore, detection_s=now - kill_at)
        self.pending_switch = None
        stale = self._stale()
        new = set(dead)
        while True:
            self.failed = self.failed | frozenset(new)
            recovery.dead = tuple(sorted(set(recovery.dead) | new))
            t0 = time.perf_counter()
            out = self.failed | stale
            state = dataclasses.replace(self.instance, plan=self.plan, failed_devices=out)
            # no checkpoint yet (the first step has not committed): nothing to re-shard from
            options = self.options if self.checkpoint is not None else dataclasses.replace(self.options, tp_degrees=())
            try:
                decision = plan_recovery(state, out, options)
            except UnrecoverableError as error:
                raise with_stale_copies(error, self.layouts, state, out) from None
            recovery.planning_s += time.perf_counter() - t0
            recovery.policy = decision.policy
            now_run = decision.interim or decision   # a hybrid reroutes first
            planned_from = self.plan
            changed = now_run.plan.tensor_parallel != self.plan.tensor_parallel
            recovery.restore = "checkpoint" if changed else self.restore
            recovery.tensor_parallel = (self.plan.tensor_parallel, now_run.plan.tensor_parallel) if changed else None
            if now_run.policy == "reroute":
                recovery.restore = "none"   # every rank keeps its layers: nothing moves or loads
            replies, new = self._generation(now_run.plan, now_run.migration,
                                            "migration" if recovery.restore == "none" else recovery.restore, step,
                                            rank_plans=now_run.rank_plans)
            if not new:
                break
            recovery.aborted_transitions += 1
            self.kill_time = None   # the recovery's clock runs from its first kill
        recovery.group_s = max(r["group_s"] for r in replies.values())
        recovery.build_s = max(r["build_s"] for r in replies.values())
        recovery.restore_s = max(r["restore_s"] for r in replies.values())
        recovery.plan = now_run.plan
        recovery.schedule = self.schedule
        recovery.hung = tuple(sorted(self.hung & set(recovery.dead)))
        recovery.reliefs = ran_reliefs(replies)
        if decision.interim is not None:
            self.pending_switch = (decision, planned_from, recovery)
        return recovery

    def _switch(self, step: int, report: PipelinedReport) -> list[tuple[Recovery | Rejoined, float]]:
        """A hybrid's second half, before `step`: its reconfigured plan, migrated from the layout
        the state is in (the interim rerouting may have idled devices, so the transfers are
        scheduled again when that layout is not the one the decision planned from), or restored
        from the checkpoint when the TP degree changes. A failure in this transition is recovered
        from as any other (the interim's state stands). Returns what opened, for the next commit
        to time."""
        assert self.pending_switch is not None
        (decision, planned_from, recovery), self.pending_switch = self.pending_switch, None
        started = time.perf_counter()
        migration = decision.migration
        stale = self._stale()
        out = self.failed | stale
        state = dataclasses.replace(self.instance, plan=self.plan, failed_devices=out)
        if stale & set(decision.plan.devices):
            # the plan counts on a device the interim idled: reconfigure again from the layout now
            decision = plan_recovery(state, out, dataclasses.replace(self.options, policy="reconfigure"))
            migration = decision.migration
            planned_from = self.plan
        changed = decision.plan.tensor_parallel != self.plan.tensor_parallel
        if not changed and self.plan != planned_from:
            migration, _, _ = communication_plan(state, self.plan, decision.plan, out,
                                                 Deadline.after(max(self.options.time_limit_s / 2, 1.0)), assign=False,
                                                 model=PerfModel(state))
        replies, dead = self._generation(decision.plan, migration, "checkpoint" if changed else self.restore, step)
        if not dead:
            recovery.switched_before_step = step
            recovery.switch_s = time.perf_counter() - started
            report.plans.append(self.running)
            report.reliefs.append(ran_reliefs(replies))
            return []
        kill_at, self.kill_time = self.kill_time or time.perf_counter(), None
        failed = self._recover(step, tuple(sorted(dead)), kill_at)
        failed.aborted_transitions += 1
        report.recoveries.append(failed)
        report.plans.append(self.running)
        report.reliefs.append(failed.reliefs)
        return [(failed, kill_at)]

    def _rejoin(self, step: int, devices: tuple[int, ...], report: PipelinedReport
                ) -> list[tuple[Recovery | Rejoined, float]]:
        """Failed `devices` are back before `step`, as fresh processes holding no state: the planner
        decides their return from the layout the state is in and the plan running now
        (`rejoin.plan_join`: keep running without them, take back rerouted slots, or scale up).
        Unless they stay out, their workers start and the next generation gives them their state by
        the planned transfers (a checkpoint re-shard with `restore` checkpoint, or when the plan's
        TP degree differs). A failure during that transition stops the newcomers (they are out
        again) and is recovered from as any other. A hybrid's switch still pending is dropped: this
        decision replaces it. Returns what opened, each with its start, for the next commit to time."""
        joined = frozenset(devices) & self.failed
        if not joined:
            return []
        self.pending_switch = None   # a hybrid's switch still pending: this decision replaces it
        started = time.perf_counter()
        stale = self._stale()
        state = dataclasses.replace(self.instance, plan=self.plan, failed_devices=self.failed | stale)
        decision = plan_join(state, self.running, self.failed | stale, joined, self.options)
        rejoined = Rejoined(step, tuple(sorted(joined)), decision.policy, decision.reason,
                            planning_s=time.perf_counter() - started)
        report.rejoins.append(rejoined)
        if decision.policy == "keep-running":
            return []   # they stay out (failed) until a later rejoin
        for d in sorted(joined):
            self._start_worker(d)
        failed_before, self.failed = self.failed, decision.failed - stale
        changed = decision.plan.tensor_parallel != self.plan.tensor_parallel
        rejoined.restore = "checkpoint" if changed else self.restore
        replies, dead = self._generation(decision.plan, decision.migration, rejoined.restore, step,
                                         rank_plans=decision.rank_plans)
        if not dead:
            rejoined.group_s = max(r["group_s"] for r in replies.values())
            rejoined.build_s = max(r["build_s"] for r in replies.values())
            rejoined.restore_s = max(r["restore_s"] for r in replies.values())
            rejoined.plan = decision.plan
            report.plans.append(decision.plan)
            report.reliefs.append(ran_reliefs(replies))
            return [(rejoined, started)]
        rejoined.aborted = True
        self._drop(joined)
        self.failed = failed_before
        kill_at, self.kill_time = self.kill_time or time.perf_counter(), None
        lost = tuple(sorted(dead - joined))
        if not lost:
            # only newcomers died: the survivors kept their state; the layout's groups are formed again
            _, dead = self._generation(self.running, None, "migration", step, rank_plans=self.rank_plans)
            lost = tuple(sorted(dead))
            if not lost:
                return []
        recovery = self._recover(step, lost, kill_at)
        recovery.aborted_transitions += 1
        report.recoveries.append(recovery)
        report.plans.append(self.running)
        report.reliefs.append(recovery.reliefs)
        return [(recovery, kill_at)]

    def _drop(self, devices: frozenset[int]) -> None:
        """Stop the workers of `devices` still alive (newcomers that never got their state)."""
        for d in sorted(devices & set(self.procs)):
            self._send(d, {"cmd": "stop"})
            proc = self.procs.pop(d)
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
            self.conns.pop(d).close()

    def _stop(self) -> None:
        for d in list(self.procs):
            self._send(d, {"cmd": "stop"})
        for proc in self.procs.values():
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
        self.procs.clear()


def runtime_instance(hf_config: str | Path, pipeline_parallel: int, data_parallel: int, tensor_parallel: int,
                     global_batch: int = 8, micro_batch_size: int = 1, sequence_length: int = 16,
                     reliefs: Sequence[str] | None = None, memory_gib: float = 4.0, reserved_gib: float = 0.1,
                     measured: WorkloadSpec | None = None, network: Mapping[str, float] | None = None,
                     recompute: str | None = None, mtbf_hours: float | None = None,
                     stage_scaling: Sequence[tuple[float, float]] = ()) -> Instance:
    """An instance of CPU worker processes (one per device) training an HF config's model with a
    regular layout, for the runtime's tests and the demo. `reliefs` (`training.reliefs`: none,
    selective, full, offload, opt-offload) are those the planner may give a stage; a small
    `memory_gib` and `reserved_gib` per device (a tiny model's stage needs about 2 MiB) make memory
    tight enough to need them; `recompute` is the training's own recomputation (every stage whose
    plan names no relief runs it); full recomputation is priced with the early stop exactly when the
    config's checkpointed blocks stop early under this torch (`hf.checkpoint_early_stops`). With `measured` (a WorkloadSpec from `profile.hf_workload_spec`)
    and the measured loopback `network`, the device type and times are this machine's one core
    per process, so the model's predicted steps can be held against the runtime's
    (bench/runtime_steps_hf.py); without, a nominal CPU core. `mtbf_hours` (per device) gives the
    planner's policy auto a time to the next fault to weigh (Eq. 8): without, it compares steady
    throughputs only, where a hybrid never beats reconfiguring. `stage_scaling`: the measured device
    type's (stage bytes, factor) points (`profile.stage_compute_ratio`), with `measured` only."""
    from chameleon_opt.instance.load import build_instance
    from chameleon_opt.workload.hf import workload_from_hf

    devices = pipeline_parallel * data_parallel * tensor_parallel
    device_type: Any = {"name": "cpu-core", "memory_gib": memory_gib, "peak_tflops": 0.05, "reserved_gib": reserved_gib}
    if measured is not None:
        from chameleon_opt.runtime.profile import cpu_device_type

        device_type = cpu_device_type(measured, devices)
        if stage_scaling:
            device_type["stage_scaling"] = [list(point) for point in stage_scaling]
        workload = measured.model_dump(mode="json", exclude_none=True)
    else:
        workload = workload_from_hf(Path(hf_config))
    links = dict(network) if network is not None else {"intra_node_gbps": 2, "inter_node_gbps": 1,
                                                       "intra_node_latency_us": 50}
    return build_instance({
        "format": 1, "name": f"{Path(hf_config).parent.name}-cpu-{devices}",
        "cluster": {"nodes": 1, "devices_per_node": devices, "device_type": device_type, "network": links},
        "workload": {"inline": workload},
        "training": {"global_batch": global_batch, "micro_batch_size": micro_batch_size,
                     "sequence_length": sequence_length, "precision": "fp32",
                     # priced as the workers' checkpoint reruns a block (hf.checkpoint_early_stops)
                     "recompute_early_stop": hf.checkpoint_early_stops(hf.load_config(hf_config)),
                     **({"reliefs": list(reliefs)} if reliefs is not None else {}),
                     **({"recomputation": recompute} if recompute is not None else {})},
        **({"failures": {"mtbf_hours_per_device": mtbf_hours}} if mtbf_hours is not None else {}),
        "plan": {"tensor_parallel": tensor_parallel,
                 "layout": {"pipeline_parallel": pipeline_parallel, "data_parallel": data_parallel}}})


def reference_losses(instance: Instance, hf_config: str | Path, steps: int, seed: int = 0,
                     dtype: str = "float64") -> list[float]:
    """Failure-free training of the whole model in this process (torch's AdamW, the same data and
    loss weighting): what every plan must reproduce step by step."""
    config = hf.load_config(hf_config)
    model = hf.build_model(config, seed, getattr(torch, dtype), 1)
    stage = hf.Stage(model, config, 0, instance.workload.num_layers)
    params = dict(stage.named_parameters())
    optimizer = torch.optim.AdamW(list(params.values()), lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY, foreach=False)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    batch = instance.spec.training.global_batch
    seq = instance.spec.training.sequence_length or instance.workload.architecture.seq_len
    losses = []
    for step in range(steps):
        tokens = hf.batch_tokens(config.vocab_size, seq, seed, step, batch)
        per_sample = hf.sample_losses(stage(tokens[:, :-1]), tokens[:, 1:])
        (per_sample.sum() / batch).backward()
        if tied:  # one weight in the model: both copies take the summed gradient
            total = params["embed.weight"].grad + params["head.weight"].grad
            params["embed.weight"].grad, params["head.weight"].grad = total, total.clone()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(per_sample.detach().mean()))
    return losses
