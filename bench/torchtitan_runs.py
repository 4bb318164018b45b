"""torchtitan's published measured runs (bench/data/torchtitan_published.json) as the planner sees them.

Each row's `config` goes through the torchtitan importer exactly as a user's job config would
(interop/torchtitan.py, written to a file and read back); a row whose settings the importer refuses
is counted with the refused key, never priced (the float8 rowwise rows among them: float8.recipe_name);
float8 tensorwise rows are priced as torchao's float8 (perf/fp8.py) and reported per benchmark file
(`source`) and recipe (`fp8`). The measured step time comes from torchtitan's
logged tokens/s per GPU (tps = local tokens / (seconds x TP x PP x CP)) and the measured memory is
its logged `max_reserved` (the caching allocator's reserved peak, which excludes the CUDA context
and NCCL's own buffers), so the prediction compared with it is the allocator's share of the model's
peak: the total less the framework term (metric_definitions in the data file).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from chameleon_opt.errors import InputError
from chameleon_opt.interop.common import ClusterOptions
from chameleon_opt.interop.torchtitan import import_torchtitan
from chameleon_opt.perf.published import NETWORKS

DATA = Path(__file__).resolve().parent / "data" / "torchtitan_published.json"
PROBE = Path(__file__).resolve().parent / "data" / "h200_probe.json"
MODELS = Path(__file__).resolve().parents[1] / "models"


@dataclass(frozen=True)
class TorchtitanRun:
    id: str
    family: str
    gpu: str                      # the die's catalogue name for the compute fit (H100-80, A100-80, ...)
    document: dict[str, Any]      # the imported instance document
    measured_step_s: float
    measured_memory_gib: float | None
    source: str                   # the benchmark file the row is from (its held-out report groups)
    fp8: str | None               # torchao's float8 recipe the job runs (tensorwise), None for bf16
    attention_kernel: str = "flash-v2"  # SDPA's backend (perf.published.ATTENTION_UTILISATION's key)


def family_of(row: dict[str, Any]) -> str:
    """The held-out unit: one model generation on one GPU and one release of the stack."""
    generation = "Llama 2" if row["model"].startswith("llama2") else "Llama 3"
    return f"{generation} ({row['source']['file'].split('/')[-1]}, {row['hardware']['gpu']})"


def load(path: Path = DATA) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(rows, device types named by the rows that the catalogue lacks)."""
    data = json.loads(path.read_text())
    return data["rows"], data["devices"]


def _die(gpu: str) -> str:
    return "H100-80" if gpu.startswith("H100") else gpu


def import_row(row: dict[str, Any], devices: dict[str, Any]) -> TorchtitanRun:
    """The row's job through the importer (InputError when it refuses the job, naming the setting)."""
    gpu = row["hardware"]["gpu"]
    network = NETWORKS.get(_die(gpu), NETWORKS["H100-80"])
    options = ClusterOptions(world_size=row["world_size"], devices_per_node=row["hardware"]["gpus_per_node"],
                             intra_node_gbps=network["intra_node_gbps"], inter_node_gbps=network["inter_node_gbps"])
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / f"{row['id']}.json"
        config.write_text(json.dumps(row["config"]))
        document = import_torchtitan(config, options, [], name=row["id"])
    device = devices.get(gpu)
    if device is not None:
        document["cluster"]["device_type"] = {k: v for k, v in device.items() if k != "note"}
    else:
        document["cluster"]["device_type"] = gpu
    document["cluster"]["network"] = {k: v for k, v in network.items()}
    par = row["config"]["parallelism"]
    non_dp = par.get("tensor_parallel_degree", 1) * par.get("pipeline_parallel_degree", 1) * \
        par.get("context_parallel_degree", 1)
    training = row["config"]["training"]
    step = training["local_batch_size"] * training["seq_len"] / (row["measured"]["tokens_per_s_per_gpu"] * non_dp)
    fp8 = document["training"].get("fp8")
    return TorchtitanRun(row["id"], family_of(row), _die(gpu), document, step, row["measured"].get("memory_gib"),
                         row["source"]["file"].split("/")[-1].removesuffix(".md"), fp8["recipe"] if fp8 else None)


def import_rows(path: Path = DATA) -> tuple[list[TorchtitanRun], dict[str, str]]:
    """Every importable row, and each refused row's id with the setting the importer named."""
    rows, devices = load(path)
    runs, refused = [], {}
    for row in rows:
        try:
            runs.append(import_row(row, devices))
        except InputError as why:
            refused[row["id"]] = why.field
    return runs, refused


def probe_config(probe: dict[str, Any]) -> dict[str, Any]:
    """The torchtitan job config a probe step of bench/device/torchtitan_probe.py runs (one rank)."""
    mode = {"none": {"mode": "none"}, "op": {"mode": "selective", "selective_ac_option": "op"},
            "full": {"mode": "full"}}[probe["ac"]]
    return {"model": {"name": "llama3", "flavor": probe["flavor"]},
            "parallelism": {"data_parallel_shard_degree": -1, "tensor_parallel_degree": 1,
                            "pipeline_parallel_degree": 1, "context_parallel_degree": 1},
            "training": {"local_batch_size": probe["batch"], "seq_len": probe["seq"],
                         "mixed_precision_param": "bfloat16", "mixed_precision_reduce": "float32"},
            "activation_checkpoint": mode, "compile": {"enable": probe["compile"]}}


def probe_runs(path: Path = PROBE) -> list[TorchtitanRun]:
    """The H200 probe's steps (bench/data/h200_probe.json) as imported torchtitan jobs: the config
    through the importer, then the flavour's architecture with the probe's block count (the probe
    builds 2-8 blocks of the flavour's widths) and the loss left eager (the probe compiles the
    blocks alone)."""
    runs = []
    for probe in json.loads(path.read_text())["rows"]:
        name = f"h200-{probe['flavor'].lower()}-L{probe['layers']}-{probe['ac']}-s{probe['seq']}-b{probe['batch']}" + \
            ("-compile" if probe["compile"] else "") + ("" if probe["sdpa"] == "default" else f"-{probe['sdpa']}")
        row = {"id": name, "model": f"llama3-{probe['flavor'].lower()}", "world_size": 1,
               "hardware": {"gpu": "H200-141", "gpus_per_node": 1}, "config": probe_config(probe),
               "source": {"file": "bench/data/h200_probe.json"},
               "measured": {"tokens_per_s_per_gpu": probe["batch"] * probe["seq"] / probe["step_s"],
                            "memory_gib": probe["max_reserved_gib"]}}
        run = import_row(row, {})
        document = run.document
        spec = json.loads((MODELS / f"{document['workload']['model']}.json").read_text())
        document["workload"] = {"inline": {"name": name, "source": spec["source"],
                                           "architecture": {**spec["architecture"], "layers": probe["layers"],
                                                            "seq_len": probe["seq"]}}}
        document["training"]["compiled_loss"] = False
        # torch 2.11's SDPA default on Hopper is cuDNN's (its rates measured: bench/data/h200_sdpa_gemm.jsonl)
        runs.append(replace(run, attention_kernel="flash-v2" if probe["sdpa"] == "flash" else "cudnn"))
    return runs
