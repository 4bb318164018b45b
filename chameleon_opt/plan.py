"""The plan: the one typed object every solver returns and every later layer consumes.

A plan is a set of pipelines; each pipeline is a list of stages; each stage is a TP group of
devices owning a contiguous layer range [first, end) and the memory relief it runs with (None: the
training's global recomputation, so plans written before reliefs existed keep their meaning). Rerouted work (ReCycle-style) is listed
separately: `from_pipeline`'s micro-batches of `stage` are computed by `to_pipeline`'s stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Stage:
    devices: tuple[int, ...]
    first: int
    end: int
    relief: str | None = None  # perf/relief.py names: "full", "offload+opt-offload", ...

    @property
    def num_layers(self) -> int:
        return self.end - self.first


@dataclass(frozen=True)
class Pipeline:
    stages: tuple[Stage, ...]
    micro_batches: int

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(d for stage in self.stages for d in stage.devices)


@dataclass(frozen=True)
class Reroute:
    """`micro_batches` of `from_pipeline` run their `stage` on `to_pipeline`'s stage instead.

    A float: the paper's Eq. 12/13 splits a failed stage's work evenly, in fractions of a
    micro-batch (a micro-batch can be cut into smaller sample groups); named integer shares are
    the special case of whole numbers."""

    from_pipeline: int
    stage: int
    to_pipeline: int
    micro_batches: float


@dataclass(frozen=True)
class Plan:
    tensor_parallel: int
    pipelines: tuple[Pipeline, ...]
    rerouted: tuple[Reroute, ...] = field(default=())

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(d for p in self.pipelines for d in p.devices)

    @property
    def total_micro_batches(self) -> int:
        return sum(p.micro_batches for p in self.pipelines)

    def to_json(self) -> dict[str, Any]:
        """The `plan` object of the CLI contract."""
        return {
            "tensor_parallel": self.tensor_parallel,
            "pipelines": [
                {"micro_batches": p.micro_batches,
                 "stages": [{"devices": list(s.devices), "layers": [s.first, s.end],
                             **({"relief": s.relief} if s.relief is not None else {})} for s in p.stages]}
                for p in self.pipelines],
            "rerouted": [
                {"from_pipeline": r.from_pipeline, "stage": r.stage, "to_pipeline": r.to_pipeline,
                 "micro_batches": r.micro_batches} for r in self.rerouted],
        }


def device_list(devices: tuple[int, ...] | list[int]) -> str:
    """A TP group as written: runs of three or more consecutive ids as `a-b`, every other id listed
    (`12,14`, `8-10,12-16`), so that a gap (a failed device re-mapped out of the group) is never hidden."""
    parts: list[str] = []
    ids = list(devices)
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts += [f"{ids[i]}-{ids[j]}"] if j - i >= 2 else [str(d) for d in ids[i:j + 1]]
        i = j + 1
    return ",".join(parts)
