"""Per-device time calibration that transfers across models, and the framework's memory constant.

Why: a model profiled on one device but run on another used to fall back to FLOPs / (peak x an
assumed efficiency). Measured profiles show a block's per-sample time is not FLOP-bound alone: on
the same device, OPT-350M (h = 1024, eager attention, s = 2048) reaches 5% of peak and OPT-30B 16%,
because the elementwise work over the a*s^2 attention tensors and the s*h activations is bound by
memory bandwidth, and narrow GEMMs are. So a block's per-sample time on device D is modelled as

    c_D = F / (peak_D * e_D) + A / (bandwidth_D * e_mem)

with F its FLOPs (forward + backward) per TP rank and A its activation bytes (Korthikanti et al.'s
per-layer count, a proxy for the elementwise traffic), e_D a per-device compute efficiency and e_mem
one memory efficiency shared by every device (it is the framework's kernels, not the chip, that set
how many times activations are touched). Both are fitted by weighted least squares (relative error)
on the per-sample slopes of every usable profile. A model without a profile on D is then predicted
either from its profile on another device S, keeping S's per-micro-batch intercept (launch and
hook overhead, a property of the model and framework) and scaling S's per-sample slope by c_D / c_S
(the fitted device ratio at this model's GEMM and activation sizes), or, with no profile at all,
from c_D alone.

The files models/calibration/<framework>.json hold one framework stack each (the efficiencies of one
stack say nothing about another's); `chameleon-solve calibrate` writes it and records which
profiles and measurements every number came from.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from chameleon_opt.workload.activations import ELEMENTWISE_BACKWARD_RATIO, Kernels, kernels_for
from chameleon_opt.workload.model import LayerTable, Workload, fit_profile_times

CALIBRATION_DIR = "calibration"
"""models/calibration/<framework>.json: one file per framework stack (not *.json in models/, which are workloads)."""


@dataclass(frozen=True)
class DeviceFit:
    """One device type's fitted compute efficiency, and the data it came from."""

    peak_tflops: float
    memory_bandwidth_gbps: float
    compute_efficiency: float
    fitted_on: tuple[str, ...]  # "model@device tpN" slopes used


@dataclass(frozen=True)
class Transferred:
    table: LayerTable
    source: str  # how the times were obtained, for `estimate`
    includes_collectives: bool = True  # scaled from a profile at this TP (which timed its collectives)


