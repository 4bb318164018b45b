"""Oobleck (SOSP'23) as a baseline policy: its mechanisms, each with its source in the public code
(SymbioticLab/Oobleck, branches sosp23-artifact and develop), priced by our performance model.

- Failure unit: the node. `oobleck/elastic/agent.py` ("only consider node failure"); a lost node
  leaves with all its GPUs (`ReconfigurationEngine.remove_lost_node_from_dist_info`). A card
  failure here therefore idles the rest of its node.
- Pipeline templates: one per node count n in [n_min, N - f] (`csrc/planning/pipeline_template.cpp`
  `create_pipeline_templates`; the artifact's test uses N - f), f = 3 by default
  (`training_util.py`); a stage never spans two nodes (`execution_result.h`). n_min is the fewest
  nodes whose memory holds the model state (`engine.py`, develop L490-507). Here a template of
  n nodes has one stage per TP group of those nodes, split by our min-max template split.
- Instantiation: every multiset of templates whose node counts sum exactly to the live node count
  (`planning/instantiator.py` `_enumerate_instantiation_options`), integer micro-batches
  balanced so pipelines finish together (`_distribute_batch`; here exact water-filling on
  each template's fill and bottleneck), the fastest by iteration time.
- Reconfiguration (`ReconfigurationEngine.on_reconfigure`): lost nodes leave their pipelines;
  a pipeline still at >= n_min nodes shrinks to the template of its size; a shorter one borrows
  nodes from the end of the biggest pipeline (ties: the later one) while the donor stays above
  n_min; without a donor, short pipelines merge in order, and a still-short one absorbs the
  first healthy pipeline. Micro-batches are redistributed.
- State: missing layers are broadcast from the first surviving replica (`_copy_model_states`).
- Costs (`tools/simulator/oobleck_simulator.py`): reconfiguration 2-10 s by model size
  (`local_rendezvous_timeout_delta`: 2 s up to GPT-2, 6 s at 2.7B, 10 s at 6.7B; interpolated
  in parameters, at least our migration bound beyond), plus one lost iteration (`step_delta`);
  a node that comes back waits until the next failure's rendezvous (`simulate_should_reconfigure`
  is False), which then re-instantiates over every live node.
"""

from __future__ import annotations

import math

import numpy as np

from chameleon_opt.instance.load import Instance
from chameleon_opt.plan import Pipeline, Plan, Stage
from chameleon_opt.recovery.interface import Policy, PolicyState, Response, restart_response, structure_key
from chameleon_opt.decision import lost_layers, migration_lower_bound_s
from chameleon_opt.solve.microbatch import allocate_greedy
from chameleon_opt.solve.templates import Template, build_template

FAULT_THRESHOLD = 3
RENDEZVOUS_S = ((0.35e9, 2.0), (1.5e9, 2.0), (2.7e9, 6.0), (6.7e9, 10.0))
"""(parameters, seconds) of Oobleck's simulator (BERT-large/GPT-3 medium, GPT-2, 2.7B, 6.7B)."""

NodePipeline = tuple[int, ...]  # the nodes of one pipeline, in stage order


def rendezvous_s(params: float) -> float:
    """Oobleck's reconfiguration time for a model of `params` parameters (interpolated in log
    parameters, held at the ends of the measured range)."""
    xs = [math.log(p) for p, _ in RENDEZVOUS_S]
    return float(np.interp(math.log(max(params, 1.0)), xs, [s for _, s in RENDEZVOUS_S]))


