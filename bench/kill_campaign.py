"""A seeded random kill campaign through `chameleon-solve demo --json`: every run must end in
exit 0 with failure-free training's losses, or in exit 5 naming the lost layers, never anything
else, never hang and never leave a process behind.

Scenarios are drawn per seed from: one kill; two kills in the same step; kills in different steps;
every replica of a stage; a kill inside a recovery's transition; a kill inside a hybrid's switch;
a kill of a device that a recovery leaves without work, in the next step or inside that recovery's
transition (where it is at most a migration source); under every policy, on both runtime instances. The expected exit code comes from the planner alone
(`replay`: the failures applied to the layout with `decide`, no process started), not from the
runtime's verdict. "No hang": each run has a time limit; "no leftover process": each run gets its
own session, and after it ends /proc must hold no process of that session.

    .venv/bin/python bench/kill_campaign.py --seeds 1 2 3 --per-seed 18

prints a line per scenario and a summary (scenarios, seeds, passed, recovery latency from kill to
the next committed step: median and worst, and by phase), and writes bench/out/kill_campaign.json.

`--runtime hf` runs the same kinds of scenarios on the Hugging Face runtime (`demo --hf`: torch
pipelining, DTensor TP) on 4-process worlds of tiny-llama and tiny-gpt2: PP2 x DP2 (TP1) and
DP2 x TP2 (PP1), under policy reconfigure, reroute or auto (with `--mtbf-hours 1`, so that the
hybrid can win); its losses are checked against single-process training of the whole model
(float64). Its replay (`hf_replay`) plans as the HF controller does: a rerouting is stored as the
layout without its reroutes, and the TP peers it idles are counted out, never reported dead; each
run's recovery policies (hybrid, reroute, reconfigure) must be the replay's. A `hang` scenario
stops a worker (SIGSTOP) in a step instead of killing it: the heartbeat watchdog must find it. A `rejoin` scenario kills a device and
brings it back a step or more later as a fresh worker (`--rejoin`), sometimes with a kill inside the
transition that admits it (a survivor's or its own) or a kill after it; the replay plans its return
with `rejoin.plan_join`, and each run's rejoin decisions must be the replay's. A `tp-change`
scenario runs a DP2 x TP2 world with `--tp-degrees 1,2` (the recovery may move to TP 1, re-sharded
from the checkpoint), sometimes bringing the device back afterwards. `--kinds` picks kinds (the
tiny-GPT runtime also runs `hang`, not drawn by default so that its seeds keep their scenarios):

    .venv/bin/python bench/kill_campaign.py --runtime hf --seeds 1 2 3 --per-seed 12 \
        --out bench/out/kill_campaign_hf.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
INSTANCES = {"cpu-4": ROOT / "instances" / "runtime-cpu-4.json", "cpu-6": ROOT / "instances" / "runtime-cpu-6.json"}
POLICIES = ("auto", "reroute", "reconfigure")
KINDS = ("single", "same-step", "different-steps", "every-replica", "in-transition", "hybrid-switch", "idle-or-source")
HF_MODELS = ROOT / "models" / "hf"
HF_INSTANCES = {"llama-pp2-dp2": ("tiny-llama", (2, 2, 1)), "gpt2-pp2-dp2": ("tiny-gpt2", (2, 2, 1)),
                "llama-dp2-tp2": ("tiny-llama", (1, 2, 2)), "gpt2-dp2-tp2": ("tiny-gpt2", (1, 2, 2))}
HF_KINDS = ("single", "same-step", "different-steps", "every-replica", "in-transition", "idle-or-source", "hang",
            "rejoin", "tp-change")
TP_DEGREES = (1, 2)    # a tp-change scenario's --tp-degrees
HF_MTBF_HOURS = 1.0    # per device, with policy auto: short enough that the hybrid can win (Eq. 8)
ALL_KINDS = {"gpt": KINDS + ("hang",), "hf": HF_KINDS}
STEPS = 6
TIME_LIMIT_S = 5.0     # the controller's planning limit: the replay plans with the same one
RUN_TIMEOUT_S = 300.0


@dataclass
class Scenario:
    seed: int
    index: int
    kind: str
    instance: str
    policy: str
    kills: list[tuple[int, int]]                              # (device, step)
    in_transition: list[tuple[int, int]] = field(default_factory=list)
    note: str = ""
    hangs: list[tuple[int, int]] = field(default_factory=list)   # (device, step): SIGSTOP, not SIGKILL
    runtime: str = "gpt"                                      # gpt: the tiny GPT; hf: demo --hf
    rejoins: list[tuple[int, int]] = field(default_factory=list)  # (device, step): back before that step
    tp_degrees: tuple[int, ...] = ()                          # --tp-degrees (hf)

    def args(self) -> list[str]:
        if self.runtime == "hf":
            model, layout = HF_INSTANCES[self.instance]
            head = ["--hf", str(HF_MODELS / model), "--hf-layout", "x".join(map(str, layout)), "--steps", str(STEPS),
                    "--policy", self.policy] + ([f"--mtbf-hours={mtbf_of(self):g}"] if mtbf_of(self) else [])
        else:
            head = [str(INSTANCES[self.instance]), "--steps", str(STEPS), "--policy", self.policy]
        return (head + [f"--kill={d}@{s}" for d, s in self.kills]
                + [f"--kill-in-transition={d}@{s}" for d, s in self.in_transition]
                + [f"--hang={d}@{s}" for d, s in self.hangs] + [f"--rejoin={d}@{s}" for d, s in self.rejoins]
                + ([f"--tp-degrees={','.join(map(str, self.tp_degrees))}"] if self.tp_degrees else []))

    def label(self) -> str:
        kills = " ".join(f"{d}@{s}" for d, s in self.kills)
        moving = " ".join(f"{d}@{s}" for d, s in self.in_transition)
        stopped = " ".join(f"{d}@{s}" for d, s in self.hangs)
        back = " ".join(f"{d}@{s}" for d, s in self.rejoins)
        return (f"seed {self.seed} #{self.index:02d} {self.kind:15s} {self.instance} {self.policy:11s} kill {kills}"
                + (f" hang {stopped}" if stopped else "") + (f" rejoin {back}" if back else "")
                + (f" tp-degrees {','.join(map(str, self.tp_degrees))}" if self.tp_degrees else "")
                + (f" in-transition {moving}" if moving else "") + (f" ({self.note})" if self.note else ""))


# ---- the planner's verdict -----------------------------------------------------------------------------
@dataclass
class Expected:
    exit_code: int
    dead: tuple[int, ...]
    layouts: list[Any]          # layouts after each recovery, for scenarios that target idle devices
    reason: str = ""
    rejoins: list[tuple[str, bool]] = field(default_factory=list)   # per rejoin: the policy, aborted
    tp_changes: list[tuple[int, int]] = field(default_factory=list)  # per recovery changing it: (from, to)
    working: list[frozenset[int]] = field(default_factory=list)  # HF: per plan started, the devices with work
    policies: list[str] = field(default_factory=list)   # HF: per recovery, the policy decided (hybrid, reroute...)


def replay(scenario: Scenario) -> Expected:
    """What the planner says about the scenario: the failures in the runtime's order (step kills
    at their step; an in-transition kill at the first transition at or after its step; a hybrid's
    switch after the step that follows its decision), each planned from the layout the state is
    in. Exit 5 as soon as some layer has no live holder in that layout. A rejoin before a step is
    planned with `plan_join` first; a kill inside the transition that admits it leaves the
    newcomer out again and is recovered from (nothing to recover when only the newcomer died).
    The HF runtime is replayed as its controller plans (`hf_replay`)."""
    if scenario.runtime == "hf":
        return hf_replay(scenario)
    from chameleon_opt.errors import UnrecoverableError
    from chameleon_opt.decision import decide
    from chameleon_opt.planning import PlanningOptions
    from chameleon_opt.rejoin import plan_join
    from chameleon_opt.solve.deadline import Deadline

    base = base_instance(scenario.runtime, scenario.instance)
    strikes = scenario.kills + scenario.hangs   # a hung worker is killed by the watchdog in its step
    state = {"layout": base.plan, "failed": frozenset(), "switch": None}
    moving = sorted(scenario.in_transition, key=lambda k: k[1])
    layouts: list[Any] = []
    rejoined: list[tuple[str, bool]] = []

    def victims(step: int) -> set[int]:
        hit = {d for d, s in moving if s <= step}
        moving[:] = [(d, s) for d, s in moving if s > step]
        return hit - state["failed"]

    def adopt(plan: Any) -> None:
        state["layout"] = dataclasses.replace(plan, rerouted=())
        layouts.append(state["layout"])

    def recover(dead: set[int], step: int) -> None:
        while True:
            state["failed"] = state["failed"] | dead
            state["switch"] = None
            inst = dataclasses.replace(base, plan=state["layout"], failed_devices=state["failed"])
            decision = decide(inst, state["failed"], scenario.policy, deadline=Deadline.after(TIME_LIMIT_S))
            chosen = decision.chosen
            assert chosen is not None, decision.reason
            dead = victims(step)
            if dead:                 # the transition is aborted: plan again from the same layout
                continue
            if chosen.policy == "hybrid":
                adopt(chosen.interim.plan)
                state["switch"] = chosen.communication[2].plan
            else:
                adopt(chosen.communication[2].plan if chosen.communication else chosen.plan)
            return

    def join(joined: frozenset[int], step: int) -> None:
        if not joined:
            return
        inst = dataclasses.replace(base, plan=state["layout"], failed_devices=state["failed"])
        decision = plan_join(inst, state["layout"], state["failed"], joined,
                             PlanningOptions("reconfigure", TIME_LIMIT_S))
        if decision.policy == "keep-running":
            rejoined.append((decision.policy, False))
            return
        before, state["failed"] = state["failed"], decision.failed
        hit = victims(step)                   # the newcomers are live in their transition
        rejoined.append((decision.policy, bool(hit)))
        if not hit:
            adopt(decision.plan)
            return
        state["failed"] = before
        if hit - joined:
            recover(hit - joined, step)

    try:
        for step in range(STEPS):
            for device, _ in [(d, s) for d, s in scenario.rejoins if s == step]:
                join(frozenset({device}) & state["failed"], step)
            dead = {d for d, s in strikes if s == step} - state["failed"]
            if dead:
                recover(dead, step)
            if state["switch"] is not None and step + 1 < STEPS:
                target, state["switch"] = state["switch"], None
                dead = victims(step + 1)
                if dead:
                    recover(dead, step + 1)
                else:
                    adopt(target)
    except UnrecoverableError as error:
        return Expected(5, tuple(sorted(state["failed"])), layouts, str(error), rejoined)
    return Expected(0, tuple(sorted(state["failed"])), layouts, rejoins=rejoined)


@dataclass
class _HFState:
    """The HF controller's planning state (`PipelinedController`): the layout the state is in
    (the running plan without its rerouting), the plan running now, the devices failed so far
    and a hybrid's reconfigured plan waiting for the next committed step."""

    layout: Any
    running: Any
    failed: frozenset[int] = frozenset()
    switch: Any = None

    def stale(self) -> frozenset[int]:
        """Live devices of a layout stage that lost a device while the running plan reroutes:
        idle, their shards dropped, so the controller plans as if they had failed (`_stale`),
        never reporting them dead."""
        if not self.running.rerouted:
            return frozenset()
        return frozenset(d for pipe in self.layout.pipelines for stage in pipe.stages
                         if self.failed.intersection(stage.devices) for d in stage.devices) - self.failed

    def working(self) -> frozenset[int]:
        """Devices with work in the running plan (neither failed nor stale)."""
        return frozenset(self.running.devices) - self.failed - self.stale()


