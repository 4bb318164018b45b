"""solve/blocks.py: the exhaustive search over layer counts (one device type, identical blocks) on a
hand-worked case and against bench/brute_force.py's independent brute force."""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path

import pytest

from chameleon_opt.instance.load import build_instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.solve.blocks import blocks_search, identical_blocks
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.solve.groups import survivor_groups

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from brute_force import brute_force, random_instance  # noqa: E402 (the bench folder is not a package)


def _hand() -> dict:
    """Two survivors in one node, four identical layers (forward 1 s, backward 2 s), no sends, two
    micro-batches, negligible state: two one-stage pipelines of one micro-batch each take 4 + 8 = 12 s
    (one two-stage pipeline: (2 + 2 - 1) x 6 = 18 s; one stage running both: 24 s)."""
    layers = 4
    return {
        "format": 1, "name": "hand", "description": "blocks hand case",
        "cluster": {"nodes": 1, "devices_per_node": 3,
                    "device_type": {"name": "fast", "memory_gib": 80, "peak_tflops": 1, "reserved_gib": 0},
                    "network": {"intra_node_gbps": 100, "inter_node_gbps": 10}},
        "workload": {"inline": {"name": "toy", "layer_bytes": {
            "params": [1] * layers, "activation_bytes_per_sample": [1] * layers,
            "boundary_bytes_per_sample": [0] * layers},
            "profiles": [{"device_type": "fast", "times": {"1": {"1": [[1.0, 2.0, 0.0]] * layers}}}]}},
        "training": {"global_batch": 2, "micro_batch_size": 1},
        "plan": {"tensor_parallel": 1, "layout": {"pipeline_parallel": 1, "data_parallel": 2}},
        "failures": {"events": [{"devices": [2]}]},
    }


def test_hand_worked_optimum():
    instance = build_instance(_hand())
    model = PerfModel(instance)
    found = blocks_search(instance, model, frozenset({2}), Deadline.never(), math.inf)
    assert found is not None and found.complete
    assert found.value == pytest.approx(12.0, rel=1e-6)
    assert sorted(len(p.stages) for p in found.plan.pipelines) == [1, 1]


def _identical(seed: int) -> tuple[dict, frozenset[int]]:
    """bench/brute_force.random_instance with one device type and every middle layer a copy of layer 1."""
    data, failed = random_instance(seed, (4, 8), (5, 6), (2, 5))
    data = copy.deepcopy(data)
    data["cluster"].pop("overrides", None)
    data["workload"]["inline"]["profiles"] = data["workload"]["inline"]["profiles"][:1]
    inline = data["workload"]["inline"]
    for rows in [*inline["layer_bytes"].values(),
                 *(t for times in inline["profiles"][0]["times"].values() for t in times.values())]:
        rows[2:-1] = [rows[1]] * (len(rows) - 3)
    return data, failed


@pytest.mark.parametrize("seed", range(6))
def test_never_beats_nor_misses_the_brute_force(seed):
    data, failed = _identical(seed)
    instance = build_instance(data)
    model = PerfModel(instance)
    assert identical_blocks(model, survivor_groups(instance, failed, instance.plan.tensor_parallel)[0])
    best, _, _, complete = brute_force(instance, failed, deadline_s=30)
    found = blocks_search(instance, model, failed, Deadline.never(), math.inf)
    assert complete and found is not None and found.complete
    if math.isinf(best):
        assert found.plan is None
    else:
        assert found.value == pytest.approx(best, rel=1e-9)
        assert model.evaluate(found.plan, failed).iteration_time_s == pytest.approx(found.value, rel=1e-12)


def test_stays_out_without_identical_blocks():
    """Random per-layer costs (bench/brute_force.random_instance): not blocks, the method declines."""
    data, failed = random_instance(0, (4, 8), (5, 6), (2, 5))
    data["cluster"].pop("overrides", None)
    instance = build_instance(data)
    assert blocks_search(instance, PerfModel(instance), failed, Deadline.never(), math.inf) is None


def test_batched_makespans_equal_the_model():
    """perf/pipeline.makespans (numpy over many rows) against perf/pipeline.one_f_one_b_time, row by row."""
    import numpy as np

    from chameleon_opt.perf.pipeline import one_f_one_b_time
    from chameleon_opt.perf.pipeline import makespans
    rng = np.random.default_rng(3)
    for p, m in [(1, 3), (3, 2), (4, 7), (5, 5)]:
        f, b = rng.uniform(0.1, 2.0, (20, p)), rng.uniform(0.1, 4.0, (20, p))
        assert makespans(f, b, m) == pytest.approx([one_f_one_b_time(x, y, m) for x, y in zip(f, b)], rel=1e-12)
