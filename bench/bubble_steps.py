"""The rerouted step of the tiny-GPT runtime: bubble-filled schedule against the serial split.

One worker is SIGKILLed in step `--kill-step` and the job reroutes (`--policy reroute`), once with
bubble filling on (the workers run the priced CP-SAT schedule: split backward, W deferred into
the peers' idle time) and once off (Eq. 12/13's shares in the runtime's 1F1B list order, full
backward); the two alternate `--repeats` times so that drift in the machine's load hits both.
Reported per mode: the planner's predicted step and the median measured step of the rerouted
generation (its first step left out). With fewer cores than workers + 1 the workers share cores,
and a bubble on one worker is another's compute time: the measured difference then says little.

    .venv/bin/python bench/bubble_steps.py [--instance instances/runtime-cpu-4.json] [--repeats 2]
Writes bench/out/bubble_steps.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chameleon_opt.instance.load import load_instance  # noqa: E402
from chameleon_opt.runtime.controller import Failure, run_training  # noqa: E402
from chameleon_opt.runtime.cores import available_cores, dedicated_cores  # noqa: E402

OUT = ROOT / "bench" / "out"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instance", type=Path, default=ROOT / "instances" / "runtime-cpu-4.json")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--kill-step", type=int, default=1)
    parser.add_argument("--victim", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    instance = load_instance(args.instance)
    pinned = dedicated_cores(len(instance.plan.devices))
    runs: dict[str, list[dict[str, float | str]]] = {"bubble-filled": [], "serial": []}
    for _ in range(args.repeats):
        for mode in runs:
            report = run_training(instance, args.steps, (Failure(args.kill_step, (args.victim,), after_ops=2),),
                                  policy="reroute", cores=pinned, bubble_filling=mode == "bubble-filled")
            rerouted = report.generations[-1]
            runs[mode].append({"schedule": rerouted.schedule, "predicted_s": rerouted.predicted_step_s,
                               "measured_median_s": statistics.median(rerouted.step_times_s[1:]),
                               "planning_s": report.recoveries[0].planning_s})
            print(f"{mode}: ran {rerouted.schedule}, predicted {rerouted.predicted_step_s * 1e3:.2f} ms, measured "
                  f"median {runs[mode][-1]['measured_median_s'] * 1e3:.1f} ms, planning "
                  f"{report.recoveries[0].planning_s * 1e3:.0f} ms", flush=True)
    summary = {mode: {"predicted_s": rows[0]["predicted_s"],
                      "measured_median_s": statistics.median(float(r["measured_median_s"]) for r in rows)}
               for mode, rows in runs.items()}
    ratio = summary["bubble-filled"]["measured_median_s"] / summary["serial"]["measured_median_s"]
    predicted = summary["bubble-filled"]["predicted_s"] / summary["serial"]["predicted_s"]
    where = "a core per worker" if pinned is not None else f"workers SHARING {len(available_cores())} cores"
    print(f"bubble-filled / serial step: measured {ratio:.3f}, predicted {predicted:.3f} ({where})")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "bubble_steps.json").write_text(json.dumps({"instance": str(args.instance), "dedicated_cores":
                                                       pinned is not None, "runs": runs, "summary": summary,
                                                       "measured_ratio": ratio, "predicted_ratio": predicted},
                                                      indent=2))


if __name__ == "__main__":
    main()
