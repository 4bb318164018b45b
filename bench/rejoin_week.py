"""Repairs that come back (issue 16): the adaptive policy's average throughput over a week at the
Llama 3 failure rate, with repaired devices returning through `rejoin.plan_join`'s candidates
(keep-running, rejoin-slots, scale-up), against the same trace with its repairs ignored, both as a
fraction of failure-free training.

The trace is `published_rate_trace("llama3", ...)` (419 interruptions in 54 days on 16,384 GPUs,
one GPU each) with every failed GPU repaired `--repair-hours` after it failed; "without rejoin"
replays the same failures with the repair events removed. Searches are charged `--time-limit`
(as `simulate --deterministic`), so a rerun gives the same figures.

Failure-free is the instance's own plan; a scale-up searches over the whole cluster and may find a
faster plan than that one, so each run is also given against failure-free training on the best
plan of the two (the search over the healthy cluster within `--time-limit`, or the instance's).
Writes bench/out/rejoin_week.{json,md}.
Run: python bench/rejoin_week.py [--seeds 0 1] [--repair-hours 2] [--horizon-hours 168]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # measure this checkout's package, not whichever one pip installed

from chameleon_opt.instance.load import load_instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.recovery.chameleon import Chameleon, DecisionSource
from chameleon_opt.recovery.interface import cached_search
from chameleon_opt.recovery.simulate import published_rate_trace, simulate

console = Console(width=160)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instance", default=str(ROOT / "instances" / "llama3-405b-16k.json"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--repair-hours", type=float, nargs="+", default=[2.0])
    parser.add_argument("--horizon-hours", type=float, default=168.0)
    parser.add_argument("--time-limit", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = parser.parse_args()
    instance = load_instance(args.instance)
    horizon = args.horizon_hours * 3600.0
    source = DecisionSource(args.time_limit)  # decisions on a state are shared by both runs
    model = PerfModel(instance)
    searched, _ = cached_search(instance, frozenset(), args.time_limit, model)
    best_step = model.evaluate(instance.plan).iteration_time_s
    if searched.solution is not None:
        best_step = min(best_step, model.evaluate(searched.solution).iteration_time_s)
    best_free = instance.spec.training.global_batch / best_step
    rows = []
    for seed in args.seeds:
        for repair in args.repair_hours:
            trace = published_rate_trace("llama3", instance.num_devices, horizon, seed, repair,
                                         instance.devices_per_node)
            row: dict = {"seed": seed, "repair_hours": repair, "horizon_hours": args.horizon_hours,
                         "failures": sum(e.kind == "fail" and e.time_s < horizon for e in trace),
                         "repairs": sum(e.kind == "repair" and e.time_s < horizon for e in trace)}
            for label, events in (("rejoin", trace), ("no_rejoin", [e for e in trace if e.kind == "fail"])):
                policy = Chameleon(args.time_limit, search_charge_s=args.time_limit, source=source)
                result = simulate(instance, events, policy, horizon)
                actions: dict[str, int] = {}
                for t in result.transitions:
                    if t.trigger == "repair":
                        actions[t.action] = actions.get(t.action, 0) + 1
                row[label] = {"fraction": result.average_throughput / result.failure_free_throughput,
                              "fraction_of_best_plan": result.average_throughput / best_free,
                              "average_throughput": result.average_throughput,
                              "failure_free_throughput": result.failure_free_throughput,
                              "time_in_transition_s": result.time_in_transition_s,
                              "final_step_s": result.final_step_s, "repair_actions": actions,
                              "wall_s": result.wall_s}
            rows.append(row)
            console.print(f"seed {seed}, repair {repair:g} h: {row['failures']} failures, {row['repairs']} repairs; "
                          f"with rejoin {100 * row['rejoin']['fraction']:.2f}% of failure-free "
                          f"({row['rejoin']['repair_actions']}), without {100 * row['no_rejoin']['fraction']:.2f}%; "
                          f"of the best failure-free plan {100 * row['rejoin']['fraction_of_best_plan']:.2f}% vs "
                          f"{100 * row['no_rejoin']['fraction_of_best_plan']:.2f}%")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rejoin_week.json").write_text(json.dumps({"instance": instance.name, "best_plan_step_s": best_step,
                                                           "rows": rows}, indent=1))
    lines = ["| seed | repair (h) | failures | repairs | with rejoin | without rejoin | with, of the best plan | "
             "without, of the best plan | repairs decided as |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['seed']} | {r['repair_hours']:g} | {r['failures']} | {r['repairs']} | "
              f"{100 * r['rejoin']['fraction']:.2f}% | {100 * r['no_rejoin']['fraction']:.2f}% | "
              f"{100 * r['rejoin']['fraction_of_best_plan']:.2f}% | "
              f"{100 * r['no_rejoin']['fraction_of_best_plan']:.2f}% | "
              f"{', '.join(f'{k} {v}' for k, v in sorted(r['rejoin']['repair_actions'].items()))} |" for r in rows]
    (args.out / "rejoin_week.md").write_text(
        f"Average throughput over {args.horizon_hours:g} h on {instance.name} at the Llama 3 rate, as a fraction of "
        f"failure-free on the instance's plan ({model.evaluate(instance.plan).iteration_time_s:.3f} s/step) and on the "
        f"best plan ({best_step:.3f} s/step)\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
