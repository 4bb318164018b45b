"""Solvers: each decision posed as a MILP or CP-SAT model, solved under a time limit, returning a SolveResult."""
