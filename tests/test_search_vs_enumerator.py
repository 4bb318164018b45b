"""The search never loses to the paper's Algorithm 1 (our enumerator) where the enumeration finishes.

The template model alone (before the exact polish) was up to 9% slower on memory-tight instances
running fewer micro-batches than stages, where its 1F1B surrogate misjudges splits; the polish
(exact rebalancing, neighbouring mixes, split moves, and the enumeration itself when it is cheap)
closes that. Tolerance 0.1%: the search estimates the gradient all-reduce of mixed pipelines per
template while the evaluation reduces each layer over its exact replica set."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from chameleon_opt.check import check_plan
from chameleon_opt.instance.load import build_instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.solve.enumerator import enumerate_plans
from chameleon_opt.solve.result import Status
from chameleon_opt.solve.search import search_plan
from tests.helpers import tiny_instance


@given(seed=st.integers(0, 100_000), failed=st.sets(st.integers(0, 7), max_size=3),
       blocks=st.integers(2, 6), micro=st.integers(2, 12), memory=st.sampled_from([100.0, 1.5, 0.9]))
@settings(max_examples=40, deadline=None)
def test_search_plan_is_never_slower_than_the_enumerators_best(seed, failed, blocks, micro, memory):
    instance = build_instance(tiny_instance(seed, nodes=2, per_node=4, blocks=blocks, micro_batches=micro,
                                            memory_gib=memory), "<tiny>")
    failed = frozenset(failed)
    model = PerfModel(instance)
    enumerated = enumerate_plans(instance, failed, Deadline.after(20), model=model)
    searched = search_plan(instance, failed, Deadline.after(10), model=model)
    if enumerated.status is Status.INFEASIBLE:
        return  # the paper's space is narrower: ours may still find a plan
    assert enumerated.status is Status.OPTIMAL
    assert searched.solution is not None, searched.reason
    assert check_plan(instance, searched.solution, failed).ok
    ours = model.evaluate(searched.solution, failed).iteration_time_s
    theirs = model.evaluate(enumerated.solution, failed).iteration_time_s
    assert ours <= theirs * (1 + 1e-3), (ours, theirs)