def hf_replay(scenario: Scenario) -> Expected:
    """`replay` for the HF runtime, deciding as `PipelinedController` does: `plan_recovery` (or
    `plan_join`) under the scenario's policy from the layout, with the devices a rerouting idles
    (`_HFState.stale`) counted out; a rerouting is stored as the layout without its reroutes; a
    hybrid's switch re-plans (reconfigure) when its plan counts on a device the interim idled;
    no TP change is planned before the first step's checkpoint."""
    from chameleon_opt.errors import UnrecoverableError
    from chameleon_opt.planning import PlanningOptions, plan_recovery
    from chameleon_opt.rejoin import plan_join

    base = base_instance(scenario.runtime, scenario.instance, mtbf_of(scenario))
    options = PlanningOptions(scenario.policy, TIME_LIMIT_S, tp_degrees=scenario.tp_degrees)
    strikes = scenario.kills + scenario.hangs   # a hung worker is killed by the watchdog in its step
    hf = _HFState(base.plan, base.plan)
    moving = sorted(scenario.in_transition, key=lambda k: k[1])
    layouts: list[Any] = []
    working: list[frozenset[int]] = []
    rejoined: list[tuple[str, bool]] = []
    tp_changes: list[tuple[int, int]] = []
    policies: list[str] = []

    def victims(step: int) -> set[int]:
        """Live devices struck inside the transition before `step` (stale ones are live)."""
        hit = {d for d, s in moving if s <= step}
        moving[:] = [(d, s) for d, s in moving if s > step]
        return hit - hf.failed

    def start(plan: Any) -> None:
        hf.running, hf.layout = plan, dataclasses.replace(plan, rerouted=())
        layouts.append(hf.layout)
        working.append(hf.working())

    def recover(dead: set[int], step: int) -> None:
        hf.switch = None
        stale = hf.stale()   # of the plan running when the failure struck
        while True:
            hf.failed = hf.failed | dead
            out = hf.failed | stale
            state = dataclasses.replace(base, plan=hf.layout, failed_devices=out)
            # no checkpoint before the first step commits: nothing to re-shard a TP change from
            decision = plan_recovery(state, out, options if step > 0 else dataclasses.replace(options, tp_degrees=()))
            dead = victims(step)
            if dead:                 # the transition is aborted: plan again from the same layout
                continue
            policies.append(decision.policy)
            now_run = decision.interim or decision
            if now_run.plan.tensor_parallel != hf.layout.tensor_parallel:
                tp_changes.append((hf.layout.tensor_parallel, now_run.plan.tensor_parallel))
            planned_from = hf.layout
            start(now_run.plan)
            if decision.interim is not None:
                hf.switch = (decision, planned_from)
            return

    def switch(step: int) -> None:
        (decision, _), hf.switch = hf.switch, None
        stale = hf.stale()
        if stale & set(decision.plan.devices):   # it counts on a device the interim idled
            out = hf.failed | stale
            state = dataclasses.replace(base, plan=hf.layout, failed_devices=out)
            decision = plan_recovery(state, out, dataclasses.replace(options, policy="reconfigure"))
        dead = victims(step)
        if dead:
            recover(dead, step)
        else:
            start(decision.plan)

    def join(joined: frozenset[int], step: int) -> None:
        if not joined:
            return
        hf.switch = None
        stale = hf.stale()
        state = dataclasses.replace(base, plan=hf.layout, failed_devices=hf.failed | stale)
        decision = plan_join(state, hf.running, hf.failed | stale, joined, options)
        if decision.policy == "keep-running":
            rejoined.append((decision.policy, False))
            return
        before, hf.failed = hf.failed, decision.failed - stale
        hit = victims(step)                   # the newcomers are live in their transition
        rejoined.append((decision.policy, bool(hit)))
        if not hit:
            start(decision.plan)
            return
        hf.failed = before
        if hit - joined:
            recover(hit - joined, step)

    try:
        for step in range(STEPS):
            for device, _ in [(d, s) for d, s in scenario.rejoins if s == step]:
                join(frozenset({device}) & hf.failed, step)
            dead = {d for d, s in strikes if s == step} - hf.failed
            if dead:
                recover(dead, step)
            if hf.switch is not None and step + 1 < STEPS:
                switch(step + 1)
    except UnrecoverableError as error:
        return Expected(5, tuple(sorted(hf.failed)), layouts, str(error), rejoined, tp_changes, working, policies)
    return Expected(0, tuple(sorted(hf.failed)), layouts, rejoins=rejoined, tp_changes=tp_changes, working=working,
                    policies=policies)


