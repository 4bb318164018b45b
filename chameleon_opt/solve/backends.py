"""The solver layer: the only module that reads a backend's own status codes, bounds and clocks.

Like cvxpy's per-backend STATUS_MAP, each backend's statuses map onto `Status` here, and every
call returns an `Outcome` (status, objective, proven bound, the backend's own run time, its own
status name); callers build `SolveResult`s from it and never see a backend code. Backends:

- CP-SAT (OR-Tools' snake_case API, >= 9.8): `cpsat_solver` / `solve_cpsat`.
- HiGHS through PuLP (`solve_pulp(..., "highs")`): PuLP builds the model, highspy reports the
  model status, the primal solution status (a time-limited MIP may hold an incumbent or not),
  the MIP dual bound and its run time. PuLP's own summary is not used: it calls a point HiGHS
  stopped at by the clock "Optimal".
- HiGHS on arrays (`run_highs`): the migration LP, too large for PuLP's row-by-row building.
- CBC through PuLP (`solve_pulp(..., "cbc")`): PuLP's solution status (`sol_status`, read from
  CBC's solution file: optimal, integer feasible after a limit, infeasible, none) - never CBC's
  log. PuLP exposes no dual bound from CBC, so CBC's bound is None.
- Heuristics: `heuristic` wraps a rule's answer (the even split, a greedy) as HEURISTIC.

`SolverOptions` carries what the operator sets on the command line (`--backend`, `--threads`,
`--seed`, `--solver-log`, `--params KEY=VALUE`); `params` go to the backend by its own option
names (CP-SAT's SatParameters fields, HiGHS's options, CBC's command-line options).
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from chameleon_opt.errors import InputError
from chameleon_opt.solve.deadline import DETERMINISTIC_WALL_FACTOR
from chameleon_opt.solve.result import SolveResult, Status, T

BACKENDS = ("cpsat", "highs", "cbc")
CPSAT_INT_LIMIT = 2 ** 53
"""Largest integer coefficient or bound handed to CP-SAT: int64 with room for the sums it forms
(objective x tie weights) and exact in a float. A model that would need more is not built."""


CPSAT_IMPORT_S = 0.3
"""Importing OR-Tools' CP-SAT (it brings pandas) the first time: inside a decision's deadline."""


def cpsat_start_s() -> float:
    """What using CP-SAT costs before any model is built: its first import, 0 once imported. A
    caller with less time left than this and its model's build does not start it."""
    return 0.0 if "ortools.sat.python.cp_model" in sys.modules else CPSAT_IMPORT_S


class OutOfRange(ValueError):
    """A number a backend cannot take (CP-SAT's int64); the caller falls back and says so."""


def cpsat_int(value: float, what: str) -> int:
    """`value` as a CP-SAT integer, or OutOfRange naming `what` when it exceeds CPSAT_INT_LIMIT."""
    if not math.isfinite(value) or abs(value) > CPSAT_INT_LIMIT:
        raise OutOfRange(f"{what} = {value:.3g} exceeds CP-SAT's integer range ({CPSAT_INT_LIMIT:.2g} after scaling)")
    return int(value)
"""Backends of the plan search's level model (`--backend`); rerouting and the migration LP are
HiGHS models (CBC as the migration's fallback)."""


@dataclass(frozen=True)
class SolverOptions:
    """What the operator sets for every solver call. `params` are passed to the backend by name
    and apply to the calls of that backend only (`--params` names one backend's options)."""

    backend: str = "cpsat"
    threads: int = 1
    seed: int = 0
    log: bool = False
    params: Mapping[str, str] = field(default_factory=dict)
    deterministic: bool = False
    """Reproducible answers on a loaded machine (`simulate --deterministic`): CP-SAT runs one worker
    and stops on its deterministic time (CPSAT_WORK_PER_S per second of limit) rather than the wall
    clock, and every backend's wall-clock limit becomes a safety net DETERMINISTIC_WALL_FACTOR x
    as long (pair it with `Deadline.after(..., deterministic=True)`)."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise InputError(None, "--backend", f"unknown backend {self.backend!r}", f"use one of {', '.join(BACKENDS)}")
        if self.threads < 1:
            raise InputError(None, "--threads", f"got {self.threads}", "use at least 1")
        self.check_params()

    def check_params(self) -> None:
        """Refuse unknown or ill-typed `--params` before any work (a search that happens not to
        start the backend would otherwise accept them silently). CBC's options are command-line
        words that only CBC itself can judge."""
        if self.backend == "cpsat" and self.params:
            cpsat_solver(1.0, self)
        elif self.backend == "highs" and self.params:
            import highspy

            h = highspy.Highs()
            _highs_options(h, 1.0, self, {})


DEFAULT = SolverOptions()

CPSAT_WORK_PER_S = 0.2
"""CP-SAT's deterministic time per wall second with one worker, measured on the bubble-filling
model on a quiet 2-core machine (paper-example losing device 1: 0.217 in 1.13 s; other models'
rates were not measured): a deterministic run's budget for a limit of T seconds is
CPSAT_WORK_PER_S x T, about T seconds of a quiet machine."""


@dataclass(frozen=True)
class Outcome:
    """One backend call as the rest of the toolkit sees it. `objective` and `bound` are in the
    model's own units; `wall_s` is the backend's own clock where it has one."""

    status: Status
    objective: float | None
    bound: float | None
    wall_s: float
    detail: str  # the backend's own status name, for reasons and logs

    @property
    def has_solution(self) -> bool:
        """`Status.has_solution`: one definition (a backend never answers HEURISTIC itself)."""
        return self.status.has_solution


def heuristic(solution: T, objective: float, backend: str, reason: str, wall_s: float = 0.0,
              build_s: float = 0.0, seed: int | None = None) -> SolveResult[T]:
    """A rule's answer (no search, no proof): HEURISTIC, no bound."""
    return SolveResult(Status.HEURISTIC, solution, objective, None, wall_s, backend, build_s, seed, reason)


