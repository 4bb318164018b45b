"""A comparison protocol that cannot flatter the adaptive policy (issue 15).

- Failure unit: a card (one device) or a node (all its devices), as two suites.
- Cadence: Oobleck's trace intervals (one failure every 6 h, 3 h, 1 h, 30 min or 10 min, as in
  its `traces/*.csv`: removals only), and the published Llama 3 and OPT-175B rates (exponential
  times at that rate per unit); a fixed number of failures per trace, the horizon one interval
  past the last.
- Measures, per policy: average throughput over the whole horizon and over the post-failure
  window (first failure to the horizon), split into the post-recovery training rate (time-weighted
  over training segments after the first failure), downtime (no training) and restarts.
- The adaptive policy is run twice: told (the true failure rate and the exact model) and blind:
  it decides with a performance model whose per-layer compute is perturbed by +-10% (seeded)
  and with the failure rate estimated from the failures seen so far; it is scored by the true
  model (its steps re-priced).
- Hindsight: the adaptive policy told the exact time to the next failure at every decision (it
  picks the best candidate for that window): the upper reference, and regret = 1 - adaptive /
  hindsight.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from chameleon_opt.errors import InfeasibleError
from chameleon_opt.instance.load import Instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.perf.reroute import even_reroute
from chameleon_opt.recovery.chameleon import Chameleon, DecisionSource
from chameleon_opt.recovery.interface import PolicyState, Response
from chameleon_opt.recovery.registry import BASELINES, make_policy
from chameleon_opt.recovery.simulate import (PUBLISHED_RATES, SimulationResult, Trace, TraceEvent, _generate,
                                             simulate, with_failure_rate)

CADENCES = {"6h": 6 * 3600.0, "3h": 3 * 3600.0, "1h": 3600.0, "30m": 1800.0, "10m": 600.0}
PUBLISHED = ("llama3", "opt175b")
SUITES = ("card", "node")
PERTURBATION = 0.10
ADAPTIVE = ("chameleon", "chameleon-blind")
UNBOUNDED_S = 1e12  # published-rate traces: generated until enough failures, the horizon set after


class PerturbedModel(PerfModel):
    """The performance model with each layer's compute scaled by a seeded factor in [1 - e, 1 + e]:
    what a policy believes when its profile is off by up to e (scoring stays with the true model)."""

    def __init__(self, instance: Instance, seed: int, error: float = PERTURBATION) -> None:
        super().__init__(instance)
        self.factors = np.random.default_rng(seed).uniform(1 - error, 1 + error, instance.workload.num_layers)

    def _tables(self, device, tp, mode=None):
        known = len(self._prefix)
        prefix = super()._tables(device, tp, mode)
        if len(self._prefix) > known:  # built just now: perturb it once
            for name in ("fwd", "bwd", "tp_fwd", "tp_bwd"):
                prefix[name] = np.concatenate([[0.0], np.cumsum(np.diff(prefix[name]) * self.factors)])
        return prefix


class _Uncached(Chameleon):
    """A Chameleon whose answers depend on more than the state (time, history): no response cache."""

    def respond(self, state: PolicyState) -> Response:
        return self._respond(state)


class HindsightChameleon(_Uncached):
    """Told the exact time to the next trace event at every decision (Eq. 8 with that D)."""

    name = "hindsight"

    def __init__(self, trace: Trace, horizon_s: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.times = sorted(e.time_s for e in trace)
        self.horizon_s = horizon_s

    def fault_statistics(self, state: PolicyState) -> tuple[float | None, float | None]:
        following = next((t for t in self.times if t > state.time_s + 1e-9), self.horizon_s)
        window = max(following - state.time_s, 1e-6)
        return window, window


class BlindChameleon(_Uncached):
    """Decides with a perturbed model and a failure rate estimated from the history; its steps
    are re-priced by the true model for scoring."""

    name = "chameleon-blind"

    def __init__(self, seed: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seed = seed
        self.failures: list[float] = []
        self.truth: dict[int, PerfModel] = {}
        self.believed: dict[int, PerfModel] = {}
        self.source.believed = self._believed

    def _believed(self, instance: Instance) -> PerfModel:
        key = id(instance.spec)
        if key not in self.believed:
            self.believed[key] = PerturbedModel(instance, self.seed)
        return self.believed[key]

    def model(self, instance: Instance) -> PerfModel:
        return self._believed(instance)

    def true_model(self, instance: Instance) -> PerfModel:
        key = id(instance.spec)
        if key not in self.truth:
            self.truth[key] = PerfModel(instance)
        return self.truth[key]

    def fault_statistics(self, state: PolicyState) -> tuple[float | None, float | None]:
        """Mean time to the next failure from the failures seen so far: the per-device rate's
        maximum-likelihood estimate n / (elapsed x devices), over the survivors."""
        seen = len(self.failures)
        elapsed = max(state.time_s, 1.0)
        survivors = state.instance.num_devices - len(state.dead)
        rate = seen / (elapsed * state.instance.num_devices)
        return None, (1.0 / (rate * survivors) if rate > 0 and survivors else None)

    def _respond(self, state: PolicyState) -> Response:
        if state.kind == "fail":
            self.failures.append(state.time_s)
        response = super()._respond(state)
        return self.reprice(state, response)

    def reprice(self, state: PolicyState, response: Response) -> Response:
        """Steps scaled by true / believed step of the same plan (rerouted work included)."""
        if response.plan is None:
            return response
        truth, belief = self.true_model(state.instance), self.model(state.instance)

        def ratio(plan) -> float:
            believed = belief.evaluate(plan, state.dead).iteration_time_s
            return truth.evaluate(plan, state.dead).iteration_time_s / believed if believed > 0 else 1.0

        step = response.step_s * ratio(response.plan)
        interim = response.interim_step_s
        if interim is not None:
            try:
                interim *= ratio(even_reroute(state.layout, state.dead))
            except InfeasibleError:  # no rerouting of this layout: keep the believed interim step
                pass
        return dataclasses.replace(response, step_s=step, interim_step_s=interim)


# -- traces -----------------------------------------------------------------------------------------
def units(instance: Instance, suite: str) -> list[tuple[int, ...]]:
    per = instance.devices_per_node
    if suite == "card":
        return [(d,) for d in range(instance.num_devices)]
    return [tuple(range(n * per, (n + 1) * per)) for n in range(instance.spec.cluster.nodes)]


def failures_per_trace(instance: Instance, suite: str) -> int:
    """Enough failures to matter, few enough that the survivors can still hold the model."""
    count = len(units(instance, suite))
    return max(1, min(6, count // 4 if suite == "card" else count // 2))


def make_trace(instance: Instance, suite: str, cadence: str, seed: int) -> tuple[Trace, float, float]:
    """(trace, horizon_s, per-device MTBF in hours that the told policy is given)."""
    pool = units(instance, suite)
    k = failures_per_trace(instance, suite)
    rng = np.random.default_rng(seed)
    if cadence in CADENCES:
        interval = CADENCES[cadence]
        chosen = rng.choice(len(pool), size=k, replace=False)
        trace = [TraceEvent(interval * (i + 1), "fail", pool[u]) for i, u in enumerate(chosen)]
        horizon = interval * (k + 1)
        per_unit_hours = interval / 3600.0 * len(pool)  # the rate that gives one failure per interval
    elif cadence in PUBLISHED:
        rate = PUBLISHED_RATES[cadence]
        per_device = rate.mtbf_hours_per_unit * (8 if rate.unit == "node" else 1)
        per_unit_hours = per_device / len(pool[0])  # a node fails when any of its devices does
        trace = [e for e in _generate(pool, per_unit_hours, UNBOUNDED_S, seed, None)
                 if e.kind == "fail"][:k]
        horizon = (trace[-1].time_s if trace else per_unit_hours * 3600.0) * (k + 1) / max(k, 1)
    else:
        raise ValueError(f"unknown cadence {cadence!r}: use {', '.join(list(CADENCES) + list(PUBLISHED))}")
    mtbf_device_hours = per_unit_hours * len(pool[0])
    return trace, horizon, mtbf_device_hours


# -- measures ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Measures:
    average: float          # samples/s over the horizon
    post_failure: float     # samples/s from the first failure to the horizon
    post_recovery: float    # time-weighted training rate after the first failure
    downtime_s: float
    restarts: int

    @staticmethod
    def of(result: SimulationResult, first_failure_s: float) -> "Measures":
        after = [s for s in result.segments if s.end_s > first_failure_s]
        window = result.horizon_s - first_failure_s
        samples = sum(s.samples_per_s * (s.end_s - max(s.start_s, first_failure_s)) for s in after)
        training = [(s.samples_per_s, s.end_s - max(s.start_s, first_failure_s)) for s in after
                    if s.phase == "train" and s.samples_per_s > 0]
        train_time = sum(d for _, d in training)
        return Measures(result.average_throughput, samples / window if window > 0 else 0.0,
                        sum(r * d for r, d in training) / train_time if train_time > 0 else 0.0,
                        result.time_in_transition_s, sum(1 for t in result.transitions if t.action == "restart"))


@dataclass(frozen=True)
class Run:
    suite: str
    cadence: str
    seed: int
    horizon_s: float
    measures: dict[str, Measures]

    def ratio(self, a: str, b: str, field: str = "average") -> float:
        x, y = getattr(self.measures[a], field), getattr(self.measures[b], field)
        return x / y if y > 0 else math.inf

    def to_json(self) -> dict[str, Any]:
        return {"suite": self.suite, "cadence": self.cadence, "seed": self.seed, "horizon_s": self.horizon_s,
                "policies": {k: dataclasses.asdict(v) for k, v in self.measures.items()}}


def run_one(instance: Instance, suite: str, cadence: str, seed: int, baselines: Sequence[str] = BASELINES,
            time_limit_s: float = 2.0, search_charge_s: float | None = 1.0) -> Run:
    """Every policy on one trace. The told policies read the trace's true rate; the search time
    charged is fixed (`search_charge_s`) so runs are reproducible."""
    trace, horizon, mtbf = make_trace(instance, suite, cadence, seed)
    told = with_failure_rate(instance, mtbf)
    first = min((e.time_s for e in trace), default=horizon)
    source = DecisionSource(time_limit_s)
    policies: dict[str, Any] = {name: make_policy(name, time_limit_s, search_charge_s, source) for name in baselines}
    policies["chameleon"] = make_policy("chameleon", time_limit_s, search_charge_s, source)
    policies["chameleon-blind"] = BlindChameleon(seed, time_limit_s=time_limit_s, search_charge_s=search_charge_s,
                                                 source=DecisionSource(time_limit_s))
    policies["hindsight"] = HindsightChameleon(trace, horizon, time_limit_s=time_limit_s,
                                               search_charge_s=search_charge_s, source=source)
    measures = {name: Measures.of(simulate(told, trace, policy, horizon), first) for name, policy in policies.items()}
    return Run(suite, cadence, seed, horizon, measures)


def compare(instance: Instance, suites: Sequence[str] = SUITES,
            cadences: Sequence[str] = tuple(CADENCES) + PUBLISHED, seeds: Sequence[int] = (0,),
            baselines: Sequence[str] = BASELINES, time_limit_s: float = 2.0,
            progress: Callable[[str], None] | None = None) -> list[Run]:
    runs = []
    for suite in suites:
        for cadence in cadences:
            for seed in seeds:
                if progress is not None:
                    progress(f"{suite} {cadence} seed {seed}")
                runs.append(run_one(instance, suite, cadence, seed, baselines, time_limit_s))
    return runs


def summary(runs: Sequence[Run], baselines: Sequence[str] = BASELINES) -> list[dict[str, Any]]:
    """One row per (suite, cadence), means over seeds: adaptive (told and blind) over each
    baseline, on the whole horizon and on the post-failure window; regret to hindsight; and the
    adaptive policy's ratio to the best baseline (the row's verdict)."""
    rows = []
    order = list(CADENCES) + list(PUBLISHED)
    keys = sorted({(r.suite, r.cadence) for r in runs}, key=lambda k: (SUITES.index(k[0]), order.index(k[1])))
    for suite, cadence in keys:
        mine = [r for r in runs if (r.suite, r.cadence) == (suite, cadence)]
        row: dict[str, Any] = {"suite": suite, "cadence": cadence, "seeds": len(mine)}
        for adaptive in ADAPTIVE:
            for base in baselines:
                row[f"{adaptive}/{base}"] = float(np.mean([r.ratio(adaptive, base) for r in mine]))
                row[f"{adaptive}/{base} post-failure"] = float(np.mean(
                    [r.ratio(adaptive, base, "post_failure") for r in mine]))
            row[f"{adaptive} regret"] = float(np.mean([1 - r.ratio(adaptive, "hindsight") for r in mine]))
            row[f"{adaptive}/best baseline"] = float(np.mean([
                r.measures[adaptive].average / max(r.measures[b].average for b in baselines) for r in mine]))
        for name in list(baselines) + list(ADAPTIVE) + ["hindsight"]:
            row[f"{name} post-recovery"] = float(np.mean([r.measures[name].post_recovery for r in mine]))
            row[f"{name} downtime s"] = float(np.mean([r.measures[name].downtime_s for r in mine]))
            row[f"{name} restarts"] = float(np.mean([r.measures[name].restarts for r in mine]))
        rows.append(row)
    return rows


def comparison_figure(runs: Sequence[Run], title: str, baselines: Sequence[str] = BASELINES) -> Any:
    """One panel per suite: each policy's average throughput over hindsight's, per cadence."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    suites = [s for s in SUITES if any(r.suite == s for r in runs)]
    figure = Figure(figsize=(6.5 * len(suites), 4.2))
    FigureCanvasAgg(figure)
    names = list(ADAPTIVE) + list(baselines)
    markers = "os^vDxP*"
    for i, suite in enumerate(suites):
        ax = figure.add_subplot(1, len(suites), i + 1)
        cadences = [c for c in list(CADENCES) + list(PUBLISHED) if any(r.suite == suite and r.cadence == c
                                                                       for r in runs)]
        xs = np.arange(len(cadences))
        ratios = {name: [np.mean([r.ratio(name, "hindsight") for r in runs if r.suite == suite and r.cadence == c])
                         for c in cadences] for name in names}
        if len(cadences) == 1:  # one cadence: one bar per policy, not markers spread along a fake axis
            bars = ax.bar(names, [ratios[name][0] for name in names],
                          color=["#4C72B0" if name in ADAPTIVE else "#AAAAAA" for name in names])
            ax.bar_label(bars, fmt="%.3f", fontsize=7)
            ax.set_xlabel(f"policy (failure cadence {cadences[0]})")
            ax.tick_params(axis="x", labelrotation=30)
            ax.set_ylim(0, 1.08 * max(1.0, *(ratios[name][0] for name in names)))
        else:
            for k, name in enumerate(names):
                style = "-" if name in ADAPTIVE else "--"
                ax.plot(xs + (k - len(names) / 2) * 0.03, ratios[name], style, marker=markers[k % len(markers)],
                        label=name, linewidth=2.4 if name == "chameleon" else 1.3)
            ax.set_xticks(xs, cadences)
            ax.set_xlabel("failure cadence")
            if i == 0:
                ax.legend(fontsize=8)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_ylabel("average throughput / hindsight")
        ax.set_title(f"{suite} failures")
        ax.grid(alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    return figure