# ---- drawing scenarios --------------------------------------------------------------------------------
def mtbf_of(scenario: Scenario) -> float | None:
    """The HF demo's `--mtbf-hours`: with policy auto only (without one, auto compares steady
    throughputs and never runs the hybrid); reconfigure and reroute keep the demo's default."""
    return HF_MTBF_HOURS if scenario.runtime == "hf" and scenario.policy == "auto" else None


@lru_cache(maxsize=None)
def base_instance(runtime: str, instance: str, mtbf_hours: float | None = None) -> Any:
    """The job a scenario runs: a bundled runtime instance, or the HF demo's (`--hf-layout`,
    `--mtbf-hours`)."""
    if runtime == "hf":
        from chameleon_opt.runtime.pipelined import runtime_instance

        model, (pp, dp, tp) = HF_INSTANCES[instance]
        return runtime_instance(HF_MODELS / model / "config.json", pp, dp, tp, mtbf_hours=mtbf_hours)
    from chameleon_opt.instance.load import load_instance

    return load_instance(INSTANCES[instance])


def stages_of(instance: str, runtime: str = "gpt") -> list[list[int]]:
    """Per stage position, one device of each replica of that layer range (its first TP rank)."""
    plan = base_instance(runtime, instance).plan
    return [sorted(p.stages[s].devices[0] for p in plan.pipelines) for s in range(len(plan.pipelines[0].stages))]


