"""Predicted vs measured step time of the Hugging Face runtime, each worker on a core of its own.

For each model family (a Llama-style and a GPT-2-style config in bench/data/, large enough that
compute, not Python, dominates a step) the HF runtime's stages are profiled on this machine with
one thread (`runtime.profile.profile_hf_layers`), the loopback network is measured, and for each
PP x DP layout one job runs `--steps` global batches with one worker SIGKILLed in `--kill-step`:
the median step before the kill is the failure-free step, the median after the recovery (the
planner's reconfiguration over the survivors, executed with torch pipelining) the reconfigured
step. Each is compared with the performance model's prediction for the plan that ran.

The gradient all-reduce is priced from its own measurement (`runtime.profile.measure_allreduce`:
the runtime's bucket all-reduce in W gloo processes on cores of their own, one ring fitted over
every data-parallel degree the layouts run), not as a ring over the point-to-point fit. The model's
one fitted framework parameter, `p2p_overhead_us` (Python, gloo and the pipelining schedule per
send or receive, which the loopback fit does not see), is fitted leave-one-family-out: the Llama
runs are predicted with the value fitted on the GPT-2 runs and the other way round (0 with one
family). The raw model (no overhead) is shown too, and the model with a measured overhead instead:
the CPU gloo's threads spend per boundary-sized message in the ping-pong (`NetworkFit.helper_cpu_s`),
which a worker's one core takes from its stage's compute.

Every step runs with the runtime's phase timers (`runtime/phases.py`): each case's phases per rank
(median over its measured steps) are written beside it, so a step is explained phase by phase:
forward and backward chunks (against the profile's compute), the loss, the schedule's own work,
the gradient all-reduce, the commit (optimizer step), the waiting (wall minus the step thread's
CPU) and the CPU of the process's other threads (gloo's).

`--no-kill` measures failure-free steps only: a layout of one worker (1x1) then runs on a 2-core
machine with a core of its own (the controller keeps the other).

The model prices one device per worker, so every worker is pinned to a core of its own (the
controller keeps one more); with too few cores the bench measures but refuses to report errors,
and so it does for a case where another process took a worker's core for more than 5% of its step
(the step thread's run-queue wait beyond its own process's other threads' CPU, Linux schedstat:
the 'foreign' phase; a shared machine's other jobs).
A core is slower while its neighbours work (shared caches and memory bandwidth, all-core clock
limits): a job of W workers is therefore priced with a profile taken in W pinned processes at
once (the median of their per-layer times, `loaded_profile`), and the profile of one core alone
is shown beside it. The same processes measure how much slower a stage computes than its layers
timed alone (`runtime.profile.stage_compute_ratio` over even splits into 1-5 stages: layers
repeated alone keep their weights in cache, a stage's layers evict each other's), which the
device type carries as `stage_scaling`, and the pipelining schedule's own work per forward or
backward (`runtime.profile.measure_schedule_overhead`: `network.schedule_overhead_us`).

    .venv/bin/python bench/runtime_steps_hf.py [--layouts 2x2,4x2,2x4,4x3] [--steps 14] [--out DIR]
    .venv/bin/python bench/runtime_steps_hf.py --layouts 1x1 --no-kill --steps 8   # a 2-core machine
Writes DIR/runtime_steps_hf.json and DIR/runtime_steps_hf.png (DIR: bench/out).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

FAMILIES = {"llama": ROOT / "bench" / "data" / "bench-llama.json", "gpt2": ROOT / "bench" / "data" / "bench-gpt2.json"}
SKIP = 2   # steps of a generation not measured: the first builds the schedule (shape inference)
FOREIGN_SHARE = 0.05   # a rank kept off its core by other processes this share of its step: no error reported


@dataclasses.dataclass
class Case:
    """One measured plan: the job it belongs to and what it ran."""

    family: str
    layout: str
    run: str                 # failure-free | reconfigured
    instance: Any            # priced with the loaded profile (W workers at once)
    alone: Any               # the same job priced with the profile of one core alone
    plan: Any
    dead: frozenset[int]
    measured_s: float
    samples: int
    phases: dict[int, dict[str, dict[str, float]]]   # device -> phase -> median wall_s, cpu_s, calls


def stage_ranges(layers: int, most_stages: int = 5) -> list[tuple[int, int]]:
    """The stages of even splits into 1..most_stages stages (what the layouts and their
    reconfigurations run): `stage_compute_ratio`'s ranges, from a tenth of the model to all of it."""
    ranges = []
    for stages in range(1, most_stages + 1):
        sizes = [layers // stages + (1 if i < layers % stages else 0) for i in range(stages)]
        ranges += [(sum(sizes[:i]), sum(sizes[:i + 1])) for i in range(stages)]
    return sorted(set(ranges))


def _profile_on(core: int, config: str, seq_len: int, mbs: int, repeats: int, out: Any) -> None:
    """One of `loaded_profile`'s processes: pinned to `core`, it profiles the layers, the stages'
    compute ratios and the schedule's overhead per operation, and sends them."""
    import torch

    from chameleon_opt.runtime import hf
    from chameleon_opt.runtime.profile import measure_schedule_overhead, profile_hf_layers, stage_compute_ratio

    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    profile = profile_hf_layers(config, seq_len, (mbs,), repeats=repeats, dtype=torch.float32)
    ranges = stage_ranges(hf.num_blocks(hf.load_config(config)) + 2)
    out.put((profile, stage_compute_ratio(config, seq_len, ranges, mbs, rounds=3),
             measure_schedule_overhead(config, seq_len, mbs)))


def loaded_profile(config: Path, seq_len: int, mbs: int, repeats: int, cores: list[int]
                   ) -> tuple[Any, list[Any], float]:
    """The per-layer profile of a core while every core of `cores` runs the same profile: the
    element-wise median over the processes (each pinned to one of them); and the stage scaling
    points (a stage's parameter bytes, its compute over its layers' sum: the median over the
    processes) for the device type (`runtime_instance(stage_scaling=)`), and the schedule's own
    work per operation (seconds, the median: `network.schedule_overhead_us`)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_profile_on, args=(core, str(config), seq_len, mbs, repeats, out)) for core in cores]
    for proc in procs:
        proc.start()
    got = [out.get(timeout=900) for _ in procs]
    for proc in procs:
        proc.join()
    profiles = [profile for profile, _, _ in got]

    def median(rows: list[tuple[float, ...]]) -> tuple[float, ...]:
        return tuple(statistics.median(column) for column in zip(*rows))

    first = profiles[0]
    scaling = [(4.0 * sum(first.params[a:b]), statistics.median(ratios[(a, b)] for _, ratios, _ in got))
               for a, b in got[0][1]]
    return dataclasses.replace(first, forward_s={mbs: median([p.forward_s[mbs] for p in profiles])},
                               backward_s={mbs: median([p.backward_s[mbs] for p in profiles])},
                               update_s=median([p.update_s for p in profiles])), scaling, \
        statistics.median(overhead for _, _, overhead in got)


def parse_layouts(text: str) -> list[tuple[int, int]]:
    layouts = []
    for part in text.split(","):
        pp, _, dp = part.lower().partition("x")
        if not (pp.isdigit() and dp.isdigit()) or int(pp) < 1 or int(dp) < 1:
            raise SystemExit(f"error: --layouts: {part!r} is not PPxDP (e.g. 2x2,4x2)")
        layouts.append((int(pp), int(dp)))
    return layouts


def shape(plan: Any) -> str:
    """Pipelines as 'layer ranges x micro-batches', e.g. '[0,5)[5,10) x12 | [0,10) x12'."""
    return " | ".join("".join(f"[{s.first},{s.end})" for s in p.stages) + f" x{p.micro_batches}"
                      for p in plan.pipelines)


def estimate(case: Case, p2p_us: float, alone: bool = False, collective: bool = True) -> Any:
    """The model's estimate for the case's plan with `p2p_us` framework cost per send or receive
    (with the one-core-alone profile when `alone`; without the measured all-reduce, a ring over the
    point-to-point fit as before, unless `collective`)."""
    from chameleon_opt.perf.model import PerfModel

    priced = case.alone if alone else case.instance
    cluster = priced.spec.cluster
    update: dict[str, Any] = {"p2p_overhead_us": p2p_us}
    if not collective:
        update.update(collective_gbps=None, collective_latency_us=None)
    network = cluster.network.model_copy(update=update)
    spec = priced.spec.model_copy(update={"cluster": cluster.model_copy(update={"network": network})})
    return PerfModel(dataclasses.replace(priced, spec=spec)).evaluate(case.plan, case.dead)


def predict(case: Case, p2p_us: float, alone: bool = False, collective: bool = True) -> float:
    return estimate(case, p2p_us, alone, collective).iteration_time_s


def phases_of(steps: list[dict[int, dict[str, dict[str, float]]]], table: Any) -> dict[int, dict[str, dict[str, float]]]:
    """Device -> its phases' medians over `steps` (`runtime.phases.phase_table`)."""
    devices = sorted({d for step in steps for d in step})
    return {d: table([step[d] for step in steps if d in step]) for d in devices}


def decomposition(phases: dict[str, dict[str, float]]) -> dict[str, float]:
    """One rank's step, phase by phase (seconds): the chunks' compute (thread CPU), the schedule's
    own work, the all-reduce and commit (wall), waiting (the step's wall beyond its CPU) and the
    CPU of the process's other threads (gloo's)."""
    def get(name: str, key: str) -> float:
        return phases.get(name, {}).get(key, 0.0)

    compute = get("forward", "cpu_s") + get("backward", "cpu_s") + get("loss", "cpu_s")
    return {"forward_cpu": get("forward", "cpu_s"), "backward_cpu": get("backward", "cpu_s"),
            "loss_cpu": get("loss", "cpu_s"), "schedule_own_cpu": get("schedule", "cpu_s") - compute,
            "allreduce": get("allreduce", "wall_s"), "commit": get("commit", "wall_s"),
            "waiting": get("step", "wall_s") - get("step", "cpu_s"),
            "other_threads_cpu": get("process", "cpu_s") - get("step", "cpu_s"),
            "kernel_cpu": get("kernel", "cpu_s"), "page_faults": get("kernel", "calls"),
            # the step thread kept off its core beyond its own process's other threads: other processes
            "foreign": max(get("runqueue", "wall_s") - (get("process", "cpu_s") - get("step", "cpu_s")), 0.0),
            "step": get("dispatch", "wall_s") + get("step", "wall_s") + get("commit", "wall_s"),
            "micro_batches": get("forward", "calls")}


def fit_overhead(cases: list[Case], grid: list[float]) -> float:
    """The p2p overhead minimising the squared relative errors of `cases`."""
    def loss(value: float) -> float:
        return sum((predict(c, value) / c.measured_s - 1) ** 2 for c in cases)
    return min(grid, key=loss)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default="llama,gpt2", help="comma-separated, of: " + ", ".join(FAMILIES))
    parser.add_argument("--layouts", default="2x2,4x2,2x4,4x3", help="PPxDP layouts, comma-separated")
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--kill-step", type=int, default=6)
    parser.add_argument("--no-kill", action="store_true", help="failure-free steps only (no kill, no recovery)")
    parser.add_argument("--victim", type=int, default=1)
    parser.add_argument("--global-batch", type=int, default=24)
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20, help="profile: timed runs per layer (median)")
    parser.add_argument("--relieved", default="", help="also run these layouts with full recomputation (the "
                        "relief checkpoints every block), e.g. 2x4")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = parser.parse_args()
    families = [f for f in args.families.split(",") if f]
    if unknown := [f for f in families if f not in FAMILIES]:
        raise SystemExit(f"error: --families: unknown {unknown}; use {', '.join(FAMILIES)}")
    jobs = [(pp, dp, None) for pp, dp in parse_layouts(args.layouts)]
    jobs += [(pp, dp, "full") for pp, dp in (parse_layouts(args.relieved) if args.relieved else [])]
    layouts = [(pp, dp) for pp, dp, _ in jobs]
    if args.no_kill:
        args.kill_step = args.steps
        if args.steps <= SKIP:
            raise SystemExit(f"error: --steps must be above {SKIP} (the unmeasured first steps)")
    elif not SKIP < args.kill_step < args.steps - SKIP:
        raise SystemExit(f"error: --kill-step must leave {SKIP} + 1 steps before and after it")

    import torch

    from chameleon_opt.runtime.controller import Failure
    from chameleon_opt.runtime.cores import available_cores, dedicated_cores
    from chameleon_opt.runtime.pipelined import PipelinedController, reference_losses, runtime_instance
    from chameleon_opt.runtime.phases import phase_table
    from chameleon_opt.runtime.profile import hf_workload_spec, measure_allreduce, measure_network, profile_hf_layers

    console = Console(width=150)
    workers = max(pp * dp for pp, dp in layouts)
    cores = dedicated_cores(workers)
    if cores is None:
        console.print(f"[bold red]{len(available_cores())} cores for {workers} workers and the controller: workers "
                      "would share cores, so no prediction error is reported (measured times only)[/]")
    with console.status("measuring the loopback network..."):
        link = measure_network()
        network = link.network()
    worlds = sorted({dp for _, dp, _ in jobs if dp > 1} | ({2} if not args.no_kill else set()))
    collective = None
    if worlds and (cores is None or len(cores) >= max(worlds)):
        with console.status(f"measuring the gradient all-reduce among {worlds} processes..."):
            collective = measure_allreduce(tuple(worlds), cores=cores)
        network.update(collective.network())
    console.print(f"network: {network}")
    cases: list[Case] = []
    checks: list[dict[str, Any]] = []
    measured_p2p: dict[str, float] = {}   # gloo threads' CPU per boundary message (measure_network)
    for family in families:
        config = FAMILIES[family]
        with console.status(f"profiling {family} on one core..."):
            if cores is not None:   # the profile on a core of its own too, as the workers run
                mask = os.sched_getaffinity(0)
                os.sched_setaffinity(0, {cores[0]})
            profile = profile_hf_layers(config, args.seq_len, (args.micro_batch,), repeats=args.repeats,
                                        dtype=torch.float32)
            if cores is not None:
                os.sched_setaffinity(0, mask)
        spec = hf_workload_spec(config, profile, args.seq_len)
        measured_p2p[family] = link.helper_cpu_at(spec.layer_bytes.boundary_bytes_per_sample[1] * args.micro_batch) * 1e6
        loaded_specs: dict[int, tuple[Any, list[Any], float]] = {}
        expected: list[float] | None = None
        for pp, dp, recompute in jobs:
            name = f"PP{pp} x DP{dp}" + (f", {recompute} recompute" if recompute else "")
            job = dict(global_batch=args.global_batch, micro_batch_size=args.micro_batch, sequence_length=args.seq_len,
                       network=network, recompute=recompute)
            alone = runtime_instance(config, pp, dp, 1, measured=spec, **job)
            instance = alone
            if cores is not None:
                if pp * dp not in loaded_specs:
                    with console.status(f"profiling {family} on {pp * dp} cores at once..."):
                        loaded, scaling, overhead = loaded_profile(config, args.seq_len, args.micro_batch,
                                                                   args.repeats, cores[:pp * dp])
                        loaded_specs[pp * dp] = (hf_workload_spec(config, loaded, args.seq_len), scaling, overhead)
                    console.print(f"{family}, {pp * dp} cores: schedule overhead {overhead * 1e6:.0f} us per operation; "
                                  "stage compute over its layers' sum by stage bytes: "
                                  + ", ".join(f"{b / 1e6:.1f} MB x{r:.2f}" for b, r in sorted(scaling)))
                spec_w, scaling, overhead = loaded_specs[pp * dp]
                instance = runtime_instance(config, pp, dp, 1, measured=spec_w, stage_scaling=scaling,
                                            **{**job, "network": {**network, "schedule_overhead_us": overhead * 1e6}})
            with console.status(f"{family} {name}: {args.steps} steps, device {args.victim} killed in step "
                                f"{args.kill_step}..."):
                started = time.perf_counter()
                report = PipelinedController(instance, config, dtype="float32", cores=cores,
                                             step_timeout_s=30.0, phase_timers=True).run(
                    args.steps, [] if args.no_kill else [Failure(args.kill_step, (args.victim,), after_ops=2)])
                wall = time.perf_counter() - started
            times = report.step_times_s
            cases.append(Case(family, name, "failure-free", instance, alone, instance.plan, frozenset(),
                              statistics.median(times[SKIP:args.kill_step]), args.kill_step - SKIP,
                              phases_of(report.phases[SKIP:args.kill_step], phase_table)))
            recovery = report.recoveries[0] if report.recoveries else None
            dead = frozenset(recovery.dead) if recovery is not None else frozenset()
            if recovery is not None:
                cases.append(Case(family, name, "reconfigured", instance, alone, recovery.plan, dead,
                                  statistics.median(times[args.kill_step + SKIP:]), args.steps - args.kill_step - SKIP,
                                  phases_of(report.phases[args.kill_step + SKIP:], phase_table)))
            if expected is None:   # the same batches and model for every layout of the family
                expected = reference_losses(instance, config, args.steps, dtype="float32")
            checks.append({"family": family, "layout": name, "wall_s": wall,
                           "recovery_total_s": None if recovery is None else recovery.total_s,
                           "every_sample_once": all(report.samples_exactly_once),
                           "loss_deviation": max(abs(a - b) / abs(b) for a, b in zip(report.losses, expected)),
                           "reconfigured_plan": None if recovery is None else shape(recovery.plan),
                           "reliefs_ran": sorted({r for plan in report.reliefs for r in plan.values()}),
                           "load_average": os.getloadavg()})
            args.out.mkdir(parents=True, exist_ok=True)
            with (args.out / "runtime_steps_hf.runs.jsonl").open("a") as log:   # kept if a later run is cut off
                log.write(json.dumps({**checks[-1], "step_times_s": times, "kill_step": args.kill_step,
                                      "dead": sorted(dead)}) + "\n")
            ran = [c for c in cases if c.family == family and c.layout == name]
            console.print(f"{family} {name}: {wall:.1f} s, " + ", ".join(f"{c.run} {c.measured_s * 1e3:.1f} ms"
                                                                         for c in ran)
                          + f", every sample once {checks[-1]['every_sample_once']}, loss deviation "
                          f"{checks[-1]['loss_deviation']:.1e}, load {os.getloadavg()[0]:.2f}")

    grid = [float(v) for v in range(0, 10001, 20)]
    fitted = {f: fit_overhead([c for c in cases if c.family != f], grid) if len(families) > 1 else 0.0
              for f in families}
    rows = []
    for c in cases:
        overhead = fitted[c.family]
        model = estimate(c, overhead)
        predicted = model.iteration_time_s
        ranks = {d: decomposition(p) for d, p in c.phases.items()}
        shared = [d for d, parts in ranks.items() if parts["foreign"] > FOREIGN_SHARE * parts["step"]]
        rows.append({"family": c.family, "layout": c.layout, "run": c.run, "devices": len(set(c.plan.devices) - c.dead),
                     "pipelines": len(c.plan.pipelines), "samples": c.samples, "measured_s": c.measured_s,
                     "raw_model_s": predict(c, 0.0), "raw_model_alone_s": predict(c, 0.0, alone=True),
                     "raw_model_p2p_ring_s": predict(c, 0.0, collective=False),
                     "stage_scaling": [list(point) for point in c.instance.device_types[0].stage_scaling],
                     "p2p_overhead_us": overhead, "predicted_s": predicted,
                     "p2p_measured_us": measured_p2p[c.family],
                     "predicted_measured_p2p_s": predict(c, measured_p2p[c.family]),
                     "model_breakdown_s": model.breakdown_s, "phases_by_device": ranks,
                     "shared_with_other_processes": shared,
                     "error": None if cores is None or shared else predicted / c.measured_s - 1})
        rows[-1]["error_measured_p2p"] = None if rows[-1]["error"] is None else \
            rows[-1]["predicted_measured_p2p_s"] / c.measured_s - 1
    table = Table(title=f"HF runtime, predicted vs measured step ({'a core per worker' if cores else 'SHARED cores'}; "
                        f"batch {args.global_batch}, micro-batch {args.micro_batch}, {args.seq_len} tokens, float32; "
                        "p2p overhead fitted on the other family)")
    for column in ("family", "layout", "run", "plan", "raw, 1 core alone ms", "raw, p2p ring ms", "raw ms", "p2p us",
                   "predicted ms", "measured ms", "error"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(r["family"], r["layout"], r["run"], f"{r['pipelines']}p/{r['devices']}d",
                      f"{r['raw_model_alone_s'] * 1e3:.1f}", f"{r['raw_model_p2p_ring_s'] * 1e3:.1f}",
                      f"{r['raw_model_s'] * 1e3:.1f}",
                      "-" if r["p2p_overhead_us"] is None else f"{r['p2p_overhead_us']:.0f}",
                      "-" if r["predicted_s"] is None else f"{r['predicted_s'] * 1e3:.1f}",
                      f"{r['measured_s'] * 1e3:.1f}",
                      "shared" if r["shared_with_other_processes"] else "n/a" if r["error"] is None
                      else f"{r['error']:+.1%}")
    console.print(table)
    console.print(phase_rows(rows))
    errors = [abs(r["error"]) for r in rows if r["error"] is not None]
    summary = None
    if errors:
        measured = [abs(r["error_measured_p2p"]) for r in rows if r["error_measured_p2p"] is not None]
        summary = {"cases": len(errors), "median_abs_error": statistics.median(errors), "worst_abs_error": max(errors),
                   "measured_p2p_median_abs_error": statistics.median(measured),
                   "measured_p2p_worst_abs_error": max(measured)}
        console.print(f"{len(errors)} cases: median |error| {summary['median_abs_error']:.1%}, "
                      f"worst {summary['worst_abs_error']:.1%} (p2p overhead fitted on the other family); with the "
                      f"measured p2p overhead ({', '.join(f'{f} {v:.0f} us' for f, v in measured_p2p.items())}): "
                      f"median {summary['measured_p2p_median_abs_error']:.1%}, "
                      f"worst {summary['measured_p2p_worst_abs_error']:.1%}")
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": available_cores(),
                          "torch": torch.__version__, "python": platform.python_version()},
              "dedicated_cores": cores is not None, "network": network,
              "allreduce_points": None if collective is None else collective.points,
              "args": {k: str(v) for k, v in vars(args).items()},
              "rows": rows, "summary": summary, "runs": checks}
    (args.out / "runtime_steps_hf.json").write_text(json.dumps(result, indent=2, default=float))
    plot(rows, args.out / "runtime_steps_hf.png")
    console.print(f"wrote {args.out / 'runtime_steps_hf.json'} and {args.out / 'runtime_steps_hf.png'}")
    return 0


