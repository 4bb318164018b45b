"""`chameleon-solve demo --hf CONFIG`: the Hugging Face runtime (`runtime.pipelined`) on CPU
processes, with failures injected and recovered as `--policy` decides (reconfiguration, with TP
degree changes under `--tp-degrees`; rerouting, bubble-filled or by serial shares; the hybrid),
killed devices brought back (`--rejoin`); the failure-free losses are computed in this process
(one model, torch's AdamW) and compared step by step."""

from __future__ import annotations

import tempfile
from pathlib import Path

from chameleon_opt.console import emit_json, parse_kill, stdout
from chameleon_opt.errors import InputError
from chameleon_opt.instance.load import Instance
from chameleon_opt.incident import COMMAND_LINE

RESTORES = ("migration", "checkpoint", "verify")


def parse_layout(text: str) -> tuple[int, int, int]:
    """(PP, DP, TP) of a `PPxDPxTP` option value."""
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise InputError(COMMAND_LINE, "--hf-layout", f"{text!r} is not PPxDPxTP", "write e.g. 2x2x1 (4 processes)")
    pp, dp, tp = (int(p) for p in parts)
    return pp, dp, tp


def check_degrees(instance: Instance, degrees: tuple[int, ...]) -> None:
    """`--tp-degrees` the runtime can shard the model at (the planner's check, named as the option)."""
    from chameleon_opt.decision import check_tp_degrees

    try:
        check_tp_degrees(instance, degrees)
    except InputError as error:
        raise InputError(COMMAND_LINE, "--tp-degrees", error.problem, error.fix) from None