def draw(rng: random.Random, seed: int, index: int, kind: str, runtime: str = "gpt") -> Scenario:
    if runtime == "hf":
        instance = rng.choice(sorted(HF_INSTANCES))
        # from a stream of its own, so that each seed draws the kills it drew under reconfigure only;
        # a tp-change under reroute would never change the degree
        policies = ("auto", "reconfigure") if kind == "tp-change" else POLICIES
        policy = random.Random(f"hf-policy {seed} {index}").choice(policies)
        devices = sorted(base_instance(runtime, instance).plan.devices)   # every TP rank too
        stages = stages_of(instance, runtime)
    else:
        instance = rng.choice(sorted(INSTANCES))
        policy = "auto" if kind == "hybrid-switch" else rng.choice(POLICIES)
        stages = stages_of(instance)
        devices = sorted(d for stage in stages for d in stage)
    step = rng.randint(1, 3)
    scenario = Scenario(seed, index, kind, instance, policy, [], runtime=runtime)
    if kind == "single":
        scenario.kills = [(rng.choice(devices), rng.randint(1, 4))]
    elif kind == "hang":
        scenario.hangs = [(rng.choice(devices), rng.randint(1, 4))]
    elif kind == "rejoin":
        first, back = rng.choice(devices), rng.randint(2, 4)
        scenario.kills, scenario.rejoins = [(first, rng.randint(1, back - 1))], [(first, back)]
        then = rng.randrange(3)
        if then == 1:   # a kill inside the transition that admits it: a survivor's or its own
            scenario.in_transition = [(rng.choice(devices), back)]
            scenario.note = "a kill in the rejoin's transition"
        elif then == 2 and back < STEPS - 1:
            scenario.kills.append((rng.choice(devices), back + 1))
            scenario.note = "a kill after the rejoin"
    elif kind == "tp-change":
        scenario.instance = rng.choice(sorted(name for name, (_, layout) in HF_INSTANCES.items() if layout[2] > 1))
        scenario.tp_degrees = TP_DEGREES
        devices = sorted(base_instance(runtime, scenario.instance).plan.devices)
        first = rng.choice(devices)
        scenario.kills = [(first, step)]
        if rng.random() < 0.5:
            scenario.rejoins = [(first, step + 1 + rng.randrange(STEPS - step - 2))]
            scenario.note = "brought back after the recovery"
    elif kind == "same-step":
        scenario.kills = [(d, step) for d in rng.sample(devices, 2)]
    elif kind == "different-steps":
        chosen = rng.sample(devices, rng.randint(2, 3))
        scenario.kills = list(zip(chosen, sorted(rng.sample(range(1, 5), len(chosen)))))
    elif kind == "every-replica":
        replicas = rng.choice(stages)
        same = rng.random() < 0.5
        scenario.kills = [(d, step if same else step + i) for i, d in enumerate(replicas)]
    elif kind == "in-transition":
        first, second = rng.sample(devices, 2)
        scenario.kills, scenario.in_transition = [(first, step)], [(second, step)]
    elif kind == "hybrid-switch":
        first, second = rng.sample(devices, 2)
        scenario.kills, scenario.in_transition = [(first, step)], [(second, step + 1)]
    else:  # idle-or-source: a device the first recovery leaves without work, per the planner
        first = rng.choice(devices)
        scenario.kills = [(first, step)]
        expected = replay(scenario)
        # HF: the devices with work in the running plan (a rerouting idles the dead device's TP peers)
        after = expected.working if runtime == "hf" else [layout.devices for layout in expected.layouts]
        alive = [d for d in devices if d != first]
        idle = sorted(set(alive) - set(after[0])) if after else []
        target = rng.choice(idle) if idle else rng.choice(alive)
        if idle and (index // len(KINDS)) % 2 == 0:  # alternate between the two
            # inside that recovery's transition, where it has no work (at most it sends state)
            scenario.in_transition = [(target, step)]
            scenario.note = f"device {target} has no work in the first recovery's plan"
        else:
            scenario.kills.append((target, step + 1))
            scenario.note = f"device {target} {'idle' if idle else 'a survivor (none idle)'} after the first recovery"
    return scenario


def scenarios(seeds: list[int], per_seed: int, runtime: str = "gpt", kinds: tuple[str, ...] | None = None
              ) -> list[Scenario]:
    """`per_seed` scenarios per seed, cycling through every kind so each seed covers them all."""
    out = []
    for seed in seeds:
        rng = random.Random(seed)
        drawn = list(kinds or (HF_KINDS if runtime == "hf" else KINDS))
        rng.shuffle(drawn)
        out += [draw(rng, seed, i, drawn[i % len(drawn)], runtime) for i in range(per_seed)]
    return out


# ---- running ------------------------------------------------------------------------------------------
def session_processes(session: int) -> list[int]:
    """Pids of live processes in `session` (from /proc, no psutil)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) == session and fields[0] != "Z":   # fields: state, ppid, pgrp, session
            found.append(int(entry.name))
    return found


def reference_losses(instance: str, runtime: str = "gpt") -> list[float]:
    """Failure-free losses of the demo's configuration (float32, seed 0; with `hf`: the whole model
    trained in this process, float64, as `demo --hf` runs it)."""
    if runtime == "hf":
        from chameleon_opt.runtime import pipelined

        model, _ = HF_INSTANCES[instance]
        return pipelined.reference_losses(base_instance(runtime, instance), HF_MODELS / model / "config.json", STEPS)
    from chameleon_opt.instance.load import load_instance
    from chameleon_opt.runtime.controller import run_training

    return run_training(load_instance(INSTANCES[instance]), STEPS, ()).losses


PHASES = ("detection", "planning", "groups", "build", "state", "redone step", "total")


def recovery_phases(recovery: dict[str, Any], runtime: str) -> dict[str, Any]:
    """One recovery of a run's JSON in the phases both runtimes report (seconds; the tiny GPT
    builds no stage: its layers move as they are)."""
    if runtime == "hf":
        keys = ("detection_s", "planning_s", "group_s", "build_s", "restore_s", "first_step_s", "total_s")
    else:
        keys = ("detection_s", "planning_s", "group_rebuild_s", None, "migration_s", "first_step_s",
                "kill_to_first_step_s")
    row = {phase: (recovery[key] if key else 0.0) for phase, key in zip(PHASES, keys)}
    row["hung"] = bool(recovery.get("hung"))
    row["aborted_transitions"] = recovery.get("aborted_transitions", 0)
    row["rejoin"] = False
    return row


def rejoin_phases(rejoin: dict[str, Any]) -> dict[str, Any]:
    """An admitted rejoin of an HF run's JSON in the same phases, from its decision to the next
    committed step (nothing to detect; its groups wait for the new process to start)."""
    keys = (None, "planning_s", "group_s", "build_s", "restore_s", "first_step_s", "total_s")
    row = {phase: (rejoin[key] if key else 0.0) for phase, key in zip(PHASES, keys)}
    return {**row, "hung": False, "aborted_transitions": 0, "rejoin": True}


def _training_problems(run: dict[str, Any], reference: list[float], dead: tuple[int, ...]) -> list[str]:
    """What a finished run got wrong against failure-free training and the planner's replay: its
    losses (relative to the reference), samples seen other than once, the devices it lost."""
    problems = []
    losses = run["losses"]
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, reference))
    if len(losses) != STEPS or worst > 1e-5:
        problems.append(f"losses differ from failure-free: {worst:.2e} relative over {len(losses)} steps")
    if not all(run["samples_exactly_once"]):
        problems.append(f"samples not exactly once: {run['samples_exactly_once']}")
    if tuple(run["dead"]) != dead:
        problems.append(f"dead {run['dead']}, planner expects {list(dead)}")
    return problems


def run(scenario: Scenario, expected: Expected, reference: list[float], workdir: Path) -> dict[str, Any]:
    """Run the demo in its own session; judge exit code, output, losses, hang and leftovers."""
    command = [sys.executable, "-m", "chameleon_opt.cli", "demo", *scenario.args(), "--no-compare", "--json"]
    if scenario.runtime != "hf":
        command += ["--plot", str(workdir / f"s{scenario.seed}-{scenario.index}.png"), "--force"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
                            start_new_session=True)
    problems: list[str] = []
    try:
        stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        problems.append(f"hung: no exit within {RUN_TIMEOUT_S:.0f} s")
    wall = time.perf_counter() - start
    deadline = time.monotonic() + 5.0
    while (left := session_processes(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if left:
        problems.append(f"processes left behind: {left}")
        os.killpg(proc.pid, signal.SIGKILL)
    code = proc.returncode
    if "Traceback" in stderr:
        problems.append("traceback: " + stderr.strip().splitlines()[-1][:200])
    if code != expected.exit_code:
        problems.append(f"exit {code}, planner expects {expected.exit_code}"
                        + (f" ({expected.reason[:120]})" if expected.reason else "")
                        + (f": {stderr.strip().splitlines()[-1][:200]}" if stderr.strip() else ""))
    latencies: list[float] = []
    phases: list[dict[str, Any]] = []
    heartbeat = None
    try:
        payload = json.loads(stdout) if stdout.strip() else {}
    except json.JSONDecodeError:
        payload = {}
        problems.append("stdout is not one JSON object")
    if code == 0 and payload and scenario.runtime == "hf":
        run_ = payload["runs"]["migration"]
        problems += _training_problems(run_, reference, expected.dead)
        hung = sorted(d for r in run_["recoveries"] for d in r["hung"])
        if hung != sorted({d for d, _ in scenario.hangs}):
            problems.append(f"the watchdog killed {hung}, hangs injected {scenario.hangs}")
        back = [(r["policy"], r["aborted"]) for r in run_["rejoins"]]
        if back != expected.rejoins:
            problems.append(f"rejoins {back}, planner expects {expected.rejoins}")
        changes = [tuple(r["tensor_parallel"]) for r in run_["recoveries"] if r["tensor_parallel"]]
        if changes != expected.tp_changes:
            problems.append(f"TP degree changes {changes}, planner expects {expected.tp_changes}")
        policies = [r["policy"] for r in run_["recoveries"]]
        if policies != expected.policies:
            problems.append(f"recovery policies {policies}, planner expects {expected.policies}")
        latencies = [r["total_s"] for r in run_["recoveries"]]
        phases = [recovery_phases(r, "hf") for r in run_["recoveries"]]
        phases += [rejoin_phases(r) for r in run_["rejoins"] if r["policy"] != "keep-running" and not r["aborted"]]
        heartbeat = run_["heartbeat_longest_s"]
    elif code == 0 and payload:
        problems += _training_problems(payload, reference, expected.dead)
        if payload["replica_max_difference"] != 0.0:
            problems.append(f"replicas differ by {payload['replica_max_difference']:.2e}")
        latencies = [r["kill_to_first_step_s"] for r in payload["recoveries"]]
        phases = [recovery_phases(r, "gpt") for r in payload["recoveries"]]
        heartbeat = payload.get("heartbeat_longest_s")
        hung = sorted(d for r in payload["recoveries"] for d in r.get("hung", []))
        if hung != sorted({d for d, _ in scenario.hangs}):
            problems.append(f"the watchdog killed {hung}, hangs injected {scenario.hangs}")
    elif code == 5 and not ("layers " in payload.get("reason", "") and "lost every replica" in payload["reason"]):
        problems.append("exit 5 without the lost layers named")
    # a recovery that waited for something: keep the evidence (the HF runtime dumps the stacks of
    # survivors that do not answer soon after a death)
    slow = any(t > 5.0 for t in latencies) or "have not answered" in stderr or "still runs" in stderr
    return {"scenario": scenario.label(), "args": scenario.args(), "expected_exit": expected.exit_code,
            "exit": code, "policy": scenario.policy, "expected_policies": expected.policies, "wall_s": wall,
            "recovery_latencies_s": latencies, "phases": phases,
            "heartbeat_longest_s": heartbeat, "problems": problems,
            "stderr_tail": stderr[-6000:] if problems or slow else ""}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--per-seed", type=int, default=18)
    parser.add_argument("--out", type=Path, default=None,
                        help="default bench/out/kill_campaign.json (kill_campaign_hf.json with --runtime hf)")
    parser.add_argument("--runtime", choices=("gpt", "hf"), default="gpt",
                        help="gpt: the tiny-GPT runtime instances; hf: demo --hf on 4-process worlds")
    parser.add_argument("--kinds", nargs="+", default=None,
                        help="scenario kinds to draw (default: every kind of the runtime but the GPT runtime's hang)")
    args = parser.parse_args()
    if args.kinds and set(args.kinds) - set(ALL_KINDS[args.runtime]):
        parser.error(f"--kinds: {args.runtime} draws from {', '.join(ALL_KINDS[args.runtime])}")
    if args.out is None:
        args.out = ROOT / "bench" / "out" / ("kill_campaign_hf.json" if args.runtime == "hf" else "kill_campaign.json")
    results = campaign(args.seeds, args.per_seed, lambda line: print(line, flush=True), args.runtime, tuple(args.kinds) if args.kinds else None)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    sys.exit(0 if results["passed"] == results["scenarios"] else 1)


def campaign(seeds: list[int], per_seed: int, say: Any, runtime: str = "gpt",
             kinds: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Draw, replay and run every scenario; one line per scenario, then the summary lines."""
    drawn = scenarios(seeds, per_seed, runtime, kinds)
    references: dict[str, list[float]] = {}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for scenario in drawn:
            expected = replay(scenario)
            if scenario.instance not in references:
                references[scenario.instance] = reference_losses(scenario.instance, runtime)
            row = run(scenario, expected, references[scenario.instance], Path(tmp))
            rows.append(row)
            verdict = "ok  " if not row["problems"] else "FAIL"
            say(f"{verdict} {row['scenario']}: exit {row['exit']} (planner {row['expected_exit']}), "
                f"{row['wall_s']:.1f} s" + "".join(f"\n     {p}" for p in row["problems"]))
    latencies = sorted(t for row in rows for t in row["recovery_latencies_s"])
    passed = sum(not row["problems"] for row in rows)
    summary = (f"kill campaign{' (hf runtime)' if runtime == 'hf' else ''}: {len(rows)} scenarios over {len(seeds)} "
               f"seeds ({', '.join(map(str, seeds))}), "
               f"{passed} passed; exits: {sum(r['exit'] == 0 for r in rows)} x 0, {sum(r['exit'] == 5 for r in rows)} x 5, "
               f"{sum(r['exit'] not in (0, 5) for r in rows)} other; recovery latency (kill to next committed step) "
               f"over {len(latencies)} recoveries: median "
               + (f"{statistics.median(latencies) * 1e3:.0f} ms, worst {latencies[-1] * 1e3:.0f} ms" if latencies
                  else "n/a"))
    say(summary)
    by_policy = {policy: [row for row in rows if row["policy"] == policy] for policy in POLICIES}
    decided = [p for row in rows for p in row["expected_policies"]]
    say("  by policy: " + ", ".join(f"{policy} {sum(not row['problems'] for row in group)}/{len(group)} passed"
                                    for policy, group in by_policy.items() if group)
        + (f"; recoveries planned as {', '.join(f'{p} x {decided.count(p)}' for p in sorted(set(decided)))}"
           if decided else ""))
    recoveries = [p for row in rows for p in row["phases"]]
    by_kind = {"kills": [p for p in recoveries if not p["hung"] and not p["rejoin"]],
               "hangs": [p for p in recoveries if p["hung"]], "rejoins": [p for p in recoveries if p["rejoin"]]}
    phases = {kind: {phase: (statistics.median(p[phase] for p in group), max(p[phase] for p in group))
                     for phase in PHASES} for kind, group in by_kind.items() if group}
    for kind, table in phases.items():
        say(f"  {kind}: {len(by_kind[kind])} {'admitted' if kind == 'rejoins' else 'recoveries'}, median / worst ms: "
            + ", ".join(f"{phase} {m * 1e3:.0f} / {w * 1e3:.0f}" for phase, (m, w) in table.items()))
    beats = [row["heartbeat_longest_s"] for row in rows if row.get("heartbeat_longest_s") is not None]
    if beats:
        say(f"  heartbeats: longest gap between two beats of a live worker {max(beats) * 1e3:.0f} ms "
            f"(median over runs {statistics.median(beats) * 1e3:.0f} ms)")
    return {"seeds": seeds, "runtime": runtime, "scenarios": len(rows), "passed": passed, "summary": summary,
            "median_recovery_s": statistics.median(latencies) if latencies else None,
            "worst_recovery_s": latencies[-1] if latencies else None, "phases": phases,
            "heartbeat_longest_s": max(beats) if beats else None, "runs": rows}


if __name__ == "__main__":
    main()
