"""Bad input never crashes: one line on stderr naming file, field and fix, exit code 2, no traceback,
no partial output (docs/cli-contract.md).

The explicit cases write a mutated copy of instances/paper-example.json and run the CLI; the property
test mutates valid instances at random and asserts a clean InputError or a sane estimate every time.
"""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from chameleon_opt.cli import app
from chameleon_opt.errors import ChameleonError
from chameleon_opt.instance.load import MAX_COUNT, build_instance
from chameleon_opt.perf.model import PerfModel

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "instances" / "paper-example.json"
STAGE_LAYERS = ([0, 2], [2, 3], [3, 5])  # the example's layers_per_stage [2, 1, 2]


def example() -> dict[str, Any]:
    return json.loads(EXAMPLE.read_text())


def explicit_example() -> dict[str, Any]:
    """The example with its layout written out: pipeline j's stage s runs on device 3j+s, 5 micro-batches each."""
    data = example()
    data["plan"] = {"tensor_parallel": 1, "pipelines": [
        {"micro_batches": 5, "stages": [{"devices": [3 * j + s], "layers": list(layers)}
                                        for s, layers in enumerate(STAGE_LAYERS)]}
        for j in range(4)]}
    return data


def inline_workload() -> dict[str, Any]:
    return example()["workload"]["inline"]


# -- building the cases ----------------------------------------------------------------------------
Writer = Callable[[Path], tuple[Path, Path]]
"""Writes the case's files under tmp_path; returns (instance file, file the error must name)."""


def at(data: Any, keys: tuple[Any, ...]) -> Any:
    for key in keys:
        data = data[key]
    return data


