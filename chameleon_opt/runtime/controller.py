"""The controller: spawns one worker per device, drives steps, injects failures, recovers.

Recovery follows the method end to end: a worker dies (SIGKILL); its peers fail their next
communication within milliseconds and stop (the controller also sees the process exit); the
controller asks the planner (`planning.plan_recovery`, policy auto by default) for a decision on
the plan the surviving state is laid out in; lowers the chosen plan (`comm.lowering`), orders
each rank's work (`runtime.schedule`) and starts a new generation: fresh process groups, state
migrated by the transfer schedule, and the interrupted step redone whole. A failure during the
transition aborts it (survivors keep their old state until every rank is ready) and the controller
plans again from the same layout with one more device gone.

The layout the controller plans from is always the one the surviving state is in: after a
rerouting it is the rerouted plan (a pipeline left without micro-batches is dropped, and its
devices drop their layers), so a later failure never counts on a device that stopped training.
A hybrid's switch is scheduled from the layout at the switch, not at the decision.

A failed device can come back (`Rejoin`) as a fresh worker process with no state: the planner
decides its return (`rejoin.plan_join`) and the next generation admits it and gives it its state
by the planned transfers, the same migration a reconfiguration runs.

The planner prices what the workers run. A bubble-filled rerouting (bubble filling is on by
default) is priced at a schedule (solve/bubbles.py) whose per-device orders reach each rank as its
action list (`RankPlan.actions`): the workers run exactly those orders, with the backward split
into B (input gradient) and W (weight gradient, deferred into the bubbles), and the micro-batches
of a lost stage go to the peers the schedule placed them on. Every other plan (a reconfiguration,
a rerouting priced by its serial shares, Eq. 12/13) runs each rank's order from `runtime.schedule`
(a 1F1B list schedule, full backward). Each `Generation` records which one it ran. The schedule
model is solved inside the decision's deadline (`time_limit_s`), and `Recovery.planning_s`
includes it: 10-30 ms where CP-SAT proves its order optimal (runtime-cpu-4 losing device 1).
Where it cannot, it once took the rerouting's whole share (losing device 2: 4.5 s of the 5 s
limit under policy reroute, 1.4 s under auto, for a 9% faster step); now it gets at most half
of what is left and stops 0.25 s after its incumbent last improved (`bubbles.BUBBLE_STALL`),
falling back on the better of the serial and the greedy list schedule (kill campaign seeds
1-2 x 5: worst recovery 4.81 -> 1.30 s, planning 4.52 -> 0.99 s). Pass
`bubble_filling=False` to price every rerouting by its serial shares.

Every committed step is checked: every sample of the global batch got exactly one loss.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import time
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import torch.distributed as dist

from chameleon_opt.comm import communication_plan
from chameleon_opt.comm.allreduce import schedule_allreduce
from chameleon_opt.comm.lowering import LoweredPlan, RankPlan, absent_rank_plan
from chameleon_opt.comm.transfers import Migration
from chameleon_opt.errors import InputError, UnrecoverableError
from chameleon_opt.instance.load import Instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.plan import Plan
from chameleon_opt.planning import PlanningOptions, RecoveryDecision, plan_recovery
from chameleon_opt.decision import with_stale_copies
from chameleon_opt.rejoin import plan_join
from chameleon_opt.runtime.cores import start_worker
from chameleon_opt.runtime.executable import refuse_unexecuted
from chameleon_opt.runtime.gpt import GPTConfig
from chameleon_opt.runtime.replies import SILENT_S, Heartbeats, collect_replies, step_loss
from chameleon_opt.runtime.schedule import order_operations, planned_operations
from chameleon_opt.runtime.worker import WorkerSpec, worker_main
from chameleon_opt.solve.deadline import Deadline

WORKER_IMPORTS = ("chameleon_opt.runtime.worker",)
"""What a worker imports, preloaded by the fork server (`cores.start_worker`)."""


@dataclass(frozen=True)
class Failure:
    """A failure to inject: `devices` die during global batch `step`.

    `after_ops`: the victim SIGKILLs itself after that many of its operations of the step (exact,
    for tests); None: the controller SIGKILLs it `delay_s` after dispatching the step.
    `in_transition`: instead, the victim dies inside the first transition (a recovery, or a
    hybrid's switch) that starts at or after `step`, after forming the new groups and before
    migrating; the job's start is not a transition. Several failures may share a step.
    `hang`: the victim stops (SIGSTOP) instead of dying: alive and silent, it is found by the
    heartbeat watchdog (`replies.Heartbeats`), SIGKILLed, and recovered from as a dead one."""

    step: int
    devices: tuple[int, ...]
    after_ops: int | None = None
    delay_s: float = 0.0
    in_transition: bool = False
    hang: bool = False


@dataclass(frozen=True)
class Rejoin:
    """Failed `devices` come back before global batch `step` as fresh worker processes holding no
    state: the planner decides their return (`rejoin.plan_join`: keep running without them, take
    back their rerouted slots, or scale up) and the next generation gives them their state by the
    planned transfers, as a reconfiguration's migration does."""

    step: int
    devices: tuple[int, ...]


@dataclass
class Recovery:
    """One failure and what it took to get back to a completed step."""

    step: int
    dead: tuple[int, ...]
    policy: str = ""
    reason: str = ""
    predicted_step_s: float = math.nan
    detection_s: float = 0.0    # kill (or hang) -> every survivor stopped the step and reported
    planning_s: float = 0.0     # decision + communication schedule + lowering + ordering
    group_s: float = 0.0        # slowest rank forming the new process groups
    migration_s: float = 0.0    # slowest rank finishing its migration rounds
    first_step_s: float = 0.0   # the redone step
    total_s: float = 0.0        # kill -> first completed step after it
    aborted_transitions: int = 0
    hung: tuple[int, ...] = ()  # devices the heartbeat watchdog found silent and killed


@dataclass
class Generation:
    index: int
    policy: str
    plan: Plan
    predicted_step_s: float
    first_step: int
    schedule: str = "1F1B"   # "bubble-filled": the plan's action lists, split backward; else the runtime's 1F1B list
    step_times_s: list[float] = field(default_factory=list)


@dataclass
class RunReport:
    losses: list[float]
    step_times_s: list[float]
    recoveries: list[Recovery]
    generations: list[Generation]
    events: list[tuple[float, str, str]]        # (seconds since start, kind, detail)
    samples_exactly_once: list[bool]
    final_layers: dict[int, dict[str, list[float]]]
    replica_max_diff: float                     # largest difference between replicas of a layer
    dead: tuple[int, ...]
    heartbeat_longest_s: float = 0.0            # longest silence of a live worker the watchdog saw


def runtime_model(instance: Instance) -> GPTConfig:
    """The runtime's GPT for an instance whose workload has a plain GPT architecture."""
    arch = instance.workload.architecture
    file = instance.path
    if arch is None:
        raise InputError(file, "workload.architecture", "the runtime trains a GPT and needs its architecture",
                         "give an architecture in the workload")
    if arch.ffn != 4 * arch.hidden or arch.gated_mlp or arch.tied_embeddings or not arch.learned_positions \
            or arch.kv_heads not in (None, arch.heads):
        raise InputError(file, "workload.architecture", "the runtime's GPT has ffn = 4 x hidden, no gated MLP, "
                         "untied embeddings, learned positions and no GQA", "change the workload to match")
    if instance.plan.tensor_parallel != 1:
        raise InputError(file, "plan.tensor_parallel", "the runtime runs TP 1 only", "set it to 1")
    refuse_unexecuted(instance, relief=False)
    return GPTConfig(layers=arch.layers, hidden=arch.hidden, heads=arch.heads, vocab=arch.vocab, seq_len=arch.seq_len)


class Controller:
    """Runs one training job of `steps` global batches with the failures given."""

    def __init__(self, instance: Instance, *, policy: str = "auto", seed: int = 0, dtype: str = "float32",
                 time_limit_s: float = 5.0, group_timeout_s: float = 30.0,
                 progress: Callable[[str], None] | None = None, bubble_filling: bool = True,
                 silent_s: float = SILENT_S, cores: Sequence[int] | None = None) -> None:
        self.instance, self.policy, self.seed, self.dtype = instance, policy, seed, dtype
        self.cores = cores   # cores[device]: its own core (runtime/cores.py), or shared cores when None
        self.silent_s = silent_s
        self.time_limit_s, self.group_timeout_s = time_limit_s, group_timeout_s
        self.bubble_filling = bubble_filling
        self.cfg = runtime_model(instance)
        self.mbs = instance.micro_batch_size
        self.batch = instance.spec.training.global_batch
        self.model = PerfModel(instance)
        self.progress = progress or (lambda _: None)
        self.layout: Plan = instance.plan
        self.failed: frozenset[int] = frozenset()  # the job starts whole; failures are injected
        self.events: list[tuple[float, str, str]] = []
        self.generations: list[Generation] = []
        self.layouts: list[Plan] = [self.layout]       # every layout so far, to explain stale copies
        self.recoveries: list[Recovery] = []
        self.open_recoveries: list[tuple[Recovery, float]] = []  # (recovery, kill time) awaiting a step
        self.pending_switch: tuple[RecoveryDecision, Plan] | None = None  # hybrid: (decision, layout it planned from)
        self.pending_transition_kills: list[Failure] = []
        self.kill_time: float | None = None
        self.attempts = 0
        self.newcomers: frozenset[int] = frozenset()  # admitted by a rejoin whose transition has not committed
        self.hung: set[int] = set()                   # killed by the heartbeat watchdog

    # ---- processes --------------------------------------------------------------------------
    def _event(self, kind: str, detail: str) -> None:
        self.events.append((time.perf_counter() - self.t_start, kind, detail))
        self.progress(f"[{self.events[-1][0]:7.2f} s] {kind}: {detail}")

    def _spawn(self) -> None:
        self.store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=self.group_timeout_s),
                                   wait_for_workers=False)
        self.procs: dict[int, Any] = {}
        self.conns: dict[int, Connection] = {}
        self.heartbeats = Heartbeats(self.instance.num_devices, self.silent_s)
        stage_of = {d: (s.first, s.end) for p in self.layout.pipelines for s in p.stages for d in s.devices}
        for d in sorted(set(self.layout.devices) - self.failed):
            self._start_worker(d, stage_of[d], 0)

    def _start_worker(self, device: int, layers: tuple[int, int] | None, steps_done: int) -> None:
        """One worker process: built with `layers` (the job's start) or empty (a device back)."""
        spec = WorkerSpec(device, "127.0.0.1", self.store.port, self.cfg, self.seed, self.batch, self.mbs,
                          self.dtype, self.group_timeout_s, layers, steps_done)
        self.heartbeats.reset(device)
        self.procs[device], self.conns[device] = start_worker(
            worker_main, (spec,), self.heartbeats.slots, None if self.cores is None else self.cores[device],
            preload=WORKER_IMPORTS)

    def _live(self) -> list[int]:
        return sorted(self.procs)

    def _send(self, device: int, msg: dict[str, Any]) -> None:
        try:
            self.conns[device].send(msg)
        except (BrokenPipeError, OSError):
            pass  # it died; its sentinel reports it

    def _collect(self, expect: set[int]) -> tuple[dict[int, dict[str, Any]], set[int]]:
        """Replies of `expect`, and the devices that died meanwhile (removed from the live set)."""
        got = collect_replies(self.conns, self.procs, expect,
                              on_death=lambda d, _: self._event("failure detected", f"device {d} exited"),
                              heartbeats=self.heartbeats,
                              on_hung=lambda d, s: self._event("hang detected", f"device {d} silent for {s * 1e3:.0f} ms: "
                                                                                "SIGKILL"))
        self.hung |= set(got.hung)
        if got.kill_time is not None:
            self.kill_time = self.kill_time or got.kill_time
        elif got.hung:  # a hang nobody injected: it started at the last beat
            self.kill_time = self.kill_time or min(got.hung.values())
        return got.replies, got.dead

    def _kill(self, devices: tuple[int, ...], hang: bool = False) -> None:
        """SIGKILL (SIGSTOP with `hang`) the live ones among `devices`; a kill of a device already
        dead starts no clock (it would be read as the next recovery's kill time)."""
        live = [d for d in devices if d in self.procs]
        if not live:
            return
        self.kill_time = self.kill_time or time.perf_counter()
        for d in live:
            os.kill(self.procs[d].pid, signal.SIGSTOP if hang else signal.SIGKILL)
        self._event("hang" if hang else "kill", f"{'SIGSTOP' if hang else 'SIGKILL'} devices {live}")

    # ---- generations --------------------------------------------------------------------------
    def _start_generation(self, run_plan: Plan, migration: Migration | None, rounds: list[list[str]],
                          policy: str, predicted_s: float, step: int, recovery: Recovery | None,
                          transition: bool = True, rank_plans: Mapping[int, RankPlan] | None = None) -> bool:
        """Order, form groups, migrate: `rank_plans` are the decision's lowering (lowered here only
        for the job's start and a switch re-scheduled from a moved layout); each worker runs its
        record, migration transfers included. True when every rank is
        ready and committed; the plan (rerouting stripped) is then the layout the state is in."""
        t0 = time.perf_counter()
        inst = dataclasses.replace(self.instance, plan=self.layout, failed_devices=self.failed)
        if rank_plans is None:
            rank_plans = LoweredPlan(inst, run_plan, migration, rounds, self.failed)
        orders = planned_operations(rank_plans)
        schedule = "1F1B" if orders is None else "bubble-filled"
        if orders is None:
            orders = order_operations(rank_plans, self.mbs)
        if recovery is not None:
            recovery.planning_s += time.perf_counter() - t0
        index = len(self.generations)
        live = self._live()
        rank_of = {d: r for r, d in enumerate(live)}
        victims: set[int] = set()
        if transition:
            victims = {d for f in self.pending_transition_kills if f.step <= step for d in f.devices}
            self.pending_transition_kills = [f for f in self.pending_transition_kills if f.step > step]
        name = f"{index}.{self.attempts}"  # an aborted attempt's keys must not be reused
        self.attempts += 1
        for d in live:
            self._send(d, {"cmd": "generation", "generation": name, "rank_of": rank_of,
                           "plan": rank_plans[d] if d in rank_plans else absent_rank_plan(inst, d, "idle"),
                           "ops": orders.get(d, []), "die_in_transition": d in victims})
        replies, dead = self._collect(set(live))
        failed_ranks = [d for d, r in replies.items() if r["event"] != "ready"]
        if dead or failed_ranks:
            if not self.generations or not dead:
                raise RuntimeError(f"workers {sorted(dead) or failed_ranks} failed to start generation {name}: "
                                   + "; ".join(r.get("error", "") for r in replies.values() if r["event"] != "ready"))
            for d in self._live():
                self._send(d, {"cmd": "discard"})
            self._event("transition aborted", f"devices {sorted(dead)} died during it")
            opened = len(self.recoveries)
            self._recover(step, tuple(sorted(dead | self._drop_newcomers())), recovery)
            if recovery is None:  # a switch or rejoin outside any recovery: the one it opened counts it
                self.recoveries[opened].aborted_transitions += 1
            return False
        for d in live:
            self._send(d, {"cmd": "go"})
        if recovery is not None:
            recovery.group_s = max(r["group_s"] for r in replies.values())
            recovery.migration_s = max(r["migration_s"] for r in replies.values())
        self.generations.append(Generation(index, policy, run_plan, predicted_s, step, schedule))
        self.layout = dataclasses.replace(run_plan, rerouted=())
        self.layouts.append(self.layout)
        self._event("generation", f"{index}: {policy}, {len(run_plan.pipelines)} pipelines, {schedule} schedule, "
                                  f"predicted step "
                                  f"{predicted_s * 1e3:.1f} ms, migration {0 if migration is None else migration.total_bytes:,} B")
        return True

    def _recover(self, step: int, dead: tuple[int, ...], recovery: Recovery | None = None) -> None:
        """Plan from the layout the surviving state is in, with every dead device, and start it.

        A new failure opens a Recovery (kill -> first committed step); one during that
        recovery's own transition extends it. A hybrid switch still pending was planned before
        this failure: it is dropped, the new decision replaces it."""
        now = time.perf_counter()
        kill, self.kill_time = self.kill_time or now, None
        if recovery is None:
            recovery = Recovery(step, dead, detection_s=now - kill)
            self.recoveries.append(recovery)
            self.open_recoveries.append((recovery, kill))
        else:
            recovery.dead = tuple(sorted(set(recovery.dead) | set(dead)))
            recovery.aborted_transitions += 1
        recovery.hung = tuple(sorted(self.hung & set(recovery.dead)))
        self.pending_switch = None
        self.failed = self.failed | frozenset(dead)
        t0 = time.perf_counter()
        inst = dataclasses.replace(self.instance, plan=self.layout, failed_devices=self.failed)
        try:
            decision = plan_recovery(inst, self.failed, PlanningOptions(self.policy, self.time_limit_s,
                                                                        bubble_filling=self.bubble_filling))
        except UnrecoverableError as error:
            raise with_stale_copies(error, self.layouts, inst, self.failed) from None
        recovery.policy, recovery.reason = decision.policy, decision.reason
        recovery.predicted_step_s = decision.iteration_time_s
        recovery.planning_s += time.perf_counter() - t0
        self._event("planned", f"{decision.policy}: {decision.reason}")
        if decision.interim is not None:
            # reroute at once; switch to the reconfigured plan after the next completed step
            switch = (decision, self.layout)
            interim = decision.interim
            recovery.predicted_step_s = interim.iteration_time_s
            rounds = [list(r) for r in interim.allreduce_rounds]
            if self._start_generation(interim.plan, None, rounds, "reroute", interim.iteration_time_s, step, recovery,
                                      rank_plans=interim.rank_plans):
                self.pending_switch = switch
        elif decision.migration is None:  # a rerouting: nothing migrates
            self._start_generation(decision.plan, None, [list(r) for r in decision.allreduce_rounds], "reroute",
                                   decision.iteration_time_s, step, recovery, rank_plans=decision.rank_plans)
        else:
            self._switch(decision, self.layout, step, recovery)

    def _switch(self, decision: RecoveryDecision, planned_from: Plan, step: int, recovery: Recovery | None) -> None:
        """Move to a reconfigured plan by its migration schedule. When the state has moved since
        the decision (a hybrid's interim rerouting takes devices off their layers), the
        migration is scheduled again from the layout the state is in now."""
        assert decision.migration is not None
        migration, rounds = decision.migration, [list(r) for r in decision.allreduce_rounds]
        rank_plans: Mapping[int, RankPlan] | None = decision.rank_plans
        if self.layout is not planned_from:
            rank_plans = None
            inst = dataclasses.replace(self.instance, plan=self.layout, failed_devices=self.failed)
            migration, rounds, _ = communication_plan(inst, self.layout, decision.plan, self.failed,
                                                      Deadline.after(max(self.time_limit_s / 2, 1.0)), assign=False,
                                                      model=self.model)
        self._start_generation(decision.plan, migration, rounds, "reconfigure", decision.iteration_time_s, step,
                               recovery, rank_plans=rank_plans)

    def _rejoin(self, step: int, devices: tuple[int, ...]) -> None:
        """Failed `devices` are back, as fresh processes: plan their return from the layout the state
        is in and the plan running now (`plan_join`); unless it keeps running without them, start
        their workers and the next generation, which migrates their state by the planned transfers.
        A hybrid switch still pending is dropped: this decision replaces it."""
        joined = frozenset(devices) & self.failed
        if not joined:
            return
        self.pending_switch = None
        inst = dataclasses.replace(self.instance, plan=self.layout, failed_devices=self.failed)
        decision = plan_join(inst, self.generations[-1].plan, self.failed, joined,
                             PlanningOptions(time_limit_s=self.time_limit_s, bubble_filling=self.bubble_filling))
        self._event("rejoin planned", f"devices {sorted(joined)}: {decision.policy}: {decision.reason}")
        if decision.policy == "keep-running":
            return  # they stay out (failed) until a later rejoin
        for d in sorted(joined):
            self._start_worker(d, None, step)
        self.failed, self.newcomers = decision.failed, joined
        assert decision.migration is not None
        self._start_generation(decision.plan, decision.migration, [list(r) for r in decision.allreduce_rounds],
                               decision.policy, decision.iteration_time_s, step, None, rank_plans=decision.rank_plans)
        self.newcomers = frozenset()

    def _drop_newcomers(self) -> set[int]:
        """A rejoin's transition aborted: its newcomers never got their state, so they are stopped
        and count as failed again (the recovery then plans as if they had never come back)."""
        dropped = {d for d in self.newcomers if d in self.procs}
        for d in dropped:
            self._send(d, {"cmd": "stop"})
            proc = self.procs.pop(d)
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
            self.conns.pop(d).close()
        self.newcomers = frozenset()
        if dropped:
            self._event("rejoin undone", f"devices {sorted(dropped)} hold no state: out again")
        return dropped

    # ---- the job ------------------------------------------------------------------------------
    def run(self, steps: int, failures: tuple[Failure, ...] = (), rejoins: tuple[Rejoin, ...] = ()) -> RunReport:
        self.t_start = time.perf_counter()
        self.pending_transition_kills = [f for f in failures if f.in_transition]
        step_failures: dict[int, list[Failure]] = {}
        for f in failures:
            if not f.in_transition:
                step_failures.setdefault(f.step, []).append(f)
        self._spawn()
        losses: list[float] = []
        times: list[float] = []
        once: list[bool] = []
        try:
            rounds = schedule_allreduce(self.model, self.layout, self.failed, Deadline.after(1.0)).rounds
            predicted = self.model.evaluate(self.layout, self.failed).iteration_time_s
            self._start_generation(self.layout, None, rounds, "initial", predicted, 0, None, transition=False)
            step = 0
            while step < steps:
                for back in [r for r in rejoins if r.step == step]:
                    self._rejoin(step, back.devices)
                now = step_failures.pop(step, [])
                die_after = {d: f.after_ops for f in now if f.after_ops is not None for d in f.devices}
                hang = {d for f in now if f.hang for d in f.devices}
                t0 = time.perf_counter()
                for d in self._live():
                    self._send(d, {"cmd": "step", "step": step, "die_after_ops": die_after.get(d), "hang": d in hang})
                for f in sorted((f for f in now if f.after_ops is None), key=lambda f: f.delay_s):
                    time.sleep(max(t0 + f.delay_s - time.perf_counter(), 0.0))
                    self._kill(f.devices, f.hang)
                replies, dead = self._collect(set(self._live()))
                if dead or any(r["event"] != "ready" for r in replies.values()):
                    if not dead:
                        raise RuntimeError("a step failed without a dead worker: "
                                           + "; ".join(r.get("error", "") for r in replies.values()))
                    for d in self._live():
                        self._send(d, {"cmd": "abort"})
                    self._recover(step, tuple(sorted(dead)))
                    continue
                for d in self._live():
                    self._send(d, {"cmd": "commit"})
                elapsed = time.perf_counter() - t0
                loss, exactly_once = step_loss(replies, self.batch)
                once.append(exactly_once)
                losses.append(loss)
                times.append(elapsed)
                self.generations[-1].step_times_s.append(elapsed)
                self._event("step", f"{step}: loss {losses[-1]:.5f}, {elapsed * 1e3:.1f} ms")
                for recovery, kill in self.open_recoveries:
                    recovery.first_step_s = elapsed
                    recovery.total_s = time.perf_counter() - kill
                self.open_recoveries.clear()
                step += 1
                if self.pending_switch is not None and step < steps:
                    (chosen, planned_from), self.pending_switch = self.pending_switch, None
                    self._switch(chosen, planned_from, step, None)
            final, diff = self._final_state()
        finally:
            self._stop()
        return RunReport(losses, times, self.recoveries, self.generations, self.events, once, final, diff,
                         tuple(sorted(self.failed)), self.heartbeats.longest_s)

    def _final_state(self) -> tuple[dict[int, dict[str, list[float]]], float]:
        for d in self._live():
            self._send(d, {"cmd": "dump"})
        replies, _ = self._collect(set(self._live()))
        final: dict[int, dict[str, list[float]]] = {}
        diff = 0.0
        for d in sorted(replies):
            for layer, params in replies[d]["layers"].items():
                if layer not in final:
                    final[layer] = params
                    continue
                for name, values in params.items():
                    diff = max(diff, max((abs(a - b) for a, b in zip(values, final[layer][name])), default=0.0))
        return final, diff

    def _stop(self) -> None:
        for d in self._live():
            self._send(d, {"cmd": "stop"})
        for d, proc in list(self.procs.items()):
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
        self.procs.clear()


def run_training(instance: Instance, steps: int, failures: tuple[Failure, ...] = (), rejoins: tuple[Rejoin, ...] = (),
                 **options: Any) -> RunReport:
    """Train `steps` global batches of the instance's plan with the runtime, injecting `failures`
    and bringing devices back (`rejoins`)."""
    return Controller(instance, **options).run(steps, failures, rejoins)
