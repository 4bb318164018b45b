"""One training process: a device of the plan, driven by the controller over a pipe.

The worker holds model state per layer (module + AdamW moments), runs the work its rank plan
(`comm.lowering.RankPlan`) gives it, and follows a small protocol (messages are dicts with a "cmd"):

- `generation`: form generation g's process group (gloo over a PrefixStore, so groups of
  earlier generations never collide), the all-reduce ring groups, then run the migration rounds
  of the transfer schedule; reply `ready` (with timings) or `failed`. Old state is kept until
  `go`, so an aborted transition (a failure during it) loses nothing: `discard` drops what arrived.
- `step k`: run the ordered forward/backward operations of global batch k (with a bubble-filled
  rerouting's action list the backward is split, `runtime/split_backward.py`: B computes only the
  input gradient, which the previous stage waits for, and W later the weight gradients), then the gradient
  all-reduce rings round by round (asynchronous within a round); reply `ready` with the per-sample
  losses of the pieces whose loss it computed. The optimizer steps only on `commit`, after every
  rank is ready: a step interrupted by a failure is redone whole, never half-applied (`abort`).
- Any communication error (a dead peer) makes the worker destroy its process groups at once, which
  closes its connections, so ranks waiting on *it* fail within milliseconds too: detection spreads
  along the pipeline instead of waiting for the group timeout.
- A daemon thread beats (`replies.start_heartbeat`) so that the controller finds a worker that
  hangs alive and kills it; the injected hang (`hang` with `die_after_ops`) is a SIGSTOP.
"""

from __future__ import annotations

import os
import signal
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.nn.functional  # noqa: F401  before any group: chameleon_opt/runtime/__init__.py says why

from chameleon_opt.comm.lowering import RankPlan, RankTransfer
from chameleon_opt.runtime.p2p import receive_piece, send_piece
from chameleon_opt.runtime.replies import start_heartbeat
from chameleon_opt.runtime.gpt import GPTConfig, batch_tokens, build_layer, sample_loss, state_elements
from chameleon_opt.runtime.schedule import work_items
from chameleon_opt.runtime.split_backward import split_backward

LEARNING_RATE = 3e-3
WEIGHT_DECAY = 0.01


@dataclass(frozen=True)
class WorkerSpec:
    device: int
    store_host: str
    store_port: int
    model: GPTConfig
    seed: int
    global_batch: int
    micro_batch_size: int
    dtype: str                 # "float32" | "float64"
    group_timeout_s: float
    initial_layers: tuple[int, int] | None  # generation 0 needs no migration: every layer is built here
    steps_done: int = 0        # a worker admitted later (a device back) joins after this many optimizer steps


