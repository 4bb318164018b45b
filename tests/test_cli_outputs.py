"""Files the command line writes (one rule: never over an existing file without --force, atomic,
exit 2 naming the file), the plan pictures, and the small front-end defects of issue 13."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from chameleon_opt.cli import app
from chameleon_opt.errors import InputError
from chameleon_opt.instance.load import build_instance, load_instance
from chameleon_opt.output import write_output
from chameleon_opt.perf.pipeline import one_f_one_b_schedule, one_f_one_b_time
from chameleon_opt.plan import device_list

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "instances" / "paper-example.json")
runner = CliRunner()


def _is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("command", [
    ["plan", EXAMPLE, "--gantt", "{out}"],
    ["plan", EXAMPLE, "--migration-plot", "{out}"],
    ["simulate", EXAMPLE, "--horizon-hours", "1", "--policy", "recycle", "--plot", "{out}"],
    ["export", EXAMPLE, "-o", "{out}"],
])
def test_an_existing_file_is_kept_without_force(tmp_path, command):
    out = tmp_path / ("model.mps" if command[0] == "export" else "picture.png")
    out.write_bytes(b"precious")
    args = [a.replace("{out}", str(out)) for a in command]
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2, refused.output
    assert str(out) in refused.output and "--force" in refused.output and "Traceback" not in refused.output
    assert out.read_bytes() == b"precious"
    forced = runner.invoke(app, args + ["--force"])
    assert forced.exit_code == 0, forced.output
    assert out.read_bytes() != b"precious"
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary file left behind


def test_write_is_atomic_and_names_the_file(tmp_path):
    out = tmp_path / "x.json"

    def broken(path: Path) -> None:
        path.write_text("{half")
        raise OSError(28, "No space left on device")

    with pytest.raises(InputError, match="x.json: --out: could not be written"):
        write_output(out, "--out", False, broken)
    assert not out.exists() and list(tmp_path.iterdir()) == []
    with pytest.raises(InputError, match="does not exist"):
        write_output(tmp_path / "missing" / "x.json", "--out", False, lambda p: p.write_text("{}"))
    write_output(out, "--out", False, lambda p: p.write_text("{}"))
    assert out.read_text() == "{}" and out.stat().st_mode & 0o044  # readable by others, as umask allows


def test_plan_pictures_of_paper_32(tmp_path):
    gantt, moves = tmp_path / "gantt.png", tmp_path / "migration.png"
    result = runner.invoke(app, ["plan", "paper-32", "--gantt", str(gantt), "--migration-plot", str(moves),
                                 "--json", "--time-limit", "5"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["files"] == [str(gantt), str(moves)]
    assert _is_png(gantt) and _is_png(moves) and moves.stat().st_size > 20_000
    bad = runner.invoke(app, ["plan", "paper-32", "--gantt", str(tmp_path / "gantt.txt")])
    assert bad.exit_code == 2 and "gantt.txt" in bad.output and ".png" in bad.output


def test_one_f_one_b_schedule_is_the_longest_path():
    rng = random.Random(1)
    for _ in range(200):
        stages, micro = rng.randint(1, 6), rng.randint(1, 12)
        f = [rng.uniform(0.1, 2) for _ in range(stages)]
        b = [rng.uniform(0.1, 3) for _ in range(stages)]
        sched = one_f_one_b_schedule(f, b, micro)
        assert sched.makespan_s == one_f_one_b_time(f, b, micro)
        for s in range(stages):
            ops = sorted([(x, x + f[s]) for x in sched.forward_start[s]] + [(x, x + b[s]) for x in sched.backward_start[s]])
            assert all(end <= nxt + 1e-12 for (_, end), (nxt, _) in zip(ops, ops[1:]))  # one op at a time
            for m in range(micro):
                if s:
                    assert sched.forward_start[s, m] >= sched.forward_end[s - 1, m] - 1e-12
                if s + 1 < stages:
                    assert sched.backward_start[s, m] >= sched.backward_end[s + 1, m] - 1e-12
    assert one_f_one_b_time([2.0] * 3, [3.0] * 3, 20) == pytest.approx((3 + 20 - 1) * 5.0)  # Eq. 9


def test_device_groups_never_hide_a_gap():
    assert device_list((12, 14)) == "12,14"
    assert device_list((0, 1)) == "0,1"
    assert device_list((8, 9, 10, 12, 13, 14, 15, 16)) == "8-10,12-16"
    assert device_list(tuple(range(8))) == "0-7"


@pytest.mark.parametrize("trace,named", [
    ("synthetic:mtbf_hours=abc", "mtbf_hours"), ("synthetic:mtbf=1", "mtbf_hours, seed, repair_hours"),
    ("synthetic:seed=1.5", "seed"), ("synthetic:mtbf_hours=-1", "mtbf_hours"), ("llama3:mtbf_hours=5", "seed"),
    ("instance:seed=1", "none"),
])
def test_bad_trace_options_are_one_line_errors(trace, named):
    result = runner.invoke(app, ["simulate", EXAMPLE, "--trace", trace, "--horizon-hours", "0.5"])
    assert result.exit_code == 2 and "--trace" in result.output and named in result.output
    assert "Traceback" not in result.output


def test_deterministic_simulation_repeats_exactly_on_a_slow_clock(monkeypatch):
    """Two runs of one simulation give the same report, the second with a wall clock running four
    times too fast (every stage's share of the time limit passes four times sooner, as on a machine
    four times slower: the failure seen at load 8), since `--deterministic` charges work, not time.
    The limit is one the searches end well within (0.2-0.4 s each on paper-32): one the deadline cuts
    short returns what it had found by then, which a busy machine changes (seen at 1 s under load 4-5).
    Three hours of this trace hold one failure (at 2.03 h), so each run plans one recovery: a second
    failure (at 10.3 h) cost 10 s of the suite and takes the same path."""
    import time

    from chameleon_opt.recovery import interface

    args = ["simulate", "paper-32", "--trace", "synthetic:mtbf_hours=500,seed=2", "--horizon-hours", "3",
            "--policy", "chameleon", "--policy", "hybrid", "--deterministic", "--time-limit", "5", "--json"]

    def run() -> dict:
        interface._SEARCHES.clear()  # the memoised searches would hide the second run's own
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        payload = json.loads(result.stdout)
        for r in payload["results"].values():
            r.pop("wall_s")  # the simulator's own run time
        return payload

    quiet = run()
    real = time.perf_counter
    monkeypatch.setattr(time, "perf_counter", lambda: 4 * real())
    assert run() == quiet and quiet["search_charge"] == "5.0 s per search"
    assert [r["num_transitions"] for r in quiet["results"].values()] == [1, 1]


def test_schema_key_is_accepted_and_ignored():
    data = json.loads(Path(EXAMPLE).read_text())
    plain = build_instance(data, EXAMPLE)
    tagged = build_instance({"$schema": "https://example.org/instance.schema.json", **data}, EXAMPLE)
    assert tagged.plan == plain.plan and tagged.spec == plain.spec
    with pytest.raises(InputError, match=r"\$schema"):
        build_instance({"$schema": 3, **data}, EXAMPLE)
    assert "$schema" in json.loads(runner.invoke(app, ["schema"]).stdout)["properties"]


def test_proto_export_states_its_objective_unit(tmp_path):
    out = tmp_path / "model.txt"
    result = runner.invoke(app, ["export", "paper-32", "--format", "proto", "-o", str(out)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "integer microseconds" in text and "floor(objective /" in text
    assert out.read_text().startswith("variables")
    assert load_instance("paper-32").name == "paper-32"
