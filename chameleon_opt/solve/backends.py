"""Solver set-up shared by every CP-SAT model: explicit limits, never the library's defaults."""

from __future__ import annotations

from ortools.sat.python import cp_model


def cpsat_solver(time_limit_s: float, threads: int, seed: int) -> cp_model.CpSolver:
    """A CP-SAT solver with the time limit, worker count and seed set explicitly (reproducible runs
    need the seed, and CP-SAT otherwise uses every core and no time limit)."""
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(time_limit_s, 0.01)
    solver.parameters.num_workers = threads
    solver.parameters.random_seed = seed
    return solver
