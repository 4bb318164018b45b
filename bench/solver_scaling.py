"""Plan-search scaling: survivors 32 .. 16,384 on GPT-3 175B and Llama-3-405B-sized jobs.

For every size: the reconfiguration search (solve time, status, gap, modelled and exact step
time), the level model solved by CP-SAT and by the HiGHS MILP on their own (from the simple
warm start, no bound shortcut: a solver-versus-solver comparison), and the paper's enumeration
with its own time limit beside it. Targets: <= 1 s at 32 devices, 2 s at 1024, 10 s at 16,384,
gap <= 1%, never worse than the enumerator where it finishes.

Writes bench/out/solver_scaling.{json,md,png}.
Run: python bench/solver_scaling.py [--time-limit 10] [--enumerator-limit 10] [--sizes 32 256 ...]
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

from chameleon_opt.instance.load import build_instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.solve.backends import SolverOptions
from chameleon_opt.solve.constructive import heuristic_mix
from chameleon_opt.solve.levels import level_model, lp_lower_bound, solve_level_model
from chameleon_opt.solve.search import search_plan, search_space
from chameleon_opt.solve.deadline import Deadline

console = Console(width=160)

WORKLOADS = {
    "gpt3-1.7b": {"device": "A100-40", "global_batch": 16, "sequence_length": 2048, "tp": 2, "per_node": 4},
    "gpt3-175b": {"device": "A100-80", "global_batch": 1536, "sequence_length": 2048},
    "llama3-405b": {"device": "H100-80", "global_batch": 2048, "sequence_length": 8192},
}


def job(workload: str, devices: int) -> dict:
    """TP 8 inside 8-GPU nodes, up to 16 stages, the rest data parallel, the optimizer sharded in two
    copies; one GPU fails."""
    spec = WORKLOADS[workload]
    tp, per_node = spec.get("tp", 8), spec.get("per_node", 8)
    nodes = devices // per_node
    pp = min(16 if tp == 8 else 2, nodes * per_node // tp)
    dp = max(nodes * per_node // (tp * pp), 1)
    # two copies of each optimizer shard (Megatron-LM's --num-distributed-optimizer-instances 2), as the
    # bundled scale jobs: with one, the failed GPU's shard is lost and the answer is a checkpoint restart
    copies = {"shard_replicas": 2} if dp >= 2 else {}
    return {
        "format": 1, "name": f"{workload}-{devices}",
        "cluster": {"nodes": nodes, "devices_per_node": per_node, "device_type": spec["device"],
                    "network": {"intra_node_gbps": 230, "inter_node_gbps": 25, "inter_node_latency_us": 10}},
        "workload": {"model": workload},
        "training": {"global_batch": spec["global_batch"], "micro_batch_size": 1,
                     "sequence_length": spec["sequence_length"], "activation_recomputation": True,
                     "distributed_optimizer": True, **copies},
        "plan": {"tensor_parallel": tp, "layout": {"pipeline_parallel": pp, "data_parallel": dp}},
        "failures": {"events": [{"time_s": 0, "devices": [3]}]},
    }


def enumerate_baseline(instance, failed, limit: float) -> dict:
    try:
        from chameleon_opt.solve.enumerator import enumerate_plans
    except ImportError:
        return {"status": "absent"}
    start = time.perf_counter()
    result = enumerate_plans(instance, failed, Deadline.after(limit))
    wall = time.perf_counter() - start
    step = PerfModel(instance).evaluate(result.solution, failed).iteration_time_s if result.solution else None
    return {"status": result.status.value, "wall_s": wall, "step_s": step, "reason": result.reason}


def run_one(workload: str, devices: int, limit: float, enumerator_limit: float) -> dict:
    instance = build_instance(job(workload, devices), f"<{workload}-{devices}>")
    failed = instance.failed_devices
    model = PerfModel(instance)
    start = time.perf_counter()
    result = search_plan(instance, failed, Deadline.after(limit), model=model)
    total = time.perf_counter() - start
    row = {"workload": workload, "devices": devices, "status": result.status.value, "backend": result.backend,
           "total_s": total, "solve_s": result.wall_s, "build_s": result.build_s, "gap": result.gap,
           "objective_s": result.objective, "bound_s": result.bound, "reason": result.reason,
           "proof": ("branch and bound" if "exhausted the space" in result.reason else
                     "relaxation" if result.status.value in ("OPTIMAL", "FEASIBLE") else "-")}
    if result.solution is not None:
        row["step_s"] = model.evaluate(result.solution, failed).iteration_time_s
        row["pipelines"] = len(result.solution.pipelines)
        space = search_space(instance, failed, model)
        warm = heuristic_mix(space.templates, space.budget, space.total)
        bound = lp_lower_bound(space.templates, space.budget, space.total)
        lm = level_model(space.templates, space.budget, space.total, warm, bound)
        for backend in ("cpsat", "highs"):
            status, _, _, build_s, wall = solve_level_model(lm, Deadline.after(limit), SolverOptions(backend))
            row[f"{backend}_level_s"] = wall + build_s
            row[f"{backend}_level_status"] = status.value if status else "NO_SOLUTION"
    row["enumerator"] = enumerate_baseline(instance, failed, enumerator_limit)
    return row


def render(rows: list[dict], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    table = Table(title="Reconfiguration search after one GPU failure")
    columns = ["workload", "devices", "status", "proof", "backend", "total s", "step s", "bound s", "gap", "pipelines",
               "CP-SAT level s", "HiGHS level s", "enum status", "enum s", "enum step s"]
    for c in columns:
        table.add_column(c, justify="right")
    lines = ["# Plan-search scaling", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        e = r["enumerator"]

        def fmt(value, pattern="{:.3f}"):
            return "-" if value is None else pattern.format(value)

        cells = [r["workload"], str(r["devices"]), r["status"], r["proof"], r["backend"], fmt(r["total_s"], "{:.2f}"),
                 fmt(r.get("step_s")), fmt(r.get("bound_s")), fmt(r["gap"], "{:.2e}"), str(r.get("pipelines", "-")),
                 fmt(r.get("cpsat_level_s"), "{:.2f}") + (f" {r['cpsat_level_status']}" if "cpsat_level_status" in r else ""),
                 fmt(r.get("highs_level_s"), "{:.2f}") + (f" {r['highs_level_status']}" if "highs_level_status" in r else ""),
                 e.get("status", "-"), fmt(e.get("wall_s"), "{:.2f}"), fmt(e.get("step_s"))]
        table.add_row(*cells)
        lines.append("| " + " | ".join(cells) + " |")
    console.print(table)
    for r in rows:
        if r["status"] == "INFEASIBLE":
            console.print(f"{r['workload']} at {r['devices']} devices: {r['reason']}")
            lines.append(f"\n- {r['workload']} at {r['devices']} devices: {r['reason']}")
    (out / "solver_scaling.md").write_text("\n".join(lines) + "\n")
    (out / "solver_scaling.json").write_text(json.dumps(rows, indent=1))
    plot(rows, out / "solver_scaling.png")
    console.print(f"wrote {out}/solver_scaling.{{md,json,png}}")


def plot(rows: list[dict], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for workload in WORKLOADS:
        mine = [r for r in rows if r["workload"] == workload and r["status"] != "INFEASIBLE"]
        if not mine:
            continue
        xs = [r["devices"] for r in mine]
        ax.plot(xs, [r["total_s"] for r in mine], "o-", label=f"{workload}: search (total)")
        ax.plot(xs, [r.get("cpsat_level_s", float("nan")) for r in mine], "s--", label=f"{workload}: CP-SAT level model")
        ax.plot(xs, [r.get("highs_level_s", float("nan")) for r in mine], "^:", label=f"{workload}: HiGHS level model")
        enum = [r["enumerator"].get("wall_s", float("nan")) for r in mine]
        ax.plot(xs, enum, "x-.", label=f"{workload}: enumeration")
    ax.plot([32, 1024, 16384], [1, 2, 10], "k*", markersize=12, label="targets")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("devices (one failed)")
    ax.set_ylabel("seconds")
    ax.set_title("Reconfiguration search time")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--enumerator-limit", type=float, default=10.0)
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 16, 32, 64, 256, 1024, 4096, 16384])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = parser.parse_args()
    rows = []
    for workload in WORKLOADS:
        for devices in args.sizes:
            if (workload == "gpt3-1.7b") != (devices <= 64):  # the small model at small sizes only
                continue
            console.print(f"[dim]{workload} on {devices} devices...[/]")
            rows.append(run_one(workload, devices, args.time_limit, args.enumerator_limit))
    render(rows, args.out)


if __name__ == "__main__":
    main()
