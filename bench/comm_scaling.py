"""Communication scaling: slot assignment, migration schedule and all-reduce rounds, 32 .. 16,384 GPUs.

For every size: GPT-3 175B (TP 8 inside 8-GPU nodes, up to 16 stages, the rest data parallel; the
smaller GPT-3 sizes where 175B does not fit the survivors), GPU 3 fails, the reconfiguration search
re-plans over the survivors, then `communication_plan` schedules the change. Reported: state moved
with the search's placement and after the assignment; fluid (LP) and round-based makespans over
the solver-independent lower bound (target: fluid <= 1.05 x bound on average); rounds over the
maximum degree (exactly 1, Koenig); CP-SAT colours against DSATUR's and the clique bound; the
communication solve time (target <= 2 s at 16,384), and the lowering to per-rank plans.

Writes bench/out/comm_scaling.{json,md,png}.
Run: python bench/comm_scaling.py [--sizes 32 256 ...] [--time-limit 5]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # measure this checkout's package, not whichever one pip installed

from chameleon_opt.comm import communication_plan, lower_plan
from chameleon_opt.comm.allreduce import cpsat_colouring, dsatur_colouring
from chameleon_opt.instance.load import build_instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.solve.search import search_plan

console = Console(width=240)
MODELS = ["gpt3-175b", "gpt3-76b", "gpt3-39b", "gpt3-18b", "gpt3-7.5b"]  # largest that fits first


def job(model: str, devices: int) -> dict:
    """bench/solver_scaling.py's job (TP 8 inside 8-GPU nodes, up to 16 stages, one GPU fails), with
    at least two pipelines: with one, the failed GPU's shards have no replica (a checkpoint restart)."""
    nodes = devices // 8
    pp = max(min(16, nodes // 2), 1)
    return {
        "format": 1, "name": f"{model}-{devices}",
        "cluster": {"nodes": nodes, "devices_per_node": 8, "device_type": "A100-80",
                    "network": {"intra_node_gbps": 230, "inter_node_gbps": 25, "inter_node_latency_us": 10}},
        "workload": {"model": model},
        "training": {"global_batch": 1536, "micro_batch_size": 1, "sequence_length": 2048,
                     "activation_recomputation": True, "distributed_optimizer": True},
        "plan": {"tensor_parallel": 8, "layout": {"pipeline_parallel": pp, "data_parallel": max(nodes // pp, 1)}},
        "failures": {"events": [{"time_s": 0, "devices": [3]}]},
    }


def run_one(devices: int, limit: float) -> dict:
    for name in MODELS:
        instance = build_instance(job(name, devices), f"<{name}-{devices}>")
        model = PerfModel(instance)
        failed = instance.failed_devices
        start = time.perf_counter()
        search = search_plan(instance, failed, Deadline.after(10.0), model=model)
        search_s = time.perf_counter() - start
        if search.solution is not None:
            break
    else:
        return {"devices": devices, "model": None, "reason": search.reason}
    start = time.perf_counter()
    migration, rounds, info = communication_plan(instance, instance.plan, search.solution, failed, Deadline.after(limit),
                                                 model=model)
    comm_s = time.perf_counter() - start
    start = time.perf_counter()
    ranks = lower_plan(instance, info.plan, migration, rounds, failed)
    lowered = len(json.dumps(ranks))
    lower_s = time.perf_counter() - start
    # CP-SAT run even where DSATUR meets the clique bound (communication_plan skips it there)
    greedy = dsatur_colouring(info.allreduce.groups)
    k = max(greedy.values(), default=-1) + 1
    cp_status, cp_colouring, _, cp_wall = cpsat_colouring(info.allreduce.groups, k, Deadline.after(2.0), hint=greedy) if k else \
        (None, {}, 0.0, 0.0)
    step_before = model.evaluate(search.solution, failed).iteration_time_s
    step_after = model.evaluate(info.plan, failed).iteration_time_s
    a, ar = info.assignment, info.allreduce
    bound = migration.lower_bound_s
    return {
        "devices": devices, "model": name, "search_s": search_s,
        "pipelines_old": len(instance.plan.pipelines), "pipelines_new": len(info.plan.pipelines),
        "stages_new": sorted({len(p.stages) for p in info.plan.pipelines}),
        "bytes_search_placement": float(a.reason.split("search's placement: ")[1].split(" GB")[0]) * 1e9,
        "bytes_moved": migration.total_bytes, "assignment_s": a.wall_s,
        "step_s_search_placement": step_before, "step_s_assigned": step_after,
        "transfers": len(migration.transfers), "lp_status": migration.solve.status.value,
        "lp_backend": migration.solve.backend, "lp_reason": migration.solve.reason,
        "lp_wall_s": migration.solve.wall_s, "lp_build_s": migration.solve.build_s,
        "fluid_makespan_s": migration.fluid_makespan_s, "makespan_s": migration.makespan_s,
        "async_makespan_s": migration.async_makespan_s,
        "lower_bound_s": bound,
        "fluid_over_bound": migration.fluid_makespan_s / bound if bound > 0 else 1.0,
        "rounds_makespan_over_bound": migration.makespan_s / bound if bound > 0 else 1.0,
        "rounds": migration.rounds, "max_degree": migration.max_degree,
        "rounds_over_degree": migration.rounds / migration.max_degree if migration.max_degree else 1.0,
        "allreduce_groups": len(ar.groups), "cpsat_colours": ar.colours, "dsatur_colours": ar.dsatur_colours,
        "clique_bound": ar.clique_bound, "colouring_status": ar.solve.status.value, "colouring_backend": ar.solve.backend,
        "cpsat_forced_colours": (max(cp_colouring.values()) + 1) if cp_colouring else 0,
        "cpsat_forced_status": cp_status.value if cp_status else "-", "cpsat_forced_s": cp_wall,
        "allreduce_s": ar.estimated_s, "comm_s": comm_s, "lower_s": lower_s, "lowered_bytes": lowered,
        "ranks": len(ranks),
    }


def fmt(value, pattern: str = "{:.3f}") -> str:
    return "-" if value is None else pattern.format(value)


def render(rows: list[dict], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    columns = ["devices", "model", "pipes old->new", "GB search->assigned", "transfers", "LP", "fluid s",
               "rounds s", "async s", "bound s", "fluid/bound", "rounds/bound", "rounds", "max deg", "colours CP-SAT/DSATUR/clique", "CP-SAT run s",
               "all-reduce s", "comm s", "lower s"]
    table = Table(title="Communication after one GPU failure (reconfiguration)")
    for c in columns:
        table.add_column(c, justify="right")
    lines = ["# Communication scaling", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        if r.get("model") is None:
            continue
        cells = [str(r["devices"]), r["model"], f"{r['pipelines_old']}->{r['pipelines_new']}",
                 f"{r['bytes_search_placement'] / 1e9:,.0f}->{r['bytes_moved'] / 1e9:,.0f}", str(r["transfers"]),
                 f"{r['lp_status']} {r['lp_backend']}", fmt(r["fluid_makespan_s"]), fmt(r["makespan_s"]),
                 fmt(r["async_makespan_s"]),
                 fmt(r["lower_bound_s"]), fmt(r["fluid_over_bound"]), fmt(r["rounds_makespan_over_bound"]),
                 str(r["rounds"]), str(r["max_degree"]),
                 f"{r['cpsat_forced_colours']}/{r['dsatur_colours']}/{r['clique_bound']}",
                 fmt(r["cpsat_forced_s"], "{:.2f}") + f" {r['cpsat_forced_status']}", fmt(r["allreduce_s"]),
                 fmt(r["comm_s"], "{:.2f}"), fmt(r["lower_s"], "{:.2f}")]
        table.add_row(*cells)
        lines.append("| " + " | ".join(cells) + " |")
    done = [r for r in rows if r.get("model")]
    if done:
        mean_fluid = sum(r["fluid_over_bound"] for r in done) / len(done)
        mean_rounds = sum(r["rounds_makespan_over_bound"] for r in done) / len(done)
        summary = (f"mean fluid/bound {mean_fluid:.3f} (target <= 1.05), mean rounds/bound {mean_rounds:.3f}; "
                   f"rounds == max degree everywhere: {all(r['rounds'] == r['max_degree'] for r in done)}; "
                   f"CP-SAT <= DSATUR everywhere: {all(r['cpsat_forced_colours'] <= r['dsatur_colours'] for r in done)}; "
                   f"max communication_plan time {max(r['comm_s'] for r in done):.2f} s (target <= 2 s at 16,384)")
        console.print(table)
        console.print(summary)
        lines += ["", summary]
    for r in rows:
        if r.get("model") is None:
            lines.append(f"\n- {r['devices']} devices: no model fits ({r['reason']})")
    (out / "comm_scaling.md").write_text("\n".join(lines) + "\n")
    (out / "comm_scaling.json").write_text(json.dumps(rows, indent=1))
    plot(done, out / "comm_scaling.png")
    console.print(f"wrote {out}/comm_scaling.{{md,json,png}}")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    xs = [r["devices"] for r in rows]
    left.plot(xs, [r["fluid_over_bound"] for r in rows], "o-", label="fluid (LP) makespan / bound")
    left.plot(xs, [r["rounds_makespan_over_bound"] for r in rows], "s--", label="round makespan / bound")
    left.plot(xs, [r["rounds_over_degree"] for r in rows], "^:", label="rounds / max degree")
    left.axhline(1.05, color="k", lw=0.8, ls="--", label="target 1.05")
    left.set_xscale("log", base=2)
    left.set_xlabel("devices (one failed)")
    left.set_title("Migration schedule quality")
    left.legend(fontsize=7)
    right.plot(xs, [r["comm_s"] for r in rows], "o-", label="communication_plan")
    right.plot(xs, [r["assignment_s"] for r in rows], "s--", label="slot assignment (min-cost flow)")
    right.plot(xs, [r["lp_wall_s"] for r in rows], "^:", label="migration LP (HiGHS)")
    right.plot(xs, [r["lower_s"] for r in rows], "x-.", label="lowering to per-rank plans")
    right.plot([16384], [2.0], "k*", markersize=12, label="target")
    right.set_xscale("log", base=2)
    right.set_yscale("log")
    right.set_xlabel("devices (one failed)")
    right.set_ylabel("seconds")
    right.set_title("Solve time")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64, 256, 1024, 4096, 16384])
    parser.add_argument("--time-limit", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = parser.parse_args()
    rows = []
    for devices in args.sizes:
        console.print(f"[dim]{devices} devices...[/]")
        rows.append(run_one(devices, args.time_limit))
    render(rows, args.out)


if __name__ == "__main__":
    main()