def put(*keys: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda data: at(data, keys[:-1]).__setitem__(keys[-1], value)


def drop(*keys: Any) -> Callable[[dict[str, Any]], None]:
    return lambda data: at(data, keys[:-1]).pop(keys[-1])


def mutated(*changes: Callable[[dict[str, Any]], None], base: Callable[[], dict[str, Any]] = example,
            suffix: str = ".json") -> Writer:
    def write(tmp_path: Path) -> tuple[Path, Path]:
        data = base()
        for change in changes:
            change(data)
        file = tmp_path / f"instance{suffix}"
        file.write_text(yaml.safe_dump(data) if suffix == ".yaml" else json.dumps(data, indent=1))
        return file, file
    return write


def explicit(*changes: Callable[[dict[str, Any]], None]) -> Writer:
    return mutated(*changes, base=explicit_example)


def raw(text: Callable[[], str], suffix: str = ".json") -> Writer:
    def write(tmp_path: Path) -> tuple[Path, Path]:
        file = tmp_path / f"instance{suffix}"
        file.write_text(text())
        return file, file
    return write


def json_text(old: str, new: str) -> Callable[[], str]:
    """The example's text with one literal replaced (for what json.dumps cannot write)."""
    def text() -> str:
        source = EXAMPLE.read_text()
        assert old in source
        return source.replace(old, new, 1)
    return text


def yaml_text(extra: str, without: str | None = None) -> Callable[[], str]:
    """The example as YAML with one top-level entry replaced by hand-written YAML."""
    def text() -> str:
        data = example()
        if without is not None:
            del data[without]
        return yaml.safe_dump(data) + extra
    return text


def with_model_file(model: Any) -> Writer:
    """An instance whose workload is `model` in a separate file next to it (text, or JSON data)."""
    def write(tmp_path: Path) -> tuple[Path, Path]:
        model_file = tmp_path / "workload.json"
        model_file.write_text(model if isinstance(model, str) else json.dumps(model))
        data = example()
        data["workload"] = {"model": "workload.json"}
        file = tmp_path / "instance.json"
        file.write_text(json.dumps(data))
        return file, model_file
    return write


def directory(tmp_path: Path) -> tuple[Path, Path]:
    folder = tmp_path / "folder.json"
    folder.mkdir()
    return folder, folder


def missing_file(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "absent.json", tmp_path / "absent.json"


def negative_params() -> dict[str, Any]:
    workload = inline_workload()
    workload["layer_bytes"]["params"][1] = -1
    return workload


HUGE_ARCHITECTURE = {"name": "huge", "architecture": {"layers": 1 << 40, "hidden": 1024, "heads": 16, "ffn": 4096,
                                                      "vocab": 50000, "seq_len": 2048}}
DEVICE = {"name": "custom", "memory_gib": 80, "peak_tflops": 300}
PROFILE = ("workload", "inline", "profiles", 0)
STAGE = ("plan", "pipelines", 0, "stages")


CASES = [
    # malformed documents
    pytest.param(raw(lambda: EXAMPLE.read_text().rstrip()[:-1]), "file", id="json-truncated"),
    pytest.param(raw(lambda: '{"format": 1,}'), "file", id="json-trailing-comma"),
    pytest.param(raw(lambda: ""), "file", id="json-empty-file"),
    pytest.param(raw(json_text('"inter_node_gbps": 10', '"inter_node_gbps": NaN')),
                 "cluster.network.inter_node_gbps", id="json-nan"),
    pytest.param(raw(json_text('"intra_node_gbps": 100', '"intra_node_gbps": 1e400')),
                 "cluster.network.intra_node_gbps", id="json-overflowing-float"),
    pytest.param(raw(json_text('"nodes": 3', '"nodes": 3' + "0" * 5000)), "file", id="json-5000-digit-int"),
    pytest.param(mutated(put(*PROFILE, "times", "1", "1", 1, value=[1e308, 3, 0])),
                 "workload.inline.profiles[0].times.1.1[1][0]", id="float-that-overflows-a-sum"),
    pytest.param(mutated(put("cluster", "network", "inter_node_gbps", value=5e-324)),
                 "cluster.network.inter_node_gbps", id="float-that-underflows"),
    pytest.param(raw(json_text('"description": ', '"notes": ' + "[" * 100_000 + "]" * 100_000 + ', "description": ')),
                 "file", id="json-nested-too-deep"),
    pytest.param(raw(lambda: "[1, 2]"), "<root>", id="root-is-a-list"),
    pytest.param(directory, "file", id="file-is-a-directory"),
    pytest.param(missing_file, "file", id="file-not-found"),
    # YAML
    pytest.param(raw(lambda: "cluster: [unclosed\n", ".yaml"), "file", id="yaml-malformed"),
    pytest.param(raw(lambda: "name: 2024-13-45\n", ".yaml"), "file", id="yaml-impossible-date"),
    pytest.param(raw(yaml_text("description: &loop [*loop]\n", without="description"), ".yaml"), "description",
                 id="yaml-recursive-alias"),
    pytest.param(raw(yaml_text("1.5: x\n"), ".yaml"), "['1.5']", id="yaml-float-key"),
    pytest.param(mutated(put("cluster", "network", "inter_node_gbps", value=-10), suffix=".yaml"),
                 "cluster.network.inter_node_gbps", id="yaml-negative-bandwidth"),
    pytest.param(raw(lambda: yaml.safe_dump(example()).replace("inter_node_gbps: 10", "inter_node_gbps: .inf"),
                     ".yaml"), "cluster.network.inter_node_gbps", id="yaml-infinity"),
    # unknown and missing fields, wrong types
    pytest.param(mutated(put("clutser", value={})), "clutser", id="unknown-top-level"),
    pytest.param(mutated(put("cluster", "network", "bandwidth_gbps", value=5)), "cluster.network.bandwidth_gbps",
                 id="unknown-nested"),
    pytest.param(mutated(put("cluster", "Nodes", value=3)), "cluster.Nodes", id="unknown-capitalised"),
    pytest.param(mutated(put("training", "a\nb", value=3)), "training['a\\nb']", id="unknown-multiline-key"),
    pytest.param(mutated(put("cluster", "device_type", value={**DEVICE, "tflops": 1})), "cluster.device_type.tflops",
                 id="unknown-in-inline-device"),
    pytest.param(mutated(drop("training", "global_batch")), "training.global_batch", id="missing-global-batch"),
    pytest.param(mutated(drop("cluster", "network")), "cluster.network", id="missing-network"),
    pytest.param(mutated(drop("plan")), "plan", id="missing-plan"),
    pytest.param(mutated(put("cluster", "device_type", value={"name": "x", "memory_gib": 1})),
                 "cluster.device_type.peak_tflops", id="missing-in-inline-device"),
    pytest.param(mutated(put("cluster", "nodes", value="three")), "cluster.nodes", id="string-for-int"),
    pytest.param(mutated(put("training", "precision", value="bf8")), "training.precision", id="bad-precision"),
    pytest.param(mutated(put("format", value=2)), "format", id="bad-format-version"),
    # negative or zero sizes, absurd counts
    pytest.param(mutated(put("cluster", "nodes", value=-1)), "cluster.nodes", id="negative-nodes"),
    pytest.param(mutated(put("training", "global_batch", value=0)), "training.global_batch", id="zero-global-batch"),
    pytest.param(mutated(put("training", "micro_batch_size", value=0)), "training.micro_batch_size",
                 id="zero-micro-batch-size"),
    pytest.param(mutated(put("cluster", "device_type", value={**DEVICE, "memory_gib": 0})),
                 "cluster.device_type.memory_gib", id="zero-device-memory"),
    pytest.param(mutated(put("cluster", "network", "inter_node_gbps", value=-10)), "cluster.network.inter_node_gbps",
                 id="negative-bandwidth"),
    pytest.param(mutated(put("workload", "inline", value=negative_params())), "workload.inline.layer_bytes.params[1]",
                 id="negative-layer-bytes"),
    pytest.param(mutated(put(*PROFILE, "times", "1", "1", 1, value=[2, -3, 0])), "workload.inline.profiles[0]",
                 id="negative-profile-time"),
    pytest.param(mutated(put("failures", "events", 0, "time_s", value=-1)), "failures.events[0].time_s",
                 id="negative-failure-time"),
    pytest.param(mutated(put("training", "global_batch", value=1 << 40)), "training.global_batch",
                 id="too-many-micro-batches"),
    pytest.param(mutated(put("cluster", "nodes", value=10 ** 9)), "cluster.nodes", id="too-many-devices"),
    pytest.param(mutated(put("cluster", "nodes", value=1 << 70)), "cluster.nodes", id="int-beyond-64-bits"),
    # workload
    pytest.param(mutated(put(*PROFILE, "times", value={})), "workload.inline.profiles[0].times",
                 id="profile-without-times"),
    pytest.param(mutated(drop("workload", "inline", "layer_bytes"), put(*PROFILE, "times", value={"1": {}})),
                 "workload.inline.profiles[0].times", id="profile-without-tp-entry"),
    pytest.param(mutated(put("workload", "inline", "layer_bytes", value={
        "params": [], "activation_bytes_per_sample": [], "boundary_bytes_per_sample": []}),
        put(*PROFILE, "times", value={"1": {"1": []}})), "workload.inline.layer_bytes", id="zero-layers"),
    pytest.param(mutated(put("workload", "inline", value=HUGE_ARCHITECTURE)),
                 "workload.inline.architecture.layers", id="too-many-layers"),
    pytest.param(mutated(put("workload", "model", value="gpt3-175b")), "workload", id="model-and-inline"),
    pytest.param(mutated(put("workload", value={"model": "no-such-model"})), "workload.model", id="model-not-found"),
    pytest.param(mutated(put("workload", value={"model": "m" * 5000})), "workload.model", id="model-name-too-long"),
    pytest.param(mutated(put("workload", value={"model": "bad\0name"})), "workload.model", id="model-name-nul-byte"),
    pytest.param(with_model_file("{"), "file", id="model-file-malformed"),
    pytest.param(with_model_file(negative_params()), "layer_bytes.params[1]", id="model-file-negative-size"),
    pytest.param(with_model_file(HUGE_ARCHITECTURE), "architecture.layers", id="model-file-too-many-layers"),
    # devices
    pytest.param(mutated(put("cluster", "device_type", value="B200")), "cluster.device_type",
                 id="unknown-device-type"),
    pytest.param(mutated(put("cluster", "overrides", value=[{"devices": [0], "device_type": "B200"}])),
                 "cluster.overrides[0].device_type", id="unknown-override-device-type"),
    pytest.param(mutated(put("cluster", "overrides", value=[{"devices": [12], "device_type": "example"}])),
                 "cluster.overrides[0].devices", id="override-device-out-of-range"),
    pytest.param(mutated(put("cluster", "device_type", value="A100-80")), "workload", id="device-type-not-profiled"),
    pytest.param(mutated(put("failures", "events", 0, "devices", value=[12])), "failures.events[0].devices",
                 id="failure-device-out-of-range"),
    pytest.param(explicit(put("plan", "pipelines", 3, "stages", 2, "devices", value=[12])),
                 "plan.pipelines[3].stages[2].devices", id="plan-device-out-of-range"),
    pytest.param(explicit(put("plan", "pipelines", 1, "stages", 0, "devices", value=[0])),
                 "plan.pipelines[1].stages[0].devices", id="plan-device-repeated"),
    pytest.param(explicit(put(*STAGE, 0, "devices", value=[-1])), "plan.pipelines[0].stages[0].devices[0]",
                 id="plan-device-negative"),
    pytest.param(explicit(put(*STAGE, 0, "devices", value=[0, 1])), "plan.pipelines[0].stages[0].devices",
                 id="plan-tp-group-size"),
    # layers
    pytest.param(explicit(put(*STAGE, 1, "layers", value=[1, 3])), "plan.pipelines[0].stages[1].layers",
                 id="layers-overlap"),
    pytest.param(explicit(put("plan", "pipelines", 2, "stages", 2, "layers", value=[4, 5])),
                 "plan.pipelines[2].stages[2].layers", id="layers-gap"),
    pytest.param(explicit(put(*STAGE, 2, "layers", value=[3, 4])), "plan.pipelines[0].stages", id="layers-miss-head"),
    pytest.param(explicit(put(*STAGE, 1, "layers", value=[2, 2])), "plan.pipelines[0].stages[1].layers",
                 id="layers-empty-range"),
    pytest.param(explicit(put(*STAGE, 1, "layers", value=[2])), "plan.pipelines[0].stages[1].layers[1]",
                 id="layers-not-a-pair"),
    pytest.param(mutated(put("plan", "layout", "layers_per_stage", value=[2, 1, 1])), "plan.layout.layers_per_stage",
                 id="layout-misses-layers"),
    pytest.param(mutated(put("plan", "layout", "layers_per_stage", value=[])), "plan.layout.layers_per_stage",
                 id="layout-empty-layer-list"),
    pytest.param(mutated(put("plan", "layout", value={"pipeline_parallel": 6, "data_parallel": 1})),
                 "plan.layout.pipeline_parallel", id="layout-more-stages-than-layers"),
    pytest.param(mutated(put("plan", "layout", "data_parallel", value=5)), "plan.layout", id="layout-too-many-devices"),
    pytest.param(mutated(put("plan", "pipelines", value=[])), "plan", id="layout-and-pipelines"),
    # micro-batches
    pytest.param(explicit(put("plan", "pipelines", 0, "micro_batches", value=4)), "plan.pipelines[*].micro_batches",
                 id="micro-batches-miss-global-batch"),
    pytest.param(explicit(put("plan", "pipelines", value=[])), "plan.pipelines[*].micro_batches", id="no-pipelines"),
    pytest.param(mutated(put("training", "micro_batch_size", value=3)), "training.micro_batch_size",
                 id="micro-batch-size-not-dividing"),
    pytest.param(mutated(put("training", "global_batch", value=2)), "plan.layout.data_parallel",
                 id="fewer-micro-batches-than-pipelines"),
]


def one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def assert_names(line: str, file: Path, field: str) -> None:
    """The contract's line: `error: FILE: FIELD: problem; fix: what to do`."""
    assert line.startswith(f"error: {file}: {field}: "), line
    assert "; fix: " in line, line


@pytest.mark.parametrize("write, field", CASES)
def test_bad_input_is_one_line_exit_2(tmp_path: Path, write: Writer, field: str) -> None:
    instance, named = write(tmp_path)
    runner = CliRunner()
    result = runner.invoke(app, ["validate", str(instance)])
    assert result.exit_code == 2, (result.stdout, result.stderr, result.exception)
    assert_names(one_line(result.stderr), named, field)
    assert result.stdout == ""  # no partial output

    result = runner.invoke(app, ["estimate", "--json", str(instance)])
    assert result.exit_code == 2, (result.stdout, result.stderr, result.exception)
    assert_names(one_line(result.stderr), named, field)
    [line] = result.stdout.splitlines()  # --json: one object on stdout, the error's
    payload = json.loads(line)
    assert payload["error"] == "InputError" and payload["exit_code"] == 2
    assert f"{named}: {field}: " in payload["reason"]


@pytest.mark.parametrize("write", [
    pytest.param(mutated(), id="json"),
    pytest.param(mutated(suffix=".yaml"), id="yaml"),
    pytest.param(explicit(), id="explicit-pipelines"),
    pytest.param(with_model_file(inline_workload()), id="model-file-next-to-instance"),
])
def test_valid_variants_estimate_the_paper_example(tmp_path: Path, write: Writer) -> None:
    """The controls: the same instance written four ways validates and takes method.md's 35 s."""
    instance, _ = write(tmp_path)
    runner = CliRunner()
    result = runner.invoke(app, ["validate", str(instance)])
    assert result.exit_code == 0 and result.stderr == "", result.stderr
    result = runner.invoke(app, ["estimate", "--json", str(instance)])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["iteration_time_s"] == pytest.approx(35.0)


def run_clis(*commands: tuple[str, ...]) -> list[subprocess.CompletedProcess[str]]:
    """Each command in a real CLI process, side by side: each is mostly an interpreter start and
    the imports, so on two cores this about halves the wait."""
    started = [subprocess.Popen([sys.executable, "-m", "chameleon_opt.cli", *command], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=ROOT) for command in commands]
    try:
        outputs = [p.communicate(timeout=60) for p in started]
        return [subprocess.CompletedProcess(p.args, p.returncode, *out) for p, out in zip(started, outputs)]
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.parametrize("write, field", [
    pytest.param(raw(lambda: EXAMPLE.read_text().rstrip()[:-1]), "file", id="json-truncated"),
    pytest.param(explicit(put(*STAGE, 1, "layers", value=[1, 3])), "plan.pipelines[0].stages[1].layers",
                 id="layers-overlap"),
])
def test_real_process_exit_code_and_stderr(tmp_path: Path, write: Writer, field: str) -> None:
    instance, named = write(tmp_path)
    validated, estimated = run_clis(("validate", str(instance)),
                                    ("estimate", "--json", "--after-failure", str(instance)))
    assert validated.returncode == 2 and validated.stdout == ""
    assert_names(one_line(validated.stderr), named, field)
    assert estimated.returncode == 2
    assert_names(one_line(estimated.stderr), named, field)
    assert json.loads(estimated.stdout)["exit_code"] == 2


# -- the property ------------------------------------------------------------------------------------
VIRTUAL = Path("/nonexistent-dir/mutated-instance.json")
"""No file is read: build_instance gets the data; a folder that does not exist keeps relative
`workload.model` references from finding files by chance."""

LEAVES = st.one_of(
    st.integers(-3, 40),
    st.sampled_from([0, -1, MAX_COUNT + 1, 2 ** 31, 2 ** 53, 2 ** 63, -2 ** 63 - 1, 10 ** 30, 10 ** 400]),
    st.floats(-1e6, 1e6),
    st.sampled_from([0.0, -0.0, 0.5, 1e-9, 1e12, 1e-31, 1e31, 5e-324, 1e308, math.nan, math.inf, -math.inf]),
    st.text(max_size=8),
    st.sampled_from(["", "example", "A100-80", "bf16", "fp32", "a\nb", "gpt3-175b", "1", "2"]),
    st.booleans(),
    st.none(),
)
KEYS = st.one_of(st.text(max_size=6), st.sampled_from(
    ["Nodes", "str", "int", "[0]", "DeviceType", "1", "2", "name", "layers", "model", "architecture",
     "sequence_length", "overrides", "layout", "pipelines", "kv_heads"]))
VALUES = st.recursive(LEAVES, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=3),
                      max_leaves=8)


def slots(data: Any) -> list[tuple[Any, Any]]:
    """(container, key) of every value below the root, in a fixed order."""
    found: list[tuple[Any, Any]] = []
    stack = [data]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            found.append((node, key))
            stack.append(value)
    return found


@st.composite
def mutated_documents(draw: st.DrawFn) -> dict[str, Any]:
    """The example (layout or explicit pipelines) after 1-3 random edits: delete a key at any depth,
    insert a key, replace any value, or duplicate or drop a list element."""
    data = draw(st.sampled_from([example, explicit_example]))()
    for _ in range(draw(st.integers(1, 3))):
        everything = slots(data)
        kind = draw(st.sampled_from(["delete", "insert", "replace", "list"]))
        if kind == "delete":
            keyed = [(c, k) for c, k in everything if isinstance(c, dict)]
            if keyed:
                container, key = draw(st.sampled_from(keyed))
                del container[key]
        elif kind == "insert":
            target = draw(st.sampled_from([data] + [c[k] for c, k in everything if isinstance(c[k], dict)]))
            target[draw(KEYS)] = draw(VALUES)
        elif kind == "replace" and everything:
            container, key = draw(st.sampled_from(everything))
            container[key] = draw(VALUES)
        else:
            lists = [c[k] for c, k in everything if isinstance(c[k], list) and c[k]]
            if lists:
                target = draw(st.sampled_from(lists))
                i = draw(st.integers(0, len(target) - 1))
                if draw(st.booleans()):
                    target.insert(i, copy.deepcopy(target[i]))
                else:
                    del target[i]
    return data


@settings(max_examples=1000, deadline=None)
@given(mutated_documents())
def test_mutated_instances_fail_cleanly_or_estimate(data: dict[str, Any]) -> None:
    try:
        instance = build_instance(data, VIRTUAL)
        estimate = PerfModel(instance).evaluate(instance.plan)
    except ChameleonError as err:
        message = str(err)
        assert len(message.splitlines()) == 1, message
        assert message.startswith(f"{VIRTUAL}: ") and "; fix: " in message, message
        field = message.removeprefix(f"{VIRTUAL}: ").split(": ")[0]
        assert field.strip(), message
        return
    assert math.isfinite(estimate.iteration_time_s) and estimate.iteration_time_s >= 0, estimate


# -- extreme but valid numbers through the planner ------------------------------------------------------
RUNTIME4 = ROOT / "instances" / "runtime-cpu-4.json"
EXTREME_FIELDS: dict[tuple[str, ...], list[Any]] = {
    ("cluster", "device_type", "memory_gib"): [1e12, 1e6, 0.2],
    ("cluster", "device_type", "reserved_gib"): [0.0, 1e-9],
    ("cluster", "device_type", "peak_tflops"): [1e-9, 1e9],
    ("cluster", "device_type", "efficiency"): [1e-9, 1.0],
    ("cluster", "network", "intra_node_gbps"): [1e-9, 1e12],
    ("cluster", "network", "inter_node_gbps"): [1e-9, 1e12],
    ("cluster", "network", "intra_node_latency_us"): [0.0, 1e-9, 1e9],
    ("training", "global_batch"): [20_000, 2, 16],
    ("failures", "mtbf_hours_per_device"): [1e-9, 1e9],
    ("failures", "next_fault_s"): [1e-9, 1e12],
}
"""Fields of runtime-cpu-4.json (one device failure added) and values at the edges of what they allow:
1e12 GiB, 1e-9 s, 10,000 micro-batches. A million micro-batches plans cleanly too (exit 0), but in
about a minute: the 1F1B longest path (perf/pipeline.py) is simulated micro-batch by micro-batch, so
it stays out of a property run in CI."""


@st.composite
def extreme_documents(draw: st.DrawFn) -> dict[str, Any]:
    data = json.loads(RUNTIME4.read_text())
    data["failures"]["events"] = [{"time_s": 1.0, "devices": [draw(st.integers(0, 3))]}]
    for path in draw(st.lists(st.sampled_from(sorted(EXTREME_FIELDS)), min_size=1, max_size=3, unique=True)):
        at(data, path[:-1])[path[-1]] = draw(st.sampled_from(EXTREME_FIELDS[path]))
    if "next_fault_s" in data["failures"]:
        data["failures"].pop("mtbf_hours_per_device", None)
    return data


@settings(max_examples=30, deadline=None)
@given(extreme_documents())
def test_plan_survives_extreme_valid_numbers(tmp_path_factory: pytest.TempPathFactory, data: dict[str, Any]) -> None:
    """`plan` runs the rerouting MILP and the reconfiguration search on them: a decision (exit 0)
    or a contract exit with its reason, never a traceback (1e12 GiB once broke the rerouting MILP)."""
    path = tmp_path_factory.mktemp("extreme") / "instance.json"
    path.write_text(json.dumps(data))
    result = CliRunner().invoke(app, ["plan", "--json", "--time-limit", "2", str(path)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code in (0, 2, 3, 4, 5), (result.exit_code, result.stderr)
    payload = json.loads(result.stdout)
    assert ("error" in payload) == (result.exit_code != 0), payload


def test_rerouting_with_a_trillion_gib_per_device(tmp_path: Path) -> None:
    """The fuzzer's reroute-mem.json: memory_gib 1e12 made HiGHS's solution unreadable (IndexError)."""
    data = json.loads(RUNTIME4.read_text())
    data["cluster"]["device_type"]["memory_gib"] = 1e12
    path = tmp_path / "reroute-mem.json"
    path.write_text(json.dumps(data))
    for policy in ("reroute", "auto"):
        result = CliRunner().invoke(app, ["plan", "--json", "--policy", policy, str(path)])
        assert result.exit_code == 0, (result.stderr, result.exception)
        assert json.loads(result.stdout)["policy"] in ("reroute", "hybrid", "reconfigure")


def test_a_lone_surrogate_in_a_name_is_printed_escaped(tmp_path: Path) -> None:
    """The fuzzer's surrogate.json: a name with a lone UTF-16 surrogate (valid JSON, not encodable
    as UTF-8) crashed the human output of validate, estimate and plan with UnicodeEncodeError."""
    data = example()
    data["name"] = "bad\ud800name"
    path = tmp_path / "surrogate.json"
    path.write_text(json.dumps(data))
    for done in run_clis(*((command, str(path)) for command in ("validate", "estimate", "plan"))):
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        assert "bad\\ud800name" in done.stdout


@pytest.mark.parametrize("bad, where", [
    (float("nan"), "table[17][1]"), (1e31, "table[17][1]"), (-1e-31, "table[17][1]"), (1 << 63, "table[17][1]"),
    (-(1 << 63) - 1, "table[17][1]"),
])
def test_long_tables_are_checked_as_blocks_and_the_refused_value_named(bad: Any, where: str) -> None:
    """A long table (numpy reads it as one block) refuses what the item-by-item walk refuses, and
    names the value's place; 64-bit integers and in-range floats, mixed, pass."""
    from chameleon_opt.instance.load import _check_numbers

    table = [[1.5, 3, 0.0] for _ in range(40)]
    table[5][1] = (1 << 63) - 1
    table[6][1] = -(1 << 63)
    _check_numbers({"table": table}, "t.json")
    table[17][1] = bad
    with pytest.raises(ChameleonError, match=r"t\.json: " + where.replace("[", r"\[").replace("]", r"\]")):
        _check_numbers({"table": table}, "t.json")
    flat = [2] * 20 + [bad]
    with pytest.raises(ChameleonError, match=r"\[20\]"):
        _check_numbers(flat, "t.json")
