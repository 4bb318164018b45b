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
the next committed step: median and worst), and writes bench/out/kill_campaign.json.
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
INSTANCES = {"cpu-4": ROOT / "instances" / "runtime-cpu-4.json", "cpu-6": ROOT / "instances" / "runtime-cpu-6.json"}
POLICIES = ("auto", "reroute", "reconfigure")
KINDS = ("single", "same-step", "different-steps", "every-replica", "in-transition", "hybrid-switch", "idle-or-source")
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

    def args(self) -> list[str]:
        return ([str(INSTANCES[self.instance]), "--steps", str(STEPS), "--policy", self.policy]
                + [f"--kill={d}@{s}" for d, s in self.kills]
                + [f"--kill-in-transition={d}@{s}" for d, s in self.in_transition])

    def label(self) -> str:
        kills = " ".join(f"{d}@{s}" for d, s in self.kills)
        moving = " ".join(f"{d}@{s}" for d, s in self.in_transition)
        return (f"seed {self.seed} #{self.index:02d} {self.kind:15s} {self.instance} {self.policy:11s} kill {kills}"
                + (f" in-transition {moving}" if moving else "") + (f" ({self.note})" if self.note else ""))


# ---- the planner's verdict -----------------------------------------------------------------------------
@dataclass
class Expected:
    exit_code: int
    dead: tuple[int, ...]
    layouts: list[Any]          # layouts after each recovery, for scenarios that target idle devices
    reason: str = ""


def replay(scenario: Scenario) -> Expected:
    """What the planner says about the scenario: the failures in the runtime's order (step kills
    at their step; an in-transition kill at the first transition at or after its step; a hybrid's
    switch after the step that follows its decision), each planned with `decide` from the layout
    the state is in. Exit 5 as soon as some layer has no live holder in that layout."""
    from chameleon_opt.errors import UnrecoverableError
    from chameleon_opt.instance.load import load_instance
    from chameleon_opt.decision import decide
    from chameleon_opt.solve.deadline import Deadline

    base = load_instance(INSTANCES[scenario.instance])
    state = {"layout": base.plan, "failed": frozenset(), "switch": None}
    moving = sorted(scenario.in_transition, key=lambda k: k[1])
    layouts: list[Any] = []

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
            decision = decide(inst, state["failed"], scenario.policy, deadline=Deadline.after(TIME_LIMIT_S),
                              bubble_filling=False)  # as the controller plans: see its docstring
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

    try:
        for step in range(STEPS):
            dead = {d for d, s in scenario.kills if s == step} - state["failed"]
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
        return Expected(5, tuple(sorted(state["failed"])), layouts, str(error))
    return Expected(0, tuple(sorted(state["failed"])), layouts)


# ---- drawing scenarios --------------------------------------------------------------------------------
def stages_of(instance: str) -> list[list[int]]:
    """Devices per stage position (the replicas of each layer range) of the instance's layout."""
    from chameleon_opt.instance.load import load_instance

    plan = load_instance(INSTANCES[instance]).plan
    return [sorted(p.stages[s].devices[0] for p in plan.pipelines) for s in range(len(plan.pipelines[0].stages))]