def phase_rows(rows: list[dict[str, Any]]) -> Any:
    """Each case's step phase by phase on its busiest rank (most compute), beside the model's parts."""
    table = Table(title="measured phases on the busiest rank (median step, ms; CPU of the step thread unless wall) "
                        "| the model's parts")
    columns = ("forward_cpu", "backward_cpu", "loss_cpu", "schedule_own_cpu", "allreduce", "commit", "waiting",
               "other_threads_cpu", "kernel_cpu", "foreign", "step")
    for column in ("case", "rank", "mb", *columns, "| compute", "bubble", "p2p", "dp", "opt"):
        table.add_column(column, justify="right")
    for r in rows:
        if not r["phases_by_device"]:
            continue
        device, phases = max(r["phases_by_device"].items(),
                             key=lambda item: item[1]["forward_cpu"] + item[1]["backward_cpu"] + item[1]["loss_cpu"])
        model = r["model_breakdown_s"]
        table.add_row(f"{r['family']} {r['layout']} {r['run']}", str(device), f"{phases['micro_batches']:.0f}",
                      *(f"{phases[c] * 1e3:.1f}" for c in columns),
                      *(f"{model.get(k, 0.0) * 1e3:.1f}" for k in ("compute", "pipeline_bubble", "p2p", "data_parallel",
                                                                  "optimizer")))
    return table


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Predicted against measured, one point per case, the diagonal and +-10% / 20% bands."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5))
    top = max(max(r["measured_s"], r["predicted_s"] or 0.0, r["raw_model_s"]) for r in rows) * 1.1e3
    for band, style in ((0.1, ":"), (0.2, "--")):
        ax.plot([0, top], [0, top * (1 + band)], "k" + style, lw=0.7)
        ax.plot([0, top], [0, top * (1 - band)], "k" + style, lw=0.7, label=f"±{band:.0%}")
    ax.plot([0, top], [0, top], "k-", lw=0.8)
    for family, marker in (("llama", "o"), ("gpt2", "s")):
        for run, colour in (("failure-free", "tab:blue"), ("reconfigured", "tab:orange")):
            picked = [r for r in rows if r["family"] == family and r["run"] == run and r["predicted_s"] is not None]
            ax.scatter([r["measured_s"] * 1e3 for r in picked], [r["predicted_s"] * 1e3 for r in picked],
                       marker=marker, color=colour, label=f"{family}, {run}")
            ax.scatter([r["measured_s"] * 1e3 for r in picked], [r["raw_model_s"] * 1e3 for r in picked],
                       marker=marker, facecolors="none", edgecolors=colour, alpha=0.5)
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("measured step (ms)")
    ax.set_ylabel("predicted step (ms); hollow: raw model")
    ax.set_title("HF runtime: predicted vs measured")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
