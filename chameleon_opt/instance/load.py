"""Reading instance and workload files into checked, resolved objects, with one-line errors.

Parsing is pydantic's (types, ranges, unknown fields); the cross-field checks a schema cannot
express (device ids in range and unique, layer ranges that tile the model, micro-batches that sum
to the global batch) are here. Every failure raises InputError naming file, field and fix.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from chameleon_opt.errors import InputError
from chameleon_opt.instance.devices import CATALOGUE
from chameleon_opt.instance.schema import DeviceType, InstanceSpec, Layout, PlanSpec
from chameleon_opt.plan import Pipeline, Plan, Stage
from chameleon_opt.workload.model import Workload
from chameleon_opt.workload.schema import WorkloadSpec

MODELS_DIR = Path(os.environ.get("CHAMELEON_MODELS", Path(__file__).resolve().parents[2] / "models"))


def read_document(path: Path) -> Any:
    """JSON or YAML (by extension) into Python objects; syntax errors name the line."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError(path, "<file>", "file not found", "check the path") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as err:
        raise InputError(path, "<file>", f"cannot be read ({type(err).__name__})", "give a readable text file") from None
    if path.suffix in (".yaml", ".yml"):
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise InputError(path, "<file>", f"malformed YAML{where}", "fix the YAML syntax") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(path, "<file>", f"malformed JSON at line {err.lineno}, column {err.colno} ({err.msg})",
                         "fix the JSON syntax") from None


def _field_path(loc: tuple[Any, ...]) -> str:
    """pydantic's loc as `plan.pipelines[0].stages[1]`, without union-branch tags."""
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item[:1].isupper() or "[" in item or item in ("str", "int", "float", "bool"):
            continue
        else:
            parts.append(("." if parts else "") + item)
    return "".join(parts) or "<root>"


def _fix_for(error: dict[str, Any]) -> tuple[str, str]:
    """(problem, fix) for one pydantic error, phrased for a person editing the file."""
    kind, ctx, msg = error["type"], error.get("ctx") or {}, error["msg"]
    if kind == "missing":
        return "required field is missing", "add it (see `chameleon-solve schema`)"
    if kind == "extra_forbidden":
        return "unknown field", "remove it or correct its spelling (see `chameleon-solve schema`)"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return f"got {error.get('input')!r}", msg.lower().replace("input should be", "use a value")
    if kind == "value_error":
        return "inconsistent values", str(ctx.get("error", msg))
    if kind == "too_short":
        return "too few items", msg.lower().replace("list should have", "give")
    return f"got {str(error.get('input'))[:60]!r}", msg.lower().replace("input should be", "use")


