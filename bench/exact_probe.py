"""How often the plan search proves OPTIMAL on random instances too large for the brute force.

Why: issue 21 asks for OPTIMAL proven on every instance up to 64 devices within 2 s. The brute force
(bench/brute_force.py) stops at about 24 devices, so this probe runs only the search on the same
generator (`random_instance`, default 32-64 devices) and reports its status, objective, bound, gap
and wall time per seed (`python bench/exact_probe.py --seeds 30 --time-limit 2`). Timings are wall
times on whatever machine runs it (noisy when shared).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from brute_force import LAYERS, _range, random_instance, regime_of  # noqa: E402 (the bench folder is not a package)

from chameleon_opt.instance.load import build_instance  # noqa: E402
from chameleon_opt.solve.deadline import Deadline  # noqa: E402
from chameleon_opt.solve.search import search_plan  # noqa: E402

OUT = Path(__file__).resolve().parent / "out" / "exact_probe.json"


def probe(seed: int, devices: tuple[int, int], time_limit_s: float,
          layers: tuple[int, int] = LAYERS) -> dict[str, Any]:
    """One seeded instance: the search's status, objective, bound, relative gap and wall time."""
    data, failed = random_instance(seed, devices, layers)
    instance = build_instance(data)
    start = time.perf_counter()
    result = search_plan(instance, failed, Deadline.after(time_limit_s))
    wall = time.perf_counter() - start
    objective, bound = result.objective, result.bound
    gap = (objective - bound) / objective if objective and bound is not None else None
    return {"seed": seed, "devices": instance.num_devices, "tp": instance.plan.tensor_parallel,
            "hetero": bool(instance.spec.cluster.overrides), "memory": regime_of(data),
            "layers": instance.workload.num_layers, "micro_batches": instance.global_micro_batches,
            "status": result.status.value, "objective": objective, "bound": bound, "gap": gap,
            "search_s": round(wall, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=30, help="instances: seeds first..first+N-1")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--devices", default="32-64", help="device range, e.g. 32-64")
    parser.add_argument("--time-limit", type=float, default=2.0, help="the search's deadline per instance")
    parser.add_argument("--layers", default=f"{LAYERS[0]}-{LAYERS[1]}", help="layer range of the instances, e.g. 8-12")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    low, high = (int(x) for x in args.devices.split("-"))
    layers = _range(args.layers, parser)
    rows = []
    print(f"{'seed':>4} {'dev':>3} {'tp':>2} {'het':>3} {'memory':>7} {'L':>2} {'m':>2} {'status':>11} "
          f"{'objective':>10} {'bound':>10} {'gap':>8} {'srch_s':>6}", flush=True)
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        row = probe(seed, (low, high), args.time_limit, layers)
        rows.append(row)
        gap = "-" if row["gap"] is None else f"{100 * row['gap']:.2f}%"
        print(f"{seed:>4} {row['devices']:>3} {row['tp']:>2} {'het' if row['hetero'] else 'hom':>3} "
              f"{row['memory']:>7} {row['layers']:>2} {row['micro_batches']:>2} {row['status']:>11} "
              f"{row['objective'] or 0:>10.4f} {row['bound'] or 0:>10.4f} "
              f"{gap:>8} {row['search_s']:>6.2f}", flush=True)
    gaps = [r["gap"] for r in rows if r["gap"] is not None]
    summary = {"instances": len(rows), "optimal": sum(r["status"] == "OPTIMAL" for r in rows),
               "median_gap": statistics.median(gaps) if gaps else None, "worst_gap": max(gaps, default=None),
               "gaps_above_10pct": sum(g > 0.1 for g in gaps)}
    print(f"\n{summary['instances']} instances ({low}-{high} devices, layers {layers[0]}-{layers[1]}, --time-limit {args.time_limit:g} s): "
          f"OPTIMAL {summary['optimal']}; gap median {summary['median_gap']}, worst {summary['worst_gap']}, "
          f"above 10%: {summary['gaps_above_10pct']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"settings": vars(args) | {"out": str(args.out)}, "summary": summary,
                                    "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
