"""`plan` and `export` through the CLI: the contract's keys, exit codes, and models any solver can read."""

from __future__ import annotations

import json
from pathlib import Path

import pulp
import pytest
from typer.testing import CliRunner

from chameleon_opt.cli import app
from chameleon_opt.instance.load import load_instance
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.solve.search import search_plan

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "instances" / "paper-example.json")
runner = CliRunner()


def test_plan_json_follows_the_contract():
    result = runner.invoke(app, ["plan", EXAMPLE, "--json", "--time-limit", "5"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    for key in ("format", "policy", "reason", "candidates", "plan", "solve", "migration", "allreduce_rounds"):
        assert key in payload
    assert payload["policy"] in ("reroute", "reconfigure", "hybrid")
    assert {c["policy"] for c in payload["candidates"]} == {"reroute", "reconfigure", "hybrid"}
    for c in payload["candidates"]:
        assert set(c) >= {"policy", "feasible", "reason", "iteration_time_s", "transition_time_s", "score"}
    assert set(payload["solve"]) >= {"status", "objective", "bound", "gap", "wall_s", "backend"}
    micro = sum(p["micro_batches"] for p in payload["plan"]["pipelines"])
    assert micro == 20
    devices = [d for p in payload["plan"]["pipelines"] for s in p["stages"] for d in s["devices"]]
    assert 4 not in devices or payload["policy"] == "reroute"
    migration = payload["migration"]
    assert set(migration) == {"transfers", "rounds", "makespan_s", "lower_bound_s"}
    assert migration["makespan_s"] >= migration["lower_bound_s"] - 1e-9
    for transfer in migration["transfers"]:
        assert set(transfer) == {"tensor", "src", "dst", "bytes", "round"} and transfer["src"] != 4
    groups = [g for round_ in payload["allreduce_rounds"] for g in round_]
    assert groups and all(isinstance(g, str) for g in groups)
    if payload["policy"] == "hybrid":  # the plan to switch to, and the rerouted one run meanwhile
        assert sum(p["micro_batches"] for p in payload["interim"]["plan"]["pipelines"]) == 20


@pytest.mark.parametrize("policy", ["reroute", "reconfigure"])
def test_plan_forced_policy(policy):
    result = runner.invoke(app, ["plan", EXAMPLE, "--json", "--policy", policy])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["policy"] == policy


def test_plan_unrecoverable_exits_5(tmp_path):
    data = json.loads(Path(EXAMPLE).read_text())
    data["failures"]["events"] = [{"time_s": 0, "devices": [1, 4, 7, 10]}]
    path = tmp_path / "lost.json"
    path.write_text(json.dumps(data))
    result = runner.invoke(app, ["plan", str(path)])
    assert result.exit_code == 5
    assert "checkpoint" in result.output


def test_plan_without_usable_candidate_exits_3_with_the_reason():
    """Reconfiguration alone, but the next fault comes before its transition ends (Eq. 8: unusable)."""
    result = runner.invoke(app, ["plan", EXAMPLE, "--policy", "reconfigure", "--next-fault-s", "0.001", "--json"])
    assert result.exit_code == 3
    payload = json.loads(result.stdout)
    assert "outlasts D = 0.001 s" in payload["reason"]


@pytest.mark.parametrize("fmt,suffix", [("mps", ".mps"), ("lp", ".lp"), ("proto", ".pb.txt")])
def test_export_writes_a_model_and_never_overwrites(tmp_path, fmt, suffix):
    out = tmp_path / f"model{suffix}"
    first = runner.invoke(app, ["export", EXAMPLE, "-o", str(out), "--format", fmt])
    assert first.exit_code == 0, first.output
    assert out.stat().st_size > 0
    before = out.read_bytes()
    again = runner.invoke(app, ["export", EXAMPLE, "-o", str(out), "--format", fmt])
    assert again.exit_code == 2 and "--force" in again.output
    assert out.read_bytes() == before


def test_exported_mps_solved_by_cbc_matches_the_search(tmp_path):
    out = tmp_path / "levels.mps"
    assert runner.invoke(app, ["export", EXAMPLE, "-o", str(out)]).exit_code == 0
    _, problem = pulp.LpProblem.fromMPS(str(out), sense=pulp.LpMinimize)
    problem.solve(pulp.PULP_CBC_CMD(msg=False, timeLimit=20))
    assert pulp.LpStatus[problem.status] == "Optimal"
    instance = load_instance(EXAMPLE)
    result = search_plan(instance, instance.failed_devices, Deadline.after(5))
    assert pulp.value(problem.objective) == pytest.approx(result.objective, rel=1e-6)
