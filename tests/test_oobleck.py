"""Oobleck's mechanisms pinned to hand-worked examples from its own code and tests."""

from __future__ import annotations

import pytest

from chameleon_opt.instance.load import load_instance
from chameleon_opt.recovery.interface import PolicyState, at_state
from chameleon_opt.recovery.oobleck import Oobleck, rendezvous_s

START = [(0, 1), (2, 3, 4), (5, 6, 7, 8), (9, 10, 11, 12, 13)]  # Oobleck's test_dynamic_reconfiguration


def test_a_pipeline_at_n_min_or_more_shrinks_in_place():
    assert sorted(Oobleck.reconfigure_nodes(START, {2}, 2)) == sorted([(9, 10, 11, 12, 13), (5, 6, 7, 8), (3, 4), (0, 1)])


def test_short_pipelines_borrow_from_the_biggest_later_one_first():
    result = Oobleck.reconfigure_nodes(START, {1, 3, 4}, 2)
    assert sorted(result) == sorted([(0, 13), (2, 12), (9, 10, 11), (5, 6, 7, 8)])


def test_without_a_donor_short_pipelines_merge():
    result = Oobleck.reconfigure_nodes(START, {1, 2, 3, 5, 6, 7, 9, 10, 11}, 2)
    assert sorted(result) == sorted([(0, 4), (8, 12, 13)])


def test_a_card_failure_loses_its_whole_node():
    instance = load_instance("paper-32")
    policy = Oobleck()
    start = policy.respond(PolicyState(instance, frozenset(), "start"))
    assert start.plan is not None
    used = {instance.node_of(d) for d in start.plan.devices}
    assert used == set(range(instance.spec.cluster.nodes))  # every node is used: exact-sum instantiation
    layout_instance = at_state(instance, start.next_layout, frozenset({13}))
    response = policy.respond(PolicyState(layout_instance, frozenset({13}), "fail", frozenset({13}), 10.0))
    node = instance.node_of(13)
    assert response.plan is not None
    assert not {instance.node_of(d) for d in response.plan.devices} & {node}  # the whole node is gone
    assert response.transition_s >= rendezvous_s(float(instance.workload.params.sum()))


def test_rendezvous_follows_oobleck_simulator_table():
    assert rendezvous_s(0.3e9) == pytest.approx(2.0)
    assert rendezvous_s(2.7e9) == pytest.approx(6.0)
    assert rendezvous_s(175e9) == pytest.approx(10.0)