def _log(text: str) -> None:
    sys.stderr.write(text if text.endswith("\n") else text + "\n")


def _copy_log(path: str) -> None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            _log(handle.read())
    finally:
        os.unlink(path)


def _temporary_log() -> str:
    handle, path = tempfile.mkstemp(prefix="chameleon-solver-", suffix=".log")
    os.close(handle)
    return path


# -- CP-SAT -----------------------------------------------------------------------------------------

def _cpsat_map() -> dict[Any, Status]:
    from ortools.sat.python import cp_model

    return {cp_model.OPTIMAL: Status.OPTIMAL, cp_model.FEASIBLE: Status.FEASIBLE,
            cp_model.INFEASIBLE: Status.INFEASIBLE, cp_model.UNKNOWN: Status.NO_SOLUTION}


def cpsat_solver(time_limit_s: float, options: SolverOptions = DEFAULT, **fixed: Any) -> Any:
    """A CP-SAT solver with the time limit, worker count and seed set explicitly (reproducible
    runs need the seed; CP-SAT otherwise uses every core and no time limit), then the model's own
    `fixed` parameters, then the operator's `--params` (which win)."""
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    parameters = solver.parameters
    parameters.max_time_in_seconds = max(time_limit_s, 0.01)
    parameters.num_workers = options.threads
    parameters.random_seed = options.seed
    if options.deterministic:  # one worker's search is a function of the model, the seed and the work done
        parameters.num_workers = 1
        parameters.max_deterministic_time = max(time_limit_s, 0.01) * CPSAT_WORK_PER_S
        parameters.max_time_in_seconds = max(time_limit_s, 0.01) * DETERMINISTIC_WALL_FACTOR
    for name, value in fixed.items():
        setattr(parameters, name, value)
    if options.backend == "cpsat":
        for name, text in options.params.items():
            if name.startswith("_") or not hasattr(parameters, name) or callable(getattr(parameters, name)):
                raise InputError(None, "--params", f"CP-SAT has no parameter {name!r}",
                                 "use a SatParameters field name, e.g. linearization_level=2")
            value = _convert(name, text, type(getattr(parameters, name)))
            try:
                setattr(parameters, name, value)
            except (TypeError, ValueError) as error:
                raise InputError(None, "--params", f"{name}={text!r}: {error}", f"give {name} a valid value") from None
    if options.log:
        parameters.log_search_progress = True
        parameters.log_to_stdout = False
        solver.log_callback = _log
    return solver


def _convert(name: str, text: str, kind: type) -> Any:
    """`text` as a value of the parameter's type: a bool from true/false/1/0, an enum (CP-SAT's
    pybind enums, e.g. search_branching) from one of its member names, else kind(text)."""
    members = getattr(kind, "__members__", None)
    if isinstance(members, dict) and members:
        if text not in members:
            raise InputError(None, "--params", f"{name}={text!r} is not one of its values",
                             f"give one of {', '.join(members)}")
        return members[text]
    try:
        if kind is bool:
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError(text)
            return text.lower() in ("true", "1")
        return kind(text)
    except ValueError:
        raise InputError(None, "--params", f"{name}={text!r} is not a {kind.__name__}",
                         f"give {name} a {kind.__name__} value") from None


