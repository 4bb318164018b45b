"""Data-parallel replica groups under torchft, with the chameleon planner deciding at each quorum
change whether the survivors take over the lost replica's micro-batches (the global batch is kept,
so training follows the failure-free run exactly) or the job shrinks (each survivor keeps its own
share and the global batch loses the lost replica's samples, which is torchft's own behaviour).

One lighthouse (its own process, bound to 127.0.0.1) and one process per replica group:

    python examples/torchft_redistribute.py lighthouse --replicas 3 > /tmp/lh   # prints its address
    for r in 0 1 2; do
      python examples/torchft_redistribute.py replica --lighthouse $(head -1 /tmp/lh) --replica $r \\
          --workdir /tmp/run --steps 8 --kill 1@4 &
    done

`--kill REPLICA@STEP` SIGKILLs that replica after its backward pass of that step, before the
gradient all-reduce (a mid-step loss). The survivors' all-reduce fails, `should_commit` says no, the
step is redone, and the next quorum (the lighthouse drops the dead replica after its heartbeat
timeout) holds the survivors only. Each step starts with an all-reduce of a one-hot membership
vector, so every survivor learns *which* replicas are left; when that set shrinks, each asks the
planner (`Planner.on_failure`, devices are replica groups, the job is `mlp-dp.json`) for the
survivors' plan. Redistribution is chosen when the planner has a plan that keeps the global batch
and its predicted step is at most `--max-slowdown` times the failure-free step; otherwise the job
shrinks. The gradient all-reduce carries a per-sample count, so each committed step proves that
every sample of its batch was trained exactly once.

Gradients are all-reduced with `Manager.allreduce` (SUM over per-sample losses divided by the global
batch), not with torchft 0.2.0's DDP wrapper, which crashes a survivor when a peer dies mid-step.
Each replica writes `log.<replica>`: one JSON line per committed step (step, loss, its samples,
members, mode) and one per decision.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from chameleon_opt.errors import InfeasibleError, NoSolutionError, UnrecoverableError

if TYPE_CHECKING:  # the lighthouse never plans: only a replica imports the planner (0.9 s of CPU)
    from chameleon_opt.api import Planner

GLOBAL_BATCH = 48
MICRO_BATCH = 2
FEATURES = 16
HEARTBEAT_TIMEOUT_MS = 400   # the lighthouse drops a replica this long after its last heartbeat
JOIN_TIMEOUT_MS = 10_000     # at the start, wait this long for every replica before a smaller quorum


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                               torch.nn.Tanh(), torch.nn.Linear(64, 1))


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step)
    x = torch.randn(GLOBAL_BATCH, FEATURES, generator=generator)
    return x, torch.sin(x.sum(dim=1, keepdim=True))


def job_spec(replicas: int) -> dict:
    """The planner's view of the job: one device per replica group, whole-model replicas."""
    spec = json.loads(Path(__file__).with_name("mlp-dp.json").read_text())
    spec["cluster"]["devices_per_node"] = spec["plan"]["layout"]["data_parallel"] = replicas
    spec["training"]["global_batch"], spec["training"]["micro_batch_size"] = GLOBAL_BATCH, MICRO_BATCH
    return spec


def failure_free_samples(replicas: int) -> dict[int, list[int]]:
    """Each replica's contiguous block of micro-batches, as the planner's failure-free plan deals them."""
    per = GLOBAL_BATCH // replicas
    return {r: list(range(r * per, (r + 1) * per)) for r in range(replicas)}


@dataclass(frozen=True)
class Assignment:
    """Who trains which samples of every step's global batch, and why."""

    mode: str                      # "failure-free", "redistribute" or "shrink"
    samples: dict[int, list[int]]  # replica -> sample indices of the global batch
    reason: str

    @property
    def batch(self) -> int:
        return sum(len(s) for s in self.samples.values())


def decide(planner: Planner, replicas: int, lost: list[int], max_slowdown: float) -> Assignment:
    """At a quorum change: redistribute the lost replicas' micro-batches as the planner's plan for
    the survivors deals them, unless the planner finds no plan keeping the global batch or its
    predicted step exceeds `max_slowdown` x the step before the loss; then shrink (survivors keep
    their own samples). Deterministic, so every survivor reaches the same answer on its own."""
    before = planner.estimate().iteration_time_s
    survivors = [r for r in range(replicas) if r not in planner.failed and r not in lost]
    shrunk = {r: failure_free_samples(replicas)[r] for r in survivors}
    try:
        decision = planner.on_failure(lost)
    except (InfeasibleError, NoSolutionError, UnrecoverableError) as error:
        return Assignment("shrink", shrunk, f"no plan keeps the global batch: {error}")
    slowdown = decision.iteration_time_s / before
    if slowdown > max_slowdown:
        return Assignment("shrink", shrunk, f"the planner's {decision.policy} keeps the batch at {slowdown:.2f}x "
                                            f"the step, over the {max_slowdown:.2f}x allowed")
    samples = {r: [i for m in decision.for_rank(r).micro_batches
                   for i in range(round((m.id + m.lo) * MICRO_BATCH), round((m.id + m.hi) * MICRO_BATCH))]
               for r in survivors}
    return Assignment("redistribute", samples, f"the planner's {decision.policy} keeps the batch at "
                                               f"{slowdown:.2f}x the step ({decision.reason})")


