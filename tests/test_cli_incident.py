"""Naming the failure on the command line (`--failed`, `--failed-node`, `--replace-failures`), the
nothing-failed outcome (exit 6), and export-plan deciding as `plan` does (issue 25)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from chameleon_opt.cli import app
from chameleon_opt.errors import InputError
from chameleon_opt.incident import failed_devices, parse_ids
from chameleon_opt.instance.load import load_instance

runner = CliRunner()


def test_ids_ranges_and_lists():
    assert parse_ids(["5,22", "8-10"], "--failed", 32, "device") == [5, 22, 8, 9, 10]
    assert parse_ids([" 3 - 4 ,", ""], "--failed", 32, "device") == [3, 4]
    for text, problem in (("x", "cannot read"), ("15-8", "runs backwards"), ("32", "device 32 does not exist"),
                          ("-1", "cannot read"), ("1-", "cannot read")):
        with pytest.raises(InputError, match=problem) as caught:
            parse_ids([text], "--failed", 32, "device")
        assert str(caught.value).startswith("command line: --failed: ")


def test_command_line_failures_merge_with_the_file_or_replace_them():
    instance = load_instance("paper-32")  # its file: device 13 fails
    assert failed_devices(instance) == {13}
    assert failed_devices(instance, ["5"]) == {5, 13}
    assert failed_devices(instance, failed_nodes=["1"]) == set(range(8, 16))
    assert failed_devices(instance, ["30"], ["0,2"], replace=True) == {*range(8), *range(16, 24), 30}
    assert failed_devices(instance, replace=True) == frozenset()


def test_plan_for_a_failed_node_named_on_the_command_line():
    result = runner.invoke(app, ["plan", "paper-32", "--failed-node", "1", "--replace-failures", "--json",
                                 "--time-limit", "5"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    used = {d for p in payload["plan"]["pipelines"] for s in p["stages"] for d in s["devices"]}
    assert used and not used & set(range(8, 16))
    assert sum(p["micro_batches"] for p in payload["plan"]["pipelines"]) == 256


@pytest.mark.parametrize("command", [["plan", "paper-32", "--replace-failures"],
                                     ["estimate", "paper-32", "--after-failure", "--replace-failures"]])
def test_nothing_failed_is_its_own_exit(command):
    human = runner.invoke(app, command)
    assert human.exit_code == 6 and human.stdout == ""
    assert "nothing failed" in human.stderr and "--failed-node" in human.stderr
    as_json = runner.invoke(app, command + ["--json"])
    assert as_json.exit_code == 6
    assert json.loads(as_json.stdout) == {"format": 1, "error": "NothingFailed", "exit_code": 6,
                                          "reason": json.loads(as_json.stdout)["reason"]}


def test_bad_failure_flags_are_one_line_errors():
    for flag, value, named in (("--failed", "40", "device 40 does not exist"), ("--failed-node", "4", "node 4"),
                               ("--failed", "a-b", "cannot read")):
        result = runner.invoke(app, ["plan", "paper-32", flag, value, "--json"])
        assert result.exit_code == 2 and named in result.stderr and "Traceback" not in result.output
        assert json.loads(result.stdout)["exit_code"] == 2


def test_estimate_after_a_failure_named_on_the_command_line_is_the_files():
    from_file = runner.invoke(app, ["estimate", "paper-32", "--after-failure", "--json"])
    from_flag = runner.invoke(app, ["estimate", "paper-32", "--failed", "13", "--replace-failures", "--json"])
    assert from_file.exit_code == from_flag.exit_code == 0
    assert json.loads(from_file.stdout) == json.loads(from_flag.stdout)


def test_export_plan_decides_as_plan_and_says_what_it_wrote(tmp_path):
    args = ["paper-example", "--time-limit", "5"]
    decided = json.loads(runner.invoke(app, ["plan", *args, "--json"]).stdout)["policy"]
    printed = runner.invoke(app, ["export-plan", *args, "--format", "ranks"])
    assert printed.exit_code == 0, printed.output
    assert json.loads(printed.stdout)["policy"] == decided  # the plan goes to stdout, the note to stderr
    assert printed.stderr.startswith("printed: ") and "failed ranks 4" in printed.stderr
    out = tmp_path / "plan.json"
    written = runner.invoke(app, ["export-plan", *args, "--format", "ranks", "--failed", "7", "-o", str(out)])
    assert written.exit_code == 0, written.output
    assert f"wrote {out}" in written.stdout and "failed ranks 4,7" in written.stdout
    assert json.loads(out.read_text())["failed"] == [4, 7]
    unchanged = runner.invoke(app, ["export-plan", "paper-example", "--replace-failures", "--format", "ranks"])
    assert unchanged.exit_code == 0 and "the current plan (nothing failed)" in unchanged.stderr
