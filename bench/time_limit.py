"""Wall time and peak memory of `chameleon-solve plan --time-limit T` against T, from 32 to 131,072 devices.

Each job (bench/solver_scaling.py's `job()`: one GPU fails) is written to a file and planned by
the installed command in its own process, so the wall time is what an operator waits for:
interpreter start-up, imports, loading, the decision and the JSON. Every bundled instance is also
planned at `--bundled-limit` (1 s). Start-up is measured apart (`chameleon-solve --version`); the
target is wall <= 1.1 T + start-up, and peak resident memory (of the planning process alone) under
2 GiB up to 16,384 devices and 4 GiB at 131,072. Each row also says what the answer is worth: the chosen
policy, the solver's status and gap, and the stages the deadline cut short.

Writes bench/out/time_limit.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from campaign import command, measured_run, startup_s  # noqa: E402 (the bench folder is not a package)
from solver_scaling import job  # noqa: E402

from chameleon_opt.bundled import bundled_instance, bundled_instance_names  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
console = Console(width=160)
SIZES = {32: "gpt3-1.7b", 64: "gpt3-1.7b", 256: "gpt3-175b", 1024: "gpt3-175b", 4096: "llama3-405b",
         16384: "llama3-405b", 131072: "llama3-405b"}
LARGE = 65_536
"""From this many devices only limits of at least LARGE_LIMIT_S are run: loading and evaluating one
plan alone takes seconds there."""
LARGE_LIMIT_S = 10.0


def run_one(path: Path | str, limit: float, policy: str = "auto") -> dict:
    """One `plan` run in its own process: wall time, exit code, peak RSS (of that process alone)."""
    done = measured_run([*command(), "plan", str(path), "--policy", policy, "--time-limit", str(limit), "--json"])
    row: dict = {"limit_s": limit, "wall_s": done["wall_s"], "exit": done["exit"], "rss_mib": done["rss_mib"]}
    if done["exit"] == 0:
        payload = json.loads(done["stdout"])
        row.update(policy=payload["policy"], status=payload["solve"]["status"], gap=payload["solve"]["gap"],
                   planned_s=payload["wall_s"], stopped_early=payload["stopped_early"],
                   stages={s["stage"] + ("" if i < 2 else f"#{i}"): round(s["wall_s"], 3)
                           for i, s in enumerate(payload["stages"])})
    else:
        row["error"] = done["stderr"].strip().splitlines()[-1:] if done["stderr"] else []
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limits", type=float, nargs="+", default=[1.0, 5.0, 10.0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--bundled-limit", type=float, default=1.0, help="limit for every bundled instance (0: none)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = parser.parse_args()
    start_up = startup_s()
    console.print(f"start-up (chameleon-solve --version): {start_up:.3f} s")
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for devices in args.sizes:
            workload = SIZES.get(devices, "llama3-405b")
            path = Path(folder) / f"{workload}-{devices}.json"
            path.write_text(json.dumps(job(workload, devices)))
            for limit in [t for t in args.limits if devices < LARGE or t >= LARGE_LIMIT_S]:
                console.print(f"[dim]{workload} on {devices} devices, --time-limit {limit:g}...[/]")
                row = {"devices": devices, "workload": workload, **run_one(path, limit)}
                row["within"] = row["wall_s"] <= 1.1 * limit + start_up
                rows.append(row)
    for name in bundled_instance_names() if args.bundled_limit > 0 else []:
        path = bundled_instance(name)
        assert path is not None
        cluster = json.loads(path.read_text())["cluster"]
        devices = cluster["nodes"] * cluster["devices_per_node"]
        limit = args.bundled_limit if devices < LARGE else max(args.bundled_limit, LARGE_LIMIT_S)
        console.print(f"[dim]bundled {name}, --time-limit {limit:g}...[/]")
        row = {"devices": devices, "workload": f"bundled {name}", **run_one(name, limit)}
        row["within"] = row["wall_s"] <= 1.1 * limit + start_up
        rows.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "time_limit.json").write_text(json.dumps({"startup_s": start_up, "rows": rows}, indent=1) + "\n")
    table = Table(title=f"plan --time-limit T: wall vs T (start-up {start_up:.2f} s; target wall <= 1.1 T + start-up)")
    columns = ("devices", "workload", "T s", "wall s", "within", "peak RSS MiB", "policy", "status", "gap",
               "stopped early")
    for column in columns:
        table.add_column(column, justify="right")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        cells = [str(r["devices"]), r["workload"], f"{r['limit_s']:g}", f"{r['wall_s']:.2f}",
                 "yes" if r["within"] else "NO", f"{r['rss_mib']:.0f}", r.get("policy", f"exit {r['exit']}"),
                 r.get("status", "-"),
                 "-" if r.get("gap") is None else f"{r['gap']:.4f}", ", ".join(r.get("stopped_early", [])) or "-"]
        table.add_row(*cells)
        lines.append("| " + " | ".join(cells) + " |")
    console.print(table)
    (args.out / "time_limit.md").write_text(f"start-up (`chameleon-solve --version`): {start_up:.3f} s\n\n"
                                            + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