class Oobleck(Policy):
    """Node-unit templates, exact-sum instantiation, local shrink / borrow / merge."""

    name = "oobleck"

    def __init__(self, fault_threshold: int = FAULT_THRESHOLD) -> None:
        super().__init__()
        self.f = fault_threshold
        self._templates: dict[str, dict[int, Template]] = {}

    # -- the cluster in node units --------------------------------------------------------------
    @staticmethod
    def node_groups(instance: Instance, node: int) -> list[tuple[int, ...]]:
        tp, per = instance.plan.tensor_parallel, instance.devices_per_node
        first = node * per
        return [tuple(range(first + i, first + i + tp)) for i in range(0, per - tp + 1, tp)]

    @staticmethod
    def dead_nodes(instance: Instance, dead: frozenset[int]) -> set[int]:
        return {instance.node_of(d) for d in dead}

    def templates(self, instance: Instance) -> dict[int, Template]:
        """Node count -> template, built once before training (as Oobleck does): n in
        [n_min, N - f] (at least n_min, so a small cluster keeps one template)."""
        key = structure_key(instance)
        if key not in self._templates:
            model = self.model(instance)
            nodes = instance.spec.cluster.nodes
            group = self.node_groups(instance, 0)[0]
            per_node = len(self.node_groups(instance, 0))
            found: dict[int, Template] = {}
            for n in range(1, nodes + 1):
                stages = n * per_node
                if stages > instance.workload.num_layers:
                    break
                template = build_template(model, group, stages, max(nodes // n, 1))
                if template is not None and template.min_pipelines <= max(nodes // n, 1):
                    found[n] = template
            n_min = min(found, default=None)
            top = max(nodes - self.f, n_min or 0)
            self._templates[key] = {n: t for n, t in found.items() if n <= top}
        return self._templates[key]

    def n_min(self, instance: Instance) -> int | None:
        return min(self.templates(instance), default=None)

    # -- plans ----------------------------------------------------------------------------------
    def lower(self, instance: Instance, pipelines: list[NodePipeline]) -> tuple[Plan, float] | None:
        """Each node pipeline on its template, micro-batches water-filled, priced exactly."""
        templates = self.templates(instance)
        if not pipelines or any(len(p) not in templates for p in pipelines):
            return None
        chosen = [templates[len(p)] for p in pipelines]
        total = instance.global_micro_batches
        shares = allocate_greedy([t.fill_s for t in chosen], [t.per_micro_batch_s for t in chosen], total).solution
        if shares is None:
            return None
        built = []
        for nodes, template, share in zip(pipelines, chosen, shares):
            groups = [g for node in nodes for g in self.node_groups(instance, node)]
            built.append(Pipeline(tuple(Stage(groups[s], template.boundaries[s], template.boundaries[s + 1])
                                        for s in range(template.stages)), share))
        plan = Plan(instance.plan.tensor_parallel, tuple(built))
        estimate = self.model(instance).evaluate(plan)
        return (plan, estimate.iteration_time_s) if estimate.memory_ok else None

    def instantiate(self, instance: Instance, live_nodes: list[int]) -> tuple[Plan, float] | None:
        """Every multiset of template sizes summing exactly to the live nodes; the fastest."""
        sizes = sorted(self.templates(instance))
        best: tuple[Plan, float] | None = None

        def partitions(left: int, smallest: int) -> list[list[int]]:
            if left == 0:
                return [[]]
            return [[s] + rest for s in sizes if smallest <= s <= left for rest in partitions(left - s, s)]

        for sizes_used in partitions(len(live_nodes), 0):
            if len(sizes_used) > instance.global_micro_batches:
                continue
            pipelines, cursor = [], 0
            for size in sorted(sizes_used, reverse=True):
                pipelines.append(tuple(live_nodes[cursor:cursor + size]))
                cursor += size
            found = self.lower(instance, pipelines)
            if found is not None and (best is None or found[1] < best[1]):
                best = found
        return best

    @staticmethod
    def node_pipelines(instance: Instance, plan: Plan) -> list[NodePipeline]:
        """The nodes of each pipeline of an Oobleck plan, in stage order."""
        found = []
        for pipe in plan.pipelines:
            nodes: list[int] = []
            for stage in pipe.stages:
                node = instance.node_of(stage.devices[0])
                if not nodes or nodes[-1] != node:
                    nodes.append(node)
            found.append(tuple(nodes))
        return found

    @staticmethod
    def reconfigure_nodes(pipelines: list[NodePipeline], lost: set[int], n_min: int) -> list[NodePipeline] | None:
        """Oobleck's local rule (on_reconfigure): shrink, borrow from the biggest, else merge."""
        kept = [[n for n in p if n not in lost] for p in pipelines]
        kept = [p for p in kept if p]
        short = [i for i, p in enumerate(kept) if len(p) < n_min]
        for i in short:
            while len(kept[i]) < n_min:
                donors = [j for j, p in enumerate(kept) if j != i and len(p) > n_min]
                if not donors:
                    break
                biggest = max(donors, key=lambda j: (len(kept[j]), j))  # ties: the later pipeline
                kept[i].append(kept[biggest].pop())
        if any(len(p) < n_min for p in kept):
            shorts = [p for p in kept if len(p) < n_min]
            healthy = [p for p in kept if len(p) >= n_min]
            merged: list[list[int]] = []
            current: list[int] = []
            for p in shorts:  # concatenated in order
                current += p
                if len(current) >= n_min:
                    merged.append(current)
                    current = []
            if current:
                if not healthy:
                    return None if not merged else [tuple(m) for m in merged[:-1]] + [tuple(merged[-1] + current)]
                healthy[0] = current + healthy[0]  # the still-short one absorbs the first healthy pipeline
            kept = merged + healthy
        return [tuple(p) for p in sorted(kept, key=len, reverse=True)]

    # -- the policy -----------------------------------------------------------------------------
    def _respond(self, state: PolicyState) -> Response:
        instance = state.instance
        nodes = instance.spec.cluster.nodes
        lost = self.dead_nodes(instance, state.dead)
        live = [n for n in range(nodes) if n not in lost]
        params = float(instance.workload.params.sum())
        if state.kind == "start":
            found = self.instantiate(instance, live)
            if found is None:
                return Response(None, math.inf, 0.0, "no template instantiation fits the cluster", "start")
            plan, step = found
            return Response(plan, step, 0.0, f"{len(plan.pipelines)} node-unit pipelines of "
                            f"{sorted({len(p) for p in self.node_pipelines(instance, plan)})} nodes", "start")
        if state.kind == "repair":
            step = self.model(instance).evaluate(state.layout).iteration_time_s
            return Response(state.layout, step, 0.0, "a repaired node waits for the next rendezvous "
                            "(Oobleck's simulator: simulate_should_reconfigure is False)", "stay")
        if lost_layers(instance, frozenset(d for n in lost for d in range(n * instance.devices_per_node,
                                                                       (n + 1) * instance.devices_per_node))):
            return restart_response(self, state, "a lost node held the last replica of some layer")
        n_min = self.n_min(instance)
        if n_min is None:
            return restart_response(self, state, "no Oobleck template fits")
        current = self.node_pipelines(instance, state.layout)
        waiting = set(live) - {n for p in current for n in p}  # repaired nodes the layout does not use
        if waiting:  # they join at this rendezvous: a re-instantiation over every live node
            found = self.instantiate(instance, live)
            how = "re-instantiated over every live node (repaired nodes joined at this rendezvous)"
        else:
            pipelines = self.reconfigure_nodes(current, lost, n_min)
            found = None if pipelines is None else self.lower(instance, pipelines)
            how = "local reconfiguration (shrink, borrow, merge)"
        if found is None:
            return restart_response(self, state, "Oobleck's reconfiguration finds no template for the survivors")
        plan, step = found
        model = self.model(instance)
        node_dead = frozenset(d for n in lost for d in range(n * instance.devices_per_node,
                                                             (n + 1) * instance.devices_per_node))
        copy = migration_lower_bound_s(model, state.layout, plan, node_dead)
        pause = max(rendezvous_s(params), copy)
        lost_iteration = model.evaluate(state.layout).iteration_time_s
        return Response(plan, step, pause + lost_iteration,
                        f"node {sorted(lost)} lost whole; {how}: {len(plan.pipelines)} pipelines; rendezvous "
                        f"{pause:.1f} s (Oobleck's simulator, or the broadcast of missing layers) + one lost "
                        f"iteration {lost_iteration:.2f} s", "reconfigure")
