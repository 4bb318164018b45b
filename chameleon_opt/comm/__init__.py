"""Communication after a reconfiguration (the paper's Restorer): which TP group takes which slot,
which replica sends which state in which round, and the gradient all-reduce rounds of uneven
pipelines; lowered to one executable plan per rank."""

from chameleon_opt.comm.allreduce import AllreduceSchedule, allreduce_groups, schedule_allreduce
from chameleon_opt.comm.api import CommInfo, communication_plan
from chameleon_opt.comm.assignment import assign_slots, figure3_example, min_cost_assignment
from chameleon_opt.comm.lowering import lower_plan
from chameleon_opt.comm.migration import schedule_migration
from chameleon_opt.comm.rounds import check_release_safety, colour_bipartite_edges
from chameleon_opt.comm.transfers import Migration, Transfer

__all__ = ["AllreduceSchedule", "CommInfo", "Migration", "Transfer", "allreduce_groups", "assign_slots",
           "check_release_safety", "colour_bipartite_edges", "communication_plan", "figure3_example",
           "lower_plan", "min_cost_assignment", "schedule_allreduce", "schedule_migration"]
