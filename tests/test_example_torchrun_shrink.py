"""examples/torchrun_shrink.py: three torchrun agents (one node each) on a c10d rendezvous whose store
runs in its own process; node 1 is lost before step 4; the world shrinks from 3 to 2 and training
continues from the survivors' own state (handed to their restarts through /dev/shm, no checkpoint),
with the loss of failure-free training on the same samples."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import load_example, momentum_sgd, train_whole_batch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "torchrun_shrink.py"
STEPS, KILL = 8, "1@4"


def reference_losses() -> list[float]:
    return train_whole_batch(load_example(EXAMPLE), STEPS, momentum_sgd)[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.multiprocess
def test_world_shrinks_from_3_to_2_and_training_continues(tmp_path):
    port = _free_port()
    run_id = f"shrink-{os.getpid()}-{port}"  # unique: handoffs in /dev/shm are named by it
    bindir = Path(sys.executable).parent
    # the rendezvous store lives in this test's process, apart from every node's (losing a node does
    # not take it along), and costs no interpreter of its own (a torch import: 2 s of CPU)
    import torch.distributed

    store = torch.distributed.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    agents = []
    try:
        for node in range(3):
            agents.append(subprocess.Popen(
                [str(bindir / "torchrun"), "--nnodes", "2:3", "--nproc-per-node", "1", "--max-restarts", "1",
                 "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id,
                 "--rdzv-conf", "is_host=false,last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=2", "--monitor-interval", "0.5", str(EXAMPLE),
                 "--workdir", str(tmp_path), "--device", str(node), "--steps", str(STEPS), "--kill", KILL],
                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outputs = [agent.communicate(timeout=400)[0] for agent in agents]
    finally:
        for process in agents:
            if process.poll() is None:
                process.kill()
        del store
    assert agents[1].returncode != 0  # the lost node (its agent was killed)
    assert agents[0].returncode == 0 and agents[2].returncode == 0, outputs[0][-2000:] + outputs[2][-2000:]
    assert "world 2: nodes [0, 2] after losing [1]" in outputs[0] + outputs[2]
    expected = reference_losses()
    for device in (0, 2):
        logged = [line.split() for line in (tmp_path / f"loss.{device}").read_text().splitlines()]
        assert [int(step) for step, _ in logged] == list(range(STEPS))  # each step once, none redone
        for (_, value), want in zip(logged, expected):
            assert abs(float(value) - want) <= 1e-5 * abs(want)
    assert len((tmp_path / "loss.1").read_text().splitlines()) == 4  # it trained steps 0-3 before it was lost
    assert not list(Path("/dev/shm").glob(f"chameleon-{run_id}-*"))  # every handoff was taken
