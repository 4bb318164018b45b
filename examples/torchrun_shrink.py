"""A data-parallel loop whose world shrinks for real when a node is lost, and continues from the
survivors' own state (no checkpoint), with the chameleon planner deciding the survivors' plan.

Launch one torchrun agent per node against a rendezvous store that runs in its own process (so
losing any node, the first included, does not take the store with it), with a node range:

    python -c "import time, torch.distributed as d; s = d.TCPStore('127.0.0.1', 29611, is_master=True, \\
        wait_for_workers=False); time.sleep(3600)" &
    for node in 0 1 2; do
      TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes 2:3 --nproc-per-node 1 --max-restarts 1 \\
          --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29611 --rdzv-id job1 \\
          --rdzv-conf is_host=false,last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=2 \\
          --monitor-interval 0.5 examples/torchrun_shrink.py --workdir /tmp/run --device $node --steps 8 --kill 1@4 &
    done

The keep-alive settings decide how soon the rendezvous drops a lost node: c10d's defaults (a
heartbeat every 5 s, 3 missed) keep the survivors waiting 15 s for it before they re-form; here 2 s.

`--kill NODE@STEP` loses that node before that step: its worker SIGKILLs its agent and itself.
The survivors' collective fails; each hands its model and optimizer state to its restarted self
through node-local memory (`/dev/shm`, not a checkpoint: nothing is written by a step that
succeeded), the agents re-form a world of 2 and restart the workers, rank 0 asks the planner for
the survivors' plan (`Planner.on_failure`, devices are nodes), every survivor executes the planned
migration (whole replicas here: the plan moves nothing) and trains on its rank plan's samples of the
same global batch, so the loss stays that of failure-free training. Ranks are renumbered by the
rendezvous; a worker's device is its stable `--device` (a node id). Losses go to `loss.<device>`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.nn.functional  # noqa: F401  before any group: chameleon_opt/runtime/__init__.py says why

GLOBAL_BATCH = 48
FEATURES = 16
NODES = 3


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                               torch.nn.Tanh(), torch.nn.Linear(64, 1))


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step)
    x = torch.randn(GLOBAL_BATCH, FEATURES, generator=generator)
    return x, torch.sin(x.sum(dim=1, keepdim=True))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", type=Path, required=True, help="where losses are logged (one file per node)")
    parser.add_argument("--device", type=int, required=True, help="this node's stable id (its device)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--kill", default=None, metavar="DEVICE@STEP", help="fault injection: lose that node")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    handoff = Path("/dev/shm") / f"chameleon-{os.environ['TORCHELASTIC_RUN_ID']}-{args.device}.pt"
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step, failed = 0, []
    if int(os.environ["TORCHELASTIC_RESTART_COUNT"]) == 0:
        handoff.unlink(missing_ok=True)  # never another run's: a rendezvous id can be reused
    elif handoff.exists():  # a survivor's restart: its own state, from its own memory
        saved = torch.load(handoff)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        step, failed = saved["step"], saved["failed"]
        handoff.unlink()
    nodes = [None] * world
    dist.all_gather_object(nodes, (args.device, step))
    alive = sorted(node for node, _ in nodes)
    failed = sorted(set(failed) | (set(range(NODES)) - set(alive)))
    spec = json.loads(Path(__file__).with_name("mlp-dp.json").read_text())
    spec["cluster"]["devices_per_node"] = spec["plan"]["layout"]["data_parallel"] = NODES
    samples = list(range(GLOBAL_BATCH))[alive.index(args.device)::world]
    if failed:
        from chameleon_opt.api import Planner  # here, not at the top: a worker before any loss never plans

        decision = Planner(spec, policy="reconfigure", time_limit_s=2.0).on_failure(failed)
        moves = [t for t in (decision.migration.transfers if decision.migration else ())]
        assert all(t.src in alive and t.dst in alive for t in moves)  # survivors only
        for t in moves:  # the planned migration: whole replicas, so a transfer is a full state copy
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            if t.src == args.device:
                dist.send(flat, alive.index(t.dst))
            elif t.dst == args.device:
                dist.recv(flat, alive.index(t.src))
        mbs = spec["training"]["micro_batch_size"]
        samples = [i for m in decision.for_rank(args.device).micro_batches
                   for i in range(round((m.id + m.lo) * mbs), round((m.id + m.hi) * mbs))]
        if rank == 0:
            print(f"world {world}: nodes {alive} after losing {failed}; {decision.policy}, migration "
                  f"{len(moves)} transfers", flush=True)
    steps_seen = {s for _, s in nodes}
    assert len(steps_seen) == 1, f"survivors disagree on the step: {nodes}"
    kill = tuple(int(v) for v in args.kill.split("@")) if args.kill else None
    log = open(args.workdir / f"loss.{args.device}", "a")
    while step < args.steps:
        if kill == (args.device, step) and not failed:
            os.kill(os.getppid(), signal.SIGKILL)  # the node is lost: agent and worker
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = global_batch(step)
        loss = ((model(x[samples]) - y[samples]) ** 2).sum() / GLOBAL_BATCH
        optimizer.zero_grad()
        loss.backward()
        try:
            for p in model.parameters():
                dist.all_reduce(p.grad)
            total = loss.detach().clone()
            dist.all_reduce(total)
        except Exception:  # a peer is gone: hand the state of the last completed step to our restart
            optimizer.zero_grad()
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                        "failed": failed}, handoff)
            raise
        optimizer.step()
        print(f"{step} {total.item():.12e}", file=log, flush=True)
        step += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
