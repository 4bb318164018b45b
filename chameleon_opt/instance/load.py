"""Reading instance and workload files into checked, resolved objects, with one-line errors.

Parsing is pydantic's (types, ranges, unknown fields); the cross-field checks a schema cannot
express (device ids in range and unique, layer ranges that tile the model, micro-batches that sum
to the global batch) are here, and so are the limits of what the model can compute with (finite
numbers, counts it can hold in memory). Every failure raises InputError naming file, field and
fix: the CLI prints only ChameleonError, so anything else would reach the user as a traceback.
"""

from __future__ import annotations

import functools
import json
import os
import re
import reprlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ValidationError

from chameleon_opt.bundled import bundled_dir, bundled_instance, bundled_instance_names
from chameleon_opt.errors import InputError
from chameleon_opt.instance.devices import CATALOGUE
from chameleon_opt.instance.schema import DeviceType, InstanceSpec, Layout, PlanSpec
from chameleon_opt.plan import Pipeline, Plan, Stage
from chameleon_opt.workload.model import Workload
from chameleon_opt.workload.schema import WorkloadSpec

MODELS_DIR = Path(os.environ.get("CHAMELEON_MODELS", bundled_dir("models")))

MAX_COUNT = 1 << 20
"""Most devices, layers or micro-batches per iteration an instance may have. The model builds
per-device and per-layer tables and simulates 1F1B micro-batch by micro-batch, so a count beyond
this (about 1000x the largest published jobs) is a typo that would exhaust memory or time."""

FLOAT_RANGE = (1e-30, 1e30)
"""Magnitudes a non-zero float may have. Every quantity of an instance (seconds, GB/s, GiB,
TFLOP/s, bytes) lies far inside; beyond it a size divided by a bandwidth, or a time summed over
micro-batches, overflows to inf or underflows to 0 (and then inf x 0 gives NaN)."""

_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 60


