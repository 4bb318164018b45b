"""Fault-tolerance planner for DP x PP x TP training jobs (see README.md)."""

__version__ = "0.1.0"
"""The one place the version is written: pyproject.toml reads it (dynamic version)."""
