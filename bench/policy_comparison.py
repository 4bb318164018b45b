"""Recovery policies compared on failure traces: the paper's 32-GPU comparison, then at scale.

Part 1 (the paper's kind of comparison): a 32-GPU cluster (4 nodes x 8 A100-40, as
instances/paper-32.json) with three workloads, each on a regular DP x PP x TP layout that fits;
deterministic traces with k = 1..4 single-GPU failures 30 min apart (horizon 3 h), and seeded
synthetic traces (per-GPU MTBF 32 h, i.e. a failure an hour on the cluster, horizon 4 h). For
every trace: average throughput per policy; the adaptive policy over Oobleck-style and over
ReCycle-style (the paper: up to 1.229x and 1.355x); its post-recovery throughput against
failure-free training (the paper: within 11%) and against the survivors' ideal share
(failure-free x live devices / devices).

Part 2 (scale, published failure rates, plan search time counted in the transition): GPT-3 175B
on 1024 A100-80 (instances/gpt3-175b-1024.json) under the OPT-175B rate (about 2 machines a day
on 128 nodes) and the Llama 3 rate, 7 days; a Llama-3-405B-sized job on 16,384 H100
(instances/llama3-405b-16k.json) under the Llama 3 rate (419 interruptions in 54 days). Failed
machines come back after `--repair-hours`. The 16k horizon is shortened to `--days-16k` (default 2
days, ~16 failures instead of 419) to keep the run within minutes: every failure there costs a
plan search (~2 s) and a migration schedule (~4 s) per policy that re-plans.

Start plan (every policy starts from it): the fastest uniform pipelined plan, i.e. the best of the
regular DP x PP layouts (PP >= 2, even layers) and the search's failure-free plan when that is
uniform (ReCycle needs same-stage peers). Gaps are measured against the best failure-free plan
known (that plan, or the search's plan on all devices when faster): the instance files' layouts
are slower than what the search finds even on fewer devices, so "failure-free" must mean the best.

Each policy's D estimate (Chameleon's expected-score form, the paper's point D) reads the per-GPU
MTBF of the trace (for the deterministic traces: the 30 min spacing, i.e. 16 h per GPU).

Writes bench/out/policy_comparison.{json,md,png}.
Run: python bench/policy_comparison.py [--quick] [--skip-scale] [--time-limit 1] [--days-16k 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from chameleon_opt.instance.load import build_instance, load_instance, read_document
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.plan import Pipeline, Plan, Stage
from chameleon_opt.recovery.baselines import DecisionSource
from chameleon_opt.recovery.registry import make_policy
from chameleon_opt.solve.search import search_plan
from chameleon_opt.recovery.simulate import (SimulationResult, draw_timeline, fixed_trace,
                                             published_mtbf_hours_per_device, published_rate_trace, simulate,
                                             synthetic_trace, with_failure_rate)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
console = Console(width=200)

SMALL_POLICIES = ["chameleon", "chameleon-unguarded", "chameleon-paper", "hybrid", "oobleck", "recycle", "bamboo",
                  "checkpoint", "reroute-only", "reconfigure-only"]
SCALE_POLICIES = ["chameleon", "chameleon-unguarded", "chameleon-paper", "hybrid", "oobleck", "recycle", "bamboo",
                  "checkpoint"]

# name: (workload, sequence length, global batch, micro-batch size, TP, PP, DP of the file's layout);
# the layout actually run is `start_plan`'s (the fastest regular pipelined one)
WORKLOADS_32 = {
    "gpt3-1.7b": ("gpt3-1.7b", 2048, 512, 4, 1, 4, 8),
    "gpt3-7.5b": ("gpt3-7.5b", 2048, 512, 2, 2, 4, 4),
    "llama2-7b": ("llama2-7b", 4096, 256, 1, 2, 2, 8),
}
FAILED_SEQUENCE = [13, 5, 22, 30]  # different pipelines and stages on every layout above
SPACING_S = 1800.0
HORIZON_32_S = 3 * 3600.0
SYNTHETIC_MTBF_H = 32.0
SYNTHETIC_HORIZON_S = 4 * 3600.0


def instance_32(name: str):
    workload, seq, batch, micro, tp, pp, dp = WORKLOADS_32[name]
    data = read_document(ROOT / "instances" / "paper-32.json")
    data.update({"name": f"{name}-32", "description": f"{name} on 4 x 8 A100-40, TP {tp} x PP {pp} x DP {dp}",
                 "workload": {"model": workload},
                 "training": {"global_batch": batch, "micro_batch_size": micro, "sequence_length": seq,
                              "precision": "bf16", "activation_recomputation": False},
                 "plan": {"tensor_parallel": tp, "layout": {"pipeline_parallel": pp, "data_parallel": dp}},
                 "failures": {}})
    return build_instance(data, f"<{name}-32>")


def regular_layout(instance, pp: int) -> Plan | None:
    """DP x PP pipelines over the TP groups in device order, layers and micro-batches even."""
    tp, n = instance.plan.tensor_parallel, instance.workload.num_layers
    groups = instance.num_devices // tp
    dp = groups // pp
    total = instance.global_micro_batches
    if dp < 1 or pp > n or dp > total or groups % pp:
        return None
    base, extra = divmod(n, pp)
    bounds = [0]
    for s in range(pp):
        bounds.append(bounds[-1] + base + (1 if s >= pp - extra else 0))
    pipelines = []
    for j in range(dp):
        stages = tuple(Stage(tuple(range((j * pp + s) * tp, (j * pp + s + 1) * tp)), bounds[s], bounds[s + 1])
                       for s in range(pp))
        pipelines.append(Pipeline(stages, total // dp + (1 if j < total % dp else 0)))
    return Plan(tp, tuple(pipelines))


def pipelined(plan: Plan) -> bool:
    """At least two pipelines, each of at least two stages (the paper's DP x PP setting)."""
    return len(plan.pipelines) >= 2 and all(len(p.stages) >= 2 for p in plan.pipelines)


def start_plan(instance, time_limit: float):
    """(instance running its start plan, best failure-free step known).

    Start plan: the search's failure-free plan on all devices when it is pipelined, else the
    fastest regular DP x PP layout with PP >= 2 and DP >= 2 (even layers); every policy starts from
    it. The best failure-free step known (the reference of `gap vs best`) is the faster of that
    plan and the search's plan."""
    model = PerfModel(instance)
    searched = search_plan(instance, frozenset(), time_limit, 1, 0, model).solution
    candidates = [p for pp in range(2, instance.workload.num_layers + 1)
                  if (p := regular_layout(instance, pp)) is not None and len(p.pipelines) >= 2]
    if instance.plan.pipelines and pipelined(instance.plan):
        candidates.append(instance.plan)
    if searched is not None and pipelined(searched):
        candidates = [searched]
    timed = [(model.evaluate(p).iteration_time_s, i, p) for i, p in enumerate(candidates)
             if model.evaluate(p).memory_ok]
    step, _, plan = min(timed)
    best = min(step, model.evaluate(searched).iteration_time_s) if searched is not None else step
    return dataclasses.replace(instance, plan=plan), best


def describe(plan: Plan) -> str:
    lengths = sorted({len(p.stages) for p in plan.pipelines})
    pp = "/".join(str(x) for x in lengths)
    return f"TP {plan.tensor_parallel} x PP {pp} x DP {len(plan.pipelines)}"


def run_traces(instance, reference_step: float, traces: list[tuple[str, list, float, float]], policies: list[str],
               time_limit: float, progress: Progress, label: str) -> list[dict]:
    """Simulate every (trace, policy); rows with the results. One decide() cache per instance."""
    source = DecisionSource(time_limit)
    made = {name: make_policy(name, time_limit_s=time_limit, source=source) for name in policies}
    rows = []
    for trace_name, trace, horizon, mtbf in traces:
        scored = with_failure_rate(instance, mtbf)
        results: dict[str, SimulationResult] = {}
        task = progress.add_task(f"{label} {trace_name}", total=len(policies) * max(len(trace), 1))
        for i, name in enumerate(policies):
            def tick(done: int, total: int, i=i) -> None:
                progress.update(task, completed=i * max(len(trace), 1) + done)
            results[name] = simulate(scored, trace, made[name], horizon, progress=tick)
            progress.update(task, completed=(i + 1) * max(len(trace), 1))
        progress.remove_task(task)
        rows.append(summarise(instance, reference_step, label, trace_name, trace, horizon, results))
    return rows


def summarise(instance, reference_step: float, label: str, trace_name: str, trace: list, horizon: float,
              results: dict[str, SimulationResult]) -> dict:
    ours = results["chameleon"]
    best = instance.spec.training.global_batch / reference_step  # the best failure-free plan known
    free = ours.failure_free_throughput  # the start plan with no failure
    dead: set[int] = set()
    for e in trace:
        if e.time_s < horizon:
            dead = dead | set(e.devices) if e.kind == "fail" else dead - set(e.devices)
    live = instance.num_devices - len(dead)
    final = ours.segments[-1].samples_per_s if ours.segments[-1].phase == "train" else ours.steady_after(0)
    post = [ours.steady_after(t.time_s + t.interim_s + t.transition_s) for t in ours.transitions
            if t.trigger == "fail" and not t.interrupted]
    row = {
        "instance": label, "trace": trace_name, "devices": instance.num_devices, "plan": describe(instance.plan),
        "failures": sum(1 for e in trace if e.kind == "fail" and e.time_s < horizon),
        "repairs": sum(1 for e in trace if e.kind == "repair" and e.time_s < horizon),
        "horizon_h": horizon / 3600, "failure_free": free, "best_failure_free": best,
        "average": {name: r.average_throughput for name, r in results.items()},
        "transition_s": {name: r.time_in_transition_s for name, r in results.items()},
        "transitions": {name: r.num_transitions for name, r in results.items()},
        "fallbacks": {name: r.fallbacks for name, r in results.items()},
        "cascades": {name: r.cascades for name, r in results.items()},
        "wall_s": {name: r.wall_s for name, r in results.items()},
        "vs_oobleck": ours.average_throughput / results["oobleck"].average_throughput,
        "vs_recycle": ours.average_throughput / results["recycle"].average_throughput,
        "unguarded_vs_oobleck": results["chameleon-unguarded"].average_throughput
        / results["oobleck"].average_throughput,
        "unguarded_vs_recycle": results["chameleon-unguarded"].average_throughput
        / results["recycle"].average_throughput,
        "paper_vs_oobleck": results["chameleon-paper"].average_throughput / results["oobleck"].average_throughput,
        "paper_vs_recycle": results["chameleon-paper"].average_throughput / results["recycle"].average_throughput,
        "final_gap": 1 - final / free, "final_gap_vs_best": 1 - final / best,
        "worst_post_recovery_gap": max((1 - p / free for p in post), default=0.0),
        "vs_ideal_share": final / (free * live / instance.num_devices),
        "live_devices": live,
        "actions": [t.action for t in ours.transitions],
        "results": {name: r.to_json() for name, r in results.items()},
    }
    row["_results"] = results
    return row


def small_part(time_limit: float, quick: bool, progress: Progress) -> list[dict]:
    rows = []
    names = list(WORKLOADS_32)[:1] if quick else list(WORKLOADS_32)
    for name in names:
        instance, reference = start_plan(instance_32(name), time_limit)
        mtbf = instance.num_devices * SPACING_S / 3600.0  # one failure per spacing on the cluster
        traces = []
        for k in (range(1, 3) if quick else range(1, 5)):
            traces.append((f"k={k} fixed",
                           fixed_trace([SPACING_S * (i + 1) for i in range(k)], FAILED_SEQUENCE[:k]), HORIZON_32_S,
                           mtbf))
        for seed in (range(1) if quick else range(3)):
            traces.append((f"synth seed {seed}",
                           synthetic_trace(instance.num_devices, SYNTHETIC_MTBF_H, SYNTHETIC_HORIZON_S, seed),
                           SYNTHETIC_HORIZON_S, SYNTHETIC_MTBF_H))
        rows += run_traces(instance, reference, traces, SMALL_POLICIES, time_limit, progress, f"{name}/32")
    return rows


def scale_part(time_limit: float, days_1024: float, days_16k: float, repair_hours: float, quick: bool,
               progress: Progress) -> list[dict]:
    rows = []
    big, reference = start_plan(with_failure_rate(load_instance(ROOT / "instances" / "gpt3-175b-1024.json"), None),
                                time_limit)
    horizon = days_1024 * 86400
    per_node = big.devices_per_node
    traces = [("OPT rate", published_rate_trace("opt175b", big.num_devices, horizon, 0, repair_hours, per_node),
               horizon, published_mtbf_hours_per_device("opt175b", per_node))]
    if not quick:
        traces.append(("Llama3 rate", published_rate_trace("llama3", big.num_devices, horizon, 0, repair_hours),
                       horizon, published_mtbf_hours_per_device("llama3")))
    rows += run_traces(big, reference, traces, SCALE_POLICIES, time_limit, progress, "gpt3-175b/1k")
    if not quick:
        huge, reference = start_plan(with_failure_rate(load_instance(ROOT / "instances" / "llama3-405b-16k.json"),
                                                       None), time_limit)
        horizon = days_16k * 86400
        traces = [("Llama3 rate", published_rate_trace("llama3", huge.num_devices, horizon, 0, repair_hours),
                   horizon, published_mtbf_hours_per_device("llama3"))]
        rows += run_traces(huge, reference, traces, SCALE_POLICIES, time_limit, progress, "llama3-405b/16k")
    return rows


SHORT = {"chameleon": "Cham", "chameleon-unguarded": "Cham-u", "chameleon-paper": "Paper", "hybrid": "Hyb", "oobleck": "Oob", "recycle": "ReC",
         "bamboo": "Bam", "checkpoint": "Ckpt", "reroute-only": "RR", "reconfigure-only": "RC"}
TABLE_POLICIES = ["chameleon", "chameleon-unguarded", "chameleon-paper", "hybrid", "oobleck", "recycle", "bamboo", "checkpoint"]


def table(rows: list[dict], title: str, policies: list[str]) -> Table:
    policies = [p for p in policies if p in TABLE_POLICIES]
    t = Table(title=title, show_lines=False)
    for col in ["instance", "trace", "fails", "free/s"] + [SHORT[p] for p in policies] + [
            "us/Oob", "us/ReC", "pap/Oob", "pap/ReC", "gap end", "gap max", "gap/best", "vs ideal"]:
        t.add_column(col, justify="left" if col in ("instance", "trace") else "right", no_wrap=True)
    for r in rows:
        t.add_row(r["instance"], r["trace"], str(r["failures"]), f"{r['failure_free']:.2f}",
                  *[f"{r['average'][p]:.2f}" for p in policies],
                  f"{r['vs_oobleck']:.3f}", f"{r['vs_recycle']:.3f}", f"{r['paper_vs_oobleck']:.3f}",
                  f"{r['paper_vs_recycle']:.3f}", f"{100 * r['final_gap']:.1f}%",
                  f"{100 * r['worst_post_recovery_gap']:.1f}%", f"{100 * r['final_gap_vs_best']:.1f}%",
                  f"{r['vs_ideal_share']:.3f}")
    return t


def markdown(rows: list[dict], policies: list[str], title: str) -> str:
    head = ["instance", "plan", "trace", "failures", "failure-free/s"] + policies + [
        "ours/Oobleck", "ours/ReCycle", "paper/Oobleck", "paper/ReCycle", "final gap", "worst post-recovery gap",
        "final gap vs best plan", "final vs ideal share"]
    lines = [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join([r["instance"], r["plan"], r["trace"], str(r["failures"]),
                                        f"{r['failure_free']:.2f}"]
                                       + [f"{r['average'][p]:.2f}" for p in policies]
                                       + [f"{r['vs_oobleck']:.3f}", f"{r['vs_recycle']:.3f}",
                                          f"{r['paper_vs_oobleck']:.3f}", f"{r['paper_vs_recycle']:.3f}",
                                          f"{100 * r['final_gap']:.1f}%",
                                          f"{100 * r['worst_post_recovery_gap']:.1f}%",
                                          f"{100 * r['final_gap_vs_best']:.1f}%",
                                          f"{r['vs_ideal_share']:.3f}"]) + " |")
    return "\n".join(lines)


def extras_table(rows: list[dict], policies: list[str]) -> str:
    """Time in transition, transitions and fallbacks per policy."""
    head = ["instance", "trace"] + [f"{p}: down s / n / fb" for p in policies]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join([r["instance"], r["trace"]] + [
            f"{r['transition_s'][p]:.0f} / {r['transitions'][p]} / {r['fallbacks'][p]}" for p in policies]) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    picks = [r for r in rows if r["trace"] == "k=4 fixed" and r["instance"].startswith("gpt3-7.5b")]
    picks += [r for r in rows if r["trace"] == "synth seed 0" and r["instance"].startswith("gpt3-7.5b")]
    for devices in (1024, 16384):  # the first trace of each scale instance
        picks += [r for r in rows if r["devices"] == devices][:1]
    picks = picks or rows[:1]
    fig, axes = plt.subplots(len(picks), 1, figsize=(12, 3.6 * len(picks)), squeeze=False)
    for ax, r in zip(axes[:, 0], picks):
        shown = {k: v for k, v in r["_results"].items() if k not in ("reroute-only", "reconfigure-only",
                                                                      "chameleon-unguarded")}
        draw_timeline(ax, shown, f"{r['instance']} ({r['plan']}), {r['trace']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=1.0, help="plan-search limit per decision (s)")
    parser.add_argument("--days-1024", type=float, default=7.0)
    parser.add_argument("--days-16k", type=float, default=2.0)
    parser.add_argument("--repair-hours", type=float, default=6.0)
    parser.add_argument("--quick", action="store_true", help="one workload, fewer traces, 1024 only")
    parser.add_argument("--skip-scale", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        small = small_part(args.time_limit, args.quick, progress)
        console.print(table(small, "32 GPUs (4 x 8 A100-40): average throughput (samples/s) per policy",
                            SMALL_POLICIES))
        scale = [] if args.skip_scale else scale_part(max(args.time_limit, 2.0), args.days_1024, args.days_16k,
                                                      args.repair_hours, args.quick, progress)
    if scale:
        console.print(table(scale, "at scale, published failure rates, search time in the transition",
                            SCALE_POLICIES))
    rows = small + scale
    summary = {
        "max_vs_oobleck": max(r["vs_oobleck"] for r in small), "max_vs_recycle": max(r["vs_recycle"] for r in small),
        "min_vs_oobleck": min(r["vs_oobleck"] for r in small), "min_vs_recycle": min(r["vs_recycle"] for r in small),
        "unguarded_max_vs_oobleck": max(r["unguarded_vs_oobleck"] for r in small),
        "unguarded_max_vs_recycle": max(r["unguarded_vs_recycle"] for r in small),
        "unguarded_min_vs_oobleck": min(r["unguarded_vs_oobleck"] for r in small),
        "scale": {f"{r['instance']} {r['trace']}": {"vs_oobleck": r["vs_oobleck"], "vs_recycle": r["vs_recycle"],
                                                   "unguarded_vs_oobleck": r["unguarded_vs_oobleck"],
                                                   "unguarded_vs_recycle": r["unguarded_vs_recycle"]}
                  for r in scale},
        "one_failure_post_recovery_gap": {r["instance"]: float(r["worst_post_recovery_gap"]) for r in small
                                          if r["trace"] == "k=1 fixed"},
        "wall_s": time.perf_counter() - started,
    }
    console.print(summary)
    OUT.mkdir(parents=True, exist_ok=True)
    settings = {"time_limit_s": args.time_limit, "scale_time_limit_s": max(args.time_limit, 2.0),
                "days_1024": args.days_1024, "days_16k": args.days_16k, "repair_hours": args.repair_hours,
                "quick": args.quick, "failed_sequence_32": FAILED_SEQUENCE, "spacing_s": SPACING_S,
                "synthetic_mtbf_hours_per_device": SYNTHETIC_MTBF_H}
    (OUT / "policy_comparison.json").write_text(json.dumps(
        {"settings": settings, "summary": summary,
         "rows": [{k: v for k, v in r.items() if k != "_results"} for r in rows]}, indent=1, default=float))
    md = ["# Recovery policies on failure traces", "", (__doc__ or "").split("\n\n")[0], "",
          f"Settings: {json.dumps(settings)}", "",
          "`ours` = Chameleon (decide's candidates, expected-score Eq. 8, hybrid allowed, guards on: see "
          "baselines._ChameleonFamily); `Cham-u`/`chameleon-unguarded` = the same with decide's candidates as "
          "built; `paper` = Eq. 8 with point D, even "
          "rerouting vs the paper's enumeration. `final gap`: 1 - Chameleon's throughput at the end of the trace / "
          "the start plan's failure-free throughput; `worst post-recovery gap`: the same right after each recovery "
          "(the worst); `vs best plan`: against the best failure-free plan known; `vs ideal share` = final "
          "throughput / (failure-free x live devices / devices).", "",
          markdown(small, SMALL_POLICIES, "32 GPUs")]
    if scale:
        md += ["", markdown(scale, SCALE_POLICIES, "At scale (published rates, search time counted)")]
    md += ["", "### Time with no training (s) / transitions / fallbacks", "", extras_table(small, SMALL_POLICIES)]
    if scale:
        md += ["", extras_table(scale, SCALE_POLICIES)]
    md += ["", f"Summary: {json.dumps(summary)}", ""]
    (OUT / "policy_comparison.md").write_text("\n".join(md))
    plot(rows, OUT / "policy_comparison.png")
    console.print(f"wrote {OUT / 'policy_comparison.json'}, .md, .png in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
