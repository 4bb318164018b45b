"""A plain PyTorch data-parallel training loop with the chameleon planner plugged in.

Without the lines marked `# chameleon` this is an ordinary DDP job on the gloo backend: every
worker trains on its slice of each global batch, rank 0 checkpoints every few steps, and a
restarted job resumes from the last checkpoint. Launch it with torchrun, whose elastic agent
restarts the worker group when a worker dies (up to --max-restarts times):

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --nproc-per-node 3 --max-restarts 2 \
        examples/torchrun_train.py --workdir /tmp/run --steps 12 --kill 1@5

(The variable gives each restart a fresh store: with the store torchrun shares across restarts,
a restarted gloo group can read its peers' addresses from the previous attempt and fail to
connect, pytorch/pytorch#135712.)

The marked lines add recovery planning. Each worker stands for one device of the instance
`mlp-dp.json` next to this file (one data-parallel pipeline per worker). Failure detection: a
worker that ends in any orderly way (finished, an error such as a collective broken by a peer's
death, or the agent's SIGTERM when it stops the group) leaves a marker `exit.<attempt>.<rank>` in
the run's own folder `run-<TORCHELASTIC_RUN_ID>` of the work directory (so an earlier run's markers
never count); a worker killed outright (SIGKILL, the OOM killer, a lost machine) cannot. So after a
restart (TORCHELASTIC_RESTART_COUNT > 0) the devices that trained in an attempt and left no marker
are the ones lost in it. torchrun restarted them, healthy, so rank 0 replays each attempt's losses
through `Planner.on_failure` and their return through `Planner.on_join` (a restarted worker is a
device back in service, not a permanent loss), and broadcasts the last decision; every worker then
trains on exactly the samples of its rank plan's micro-batch pieces (micro-batch k holds samples
[k * mbs, (k + 1) * mbs)), so the global batch, and the maths of each step, stay the same.

What it does not do: every worker loses its memory in the restart and resumes from the checkpoint,
so the decisions' state `migration` is not executed here (the checkpoint delivers the state), and
`on_failure`'s decision is only printed: under torchrun --standalone the world never shrinks, the
restart brings every device back. A worker stuck for the agent's 30 s grace period is
killed outright and so counts as failed. In a multi-node job (`--nnodes MIN:MAX --rdzv-backend
c10d --rdzv-endpoint HOST:PORT`) the agents would re-form a smaller world instead; ranks are then
renumbered, so a worker's device would have to come from a stable identity (host and LOCAL_RANK),
which this example does not do, and the work directory would have to be shared by all nodes.

`--kill RANK@STEP` is fault injection, not part of the integration: that rank SIGKILLs itself
before that step; the i-th --kill fires in the i-th attempt. A run starts clean (and says so)
even where the work directory holds an earlier run's checkpoint; `--resume` continues that one.
"""

from __future__ import annotations

import argparse
import atexit  # chameleon
import gc
import json  # chameleon
import os
import signal
import sys  # chameleon
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.nn.functional  # noqa: F401  before any group: chameleon_opt/runtime/__init__.py says why
from torch import nn
from torch.nn.parallel import DistributedDataParallel

GLOBAL_BATCH = 48
FEATURES = 16


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's samples, the same on every rank: a fixed synthetic regression task."""
    generator = torch.Generator().manual_seed(step)
    x = torch.randn(GLOBAL_BATCH, FEATURES, generator=generator)
    return x, torch.sin(x.sum(dim=1, keepdim=True))