def read_document(path: Path) -> Any:
    """JSON or YAML (by extension) into Python objects; syntax errors name the line."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError(path, "file", "file not found", "check the path") from None
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(path, "file", f"cannot be read ({type(err).__name__})", "give a readable text file") from None
    syntax = "YAML" if path.suffix.lower() in (".yaml", ".yml") else "JSON"
    try:
        return _read_yaml(path, text) if syntax == "YAML" else json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(path, "file", f"malformed JSON at line {err.lineno}, column {err.colno} ({err.msg})",
                         "fix the JSON syntax") from None
    except ValueError as err:  # an integer of more than 4300 digits, a YAML date like 2024-13-45
        reason = str(err).split(";")[0].splitlines()[0][:80]
        raise InputError(path, "file", f"a value cannot be read ({reason})",
                         "correct it, or quote it to make it a string") from None
    except RecursionError:
        raise InputError(path, "file", f"{syntax} nested too deeply", "flatten the document") from None


def _read_yaml(path: Path, text: str) -> Any:
    """YAML into Python objects; PyYAML is imported here, as only YAML files need it (0.02-0.04 s of
    every command's start-up otherwise)."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise InputError(path, "file", f"malformed YAML{where}", "fix the YAML syntax") from None


def _path_text(keys: list[Any]) -> str:
    """Keys and indices as `plan.pipelines[0].stages[1]`; odd keys quoted so the line stays one line."""
    parts: list[str] = []
    for key in keys:
        if isinstance(key, int) and not isinstance(key, bool):
            parts.append(f"[{key}]")
        elif isinstance(key, str) and re.fullmatch(r"[A-Za-z0-9_-]+", key):
            parts.append(("." if parts else "") + key)
        else:
            parts.append(f"[{_SHOWN.repr(key)}]")
    return "".join(parts) or "<root>"


def _field_path(loc: tuple[Any, ...], data: Any, kind: str) -> str:
    """pydantic's loc as a path through the document, without union-branch tags (`DeviceType`,
    `str`): a loc item is kept when it is a key or index of the data at that point, or names the
    missing field an error is about. Following the data, not guessing from spelling, keeps user
    keys such as an unknown `Nodes`."""
    keys: list[Any] = []
    node = data
    for i, item in enumerate(loc):
        if isinstance(node, dict) and item in node:
            keys.append(item)
            node = node[item]
        elif isinstance(node, (list, tuple)) and isinstance(item, int) and -len(node) <= item < len(node):
            keys.append(item)
            node = node[item]
        elif i == len(loc) - 1 and kind in ("missing", "invalid_key"):
            keys.append(item)
    return _path_text(keys)


def _check_numbers(data: Any, path: Path | str | None) -> None:
    """NaN, infinities (JSON's `NaN`, `1e400`, YAML's `.inf`), floats beyond FLOAT_RANGE and
    integers beyond 64 bits pass pydantic's float and int types but make the model's sums and
    products inf or NaN, which no result and no JSON output can carry, so they are refused first.
    Iterative with a visited set: YAML aliases can make the document share or cycle. Leaves are
    checked where their container is read and each container carries its trail of keys as a linked
    pair (key, parent's trail), so the path is spelled out only for the value refused: profile
    tables hold thousands of numbers, and a workload file is read at every instance built from it;
    a long list that numpy reads as one block of floats or 64-bit integers is checked at once (a
    float's NaN fails the range test; numpy keeps an integer beyond 64 bits as an object, and one of
    2^63 .. 2^64 beside floats becomes a float of that size, which the block test leaves to the walk),
    and walked item by item only when the block test does not pass it."""
    low, high = FLOAT_RANGE
    Trail = tuple[Any, Any] | None

    def bad(value: Any) -> bool:
        if isinstance(value, float):
            return not (value == 0 or low <= abs(value) <= high)
        return isinstance(value, int) and not isinstance(value, bool) and not -(1 << 63) <= value < 1 << 63

    def refuse(value: Any, trail: Trail) -> None:
        keys: list[Any] = []
        while trail is not None:
            key, trail = trail
            keys.append(key)
        where = _path_text(keys[::-1])
        if isinstance(value, float):
            raise InputError(path, where, f"got {value!r}", f"use 0 or a magnitude between {low:g} and {high:g}")
        raise InputError(path, where, "integer beyond 64 bits", "use a value below 2^63")

    def in_range_block(items: list[Any]) -> bool:
        try:
            block = np.asarray(items)
        except (ValueError, OverflowError):  # ragged nesting
            return False
        if block.dtype.kind in "biu":
            return block.dtype.kind != "u" or bool(np.all(block < 1 << 63))
        if block.dtype.kind != "f":
            return False
        size = np.abs(block)  # below 2^63: no integer of 64 bits or more hides in it as a float
        return bool(np.all((size == 0) | ((size >= low) & (size <= high) & (size < 2.0 ** 63))))

    if bad(data):
        refuse(data, None)
    stack: list[tuple[Any, Trail]] = [(data, None)] if isinstance(data, (dict, list, tuple)) else []
    seen: set[int] = set()
    while stack:
        node, trail = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, list) and len(node) >= 16 and in_range_block(node):
            continue
        for key, value in (node.items() if isinstance(node, dict) else enumerate(node)):
            if isinstance(value, (dict, list, tuple)):
                stack.append((value, (key, trail)))
            elif bad(value):
                refuse(value, (key, trail))


def _fix_for(error: dict[str, Any]) -> tuple[str, str]:
    """(problem, fix) for one pydantic error, phrased for a person editing the file; the input is
    shown shortened (reprlib), so a long or nested value cannot flood the one line."""
    kind, ctx, msg = error["type"], error.get("ctx") or {}, error["msg"]
    if kind == "missing":
        return "required field is missing", "add it (see `chameleon-solve schema`)"
    if kind == "extra_forbidden":
        return "unknown field", "remove it or correct its spelling (see `chameleon-solve schema`)"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return f"got {_SHOWN.repr(error.get('input'))}", msg.lower().replace("input should be", "use a value")
    if kind == "value_error":
        return "inconsistent values", str(ctx.get("error", msg))
    if kind == "too_short":
        return "too few items", msg.lower().replace("list should have", "give")
    return f"got {_SHOWN.repr(error.get('input'))}", msg.lower().replace("input should be", "use")


