"""The comparison protocol and the baselines' mechanisms (ReCycle, Bamboo) on small instances."""

from __future__ import annotations


import pytest

from chameleon_opt.instance.load import load_instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.recovery.bamboo import FALLBACK_SLOWDOWN, USEFUL_FRACTION, Bamboo
from chameleon_opt.recovery.interface import PolicyState, at_state
from chameleon_opt.recovery.compare import PerturbedModel, make_trace, run_one, summary
from chameleon_opt.recovery.recycle import ReCycle


@pytest.fixture(scope="module")
def paper32():
    return load_instance("paper-32")


def test_oobleck_cadence_traces_remove_one_unit_per_interval(paper32):
    trace, horizon, _ = make_trace(paper32, "node", "1h", 0)
    assert [e.time_s for e in trace] == [3600.0, 7200.0] and horizon == 3 * 3600.0
    assert all(len(e.devices) == 8 for e in trace)  # a node: all its devices
    card, _, _ = make_trace(paper32, "card", "10m", 0)
    assert len(card) == 6 and all(len(e.devices) == 1 for e in card)


def test_perturbed_model_stays_within_ten_percent(paper32):
    true, believed = PerfModel(paper32), PerturbedModel(paper32, seed=3)
    a, b = true.evaluate(paper32.plan), believed.evaluate(paper32.plan)
    ratio = b.iteration_time_s / a.iteration_time_s
    assert ratio != 1.0 and 0.9 <= ratio <= 1.1


def test_bamboo_pays_redundancy_always_and_slows_on_takeover(paper32):
    policy = Bamboo()
    free = PerfModel(paper32).evaluate(paper32.plan).iteration_time_s
    start = policy.respond(PolicyState(paper32, frozenset(), "start"))
    assert start.step_s == pytest.approx(free / USEFUL_FRACTION)
    dead = frozenset({13})  # pipeline 1, stage 2: its predecessor takes over
    taken = policy.respond(PolicyState(at_state(paper32, paper32.plan, dead), dead, "fail", dead, 60.0))
    assert taken.action == "takeover" and taken.step_s == pytest.approx(start.step_s * FALLBACK_SLOWDOWN)
    both = frozenset({11, 13})  # stage 1 and stage 2 of pipeline 1: the replica holder is gone too
    fatal = policy.respond(PolicyState(at_state(paper32, paper32.plan, both), both, "fail", frozenset({11}), 90.0))
    assert fatal.action in ("reconfigure", "restart") and fatal.fallback


def test_recycle_fills_bubbles_with_whole_micro_batches():
    example = load_instance("paper-example")  # method.md: 3 stages x 4 pipelines, t_f 2, t_b 3
    dead = frozenset({0})
    response = ReCycle().respond(PolicyState(at_state(example, example.plan, dead), dead, "fail", dead, 1.0))
    assert response.action == "reroute"
    assert all(float(r.micro_batches).is_integer() for r in response.plan.rerouted)
    assert response.step_s < 35 + 25 / 3 - 1  # below Eq. 12/13's serial step (43.33 s)


def test_protocol_reports_ratios_regret_and_the_post_failure_window(paper32):
    run = run_one(paper32, "node", "1h", 0, time_limit_s=1.0)
    assert set(run.measures) >= {"oobleck", "recycle", "bamboo", "checkpoint", "chameleon", "chameleon-blind",
                                 "hindsight"}
    for name, m in run.measures.items():
        assert 0 < m.post_failure <= m.average * 1.5 and m.downtime_s >= 0, name
    # The row is arithmetic on the measures (no claim about which policy wins: a 1 s search decides
    # that, and the bench reports it): each ratio, the regret and the best-baseline verdict.
    row = summary([run])[0]
    measures = run.measures
    for adaptive in ("chameleon", "chameleon-blind"):
        for base in ("oobleck", "recycle", "bamboo", "checkpoint"):
            assert row[f"{adaptive}/{base}"] == pytest.approx(measures[adaptive].average / measures[base].average)
            assert row[f"{adaptive}/{base} post-failure"] == pytest.approx(
                measures[adaptive].post_failure / measures[base].post_failure)
        assert row[f"{adaptive} regret"] == pytest.approx(1 - measures[adaptive].average / measures["hindsight"].average)
        best = max(measures[b].average for b in ("oobleck", "recycle", "bamboo", "checkpoint"))
        assert row[f"{adaptive}/best baseline"] == pytest.approx(measures[adaptive].average / best)
    assert row["seeds"] == 1 and (row["suite"], row["cadence"]) == ("node", "1h")
    assert row["checkpoint restarts"] == len(make_trace(paper32, "node", "1h", 0)[0])  # one restart a failure


def test_compare_command_json_plot_and_refusals(tmp_path):
    import json

    from typer.testing import CliRunner

    from chameleon_opt.cli import app

    runner = CliRunner()
    plot = tmp_path / "compare.png"
    result = runner.invoke(app, ["compare", "paper-32", "--suite", "node", "--cadence", "1h", "--time-limit", "1",
                                 "--plot", str(plot), "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["rows"][0]["suite"] == "node" and plot.stat().st_size > 0
    again = runner.invoke(app, ["compare", "paper-32", "--suite", "node", "--cadence", "1h", "--plot", str(plot)])
    assert again.exit_code == 2  # never over an existing file without --force
    bad = runner.invoke(app, ["compare", "paper-32", "--suite", "rack"])
    assert bad.exit_code == 2 and "--suite" in bad.output
