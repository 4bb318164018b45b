"""The memoised 1F1B makespan (perf/pipeline.py `_makespan`) returns exactly the simulation's value."""

import numpy as np
import pytest

from chameleon_opt.perf.pipeline import _one_f_one_b_ends, one_f_one_b_time, uniform_1f1b_time


def test_memoised_makespan_equals_simulation_for_lists_and_arrays() -> None:
    forward, backward = [0.3, 0.1, 0.25], [0.6, 0.2, 0.5]
    expected = max(_one_f_one_b_ends(forward, backward, 5)[1][0])
    assert one_f_one_b_time(forward, backward, 5) == expected
    assert one_f_one_b_time(np.array(forward), np.array(backward), 5) == expected  # a cache hit, same value
    assert one_f_one_b_time(forward, backward, 6) != expected  # micro-batches are part of the key
    assert one_f_one_b_time([1.0] * 4, [2.0] * 4, 3) == uniform_1f1b_time(4, 3, 1.0, 2.0)
    assert one_f_one_b_time([], [], 3) == 0.0


def test_negative_times_still_raise_after_a_hit() -> None:
    one_f_one_b_time([0.5], [0.5], 2)
    with pytest.raises(ValueError):
        one_f_one_b_time([-0.5], [0.5], 2)