def draw(rng: random.Random, seed: int, index: int, kind: str) -> Scenario:
    instance = rng.choice(sorted(INSTANCES))
    policy = "auto" if kind == "hybrid-switch" else rng.choice(POLICIES)
    stages = stages_of(instance)
    devices = sorted(d for stage in stages for d in stage)
    step = rng.randint(1, 3)
    scenario = Scenario(seed, index, kind, instance, policy, [])
    if kind == "single":
        scenario.kills = [(rng.choice(devices), rng.randint(1, 4))]
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
        after = replay(scenario).layouts
        alive = [d for d in devices if d != first]
        idle = sorted(set(alive) - set(after[0].devices)) if after else []
        target = rng.choice(idle) if idle else rng.choice(alive)
        if idle and (index // len(KINDS)) % 2 == 0:  # alternate between the two
            # inside that recovery's transition, where it has no work (at most it sends state)
            scenario.in_transition = [(target, step)]
            scenario.note = f"device {target} has no work in the first recovery's plan"
        else:
            scenario.kills.append((target, step + 1))
            scenario.note = f"device {target} {'idle' if idle else 'a survivor (none idle)'} after the first recovery"
    return scenario


def scenarios(seeds: list[int], per_seed: int) -> list[Scenario]:
    """`per_seed` scenarios per seed, cycling through every kind so each seed covers them all."""
    out = []
    for seed in seeds:
        rng = random.Random(seed)
        kinds = list(KINDS)
        rng.shuffle(kinds)
        out += [draw(rng, seed, i, kinds[i % len(kinds)]) for i in range(per_seed)]
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


def reference_losses(instance: str) -> list[float]:
    """Failure-free losses of the demo's configuration (float32, seed 0)."""
    from chameleon_opt.instance.load import load_instance
    from chameleon_opt.runtime.controller import run_training

    return run_training(load_instance(INSTANCES[instance]), STEPS, ()).losses


def run(scenario: Scenario, expected: Expected, reference: list[float], workdir: Path) -> dict[str, Any]:
    """Run the demo in its own session; judge exit code, output, losses, hang and leftovers."""
    command = [sys.executable, "-m", "chameleon_opt.cli", "demo", *scenario.args(), "--no-compare", "--json",
               "--plot", str(workdir / f"s{scenario.seed}-{scenario.index}.png"), "--force"]
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
    try:
        payload = json.loads(stdout) if stdout.strip() else {}
    except json.JSONDecodeError:
        payload = {}
        problems.append("stdout is not one JSON object")
    if code == 0 and payload:
        losses = payload["losses"]
        worst = max(abs(a - b) / abs(a) for a, b in zip(reference, losses))
        if len(losses) != STEPS or worst > 1e-5:
            problems.append(f"losses differ from failure-free: {worst:.2e} relative over {len(losses)} steps")
        if not all(payload["samples_exactly_once"]):
            problems.append(f"samples not exactly once: {payload['samples_exactly_once']}")
        if payload["replica_max_difference"] != 0.0:
            problems.append(f"replicas differ by {payload['replica_max_difference']:.2e}")
        if tuple(payload["dead"]) != expected.dead:
            problems.append(f"dead {payload['dead']}, planner expects {list(expected.dead)}")
        latencies = [r["kill_to_first_step_s"] for r in payload["recoveries"]]
    elif code == 5 and not ("layers " in payload.get("reason", "") and "lost every replica" in payload["reason"]):
        problems.append("exit 5 without the lost layers named")
    return {"scenario": scenario.label(), "args": scenario.args(), "expected_exit": expected.exit_code,
            "exit": code, "wall_s": wall, "recovery_latencies_s": latencies, "problems": problems}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--per-seed", type=int, default=18)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "kill_campaign.json")
    args = parser.parse_args()
    results = campaign(args.seeds, args.per_seed, print)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    sys.exit(0 if results["passed"] == results["scenarios"] else 1)


def campaign(seeds: list[int], per_seed: int, say: Any) -> dict[str, Any]:
    """Draw, replay and run every scenario; one line per scenario, then the summary line."""
    drawn = scenarios(seeds, per_seed)
    references: dict[str, list[float]] = {}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for scenario in drawn:
            expected = replay(scenario)
            if scenario.instance not in references:
                references[scenario.instance] = reference_losses(scenario.instance)
            row = run(scenario, expected, references[scenario.instance], Path(tmp))
            rows.append(row)
            verdict = "ok  " if not row["problems"] else "FAIL"
            say(f"{verdict} {row['scenario']}: exit {row['exit']} (planner {row['expected_exit']}), "
                f"{row['wall_s']:.1f} s" + "".join(f"\n     {p}" for p in row["problems"]))
    latencies = sorted(t for row in rows for t in row["recovery_latencies_s"])
    passed = sum(not row["problems"] for row in rows)
    summary = (f"kill campaign: {len(rows)} scenarios over {len(seeds)} seeds ({', '.join(map(str, seeds))}), "
               f"{passed} passed; exits: {sum(r['exit'] == 0 for r in rows)} x 0, {sum(r['exit'] == 5 for r in rows)} x 5, "
               f"{sum(r['exit'] not in (0, 5) for r in rows)} other; recovery latency (kill to next committed step) "
               f"over {len(latencies)} recoveries: median "
               + (f"{statistics.median(latencies) * 1e3:.0f} ms, worst {latencies[-1] * 1e3:.0f} ms" if latencies
                  else "n/a"))
    say(summary)
    return {"seeds": seeds, "scenarios": len(rows), "passed": passed, "summary": summary,
            "median_recovery_s": statistics.median(latencies) if latencies else None,
            "worst_recovery_s": latencies[-1] if latencies else None, "runs": rows}


if __name__ == "__main__":
    main()
