"""The paper's rerouting plan (ReCycle-style even split), as the performance model evaluates it."""

from __future__ import annotations

from chameleon_opt.errors import InfeasibleError
from chameleon_opt.plan import Plan, Reroute


def even_reroute(plan: Plan, failed_devices: frozenset[int]) -> Plan:
    """Keep the layout; split each failed stage slot's micro-batches evenly over the healthy slots
    of the same stage, holding the same layers, in other pipelines (Eq. 12/13's assumption).

    Raises InfeasibleError naming the layers when a stage lost every replica."""
    failed = {(j, s) for j, p in enumerate(plan.pipelines) for s, st in enumerate(p.stages)
              if failed_devices.intersection(st.devices)}
    reroutes: list[Reroute] = []
    for j, s in sorted(failed):
        stage = plan.pipelines[j].stages[s]
        peers = [k for k, p in enumerate(plan.pipelines)
                 if (k, s) not in failed and s < len(p.stages)
                 and (p.stages[s].first, p.stages[s].end) == (stage.first, stage.end)]
        if not peers:
            raise InfeasibleError(f"layers {stage.first}-{stage.end - 1} (stage {s}) lost every replica: "
                                  "rerouting needs a surviving peer holding the same layers")
        share = plan.pipelines[j].micro_batches / len(peers)
        reroutes += [Reroute(j, s, k, share) for k in peers]
    return Plan(plan.tensor_parallel, plan.pipelines, tuple(reroutes))
