"""Memory relief per stage: the model's prices, the checker, and the plan search against a brute
force over (plan x per-stage relief), written apart from the search and from perf/relief.py."""

from __future__ import annotations

import functools
import math
import random
from typing import Any

import pytest

from chameleon_opt.check import check_plan
from chameleon_opt.instance.load import build_instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.perf.relief_kinds import parse_relief, relief_options
from chameleon_opt.plan import Pipeline, Plan, Stage
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.solve.result import Status
from chameleon_opt.solve.search import search_plan
from test_search_exact import all_plans

RELIEFS = ["none", "full", "offload", "opt-offload"]


def _instance(seed: int) -> tuple[dict[str, Any], frozenset[int]]:
    """Small random instances where memory binds and the host link is slow or fast."""
    rng = random.Random(seed)
    devices = rng.choice([2, 3])
    layers = rng.choice([2, 3])
    micro = rng.randint(1, 3)
    params = [rng.randint(1, 6) * 10 ** 7 for _ in range(layers)]
    activation = [rng.randint(1, 8) * 10 ** 8 for _ in range(layers)]
    boundary = [rng.choice([10 ** 6, 10 ** 7]) for _ in range(layers)]
    state = sum(params) * 16 / 2 ** 30
    memory = state * rng.uniform(0.4, 1.2) + rng.choice([0.3, 1.0, 3.0])
    times = [[rng.uniform(0.2, 2.0), rng.uniform(0.2, 4.0), 0.0] for _ in range(layers)]
    data = {
        "format": 1, "name": f"relief-{seed}",
        "cluster": {"nodes": 1, "devices_per_node": devices,
                    "device_type": {"name": "d", "memory_gib": memory, "peak_tflops": 2, "reserved_gib": 0,
                                    "memory_bandwidth_gbps": 10},
                    "network": {"intra_node_gbps": 100, "inter_node_gbps": 10,
                                "host_link_gbps": rng.choice([0.2, 1.0, 25.0]), "host_memory_gbps": 5}},
        "workload": {"inline": {"name": "toy", "layer_bytes": {
            "params": params, "activation_bytes_per_sample": activation, "boundary_bytes_per_sample": boundary},
            "profiles": [{"device_type": "d", "times": {"1": {"1": times}}}]}},
        "training": {"global_batch": micro, "micro_batch_size": 1, "reliefs": RELIEFS},
        "plan": {"tensor_parallel": 1, "layout": {"pipeline_parallel": 1, "data_parallel": min(micro, devices)}},
    }
    failed = frozenset(rng.sample(range(devices), rng.randint(0, 1)))
    return data, failed


def brute_force(instance, failed: frozenset[int]) -> float:
    """Every plan of the space (test_search_exact's enumeration) times every relief on every stage."""
    model = PerfModel(instance)
    best = math.inf
    for plan in all_plans(instance, failed, relief_options(RELIEFS, "none")):
        estimate = model.evaluate(plan, failed)
        if estimate.memory_ok:
            best = min(best, estimate.iteration_time_s)
    return best


@functools.lru_cache(maxsize=None)
def relief_optimum(seed: int) -> float:
    """`brute_force` on seed's instance, once per seed: two tests compare against it."""
    data, failed = _instance(seed)
    return brute_force(build_instance(data), failed)


def test_relief_names_and_default_options() -> None:
    assert parse_relief("full+opt-offload") == ("full", True)
    assert parse_relief("opt-offload") == ("none", True)
    with pytest.raises(ValueError):
        parse_relief("swap")
    assert relief_options(None, "selective") == ("selective",)
    assert relief_options(["none", "offload", "opt-offload"], "none") == (
        "none", "offload", "opt-offload", "offload+opt-offload")


def test_relief_prices_hand_worked() -> None:
    """One stage, two layers: offload keeps two micro-batches and lasts max(compute, copy); full
    recomputation adds the forward to the backward; opt-offload drops the optimizer state."""
    data, _ = _instance(1)
    data["workload"]["inline"]["layer_bytes"] = {"params": [10 ** 7, 10 ** 7], "activation_bytes_per_sample": [
        10 ** 9, 10 ** 9], "boundary_bytes_per_sample": [10 ** 6, 10 ** 6]}
    data["workload"]["inline"]["profiles"] = [{"device_type": "d", "times": {"1": {"1": [[0.5, 1.0, 0], [0.5, 1.0, 0]]}}}]
    data["cluster"]["network"]["host_link_gbps"] = 1.0
    data["cluster"]["devices_per_node"] = 2
    data["training"]["global_batch"] = 4
    instance = build_instance(data)
    model = PerfModel(instance)
    devices = (0,)
    assert model.stage_times(devices, 0, 2, "none")[:2] == pytest.approx((1.0, 2.0))
    assert model.stage_times(devices, 0, 2, "full")[:2] == pytest.approx((1.0, 3.0))
    assert model.stage_times(devices, 0, 2, "offload")[:2] == pytest.approx((2.0, 2.0))  # 2e9 B at 1 GB/s
    # stage 0 of 4 with 4 micro-batches: 4 in flight, offload keeps 2
    keep = model.stage_memory_breakdown(devices, 0, 2, 0, 4, 4, relief="none").activations
    off = model.stage_memory_breakdown(devices, 0, 2, 0, 4, 4, relief="offload").activations
    assert keep == pytest.approx(4 * 2e9) and off == pytest.approx(2 * 2e9)
    assert model.stage_memory_breakdown(devices, 0, 2, 0, 4, 4, relief="opt-offload").optimizer == 0.0
    assert model.stage_memory_breakdown(devices, 0, 2, 0, 4, 4, relief="none").optimizer == pytest.approx(2e7 * 12)
    # optimizer offload: 2e7 params x (2 + 2) B over 1 GB/s + 2e7 x 28 B at 5 GB/s
    assert model.optimizer_time(devices, 0, 2, "opt-offload") == pytest.approx(2e7 * 4 / 1e9 + 2e7 * 28 / 5e9)


