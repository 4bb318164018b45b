"""Ablations: our own method with one piece swapped for a published system's idea, on the one
performance model (the published systems themselves: recovery/oobleck.py, recycle.py, bamboo.py).

- `EvenRerouteAblation` (ReCycle's rerouting without its bubble filling): even rerouting
  (`even_reroute`, Eq. 12/13); transition 0 (the in-flight iteration is finished by the peers; at
  most a partial iteration would be lost, not counted). When a stage lost every replica, or the
  rerouted work overflows a peer's memory, it falls back to checkpoint-restart (`fallback=True`).
- `TemplatesAblation` (our card-level reconfiguration with Oobleck's templates): pipeline
  templates (`build_templates`: best layer split per stage count) precomputed once for 1..k TP
  groups; on every change it instantiates templates over all surviving TP groups (an exact-fill
  knapsack over template sizes, plus each single size with the remainder lengthening some
  pipelines), splits the micro-batches across the pipelines in proportion to their throughput and
  keeps the fastest by the performance model. Transition = `migration_lower_bound_s` +
  `GROUP_REBUILD_S`; no search time (its planning is precomputed).
- `RedundancyAblation` (a redundancy model on ours): stage s of every pipeline also runs the
  forward of its successor's layers (the last stage covers stage 0), so each stage's forward op is
  longer by `redundancy` x the successor's forward time, with or without failures. Default 1.0:
  the whole successor forward is exposed (about a third more compute with backward = 2 x forward,
  above the ~10-20% Bamboo reports, because Bamboo hides part of it in bubbles; `redundancy=0.5`
  lands in the reported range). On a failure the predecessor takes over at once (`takeover_s`);
  it then does two stages' work and its gradient all-reduce takes twice as long. When a stage and
  its predecessor are both down the replica is lost: re-plan over the survivors (migration bound
  + group rebuild; search not charged). Memory of the redundant layers is not enforced.

Repairs: a repaired device that sits in the running layout rejoins its own slot (migration bound
+ group rebuild); one outside the layout stays idle, except for the templates, which re-plan over it.
"""

from __future__ import annotations

import math

from chameleon_opt.errors import InfeasibleError
from chameleon_opt.instance.load import Instance
from chameleon_opt.perf.pipeline import one_f_one_b_time
from chameleon_opt.perf.reroute import even_reroute
from chameleon_opt.plan import Plan
from chameleon_opt.recovery.interface import (CHECKPOINT_INTERVAL_S, RESTART_S, SEARCH_TIME_LIMIT_S, Policy,
                                              PolicyState, Response, cached_search, restart_response, structure_key)
from chameleon_opt.decision import GROUP_REBUILD_S, lost_layers, migration_lower_bound_s
from chameleon_opt.solve.groups import survivor_groups
from chameleon_opt.solve.constructive import Mix, lower
from chameleon_opt.solve.templates import Template, build_templates

BAMBOO_TAKEOVER_S = 2.0
"""The redundancy ablation's takeover: detect the failure and re-link the pipeline around it."""


