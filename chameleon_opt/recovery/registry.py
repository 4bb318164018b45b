"""Every recovery policy by name, for the simulator, `simulate --policy` and the benches.

Baselines reproduce the published systems (recovery/oobleck.py, recycle.py, bamboo.py, each citing
its sources); the `-ablation` entries are our own method with a piece removed, labelled so."""

from __future__ import annotations

from typing import Callable

from chameleon_opt.recovery.bamboo import Bamboo
from chameleon_opt.recovery.ablations import EvenRerouteAblation, RedundancyAblation, TemplatesAblation
from chameleon_opt.recovery.chameleon import (Chameleon, ChameleonPaper, DecisionSource, Hybrid, ReconfigureOnly,
                                              RerouteOnly, _ChameleonFamily)
from chameleon_opt.recovery.checkpoint import CheckpointRestart
from chameleon_opt.recovery.interface import SEARCH_TIME_LIMIT_S, Policy
from chameleon_opt.recovery.oobleck import Oobleck
from chameleon_opt.recovery.recycle import ReCycle
from chameleon_opt.solve.backends import DEFAULT, SolverOptions

POLICIES: dict[str, Callable[..., Policy]] = {
    "chameleon": Chameleon,
    "chameleon-paper": ChameleonPaper,
    "hybrid": Hybrid,
    "recycle": ReCycle,
    "oobleck": Oobleck,
    "bamboo": Bamboo,
    "checkpoint": CheckpointRestart,
    "reroute-only": RerouteOnly,
    "reconfigure-only": ReconfigureOnly,
    "templates-ablation": TemplatesAblation,
    "even-reroute-ablation": EvenRerouteAblation,
    "redundancy-ablation": RedundancyAblation,
}
BASELINES = ("oobleck", "recycle", "bamboo", "checkpoint")
"""The published systems (and checkpointing): what `compare` measures the adaptive policy against."""


def make_policy(name: str, time_limit_s: float = SEARCH_TIME_LIMIT_S, search_charge_s: float | None = None,
                source: DecisionSource | None = None, solver: SolverOptions | None = None) -> Policy:
    """A policy by name (see POLICIES), with the search settings that apply to it. `solver`: the
    options of its solver calls (default: the source's, else DEFAULT); with a source, the source's
    decisions run with the source's own options.

    Raises ValueError for an unknown name."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}: use one of {', '.join(POLICIES)}")
    cls = POLICIES[name]
    if issubclass(cls, _ChameleonFamily):
        policy: Policy = cls(time_limit_s=time_limit_s, search_charge_s=search_charge_s, source=source)
    elif cls is ChameleonPaper:
        policy = cls(time_limit_s=time_limit_s, search_charge_s=search_charge_s)
    elif cls in (ReCycle, Bamboo, CheckpointRestart, EvenRerouteAblation, RedundancyAblation):
        policy = cls(time_limit_s=time_limit_s)
    else:
        policy = cls()
    policy.solver = solver or (source.solver if source is not None else DEFAULT)
    return policy
