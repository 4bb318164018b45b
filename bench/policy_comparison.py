"""The adaptive policy against Oobleck, ReCycle, Bamboo and checkpointing under the protocol of
`chameleon_opt.recovery.compare` (issue 15): card and node failure suites, Oobleck's trace
cadences (6h, 3h, 1h, 30m, 10m) and the Llama 3 / OPT-175B rates, three seeded traces each, on
three workloads on 4 x 8 A100-40 that start from a uniform layout (ReCycle's requirement):

    gpt3-1.7b (TP 1 x PP 4 x DP 8), gpt3-7.5b (TP 2 x PP 4 x DP 4, the paper's 32 GPUs),
    llama2-7b (TP 2 x PP 2 x DP 8).

Per row (workload x suite x cadence): adaptive / each baseline on the whole horizon and on the
post-failure window, adaptive / best baseline (told and blind), regret to hindsight, and each
policy's post-recovery rate, downtime and restarts. Writes bench/out/policy_comparison.{json,md}
and one plot per workload.
Run: python bench/policy_comparison.py [--seeds 3] [--time-limit 2] [--workloads gpt3-7.5b ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # measure this checkout's package, not whichever one pip installed

from chameleon_opt.instance.load import build_instance, read_document
from chameleon_opt.output import save_figure
from chameleon_opt.recovery.compare import CADENCES, PUBLISHED, SUITES, comparison_figure, run_one, summary
from chameleon_opt.recovery.registry import BASELINES

console = Console(width=200)
WORKLOADS = {  # workload, sequence length, global batch, micro-batch size, TP, PP, DP
    "gpt3-1.7b": ("gpt3-1.7b", 2048, 512, 4, 1, 4, 8),
    "gpt3-7.5b": ("gpt3-7.5b", 2048, 512, 2, 2, 4, 4),
    "llama2-7b": ("llama2-7b", 4096, 256, 1, 2, 2, 8),
}


def instance_32(name: str):
    workload, seq, batch, micro, tp, pp, dp = WORKLOADS[name]
    data = read_document(ROOT / "instances" / "paper-32.json")
    data.update({"name": f"{name}-32", "description": f"{name} on 4 x 8 A100-40, TP {tp} x PP {pp} x DP {dp}",
                 "workload": {"model": workload},
                 "training": {"global_batch": batch, "micro_batch_size": micro, "sequence_length": seq,
                              "precision": "bf16"},
                 "plan": {"tensor_parallel": tp, "layout": {"pipeline_parallel": pp, "data_parallel": dp}},
                 "failures": {}})
    return build_instance(data, f"<{name}-32>")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--time-limit", type=float, default=2.0)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows, everything = [], {}
    for name in args.workloads:
        instance = instance_32(name)
        runs = []
        for suite in SUITES:
            for cadence in list(CADENCES) + list(PUBLISHED):
                for seed in range(args.seeds):
                    console.print(f"[dim]{name}: {suite} failures, {cadence}, seed {seed}[/]")
                    runs.append(run_one(instance, suite, cadence, seed, BASELINES, args.time_limit))
        for row in summary(runs):
            rows.append({"workload": name, **row})
        everything[name] = [r.to_json() for r in runs]
        save_figure(comparison_figure(runs, f"{name} on 32 A100-40"), args.out / f"policy_comparison_{name}.png",
                    "--out", force=True)
    columns = ["workload", "suite", "cadence"] + [f"chameleon/{b}" for b in BASELINES] + [
        "chameleon/best baseline", "chameleon-blind/best baseline", "chameleon regret", "chameleon-blind regret"]
    lines = ["# Policy comparison", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [str(row[c]) if isinstance(row[c], str) else f"{row[c]:.3f}" for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
        console.print("  ".join(cells))
    (args.out / "policy_comparison.md").write_text("\n".join(lines) + "\n")
    (args.out / "policy_comparison.json").write_text(json.dumps({"rows": rows, "runs": everything}, indent=1))
    console.print(f"wrote {args.out}/policy_comparison.{{md,json}} and one plot per workload")


if __name__ == "__main__":
    main()