class EvenRerouteAblation(Policy):
    """Ablation (not ReCycle: see recovery/recycle.py): always reroute with the even fractional split
    of Eq. 12/13, serial after the peers' own work; checkpoint-restart when that is impossible."""

    name = "even-reroute-ablation"

    def __init__(self, restart_s: float = RESTART_S, checkpoint_interval_s: float = CHECKPOINT_INTERVAL_S,
                 time_limit_s: float = SEARCH_TIME_LIMIT_S) -> None:
        super().__init__()
        self.restart_s, self.interval_s, self.time_limit_s = restart_s, checkpoint_interval_s, time_limit_s

    def rerouted(self, state: PolicyState) -> tuple[Plan, float]:
        """Raises InfeasibleError when a stage lost every replica or a peer runs out of memory."""
        model = self.model(state.instance)
        plan = even_reroute(state.layout, state.dead)
        estimate = model.evaluate(plan, state.dead)
        if not estimate.memory_ok:
            raise InfeasibleError("rerouted work overflows a peer's memory: "
                                  + "; ".join(estimate.memory_violations()[:2]))
        return plan, estimate.iteration_time_s

    def _respond(self, state: PolicyState) -> Response:
        if state.kind == "start":
            return self.start(state)
        if state.kind == "repair" and not state.changed & set(state.layout.devices):
            plan, step = self.rerouted(state)  # idle devices came back: ReCycle leaves them idle
            return Response(plan, step, 0.0, "repaired devices outside the layout stay idle", "stay")
        try:
            plan, step = self.rerouted(state)
        except InfeasibleError as error:
            return restart_response(self, state, f"ReCycle cannot reroute ({error.reason})", self.restart_s,
                                    self.interval_s / 2, self.time_limit_s)
        if state.kind == "repair":
            return Response(plan, step, self.rejoin_cost_s(state, state.layout),
                            "repaired devices rejoin their slots (state copied from a replica)", "rejoin")
        shares = len(plan.rerouted)
        return Response(plan, step, 0.0, f"even split of the failed slots' micro-batches over {shares} peer shares "
                        "(transition 0: no partial iteration counted)", "reroute")