def parse_model(model: type[BaseModel], data: Any, path: Path | str | None, prefix: str = "") -> Any:
    """Validate `data` against `model`; the first error becomes an InputError."""
    _check_numbers(data, path)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        errors = sorted(err.errors(), key=lambda e: e["type"] in ("string_type", "model_type", "dict_type"))
        first = errors[0]
        problem, fix = _fix_for(first)
        field = _field_path(tuple(first["loc"]), data, first["type"])
        raise InputError(path, f"{prefix}{field}" if field != "<root>" or not prefix else prefix.rstrip("."),
                         problem, fix) from None


def available_models() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


def load_workload_file(path: Path) -> WorkloadSpec:
    """The validated workload in `path`. A catalogue file (in MODELS_DIR) is parsed once per version
    (its mtime and size): every instance naming a catalogue model reads it, and a calibration grid
    builds hundreds (validating opt-350m.json took half of bench/validate_perf.py's Sailor fit). The
    spec is frozen, so sharing it is safe; files elsewhere may be rewritten in place, so are read each time."""
    try:
        catalogue = Path(path).resolve().parent == MODELS_DIR.resolve()
        stat = Path(path).stat()
    except (OSError, ValueError):
        catalogue = False
    if catalogue:
        return _catalogue_workload(path, stat.st_mtime_ns, stat.st_size)
    return _parse_workload_file(path)


@functools.lru_cache(maxsize=128)
def _catalogue_workload(path: Path, mtime_ns: int, size: int) -> WorkloadSpec:
    """A catalogue file's spec, memoised by version (the key's mtime and size)."""
    return _parse_workload_file(path)


def _parse_workload_file(path: Path) -> WorkloadSpec:
    spec = parse_model(WorkloadSpec, read_document(path), path)
    _check_workload(spec, path)
    return spec


def _check_workload(spec: WorkloadSpec, path: Path | str | None, prefix: str = "") -> None:
    """What the workload schema lets through but the model cannot use: no layers at all, or more
    blocks than the per-layer tables can hold (sizes and profile shapes are the schema's)."""
    if spec.architecture is not None and spec.architecture.layers > MAX_COUNT:
        raise InputError(path, f"{prefix}architecture.layers", f"{spec.architecture.layers} blocks",
                         f"use at most {MAX_COUNT}")
    if spec.architecture is None and Workload(spec, None, 2).num_layers == 0:
        raise InputError(path, f"{prefix}{'profiles' if spec.layer_bytes is None else 'layer_bytes'}",
                         "zero layers", "give one entry per layer, embedding and head included")


def _is_file(candidate: Path) -> bool:
    """Path.is_file that treats an impossible name (too long, a NUL byte) as absent."""
    try:
        return candidate.is_file()
    except (OSError, ValueError):
        return False


def resolve_workload_path(reference: str, base_dir: Path | None) -> Path | None:
    """A catalogue name (`gpt3-175b`) or a path, relative to the instance file first."""
    candidates = [Path(reference)]
    if base_dir is not None:
        candidates.insert(0, base_dir / reference)
    candidates += [MODELS_DIR / reference, MODELS_DIR / f"{reference}.json"]
    return next((c for c in candidates if _is_file(c)), None)


@dataclass(frozen=True)
class Instance:
    """A validated instance with everything resolved: the workload, per-device types, the plan."""

    spec: InstanceSpec
    path: Path | None
    workload: Workload
    device_types: tuple[DeviceType, ...]
    plan: Plan
    failed_devices: frozenset[int]

    @property
    def num_devices(self) -> int:
        return len(self.device_types)

    @property
    def devices_per_node(self) -> int:
        return self.spec.cluster.devices_per_node

    def node_of(self, device: int) -> int:
        return device // self.spec.cluster.devices_per_node

    @property
    def micro_batch_size(self) -> int:
        return self.spec.training.micro_batch_size

    @property
    def global_micro_batches(self) -> int:
        return self.spec.training.global_batch // self.spec.training.micro_batch_size

    @property
    def name(self) -> str:
        return self.spec.name


