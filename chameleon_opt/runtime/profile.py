"""Profiler of the runtime's GPT on the machine it runs on: per-layer times and bytes, and the link.

Why: the performance model predicts a plan's step time from a workload profile and an alpha-beta
network. For the CPU runtime (one torch thread per process, gloo between processes) no published
profile applies, so this module measures one: forward, backward and AdamW-update seconds of every
layer with one thread, the activation bytes each layer keeps for its backward (the tensors autograd
saves), the bytes a stage boundary sends, and the latency and bandwidth of gloo send/recv between
two local processes. `write_profile` stores the layers as a `models/` workload file and
`runtime_instance` builds the instance whose predicted step time the runtime can be held against.

Each layer is timed alone, so a stage of several layers pays autograd's per-call overhead once per
layer here but once per stage in the runtime (tens of microseconds); the head's backward includes
the loss (cross-entropy forward and backward). Run `python -m chameleon_opt.runtime.profile -h`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.nn.functional  # noqa: F401  before any group: chameleon_opt/runtime/__init__.py says why
import torch.multiprocessing as mp
from pydantic import ValidationError

from chameleon_opt.errors import ChameleonError, InputError
from chameleon_opt.instance.load import (build_instance, load_workload_file, resolve_workload_path)
from chameleon_opt.perf.model import ADAM_BYTES_TOUCHED_PER_PARAM
from chameleon_opt.runtime.gpt import GPTConfig, batch_tokens, build_layer, sample_loss
from chameleon_opt.runtime.p2p import allreduce_flat
from chameleon_opt.workload.importers import write_workload
from chameleon_opt.workload.model import Workload
from chameleon_opt.workload.schema import Architecture, LayerBytes, Profile, WorkloadSpec

DEVICE_TYPE = "cpu-core"
"""Device type name of the profile: one CPU core running one torch thread."""

PROCESS_RESERVED_GIB = 0.5
"""Memory each runtime process holds outside the model (the Python interpreter and torch)."""

NETWORK_SIZES = (64, 1 << 10, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22)
"""Message sizes (bytes) of the network fit: from latency-bound to bandwidth-bound."""

NETWORK_WARMUP = 3
"""Untimed round trips per message size (connection set-up, first allocation)."""

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class LayerProfile:
    """What `profile_layers` measured; tuples have one entry per layer (embedding, blocks, head)."""

    forward_s: dict[int, tuple[float, ...]]   # by micro-batch size
    backward_s: dict[int, tuple[float, ...]]  # by micro-batch size; the head's includes the loss
    update_s: tuple[float, ...]               # AdamW step over the layer's parameters alone
    params: tuple[int, ...]
    activation_bytes_per_sample: tuple[int, ...]
    boundary_bytes_per_sample: tuple[int, ...]
    dtype: torch.dtype
    repeats: int
    warmup: int

    @property
    def update_whole_model_s(self) -> float:
        """The profile format's update column is the whole model's step (scaled by share later)."""
        return float(sum(self.update_s))


@dataclass(frozen=True)
class NetworkFit:
    """Latency + bytes / bandwidth fitted to one-way gloo send/recv times between two processes."""

    latency_s: float
    bandwidth_bytes_per_s: float
    sizes: tuple[int, ...]
    one_way_s: tuple[float, ...]  # median one-way time per size (half a ping-pong round trip)
    # per size, the CPU the process's other threads (gloo's) spend per message sent or received,
    # beyond the calling thread's: on a worker's one core it is taken from the stage's compute
    helper_cpu_s: tuple[float, ...] = ()

    def helper_cpu_at(self, nbytes: float) -> float:
        """`helper_cpu_s` at a message size, interpolated on log sizes (0 when not measured)."""
        if not self.helper_cpu_s:
            return 0.0
        return float(np.interp(np.log(max(nbytes, 1.0)), np.log(self.sizes), self.helper_cpu_s))

    def network(self) -> dict[str, float]:
        """The instance's `cluster.network`: one node, so both links are the loopback's."""
        gbps, latency_us = self.bandwidth_bytes_per_s / 1e9, self.latency_s * 1e6
        return {"intra_node_gbps": gbps, "intra_node_latency_us": latency_us,
                "inter_node_gbps": gbps, "inter_node_latency_us": latency_us}


# -- layers -------------------------------------------------------------------------------------


def _median_s(samples: list[float]) -> float:
    return float(statistics.median(samples))


class _SavedStorages:
    """saved_tensors_hooks that add up the distinct storages autograd keeps for backward,
    parameters excluded (they are static memory, not activations)."""

    def __init__(self, params: set[int]) -> None:
        self.params = params
        self.storages: dict[int, int] = {}

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self.params:
            self.storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    @staticmethod
    def unpack(tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    @property
    def nbytes(self) -> int:
        return sum(self.storages.values())


def profile_layers(cfg: GPTConfig, micro_batch_sizes: Sequence[int] = (1, 2, 4), repeats: int = 20,
                   dtype: torch.dtype = torch.float32, warmup: int = 3, seed: int = 0) -> LayerProfile:
    """Profile the runtime's GPT (`runtime.gpt`), one module per workload layer."""
    layers = [build_layer(cfg, index, seed, dtype) for index in range(cfg.num_layers)]

    def tokens(mbs: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = batch_tokens(cfg, seed, 0, mbs)
        return rows[:, :-1], rows[:, 1:]

    return profile_modules(layers, tokens, sample_loss, micro_batch_sizes, repeats, dtype, warmup)


def profile_hf_layers(hf_config: str | Path, seq_len: int, micro_batch_sizes: Sequence[int] = (1, 2),
                      repeats: int = 20, dtype: torch.dtype = torch.float32, warmup: int = 3,
                      seed: int = 0) -> LayerProfile:
    """Profile a Hugging Face model as the HF runtime cuts it (`runtime.hf.Stage` of one workload
    layer each: embeddings, every decoder block, final norm + head), on `seq_len` tokens.

    A Llama block alone also computes the rotary tables, which a stage of several blocks computes
    once: a few microseconds per block that the profile charges every layer."""
    from chameleon_opt.runtime import hf

    config = hf.load_config(hf_config)
    model = hf.build_model(config, seed, dtype, 1)
    count = hf.num_blocks(config) + 2
    layers = [hf.Stage(model, config, index, index + 1) for index in range(count)]

    def tokens(mbs: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = hf.batch_tokens(config.vocab_size, seq_len, seed, 0, mbs)
        return rows[:, :-1], rows[:, 1:]

    return profile_modules(layers, tokens, hf.sample_losses, micro_batch_sizes, repeats, dtype, warmup)


def stage_compute_ratio(hf_config: str | Path, seq_len: int, ranges: Sequence[tuple[int, int]],
                        micro_batch_size: int = 1, rounds: int = 5, micro_batches: int = 4,
                        dtype: torch.dtype = torch.float32, seed: int = 0) -> dict[tuple[int, int], float]:
    """Per layer range [first, end) of the HF runtime's workload layers: the thread CPU of a
    micro-batch's forward and backward through the range as one `hf.Stage` (micro-batch after
    micro-batch, as a stage runs them) over the sum of its layers' times each timed alone and
    repeated (as `profile_hf_layers` times them); the median over `rounds` interleaved rounds.

    Why: the model adds up the per-layer profile. A layer repeated alone keeps its weights and
    gradients in cache; in a stage the other layers' evict them between its uses once the stage's
    working set outgrows the core's cache share. The ratio measures that on the machine: 0.94 for
    the whole Llama bench model on this project's 2-core machine (32 MB of L3 for 2 cores)."""
    from chameleon_opt.runtime import hf

    config = hf.load_config(hf_config)
    model = hf.build_model(config, seed, dtype, 1)
    head = hf.num_blocks(config) + 1
    rows = hf.batch_tokens(config.vocab_size, seq_len, seed, 0, micro_batch_size)
    ids, targets = rows[:, :-1], rows[:, 1:]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)

    def run(stage: Any, x: torch.Tensor) -> float:
        if stage.first > 0:
            x = x.detach().requires_grad_()
        start = time.thread_time()
        out = stage(x)
        if stage.has_head:
            hf.sample_losses(out, targets).sum().backward()
        else:
            out.backward(torch.ones_like(out))
        return time.thread_time() - start

    try:
        with torch.no_grad():
            inputs = [ids]
            for layer in range(head):
                inputs.append(hf.Stage(model, config, layer, layer + 1)(inputs[-1]))
        ratios: dict[tuple[int, int], list[float]] = {r: [] for r in ranges}
        for _ in range(rounds):
            for first, end in ranges:
                alone = 0.0
                for layer in range(first, end):
                    single = hf.Stage(model, config, layer, layer + 1)
                    alone += _median_s([run(single, inputs[layer]) for _ in range(2 + 5)][2:])
                stage = hf.Stage(model, config, first, end)
                run(stage, inputs[first])   # warm-up
                together = sum(run(stage, inputs[first]) for _ in range(micro_batches)) / micro_batches
                ratios[(first, end)].append(together / alone)
                model.zero_grad(set_to_none=True)
    finally:
        torch.set_num_threads(threads)
    return {r: _median_s(values) for r, values in ratios.items()}


def measure_schedule_overhead(hf_config: str | Path, seq_len: int, micro_batch_size: int = 1,
                              micro_batches: int = 8, rounds: int = 8, dtype: torch.dtype = torch.float32,
                              seed: int = 0) -> float:
    """Seconds of thread CPU that torch pipelining's Schedule1F1B spends per forward or backward of a
    micro-batch beyond the stage's own compute and loss: a one-stage schedule (a gloo group of this
    process alone) of the model's last layer (norm, head and loss: the stage whose outputs and losses
    the schedule also keeps) against the same micro-batches run in a plain loop, interleaved; the
    median over `rounds`, per operation (2 per micro-batch), at least 0.

    Why: the model prices a stage's operation as its layers' profiled compute; the schedule's own
    bookkeeping (chunking, argument flattening, autograd bookkeeping, loss and output merging) is
    Python on the same core, 0.1-0.4 ms per micro-batch on this project's 2-core machine. Needs no
    process group in the calling process (it forms and destroys one)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from chameleon_opt.runtime import hf

    if dist.is_initialized():
        raise RuntimeError("measure_schedule_overhead forms a group of its own: call it where none is formed")
    config = hf.load_config(hf_config)
    model = hf.build_model(config, seed, dtype, 1)
    last = hf.num_blocks(config) + 1
    rows = hf.batch_tokens(config.vocab_size, seq_len, seed, 0, micro_batches * micro_batch_size)
    with torch.no_grad():
        hidden = hf.Stage(model, config, 0, last)(rows[:, :-1])
    targets = rows[:, 1:]
    stage = hf.Stage(model, config, last, last + 1)

    def loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return hf.sample_losses(logits, target).sum()

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        schedule = Schedule1F1B(PipelineStage(stage, 0, 1, torch.device("cpu")), micro_batches, loss_fn=loss,
                                scale_grads=False)
        samples = []
        for round_ in range(rounds + 2):
            start = time.thread_time()
            schedule.step(hidden, target=targets, losses=[])
            scheduled = time.thread_time() - start
            start = time.thread_time()
            for k in range(micro_batches):
                part = slice(k * micro_batch_size, (k + 1) * micro_batch_size)
                loss(stage(hidden[part]), targets[part]).backward()
            plain = time.thread_time() - start
            stage.zero_grad(set_to_none=True)
            if round_ >= 2:
                samples.append((scheduled - plain) / (2 * micro_batches))
    finally:
        dist.destroy_process_group()
        torch.set_num_threads(threads)
    return max(_median_s(samples), 0.0)


def profile_modules(layers: Sequence[torch.nn.Module],
                    tokens: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
                    head_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                    micro_batch_sizes: Sequence[int] = (1, 2, 4), repeats: int = 20,
                    dtype: torch.dtype = torch.float32, warmup: int = 3) -> LayerProfile:
    """Time every layer's forward, backward and AdamW step with one torch thread (median of
    `repeats` after `warmup`), and measure its parameters, saved activations and output bytes.

    Times are the thread's CPU time, not wall: on a core of its own they agree, and on a shared
    one the wall clock also counts other processes' turns (on this project's 2-core machine at
    load 3.3 a profile by the wall clock priced the Llama bench model's step 26% above the CPU the
    runtime's own step spent computing it).

    `layers` are the workload layers in order (token ids into the first, logits out of the last),
    `tokens(mbs)` gives (inputs, targets) of a micro-batch, `head_loss(logits, targets)` the
    per-sample losses. Gradients accumulate across repeats, as they do across a step's
    micro-batches. Activation and boundary bytes come from the largest micro-batch size, divided
    by it (rounded up)."""
    if not micro_batch_sizes or min(micro_batch_sizes) < 1 or repeats < 1 or warmup < 0:
        raise ValueError("give positive micro-batch sizes, repeats >= 1 and warmup >= 0")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        head = len(layers) - 1
        forward: dict[int, tuple[float, ...]] = {}
        backward: dict[int, tuple[float, ...]] = {}
        for mbs in sorted(set(micro_batch_sizes)):
            inputs, targets = tokens(mbs)
            fwd, bwd = [], []
            x: torch.Tensor = inputs
            for index, layer in enumerate(layers):
                if index > 0:
                    x = x.detach().requires_grad_()
                f_samples, b_samples = [], []
                for repeat in range(warmup + repeats):
                    start = time.thread_time()
                    out = layer(x)
                    middle = time.thread_time()
                    if index == head:
                        head_loss(out, targets).sum().backward()
                    else:
                        out.backward(torch.ones_like(out))
                    end = time.thread_time()
                    if repeat >= warmup:
                        f_samples.append(middle - start)
                        b_samples.append(end - middle)
                fwd.append(_median_s(f_samples))
                bwd.append(_median_s(b_samples))
                with torch.no_grad():
                    x = layer(x)
            forward[mbs], backward[mbs] = tuple(fwd), tuple(bwd)

        update = []
        for layer in layers:
            optimizer = torch.optim.AdamW(layer.parameters())
            samples = []
            for repeat in range(warmup + repeats + 1):  # the first step allocates the state
                start = time.thread_time()
                optimizer.step()
                if repeat > warmup:
                    samples.append(time.thread_time() - start)
            update.append(_median_s(samples))

        mbs = max(micro_batch_sizes)
        inputs, targets = tokens(mbs)
        activation, boundary = [], []
        x = inputs
        for index, layer in enumerate(layers):
            if index > 0:
                x = x.detach().requires_grad_()
            saved = _SavedStorages({p.untyped_storage().data_ptr() for p in layer.parameters()})
            with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
                out = layer(x)
                if index == head:
                    head_loss(out, targets)
            activation.append(-(-saved.nbytes // mbs))
            # nothing follows the head: its logits never cross a stage boundary
            boundary.append(0 if index == head else -(-out.numel() * out.element_size() // mbs))
            x = out
    finally:
        torch.set_num_threads(threads)
    return LayerProfile(forward, backward, tuple(update),
                        tuple(sum(p.numel() for p in layer.parameters()) for layer in layers),
                        tuple(activation), tuple(boundary), dtype, repeats, warmup)


# -- network ------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _network_worker(rank: int, port: int, sizes: Sequence[int], rounds: int, out_path: str) -> None:
    """One of the two ping-pong processes; rank 0 writes the median one-way time per size."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=30))
    try:
        medians, helpers = [], []
        for size in sizes:
            buffer = torch.zeros(size, dtype=torch.uint8)
            samples = []
            for repeat in range(NETWORK_WARMUP + rounds):
                if repeat == NETWORK_WARMUP:
                    process, thread = time.process_time(), time.thread_time()
                start = time.perf_counter()
                if rank == 0:
                    dist.send(buffer, 1)
                    dist.recv(buffer, 1)
                else:
                    dist.recv(buffer, 0)
                    dist.send(buffer, 0)
                if repeat >= NETWORK_WARMUP:
                    samples.append((time.perf_counter() - start) / 2)
            helpers.append(((time.process_time() - process) - (time.thread_time() - thread)) / (2 * rounds))
            medians.append(_median_s(samples))
        if rank == 0:
            Path(out_path).write_text(json.dumps([medians, helpers]))
    finally:
        dist.destroy_process_group()


