"""Predicted vs measured step time of the CPU runtime: failure-free, rerouted, reconfigured.

The workload is models/tiny-gpt-cpu.json (per-layer times measured on this machine by
`python -m chameleon_opt.runtime.profile`; re-profile on another machine), the network is measured
on loopback at the start, and the plan is PP2 x DP2 on 4 worker processes (one torch thread each).
For each policy, one worker is SIGKILLed in step `--kill-step`; the median step time of the
generation after the recovery is compared with the performance model's prediction for the plan
the planner chose, and post-recovery throughput is divided by failure-free throughput.

The performance model assumes one dedicated device per worker. With a core for every worker and
one for the controller (runtime/cores.py), each worker is pinned to its own core and predictions
are compared as they are; with fewer, workers share cores, predictions are scaled by workers /
cores (when above one), and the table says that its errors are an artefact of the sharing.
`--reprofile` measures the layers on this machine first (the bundled profile was measured on
another). The planner's own choice (`--policy auto`, Eq. 8) for the same failure is printed beside
the measured throughputs of rerouting and reconfiguring: the option it chose should be the one
that measured faster, or within the prediction error of it. The runtime
also pays a framework cost per pipeline send/receive (Python, gloo, waking a process that shares a
core) that the loopback network fit does not see: it is the model's one framework parameter,
`p2p_overhead_us`, fitted here as in bench/validate_perf.py, and every reported prediction is
leave-one-out (fitted on the two other runs only). The raw model (no fit, no core share) is shown too.

    .venv/bin/python bench/runtime_steps.py [--steps 14] [--kill-step 5] [--workers 4]
Writes bench/out/runtime_steps.json and bench/out/runtime_steps.png.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chameleon_opt.instance.load import build_instance  # noqa: E402
from chameleon_opt.perf.calibrate import calibrate  # noqa: E402
from chameleon_opt.perf.model import PerfModel  # noqa: E402
from chameleon_opt.runtime.controller import Failure, RunReport, run_training  # noqa: E402
from chameleon_opt.runtime.gpt import GPTConfig  # noqa: E402
from chameleon_opt.planning import PlanningOptions, plan_recovery  # noqa: E402
from chameleon_opt.runtime.cores import available_cores, dedicated_cores  # noqa: E402
from chameleon_opt.runtime.profile import (measure_network, profile_layers, runtime_instance,  # noqa: E402
                                           workload_spec)

OUT = ROOT / "bench" / "out"


def median_after(times: list[float], skip: int) -> float:
    kept = times[skip:] if len(times) > skip else times
    return statistics.median(kept)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--kill-step", type=int, default=5)
    parser.add_argument("--victim", type=int, default=1)
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--dp", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--reprofile", action="store_true", help="profile the layers on this machine first")
    args = parser.parse_args()
    console = Console(width=140)
    workers = args.pp * args.dp
    pinned = dedicated_cores(workers)
    cores = len(available_cores())
    with console.status("measuring the loopback network..."):
        network = measure_network()
    workload: Any = ROOT / "models" / "tiny-gpt-cpu.json"
    if args.reprofile:
        with console.status("profiling the layers on this machine..."):
            mask = os.sched_getaffinity(0)
            if pinned is not None:
                os.sched_setaffinity(0, {pinned[0]})
            workload = workload_spec(GPTConfig(), profile_layers(GPTConfig(), (args.micro_batch,), repeats=30))
            os.sched_setaffinity(0, mask)
    data = runtime_instance(GPTConfig(), workload, global_batch=args.global_batch,
                            micro_batch_size=args.micro_batch, network=network, pp=args.pp, dp=args.dp,
                            mtbf_hours_per_device=1.0, name="runtime-bench")
    instance = build_instance(data, "<runtime-bench>")
    runs: dict[str, RunReport] = {}
    # Bubble filling off: the leave-one-out fit re-prices each generation's plan with
    # PerfModel.evaluate, which prices a rerouting by its serial shares (Eq. 12/13), not by the
    # schedule model (solve/bubbles.py) a bubble-filled one is priced at.
    with console.status("failure-free run...") as status:
        runs["failure-free"] = run_training(instance, args.steps, cores=pinned, bubble_filling=False)
        for policy in ("reroute", "reconfigure"):
            status.update(f"{policy} run...")
            runs[policy] = run_training(instance, args.steps, (Failure(args.kill_step, (args.victim,), after_ops=2),),
                                        policy=policy, cores=pinned, bubble_filling=False)
    auto = plan_recovery(dataclasses.replace(instance, failed_devices=frozenset({args.victim})),
                         frozenset({args.victim}), PlanningOptions("auto", 5.0, bubble_filling=False))
    base = runs["failure-free"]
    cases = []
    for name, run in runs.items():
        gen = run.generations[-1]
        measured = median_after(gen.step_times_s, 2 if name == "failure-free" else 1)
        share = 1.0 if pinned is not None else max(1.0, (workers - len(run.dead)) / cores)
        cases.append((name, run, gen, measured, share))

    def predict(p2p_us: float) -> list[float]:
        fitted = json.loads(json.dumps(data))
        fitted["cluster"]["network"]["p2p_overhead_us"] = p2p_us
        model = PerfModel(build_instance(fitted, "<runtime-bench>"))
        return [model.evaluate(gen.plan, frozenset(run.dead)).iteration_time_s * share
                for _, run, gen, _, share in cases]

    fit = calibrate(predict, [c[3] for c in cases], [float(v) for v in range(0, 5001, 25)])
    rows = []
    for i, (name, run, gen, measured, share) in enumerate(cases):
        predicted = float(fit.loo_predictions[i])
        rows.append({"run": name, "policy": gen.policy, "workers": workers - len(run.dead),
                     "devices_in_plan": len(set(gen.plan.devices) - set(run.dead)),
                     "pipelines": len(gen.plan.pipelines), "raw_model_s": gen.predicted_step_s,
                     "core_share": share, "p2p_overhead_us_loo": float(fit.loo_values[i]),
                     "predicted_s": predicted, "measured_s": measured, "error": predicted / measured - 1,
                     "recovery": None if not run.recoveries else dataclasses.asdict(run.recoveries[0])})
    for r in rows:
        r["throughput_vs_failure_free"] = rows[0]["measured_s"] / r["measured_s"]
        r["predicted_throughput_vs_failure_free"] = rows[0]["predicted_s"] / r["predicted_s"]
    where = "a core per worker" if pinned is not None else "SHARED cores: errors are an artefact of the sharing"
    table = Table(title=f"CPU runtime, PP{args.pp} x DP{args.dp}, {workers} workers on {cores} cores ({where}), batch "
                        f"{args.global_batch}, micro-batch {args.micro_batch}; network {network}")
    for column in ("run", "plan", "raw model ms", "p2p us (LOO)", "predicted ms", "measured ms", "error",
                   "throughput / failure-free (pred.)"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(r["run"], f"{r['pipelines']}p/{r['devices_in_plan']}d", f"{r['raw_model_s'] * 1e3:.1f}",
                      f"{r['p2p_overhead_us_loo']:.0f}", f"{r['predicted_s'] * 1e3:.1f}", f"{r['measured_s'] * 1e3:.1f}",
                      f"{r['error']:+.1%}",
                      f"{r['throughput_vs_failure_free']:.3f} ({r['predicted_throughput_vs_failure_free']:.3f})")
    console.print(table)
    latency = Table(title="recovery latency: kill to first completed step")
    for column in ("run", "policy", "detect ms", "plan ms", "groups ms", "migrate ms", "first step ms", "total ms"):
        latency.add_column(column, justify="right")
    for r in rows:
        rec = r["recovery"]
        if rec:
            latency.add_row(r["run"], rec["policy"], *(f"{rec[k] * 1e3:.1f}" for k in
                            ("detection_s", "planning_s", "group_s", "migration_s", "first_step_s", "total_s")))
    console.print(latency)
    for name, run in runs.items():
        if name != "failure-free":
            worst = max(abs(a - b) / abs(a) for a, b in zip(base.losses, run.losses))
            console.print(f"{name}: losses vs failure-free, largest relative difference {worst:.2e}; "
                          f"every sample exactly once: {all(run.samples_exactly_once)}")
    measured = {r["run"]: r["measured_s"] for r in rows}
    faster = min(("reroute", "reconfigure"), key=lambda k: measured[k])
    slower = "reconfigure" if faster == "reroute" else "reroute"
    margin = measured[slower] / measured[faster] - 1
    ends_in = "reconfigure" if auto.policy == "hybrid" else auto.policy   # a hybrid ends reconfigured
    console.print(f"Eq. 8 (--policy auto) chose {auto.policy}; measured faster after the recovery: {faster} "
                  f"(by {margin:.1%}); " + ("agree" if ends_in == faster else
                                            "disagree" + (", within the prediction error" if margin <= max(
                                                abs(r["error"]) for r in rows) else "")))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "runtime_steps.json").write_text(json.dumps({"cores": cores, "dedicated_cores": pinned is not None,
                                                        "eq8_choice": auto.policy, "measured_faster": faster,
                                                        "network": str(network),
                                                        "p2p_overhead_us_all": fit.value, "rows": rows},
                                                       indent=2, default=float))
    plot(rows, OUT / "runtime_steps.png")
    console.print(f"wrote {OUT / 'runtime_steps.json'} and {OUT / 'runtime_steps.png'}")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    xs = range(len(rows))
    width = 0.27
    ax.bar([x - width for x in xs], [r["raw_model_s"] * 1e3 for r in rows], width, label="raw model")
    ax.bar(list(xs), [r["predicted_s"] * 1e3 for r in rows], width, label="predicted (core share, LOO p2p fit)")
    ax.bar([x + width for x in xs], [r["measured_s"] * 1e3 for r in rows], width, label="measured (median)")
    ax.set_xticks(list(xs), [r["run"] for r in rows])
    ax.set_ylabel("step time (ms)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