def _device_type(value: DeviceType | str, path: Path | str | None, field: str) -> DeviceType:
    if isinstance(value, DeviceType):
        return value
    if value not in CATALOGUE:
        raise InputError(path, field, f"unknown device type {value!r}",
                         f"use one of {', '.join(CATALOGUE)} or describe it inline")
    return CATALOGUE[value]


def _balanced_split(total: int, parts: int) -> list[int]:
    """Layer counts as even as possible, the extra layers on the last stages (they hold fewer
    activations in flight under 1F1B)."""
    base, extra = divmod(total, parts)
    return [base + (1 if i >= parts - extra else 0) for i in range(parts)]


def rank_of(order: str, sizes: dict[str, int], index: dict[str, int]) -> int:
    """The global rank of grid position `index` (per dimension "tp", "pp", "dp") under `order`
    (innermost dimension first, e.g. "tp-dp-pp"): a mixed-radix number, innermost digit first."""
    rank, stride = 0, 1
    for dim in order.split("-"):
        rank += index[dim] * stride
        stride *= sizes[dim]
    return rank


def grid_position(order: str, sizes: dict[str, int], rank: int) -> dict[str, int]:
    """Inverse of rank_of: the (tp, pp, dp) position of a global rank."""
    position = {}
    for dim in order.split("-"):
        rank, position[dim] = divmod(rank, sizes[dim])
    return position


