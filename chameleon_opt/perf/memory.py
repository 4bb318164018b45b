"""Per-device memory of a pipeline stage (the paper's Eq. 14, generalised)."""

from __future__ import annotations


def stage_memory_eq14(stage: int, stages: int, layers: int, param_bytes: float, grad_bytes: float,
                      optimizer_bytes: float, activation_bytes: float) -> tuple[float, float]:
    """Eq. 14 for uniform layers: (static, activations) with
    static = L_i (m_p + m_g + m_o) and activations = (N_pp - i) L_i m_a, stage i 0-based:
    under 1F1B stage i keeps N_pp - i micro-batches in flight."""
    static = layers * (param_bytes + grad_bytes + optimizer_bytes)
    activations = (stages - stage) * layers * activation_bytes
    return static, activations


def in_flight_micro_batches(stage: int, stages: int, own: int, extra: float = 0.0) -> float:
    """Micro-batches whose activations a stage holds at its peak under 1F1B: N_pp - s, at most
    the micro-batches it runs. Rerouted work (`extra`) is assumed to interleave into the schedule
    in proportion to the stage's own load, so it raises the peak by the same ratio."""
    base = min(stages - stage, own) if own > 0 else 0
    if extra <= 0 or own <= 0:
        return float(base if own > 0 else min(stages - stage, extra))
    return min(base * (own + extra) / own, own + extra)