def test_checker_refuses_unsupported_relief() -> None:
    data, _ = _instance(2)
    data["training"]["reliefs"] = None
    instance = build_instance(data)
    pipe = instance.plan.pipelines[0]
    plan = Plan(1, (Pipeline(tuple(Stage(st.devices, st.first, st.end, "offload") for st in pipe.stages),
                             pipe.micro_batches),) + instance.plan.pipelines[1:])
    report = check_plan(instance, plan)
    assert any("not one the trainer supports" in v for v in report.violations)


@pytest.mark.parametrize("seed", range(14))
def test_search_with_relief_equals_brute_force(seed: int) -> None:
    data, failed = _instance(seed)
    instance = build_instance(data)
    best = relief_optimum(seed)
    result = search_plan(instance, failed, Deadline.after(20))
    if math.isinf(best):
        assert result.status is Status.INFEASIBLE, (result.status, result.reason)
        return
    assert result.solution is not None, result.reason
    assert check_plan(instance, result.solution, failed).ok
    assert all(st.relief is not None for p in result.solution.pipelines for st in p.stages)
    assert result.objective == pytest.approx(PerfModel(instance).evaluate(result.solution, failed).iteration_time_s)
    assert result.bound <= best * (1 + 1e-9)
    assert result.status is Status.OPTIMAL
    assert result.objective == pytest.approx(best, rel=1e-6)


def test_relief_matters_in_the_random_cases() -> None:
    """The brute-force cases are not vacuous: in some, relief admits a plan or beats keeping
    every activation on the device."""
    admitted = faster = 0
    for seed in range(14):
        data, failed = _instance(seed)
        with_relief = relief_optimum(seed)
        data["training"]["reliefs"] = None
        plain = search_plan(build_instance(data), failed, Deadline.after(20))
        plain_value = plain.objective if plain.solution is not None else math.inf
        admitted += math.isinf(plain_value) and math.isfinite(with_relief)
        faster += math.isfinite(plain_value) and with_relief < plain_value * (1 - 1e-9)
    assert admitted >= 1 and faster >= 1, (admitted, faster)


def test_plan_joined_on_the_command_line() -> None:
    """`plan --joined`: the instance's failure is recovered, then the device's return is decided
    among keep-running and scale-up by Eq. 8 (paper-32, device 13)."""
    import json

    from typer.testing import CliRunner

    from chameleon_opt.cli import app

    done = CliRunner().invoke(app, ["plan", "paper-32", "--joined", "13", "--json", "--time-limit", "6"])
    assert done.exit_code == 0, done.output
    payload = json.loads(done.stdout)
    policies = {c["policy"] for c in payload["candidates"]}
    assert {"keep-running", "scale-up"} <= policies and payload["policy"] in policies
    devices = {d for p in payload["plan"]["pipelines"] for st in p["stages"] for d in st["devices"]}
    assert (13 in devices) == (payload["policy"] != "keep-running")


def test_bundled_relief_fit_8_fits_only_with_relief() -> None:
    """relief-fit-8: the optimizer replicated (each pipeline a whole copy), devices 0, 1 and 6 fail,
    each pipeline losing a different stage, so every layer keeps a replica and the survivors form 2
    TP groups. One 2-stage pipeline runs both micro-batches: its first stage holds two in flight,
    94.2 GiB without recomputation on 80 GiB GPUs. With the instance's reliefs the search finds
    full recomputation there (56.0 GiB) and none on the second stage (73.6 GiB), proven optimal and
    moving no state; with recomputation off everywhere nothing fits (exit 3)."""
    import json

    from chameleon_opt.bundled import bundled_instance
    from chameleon_opt.decision import decide
    from chameleon_opt.instance.load import load_instance

    instance = load_instance("relief-fit-8")
    failed = frozenset({0, 1, 6})
    model = PerfModel(instance)
    assert model.evaluate(instance.plan).memory_ok
    decision = decide(instance, failed, "reconfigure", deadline=Deadline.after(10))
    chosen = decision.chosen
    assert chosen is not None and chosen.bytes_moved == 0 and chosen.solve.status is Status.OPTIMAL
    stages = [(st.devices, st.first, st.end, st.relief) for p in chosen.plan.pipelines for st in p.stages]
    assert stages == [((4, 5), 0, 21, "full"), ((2, 3), 21, 42, "none")]
    assert model.stage_memory((4, 5), 0, 21, 0, 2, 2, 0.0, 1, "none")[0] / 2 ** 30 == pytest.approx(94.2, abs=0.05)
    spec = json.loads(bundled_instance("relief-fit-8").read_text())
    spec["training"]["reliefs"] = ["none"]
    nothing = decide(build_instance(spec), failed, "auto", deadline=Deadline.after(10))
    assert nothing.chosen is None and nothing.proven  # the CLI's exit 3
