"""Errors that reach a user, each mapped to one exit code of the CLI contract.

Every error carries enough to print one line that names the file, the field and the fix:
the CLI prints `str(error)` and exits with `error.exit_code`, never a traceback.
"""

from __future__ import annotations

from pathlib import Path


class ChameleonError(Exception):
    """Base class: a message for a person and the exit code `chameleon-solve` returns."""

    exit_code = 1


class InputError(ChameleonError):
    """Bad usage or an invalid input file (exit code 2)."""

    exit_code = 2

    def __init__(self, file: str | Path | None, field: str, problem: str, fix: str) -> None:
        self.file = str(file) if file is not None else None  # None: a setting given in code, not a file
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(f"{'' if self.file is None else self.file + ': '}{field}: {problem}; fix: {fix}")


class InfeasibleError(ChameleonError):
    """Proven infeasible (exit code 3): no plan exists, and `reason` says why."""

    exit_code = 3

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"infeasible: {reason}")


class NoSolutionError(ChameleonError):
    """Nothing usable found within the time limit and infeasibility not proven (exit code 4):
    `reason` names what was tried, `suggested_limit_s` a limit that would likely suffice."""

    exit_code = 4

    def __init__(self, reason: str, limit_s: float, suggested_limit_s: float | None) -> None:
        self.reason, self.limit_s, self.suggested_limit_s = reason, limit_s, suggested_limit_s
        fix = (f"raise --time-limit (about {suggested_limit_s:.3g} s would likely suffice)"
               if suggested_limit_s is not None else
               "the search ended before the limit without a plan and without a proof that none exists: give the "
               "survivors more memory (or a lighter recomputation / relief) or plan with a checkpoint restart")
        super().__init__(f"no answer within the {limit_s:.3g} s limit: {reason}; fix: {fix}")


class UnrecoverableError(ChameleonError):
    """Some model state has no surviving copy (exit code 5): restart from a checkpoint."""

    exit_code = 5
