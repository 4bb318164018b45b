"""A re-plan that changes the TP degree, priced as what the runtime executes: a re-shard from the
checkpoint of the last committed step.

The migration layer (state.py) moves whole TP shards between devices that held the same layer at
the same TP rank; across TP degrees a shard of the new degree is made of parts of several old
shards, cut along a different dimension per tensor (column-wise q/k/v and MLP input, row-wise
output projections), which its transfers cannot express. So a TP change is not migrated: every
live device of the new plan reads its new shards of its layers' parameters and optimizer state
from the checkpoint (torch.distributed.checkpoint stores global tensors keyed by parameter name,
so any degree can load them; the HF runtime does exactly this, runtime/pipelined.py), at
`network.checkpoint_read_gbps` per device, all devices reading at once. Under ZeRO a device reads
its own range of the sharded state only (comm/state.py's ranges over the new plan's shard groups).
The checkpoint must exist: the trainer writes one after every committed step, a cost of the
steady state that the step time here does not include.
"""

from __future__ import annotations

from dataclasses import dataclass

from chameleon_opt.comm.state import ShardGroups, data_parallel_groups, live_slots, state_bytes
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.plan import Plan


@dataclass(frozen=True)
class CheckpointReshard:
    """Every live device's bytes read from the checkpoint when the TP degree changes from
    `from_tp` to `to_tp`, and the time it takes with every device reading at `read_gbps`."""

    from_tp: int
    to_tp: int
    bytes_per_device: dict[int, int]
    read_gbps: float

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_per_device.values())

    @property
    def read_s(self) -> float:
        """The slowest device's read (they read in parallel)."""
        return max(self.bytes_per_device.values(), default=0) / (self.read_gbps * 1e9)

    def to_json(self) -> dict[str, object]:
        return {"from": self.from_tp, "to": self.to_tp, "restore": "checkpoint re-shard",
                "devices": len(self.bytes_per_device), "bytes": self.total_bytes, "read_s": self.read_s,
                "read_gbps": self.read_gbps}


def checkpoint_reshard(model: PerfModel, old: Plan, new: Plan, failed: frozenset[int]) -> CheckpointReshard:
    """What each live device of `new` reads: its stage's layers at its new TP rank (1 / TP of each
    layer's parameters and optimizer state), and under ZeRO only its range of the sharded part."""
    replicated, sharded = state_bytes(model, new.tensor_parallel)
    slots = live_slots(new, failed)
    groups = {layer: ShardGroups(held, model.shard_copies)
              for layer, held in data_parallel_groups(new, slots).items()} if sharded.any() else {}
    per_device: dict[int, int] = {}
    for j, s in slots:
        stage = new.pipelines[j].stages[s]
        nbytes = int(replicated[stage.first:stage.end].sum())
        for layer in range(stage.first, stage.end):
            if sharded[layer]:
                lo, hi = groups[layer].range_of((j, s), int(sharded[layer]))
                nbytes += hi - lo
        for d in stage.devices:
            per_device[d] = nbytes
    read_gbps = model.instance.spec.cluster.network.checkpoint_read_gbps
    return CheckpointReshard(old.tensor_parallel, new.tensor_parallel, per_device, read_gbps)
