"""Fitting one free parameter of the performance model to measured step times, honestly.

The fit minimises the sum of squared relative errors over a grid, and every measurement is also
predicted by a leave-one-out fit (calibrated on all the others), so reported errors can be read
as predictions rather than as a fit that has seen the answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Calibration:
    value: float                    # the parameter fitted on every measurement
    predictions: np.ndarray         # predictions with that value
    loo_values: np.ndarray          # value fitted without measurement i
    loo_predictions: np.ndarray     # prediction of measurement i from the fit without it


def calibrate(predict: Callable[[float], Sequence[float]], measured: Sequence[float],
              grid: Sequence[float]) -> Calibration:
    """Fit one parameter: `predict(value)` returns one predicted time per measurement."""
    truth = np.asarray(measured, dtype=float)
    table = np.array([np.asarray(predict(v), dtype=float) for v in grid])  # [grid, cases]
    squared = ((table - truth) / truth) ** 2
    best = int(np.argmin(squared.sum(axis=1)))
    loo_values, loo_predictions = [], []
    for i in range(len(truth)):
        others = np.delete(squared, i, axis=1).sum(axis=1)
        k = int(np.argmin(others))
        loo_values.append(grid[k])
        loo_predictions.append(table[k, i])
    return Calibration(float(grid[best]), table[best], np.array(loo_values), np.array(loo_predictions))