@dataclass(frozen=True)
class Stall:
    """Stop a CP-SAT search once its incumbent has not improved for `least_s` seconds, or for
    `ratio` x the time its last improvement took to come, whichever is longer (before any
    solution: `least_s` from the start). For a model whose caller already holds a valid answer
    and pays for every second it waits (a rerouting's schedule mid-incident): the time limit
    alone let CP-SAT use all of it whenever it could not prove optimality. A wall-clock rule, so
    it is not applied when `SolverOptions.deterministic` asks for reproducible runs."""

    least_s: float
    ratio: float

    def stop_at(self, started: float, improved: float | None) -> float:
        """The wall-clock instant to stop at, given the search's start and its last improvement."""
        if improved is None:
            return started + self.least_s
        return improved + max(self.least_s, self.ratio * (improved - started))


STALL_POLL_S = 0.01
"""How often the stall watch looks at the clock (CP-SAT's stop_search is safe from another thread)."""


def _solve_watched(solver: Any, model: Any, stall: Stall) -> tuple[Any, bool]:
    """Run `solver` on `model` while a thread stops it when `stall` says so; (status code, stalled)."""
    import threading

    from ortools.sat.python import cp_model

    started = time.perf_counter()
    improved: list[float | None] = [None]
    stalled = threading.Event()
    finished = threading.Event()

    class Improved(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self) -> None:  # a minimising search reports only better solutions
            improved[0] = time.perf_counter()

    def watch() -> None:
        while not finished.wait(STALL_POLL_S):
            if time.perf_counter() >= stall.stop_at(started, improved[0]):
                stalled.set()
                solver.stop_search()
                return

    watcher = threading.Thread(target=watch, name="cpsat-stall", daemon=True)
    watcher.start()
    try:
        code = solver.solve(model, Improved())
    finally:
        finished.set()
        watcher.join()
    return code, stalled.is_set()


def solve_cpsat(model: Any, time_limit_s: float, options: SolverOptions = DEFAULT, stall: Stall | None = None,
                **fixed: Any) -> tuple[Any, Outcome]:
    """Solve a CP-SAT model; the solver is returned to read values from when the outcome has a
    solution (reading values without one gives zeros, not an error). With `stall` (and not
    `options.deterministic`) the search also stops when its incumbent stops improving; the
    outcome's detail then says so."""
    from ortools.sat.python import cp_model

    solver = cpsat_solver(time_limit_s, options, **fixed)
    if stall is not None and not options.deterministic:
        code, stalled = _solve_watched(solver, model, stall)
    else:
        code, stalled = solver.solve(model), False
    if code == cp_model.MODEL_INVALID:
        raise AssertionError(f"invalid CP-SAT model (a bug): {model.validate()}")
    status = _cpsat_map()[code]
    solved = status in (Status.OPTIMAL, Status.FEASIBLE)
    detail = solver.status_name(code) + (" (stopped: no improvement)" if stalled and status is not Status.OPTIMAL
                                         else "")
    return solver, Outcome(status, float(solver.objective_value) if solved else None,
                           float(solver.best_objective_bound) if solved else None, float(solver.wall_time), detail)


# -- HiGHS ------------------------------------------------------------------------------------------

def _highs_map() -> dict[Any, Status | None]:
    """HiGHS model status -> Status; None: decided by the primal solution status (a limit was hit,
    with or without an incumbent)."""
    import highspy

    m = highspy.HighsModelStatus
    return {m.kOptimal: Status.OPTIMAL, m.kInfeasible: Status.INFEASIBLE,
            m.kUnboundedOrInfeasible: Status.INFEASIBLE, m.kTimeLimit: None, m.kIterationLimit: None,
            m.kSolutionLimit: None, m.kInterrupt: None, m.kObjectiveBound: None, m.kObjectiveTarget: None,
            m.kMemoryLimit: None, m.kUnknown: None, m.kNotset: Status.NO_SOLUTION, m.kModelEmpty: Status.NO_SOLUTION}


def _highs_options(h: Any, time_limit_s: float, options: SolverOptions, fixed: Mapping[str, Any]) -> str | None:
    """Set limits, seed, threads, the model's `fixed` options and the operator's `--params`;
    returns the log file to copy to stderr afterwards (None without --solver-log)."""
    if options.deterministic:  # HiGHS has no work limit: its clock becomes a safety net
        time_limit_s *= DETERMINISTIC_WALL_FACTOR
    settings: dict[str, Any] = {"output_flag": options.log, "log_to_console": False,  # stdout is for --json
                                "time_limit": max(time_limit_s, 0.01), "threads": options.threads,
                                "random_seed": options.seed, **fixed}
    if options.backend == "highs":
        settings.update(options.params)
    log = None
    if options.log:
        log = settings["log_file"] = _temporary_log()
    for name, value in settings.items():
        if h.setOptionValue(name, value) != _highs_ok():
            raise InputError(None, "--params", f"HiGHS rejects option {name}={value!r}",
                             "use a HiGHS option name and a value of its type (e.g. mip_rel_gap=1e-4)")
    return log


