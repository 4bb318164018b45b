"""`simulate` through the CLI: JSON results, the plot, refusals that name the field."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from chameleon_opt.cli import POLICY_NAMES, app
from chameleon_opt.recovery.registry import POLICIES

EXAMPLE = str(Path(__file__).resolve().parents[1] / "instances" / "paper-example.json")
runner = CliRunner()


def test_policy_names_in_help_match_the_simulator():
    assert set(POLICIES) == set(POLICY_NAMES)


def test_simulate_json_and_plot(tmp_path):
    plot = tmp_path / "timeline.png"
    result = runner.invoke(app, ["simulate", EXAMPLE, "--trace", "instance", "--horizon-hours", "4",
                                 "--policy", "chameleon", "--policy", "recycle", "--plot", str(plot), "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert set(payload["results"]) == {"chameleon", "recycle"}
    for r in payload["results"].values():
        assert r["average_throughput"] > 0 and r["samples"] > 0
        assert r["samples"] == __import__("pytest").approx(r["average_throughput"] * r["horizon_s"])
    assert plot.stat().st_size > 0
    again = runner.invoke(app, ["simulate", EXAMPLE, "--plot", str(plot), "--horizon-hours", "1"])
    assert again.exit_code == 2 and "--force" in again.output


def test_simulate_unknown_policy_is_a_clean_error():
    result = runner.invoke(app, ["simulate", EXAMPLE, "--policy", "nonsense"])
    assert result.exit_code == 2 and "--policy" in result.output and "chameleon" in result.output