def hf_demo(config: Path, restore: str, steps: int, kill: list[str], seed: int, as_json: bool,
            kill_in_transition: list[str] = (), hang: list[str] = (), layout: str = "2x2x2",
            rejoin: list[str] = (), tp_degrees: tuple[int, ...] = (), policy: str = "auto",
            mtbf_hours: float | None = None) -> None:
    """PP x DP x TP (`layout`, default 2 x 2 x 2: 8 processes) training the config's model. Each
    `--kill DEVICE@STEP` SIGKILLs that worker after its stage's 2nd forward of the step (several
    may share a step), each `--hang` SIGSTOPs it there instead (found by the heartbeat watchdog),
    each `--kill-in-transition` kills it inside the first recovery (or hybrid switch) at or after
    STEP; every failure is recovered as the planner decides under `policy`, and a failure that
    leaves some layer without a live copy ends with exit 5 naming the layers. Each `--rejoin DEVICE@STEP` brings a device killed (or hung) before
    STEP back before it as a fresh worker: the planner decides its return and the next generation
    gives it its state. `--tp-degrees` lets a recovery change the TP degree (restored from the
    checkpoint saved after every step). `--restore checkpoint` runs the job twice, by planned migration
    and by a torch.distributed.checkpoint re-shard, and prints both recovery latencies (kill to
    next committed step); `verify` migrates and checks against the checkpoint. `mtbf_hours` (per
    device) is the time to the next fault that policy auto weighs: without it auto compares steady
    throughputs, where the hybrid never wins."""
    from rich.table import Table

    from chameleon_opt.runtime.controller import Failure, Rejoin
    from chameleon_opt.runtime.pipelined import PipelinedController, reference_losses, runtime_instance

    if restore not in RESTORES:
        raise InputError(COMMAND_LINE, "--restore", f"unknown restore {restore!r}", "use migration, checkpoint or verify")
    pp, dp, tp = parse_layout(layout)
    instance = runtime_instance(config, pipeline_parallel=pp, data_parallel=dp, tensor_parallel=tp,
                                mtbf_hours=mtbf_hours)
    check_degrees(instance, tp_degrees)
    failures: list[Failure] = []
    for option, values in (("--kill", kill), ("--hang", hang), ("--kill-in-transition", kill_in_transition)):
        for device, step in (parse_kill(k, option) for k in values):
            if device not in instance.plan.devices or step >= steps:
                raise InputError(COMMAND_LINE, option, f"{device}@{step} is not a device and step of the job",
                                 f"use devices 0..{instance.num_devices - 1} and steps below {steps}")
            failures.append(Failure(step, (device,), after_ops=2, hang=option == "--hang",
                                    in_transition=option == "--kill-in-transition"))
    rejoins: list[Rejoin] = []
    for device, step in (parse_kill(r, "--rejoin") for r in rejoin):
        if not any(f.devices == (device,) and f.step < step and not f.in_transition for f in failures) \
                or step >= steps:
            raise InputError(COMMAND_LINE, "--rejoin", f"device {device} is not killed (--kill or --hang) before step "
                             f"{step}, or {step} is not before --steps {steps}", "bring back a killed device in a "
                             "later step")
        rejoins.append(Rejoin(step, (device,)))
    expected = reference_losses(instance, config, steps, seed)
    runs = ["migration", "checkpoint"] if restore == "checkpoint" else [restore]
    results = {}
    for mode in runs:
        with tempfile.TemporaryDirectory(prefix="chameleon-dcp-") as folder:
            # a TP change is restored from the checkpoint, so with --tp-degrees every step saves one
            report = PipelinedController(instance, config, seed=seed, restore=mode, tp_degrees=tp_degrees,
                                         policy=policy,
                                         checkpoint_dir=None if mode == "migration" and not tp_degrees else folder
                                         ).run(steps, failures, rejoins)
        deviation = max(abs(a - b) / abs(b) for a, b in zip(report.losses, expected))
        results[mode] = (report, deviation)
    shape = f"PP{pp} x DP{dp} x TP{tp} on {instance.num_devices} processes"
    if as_json:
        emit_json({"format": 1, "model": str(config), "layout": shape, "expected_losses": expected, "runs": {
            mode: {"losses": r.losses, "samples_exactly_once": r.samples_exactly_once, "loss_deviation": dev,
                   "dead": list(r.dead), "checkpoint_save_s": r.checkpoint_save_s,
                   "heartbeat_longest_s": r.heartbeat_longest_s,
                   "reliefs": [{str(d): name for d, name in ran.items()} for ran in r.reliefs],
                   "recoveries": [{"step": x.step, "dead": list(x.dead), "hung": list(x.hung), "policy": x.policy,
                                   "schedule": x.schedule, "switched_before_step": x.switched_before_step,
                                   "detection_s": x.detection_s, "planning_s": x.planning_s, "group_s": x.group_s,
                                   "build_s": x.build_s, "restore_s": x.restore_s, "first_step_s": x.first_step_s,
                                   "total_s": x.total_s, "aborted_transitions": x.aborted_transitions,
                                   "plan": x.plan.to_json() if x.plan else None, "restore": x.restore,
                                   "tensor_parallel": list(x.tensor_parallel) if x.tensor_parallel else None,
                                   "reliefs": {str(d): name for d, name in x.reliefs.items()}}
                                  for x in r.recoveries],
                   "rejoins": [{"step": x.step, "devices": list(x.devices), "policy": x.policy, "reason": x.reason,
                                "restore": x.restore, "planning_s": x.planning_s, "group_s": x.group_s,
                                "build_s": x.build_s, "restore_s": x.restore_s, "first_step_s": x.first_step_s,
                                "total_s": x.total_s, "aborted": x.aborted,
                                "plan": x.plan.to_json() if x.plan else None} for x in r.rejoins]}
            for mode, (r, dev) in results.items()}})
        return
    table = Table(title=f"{config}: recovery (kill to next committed step), {shape}")
    for column in ("restore", "step", "dead", "policy", "schedule", "detect ms", "plan ms", "groups ms", "build ms",
                   "restore ms", "first step ms", "total ms"):
        table.add_column(column, justify="right")
    for mode, (r, _) in results.items():
        for x in r.recoveries:
            table.add_row(mode, str(x.step), str(list(x.dead)), x.policy, x.schedule, *(f"{v * 1e3:.0f}" for v in (
                x.detection_s, x.planning_s, x.group_s, x.build_s, x.restore_s, x.first_step_s, x.total_s)))
    stdout.print(table)
    for mode, (r, _) in results.items():
        for x in r.rejoins:
            admitted = "aborted by a failure in its transition" if x.aborted else (
                f"admitted in {x.total_s * 1e3:.0f} ms to the next committed step (plan {x.planning_s * 1e3:.0f}, "
                f"groups {x.group_s * 1e3:.0f}, build {x.build_s * 1e3:.0f}, {x.restore} {x.restore_s * 1e3:.0f} ms)"
                if x.policy != "keep-running" else "kept out")
            stdout.print(f"{mode}: devices {list(x.devices)} back before step {x.step}: {x.policy}, {admitted}")
    for mode, (r, dev) in results.items():
        save = f"; checkpoint save per step {sum(r.checkpoint_save_s) / len(r.checkpoint_save_s) * 1e3:.0f} ms" \
            if r.checkpoint_save_s else ""
        stdout.print(f"{mode}: {len(r.losses)} steps, every sample once: {all(r.samples_exactly_once)}, largest loss "
                     f"difference from failure-free training {dev:.1e} (relative){save}")