# -- templates (Oobleck's idea) -----------------------------------------------------------------
class TemplatesAblation(Policy):
    """Ablation (not Oobleck: see recovery/oobleck.py): our card-level templates, instantiated over all
    surviving TP groups on every change, with no search time charged."""

    name = "templates-ablation"
    EXACT_CANDIDATES = 4

    def __init__(self) -> None:
        super().__init__()
        self._templates: dict[str, list[Template]] = {}

    def templates(self, instance: Instance) -> list[Template]:
        """Templates for 1..k TP groups on the full cluster (device type of the first group): built
        once, before training, as Oobleck does."""
        key = structure_key(instance)
        if key not in self._templates:
            model = self.model(instance)
            groups = survivor_groups(instance, frozenset(), instance.plan.tensor_parallel)
            kind = model.stage_device(groups[0]).name
            same = [g for g in groups if model.stage_device(g).name == kind]
            self._templates[key] = [t for t in build_templates(model, same) if t.max_level is None]
        return self._templates[key]

    @staticmethod
    def proportional_shares(rates: list[float], total: int) -> list[int] | None:
        """Micro-batches in proportion to throughput, largest remainder, at least one each."""
        if len(rates) > total:
            return None
        whole = sum(rates)
        raw = [total * r / whole for r in rates]
        shares = [max(int(math.floor(x)), 1) for x in raw]
        order = sorted(range(len(rates)), key=lambda j: raw[j] - math.floor(raw[j]), reverse=True)
        i = 0
        while sum(shares) < total:
            shares[order[i % len(order)]] += 1
            i += 1
        while sum(shares) > total:
            j = max((j for j in range(len(shares)) if shares[j] > 1), key=lambda j: shares[j] - raw[j])
            shares[j] -= 1
        return shares

    def instantiations(self, templates: list[Template], groups: int, total: int) -> list[dict[int, int]]:
        """Pipelines per template index that use the groups: the exact-fill knapsack maximising
        summed throughput, and each single size with the remainder lengthening pipelines."""
        by_size = {t.stages: k for k, t in enumerate(templates)}
        sizes = sorted(by_size)
        found: list[dict[int, int]] = []
        best = [-math.inf] * (groups + 1)
        choice = [-1] * (groups + 1)
        best[0] = 0.0
        for g in range(1, groups + 1):
            for s in sizes:
                if s <= g and best[g - s] > -math.inf:
                    value = best[g - s] + 1.0 / templates[by_size[s]].per_micro_batch_s
                    if value > best[g] + 1e-15:
                        best[g], choice[g] = value, s
        fill = max((g for g in range(groups + 1) if best[g] > -math.inf and g > 0), default=0)
        counts: dict[int, int] = {}
        g = fill
        while g > 0:
            s = choice[g]
            counts[by_size[s]] = counts.get(by_size[s], 0) + 1
            g -= s
        if counts:
            found.append(counts)
        for s in sizes:
            n, r = divmod(groups, s)
            if n == 0:
                continue
            if r and s + 1 in by_size and r <= n:
                found.append({by_size[s]: n - r, by_size[s + 1]: r})
            else:
                found.append({by_size[s]: n})
        unique = []
        for counts in found:
            counts = {k: c for k, c in counts.items() if c}
            if counts and counts not in unique and sum(counts.values()) <= total and all(
                    sum(counts.values()) >= templates[k].min_pipelines for k in counts):
                unique.append(counts)
        return unique

    def instantiate(self, instance: Instance, dead: frozenset[int]) -> tuple[Plan, float] | None:
        model = self.model(instance)
        templates = self.templates(instance)
        groups = survivor_groups(instance, dead, instance.plan.tensor_parallel)
        if not templates:
            return None
        kind = templates[0].device_type
        pool = [g for g in groups if model.stage_device(g).name == kind]
        total = instance.global_micro_batches
        ranked = []
        for counts in self.instantiations(templates, len(pool), total):
            chosen = [k for k in sorted(counts) for _ in range(counts[k])]
            shares = self.proportional_shares([1.0 / templates[k].per_micro_batch_s for k in chosen], total)
            if shares is None:
                continue
            per: dict[int, list[int]] = {}
            for k, m in zip(chosen, shares):
                per.setdefault(k, []).append(m)
            mix = Mix(tuple(len(per.get(k, ())) for k in range(len(templates))),
                      tuple(tuple(per.get(k, ())) for k in range(len(templates))))
            surrogate = max(templates[k].pipeline_time(m) for k, m in zip(chosen, shares)) + max(
                templates[k].sync_s for k in chosen)
            ranked.append((surrogate, mix))
        ranked.sort(key=lambda item: item[0])
        best: tuple[Plan, float] | None = None
        for _, mix in ranked[:self.EXACT_CANDIDATES]:
            plan = lower(templates, mix, {kind: pool}, instance.plan.tensor_parallel)
            estimate = model.evaluate(plan, dead)
            if estimate.memory_ok and (best is None or estimate.iteration_time_s < best[1]):
                best = (plan, estimate.iteration_time_s)
        return best

    def _respond(self, state: PolicyState) -> Response:
        if state.kind == "start":
            return self.start(state)
        if lost_layers(state.instance, state.dead) and state.kind == "fail":
            return restart_response(self, state, "some layer lost every replica")
        found = self.instantiate(state.instance, state.dead)
        if found is None:
            return Response(None, math.inf, 0.0, "no template instantiation fits the survivors", "reconfigure",
                            layout=state.layout)
        plan, step = found
        model = self.model(state.instance)
        migration = migration_lower_bound_s(model, state.layout, plan, state.previous_dead if state.kind == "repair"
                                            else state.dead)
        sizes = sorted({len(p.stages) for p in plan.pipelines})
        return Response(plan, step, migration + GROUP_REBUILD_S,
                        f"templates instantiated: {len(plan.pipelines)} pipelines of {sizes} stages, batch split by "
                        f"throughput; migration bound {migration:.2f} s + rebuild {GROUP_REBUILD_S:.0f} s, "
                        "planning precomputed", "reconfigure")