def serve_lighthouse(replicas: int) -> None:
    """Run the lighthouse on 127.0.0.1 with a short heartbeat timeout; print its address."""
    from torchft.coordination import LighthouseServer

    server = LighthouseServer(bind="127.0.0.1:0", min_replicas=max(1, replicas - 1),
                              join_timeout_ms=JOIN_TIMEOUT_MS, heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS)
    port = server.address().rsplit(":", 1)[1]  # it advertises the host name; replicas use the loopback
    print(f"http://127.0.0.1:{port}", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    server.shutdown()


def run_replica(args: argparse.Namespace) -> None:
    """Train `args.steps` steps as replica group `args.replica` (a group of one process)."""
    import torch.distributed as dist
    from torchft import Manager, ProcessGroupGloo
    from torchft.process_group import ReduceOp

    from chameleon_opt.api import Planner

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # this group's own store
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    params = list(model.parameters())
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=args.timeout_s)), min_replica_size=1,
        load_state_dict=lambda state: (model.load_state_dict(state["model"]), optimizer.load_state_dict(state["optim"])),
        state_dict=lambda: {"model": model.state_dict(), "optim": optimizer.state_dict()},
        use_async_quorum=False, init_sync=False,  # identical seeded initialisation on every replica
        timeout=timedelta(seconds=args.timeout_s), quorum_timeout=timedelta(seconds=args.timeout_s),
        connect_timeout=timedelta(seconds=args.timeout_s), rank=0, world_size=1,
        store_addr="127.0.0.1", store_port=store.port, lighthouse_addr=args.lighthouse,
        replica_id=f"replica_{args.replica}", hostname="127.0.0.1", heartbeat_interval=timedelta(milliseconds=50))
    ready = args.workdir / f"ready.{args.replica}"  # start together: a late joiner would look like a loss
    ready.touch()
    deadline = time.monotonic() + args.timeout_s
    while not all((args.workdir / f"ready.{r}").exists() for r in range(args.replicas)):
        if time.monotonic() > deadline:
            raise TimeoutError("not every replica started")
        time.sleep(0.05)
    planner = Planner(job_spec(args.replicas), time_limit_s=2.0)
    assignment = Assignment("failure-free", failure_free_samples(args.replicas), "every replica alive")
    members = list(range(args.replicas))
    kill = tuple(int(v) for v in args.kill.split("@")) if args.kill else None
    log = open(args.workdir / f"log.{args.replica}", "a")
    try:
        while manager.current_step() < args.steps:
            step = manager.current_step()
            began = time.perf_counter()
            manager.start_quorum()
            membership = torch.zeros(args.replicas)
            membership[args.replica] = 1.0
            manager.allreduce(membership, reduce_op=ReduceOp.SUM).wait()
            if manager.errored() is None:
                alive = [r for r in range(args.replicas) if membership[r].item() > 0.5]
                lost = [r for r in members if r not in alive]
                if lost:
                    decided = time.perf_counter()
                    assignment = decide(planner, args.replicas, lost, args.max_slowdown)
                    members = alive
                    print(json.dumps({"decision": assignment.mode, "lost": lost, "members": alive, "step": step,
                                      "plan_s": round(time.perf_counter() - decided, 3),
                                      "reason": assignment.reason}), file=log, flush=True)
                mine = assignment.samples[args.replica]
                x, y = global_batch(step)
                loss = ((model(x[mine]) - y[mine]) ** 2).sum() / assignment.batch
                optimizer.zero_grad()
                loss.backward()
                if kill == (args.replica, step):
                    os.kill(os.getpid(), signal.SIGKILL)  # lost mid-step: after backward, before the all-reduce
                counts = torch.zeros(GLOBAL_BATCH)
                counts[mine] = 1.0
                flat = torch.cat([p.grad.reshape(-1) for p in params] + [loss.detach().reshape(1), counts])
                manager.allreduce(flat, reduce_op=ReduceOp.SUM).wait()
            if not manager.should_commit():
                optimizer.zero_grad()
                continue  # the step is redone under the next quorum
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
            seen = flat[offset + 1:]
            want = torch.zeros(GLOBAL_BATCH)
            for share in assignment.samples.values():
                want[share] = 1.0
            if not torch.equal(seen, want):
                raise RuntimeError(f"step {step}: samples trained {seen.tolist()}, expected {want.tolist()}")
            optimizer.step()
            print(json.dumps({"step": step, "loss": flat[offset].item(), "samples": mine, "members": members,
                              "mode": assignment.mode, "step_s": round(time.perf_counter() - began, 3)}),
                  file=log, flush=True)
    finally:
        manager.shutdown(wait=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    lighthouse = sub.add_parser("lighthouse", help="run the lighthouse (prints its address)")
    lighthouse.add_argument("--replicas", type=int, default=3)
    replica = sub.add_parser("replica", help="run one replica group")
    replica.add_argument("--lighthouse", required=True, help="the lighthouse's address")
    replica.add_argument("--replica", type=int, required=True)
    replica.add_argument("--replicas", type=int, default=3)
    replica.add_argument("--workdir", type=Path, required=True)
    replica.add_argument("--steps", type=int, default=8)
    replica.add_argument("--kill", default=None, metavar="REPLICA@STEP")
    replica.add_argument("--max-slowdown", type=float, default=2.0,
                         help="keep the global batch only while the planner's step is at most this x the step before")
    replica.add_argument("--timeout-s", type=float, default=20.0, help="torchft's collective and quorum timeout")
    args = parser.parse_args()
    if args.command == "lighthouse":
        serve_lighthouse(args.replicas)
    else:
        if GLOBAL_BATCH % (args.replicas * MICRO_BATCH):
            sys.exit(f"{args.replicas} replicas do not divide {GLOBAL_BATCH // MICRO_BATCH} micro-batches")
        run_replica(args)


if __name__ == "__main__":
    main()
