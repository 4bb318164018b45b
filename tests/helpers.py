"""Small instances built in memory for solver tests (profile-only workloads: exact, fast)."""

from __future__ import annotations

import random
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