class Worker:
    """State and protocol of one worker process."""

    def __init__(self, spec: WorkerSpec, conn: Connection, heartbeat_slots: Any = None) -> None:
        self.spec, self.conn = spec, conn
        self.heartbeat_slots = heartbeat_slots
        self.dtype = getattr(torch, spec.dtype)
        self.store = dist.TCPStore(spec.store_host, spec.store_port, None, False,
                                   timeout=timedelta(seconds=spec.group_timeout_s))
        self.layers: dict[int, torch.nn.Module] = {}
        self.moments: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}  # layer -> (exp_avg, exp_avg_sq)
        self.active: tuple[int, int] | None = None
        self.optimizer: torch.optim.AdamW | None = None
        self.steps_done = spec.steps_done
        if spec.initial_layers is not None:
            for layer in range(*spec.initial_layers):
                self.layers[layer] = build_layer(spec.model, layer, spec.seed, self.dtype)
            self._activate(spec.initial_layers)
        self.plan: RankPlan | None = None
        self.rank_of: dict[int, int] = {}
        self.ring_groups: dict[str, Any] = {}
        self.incoming: dict[int, torch.nn.Module] = {}
        self.incoming_moments: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.ops: list[tuple[str, int]] = []

    # ---- state ------------------------------------------------------------------------------
    def _activate(self, layers: tuple[int, int] | None) -> None:
        """Train layers [first, end) from now on: one AdamW over them, moments carried over."""
        if self.optimizer is not None:
            self._save_moments()
        self.active = layers
        if layers is None:
            self.optimizer = None
            return
        params = [p for layer in range(*layers) for p in self.layers[layer].parameters()]
        self.optimizer = torch.optim.AdamW(params, lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY, foreach=False)
        for layer in range(*layers):
            for p, (m, v) in zip(self.layers[layer].parameters(), self.moments.get(layer, [])):
                self.optimizer.state[p] = {"step": torch.tensor(float(self.steps_done)), "exp_avg": m, "exp_avg_sq": v}

    def _save_moments(self) -> None:
        assert self.optimizer is not None and self.active is not None
        for layer in range(*self.active):
            saved = []
            for p in self.layers[layer].parameters():
                st = self.optimizer.state.get(p)
                saved.append((st["exp_avg"], st["exp_avg_sq"]) if st else (torch.zeros_like(p), torch.zeros_like(p)))
            self.moments[layer] = saved

    def _flat_state(self, layer: int) -> torch.Tensor:
        """Parameters, then first moments, then second moments: what a migration moves."""
        if self.optimizer is not None:
            self._save_moments()
        params = list(self.layers[layer].parameters())
        moments = self.moments.get(layer) or [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]
        parts = [p.detach().reshape(-1) for p in params] + [m.reshape(-1) for m, _ in moments] + \
                [v.reshape(-1) for _, v in moments]
        return torch.cat(parts)

    def _unflatten(self, layer: int, flat: torch.Tensor) -> None:
        module = build_layer(self.spec.model, layer, self.spec.seed, self.dtype)
        params = list(module.parameters())
        sizes = [p.numel() for p in params]
        chunks = list(torch.split(flat, sizes * 3))
        with torch.no_grad():
            for p, c in zip(params, chunks):
                p.copy_(c.view_as(p))
        n = len(params)
        self.incoming[layer] = module
        self.incoming_moments[layer] = [(chunks[n + i].view_as(p).clone(), chunks[2 * n + i].view_as(p).clone())
                                        for i, p in enumerate(params)]

    # ---- protocol -----------------------------------------------------------------------------
    def serve(self) -> None:
        while True:
            msg = self.conn.recv()
            cmd = msg["cmd"]
            if cmd == "generation":
                self.conn.send(self._generation(msg))
            elif cmd == "go":
                self._go()
            elif cmd == "discard":
                self.incoming.clear()
                self.incoming_moments.clear()
                self._shutdown_groups()
            elif cmd == "step":
                self.conn.send(self._step(msg))
            elif cmd == "commit":
                assert self.optimizer is not None or self.active is None
                if self.optimizer is not None:
                    self.optimizer.step()
                    self.optimizer.zero_grad(set_to_none=True)
                self.steps_done += 1
            elif cmd == "abort":
                self._zero_grad()
                self._shutdown_groups()
            elif cmd == "dump":
                self.conn.send({"event": "state", "layers": self._dump()})
            elif cmd == "stop":
                self._shutdown_groups()
                return

    def _generation(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Form the groups of generation g and migrate state; old state is kept until `go`."""
        t0 = time.perf_counter()
        self.plan, self.ops = msg["plan"], [tuple(op) for op in msg["ops"]]
        assert self.plan is not None
        self.rank_of = {int(d): r for d, r in msg["rank_of"].items()}
        try:
            self._shutdown_groups()
            dist.init_process_group("gloo", store=dist.PrefixStore(f"gen{msg['generation']}/", self.store),
                                    rank=self.rank_of[self.spec.device], world_size=len(self.rank_of),
                                    timeout=timedelta(seconds=self.spec.group_timeout_s))
            for ring in sorted(self.plan.allreduce, key=lambda r: r.group):
                ranks = sorted(self.rank_of[d] for d in ring.ring)
                if len(ranks) > 1:
                    self.ring_groups[ring.group] = dist.new_group(ranks, use_local_synchronization=True)
            t1 = time.perf_counter()
            if msg.get("die_in_transition"):
                self._die()
            self._migrate(self.plan.transfers)
            t2 = time.perf_counter()
        except Exception as error:  # a peer died during the transition
            self._shutdown_groups()
            self.incoming.clear()
            self.incoming_moments.clear()
            return {"event": "failed", "device": self.spec.device, "error": _short(error)}
        return {"event": "ready", "device": self.spec.device, "group_s": t1 - t0, "migration_s": t2 - t1}

    def _migrate(self, transfers: tuple[RankTransfer, ...]) -> None:
        """Round by round: post every send and receive of the round, then wait for all of them.
        A transfer carries elements [lo, hi) of a layer's flat state (`StateShare.elements`: the
        schedule may split a layer over several sources)."""
        buffers: dict[int, torch.Tensor] = {}
        for t in transfers:
            if t.op == "recv" and t.share.layer not in buffers:
                buffers[t.share.layer] = torch.empty(state_elements(self.spec.model, t.share.layer), dtype=self.dtype)
        flats: dict[int, torch.Tensor] = {}
        for rnd in sorted({t.share.round for t in transfers}):
            works = []
            for t in (t for t in transfers if t.share.round == rnd):
                share, peer = t.share, self.rank_of[t.peer]
                lo, hi = share.elements(state_elements(self.spec.model, share.layer))
                if hi <= lo:
                    continue
                if t.op == "send":
                    flat = flats.get(share.layer)
                    if flat is None:
                        flat = flats[share.layer] = self._flat_state(share.layer)
                    works.append(dist.isend(flat[lo:hi].contiguous(), peer, tag=share.tag))
                else:
                    works.append(dist.irecv(buffers[share.layer][lo:hi], peer, tag=share.tag))
            for w in works:
                w.wait()
        for layer, flat in buffers.items():
            self._unflatten(layer, flat)

    def _go(self) -> None:
        """Commit the transition: adopt received layers, keep only the new stage's layers."""
        if self.heartbeat_slots is not None:  # from the job's start (or its admission) on
            start_heartbeat(self.heartbeat_slots, self.spec.device)
            self.heartbeat_slots = None
        if self.optimizer is not None:
            self._save_moments()
            self.optimizer = None
        self.layers.update(self.incoming)
        self.moments.update(self.incoming_moments)
        self.incoming.clear()
        self.incoming_moments.clear()
        assert self.plan is not None
        layers = self.plan.layers if self.plan.role == "train" else None
        keep = set(range(*layers)) if layers else set()
        self.layers = {k: v for k, v in self.layers.items() if k in keep}
        self.moments = {k: v for k, v in self.moments.items() if k in keep}
        missing = keep - set(self.layers)
        if missing:
            raise AssertionError(f"device {self.spec.device} lacks layers {sorted(missing)} after migration")
        self._activate(layers)

    def _step(self, msg: dict[str, Any]) -> dict[str, Any]:
        step = msg["step"]
        t0 = time.perf_counter()
        if self.plan is None or self.plan.role != "train":
            if msg.get("die_after_ops") is not None:  # an idle device has no operations to count
                self._die(msg.get("hang", False))
            return {"event": "ready", "device": self.spec.device, "step": step, "losses": {}, "compute_s": 0.0}
        try:
            losses, compute_s = self._run_operations(step, msg.get("die_after_ops"), msg.get("hang", False))
            self._allreduce()
        except Exception as error:
            self._shutdown_groups()
            self._zero_grad()
            return {"event": "aborted", "device": self.spec.device, "step": step, "error": _short(error)}
        return {"event": "ready", "device": self.spec.device, "step": step, "losses": losses,
                "compute_s": compute_s, "wall_s": time.perf_counter() - t0}

    def _die(self, hang: bool = False) -> None:
        """Failure injection: tell the controller when, then SIGKILL this process (no clean-up), or
        with `hang` SIGSTOP it: alive, silent, its connections open, until the watchdog kills it."""
        self.conn.send({"event": "dying", "device": self.spec.device, "t": time.time()})
        os.kill(os.getpid(), signal.SIGSTOP if hang else signal.SIGKILL)

    def _run_operations(self, step: int, die_after_ops: int | None, hang: bool = False
                        ) -> tuple[dict[int, float], float]:
        spec, plan = self.spec, self.plan
        assert plan is not None and plan.layers is not None
        first, end = plan.layers
        has_embedding, has_head = first == 0, end == spec.model.num_layers
        modules = [self.layers[layer] for layer in range(first, end)]
        items = work_items(plan, spec.micro_batch_size)
        tokens = batch_tokens(spec.model, spec.seed, step, spec.global_batch)
        saved: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}
        split = any(kind == "W" for kind, _ in self.ops)  # a bubble-filled schedule's B / W
        params = [p for module in modules for p in module.parameters()]
        deferred: dict[int, Callable[[], None]] = {}  # micro-batch -> its W
        sends, losses, compute_s = [], {}, 0.0
        shape = (spec.model.seq_len, spec.model.hidden)
        for count, (kind, i) in enumerate(self.ops):
            if count == die_after_ops:
                self._die(hang)
            item = items[i]
            assert item is not None
            if kind == "F":
                x = receive_piece(item.receive_from, shape, self.dtype, self.rank_of, backward=False) if not has_embedding else None
                c0 = time.perf_counter()
                if x is None:
                    out = tokens[item.start:item.stop, :-1]
                else:
                    x.requires_grad_(True)
                    out = x
                for module in modules:
                    out = module(out)
                if has_head:
                    per_sample = sample_loss(out, tokens[item.start:item.stop, 1:])
                    out = per_sample.sum() / spec.global_batch
                    losses.update({item.start + k: v for k, v in enumerate(per_sample.detach().tolist())})
                compute_s += time.perf_counter() - c0
                saved[i] = (x, out)
                if not has_head:
                    sends += send_piece(item.send_to, item, out.detach(), self.rank_of, backward=False)
            elif kind == "B":
                x, out = saved.pop(i)  # a split's W keeps what it needs of the graph
                grad = None if has_head else receive_piece(item.send_to, shape, self.dtype, self.rank_of, backward=True)
                c0 = time.perf_counter()
                if split:
                    x_grad, deferred[i] = split_backward(out, x, grad, params)
                else:
                    out.backward(grad)
                    x_grad = x.grad if x is not None else None
                compute_s += time.perf_counter() - c0
                if x_grad is not None:
                    sends += send_piece(item.receive_from, item, x_grad, self.rank_of, backward=True)
            else:  # W: the weight gradients B left for later
                c0 = time.perf_counter()
                deferred.pop(i)()
                compute_s += time.perf_counter() - c0
        for w in sends:
            w.wait()
        return losses, compute_s

    def _allreduce(self) -> None:
        """Gradient rings round by round; the rings of one round run concurrently."""
        assert self.plan is not None
        rings = [r for r in self.plan.allreduce if r.group in self.ring_groups]
        for rnd in sorted({r.round for r in rings}):
            launched = []
            for ring in (r for r in rings if r.round == rnd):
                grads = [p.grad if p.grad is not None else torch.zeros_like(p)
                         for layer in ring.layers for p in self.layers[layer].parameters()]
                flat = torch.cat([g.reshape(-1) for g in grads])
                launched.append((dist.all_reduce(flat, group=self.ring_groups[ring.group], async_op=True),
                                 ring, flat))
            for work, ring, flat in launched:
                work.wait()
                offset = 0
                for layer in ring.layers:
                    for p in self.layers[layer].parameters():
                        n = p.numel()
                        p.grad = flat[offset:offset + n].view_as(p).clone()
                        offset += n

    def _zero_grad(self) -> None:
        for module in self.layers.values():
            module.zero_grad(set_to_none=True)

    def _shutdown_groups(self) -> None:
        self.ring_groups.clear()
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # already broken by a dead peer: nothing left to close
                pass

    def _dump(self) -> dict[int, dict[str, list[float]]]:
        return {layer: {name: p.detach().to(torch.float64).reshape(-1).tolist()
                        for name, p in module.named_parameters()} for layer, module in self.layers.items()}


def _short(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"


def worker_main(spec: WorkerSpec, conn: Connection, heartbeat_slots: Any = None) -> None:
    """Process entry point: one compute thread (workers share the machine's cores), and from its
    first generation on a heartbeat into `heartbeat_slots[device]` when given."""
    torch.set_num_threads(1)
    try:
        Worker(spec, conn, heartbeat_slots).serve()
    except (EOFError, KeyboardInterrupt):  # the controller went away
        pass
    except Exception:
        conn.send({"event": "crashed", "device": spec.device, "error": traceback.format_exc(limit=3)})
        raise