@dataclass(frozen=True)
class FrameworkCalibration:
    """A framework stack's calibration: device efficiencies, the shared memory efficiency, the
    attention implementation its profiles were measured with, and its fitted memory overhead."""

    name: str
    attention: str
    memory_efficiency: float
    devices: dict[str, DeviceFit]
    overhead_gib: float | None = None
    overhead_fitted_on: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())
    kernels: str | None = None  # the stack's kernels for activations (workload/activations.py); None: megatron
    tp_exposed: float = 1.0     # share of the TP collectives not hidden behind GEMMs (Megatron --tp-comm-overlap: 0)
    attention_utilisation: dict[str, Any] = field(default_factory=dict)  # a share, or (seq, share) points
    """Per device: the share of peak the stack's flash-attention kernel sustains on the FLOPs it executes
    (flash_attention_seconds). Absent: the attention core is priced as GEMM FLOPs at compute_efficiency."""
    sharded_interference: float | None = None
    """The stack's cost of overlapping ZeRO-3 collectives with compute (PerfModel.overlap_sharded);
    None: perf/model.py's SHARDED_OVERLAP_INTERFERENCE."""
    fp8_ratio: float | None = None
    """The stack's fp8 GEMM efficiency as a share of its bf16 one (perf/fp8.py); None: FP8_GEMM_RATIO."""

    # -- the model ---------------------------------------------------------------------------
    def layer_work(self, workload: Workload, tp: int) -> tuple[np.ndarray, np.ndarray]:
        """(FLOPs of forward + backward, activation bytes) per sample and layer on one TP rank."""
        flops = 3.0 * workload.forward_flops_per_sample / tp
        traffic = workload.activation_bytes_per_sample(tp, "none", self.attention)
        return flops, traffic

    def slope(self, workload: Workload, device: str, tp: int) -> np.ndarray | None:
        """Predicted seconds per sample of every layer on `device` (None if not calibrated)."""
        split = self.forward_backward(workload, device, tp)
        return None if split is None else split[0] + split[1]

    def forward_backward(self, workload: Workload, device: str, tp: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(forward, backward) seconds per sample of every layer on `device` from the efficiencies alone
        (None if not calibrated): GEMM FLOPs and activation traffic split 1 : 2 between forward and
        backward, and, where attention_utilisation names the device (flash attention), the attention
        core apart at the FLOPs its kernel executes (flash_attention_seconds)."""
        fit = self.devices.get(device)
        if fit is None:
            return None
        flops, traffic = self.layer_work(workload, tp)
        rate = fit.peak_tflops * 1e12
        utilisation = self.flash_utilisation(device, workload.sequence_length)
        attention_f = attention_b = np.zeros_like(flops)
        if utilisation:
            core = workload.attention_core_flops_per_sample / tp
            flops = flops - 3.0 * core
            attention_f, attention_b = flash_attention_seconds(core, rate * utilisation)
        total = flops / (rate * fit.compute_efficiency) + traffic / (fit.memory_bandwidth_gbps * 1e9 * self.memory_efficiency)
        eager = self.elementwise_forward_s(workload, device, tp)
        return total / 3.0 + attention_f + eager, total * 2.0 / 3.0 + attention_b + eager * ELEMENTWISE_BACKWARD_RATIO

    @property
    def prices_architecture(self) -> bool:
        """A stack's own calibration (its kernels named) prices the architecture and never a profile
        another stack measured (the catalogue's Sailor profiles, on the device or scaled from others)."""
        return self.kernels is not None

    def flash_utilisation(self, device: str, seq: int) -> float | None:
        """The flash kernel's share of `device`'s peak at sequence length `seq` (a constant, or a table
        of measured points: utilisation_at); None where the attention is eager or not calibrated."""
        found = self.attention_utilisation.get(device) if self.attention == "flash" else None
        return utilisation_at(found, seq) if isinstance(found, (list, tuple)) else found

    def elementwise_forward_s(self, workload: Workload, device: str, tp: int) -> np.ndarray:
        """Per-sample forward seconds, per layer, of the element-wise kernels the stack runs unfused
        (workload.unfused_elementwise_bytes_per_sample, zero unless its kernels are eager), streamed
        at ELEMENTWISE_HBM_SHARE of the device's HBM bandwidth. Why apart from the fitted memory term:
        that term is fitted on fused stacks (Megatron-LM, llm-foundry), whose chains are one kernel."""
        fit = self.devices.get(device)
        kernels = self.stack_kernels()
        if fit is None or kernels is None or kernels.elementwise == "fused":
            return np.zeros(workload.num_layers)
        nbytes = workload.unfused_elementwise_bytes_per_sample(tp, kernels)
        return nbytes / (fit.memory_bandwidth_gbps * 1e9 * ELEMENTWISE_HBM_SHARE)

    def stack_kernels(self) -> Kernels | None:
        """The stack's kernels where they do not depend on the model family (not Hugging Face's:
        its calibrations are fitted on its own eager profiles, whose slopes include the chains)."""
        if self.kernels in (None, "hf"):
            return None
        return kernels_for(self.kernels, None)

    def transfer(self, workload: Workload, device: str, micro_batch_size: int, tp: int,
                 withheld: frozenset[str] = frozenset()) -> Transferred | None:
        """Per-layer times of `workload` on `device` without its own profile there: from its profiles
        on other calibrated devices (intercept kept, slope scaled by the fitted ratio; the median over
        source devices), else from the fitted efficiencies alone. None when `device` is not calibrated."""
        target = self.slope(workload, device, tp)
        if target is None or workload.architecture is None:
            return None
        predictions, sources = [], []
        for profile in () if self.prices_architecture else workload.spec.profiles:
            source = profile.device_type
            if source == device or source in withheld or source not in self.devices:
                continue
            intercept, per_sample = affine_layers(profile.times, tp)
            if per_sample is None:
                continue
            ratio = np.divide(target, self.slope(workload, source, tp), out=np.ones_like(target),
                              where=target > 0)
            predictions.append(intercept + micro_batch_size * per_sample * ratio)
            sources.append(source)
        if predictions:
            times = np.median(np.array(predictions), axis=0)
            label = (f"{workload.name}'s profiles on {', '.join(sorted(sources))} scaled by the fitted "
                     f"device ratio ({self.name} calibration)")
        else:
            forward, backward = self.forward_backward(workload, device, tp)
            label = f"FLOPs and activation traffic at {device}'s fitted efficiencies ({self.name} calibration)"
            zeros = np.zeros_like(forward)
            return Transferred(LayerTable(micro_batch_size * forward, micro_batch_size * backward, zeros, True),
                               label, includes_collectives=False)
        forward_share = 1.0 / 3.0  # forward is a third of forward + backward FLOPs
        zeros = np.zeros_like(times)
        return Transferred(LayerTable(times * forward_share, times * (1 - forward_share), zeros, True), label,
                           includes_collectives=True)

    def to_json(self) -> dict[str, Any]:
        return {
            "attention": self.attention,
            "memory_efficiency": self.memory_efficiency,
            "overhead_gib": self.overhead_gib,
            "overhead_fitted_on": list(self.overhead_fitted_on),
            "devices": {name: {"peak_tflops": d.peak_tflops, "memory_bandwidth_gbps": d.memory_bandwidth_gbps,
                               "compute_efficiency": d.compute_efficiency, "fitted_on": list(d.fitted_on)}
                        for name, d in sorted(self.devices.items())},
            "excluded": list(self.excluded),
            "notes": list(self.notes),
            **({"kernels": self.kernels} if self.kernels else {}),
            **({"tp_exposed": self.tp_exposed} if self.tp_exposed != 1.0 else {}),
            **({"attention_utilisation": dict(self.attention_utilisation)} if self.attention_utilisation else {}),
            **({"sharded_interference": self.sharded_interference} if self.sharded_interference is not None else {}),
            **({"fp8_ratio": self.fp8_ratio} if self.fp8_ratio is not None else {}),
        }

    @classmethod
    def from_json(cls, name: str, data: dict[str, Any]) -> "FrameworkCalibration":
        devices = {k: DeviceFit(v["peak_tflops"], v["memory_bandwidth_gbps"], v["compute_efficiency"],
                                tuple(v.get("fitted_on", ()))) for k, v in data["devices"].items()}
        return cls(name, data.get("attention", "flash"), data["memory_efficiency"], devices,
                   data.get("overhead_gib"), tuple(data.get("overhead_fitted_on", ())),
                   tuple(data.get("excluded", ())), tuple(data.get("notes", ())), data.get("kernels"),
                   float(data.get("tp_exposed", 1.0)), dict(data.get("attention_utilisation", {})),
                   data.get("sharded_interference"), data.get("fp8_ratio"))


ELEMENTWISE_HBM_SHARE = 0.85
"""Share of HBM peak bandwidth a large streaming element-wise kernel sustains on A100 / H100: STREAM-
class copy and triad kernels reach about 85-90% of the data-sheet bandwidth (BabelStream-type
results on A100 and H100). Assumed (the low end: the decomposed chains include reductions), fitted
on none of the validation rows."""

FLASH_CAUSAL_SHARE = 0.5
"""A causal flash-attention kernel skips the key blocks above the diagonal: half of the s^2 score
and value products (FlashAttention-2, Dao 2023, Sec. 3.1.1 'Causal masking'; its FLOP counts for
causal runs are halved). Every workload here is a causal decoder."""
FLASH_BACKWARD_RATIO = 2.5
"""A flash-attention backward runs 5 s^2 d matrix products against the forward's 2 (it recomputes
the scores instead of reading them back): 2.5 times the forward's FLOPs (FlashAttention-2, Sec. 4.1,
whose backward speeds count it so)."""


def utilisation_at(table: Sequence[tuple[float, float]], seq: int) -> float:
    """A kernel's utilisation at sequence length `seq` from (sequence, utilisation) points measured
    at a few lengths: linear in log2(seq) between them, the end values beyond."""
    points = sorted((float(s), float(u)) for s, u in table)
    lengths = np.log2([s for s, _ in points])
    return float(np.interp(np.log2(max(seq, 1)), lengths, [u for _, u in points]))


def flash_attention_seconds(core_forward_flops: np.ndarray, rate: float) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of the attention core whose forward is `core_forward_flops` as the
    model counts it (4 s^2 q per block: QK^T and attention x V over the whole square) under a flash
    kernel sustaining `rate` FLOP/s on what it executes: the causal half, the backward 2.5 times
    the forward."""
    executed = core_forward_flops * FLASH_CAUSAL_SHARE
    return executed / rate, executed * FLASH_BACKWARD_RATIO / rate


def affine_layers(times: dict[str, dict[str, list]], tp: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Per-layer (intercept, per-sample slope) of forward + backward over a profile's micro-batch
    sizes at `tp` (fit_profile_times' weighted line, evaluated at 0 and 1 sample apart)."""
    from chameleon_opt.workload.schema import Profile
    profile = Profile(device_type="-", times=times)
    at0 = fit_profile_times(profile, 0, tp)
    at1 = fit_profile_times(profile, 1, tp)
    if at0 is None or at1 is None:
        return np.zeros(0), None
    if not at0.fitted:  # a single measured size: no intercept can be told apart
        return np.zeros_like(at1.forward_s), at1.forward_s + at1.backward_s
    intercept = at0.forward_s + at0.backward_s
    return intercept, (at1.forward_s + at1.backward_s) - intercept


def fit_calibration(name: str, workloads: list[Workload], peaks: dict[str, tuple[float, float]],
                    attention: str, exclude: set[tuple[str, str]] | None = None,
                    exclude_tp: dict[str, int] | None = None, excluded_notes: tuple[str, ...] = ()
                    ) -> FrameworkCalibration:
    """Fit per-device compute efficiencies and the shared memory efficiency on the block layers of
    every profile: `exclude` drops (workload, device) pairs, `exclude_tp[workload]` drops TP degrees
    at or above it. `peaks[device]` = (peak TFLOP/s, memory GB/s) from the data sheets."""
    exclude = exclude or set()
    exclude_tp = exclude_tp or {}
    rows: list[tuple[str, float, float, float, str]] = []  # device, F/peak, A/bandwidth, slope, label
    for w in workloads:
        if w.architecture is None:
            continue
        for profile in w.spec.profiles:
            device = profile.device_type
            if (w.name, device) in exclude or device not in peaks:
                continue
            tps = sorted({int(tp) for per_tp in profile.times.values() for tp in per_tp})
            for tp in tps:
                if tp >= exclude_tp.get(w.name, 1 << 30):
                    continue
                _, per_sample = affine_layers(profile.times, tp)
                if per_sample is None:
                    continue
                flops = 3.0 * w.forward_flops_per_sample[1:-1].mean() / tp
                traffic = float(w.activation_bytes_per_sample(tp, "none", attention)[1:-1].mean())
                slope = float(np.median(per_sample[1:-1]))
                if slope <= 0:
                    continue
                peak, bandwidth = peaks[device]
                rows.append((device, flops / (peak * 1e12), traffic / (bandwidth * 1e9), slope,
                             f"{w.name}@{device} tp{tp}"))
    devices = sorted({r[0] for r in rows})
    design = np.zeros((len(rows), len(devices) + 1))
    for i, (device, f, a, slope, _) in enumerate(rows):
        design[i, devices.index(device)] = f / slope
        design[i, -1] = a / slope
    coef = _nonnegative_lstsq(design, np.ones(len(rows)))
    inverse_memory = coef[-1]
    fits = {}
    for k, device in enumerate(devices):
        inverse = coef[k]
        labels = tuple(r[4] for r in rows if r[0] == device)
        fits[device] = DeviceFit(peaks[device][0], peaks[device][1],
                                 float(1.0 / inverse) if inverse > 0 else 1.0, labels)
    memory_efficiency = float(1.0 / inverse_memory) if inverse_memory > 0 else 1.0
    return FrameworkCalibration(name, attention, memory_efficiency, fits, excluded=excluded_notes)


def _nonnegative_lstsq(design: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients (active-set: drop negative ones and refit)."""
    active = np.ones(design.shape[1], dtype=bool)
    while True:
        coef = np.zeros(design.shape[1])
        solution, *_ = np.linalg.lstsq(design[:, active], target, rcond=None)
        coef[active] = solution
        if (coef >= 0).all() or active.sum() == 1:
            return np.maximum(coef, 0.0)
        active &= coef > 0


def calibration_path(framework: str) -> Path:
    from chameleon_opt.instance.load import MODELS_DIR
    return MODELS_DIR / CALIBRATION_DIR / f"{framework}.json"


@lru_cache(maxsize=8)
def _load_file(path: str) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def load_framework(name: str, path: Path | None = None) -> FrameworkCalibration:
    """The named framework's calibration from models/calibration/<name>.json (InputError if absent)."""
    from chameleon_opt.errors import InputError
    path = path or calibration_path(name)
    try:
        data = _load_file(str(path))
    except (OSError, ValueError):
        raise InputError(None, "training.framework", f"no calibration for framework {name!r} ({path})",
                         "run `chameleon-solve calibrate`, or drop training.framework") from None
    return FrameworkCalibration.from_json(name, data)