def fit_alpha_beta(sizes: Sequence[int], seconds: Sequence[float]) -> tuple[float, float]:
    """(latency_s, bandwidth bytes/s) of t = latency + n / bandwidth by least squares weighted by
    1/t, so the small (latency-bound) messages count as much as the large ones."""
    n, t = np.asarray(sizes, dtype=float), np.asarray(seconds, dtype=float)
    weight = 1.0 / np.maximum(t, 1e-12)
    design = np.stack([np.ones_like(n), n], axis=1) * weight[:, None]
    (latency, per_byte), *_ = np.linalg.lstsq(design, t * weight, rcond=None)
    per_byte = per_byte if per_byte > 0 else float(t.max() / n.max())
    return max(float(latency), 0.0), 1.0 / float(per_byte)


def measure_network(sizes: Sequence[int] = NETWORK_SIZES, rounds: int = 20) -> NetworkFit:
    """Spawn two gloo processes on localhost, ping-pong each message size `rounds` times and fit
    latency and bandwidth to the one-way times (a few seconds, most of it process start-up).

    The processes are spawned, so the calling script must be importable and guarded by
    `if __name__ == "__main__":` (not stdin). Measure on an otherwise idle machine: two processes
    ping-ponging share the cores with everything else (on a busy 2-core machine every size took
    2 ms one way instead of 35 us)."""
    with tempfile.TemporaryDirectory() as folder:
        out_path = os.path.join(folder, "one_way.json")
        mp.spawn(_network_worker, args=(_free_port(), tuple(sizes), rounds, out_path), nprocs=2, join=True)
        one_way, helpers = json.loads(Path(out_path).read_text())
    latency, bandwidth = fit_alpha_beta(sizes, one_way)
    return NetworkFit(latency, bandwidth, tuple(sizes), tuple(one_way), tuple(max(h, 0.0) for h in helpers))


