"""A random campaign against the decision's deadline: `plan --policy auto --time-limit T --json` on
seeded random clusters, each in its own process, judged on time, memory, exit code and soundness.

The generator is this file's own (not the search's space): 4 to 512 devices in nodes of 1-8, TP
1-8 inside a node, one to three device types mixed per node (each node draws its own mix), a GPT-
style model of 4-64 layers, a regular DP x PP x TP layout, memory from ample to impossible (device
memory drawn relative to what the layout's stages need), 1-3 failed devices and a time to the next
fault from seconds to years. Every run must:
- end within 1.1 T + start-up (`chameleon-solve --version`), with its peak resident memory measured
  (os.wait4's ru_maxrss of that process alone);
- exit 0, 3 (proven infeasible), 4 (no answer in time) or 5 (layers lost), never with a traceback;
- on exit 0, print plans (the chosen one and a hybrid's interim rerouting) that the independent
  checker (`chameleon_opt.check.check_plan`), run again here, accepts.

Writes bench/out/campaign.{json,md}; the summary line is instances, exit codes, worst wall / limit
and worst peak RSS. `tests/test_campaign.py` runs a seeded subset in-process.

    .venv/bin/python bench/campaign.py --count 300 --time-limit 1
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEVICE_TYPES = (  # name, GiB, peak TFLOP/s: three generations, so that mixes differ in speed and memory
    ("big", 80.0, 989.0), ("mid", 40.0, 312.0), ("small", 16.0, 125.0))
REGIMES = ("ample", "tight", "binding", "impossible")
MEMORY_FACTOR = {"ample": (4.0, 10.0), "tight": (1.3, 2.0), "binding": (0.9, 1.2), "impossible": (0.05, 0.4)}
"""Device memory as a multiple of the largest per-device need of the instance's own layout."""


def _layout_need_gib(layers: int, hidden: int, ffn: int, vocab: int, seq: int, tp: int, pp: int) -> float:
    """A rough per-device need of the instance's layout (16 bytes a parameter of state, a first stage
    holding pp micro-batches of ~34 s h bytes per layer): only a scale for the memory draw, the
    planner's own model decides what fits."""
    params = (layers - 2) * (4 * hidden * hidden + 2 * hidden * ffn) + 2 * vocab * hidden
    stage_params = params / tp / pp
    activations = pp * (layers / pp) * 34 * seq * hidden / tp
    return (stage_params * 16 + activations) / 2 ** 30 + 1.0


