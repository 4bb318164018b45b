"""examples/torchrun_train.py: a plain DDP loop with the planner plugged in (at most 30 marked
lines) survives workers killed under torchrun's elastic agent and ends with the weights of a
failure-free run, because every step still trains on the whole global batch."""

from __future__ import annotations

import ast
import builtins
import io
import os
import subprocess
import sys
import tokenize
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import load_example, train_whole_batch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "torchrun_train.py"
STEPS = 12
EARLIER_RUN = "an-earlier-run"


def marked_lines(source: str) -> set[int]:
    """Line numbers carrying a `# chameleon` comment (comments only, not strings)."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return {t.start[0] for t in tokens if t.type == tokenize.COMMENT and t.string.startswith("# chameleon")}


def test_integration_is_at_most_30_marked_lines():
    source = EXAMPLE.read_text()
    marked = marked_lines(source)
    assert 0 < len(marked) <= 30, f"{len(marked)} lines marked # chameleon"
    plain = "\n".join(line for n, line in enumerate(source.splitlines(), 1) if n not in marked)
    nodes = list(ast.walk(ast.parse(plain)))            # without them it is still a program,
    used = {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    defined = set(dir(builtins)) | {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    defined |= {n.arg for n in nodes if isinstance(n, ast.arg)}
    defined |= {n.name for n in nodes if isinstance(n, ast.FunctionDef)}
    defined |= {(a.asname or a.name).split(".")[0] for n in nodes if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names}
    assert used <= defined, f"names left undefined: {sorted(used - defined)}"
    assert not any(isinstance(n, ast.ImportFrom) and n.module == "chameleon_opt.api" for n in nodes)  # the plain loop


def reference_weights() -> dict[str, Any]:
    """The example's maths in one process, without failures: full global batch, mean loss."""
    import torch

    module = load_example(EXAMPLE)
    torch.manual_seed(0)
    return train_whole_batch(module, STEPS, module.make_optimizer)[0].state_dict()


def earlier_run_checkpoint(path: Path) -> None:
    """A checkpoint an earlier run left at its last step, with weights no run of this test reaches."""
    import torch

    module = load_example(EXAMPLE)
    torch.manual_seed(1)
    model = module.make_model()
    torch.save({"model": model.state_dict(), "optimizer": module.make_optimizer(model).state_dict(),
                "step": STEPS, "run": EARLIER_RUN}, path)


@pytest.mark.multiprocess
def test_killed_workers_are_planned_around(tmp_path: Path):
    """Two workers, each killed once (rank 0, the checkpoint writer, at step 2, before the first
    checkpoint; rank 1 at step 5, after it; one per attempt): after each restart the planner hears
    every attempt's loss and the restarted worker's return, so no device counts as lost for good
    (this ended in UnrecoverableError when a restarted worker stayed failed: with two workers the
    second kill would lose every replica) and both finish the run. Two workers, not three: each
    attempt costs a torch import per worker, and a third kill exercises nothing the second does not.

    The work directory starts with an earlier run's checkpoint at step 12: the run starts clean
    (and says so) instead of stopping at once, and the restart after rank 0's kill, which finds
    only that checkpoint, starts from step 0 again (the example tells runs apart by
    TORCHELASTIC_RUN_ID, which torchrun draws afresh per invocation)."""
    torch = pytest.importorskip("torch")
    workers, kills = 2, ["0@2", "1@5"]
    lost = [[0], [0], [1]]                              # attempt 1 replays [0]; attempt 2 [0], [1]
    earlier_run_checkpoint(tmp_path / "checkpoint.pt")
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={workers}",
               f"--max-restarts={len(kills)}", str(EXAMPLE), "--workdir", str(tmp_path), "--steps", str(STEPS),
               "--checkpoint-every", "4"] + [f"--kill={kill}" for kill in kills]
    result = subprocess.run(command, capture_output=True, text=True, timeout=400, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "starting clean" in result.stdout and "--resume continues it" in result.stdout
    consulted = [line for line in result.stdout.splitlines() if line.startswith("chameleon: failed ")]
    assert [line.split(":")[1].strip() for line in consulted] == [f"failed {devices}" for devices in lost]
    assert all(line.endswith(("rejoined: scale-up", "rejoined: rejoin-slots")) for line in consulted), consulted
    assert f"done: step {STEPS}" in result.stdout
    for attempt, kill in enumerate(kills):              # only the killed worker left no marker
        ended = {r for r in range(workers) if any(tmp_path.glob(f"run-*/exit.{attempt}.{r}"))}
        assert ended == set(range(workers)) - {int(kill.split("@")[0])}
    state = torch.load(tmp_path / "checkpoint.pt")
    assert state["step"] == STEPS and state["run"] not in ("none", EARLIER_RUN)
    for name, expected in reference_weights().items():
        assert torch.allclose(state["model"][name], expected, rtol=1e-4, atol=1e-6), name
