"""Sailor's measured plans and network fits as chameleon_opt instances (for validation).

Sailor (ETH Zurich, MIT licence) ran plans on GH200 nodes and recorded the iteration time; its
bandwidth fits give GB/s as a polynomial in log2(message MB), capped by a peak. We turn a plan
into an instance (one TP group per node) and the polynomial into an alpha-beta link fitted over
the message sizes that matter (1 MB to 1 GB), so the model uses its own link form throughout.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def polynomial_bandwidth(nbytes: float, coefficients: list[float], peak: float) -> float:
    """Sailor's fitted bandwidth (bytes/s) for one message of `nbytes`."""
    x = math.log2(nbytes / 1e6)
    degree = len(coefficients) - 1
    gbps = sum(c * x ** (degree - i) for i, c in enumerate(coefficients))
    return min(gbps * 1e9, peak)


def fit_alpha_beta(coefficients: list[float], peak: float) -> tuple[float, float]:
    """(latency_s, bandwidth_bytes_per_s) whose latency + n/bandwidth best matches Sailor's curve in
    relative error over 1 MB..1 GB (least squares on log-spaced sizes)."""
    sizes = np.logspace(6, 9, 31)
    times = np.array([n / polynomial_bandwidth(n, coefficients, peak) for n in sizes])
    design = np.stack([np.ones_like(sizes), sizes], axis=1) / times[:, None]
    (latency, inverse_bw), *_ = np.linalg.lstsq(design, np.ones_like(sizes), rcond=None)
    return max(float(latency), 0.0), 1.0 / float(inverse_bw)


def sailor_plan_instance(plan: dict[str, Any], name: str, workload: str, device_type: str,
                         network: dict[str, float], devices_per_node: int = 4) -> dict[str, Any]:
    """An instance document for one Sailor measured plan (single-pipeline-template form).

    Sailor lists, per stage, the DP replicas, each a whole node running TP over its GPUs. Replica
    r of stage s goes on node s * dp + r; every stage boundary and DP ring then crosses nodes,
    as on the measured cluster, whichever numbering Sailor used."""
    template = plan["pipeline_list"][0]
    stages = template["num_stages"]
    dp = template["dp"][0]
    tp = template["tmp_per_stage"][0][0][1]
    layers = template["layers_per_stage"]
    mbs, gbs = plan["mbs"], plan["gbs"]
    pipelines = []
    for r in range(dp):
        slots = []
        for s in range(stages):
            node = s * dp + r
            slots.append({"devices": [node * devices_per_node + k for k in range(tp)],
                          "layers": [layers[s][0], layers[s][-1] + 1]})
        pipelines.append({"micro_batches": gbs // mbs // dp, "stages": slots})
    return {
        "format": 1,
        "name": name,
        "description": f"Sailor measured plan: {stages} stages x DP {dp} x TP {tp}, mbs {mbs}, gbs {gbs}",
        "cluster": {"nodes": stages * dp, "devices_per_node": devices_per_node, "device_type": device_type,
                    "network": network},
        "workload": {"model": workload},
        "training": {"global_batch": gbs, "micro_batch_size": mbs},
        "plan": {"tensor_parallel": tp, "pipelines": pipelines},
    }
