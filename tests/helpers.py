"""Small instances built in memory for solver tests (profile-only workloads: exact, fast)."""

from __future__ import annotations

import functools
import importlib.util
import random
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any


def tiny_instance(seed: int, nodes: int = 2, per_node: int = 3, blocks: int = 4, micro_batches: int = 6,
                  memory_gib: float = 100.0, tp: int = 1) -> dict[str, Any]:
    """A random instance: `blocks` transformer blocks with random times and sizes, a regular plan."""
    rng = random.Random(seed)
    layers = blocks + 2
    times = [[0.0, 0.0, 0.0]] + [[rng.uniform(0.5, 2.0), rng.uniform(1.0, 4.0), 0.0] for _ in range(blocks)] + [
        [rng.uniform(0.1, 0.5), rng.uniform(0.1, 1.0), 0.0]]
    params = [rng.randint(1, 4) * 10 ** 7 for _ in range(layers)]
    activation = [rng.randint(1, 5) * 10 ** 7 for _ in range(layers)]
    devices = nodes * per_node
    pipelines = max(devices // (tp * min(2, layers)), 1)
    stages = min(2, layers)
    while pipelines * stages * tp > devices:
        pipelines -= 1
    return {
        "format": 1, "name": f"tiny-{seed}",
        "cluster": {"nodes": nodes, "devices_per_node": per_node,
                    "device_type": {"name": "toy", "memory_gib": memory_gib, "peak_tflops": 1, "reserved_gib": 0},
                    "network": {"intra_node_gbps": 100, "inter_node_gbps": 10}},
        "workload": {"inline": {
            "name": "toy", "layer_bytes": {"params": params, "activation_bytes_per_sample": activation,
                                           "boundary_bytes_per_sample": [10 ** 6] * layers},
            "profiles": [{"device_type": "toy", "times": {"1": {str(tp): times}}}]}},
        "training": {"global_batch": micro_batches, "micro_batch_size": 1},
        "plan": {"tensor_parallel": tp,
                 "layout": {"pipeline_parallel": stages, "data_parallel": min(pipelines, micro_batches)}},
    }


def load_example(path: Path) -> ModuleType:
    """An example script as a module (registered by name: a dataclass in it looks its module up)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def train_whole_batch(module: ModuleType, steps: int, make_optimizer: Callable[[Any], Any]) -> tuple[Any, list[float]]:
    """Failure-free training of an example's model on its whole global batch in one process: the
    (model, per-step losses) its distributed runs must reproduce."""
    model = module.make_model()
    optimizer = make_optimizer(model)
    losses = []
    for step in range(steps):
        x, y = module.global_batch(step)
        loss = ((model(x) - y) ** 2).sum() / module.GLOBAL_BATCH
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return model, losses


def momentum_sgd(model: Any) -> Any:
    """The examples' optimizer: SGD, lr 0.05, momentum 0.9."""
    import torch

    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def assert_failure_free(report: Any, expected: list[float], steps: int) -> None:
    """A runtime run trained as failure-free training did: every step committed, every sample of
    every global batch once, each loss within 1e-5 relative of the reference (float64 runs measure
    about 2e-16; the bound leaves room for summation order)."""
    assert len(report.losses) == steps and all(report.samples_exactly_once)
    for got, want in zip(report.losses, expected):
        assert abs(got - want) <= 1e-5 * abs(want)


_HF_REFERENCES: dict[tuple[str, int, int, int, int], list[float]] = {}


def hf_reference_losses(instance: Any, hf_config: Path, steps: int) -> list[float]:
    """`pipelined.reference_losses` once per (model, global batch, sequence, layers, steps) in a
    session: it reads nothing else of the instance (layout, reliefs and MTBF leave the whole model's
    failure-free losses alone), and the runtime tests train the same tiny models on the same batches
    (about 1 s of CPU a time)."""
    from chameleon_opt.runtime.pipelined import reference_losses

    training = instance.spec.training
    seq = training.sequence_length or instance.workload.architecture.seq_len
    key = (str(hf_config), training.global_batch, seq, instance.workload.num_layers, steps)
    if key not in _HF_REFERENCES:
        _HF_REFERENCES[key] = reference_losses(instance, hf_config, steps)
    return list(_HF_REFERENCES[key])


@functools.lru_cache(maxsize=None)
def bundled_recovery(name: str) -> tuple[Any, Any, Any]:
    """(instance, its PerfModel, `search_plan`'s recovery from the file's failures under a 10 s
    limit) of a bundled instance, searched once per session: test_search_scale checks the plan,
    test_time_limit schedules migrations to it (1.5-3 s of CPU a search; each ends by itself)."""
    from chameleon_opt.instance.load import load_instance
    from chameleon_opt.perf.model import PerfModel
    from chameleon_opt.solve.deadline import Deadline
    from chameleon_opt.solve.search import search_plan

    instance = load_instance(name)
    model = PerfModel(instance)
    return instance, model, search_plan(instance, instance.failed_devices, Deadline.after(10), model=model)


def bench_relaxation(seed: int, devices: tuple[int, int]) -> tuple[Any, Any, frozenset[int], list, Any]:
    """bench/brute_force.py's random instance `seed` (the seed the brute force and the probes draw) with
    the exact search's relaxation over its TP-group inventories, not yet built: (instance, model,
    failed, options, relaxation), where the floors' unit tests start."""
    from chameleon_opt.instance.load import build_instance
    from chameleon_opt.perf.model import PerfModel
    from chameleon_opt.solve.exact import Relaxation, inventories

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from brute_force import random_instance

    data, failed = random_instance(seed, devices)
    instance = build_instance(data)
    model = PerfModel(instance)
    options = [groups for groups in inventories(instance, model, failed, instance.plan.tensor_parallel) if groups]
    relaxation = Relaxation(model, options, instance.global_micro_batches,
                            [d for d in range(instance.num_devices) if d not in failed])
    return instance, model, failed, options, relaxation