ALLREDUCE_SIZES = (1 << 16, 1 << 20, 1 << 22, 1 << 24)
"""Buffer sizes (bytes) of the all-reduce fit: a few blocks' gradients up to a whole bench model's."""


@dataclass(frozen=True)
class AllreduceFit:
    """The gradient all-reduce as the HF runtime runs it (`pipelined.Worker._allreduce`: flatten a
    bucket, gloo all-reduce, copy back), fitted as a ring over W processes: 2(W-1) steps of
    `step_latency_s` each plus 2(W-1)/W of the bytes at `bus_bytes_per_s` (the form the model prices,
    comm.ring_allreduce_time). `points`: (W, bytes, median wall of the slowest rank, median process
    CPU of the busiest rank, all threads: gloo sums in its own) per measurement, so a fit taken on
    shared cores can be told from one on cores of their own."""

    step_latency_s: float
    bus_bytes_per_s: float
    points: tuple[tuple[int, int, float, float], ...]

    def time(self, nbytes: float, world: int) -> float:
        steps = 2 * (world - 1)
        return steps * self.step_latency_s + steps / world * nbytes / self.bus_bytes_per_s

    def network(self) -> dict[str, float]:
        """The instance's `cluster.network` fields that carry it to the model."""
        return {"collective_gbps": self.bus_bytes_per_s / 1e9, "collective_latency_us": self.step_latency_s * 1e6}


