"""The operator's reading of plans (chameleon_opt/describe.py): rounding, device ranges, and what
every device does, at 32 and at 16,384 devices (issue 25)."""

from __future__ import annotations

import math
import re

from typer.testing import CliRunner

from chameleon_opt.cli import app
from chameleon_opt.describe import devices, duration, failure_title, layout_lines, plural, ranges, sig
from chameleon_opt.instance.load import load_instance
from chameleon_opt.perf.reroute import even_reroute


def test_numbers_are_rounded_to_what_an_operator_acts_on():
    assert [sig(x) for x in (12.1702, 9.689, 0.4512, 5.0, 0.0, 5885071.0)] == [
        "12.2", "9.69", "0.451", "5", "0", "5,890,000"]
    assert sig(math.inf) == "never"
    assert [duration(x) for x in (5885071.0, 35.4, 300.0, 7200.0, math.inf, 0.45)] == [
        "68 d", "35.4 s", "5 min", "2 h", "never", "0.45 s"]
    assert [plural(1, "device"), plural(2, "device"), plural(1, "micro-batch"), plural(21.333, "micro-batch")] == [
        "1 device", "2 devices", "1 micro-batch", "21.3 micro-batches"]


def test_device_ranges_are_compact_and_bounded():
    assert ranges([*range(7), *range(8, 16)]) == "0-6, 8-15"
    assert devices([7]) == "device 7" and devices([]) == "no device" and devices([3, 1, 2]) == "devices 1-3"
    scattered = ranges(range(0, 100, 2))  # 50 runs: ten shown, the other 40 devices counted
    assert scattered.endswith(", and 40 more") and scattered.startswith("0, 2, 4")


def test_failure_title_names_nodes():
    assert failure_title("paper-32", frozenset(range(8, 16)), 32, 8) == \
        "paper-32: devices 8-15 failed (all of node 1); 24 of 32 devices left"
    assert failure_title("x", frozenset({13}), 32, 8) == "x: device 13 failed (on node 1); 31 of 32 devices left"


def _listed(lines: list[str]) -> list[int]:
    """Every device id the lines give a role (`devices 0-6, 8-15: ...`, `idle: device 12`)."""
    out: list[int] = []
    for line in lines:
        label, _, rest = line.partition(": ")
        head = rest if label in ("idle", "failed") else label
        for a, b in re.findall(r"(\d+)(?:-(\d+))?", head):
            out.extend(range(int(a), int(b or a) + 1))
    return out


def test_every_device_is_named_once_under_a_rerouting():
    instance = load_instance("paper-32")
    failed = frozenset({13})
    lines = layout_lines(even_reroute(instance.plan, failed), failed, 32, instance.plan)
    assert sorted(_listed(lines)) == list(range(32))
    assert lines[-2:] == ["idle: device 12", "failed: device 13"]
    assert "stage 2 (devices 4-5, 20-21, 28-29) also runs 21.3 micro-batches each of pipeline 1's stage 2" in lines[0]
    assert lines[1].startswith("devices 8-11, 14-15: 1 pipeline as before") and "stage 2 lost" in lines[1]


def test_sixteen_thousand_devices_read_in_a_few_lines():
    instance = load_instance("llama3-405b-16k")
    failed = frozenset(range(8 * 100, 8 * 101))  # node 100
    lines = layout_lines(even_reroute(instance.plan, failed), failed, instance.num_devices, instance.plan)
    assert len(lines) <= 4 and max(map(len, lines)) < 400, lines
    assert lines[-1] == "failed: devices 800-807"
    assert "127 pipelines as before" in lines[0]


def test_plan_says_what_every_device_does_now_and_after():
    result = CliRunner().invoke(app, ["plan", "paper-32", "--failed-node", "1", "--time-limit", "5"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "paper-32: devices 8-15 failed (all of node 1); 24 of 32 devices left" in text
    assert "failed: devices 8-15" in text and "decision:" in text and "why:" in text
    if "hybrid" in text.split("decision:")[1][:10]:
        assert "now, rerouted" in text and "after the switch" in text
    for raw in ("inf s", "e+0", "1 devices", "0.00 micro"):
        assert raw not in text
