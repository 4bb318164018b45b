"""examples/torchft_redistribute.py: torchft's Manager runs three replica groups on gloo (CPU) with
its lighthouse in its own process; replica 1 is SIGKILLed mid-step 4; at the quorum change the
planner chooses to redistribute its micro-batches over the two survivors, so every step trains the
whole global batch, every sample exactly once, and the losses are those of failure-free training.
Skipped when torchft is not installed (it is in the `runtime` extra on Linux x86-64)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers import load_example, momentum_sgd, train_whole_batch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "torchft_redistribute.py"
REPLICAS, STEPS, KILLED, KILL_STEP = 3, 8, 1, 4
LOSS_RTOL = 1e-5  # float32 sums in another order (per replica, then across replicas)


def example() -> ModuleType:
    return load_example(EXAMPLE)


def reference_losses(module: ModuleType) -> list[float]:
    """Failure-free training on the whole global batch, in one process."""
    return train_whole_batch(module, STEPS, momentum_sgd)[1]


def read_log(path: Path) -> tuple[list[dict], list[dict]]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [e for e in lines if "step" in e and "loss" in e], [e for e in lines if "decision" in e]


@pytest.mark.multiprocess
def test_killed_replica_group_is_redistributed_with_failure_free_losses(tmp_path):
    pytest.importorskip("torchft")
    lighthouse = subprocess.Popen([sys.executable, str(EXAMPLE), "lighthouse", "--replicas", str(REPLICAS)],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    replicas: list[subprocess.Popen] = []
    try:
        assert lighthouse.stdout is not None
        address = lighthouse.stdout.readline().strip()
        assert address.startswith("http://127.0.0.1:")
        for r in range(REPLICAS):
            replicas.append(subprocess.Popen(
                [sys.executable, str(EXAMPLE), "replica", "--lighthouse", address, "--replica", str(r),
                 "--replicas", str(REPLICAS), "--workdir", str(tmp_path), "--steps", str(STEPS),
                 "--kill", f"{KILLED}@{KILL_STEP}"],
                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outputs = [p.communicate(timeout=120)[0] for p in replicas]
    finally:
        for process in replicas + [lighthouse]:
            if process.poll() is None:
                process.kill()
            process.wait()
    survivors = [r for r in range(REPLICAS) if r != KILLED]
    assert replicas[KILLED].returncode == -9
    for r in survivors:
        assert replicas[r].returncode == 0, outputs[r][-3000:]
    expected = reference_losses(example())
    logs = {r: read_log(tmp_path / f"log.{r}") for r in range(REPLICAS)}
    for r in survivors:
        steps, decisions = logs[r]
        assert [d["decision"] for d in decisions] == ["redistribute"]
        assert decisions[0]["lost"] == [KILLED] and decisions[0]["members"] == survivors
        assert [e["step"] for e in steps] == list(range(STEPS))  # each step committed once
        for entry, want in zip(steps, expected):
            assert abs(entry["loss"] - want) <= LOSS_RTOL * abs(want), (entry, want)
    assert [e["step"] for e in logs[KILLED][0]] == list(range(KILL_STEP))  # it never committed step 4
    for step in range(STEPS):  # every sample of every global batch trained exactly once
        trained = sorted(i for r in range(REPLICAS) for e in logs[r][0] if e["step"] == step for i in e["samples"])
        assert trained == list(range(48)), step


def test_planner_shrinks_when_keeping_the_batch_slows_the_step_too_much():
    module = example()
    from chameleon_opt.api import Planner

    keep = module.decide(Planner(module.job_spec(REPLICAS), time_limit_s=2.0), REPLICAS, [KILLED], 2.0)
    assert keep.mode == "redistribute" and keep.batch == module.GLOBAL_BATCH
    assert sorted(i for s in keep.samples.values() for i in s) == list(range(module.GLOBAL_BATCH))
    shrink = module.decide(Planner(module.job_spec(REPLICAS), time_limit_s=2.0), REPLICAS, [KILLED], 1.2)
    assert shrink.mode == "shrink" and "1.2" in shrink.reason
    assert shrink.samples == {r: module.failure_free_samples(REPLICAS)[r] for r in (0, 2)}
    assert shrink.batch == module.GLOBAL_BATCH * 2 // 3
