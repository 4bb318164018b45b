"""The one planning path: failure -> candidates -> Eq. 8 -> communication -> checked, lowered plan.

`plan_recovery` is what the CLI (`plan`), the library (`api.Planner`) and the runtime controller
call; the simulator's policies reach the same candidates through `decision.decide`. One
`Deadline` bounds all of it: rerouting, the plan search and the reconfiguration's communication
each take a share of what is left when they start (`decision.py`) of all but FINISH_SHARE,
then the chosen option's remaining communication (a rerouting's gradient rounds) takes what is left. Each stage's
limit, time and whether it stopped early travel in `RecoveryDecision.stages`. Lowering to
per-rank plans is lazy (`comm.lowering.LoweredPlan`): a rank's plan is built when it is asked
for, so a decision at 16,384 devices costs no lowering until a rank wants its work.

No torch here: trainers import this before (or without) their framework.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from chameleon_opt.check import assert_sound
from chameleon_opt.comm import Migration, communication_plan, schedule_allreduce
from chameleon_opt.comm.api import CommInfo
from chameleon_opt.comm.reshard import CheckpointReshard
from chameleon_opt.comm.lowering import LoweredPlan, RankPlan, absent_rank_plan
from chameleon_opt.errors import InfeasibleError, InputError, NoSolutionError
from chameleon_opt.instance.load import Instance
from chameleon_opt.perf.model import Estimate, PerfModel
from chameleon_opt.plan import Plan
from chameleon_opt.decision import RecoveryOption, decide
from chameleon_opt.solve.backends import SolverOptions
from chameleon_opt.solve.bubbles import BubbleSchedule
from chameleon_opt.solve.deadline import Deadline, StageTime
from chameleon_opt.solve.result import SolveResult
from chameleon_opt.solve.target import TARGETS, as_run_by

POLICIES = ("auto", "reroute", "reconfigure")
FINISH_SHARE = 0.1
"""Of the decision's time, kept back from the candidates for what follows the choice: the chosen
option's remaining communication (a rerouting's gradient rounds), its check and the caller's
answer (0.1-0.2 s at 16,384 devices, which would otherwise all fall after the deadline)."""


@dataclass(frozen=True)
class PlanningOptions:
    """How to plan: the policy (`auto`: Eq. 8 among rerouting, reconfiguration and the hybrid),
    the time limit for the whole decision, the solver settings, and an explicit time to the next
    fault D (else the instance's fault statistics). `tp_degrees`: TP degrees a reconfiguration may
    move to besides the job's own (opt-in: each is searched within the search's share of the time,
    and a change is priced as a re-shard from the last step's checkpoint, comm/reshard.py)."""

    policy: str = "auto"
    time_limit_s: float = 10.0
    solver: SolverOptions = field(default_factory=SolverOptions)
    next_fault_s: float | None = None
    bubble_filling: bool = True  # also place rerouted work into the peers' idle time (solve/bubbles.py)
    target: str = "any"  # the trainer whose vocabulary the plan must fit (solve/target.py)
    tp_degrees: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise InputError(None, "policy", f"unknown policy {self.policy!r}", f"use one of {', '.join(POLICIES)}")
        if self.target not in TARGETS:
            raise InputError(None, "target", f"unknown target {self.target!r}", f"use one of {', '.join(TARGETS)}")
        if not self.time_limit_s > 0:
            raise InputError(None, "time_limit_s", f"got {self.time_limit_s!r}", "give a positive number of seconds")
        if self.tp_degrees and self.target != "any":
            raise InputError(None, "tp_degrees", f"a TP change is not planned for target {self.target}",
                             "use --target any with TP degrees")
        if self.next_fault_s is not None and not self.next_fault_s > 0:
            raise InputError(None, "next_fault_s", f"got {self.next_fault_s!r}", "give a positive number of seconds")


@dataclass(frozen=True)
class RecoveryDecision:
    """The chosen recovery, ready to run.

    `plan` is the checked plan to run next, `estimate` its predicted step, and `rank_plans` its
    lowering: device -> executable plan (`comm/lowering.py` documents the format) for every live
    device of the plan and every device that only sends migration state, built per rank on
    access. `failed` holds every device failed so far, `candidates` what was weighed (Eq. 8
    scores), `migration` the state to move before training resumes (None when rerouting: nothing
    moves), `allreduce_rounds` the gradient all-reduce groups per round, `solve` the chosen plan's
    solve, `communication` the scheduling's details and `stages` each stage's time limit, time and
    whether it stopped early. A hybrid's `plan` is the final, reconfigured plan, and `interim` the
    rerouting decision to run at once while the search and migration proceed in the background
    (its `candidates` are empty); `transition_s` is then the pause of the switch. `reshard` is set
    when the plan changes the TP degree: no migration moves state, every device reads its new
    shards from the checkpoint of the last committed step. `schedule` is set when the plan is a
    bubble-filled rerouting: the schedule it was priced at, whose per-device orders the lowering
    hands each rank as its action list (`RankPlan.actions`)."""

    policy: str
    reason: str
    failed: frozenset[int]
    num_devices: int
    plan: Plan
    estimate: Estimate
    transition_s: float
    candidates: tuple[RecoveryOption, ...]
    migration: Migration | None
    allreduce_rounds: tuple[tuple[str, ...], ...]
    rank_plans: LoweredPlan
    interim: RecoveryDecision | None = None
    solve: SolveResult[Plan] | None = None
    communication: CommInfo | None = None
    stages: tuple[StageTime, ...] = ()
    reshard: CheckpointReshard | None = None
    schedule: BubbleSchedule | None = None

    @property
    def tensor_parallel_changed(self) -> bool:
        """The plan runs another TP degree: its state comes from the checkpoint (`reshard`)."""
        return self.reshard is not None

    @property
    def iteration_time_s(self) -> float:
        return self.estimate.iteration_time_s

    @property
    def stopped_early(self) -> list[str]:
        """The stages the deadline cut short."""
        return [s.stage for s in self.stages if s.stopped_early]

    def for_rank(self, device: int) -> RankPlan:
        """The executable plan of `device`; a device with no part in the plan (failed, or a spare
        the plan leaves out) gets the lowering's absent record (role `failed` or `idle`, no work),
        so that every process of a job can ask the same question."""
        if device in self.rank_plans:
            return self.rank_plans[device]
        if not 0 <= device < self.num_devices:
            raise InputError(None, "device", f"{device} is not a device of the instance",
                             f"use 0..{self.num_devices - 1}")
        return absent_rank_plan(self.rank_plans.instance, device, "failed" if device in self.failed else "idle")


def executable(state: Instance, option: RecoveryOption, failed: frozenset[int], reason: str,
               candidates: tuple[RecoveryOption, ...], deadline: Deadline, solver: SolverOptions,
               stages: tuple[StageTime, ...] = ()) -> RecoveryDecision:
    """The option's plan with its communication scheduled (rerouting: the gradient rounds only,
    nothing migrates), checked, and lowered lazily per rank."""
    assert option.plan is not None and option.estimate is not None
    rerouted = option.communication is None
    if rerouted:
        started = time.perf_counter()
        _, rounds, comm = communication_plan(state, state.plan, option.plan, failed, assign=False,
                                             deadline=deadline, options=solver)
        stages += (StageTime("communication", max(deadline.end - started, 0.0), time.perf_counter() - started,
                             comm.stopped_early, f"gradient rounds {comm.allreduce.solve.status.value}"),)
        migration = None
    else:
        migration, rounds, comm = option.communication
    # A rerouting's plan passed the checker inside `reroute_plan` and is kept as is; a
    # reconfiguration's was re-mapped onto slots since its search, so it is checked again.
    plan = comm.plan if rerouted and comm.plan is option.plan else \
        assert_sound(state, comm.plan, failed, require_tp_in_node=not rerouted)
    ranks = LoweredPlan(state, plan, migration, rounds, failed, option.schedule)
    return RecoveryDecision(option.policy, reason, failed, state.num_devices, plan, option.estimate,
                            option.transition_s, candidates, migration, tuple(tuple(r) for r in rounds), ranks,
                            solve=option.solve, communication=comm, stages=stages, reshard=option.reshard,
                            schedule=option.schedule)


def current_rank_plans(instance: Instance, deadline: Deadline,
                       options: SolverOptions = SolverOptions()) -> LoweredPlan:
    """The running layout's lowering with nothing failed, as the runtime lowers a job's start
    (its gradient rounds scheduled, nothing migrates): what `export-plan` writes when there is
    no failure to decide for."""
    rounds = schedule_allreduce(PerfModel(instance), instance.plan, frozenset(), deadline, options).rounds
    return LoweredPlan(instance, instance.plan, None, rounds, frozenset())


def suggested_limit_s(stages: tuple[StageTime, ...], limit_s: float) -> float | None:
    """A whole-decision limit that would likely have sufficed: each stage gets a share of the
    limit, so the limit scales by the largest ratio of a stopped stage's estimated need to what it
    was given (twice the limit where a stage that stopped early gives no estimate). None when no
    stage was cut short: more time would not change the answer."""
    stopped = [stage for stage in stages if stage.stopped_early]
    if not stopped:
        return None
    ratio = 2.0
    for stage in stopped:
        if stage.needed_s is not None and stage.limit_s > 0:
            ratio = max(ratio, 1.2 * stage.needed_s / stage.limit_s)
    return limit_s * ratio


def plan_recovery(instance: Instance, failed: frozenset[int], options: PlanningOptions = PlanningOptions(),
                  deadline: Deadline | None = None) -> RecoveryDecision:
    """The recovery from `failed` (every device failed so far) of the job whose current layout is
    `instance.plan`, within `deadline` (else `options.time_limit_s` from now). Priced as
    `options.target` runs the job (`solve.target.as_run_by`: Megatron-LM's recompute has no early stop).

    Raises UnrecoverableError when some layer lost every replica, InfeasibleError when no
    candidate is usable for a proven reason, NoSolutionError when none is usable because the
    deadline cut the work short (each one's reason and a limit that would suffice are given)."""
    begun = time.perf_counter()
    deadline = deadline or Deadline.after(options.time_limit_s, begun, options.solver.deterministic)
    instance = as_run_by(instance, options.target)  # the trainer's recomputation, not the imported job's
    deciding = deadline.share(1 - FINISH_SHARE)
    decision = decide(instance, failed, options.policy, next_fault_s=options.next_fault_s, deadline=deciding,
                      bubble_filling=options.bubble_filling, target=options.target,
                      options=options.solver, tp_degrees=options.tp_degrees)
    if decision.chosen is None:
        if decision.proven:
            raise InfeasibleError(decision.reason)
        raise NoSolutionError(decision.reason, options.time_limit_s,
                              suggested_limit_s(decision.stages, options.time_limit_s))
    chosen = decision.chosen
    result = executable(instance, chosen, failed, decision.reason, decision.candidates, deadline, options.solver,
                        decision.stages)
    if chosen.interim is not None:
        interim = executable(instance, chosen.interim, failed, chosen.interim.reason, (), deadline, options.solver)
        result = dataclasses.replace(result, interim=interim, stages=result.stages + interim.stages)
    return result
