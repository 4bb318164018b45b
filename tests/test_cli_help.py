"""The CLI contract for usage errors (one JSON object with --json, exit 2) and help an operator can
read: panels, whole option names, choices listed (issue 25)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from chameleon_opt.cli import app

runner = CliRunner()


@pytest.mark.parametrize("args,error,named", [
    (["plan", "paper-32", "--time-limit", "0", "--json"], "BadParameter", "--time-limit"),
    (["plan", "paper-32", "--bogus", "--json"], "NoSuchOption", "--bogus"),
    (["plan", "--json"], "MissingParameter", "file"),
    (["plan", "paper-32", "--backend", "gurobi", "--json"], "BadParameter", "'cpsat', 'highs', 'cbc'"),
    (["simulate", "paper-32", "--horizon-hours", "-1", "--json"], "BadParameter", "--horizon-hours"),
    (["plann", "paper-32", "--json"], "UsageError", "plann"),
])
def test_usage_errors_keep_the_json_contract(args, error, named):
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    lines = result.stdout.splitlines()
    assert len(lines) == 1, result.stdout
    payload = json.loads(lines[0])
    assert payload["error"] == error and payload["exit_code"] == 2 and named in payload["reason"]
    assert named in result.stderr  # the person still reads it on stderr


def test_usage_error_without_json_prints_nothing_on_stdout():
    result = runner.invoke(app, ["plan", "paper-32", "--time-limit", "0"])
    assert result.exit_code == 2 and result.stdout == "" and "--time-limit" in result.stderr


def test_help_is_grouped_whole_and_lists_choices():
    text = runner.invoke(app, ["plan", "--help"]).stdout
    panels = [title for title in ("Failure", "Decision", "Solver", "Output") if f"─ {title} ─" in text]
    assert panels == ["Failure", "Decision", "Solver", "Output"]
    assert text.index("─ Failure ─") < text.index("─ Decision ─")  # the incident's options first
    assert "<auto|reroute|reconfigure>" in text and "<cpsat|highs|cbc>" in text
    replace_line = next(line for line in text.splitlines() if "--replace-failures" in line)
    assert "<bool>" not in replace_line
    demo = runner.invoke(app, ["demo", "--help"]).stdout
    assert "--kill-in-transition" in demo and "…" not in demo
    for command in ("simulate", "compare"):  # why their default limit is not plan's
        assert "not plan's 10 s" in " ".join(runner.invoke(app, [command, "--help"]).stdout.split())