def random_instance(seed: int) -> dict[str, Any]:
    """One random instance (see the module docstring); the same seed gives the same instance."""
    rng = random.Random(seed)
    per_node = rng.choice((1, 2, 4, 8, 8))
    nodes = max(1, min(rng.randint(4, 512) // per_node, 512 // per_node))
    devices = nodes * per_node
    if devices < 4:
        nodes = -(-4 // per_node)
        devices = nodes * per_node
    tp = rng.choice([t for t in (1, 2, 4, 8) if t <= per_node])
    layers = rng.randint(4, 64)
    hidden = rng.choice((1024, 2048, 4096))
    heads = hidden // 128
    seq = rng.choice((512, 1024, 2048))
    vocab = rng.choice((32000, 50304))
    groups = devices // tp
    pp = rng.randint(1, max(1, min(layers, groups, 16)))
    dp = max(1, groups // pp)
    if rng.random() < 0.3:  # some jobs leave spare groups
        dp = max(1, dp - rng.randint(1, max(1, dp // 2)))
    micro_batches = dp * rng.randint(1, 8)
    regime = rng.choice(REGIMES)
    need = _layout_need_gib(layers, hidden, 4 * hidden, vocab, seq, tp, pp)
    low, high = MEMORY_FACTOR[regime]
    kinds = rng.sample(DEVICE_TYPES, rng.randint(1, 3))
    base = kinds[0]
    scale = need * rng.uniform(low, high) / base[1]

    def device_type(kind: tuple[str, float, float]) -> dict[str, Any]:
        return {"name": kind[0], "memory_gib": round(kind[1] * scale, 3), "peak_tflops": kind[2],
                "efficiency": round(rng.uniform(0.3, 0.6), 3), "reserved_gib": 0.5}

    overrides = []
    if len(kinds) > 1:
        for other in kinds[1:]:
            members = [d for node in range(nodes) for d in range(node * per_node, (node + 1) * per_node)
                       if rng.random() < rng.choice((0.2, 0.5))]  # each node its own mix
            if members:
                overrides.append({"devices": members, "device_type": device_type(other)})
    used = pp * dp * tp
    failed = sorted(rng.sample(range(used), min(rng.randint(1, 3), used)))
    return {
        "format": 1, "name": f"campaign-{seed}",
        "description": f"seed {seed}: {devices} devices, {len(kinds)} types, TP {tp}, memory {regime}",
        "cluster": {"nodes": nodes, "devices_per_node": per_node, "device_type": device_type(base),
                    "network": {"intra_node_gbps": rng.choice((100, 300, 900)),
                                "inter_node_gbps": rng.choice((5, 25, 50, 100)),
                                "intra_node_latency_us": 5, "inter_node_latency_us": 20},
                    **({"overrides": overrides} if overrides else {})},
        "workload": {"inline": {"name": f"gpt-{layers}x{hidden}",
                                "architecture": {"layers": layers, "hidden": hidden, "heads": heads,
                                                 "ffn": 4 * hidden, "vocab": vocab, "seq_len": seq}}},
        "training": {"global_batch": micro_batches, "micro_batch_size": 1},
        "plan": {"tensor_parallel": tp, "layout": {"pipeline_parallel": pp, "data_parallel": dp}},
        "failures": {"events": [{"time_s": 100.0, "devices": failed}],
                     "next_fault_s": round(10 ** rng.uniform(0.5, 8), 1)},
    }


def command() -> list[str]:
    """The installed command beside this interpreter (what an operator runs)."""
    found = Path(sys.executable).parent / "chameleon-solve"
    return [str(found)] if found.exists() else [sys.executable, "-m", "chameleon_opt.cli"]


def checkout_env() -> dict[str, str]:
    """This process's environment with this checkout first on the path: the installed command may be an
    editable install of another checkout, and the campaign measures the code beside it."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def measured_run(arguments: list[str]) -> dict[str, Any]:
    """Run one command; its wall time, exit code, output and peak RSS in MiB (of that process alone)."""
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(arguments, stdout=out, stderr=err, text=True, env=checkout_env())
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {"wall_s": wall, "exit": process.returncode, "rss_mib": usage.ru_maxrss / 1024.0,
                "stdout": out.read(), "stderr": err.read()}


def startup_s(repeats: int = 3) -> float:
    """Least wall time of `chameleon-solve --version` (interpreter and CLI import)."""
    return min(measured_run([*command(), "--version"])["wall_s"] for _ in range(repeats))


def plan_from_json(data: dict[str, Any]) -> Any:
    """The CLI contract's `plan` object as a Plan (read here, not by the code that wrote it)."""
    from chameleon_opt.plan import Pipeline, Plan, Reroute, Stage
    pipelines = tuple(Pipeline(tuple(Stage(tuple(s["devices"]), s["layers"][0], s["layers"][1], s.get("relief"))
                                     for s in p["stages"]), p["micro_batches"]) for p in data["pipelines"])
    rerouted = tuple(Reroute(r["from_pipeline"], r["stage"], r["to_pipeline"], r["micro_batches"])
                     for r in data.get("rerouted", []))
    return Plan(data["tensor_parallel"], pipelines, rerouted)


def check_answer(spec: dict[str, Any], payload: dict[str, Any]) -> list[str]:
    """The checker's violations of the printed plans (chosen, and a hybrid's interim rerouting)."""
    from chameleon_opt.check import check_plan
    from chameleon_opt.instance.load import build_instance
    instance = build_instance(spec, spec["name"])
    failed = frozenset(d for event in spec["failures"]["events"] for d in event["devices"])
    problems = []
    rerouted = payload["policy"] == "reroute"
    problems += check_plan(instance, plan_from_json(payload["plan"]), failed, require_tp_in_node=not rerouted).violations
    if payload.get("interim"):
        problems += check_plan(instance, plan_from_json(payload["interim"]["plan"]), failed,
                               require_tp_in_node=False).violations
    return list(problems)


def judge(spec: dict[str, Any], run: dict[str, Any], limit: float, start_up: float) -> dict[str, Any]:
    """One row: the run's numbers and every way it failed the campaign's rules."""
    cluster = spec["cluster"]
    row: dict[str, Any] = {"name": spec["name"], "description": spec["description"],
                           "devices": cluster["nodes"] * cluster["devices_per_node"], "limit_s": limit,
                           "wall_s": round(run["wall_s"], 3), "rss_mib": round(run["rss_mib"], 1), "exit": run["exit"]}
    problems = []
    if run["wall_s"] > 1.1 * limit + start_up:
        problems.append(f"wall {run['wall_s']:.2f} s > 1.1 x {limit:g} + start-up {start_up:.2f} s")
    if "Traceback" in run["stderr"]:
        problems.append("traceback: " + run["stderr"].strip().splitlines()[-1])
    if run["exit"] not in (0, 3, 4, 5):
        problems.append(f"exit {run['exit']}: {run['stderr'].strip().splitlines()[-1:] or ['(no message)']}")
    try:
        payload = json.loads(run["stdout"])
    except json.JSONDecodeError:
        payload = None
        problems.append("stdout is not one JSON object")
    if payload is not None and run["exit"] == 0:
        row.update(policy=payload["policy"], status=payload["solve"]["status"] if payload.get("solve") else None,
                   gap=payload["solve"]["gap"] if payload.get("solve") else None)
        problems += [f"checker: {v}" for v in check_answer(spec, payload)]
    elif payload is not None:
        row["reason"] = payload.get("reason", "")[:300]
    row["problems"] = problems
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--time-limit", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = parser.parse_args()
    start_up = startup_s()
    print(f"start-up (chameleon-solve --version): {start_up:.3f} s", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for seed in range(args.first_seed, args.first_seed + args.count):
            spec = random_instance(seed)
            path = Path(folder) / f"{spec['name']}.json"
            path.write_text(json.dumps(spec))
            run = measured_run([*command(), "plan", str(path), "--policy", "auto",
                                "--time-limit", str(args.time_limit), "--json"])
            row = judge(spec, run, args.time_limit, start_up)
            rows.append(row)
            mark = "ok" if not row["problems"] else "FAIL " + "; ".join(row["problems"])
            print(f"{spec['name']:>16} {row['devices']:>4} dev exit {row['exit']} wall {row['wall_s']:.2f} s "
                  f"rss {row['rss_mib']:.0f} MiB {mark}", flush=True)
    exits = Counter(r["exit"] for r in rows)
    failed = [r for r in rows if r["problems"]]
    worst_wall = max(rows, key=lambda r: r["wall_s"] / r["limit_s"])
    worst_rss = max(rows, key=lambda r: r["rss_mib"])
    summary = (f"{len(rows)} instances, exits {dict(sorted(exits.items()))}, {len(failed)} failing a rule; worst wall "
               f"{worst_wall['wall_s']:.2f} s for a {worst_wall['limit_s']:g} s limit ({worst_wall['name']}, start-up "
               f"{start_up:.2f} s); worst peak RSS {worst_rss['rss_mib']:.0f} MiB ({worst_rss['name']})")
    print(summary)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "campaign.json").write_text(json.dumps({"startup_s": start_up, "summary": summary, "rows": rows},
                                                       indent=1) + "\n")
    lines = [summary, "", "| instance | devices | exit | wall s | RSS MiB | policy | status | problems |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['name']} | {r['devices']} | {r['exit']} | {r['wall_s']:.2f} | {r['rss_mib']:.0f} | "
              f"{r.get('policy', '-')} | {r.get('status', '-')} | {'; '.join(r['problems']) or '-'} |" for r in rows]
    (args.out / "campaign.md").write_text("\n".join(lines) + "\n")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