def fit_ring(points: Sequence[tuple[int, int, float]]) -> tuple[float, float]:
    """(step latency s, bus bytes/s) of t = 2(W-1) lat + 2(W-1)/W n / bw over (W, n, t) points, by
    least squares weighted by 1/t (as fit_alpha_beta)."""
    world = np.array([p[0] for p in points], dtype=float)
    n = np.array([p[1] for p in points], dtype=float)
    t = np.array([p[2] for p in points], dtype=float)
    weight = 1.0 / np.maximum(t, 1e-12)
    design = np.stack([2 * (world - 1), 2 * (world - 1) / world * n], axis=1) * weight[:, None]
    (latency, per_byte), *_ = np.linalg.lstsq(design, t * weight, rcond=None)
    if per_byte <= 0:
        per_byte = float(max(ti / (2 * (w - 1) / w * ni) for w, ni, ti in zip(world, n, t)))
    return max(float(latency), 0.0), 1.0 / float(per_byte)


def _allreduce_worker(rank: int, world: int, port: int, sizes: Sequence[int], rounds: int, out_path: str,
                      cores: Sequence[int] | None) -> None:
    """One of `measure_allreduce`'s processes: each size `rounds` times after a barrier; writes its
    per-size median wall and CPU seconds."""
    if cores is not None:
        os.sched_setaffinity(0, {cores[rank]})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        walls, cpus = [], []
        for size in sizes:
            grads = [torch.ones(size // 8), torch.ones(size // 4 - size // 8)]   # two tensors, as a bucket has many
            wall_samples, cpu_samples = [], []
            for repeat in range(NETWORK_WARMUP + rounds):
                dist.barrier()
                wall, cpu = time.perf_counter(), time.process_time()
                allreduce_flat(grads)
                if repeat >= NETWORK_WARMUP:
                    wall_samples.append(time.perf_counter() - wall)
                    cpu_samples.append(time.process_time() - cpu)
            walls.append(_median_s(wall_samples))
            cpus.append(_median_s(cpu_samples))
        Path(f"{out_path}.{rank}").write_text(json.dumps([walls, cpus]))
    finally:
        dist.destroy_process_group()


def measure_allreduce(worlds: Sequence[int] = (2,), sizes: Sequence[int] = ALLREDUCE_SIZES, rounds: int = 10,
                      cores: Sequence[int] | None = None) -> AllreduceFit:
    """For each W of `worlds`, spawn W gloo processes (pinned to the first W of `cores` when given),
    all-reduce each buffer size `rounds` times as the runtime reduces a gradient bucket, and fit
    one ring to every (W, size) median (`fit_ring`).

    Why: the model priced the gradient all-reduce as a ring over the point-to-point fit, which
    leaves out what gloo's all-reduce does besides moving bytes (summing the buffers on the CPU,
    its own copies) and the runtime's flatten and copy-back, all on the worker's one core; and
    the point-to-point fit, weighted towards small messages, is loose at a gradient's megabytes.
    On this project's 2-core machine (load 1.5-2): 27.4 MB (the Llama bench model) between two
    processes took 36 ms (25 ms of CPU) where the ring over the p2p fit gave 7 ms."""
    if not worlds or min(worlds) < 2:
        raise ValueError("an all-reduce needs two processes or more")
    points = []
    for world in worlds:
        with tempfile.TemporaryDirectory() as folder:
            out_path = os.path.join(folder, "allreduce")
            mp.spawn(_allreduce_worker, args=(world, _free_port(), tuple(sizes), rounds, out_path,
                                              None if cores is None else tuple(cores)), nprocs=world, join=True)
            ranks = [json.loads(Path(f"{out_path}.{rank}").read_text()) for rank in range(world)]
        points += [(world, size, max(r[0][i] for r in ranks), max(r[1][i] for r in ranks))
                   for i, size in enumerate(sizes)]
    latency, bandwidth = fit_ring([(w, n, t) for w, n, t, _ in points])
    return AllreduceFit(latency, bandwidth, tuple(points))


# -- workload file ------------------------------------------------------------------------------


def _machine() -> str:
    """CPU model and OS, for the profile's source text (not the host name)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def _measured(profile: LayerProfile, model: str, device_type: str) -> tuple[LayerBytes, Profile]:
    """A measured profile in the workload format: the times (update column = the whole model's
    AdamW step, as the format expects) and the layer bytes, with where and how they were taken."""
    update = round(profile.update_whole_model_s, 9)
    count = len(profile.params)
    times = {str(mbs): {"1": [[round(profile.forward_s[mbs][i], 9), round(profile.backward_s[mbs][i], 9), update]
                              for i in range(count)]}
             for mbs in sorted(profile.forward_s)}
    dtype_name = str(profile.dtype).removeprefix("torch.")
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    measured = (f"{model} measured by chameleon_opt.runtime.profile on {_machine()}, {when}, torch "
                f"{torch.__version__}, 1 thread, {dtype_name}, median of {profile.repeats} after {profile.warmup} "
                "warm-up; each layer timed alone; the head's backward includes the loss; update = AdamW step of "
                "the whole model; activations = tensors autograd saves for backward")
    layer_bytes = LayerBytes(params=list(profile.params),
                             activation_bytes_per_sample=list(profile.activation_bytes_per_sample),
                             boundary_bytes_per_sample=list(profile.boundary_bytes_per_sample))
    return layer_bytes, Profile(device_type=device_type, source=measured, times=times)


def workload_spec(cfg: GPTConfig, profile: LayerProfile, name: str = "tiny-gpt-cpu",
                  device_type: str = DEVICE_TYPE) -> WorkloadSpec:
    """The `models/` workload of a measured profile of the runtime's GPT."""
    layer_bytes, measured = _measured(profile, "the runtime's GPT (chameleon_opt/runtime/gpt.py)", device_type)
    return WorkloadSpec(name=name, source=f"{measured.source} (one CPU core per process)",
                        architecture=Architecture(**cfg.architecture()), layer_bytes=layer_bytes,
                        profiles=[measured])


def hf_workload_spec(hf_config: str | Path, profile: LayerProfile, seq_len: int,
                     device_type: str = DEVICE_TYPE) -> WorkloadSpec:
    """The workload of a Hugging Face config (`workload.hf`) with a measured profile of the HF
    runtime's layers (`profile_hf_layers` on `seq_len` tokens) for one CPU core per process."""
    from chameleon_opt.workload.hf import workload_from_hf

    document = workload_from_hf(Path(hf_config))
    document["architecture"]["seq_len"] = seq_len
    layer_bytes, measured = _measured(profile, f"the HF runtime's stages of {hf_config}", device_type)
    if len(profile.params) != document["architecture"]["layers"] + 2:
        raise InputError(hf_config, "profile", f"{len(profile.params)} profiled layers",
                         "profile this config with profile_hf_layers")
    return WorkloadSpec(**document, layer_bytes=layer_bytes, profiles=[measured])


def write_profile(path: str | Path, cfg: GPTConfig, profile: LayerProfile, name: str = "tiny-gpt-cpu",
                  device_type: str = DEVICE_TYPE, force: bool = False) -> WorkloadSpec:
    """Write the profile as a `models/` workload file; an existing file is kept unless `force`."""
    spec = workload_spec(cfg, profile, name, device_type)
    write_workload(spec, Path(path), force=force)
    return spec


# -- instance -----------------------------------------------------------------------------------


def _load_workload(workload: str | Path | WorkloadSpec) -> WorkloadSpec:
    if isinstance(workload, WorkloadSpec):
        return workload
    found = resolve_workload_path(str(workload), None)
    if found is None:
        raise InputError(workload, "file", "no such workload file or models/ name",
                         "run python -m chameleon_opt.runtime.profile -o FILE first")
    return load_workload_file(found)


def _host_memory_gib() -> float:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / float(1 << 30)
    except (ValueError, OSError, AttributeError):  # no sysconf names on this platform
        return 16.0


def cpu_device_type(spec: WorkloadSpec, devices: int, device_type: str = DEVICE_TYPE) -> dict[str, Any]:
    """An inline device type for one runtime process: a share of the host's memory, and a peak and
    memory bandwidth derived from the profile itself (forward FLOPs per measured second at the
    largest micro-batch; AdamW bytes per measured second), so analytic fallbacks stay consistent."""
    profile = next((p for p in spec.profiles if p.device_type == device_type), None)
    if profile is None or spec.architecture is None:
        raise InputError(spec.name, "profiles", f"no {device_type!r} profile with an architecture",
                         "profile the model with python -m chameleon_opt.runtime.profile")
    mbs = max(int(m) for m in profile.times if "1" in profile.times[m])
    rows = np.array(profile.times[str(mbs)]["1"], dtype=float)
    workload = Workload(spec, None, 4)
    flops = float(workload.forward_flops_per_sample.sum()) * mbs
    update = float(rows[:, 2].max())
    return {"name": device_type, "memory_gib": _host_memory_gib() / devices, "reserved_gib": PROCESS_RESERVED_GIB,
            "peak_tflops": flops / max(float(rows[:, 0].sum()), 1e-12) / 1e12, "efficiency": 1.0,
            "memory_bandwidth_gbps": ADAM_BYTES_TOUCHED_PER_PARAM * float(workload.params.sum())
            / max(update, 1e-12) / 1e9}


def runtime_instance(cfg: GPTConfig, workload: str | Path | WorkloadSpec, *, global_batch: int,
                     micro_batch_size: int, network: NetworkFit | Mapping[str, float],
                     pipelines: Sequence[Sequence[tuple[int, int]]] | None = None,
                     micro_batches: Sequence[int] | None = None, pp: int | None = None, dp: int | None = None,
                     layers_per_stage: Sequence[int] | None = None, failed_devices: Sequence[int] = (),
                     mtbf_hours_per_device: float | None = None, next_fault_s: float | None = None,
                     dtype: torch.dtype = torch.float32, device_type: str = DEVICE_TYPE,
                     name: str = "runtime") -> dict[str, Any]:
    """An instance (the instances/ JSON format, checked by the loader) for the CPU runtime: one node
    with one device per stage, the measured workload inline, the measured loopback network.

    The plan is either `pipelines` (per pipeline, each stage's layer range [first, end); devices
    numbered in order; `micro_batches` per pipeline, default an even split) or a regular
    `pp` x `dp` layout with optional `layers_per_stage`."""
    spec = _load_workload(workload)
    if spec.architecture != Architecture(**cfg.architecture()):
        raise InputError(spec.name, "architecture", "differs from the runtime's GPTConfig",
                         "profile this configuration, or pass the GPTConfig the profile was measured with")
    global_micro = global_batch // micro_batch_size if micro_batch_size > 0 else 0
    if pipelines is not None:
        if pp is not None or dp is not None or layers_per_stage is not None:
            raise InputError(None, "plan", "both pipelines and a pp/dp layout given", "give only one of them")
        counts = list(micro_batches) if micro_batches is not None else \
            [global_micro // len(pipelines) + (1 if j < global_micro % len(pipelines) else 0)
             for j in range(len(pipelines))]
        if len(counts) != len(pipelines):
            raise InputError(None, "micro_batches", f"{len(counts)} counts for {len(pipelines)} pipelines",
                             "give one count per pipeline")
        device, explicit = 0, []
        for pipe, count in zip(pipelines, counts):
            stages = []
            for first, end in pipe:
                stages.append({"devices": [device], "layers": [first, end]})
                device += 1
            explicit.append({"micro_batches": count, "stages": stages})
        plan: dict[str, Any] = {"tensor_parallel": 1, "pipelines": explicit}
        devices = device
    elif pp is not None and dp is not None:
        layout: dict[str, Any] = {"pipeline_parallel": pp, "data_parallel": dp}
        if layers_per_stage is not None:
            layout["layers_per_stage"] = list(layers_per_stage)
        plan, devices = {"tensor_parallel": 1, "layout": layout}, pp * dp
    else:
        raise InputError(None, "plan", "no plan given", "give pipelines, or pp and dp")
    failures: dict[str, Any] = {}
    if failed_devices:
        failures["events"] = [{"time_s": 0.0, "devices": list(failed_devices)}]
    if mtbf_hours_per_device is not None:
        failures["mtbf_hours_per_device"] = mtbf_hours_per_device
    if next_fault_s is not None:
        failures["next_fault_s"] = next_fault_s
    dtype_bytes = torch.empty((), dtype=dtype).element_size()
    data = {
        "format": 1, "name": name,
        "description": f"the CPU runtime: {devices} processes with one torch thread each, gloo on localhost",
        "cluster": {"nodes": 1, "devices_per_node": devices,
                    "device_type": cpu_device_type(spec, devices, device_type),
                    "network": network.network() if isinstance(network, NetworkFit) else dict(network)},
        "workload": {"inline": spec.model_dump(mode="json", exclude_none=True)},
        "training": {"global_batch": global_batch, "micro_batch_size": micro_batch_size,
                     "precision": "fp32" if dtype_bytes == 4 else "bf16",
                     # AdamW keeps m and v in the parameters' precision; no master copy
                     "optimizer": {"name": "adamw", "state_bytes_per_param": 2.0 * dtype_bytes}},
        "plan": plan,
        "failures": failures,
    }
    build_instance(data, f"<{name}>")  # raises InputError naming the field when the plan is wrong
    return data


# -- command line -------------------------------------------------------------------------------


def _print_table(cfg: GPTConfig, profile: LayerProfile, network: NetworkFit | None) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    sizes = sorted(profile.forward_s)
    table = Table(title=f"per-layer profile ({str(profile.dtype).removeprefix('torch.')}, 1 thread): "
                        "fwd/bwd and AdamW in us, bytes per sample", box=box.SIMPLE_HEAD)
    table.add_column("layer", min_width=9)
    for column in ["params", "act B", "out B",
                   *(f"mbs {mbs}" for mbs in sizes), "AdamW"]:
        table.add_column(column, justify="right")
    for i in range(cfg.num_layers):
        kind = "embedding" if i == 0 else "head" if i == cfg.num_layers - 1 else f"block {i}"
        times = [f"{profile.forward_s[mbs][i] * 1e6:.0f}/{profile.backward_s[mbs][i] * 1e6:.0f}" for mbs in sizes]
        table.add_row(kind, f"{profile.params[i]:,}", f"{profile.activation_bytes_per_sample[i]:,}",
                      f"{profile.boundary_bytes_per_sample[i]:,}", *times, f"{profile.update_s[i] * 1e6:.0f}")
    console = Console()
    if not console.is_terminal:  # a log or a pipe: rich would cut numbers to 80 columns
        console = Console(width=120)
    console.print(table)
    if network is not None:
        console.print(f"gloo send/recv on localhost: latency {network.latency_s * 1e6:.1f} us, "
                      f"bandwidth {network.bandwidth_bytes_per_s / 1e9:.2f} GB/s")


def _parser() -> argparse.ArgumentParser:
    defaults = GPTConfig()
    parser = argparse.ArgumentParser(
        prog="python -m chameleon_opt.runtime.profile",
        description="Profile the runtime's GPT per layer with one torch thread and write a models/ workload file.")
    parser.add_argument("-o", "--output", required=True, help="output JSON file (models/NAME.json)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing output file")
    parser.add_argument("--name", help="workload name (default: the output file's stem)")
    for field in ("layers", "hidden", "heads", "vocab", "seq_len"):
        parser.add_argument(f"--{field.replace('_', '-')}", type=int, default=getattr(defaults, field))
    parser.add_argument("--micro-batch-sizes", default="1,2,4", help="comma-separated (default 1,2,4)")
    parser.add_argument("--repeats", type=int, default=50, help="timed runs per measurement (median)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--network", action="store_true", help="also measure and print gloo latency/bandwidth")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (0, or the InputError's 2) and prints one line on error."""
    args = _parser().parse_args(argv)
    try:
        out = Path(args.output)
        if out.exists() and not args.force:  # before the measurement, so it is not wasted
            raise InputError(out, "<output>", "file exists", "choose another -o path, or pass --force to overwrite it")
        try:
            sizes = [int(s) for s in args.micro_batch_sizes.split(",")]
        except ValueError:
            raise InputError("<command line>", "--micro-batch-sizes", f"got {args.micro_batch_sizes!r}",
                             "give positive integers separated by commas, e.g. 1,2,4") from None
        if min(sizes) < 1 or args.repeats < 1 or args.warmup < 0:
            raise InputError("<command line>", "--micro-batch-sizes/--repeats/--warmup", "out of range",
                             "give positive sizes, repeats >= 1 and warmup >= 0")
        cfg = GPTConfig(layers=args.layers, hidden=args.hidden, heads=args.heads, vocab=args.vocab,
                        seq_len=args.seq_len)
        try:
            Architecture(**cfg.architecture())
        except ValidationError as err:
            raise InputError("<command line>", "--layers/--hidden/--heads", str(err.errors()[0]["msg"]),
                             "give positive sizes with hidden a multiple of heads") from None
        profile = profile_layers(cfg, sizes, args.repeats, DTYPES[args.dtype], args.warmup)
        write_profile(out, cfg, profile, args.name or out.stem, force=args.force)
        network = measure_network() if args.network else None
    except ChameleonError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    _print_table(cfg, profile, network)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