def parse_model(model: type[BaseModel], data: Any, path: Path | str | None, prefix: str = "") -> Any:
    """Validate `data` against `model`; the first error becomes an InputError."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        errors = sorted(err.errors(), key=lambda e: e["type"] in ("string_type", "model_type", "dict_type"))
        first = errors[0]
        problem, fix = _fix_for(first)
        field = _field_path(tuple(first["loc"]))
        raise InputError(path, f"{prefix}{field}" if field != "<root>" or not prefix else prefix.rstrip("."),
                         problem, fix) from None


def available_models() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


def load_workload_file(path: Path) -> WorkloadSpec:
    return parse_model(WorkloadSpec, read_document(path), path)


def resolve_workload_path(reference: str, base_dir: Path | None) -> Path | None:
    """A catalogue name (`gpt3-175b`) or a path, relative to the instance file first."""
    candidates = [Path(reference)]
    if base_dir is not None:
        candidates.insert(0, base_dir / reference)
    candidates += [MODELS_DIR / reference, MODELS_DIR / f"{reference}.json"]
    return next((c for c in candidates if c.is_file()), None)


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


def expand_layout(layout: Layout, tp: int, num_layers: int, global_micro: int, num_devices: int,
                  path: Path | str | None) -> list[Pipeline]:
    """The explicit pipelines of a regular layout (TP innermost, then stages, then pipelines)."""
    pp, dp = layout.pipeline_parallel, layout.data_parallel
    if pp * dp * tp > num_devices:
        raise InputError(path, "plan.layout", f"needs {pp}x{dp}x{tp} = {pp * dp * tp} devices, the cluster has {num_devices}",
                         "lower data_parallel or pipeline_parallel, or enlarge the cluster")
    if pp > num_layers:
        raise InputError(path, "plan.layout.pipeline_parallel", f"{pp} stages for {num_layers} layers",
                         f"use at most {num_layers} stages")
    counts = layout.layers_per_stage or _balanced_split(num_layers, pp)
    if len(counts) != pp or sum(counts) != num_layers:
        raise InputError(path, "plan.layout.layers_per_stage",
                         f"{len(counts)} stages holding {sum(counts)} layers",
                         f"give {pp} positive counts summing to {num_layers}")
    if global_micro < dp:
        raise InputError(path, "plan.layout.data_parallel", f"{dp} pipelines for {global_micro} micro-batches",
                         "use at most as many pipelines as micro-batches")
    shares = [global_micro // dp + (1 if i < global_micro % dp else 0) for i in range(dp)]
    pipelines, device, bounds = [], 0, [0]
    for c in counts:
        bounds.append(bounds[-1] + c)
    for j in range(dp):
        stages = []
        for s in range(pp):
            stages.append(Stage(tuple(range(device, device + tp)), bounds[s], bounds[s + 1]))
            device += tp
        pipelines.append(Pipeline(tuple(stages), shares[j]))
    return pipelines


def _explicit_pipelines(plan: PlanSpec) -> list[Pipeline]:
    return [Pipeline(tuple(Stage(tuple(st.devices), st.layers[0], st.layers[1]) for st in p.stages), p.micro_batches)
            for p in plan.pipelines or []]


def check_plan_shape(pipelines: list[Pipeline], tp: int, num_layers: int, num_devices: int,
                     global_micro: int, path: Path | str | None) -> None:
    """Cross-field checks of a plan: TP group sizes, device ids, layer tiling, micro-batch sum."""
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
    total = sum(p.micro_batches for p in pipelines)
    if total != global_micro:
        raise InputError(path, "plan.pipelines[*].micro_batches", f"they sum to {total}",
                         f"make them sum to global_batch / micro_batch_size = {global_micro}")


def build_instance(data: Any, path: Path | str | None = None) -> Instance:
    """Validate a parsed document and resolve it into an Instance (raises InputError)."""
    spec: InstanceSpec = parse_model(InstanceSpec, data, path)
    base_dir = Path(path).parent if path is not None else None
    if spec.workload.inline is not None:
        workload_spec = spec.workload.inline
    else:
        found = resolve_workload_path(spec.workload.model or "", base_dir)
        if found is None:
            raise InputError(path, "workload.model", f"no model file {spec.workload.model!r}",
                             f"use a path or one of: {', '.join(available_models())}")
        workload_spec = load_workload_file(found)
    training = spec.training
    if training.global_batch % training.micro_batch_size:
        raise InputError(path, "training.micro_batch_size",
                         f"{training.micro_batch_size} does not divide global_batch {training.global_batch}",
                         "use a micro-batch size that divides the global batch")
    workload = Workload(workload_spec, training.sequence_length, training.dtype_bytes)

    cluster = spec.cluster
    num_devices = cluster.nodes * cluster.devices_per_node
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
        pipelines = expand_layout(spec.plan.layout, tp, workload.num_layers, global_micro, num_devices, path)
    else:
        pipelines = _explicit_pipelines(spec.plan)
    check_plan_shape(pipelines, tp, workload.num_layers, num_devices, global_micro, path)

    if workload_spec.architecture is None:
        for d in {d for p in pipelines for d in p.devices}:
            if workload.profile_table(types[d].name, training.micro_batch_size, tp) is None:
                raise InputError(path, "workload", f"{workload.name} has no architecture and no profile for "
                                 f"device type {types[d].name} at TP {tp}",
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
    """Read, validate and resolve an instance file (JSON or YAML)."""
    path = Path(path)
    return build_instance(read_document(path), path)
