"""Calibrating the model on Sailor's data: models/calibration/sailor.json.

Sailor's measured OPT-350M plans ran on GH200 nodes with Megatron-style TP 4 inside a node, DeepSpeed-
style pipeline stages, mixed-precision Adam and eager (non-flash) attention without recomputation.
The memory model then has one constant it cannot derive: what the framework holds outside the
model (CUDA context, NCCL buffers, cuBLAS workspaces, the caching allocator's slack). It is fitted
here as one number over the 9 plans' measured peaks (least squares in relative error), and every
plan is also predicted leave-one-out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from chameleon_opt.instance.devices import CATALOGUE
from chameleon_opt.instance.load import build_instance, load_workload_file, MODELS_DIR
from chameleon_opt.instance.sailor import fit_alpha_beta, sailor_plan_instance
from chameleon_opt.perf.calibration import FrameworkCalibration, fit_calibration
from chameleon_opt.workload.model import Workload

SAILOR_TRAINING = {"precision": "fp16", "attention": "eager", "recomputation": "none", "zero_stage": 0}
"""What Sailor's OPT-350M runs used (its configs: fp16 mixed precision with Adam; GPT-2-type
attention in plain PyTorch, i.e. eager; no activation checkpointing; no ZeRO)."""

EXCLUDED = (
    "GPT-Neo-2.7 on GH-96: Sailor's file has 26 rows and equals OPT-350's GH-96 profile entry for "
    "entry (the model has 34 layers), so it is not in models/gpt-neo-2.7b.json and not used",
    "LLAMA-3-8 at TP >= 2 (all of its A100-40 and V100-16 rows, GH-96 TP 2 and 4): Sailor's step times "
    "there are reported with wrong units at the source (about 20x its TP 1 figure per the issue); "
    "only GH-96 TP 1 is used",
)
EXCLUDE_TP = {"llama3-8b": 2}


def sailor_network(sailor_dir: Path) -> dict[str, float]:
    """GH200 links fitted to Sailor's bandwidth curves (alpha-beta), as instance network fields."""
    coeffs = json.loads((sailor_dir / "network_coeffs_all_homo.json").read_text())
    inter_latency, inter_bw = fit_alpha_beta(*coeffs["inter"]["GH-96"]["1"])
    intra_latency, intra_bw = fit_alpha_beta(*coeffs["intra"]["GH-96"]["4"])
    return {"intra_node_gbps": intra_bw / 1e9, "intra_node_latency_us": intra_latency * 1e6,
            "inter_node_gbps": inter_bw / 1e9, "inter_node_latency_us": inter_latency * 1e6}


def measured_plans(sailor_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    plans = sorted((sailor_dir / "measured-plans").glob("OPT-350_*.json"))
    return [(p.stem.removeprefix("OPT-350_plan_config_"), json.loads(p.read_text())) for p in plans]


def sailor_document(name: str, plan: dict[str, Any], network: dict[str, float],
                    training: dict[str, Any] | None = None) -> dict[str, Any]:
    """An instance for one measured plan, with Sailor's training settings (and any `training` extras)."""
    document = sailor_plan_instance(plan, name, "opt-350m", "GH-96", network)
    document["training"].update(SAILOR_TRAINING)
    document["training"].update(training or {})
    return document


def peak_memory(document: dict[str, Any], **model_args: Any) -> float:
    """The predicted per-device peak of a plan: the largest stage's need."""
    from chameleon_opt.perf.model import PerfModel
    instance = build_instance(document, f"<{document['name']}>")
    estimate = PerfModel(instance, **model_args).evaluate(instance.plan)
    return max(c.memory_bytes for p in estimate.pipelines for c in p.stages)


def fit_overhead(sailor_dir: Path) -> tuple[float, list[float], list[str]]:
    """(overhead GiB fitted on all plans, leave-one-out fits, plan names): the value minimising the
    sum of squared relative errors of the plans' peaks, on a 0.01 GiB grid."""
    network = sailor_network(sailor_dir)
    plans = measured_plans(sailor_dir)
    model_only = np.array([peak_memory(sailor_document(n, p, network, {"framework_overhead_gib": 0.0}))
                           for n, p in plans])
    measured = np.array([p["max_mem"] for _, p in plans], dtype=float)
    grid = np.arange(0.0, 16.0, 0.01)
    gib = float(1 << 30)
    table = model_only[None, :] + grid[:, None] * gib  # the overhead adds to the largest stage alike
    squared = ((table - measured) / measured) ** 2
    best = float(grid[int(np.argmin(squared.sum(axis=1)))])
    loo = [float(grid[int(np.argmin(np.delete(squared, i, axis=1).sum(axis=1)))]) for i in range(len(plans))]
    return best, loo, [n for n, _ in plans]


def catalogue_workloads() -> list[Workload]:
    """Every catalogue workload with profiles, at its own sequence length, 2-byte activations."""
    found = []
    for path in sorted(MODELS_DIR.glob("*.json")):
        spec = load_workload_file(path)
        if spec.profiles and spec.architecture is not None:
            found.append(Workload(spec, None, 2))
    return found


def device_peaks() -> dict[str, tuple[float, float]]:
    return {name: (d.peak_tflops, d.memory_bandwidth_gbps) for name, d in CATALOGUE.items()}


def calibrate_sailor(sailor_dir: Path | None, withhold: set[tuple[str, str]] | None = None
                     ) -> FrameworkCalibration:
    """The `sailor` framework calibration: time from the catalogue's Sailor profiles (less the
    exclusions and any `withhold`-en (workload, device) pairs), memory overhead from the measured
    plans when `sailor_dir` is given."""
    exclude = set(withhold or set())
    calibration = fit_calibration("sailor", catalogue_workloads(), device_peaks(), SAILOR_TRAINING["attention"],
                                  exclude, EXCLUDE_TP, EXCLUDED)
    if sailor_dir is None:
        return calibration
    overhead, _, names = fit_overhead(sailor_dir)
    return FrameworkCalibration(calibration.name, calibration.attention, calibration.memory_efficiency,
                                calibration.devices, overhead,
                                tuple(f"{sailor_dir.name}/measured-plans/OPT-350_plan_config_{n}.json max_mem"
                                      for n in names),
                                calibration.excluded,
                                ("time: per-sample slopes of the catalogue's Sailor profiles (block layers);",
                                 "memory: one framework overhead fitted on Sailor's 9 measured OPT-350M plans"))