# -- redundancy (Bamboo's idea) ----------------------------------------------------------------
class RedundancyAblation(Policy):
    """Ablation (not Bamboo: see recovery/bamboo.py): each stage also runs its successor's forward on
    our model; a failed stage's predecessor takes over almost at once."""

    name = "redundancy-ablation"

    def __init__(self, redundancy: float = 1.0, takeover_s: float = BAMBOO_TAKEOVER_S,
                 time_limit_s: float = SEARCH_TIME_LIMIT_S) -> None:
        super().__init__()
        self.redundancy, self.takeover_s, self.time_limit_s = redundancy, takeover_s, time_limit_s

    def step(self, instance: Instance, layout: Plan, dead: frozenset[int]) -> float | None:
        """Step time with redundancy and takeovers; None when some slot and its predecessor
        (its replica holder) are both down."""
        model = self.model(instance)
        failed = model.failed_slots(layout, dead)
        takeover = False
        slowest = 0.0
        optimizer = 0.0
        schedules: dict[tuple, float] = {}  # identical pipelines are the common case
        for j, pipe in enumerate(layout.pipelines):
            costs = model.stage_costs(layout, j, [0.0] * len(pipe.stages))
            n = len(pipe.stages)
            live = [s for s in range(n) if (j, s) not in failed]
            if not live:
                return None  # the whole pipeline is gone: its micro-batches have nowhere to run
            owned: dict[int, list[int]] = {s: [s] for s in live}
            for s in range(n):
                if (j, s) in failed:
                    holder = (s - 1) % n
                    if (j, holder) in failed or n == 1:
                        return None  # the replica holder is down too
                    owned[holder].append(s)
                    takeover = True
            forward, backward = [], []
            for s in live:
                stages = owned[s]
                f = sum(costs[x].op_forward_s for x in stages)
                b = sum(costs[x].op_backward_s for x in stages)
                successor = (stages[-1] + 1) % n  # redundant forward of the next stage it does not own
                if successor not in stages:
                    f += self.redundancy * costs[successor].forward_s
                forward.append(f)
                backward.append(b)
                optimizer = max(optimizer, sum(model.optimizer_time(pipe.stages[x].devices, pipe.stages[x].first,
                                                                    pipe.stages[x].end) for x in stages))
            key = (tuple(forward), tuple(backward), pipe.micro_batches)
            if key not in schedules:
                schedules[key] = one_f_one_b_time(forward, backward, pipe.micro_batches)
            slowest = max(slowest, schedules[key])
        data_parallel = model.data_parallel_time(layout) * (2.0 if takeover else 1.0)
        return slowest + data_parallel + optimizer

    def _respond(self, state: PolicyState) -> Response:
        instance, layout = state.instance, state.layout
        if state.kind == "start":
            step = self.step(instance, layout, state.dead)
            plain = self.model(instance).evaluate(layout, state.dead).iteration_time_s
            return Response(layout, step if step is not None else math.inf, 0.0,
                            f"redundant forward of each successor stage (factor {self.redundancy:g}): "
                            f"{100 * ((step or math.inf) / plain - 1):.1f}% over failure-free", "start")
        step = self.step(instance, layout, state.dead)
        if step is not None:
            if state.kind == "repair":
                if not state.changed & set(layout.devices):
                    return Response(layout, step, 0.0, "repaired devices outside the layout stay idle", "stay")
                return Response(layout, step, self.rejoin_cost_s(state, layout),
                                "repaired devices take their stages back (state copied)", "rejoin")
            return Response(layout, step, self.takeover_s, "predecessor takes over the failed stage (two stages' "
                            "work, doubled gradient reduction)", "takeover")
        if lost_layers(instance, state.dead):
            return restart_response(self, state, "some layer lost every replica")
        model = self.model(instance)
        result, _ = cached_search(instance, state.dead, self.time_limit_s, model, options=self.solver)
        if result.solution is None:
            return restart_response(self, state, f"Bamboo cannot re-plan ({result.reason})")
        new = result.solution
        step = self.step(instance, new, state.dead)
        if step is None:
            return restart_response(self, state, "Bamboo's re-plan cannot hold redundancy")
        migration = migration_lower_bound_s(model, layout, new, state.previous_dead)
        return Response(new, step, migration + GROUP_REBUILD_S,
                        f"a stage and its replica holder are both down: re-plan over the survivors from DP replicas "
                        f"(migration bound {migration:.2f} s + rebuild {GROUP_REBUILD_S:.0f} s)", "reconfigure",
                        fallback=True)