def expand_layout(layout: Layout, tp: int, num_layers: int, global_micro: int, num_devices: int,
                  path: Path | str | None, cp: int = 1) -> list[Pipeline]:
    """The explicit pipelines of a regular layout, device ids numbered by `layout.order`. Under
    context parallelism each data-parallel pipeline becomes cp consecutive pipelines (one per cp
    rank, each with the replica's micro-batches), the cp rank numbered right after tp as in
    Megatron-LM's orders (tp-cp-ep-dp-pp, tp-cp-ep-pp-dp: parallel_state.RankGenerator)."""
    pp, dp = layout.pipeline_parallel, layout.data_parallel
    if pp * dp * tp * cp > num_devices:
        grid = f"{pp}x{dp}x{tp}" + (f"x{cp} (context_parallel)" if cp > 1 else "")
        raise InputError(path, "plan.layout",
                         f"needs {grid} = {pp * dp * tp * cp} devices, the cluster has {num_devices}",
                         "lower data_parallel or pipeline_parallel, or enlarge the cluster")
    if pp > num_layers:
        raise InputError(path, "plan.layout.pipeline_parallel", f"{pp} stages for {num_layers} layers",
                         f"use at most {num_layers} stages")
    counts = layout.layers_per_stage if layout.layers_per_stage is not None else _balanced_split(num_layers, pp)
    if len(counts) != pp or sum(counts) != num_layers:
        raise InputError(path, "plan.layout.layers_per_stage",
                         f"{len(counts)} stages holding {sum(counts)} layers",
                         f"give {pp} positive counts summing to {num_layers}")
    if global_micro < dp:
        raise InputError(path, "plan.layout.data_parallel", f"{dp} pipelines for {global_micro} micro-batches",
                         "use at most as many pipelines as micro-batches")
    shares = [global_micro // dp + (1 if i < global_micro % dp else 0) for i in range(dp)]
    pipelines, bounds = [], [0]
    for c in counts:
        bounds.append(bounds[-1] + c)
    sizes = {"tp": tp, "pp": pp, "dp": dp, "cp": cp}
    order = layout.order.replace("tp", "tp-cp")
    for j in range(dp):
        for c in range(cp):
            stages = []
            for s in range(pp):
                group = tuple(rank_of(order, sizes, {"tp": t, "pp": s, "dp": j, "cp": c}) for t in range(tp))
                stages.append(Stage(group, bounds[s], bounds[s + 1]))
            pipelines.append(Pipeline(tuple(stages), shares[j]))
    return pipelines


def _check_context_parallel(workload: WorkloadSpec, sequence_length: int | None, cp: int,
                            path: Path | str | None) -> None:
    """What context parallelism needs: an architecture (the per-rank share is derived from it), no
    measured profiles (they time whole sequences), and a sequence that splits into 2 x cp equal chunks
    (Transformer Engine's load-balanced causal split gives each rank chunks i and 2cp - 1 - i)."""
    if workload.architecture is None or workload.profiles:
        raise InputError(path, "training.context_parallel", f"is {cp} but the workload "
                         + ("has no architecture" if workload.architecture is None else "has measured profiles"),
                         "describe the workload by its architecture without profiles, or set context_parallel to 1")
    seq = sequence_length or workload.architecture.seq_len
    if seq % (2 * cp):
        raise InputError(path, "training.context_parallel", f"{cp} does not split the {seq}-token sequence into "
                         f"2 x {cp} equal chunks", "use a sequence length divisible by 2 x context_parallel")


def _explicit_pipelines(plan: PlanSpec) -> list[Pipeline]:
    return [Pipeline(tuple(Stage(tuple(st.devices), st.layers[0], st.layers[1], st.relief) for st in p.stages), p.micro_batches)
            for p in plan.pipelines or []]


def check_plan_shape(pipelines: list[Pipeline], tp: int, num_layers: int, num_devices: int,
                     global_micro: int, path: Path | str | None, cp: int = 1) -> None:
    """Cross-field checks of a plan: TP group sizes, device ids, layer tiling, micro-batch sum (each
    of cp consecutive pipelines runs the same micro-batches' slices under context parallelism)."""
    if cp > 1:
        groups = [pipelines[g:g + cp] for g in range(0, len(pipelines), cp)]
        if len(pipelines) % cp or any(len({(p.micro_batches, tuple((s.first, s.end) for s in p.stages))
                                           for p in group}) > 1 for group in groups):
            raise InputError(path, "plan.pipelines", f"{len(pipelines)} pipelines are not groups of "
                             f"context_parallel {cp} consecutive pipelines with equal stages and micro-batches",
                             "give each context-parallel group's cp pipelines the same layers and micro_batches")
    seen: dict[int, str] = {}
    for j, pipe in enumerate(pipelines):
        expected_first = 0
        for s, stage in enumerate(pipe.stages):
            where = f"plan.pipelines[{j}].stages[{s}]"
            if len(stage.devices) != tp:
                raise InputError(path, f"{where}.devices", f"{len(stage.devices)} devices with tensor_parallel {tp}",
                                 f"give exactly {tp} devices per stage (one TP group)")
            for d in stage.devices:
                if d >= num_devices:
                    raise InputError(path, f"{where}.devices", f"device {d} out of range",
                                     f"use ids 0..{num_devices - 1} (nodes x devices_per_node)")
                if d in seen:
                    raise InputError(path, f"{where}.devices", f"device {d} is also used in {seen[d]}",
                                     "give each device to one stage only")
                seen[d] = where
            first, end = stage.first, stage.end
            if first != expected_first:
                problem = "overlaps the previous stage" if first < expected_first else "leaves a gap before it"
                raise InputError(path, f"{where}.layers", f"[{first}, {end}] {problem}",
                                 f"start this stage at layer {expected_first}")
            if end <= first:
                raise InputError(path, f"{where}.layers", f"empty range [{first}, {end}]",
                                 "give [first, end_exclusive] with end > first")
            expected_first = end
        if expected_first != num_layers:
            raise InputError(path, f"plan.pipelines[{j}].stages", f"layers end at {expected_first}",
                             f"the last stage must end at {num_layers} (the workload's layer count, head included)")
    total = sum(p.micro_batches for p in pipelines[::cp])  # one pipeline per context-parallel group
    if total != global_micro:
        raise InputError(path, "plan.pipelines[*].micro_batches", f"they sum to {total}",
                         f"make them sum to global_batch / micro_batch_size = {global_micro}")


def build_instance(data: Any, path: Path | str | None = None) -> Instance:
    """Validate a parsed document and resolve it into an Instance (raises InputError)."""
    if isinstance(data, dict) and "$schema" in data:  # an editor's pointer to the JSON Schema: ignored
        if not isinstance(data["$schema"], str):
            raise InputError(path, "$schema", "not a string", "give the schema's URL or path, or remove the key")
        data = {key: value for key, value in data.items() if key != "$schema"}
    spec: InstanceSpec = parse_model(InstanceSpec, data, path)
    base_dir = Path(path).parent if path is not None else None
    if spec.workload.inline is not None:
        workload_spec = spec.workload.inline
        _check_workload(workload_spec, path, "workload.inline.")
    else:
        found = resolve_workload_path(spec.workload.model or "", base_dir)
        if found is None:
            names = available_models()
            raise InputError(path, "workload.model", f"no model file {spec.workload.model!r}",
                             f"use one of: {', '.join(names)}, or a path" if names else
                             f"give the path of a workload file, relative to the instance (no models in {MODELS_DIR})")
        workload_spec = load_workload_file(found)
    training = spec.training
    if training.global_batch % training.micro_batch_size:
        raise InputError(path, "training.micro_batch_size",
                         f"{training.micro_batch_size} does not divide global_batch {training.global_batch}",
                         "use a micro-batch size that divides the global batch")
    if training.global_batch // training.micro_batch_size > MAX_COUNT:
        raise InputError(path, "training.global_batch",
                         f"{training.global_batch // training.micro_batch_size} micro-batches per iteration",
                         f"use at most {MAX_COUNT} (global_batch / micro_batch_size)")
    cp = training.context_parallel
    if cp > 1:
        _check_context_parallel(workload_spec, training.sequence_length, cp, path)
    workload = Workload(workload_spec, training.sequence_length, training.dtype_bytes, cp)

    cluster = spec.cluster
    num_devices = cluster.nodes * cluster.devices_per_node
    if num_devices > MAX_COUNT:
        raise InputError(path, "cluster.nodes", f"{cluster.nodes} x {cluster.devices_per_node} = {num_devices} devices",
                         f"use at most {MAX_COUNT} devices (nodes x devices_per_node)")
    default_type = _device_type(cluster.device_type, path, "cluster.device_type")
    types = [default_type] * num_devices
    for i, override in enumerate(cluster.overrides):
        dtype = _device_type(override.device_type, path, f"cluster.overrides[{i}].device_type")
        for d in override.devices:
            if d >= num_devices:
                raise InputError(path, f"cluster.overrides[{i}].devices", f"device {d} out of range",
                                 f"use ids 0..{num_devices - 1}")
            types[d] = dtype

    tp = spec.plan.tensor_parallel
    global_micro = training.global_batch // training.micro_batch_size
    if spec.plan.layout is not None:
        pipelines = expand_layout(spec.plan.layout, tp, workload.num_layers, global_micro, num_devices, path, cp)
    else:
        pipelines = _explicit_pipelines(spec.plan)
    check_plan_shape(pipelines, tp, workload.num_layers, num_devices, global_micro, path, cp)

    if workload_spec.architecture is None:
        for d in {d for p in pipelines for d in p.devices}:
            if workload.profile_table(types[d].name, training.micro_batch_size, tp) is None:
                raise InputError(path, "workload", f"{workload.name!r} has no architecture and no profile for "
                                 f"device type {types[d].name!r} at TP {tp}",
                                 "add a profile for that device type and TP degree, or an architecture")

    failed: set[int] = set()
    for i, event in enumerate(spec.failures.events):
        for d in event.devices:
            if d >= num_devices:
                raise InputError(path, f"failures.events[{i}].devices", f"device {d} out of range",
                                 f"use ids 0..{num_devices - 1}")
            failed.add(d)
    return Instance(spec, Path(path) if path is not None else None, workload, tuple(types),
                    Plan(tp, tuple(pipelines)), frozenset(failed))


def load_instance(path: str | Path) -> Instance:
    """Read, validate and resolve an instance file (JSON or YAML), or a bundled instance by name
    (`paper-32`) when no such file exists, so that an installed package runs its own examples."""
    path = Path(path)
    if not _is_file(path):
        bundled = bundled_instance(str(path))
        if bundled is None and not path.suffix and path.name == str(path):
            raise InputError(path, "file", "no such file or bundled instance",
                             f"give a path or one of: {', '.join(bundled_instance_names())}")
        path = bundled or path
    return build_instance(read_document(path), path)