def _highs_ok() -> Any:
    import highspy

    return highspy.HighsStatus.kOk


def highs_outcome(h: Any, mip: bool) -> Outcome:
    """Status, objective, bound and run time of a HiGHS object that has run."""
    import highspy

    model_status = h.getModelStatus()
    info = h.getInfo()
    status = _highs_map().get(model_status, Status.NO_SOLUTION)
    feasible = info.primal_solution_status == highspy.SolutionStatus.kSolutionStatusFeasible
    if status is None:
        status = Status.FEASIBLE if feasible else Status.NO_SOLUTION
    if status is Status.OPTIMAL and not feasible:
        status = Status.NO_SOLUTION
    objective = float(info.objective_function_value) if status.has_solution else None
    if not mip:
        bound = objective if status is Status.OPTIMAL else None
    else:
        bound = float(info.mip_dual_bound) if status.has_solution else None
    return Outcome(status, objective, bound, float(h.getRunTime()), h.modelStatusToString(model_status))


def new_highs(time_limit_s: float, options: SolverOptions = DEFAULT, **fixed: Any) -> tuple[Any, str | None]:
    """A configured HiGHS object (options set before any model is passed: HiGHS prints its banner
    on the first call otherwise) and the log file to hand to `run_highs`."""
    import highspy

    h = highspy.Highs()
    return h, _highs_options(h, time_limit_s, options, fixed)


def run_highs(h: Any, log: str | None, mip: bool = False) -> Outcome:
    """Run a HiGHS object from `new_highs` whose model has been passed (the array interface)."""
    h.run()
    if log is not None:
        _copy_log(log)
    return highs_outcome(h, mip)


def solve_pulp(problem: Any, time_limit_s: float, options: SolverOptions = DEFAULT, backend: str = "highs",
               **fixed: Any) -> Outcome:
    """Solve a PuLP problem with HiGHS (highspy) or CBC; variables' values are set when the
    outcome has a solution. `fixed`: the model's own options in the backend's names."""
    import pulp

    if backend == "highs":
        solver = pulp.HiGHS(msg=False)
        solver.createAndConfigureSolver(problem)
        log = _highs_options(problem.solverModel, time_limit_s, options, fixed)
        solver.buildSolverModel(problem)
        solver.callSolver(problem)
        if log is not None:
            _copy_log(log)
        outcome = highs_outcome(problem.solverModel, mip=problem.isMIP())
        if outcome.has_solution:
            solver.findSolutionValues(problem)
        return outcome
    if backend != "cbc":
        raise ValueError(f"solve_pulp: unknown backend {backend!r}")
    extra = [f"{k} {v}" for k, v in {**fixed, **(options.params if options.backend == "cbc" else {})}.items()]
    if options.deterministic:  # CBC has no work limit: its clock becomes a safety net
        time_limit_s *= DETERMINISTIC_WALL_FACTOR
    log = _temporary_log() if options.log else None
    with warnings.catch_warnings():  # PuLP's bundled CBC is deprecated for PuLP 4.0; it is what we have
        warnings.simplefilter("ignore", DeprecationWarning)
        solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=max(time_limit_s, 0.1), threads=options.threads,
                                   timeMode="elapsed", options=[f"randomCbcSeed {options.seed + 1}", *extra],
                                   logPath=log)
    start = time.perf_counter()
    problem.solve(solver)
    wall = time.perf_counter() - start
    if log is not None:
        _copy_log(log)
    cbc = {pulp.LpSolutionOptimal: Status.OPTIMAL, pulp.LpSolutionIntegerFeasible: Status.FEASIBLE,
           pulp.LpSolutionInfeasible: Status.INFEASIBLE, pulp.LpSolutionNoSolutionFound: Status.NO_SOLUTION,
           pulp.LpSolutionUnbounded: Status.NO_SOLUTION}
    status = cbc.get(problem.sol_status, Status.NO_SOLUTION)
    objective = pulp.value(problem.objective) if status.has_solution else None
    return Outcome(status, None if objective is None else float(objective),
                   float(objective) if status is Status.OPTIMAL and objective is not None else None, wall,
                   pulp.LpSolution.get(problem.sol_status, str(problem.sol_status)))


# -- OR-Tools' graph solvers (exact; they fail only on malformed input) -----------------------------

def require_optimal(solver: Any, code: Any, what: str) -> None:
    """OR-Tools' assignment and min-cost-flow solvers report OPTIMAL or a malformed input."""
    if code != solver.OPTIMAL:
        raise RuntimeError(f"{what} failed (a bug): status {code}")