def main() -> None:
    parser = argparse.ArgumentParser(description="plain DDP training of a small MLP on synthetic data")
    parser.add_argument("--workdir", type=Path, required=True, help="checkpoint directory (shared by all nodes)")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--checkpoint-every", type=int, default=4)
    parser.add_argument("--resume", action="store_true",
                        help="continue from the checkpoint in --workdir (without it a run starts clean)")
    parser.add_argument("--kill", action="append", default=[], metavar="RANK@STEP",
                        help="fault injection: that rank SIGKILLs itself before that step (i-th flag: i-th attempt)")
    args = parser.parse_args()
    kills = [tuple(int(part) for part in kill.split("@")) for kill in args.kill]
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")  # one per torchrun invocation, kept across restarts
    args.workdir.mkdir(parents=True, exist_ok=True)
    markers = args.workdir / f"run-{run_id}"  # chameleon: this run's markers; an earlier run's can never count
    markers.mkdir(exist_ok=True)  # chameleon
    marker = markers / f"exit.{attempt}.{os.environ['RANK']}"  # chameleon: a killed worker leaves none
    atexit.register(marker.touch)  # chameleon: done, or an error (a peer's death breaks the collectives)
    signal.signal(signal.SIGTERM, lambda *_: (marker.touch(), sys.exit(143)))  # chameleon: the agent's stop
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model = make_model()
    optimizer = make_optimizer(model)
    checkpoint = args.workdir / "checkpoint.pt"
    step = 0
    state = torch.load(checkpoint) if checkpoint.exists() else None
    # A restart continues this run's own checkpoint; an earlier run's only with --resume
    if state is not None and (state["run"] == run_id or args.resume):
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
    if rank == 0 and attempt == 0:
        print(f"resuming from step {step} of {args.workdir}" if step else
              f"starting clean in {args.workdir}" + (" (its earlier checkpoint is ignored: --resume continues it)"
                                                     if state is not None else ""), flush=True)
    share = GLOBAL_BATCH // world
    samples = list(range(rank * share, (rank + 1) * share))
    events: list[set[int]] = []  # chameleon: per earlier attempt, the devices that trained and left no marker
    for past in range(attempt):  # chameleon
        ended = {r for r in range(world) if (markers / f"exit.{past}.{r}").exists()}  # chameleon
        events.append(set(range(world)) - ended)  # chameleon
    if any(events):  # chameleon
        spec = json.loads(Path(__file__).with_name("mlp-dp.json").read_text())  # chameleon
        spec["cluster"]["devices_per_node"] = spec["plan"]["layout"]["data_parallel"] = world  # chameleon
        if rank == 0:  # chameleon
            from chameleon_opt.api import Planner  # chameleon: here, not at the top: the other ranks never plan
            planner = Planner(spec, time_limit_s=2.0)  # chameleon
            for event in filter(None, events):  # chameleon: lost in an attempt, restarted by torchrun for the next
                lost = planner.on_failure(event)  # chameleon: planned around,
                decision = planner.on_join(event)  # chameleon: then back, with no state until it loads the checkpoint
                print(f"chameleon: failed {sorted(event)}: {lost.policy}; rejoined: {decision.policy}",  # chameleon
                      flush=True)  # chameleon
            assert all(len(pipe.stages) == 1 for pipe in decision.plan.pipelines), "data parallel only"  # chameleon
        box = [decision if rank == 0 else None]  # chameleon
        dist.broadcast_object_list(box, src=0)  # chameleon
        mbs = spec["training"]["micro_batch_size"]  # chameleon: micro-batch k holds samples [k * mbs, (k + 1) * mbs)
        samples = [i for m in box[0].for_rank(rank).micro_batches  # chameleon: none for a failed device
                   for i in range(round((m.id + m.lo) * mbs), round((m.id + m.hi) * mbs))]  # chameleon

    ddp = DistributedDataParallel(model)
    scale = world / GLOBAL_BATCH  # DDP averages over the workers: the loss is the global batch's mean
    while step < args.steps:
        if attempt < len(kills) and kills[attempt] == (rank, step):
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = global_batch(step)
        loss = ((ddp(x[samples]) - y[samples]) ** 2).sum() * scale
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if rank == 0 and (step % args.checkpoint_every == 0 or step == args.steps):
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                        "run": run_id}, checkpoint.with_suffix(".tmp"))
            checkpoint.with_suffix(".tmp").replace(checkpoint)
    if rank == 0:
        print(f"done: step {step}", flush=True)


if __name__ == "__main__":
    main()
    # DDP's reducer sits in a reference cycle: collect it so that destroying the group stops gloo's
    # threads now, not during interpreter shutdown (where one can abort the process, torch 2.13).
    gc.collect()
    dist.destroy_process_group()
