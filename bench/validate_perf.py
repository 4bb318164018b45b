"""Validate the performance model against measured iteration times and memory peaks.

1. Sailor's 9 OPT-350M plans measured on GH200 nodes (../shared/data/sailor/measured-plans): the
   model predicts each from the matching profile. The one time parameter it cannot know (the
   per-send cost of DeepSpeed's blocking pipeline p2p) is fitted, and every plan is also predicted
   leave-one-out. Memory: every plan's measured peak (`max_mem`) against the model's largest stage,
   with one fitted constant (the framework overhead), also leave-one-out.
   Transfer: OPT-350M's own GH200 profile withheld, the plans predicted from its profiles on other
   devices scaled by the device ratio calibrated on other models (and the other way round: A100-40
   without its OPT-350M profile, compared with that profile).
2. Megatron-LM's GPT-3 175B runs (Narayanan et al., SC'21: TP 8, PP 12, DP 4/8/16, global batch
   1536, micro-batch 1, recomputation; 153/149/141 TFLOP/s per A100), predicted from the
   architecture alone. The A100's sustained efficiency is fitted on DP 4 and the others are
   predictions. Target: within 15%.

3. The published tables (../shared/data/published: Megatron-LM, llm-foundry, DeepSpeed, NeMo), each
   row an instance (chameleon_opt/perf/published.py; rows with context parallelism, MoE, CPU
   offload, LoRA or an unknown GPU refused and counted by reason). Before: the catalogue's FLOP
   efficiencies. After: per-die compute efficiency (A100 40/80 GB one die) and one memory-traffic
   efficiency fitted leave-one-family-out (every family predicted from a fit on the others only);
   flash-attention kernels at their published utilisation (published.ATTENTION_UTILISATION), FSDP's
   per-micro-batch collectives, Megatron's layer split and overlap flags as the trainers run them
   (docs/performance-model.md). The cost of overlapping ZeRO-3 collectives with compute is fitted on
   one FSDP family and reported on the other (llm-foundry <-> torchtitan). Megatron-DeepSpeed's rows
   are priced from the others' fit and fitted into none (REPORT_ONLY_FAMILIES). Per-source and
   per-family error tables, the stated memory peaks (also of rows whose step time alone is refused),
   and a predicted-vs-measured plot
   (validate_perf_published.png).
   fp8 rows (perf/fp8.py) in no bf16 fit: the fp8 GEMM ratio fitted on one source's fp8 rows and
   reported on the others' (validate_perf_fp8.json; a section of validate_perf_published.md).
   Rows on a die no bf16 row measures (B200: NeMo's long-sequence table) in no fit at all: priced at
   their proxy die's fitted efficiency (published.PROXY_DIE) and each source's fp8 ratio, reported
   per device (validate_perf_proxy.json).

Writes bench/out/validate_perf.{json,md,png} and prints the tables.
Run: python bench/validate_perf.py [--sailor-dir ../shared/data/sailor] [--published-dir
../shared/data/published] [--out bench/out]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # bench.torchtitan_runs when run as a script

from chameleon_opt.instance.load import MODELS_DIR, build_instance  # noqa: E402
from chameleon_opt.perf.calibrate import calibrate  # noqa: E402
from chameleon_opt.perf.model import GIB, PerfModel  # noqa: E402
from chameleon_opt.perf.sailor_fit import (calibrate_sailor, fit_overhead, measured_plans, peak_memory,
                                           sailor_document, sailor_network)
from chameleon_opt.workload.model import Workload  # noqa: E402
from chameleon_opt.workload.schema import WorkloadSpec  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
console = Console(width=140)

MEGATRON_RUNS = [  # (data parallel, measured TFLOP/s per GPU)
    (4, 153.0), (8, 149.0), (16, 141.0)]
SELENE_NETWORK = {  # DGX A100: NVLink3 (NCCL all-reduce bus bandwidth ~230 GB/s), 8 x HDR 200 Gb/s per node
    "intra_node_gbps": 230.0, "intra_node_latency_us": 5.0, "inter_node_gbps": 25.0, "inter_node_latency_us": 10.0}


def predict(document: dict, **model_args) -> float:
    instance = build_instance(document, f"<{document['name']}>")
    return PerfModel(instance, **model_args).evaluate(instance.plan).iteration_time_s


def without_profile(device: str) -> dict:
    """OPT-350M's catalogue workload, inline, with its profile on `device` removed."""
    spec = json.loads((MODELS_DIR / "opt-350m.json").read_text())
    spec["profiles"] = [p for p in spec["profiles"] if p["device_type"] != device]
    return spec


def sailor_validation(sailor_dir: Path) -> dict:
    base_network = sailor_network(sailor_dir)
    plans = measured_plans(sailor_dir)
    documents = [p for _, p in plans]
    measured = [d["real"] for d in documents]

    def predictions(overhead_us: float, withheld: bool = False) -> list[float]:
        network = {**base_network, "p2p_overhead_us": overhead_us}
        out = []
        for name, doc in plans:
            document = sailor_document(name, doc, network)
            args = {}
            if withheld:
                document["workload"] = {"inline": without_profile("GH-96")}
                args["calibration"] = transfer_calibration
            out.append(predict(document, **args))
        return out

    transfer_calibration = calibrate_sailor(None, {("opt-350m", "GH-96")})

    uncalibrated = np.array(predictions(0.0))
    fit = calibrate(predictions, measured, np.arange(0.0, 5001.0, 100.0))
    transfer = np.array(predictions(fit.value, withheld=True))
    overhead, loo_overhead, _ = fit_overhead(sailor_dir)
    rows = []
    for i, (name, doc) in enumerate(plans):
        template = doc["pipeline_list"][0]
        old_style = sailor_document(name, doc, base_network, {"attention": "flash", "framework_overhead_gib": 0.0})
        memory = peak_memory(sailor_document(name, doc, base_network, {"framework_overhead_gib": overhead}))
        memory_loo = peak_memory(sailor_document(name, doc, base_network,
                                                 {"framework_overhead_gib": loo_overhead[i]}))
        rows.append({
            "plan": name, "stages": template["num_stages"],
            "dp": template["dp"][0], "mbs": doc["mbs"], "gbs": doc["gbs"], "measured_s": measured[i],
            "predicted_uncalibrated_s": float(uncalibrated[i]), "predicted_s": float(fit.predictions[i]),
            "predicted_loo_s": float(fit.loo_predictions[i]),
            "error": float(fit.predictions[i] / measured[i] - 1),
            "error_uncalibrated": float(uncalibrated[i] / measured[i] - 1),
            "error_loo": float(fit.loo_predictions[i] / measured[i] - 1),
            "predicted_transfer_s": float(transfer[i]), "error_transfer": float(transfer[i] / measured[i] - 1),
            "measured_mem_gib": doc["max_mem"] / GIB, "predicted_mem_gib": memory / GIB,
            "error_mem": memory / doc["max_mem"] - 1, "predicted_mem_loo_gib": memory_loo / GIB,
            "error_mem_loo": memory_loo / doc["max_mem"] - 1,
            "predicted_mem_flash_no_overhead_gib": peak_memory(old_style) / GIB,
            "error_mem_flash_no_overhead": peak_memory(old_style) / doc["max_mem"] - 1})
    summary = {key: {"median_abs": float(np.median(np.abs([r[key] for r in rows]))),
                     "worst_abs": float(np.max(np.abs([r[key] for r in rows])))}
               for key in ("error_uncalibrated", "error", "error_loo", "error_transfer", "error_mem",
                           "error_mem_loo", "error_mem_flash_no_overhead")}
    return {"network": {"inter_latency_us": base_network["inter_node_latency_us"],
                        "inter_gbps": base_network["inter_node_gbps"],
                        "intra_latency_us": base_network["intra_node_latency_us"],
                        "intra_gbps": base_network["intra_node_gbps"]},
            "p2p_overhead_us": fit.value, "framework_overhead_gib": overhead,
            "framework_overhead_loo_gib": loo_overhead, "rows": rows, "summary": summary,
            "transfer_source": "opt-350m profiles on other devices x device ratio calibrated without opt-350m@GH-96",
            "profile_transfer": profile_transfer()}


def profile_transfer() -> list[dict]:
    """Each direction: a device's OPT-350M profile withheld, its per-micro-batch time (all layers)
    predicted from the other devices' OPT-350M profiles and a calibration fitted without it."""
    spec = json.loads((MODELS_DIR / "opt-350m.json").read_text())
    out = []
    for device in ("GH-96", "A100-40"):
        calibration = calibrate_sailor(None, {("opt-350m", device)})
        reduced = Workload(WorkloadSpec.model_validate(without_profile(device)), None, 2)
        truth = Workload(WorkloadSpec.model_validate(spec), None, 2)
        for tp in (1, 2, 4):
            for mbs in (1, 2, 4, 8):
                own = truth.profile_table(device, mbs, tp)
                moved = calibration.transfer(reduced, device, mbs, tp)
                if own is None or moved is None:
                    continue
                predicted = float((moved.table.forward_s + moved.table.backward_s).sum())
                actual = float((own.forward_s + own.backward_s).sum())
                out.append({"device": device, "tp": tp, "mbs": mbs, "profile_s": actual, "predicted_s": predicted,
                            "error": predicted / actual - 1})
    return out


def megatron_document(dp: int, efficiency: float) -> dict:
    tp, pp = 8, 12
    return {
        "format": 1, "name": f"megatron-gpt3-175b-dp{dp}",
        "cluster": {"nodes": tp * pp * dp // 8, "devices_per_node": 8,
                    "device_type": {"name": "A100-80", "memory_gib": 80, "peak_tflops": 312,
                                    "efficiency": efficiency, "memory_bandwidth_gbps": 2039},
                    "network": SELENE_NETWORK},
        "workload": {"model": "gpt3-175b"},
        "training": {"global_batch": 1536, "micro_batch_size": 1, "sequence_length": 2048,
                     "activation_recomputation": True},
        "plan": {"tensor_parallel": tp, "layout": {"pipeline_parallel": pp, "data_parallel": dp}},
    }


def megatron_flops(batch: int = 1536, seq: int = 2048, layers: int = 96, hidden: int = 12288,
                   vocab: int = 51200) -> float:
    """FLOPs per iteration as Megatron-LM counts them (SC'21, Eq. 3, with recomputation)."""
    return 96.0 * batch * seq * layers * hidden ** 2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


def megatron_validation() -> dict:
    flops = megatron_flops()

    def tflops(efficiency: float, runs: list[tuple[int, float]]) -> list[float]:
        return [flops / predict(megatron_document(dp, efficiency)) / (96 * dp) / 1e12 for dp, _ in runs]

    measured = [m for _, m in MEGATRON_RUNS]
    # Fit on DP 4 alone (only its column is priced over the grid): the other runs are then predictions.
    grid = np.arange(0.30, 0.95, 0.0025)
    fitted = np.array([tflops(e, MEGATRON_RUNS[:1])[0] for e in grid])
    best = int(np.argmin(np.abs(fitted / measured[0] - 1)))
    efficiency = float(grid[best])
    rows = [{"data_parallel": dp, "gpus": 96 * dp, "measured_tflops": m, "predicted_tflops": float(p),
             "error": float(p / m - 1), "predicted_mem_gib": peak_memory(megatron_document(dp, efficiency)) / GIB}
            for (dp, m), p in zip(MEGATRON_RUNS, tflops(efficiency, MEGATRON_RUNS))]
    return {"efficiency_fitted_on_dp4": efficiency, "rows": rows,
            "worst_abs_error_unseen": float(max(abs(r["error"]) for r in rows[1:]))}


def render(sailor: dict | None, megatron: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# Performance model validation", ""]
    if sailor is not None:
        table = Table(title=f"Sailor OPT-350M on GH200 (p2p overhead fitted: {sailor['p2p_overhead_us']:.0f} us)")
        for col in ("plan", "stages", "dp", "mbs", "measured s", "pred (no fit)", "err", "pred", "err",
                    "pred LOO", "err LOO"):
            table.add_column(col, justify="right")
        lines += ["## Sailor OPT-350M plans (GH200)", "",
                  f"Link fitted to Sailor's curve: inter-node {sailor['network']['inter_gbps']:.1f} GB/s, "
                  f"{sailor['network']['inter_latency_us']:.0f} us. Fitted p2p overhead: "
                  f"{sailor['p2p_overhead_us']:.0f} us per send.", "",
                  "| plan | stages | dp | mbs | measured s | predicted s (no fit) | err | predicted s | err | LOO s | err LOO |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in sailor["rows"]:
            cells = [r["plan"], str(r["stages"]), str(r["dp"]), str(r["mbs"]), f"{r['measured_s']:.3f}",
                     f"{r['predicted_uncalibrated_s']:.3f}", f"{100 * r['error_uncalibrated']:+.1f}%",
                     f"{r['predicted_s']:.3f}", f"{100 * r['error']:+.1f}%",
                     f"{r['predicted_loo_s']:.3f}", f"{100 * r['error_loo']:+.1f}%"]
            table.add_row(*cells)
            lines.append("| " + " | ".join(cells) + " |")
        console.print(table)
        lines.append("")
        for key, label in (("error_uncalibrated", "no fit"), ("error", "fitted"), ("error_loo", "leave-one-out"),
                           ("error_transfer", "transfer (own GH200 profile withheld)")):
            s = sailor["summary"][key]
            text = f"time, {label}: median |error| {100 * s['median_abs']:.1f}%, worst {100 * s['worst_abs']:.1f}%"
            console.print(text)
            lines.append(f"- {text}")
        lines += ["", f"### Memory (framework overhead fitted: {sailor['framework_overhead_gib']:.2f} GiB)", "",
                  "| plan | measured GiB | predicted GiB | err | LOO GiB | err LOO | old model (flash, no overhead) | err |",
                  "|---|---|---|---|---|---|---|---|"]
        table = Table(title=f"Memory peaks (framework overhead fitted: {sailor['framework_overhead_gib']:.2f} GiB)")
        for col in ("plan", "measured GiB", "pred", "err", "pred LOO", "err LOO", "transfer time s", "err"):
            table.add_column(col, justify="right")
        for r in sailor["rows"]:
            cells = [r["plan"], f"{r['measured_mem_gib']:.2f}", f"{r['predicted_mem_gib']:.2f}",
                     f"{100 * r['error_mem']:+.1f}%", f"{r['predicted_mem_loo_gib']:.2f}",
                     f"{100 * r['error_mem_loo']:+.1f}%", f"{r['predicted_mem_flash_no_overhead_gib']:.2f}",
                     f"{100 * r['error_mem_flash_no_overhead']:+.1f}%"]
            lines.append("| " + " | ".join(cells) + " |")
            table.add_row(*cells[:6], f"{r['predicted_transfer_s']:.3f}", f"{100 * r['error_transfer']:+.1f}%")
        console.print(table)
        lines.append("")
        for key, label in (("error_mem", "fitted"), ("error_mem_loo", "leave-one-out"),
                           ("error_mem_flash_no_overhead", "flash attention, no overhead (the old model's terms)")):
            s = sailor["summary"][key]
            text = f"memory, {label}: median |error| {100 * s['median_abs']:.1f}%, worst {100 * s['worst_abs']:.1f}%"
            console.print(text)
            lines.append(f"- {text}")
        lines += ["", "### Profile transfer (a device's OPT-350M profile withheld)", "",
                  "| device | TP | mbs | profile s | predicted s | err |", "|---|---|---|---|---|---|"]
        for r in sailor["profile_transfer"]:
            lines.append(f"| {r['device']} | {r['tp']} | {r['mbs']} | {r['profile_s']:.4f} | {r['predicted_s']:.4f} | "
                         f"{100 * r['error']:+.1f}% |")
        for device in ("GH-96", "A100-40"):
            errors = [abs(r["error"]) for r in sailor["profile_transfer"] if r["device"] == device]
            text = (f"profile transfer to {device}: median |error| {100 * np.median(errors):.1f}%, "
                    f"worst {100 * max(errors):.1f}% over {len(errors)} (TP, mbs) points")
            console.print(text)
            lines.append(f"- {text}")
        lines.append("")
    table = Table(title=f"Megatron-LM GPT-3 175B, TP8 PP12 (A100 efficiency fitted on DP4: "
                        f"{megatron['efficiency_fitted_on_dp4']:.4f})")
    for col in ("DP", "GPUs", "measured TFLOP/s", "predicted", "error", "peak GiB (pred)"):
        table.add_column(col, justify="right")
    lines += ["## Megatron-LM GPT-3 175B (A100)", "",
              f"A100 sustained efficiency fitted on DP 4: {megatron['efficiency_fitted_on_dp4']:.4f}.", "",
              "Memory: Megatron-LM publishes no per-GPU peak for these runs; the predicted peak (80 GiB devices, "
              "framework overhead = the catalogue's assumed 2 GiB) must fit.", "",
              "| DP | GPUs | measured TFLOP/s | predicted | error | predicted peak GiB |", "|---|---|---|---|---|---|"]
    for r in megatron["rows"]:
        cells = [str(r["data_parallel"]), str(r["gpus"]), f"{r['measured_tflops']:.0f}",
                 f"{r['predicted_tflops']:.1f}", f"{100 * r['error']:+.1f}%", f"{r['predicted_mem_gib']:.1f}"]
        table.add_row(*cells)
        lines.append("| " + " | ".join(cells) + " |")
    console.print(table)
    (out / "validate_perf.md").write_text("\n".join(lines) + "\n")
    (out / "validate_perf.json").write_text(json.dumps({"sailor": sailor, "megatron": megatron}, indent=1))
    plot(sailor, megatron, out / "validate_perf.png")
    console.print(f"wrote {out}/validate_perf.{{md,json,png}}")


def plot(sailor: dict | None, megatron: dict, path: Path) -> None:
    """Predicted against measured: time and memory of Sailor's plans, Megatron's TFLOP/s. The object
    API with its own Agg canvas, so the process-wide matplotlib backend is never touched."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4.5))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3)
    if sailor is not None:
        for ax, truth, series, unit, title in (
                (axes[0], "measured_s", (("predicted_uncalibrated_s", "no fit", "x"), ("predicted_s", "fitted", "o"),
                                         ("predicted_loo_s", "leave-one-out", "^"),
                                         ("predicted_transfer_s", "transfer (GH200 profile withheld)", "s")),
                 "iteration time (s)", "Sailor OPT-350M, GH200: time"),
                (axes[1], "measured_mem_gib", (("predicted_mem_gib", "fitted overhead", "o"),
                                               ("predicted_mem_loo_gib", "leave-one-out", "^"),
                                               ("predicted_mem_flash_no_overhead_gib", "old terms", "x")),
                 "peak memory (GiB)", "Sailor OPT-350M, GH200: memory")):
            measured = [r[truth] for r in sailor["rows"]]
            for key, label, marker in series:
                ax.scatter(measured, [r[key] for r in sailor["rows"]], label=label, marker=marker)
            top = max(measured) * 1.15
            ax.plot([0, top], [0, top], "k-", lw=0.8)
            ax.fill_between([0, top], [0, top * 0.8], [0, top * 1.2], color="grey", alpha=0.15, label="±20%")
            ax.set_xlabel(f"measured {unit}")
            ax.set_ylabel("predicted")
            ax.set_title(title)
            ax.legend(fontsize=8)
    ax = axes[2]
    dps = [str(r["data_parallel"]) for r in megatron["rows"]]
    x = np.arange(len(dps))
    ax.bar(x - 0.2, [r["measured_tflops"] for r in megatron["rows"]], 0.4, label="measured (Megatron-LM)")
    ax.bar(x + 0.2, [r["predicted_tflops"] for r in megatron["rows"]], 0.4, label="predicted")
    ax.set_xticks(x, [f"DP {d}" for d in dps])
    ax.set_ylabel("TFLOP/s per A100")
    ax.set_title("GPT-3 175B, TP8 PP12")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def published_runs(directory: Path) -> tuple[list, dict[str, int], list]:
    """The priceable published rows as runs, the refused ones counted by reason, and the runs whose time
    alone is refused (published.TimeRefused: their stated memory peaks are still checked)."""
    from collections import Counter

    from chameleon_opt.perf.published import Refused, TimeRefused, load_rows, to_run
    runs, refused, memory_only = [], Counter(), []
    for row in load_rows(directory):
        try:
            runs.append(to_run(row))
        except Refused as why:
            refused[f"{row['_source']}: {why}"] += 1
            if isinstance(why, TimeRefused):
                memory_only.append(why.run)
    return runs, dict(refused), memory_only


REPORT_ONLY_FAMILIES = ("GPT (Megatron-DeepSpeed)",)
"""Families priced from the others' fit and reported, but fitted into no other family's constants. Why:
Megatron-DeepSpeed's README rows (before/after-change anecdotes on 8-128 GPUs) sit 2.2-2.7x slower than
the model on its 125M (8 A100), 1.3-1.4x on its 2.7B, while its 13B rows (128 V100) are within 7-16%: a
gap the model does not explain yet (docs/performance-model.md), which fitted into the others'
efficiencies spreads to them (measured with them fitted in, before the 1.3B pair's pass count was fixed:
llm-foundry worst 20.7% -> 33.6%, GPT-2 Megatron 2020 worst 12.7% -> 42.9%). The 1.3B V100 pair's step
time is refused (published.DEEPSPEED_CHECKPOINTING_AB); the remaining six are not within 15%, and fitted
in they still spread: llm-foundry 3.2% / 25.6% -> 3.9% / 27.9%, GPT-2 Megatron 2020 4.5% / 12.9% -> 5.1% /
21.7% (median / worst)."""


def fitted_runs(runs: list, held_out: str | None = None) -> list:
    """The runs a fit may use: not the held-out family, not a report-only one."""
    return [r for r in runs if r.family != held_out and r.family not in REPORT_ONLY_FAMILIES]


def sharded(run) -> bool:
    """Whether the run's plan gathers and reduce-scatters ZeRO-3 shards on every micro-batch."""
    return run.document["training"].get("zero_stage", 0) >= 3


def fits_interference(run) -> bool:
    """Whether a torchtitan run is one of those SHARDED_OVERLAP_INTERFERENCE is fitted on: eager blocks,
    every block checkpointed alike. Why not every priced row: the constant prices llm-foundry's family,
    so a setting newly priced here (compile, layer-selective checkpointing) would move another source's
    check through its own error; those rows are reported, not fitted on."""
    training = run.document["training"]
    return training.get("kernels") == "torchtitan" and training.get("checkpoint_every", 1) == 1


def interference_of(runs: list, price) -> float:
    """The ZeRO-3 overlap interference fitted on `runs` (published.fit_interference), each priced by
    `price(run, x)` at x = 0 and x = 1."""
    from chameleon_opt.perf.published import fit_interference
    return fit_interference([r.measured_step_s for r in runs], [price(r, 0.0) for r in runs],
                            [price(r, 1.0) for r in runs])


def published_interference(runs: list, terms: dict) -> dict[str, float]:
    """Per family with ZeRO-3 runs: the overlap interference fitted on its own runs, at the efficiencies
    fitted on the other families (what the other FSDP family is priced with)."""
    from chameleon_opt.perf.published import fit_efficiencies, predict_calibrated
    fitted = {}
    for family in sorted({r.family for r in runs if sharded(r)}):
        fit = fit_efficiencies(fitted_runs(runs, family), terms)
        mine = [r for r in runs if r.family == family and r.gpu in fit.compute]
        fitted[family] = interference_of(mine, lambda r, x: predict_calibrated(
            r, fit.compute[r.gpu], fit.memory_efficiency, x))
    return fitted


def published_validation(runs: list, refused: dict[str, int], terms: dict, interference: float,
                         memory_only: list = ()) -> dict:
    """Every priceable published row, before (catalogue efficiencies) and leave-one-family-out: the
    efficiencies fitted on the other families, ZeRO-3 runs at `interference` (fitted on torchtitan's);
    the stated memory peaks of those and of `memory_only` (rows whose time alone is refused)."""
    from chameleon_opt.instance.devices import CATALOGUE
    from chameleon_opt.perf.published import fit_efficiencies, predict_calibrated, predict_step
    families = sorted({r.family for r in runs})
    rows, fits, memory = [], {}, []
    for family in families:
        fit = fit_efficiencies(fitted_runs(runs, family), terms)
        fits[family] = {"compute": fit.compute, "memory_efficiency": fit.memory_efficiency,
                        "fitted_on": list(fit.fitted_on), "borrowed": list(fit.borrowed)}
        for r in (r for r in runs if r.family == family):
            before = predict_step(r, CATALOGUE[r.gpu].efficiency)
            held = r.gpu in fit.compute
            after = predict_calibrated(r, fit.compute[r.gpu], fit.memory_efficiency,
                                       interference if sharded(r) else None) if held else before
            rows.append({"id": r.id, "source": r.source, "family": family, "gpu": r.gpu, "label": r.label,
                         "metric": r.metric, "measured_s": r.measured_step_s, "before_s": before, "lofo_s": after,
                         "error_before": before / r.measured_step_s - 1, "error_lofo": after / r.measured_step_s - 1,
                         "gpu_fitted_elsewhere": held and r.gpu not in fit.borrowed})
            if held and r.document["training"].get("recompute_early_stop") and r.document["training"][
                    "recomputation"] == "full":
                # the same run with the whole block rerun (torch before 2.1): what remeasured() compares
                # the earlier, torch 1.13 measurement of the configuration against
                whole = replace(r, document={**r.document, "training": {**r.document["training"],
                                                                        "recompute_early_stop": False}})
                rows[-1]["lofo_full_recompute_s"] = predict_calibrated(
                    whole, fit.compute[r.gpu], fit.memory_efficiency, interference if sharded(r) else None)
    for r in sorted(runs + list(memory_only), key=lambda r: (r.family, r.id)):
        if r.measured_memory_gib:
            memory.append({"id": r.id, "family": r.family, "label": r.label, "measured_gib": r.measured_memory_gib,
                           "predicted_gib": peak_gib(r), "error": peak_gib(r) / r.measured_memory_gib - 1,
                           "time_refused": r in memory_only})

    def summary(key: str, value: str) -> list[dict]:
        out = []
        for name in sorted({r[key] for r in rows}):
            chosen = [r for r in rows if r[key] == name]
            b = np.abs([r["error_before"] for r in chosen])
            a = np.abs([r["error_lofo"] for r in chosen])
            out.append({value: name, "n": len(chosen), "median_before": float(np.median(b)),
                        "worst_before": float(b.max()), "median_lofo": float(np.median(a)), "worst_lofo": float(a.max()),
                        "gpu_not_fitted_elsewhere": sum(not r["gpu_fitted_elsewhere"] for r in chosen)})
        return out
    return {"rows": rows, "refused": dict(refused), "fits": fits, "by_source": summary("source", "source"),
            "by_family": summary("family", "family"), "sharded_interference": interference, "memory": memory,
            "report_only": list(REPORT_ONLY_FAMILIES)}


EARLIER_A100_80GB = ROOT / "bench" / "data" / "llm_foundry_a100_80gb_2023_05.json"
"""llm-foundry's README A100 80GB table as shown from May to October 2023, before its rows were re-measured."""
CONFIGURATION = ("Model", "SeqLen (T)", "# GPUs", "GPU", "MicroBatchSize", "GradAccum", "Activation Checkpointing")
"""The README cells that name one benchmark configuration (llm-foundry's sweep.sh submits one run for each)."""


def remeasured(published: dict, directory: Path, earlier: Path = EARLIER_A100_80GB) -> dict:
    """Each llm-foundry row whose configuration the README had measured before with another result, and its
    held-out error against both measurements. Why: the A100 80GB section was re-run in October 2023
    (amp_bf16 / DEFAULT, torch 2.1; before: bf16 / PURE, torch 1.13.1) with the same model, sequence, GPU count,
    micro-batch, accumulation and checkpointing; two runs of one configuration by one script bound how closely
    any step-time model can match either. The model prices the two alike (2-byte gathers and reductions) except
    for the recompute: torch 1.13 reruns a checkpointed block whole, torch 2.1 stops before its MLP output
    projection (Training.recompute_early_stop), so a checkpointed row's earlier run is priced with the whole
    block rerun (`lofo_full_recompute_s`) and the predicted change (earlier / re-run step) stands beside the
    measured one; its step time scales with 1 / tokens per second per GPU."""
    from chameleon_opt.perf.published import load_rows
    before = {tuple(r[k] for k in CONFIGURATION): r for r in json.loads(earlier.read_text())["rows"]}
    raw = {r["id"]: r.get("raw") or {} for r in load_rows(directory) if r["_source"] == "llm_foundry"}
    rows = []
    for r in published["rows"]:
        old = before.get(tuple(raw.get(r["id"], {}).get(k) for k in CONFIGURATION))
        if old is None or old["Throughput (T/s/GPU)"] == raw[r["id"]]["Throughput (T/s/GPU)"]:
            continue
        now, then = float(raw[r["id"]]["Throughput (T/s/GPU)"]), float(old["Throughput (T/s/GPU)"])
        earlier_s = r.get("lofo_full_recompute_s", r["lofo_s"]) if old["Precision"] == "bf16" else r["lofo_s"]
        rows.append({"id": r["id"], "label": r["label"], "tokens_per_s_per_gpu": now, "earlier_tokens_per_s_per_gpu": then,
                     "earlier_setting": f"{old['Precision']} / {old['MP Mode']}", "change": now / then - 1,
                     "predicted_change": earlier_s / r["lofo_s"] - 1, "error_lofo": r["error_lofo"],
                     "error_lofo_earlier": earlier_s * then / (r["measured_s"] * now) - 1})
    if not rows:
        return {"rows": []}
    stats = {key: (float(np.median(np.abs(v))), float(np.max(np.abs(v))))
             for key in ("change", "error_lofo", "error_lofo_earlier") for v in [[row[key] for row in rows]]}
    for row in rows:  # 0 when the prediction lies between the two measurements of its configuration
        now_e, then_e = row["error_lofo"], row["error_lofo_earlier"]
        row["error_nearer_run"] = 0.0 if now_e * then_e <= 0 else min(now_e, then_e, key=abs)
    stats["error_nearer_run"] = (float(np.median(np.abs([row["error_nearer_run"] for row in rows]))),
                                 float(np.max(np.abs([row["error_nearer_run"] for row in rows]))))
    rerun = [row for row in rows if row["predicted_change"] != 0.0]
    explained = {"n": len(rerun), "median_change": float(np.median([row["change"] for row in rerun])) if rerun else 0.0,
                 "median_predicted": float(np.median([row["predicted_change"] for row in rerun])) if rerun else 0.0,
                 "median_gap": float(np.median([abs(row["change"] - row["predicted_change"]) for row in rerun]))
                 if rerun else 0.0}
    return {"rows": rows, "source": earlier.name, "median_worst": stats, "recompute_changed": explained,
            "changed_over_5pct": sum(abs(row["change"]) > 0.05 for row in rows)}


def earlier_only(published: dict, directory: Path, earlier: Path = EARLIER_A100_80GB) -> dict:
    """The earlier A100 80GB table's configurations that the re-run dropped (multi-node 16-64 GPU runs among
    them, a layout the published A100 80GB rows barely have), priced held out like the MPT rows: the fit
    without llm-foundry, ZeRO-3 runs at the interference fitted on torchtitan. Each becomes a row of the
    published format from the cells as printed, the model's dimensions taken from a published row of the
    same MPT size (llm-foundry's yaml per size; only the sequence length varies)."""
    import copy

    from chameleon_opt.perf.published import load_rows, predict_calibrated, to_run
    foundry = [r for r in load_rows(directory) if r["_source"] == "llm_foundry"]
    published_configs = {tuple((r.get("raw") or {}).get(k) for k in CONFIGURATION) for r in foundry}
    sizes = {r["raw"]["Model"]: r for r in foundry if (r.get("raw") or {}).get("GPU") == "a100_80gb"}
    fit = next(f for family, f in published["fits"].items() if family.startswith("MPT"))
    rows = []
    for cells in json.loads(earlier.read_text())["rows"]:
        if tuple(cells[k] for k in CONFIGURATION) in published_configs or cells["Model"] not in sizes:
            continue
        row = copy.deepcopy(sizes[cells["Model"]])
        row.update({"id": f"llmfoundry-2023-05-line{cells['line']}", "precision": cells["Precision"], "raw": cells,
                    "activation_checkpointing": "full" if cells["Activation Checkpointing"] == "True" else "none",
                    "measured": {"tokens_per_s_per_gpu": float(cells["Throughput (T/s/GPU)"])},
                    "batch": {"micro_batch": int(cells["MicroBatchSize"]), "grad_accum": int(cells["GradAccum"]),
                              "global_batch": int(cells["GlobalBatchSize"])}})
        row["model"]["seq_len"] = int(cells["SeqLen (T)"])
        row["hardware"]["num_gpus"] = int(cells["# GPUs"])
        row["parallel"] = {**row["parallel"], "sharding_strategy": cells["Sharding Strategy"],
                           "notes": f"PyTorch FSDP (FSDP1) sharding_strategy={cells['Sharding Strategy']}, "
                                    f"mixed_precision mode={cells['MP Mode']}"}
        run = to_run(row)
        predicted = predict_calibrated(run, fit["compute"][run.gpu], fit["memory_efficiency"],
                                       published["sharded_interference"])
        rows.append({"id": run.id, "label": run.label, "measured_s": run.measured_step_s, "predicted_s": predicted,
                     "error_lofo": predicted / run.measured_step_s - 1})
    errors = np.abs([row["error_lofo"] for row in rows]) if rows else np.zeros(1)
    return {"rows": rows, "median": float(np.median(errors)), "worst": float(errors.max())}


def render_remeasured(found: dict) -> list[str]:
    """Markdown lines for remeasured()."""
    if not found["rows"]:
        return []
    stats = found["median_worst"]
    lines = ["## llm-foundry rows the README measured twice", "",
             f"{len(found['rows'])} A100 80GB configurations re-run in October 2023 ({found['source']}): the two runs differ "
             f"by median {stats['change'][0]:.1%}, worst {stats['change'][1]:.1%} ({found['changed_over_5pct']} by more than 5%). "
             f"Held-out |error| against the rows as published: median {stats['error_lofo'][0]:.1%}, worst "
             f"{stats['error_lofo'][1]:.1%}; against the earlier run: median {stats['error_lofo_earlier'][0]:.1%}, worst "
             f"{stats['error_lofo_earlier'][1]:.1%}; against the nearer of the two (0 when the prediction lies between "
             f"them): median {stats['error_nearer_run'][0]:.1%}, worst {stats['error_nearer_run'][1]:.1%}.", "",
             f"The {found['recompute_changed']['n']} configurations the model prices differently in the two runs "
             f"(checkpointed: torch 1.13 reruns the whole block, torch 2.1 stops before the MLP output projection) "
             f"changed by median {found['recompute_changed']['median_change']:+.1%} measured, "
             f"{found['recompute_changed']['median_predicted']:+.1%} predicted (|measured - predicted| median "
             f"{found['recompute_changed']['median_gap']:.1%}).", "",
             "| row | configuration | tokens/s/GPU now / earlier | change | predicted change | LOFO error now | "
             "against the earlier run |", "|---|---|---|---|---|---|---|"]
    for row in sorted(found["rows"], key=lambda row: -abs(row["error_lofo"])):
        lines.append(f"| {row['id']} | {row['label']} | {row['tokens_per_s_per_gpu']:.0f} / "
                     f"{row['earlier_tokens_per_s_per_gpu']:.0f} ({row['earlier_setting']}) | {row['change']:+.1%} | "
                     f"{row['predicted_change']:+.1%} | {row['error_lofo']:+.1%} | {row['error_lofo_earlier']:+.1%} |")
    dropped = found.get("earlier_only", {"rows": []})
    if dropped["rows"]:
        lines += ["", f"{len(dropped['rows'])} configurations only the earlier table has, priced held out (MPT's "
                  f"leave-one-family-out fit): median {dropped['median']:.1%}, worst {dropped['worst']:.1%}.", "",
                  "| row | configuration | measured s | predicted s | LOFO error |", "|---|---|---|---|---|"]
        lines += [f"| {row['id']} | {row['label']} | {row['measured_s']:.3f} | {row['predicted_s']:.3f} | "
                  f"{row['error_lofo']:+.1%} |" for row in dropped["rows"]]
    return lines + [""]


def fp8_terms(run, fit, interference: float) -> tuple[float, float]:
    """(A, B) with the run's step time = A + B / ratio, ratio the fp8 GEMM efficiency as a share of the
    bf16 one (perf/fp8.py): evaluated at ratio 1 and 1/2, exact while the bottleneck stays the same."""
    from chameleon_opt.perf.published import predict_calibrated
    x = interference if sharded(run) else None
    at_one, at_half = (predict_calibrated(run, fit.compute[run.gpu], fit.memory_efficiency, x, ratio)
                       for ratio in (1.0, 0.5))
    return 2.0 * at_one - at_half, at_half - at_one


def fit_fp8_ratio(runs: list, terms: dict[str, tuple[float, float]]) -> float:
    """The ratio minimising the squared relative step-time errors of `runs` (closed form in 1 / ratio)."""
    a = np.array([terms[r.id][0] / r.measured_step_s for r in runs])
    b = np.array([terms[r.id][1] / r.measured_step_s for r in runs])
    return float(1.0 / ((b * (1.0 - a)).sum() / (b * b).sum()))


def fp8_validation(bf16_runs: list, fp8_runs: list, refused: dict[str, int], interference: float,
                   torchtitan_refused: dict[str, str]) -> dict:
    """fp8 rows, leave-one-source-out: the bf16 efficiencies fitted on every bf16 family but the fp8
    row's own stack's (llm-foundry's fp8 rows without llm-foundry's bf16 rows), the fp8 GEMM ratio fitted
    on ONE source's fp8 rows and reported on every other source's. Also each source's own fit (in
    sample, for reference), the ratio-1 baseline (fp8 GEMMs as efficient as bf16 against the fp8 peak),
    and the rows priced as if bf16 (what refusing them guarded against)."""
    from chameleon_opt.perf.published import fit_efficiencies, predict_calibrated
    sources = sorted({r.source for r in fp8_runs})
    fits, terms = {}, {}
    for r in fp8_runs:
        own = r.family.removesuffix(" FP8")
        if own not in fits:
            fits[own] = fit_efficiencies(fitted_runs(bf16_runs, own), {b.id: step_terms_of(b) for b in bf16_runs})
        terms[r.id] = fp8_terms(r, fits[own], interference)
    ratios = {s: fit_fp8_ratio([r for r in fp8_runs if r.source == s], terms) for s in sources}
    rows = []
    for r in fp8_runs:
        a, b = terms[r.id]
        fit = fits[r.family.removesuffix(" FP8")]
        bf16_doc = json.loads(json.dumps(r.document))
        del bf16_doc["training"]["fp8"]
        as_bf16 = predict_calibrated(replace(r, document=bf16_doc), fit.compute[r.gpu],
                                     fit.memory_efficiency, interference if sharded(r) else None)
        rows.append({"id": r.id, "source": r.source, "family": r.family, "label": r.label,
                     "measured_s": r.measured_step_s, "as_bf16_error": as_bf16 / r.measured_step_s - 1,
                     "ratio_one_error": (a + b) / r.measured_step_s - 1,
                     **{f"error_fit_{s}": (a + b / ratios[s]) / r.measured_step_s - 1 for s in sources},
                     "measured_mem_gib": r.measured_memory_gib})
    table = []
    for fitted in sources:
        for s in sources:
            errors = np.abs([row[f"error_fit_{fitted}"] for row in rows if row["source"] == s])
            table.append({"fitted_on": fitted, "reported_on": s, "held_out": fitted != s, "n": len(errors),
                          "ratio": ratios[fitted], "median": float(np.median(errors)), "worst": float(errors.max())})
    baselines = []
    for s in sources:
        chosen = [row for row in rows if row["source"] == s]
        baselines.append({"source": s, "n": len(chosen),
                          **{f"{k}_{stat}": float(f(np.abs([row[k + '_error'] for row in chosen])))
                             for k in ("ratio_one", "as_bf16") for stat, f in (("median", np.median), ("worst", np.max))}})
    fp8_refused = {why: n for why, n in refused.items() if any(t in why for t in ("fp8", "FP8"))}
    for row_id, why in torchtitan_refused.items():
        if "float8" in why:
            key = f"torchtitan: {why}"
            fp8_refused[key] = fp8_refused.get(key, 0) + 1
    return {"rows": rows, "ratios": ratios, "table": table, "baselines": baselines, "refused_fp8_rows": fp8_refused,
            "bf16_fits": {k: {"compute": v.compute, "memory_efficiency": v.memory_efficiency,
                              "fitted_on": list(v.fitted_on)} for k, v in fits.items()}}


def step_terms_of(run):
    """published.step_terms, remembered per run (every held-out stack's bf16 fit asks for all of them)."""
    from chameleon_opt.perf.published import step_terms
    if run.id not in _STEP_TERMS:
        _STEP_TERMS[run.id] = step_terms(run)
    return _STEP_TERMS[run.id]


_STEP_TERMS: dict = {}


def render_fp8(fp8: dict) -> list[str]:
    """The fp8 section: the ratio fitted per source and its error on each source (markdown, also printed)."""
    lines = ["## fp8 rows: the fp8 GEMM ratio fitted on one source, reported on the others", "",
             "| fitted on | reported on | held out | n | ratio | median |error| | worst |error| |", "|---|---|---|---|---|---|---|"]
    table = Table(title="fp8 rows: ratio fitted on one source, |error| on each")
    for col in ("fitted on", "reported on", "held out", "n", "ratio", "median", "worst"):
        table.add_column(col, justify="right")
    for t in fp8["table"]:
        cells = [t["fitted_on"], t["reported_on"], "yes" if t["held_out"] else "no (in sample)", str(t["n"]),
                 f"{t['ratio']:.3f}", f"{100 * t['median']:.1f}%", f"{100 * t['worst']:.1f}%"]
        table.add_row(*cells)
        lines.append("| " + " | ".join(cells) + " |")
    console.print(table)
    lines += ["", "Baselines (no fp8 constant): ratio 1 (fp8 GEMMs at the bf16 efficiency against the fp8 peak); "
              "priced as bf16 (what the model refuses to do):", ""]
    for b in fp8["baselines"]:
        lines.append(f"- {b['source']} (n {b['n']}): ratio 1 median {100 * b['ratio_one_median']:.1f}% worst "
                     f"{100 * b['ratio_one_worst']:.1f}%; as bf16 median {100 * b['as_bf16_median']:.1f}% worst "
                     f"{100 * b['as_bf16_worst']:.1f}%")
    lines += ["", "Per row (error with each source's ratio):", ""]
    for row in fp8["rows"]:
        errors = ", ".join(f"{k.removeprefix('error_fit_')} {v:+.1%}" for k, v in row.items() if k.startswith("error_fit_"))
        lines.append(f"- {row['id']} {row['label']}: {errors}; as bf16 {row['as_bf16_error']:+.1%}"
                     + ("" if row["measured_mem_gib"] else "; memory not stated"))
    lines += ["", "fp8 rows still refused:", ""] + [f"- {n} x {why}" for why, n in sorted(fp8["refused_fp8_rows"].items())]
    for line in lines[lines.index("Baselines (no fp8 constant): ratio 1 (fp8 GEMMs at the bf16 efficiency against the fp8 peak); "
                                  "priced as bf16 (what the model refuses to do):"):]:
        console.print(line)
    return lines + [""]


def context_parallel(run) -> int:
    """The run's context-parallel size (training.context_parallel; 1 without)."""
    return int(run.document["training"].get("context_parallel", 1))


def as_data_parallel(run):
    """The naive pricing context parallelism is checked against: each cp rank as a data-parallel replica
    of s / cp-token sequences (attention over s / cp keys instead of s, no K/V ring)."""
    cp = context_parallel(run)
    doc = json.loads(json.dumps(run.document))
    training, layout = doc["training"], doc["plan"]["layout"]
    training["sequence_length"] //= cp
    training["global_batch"] *= cp
    training["context_parallel"] = 1
    layout["data_parallel"] *= cp
    return replace(run, document=doc)


def ring_margin(run, fit) -> float:
    """The largest ratio, over blocks and directions, of one ring step's K/V message to one step's attention
    (PerfModel.context_parallel_steps) under the run's held-out calibration: below 1 the exchanges hide."""
    from chameleon_opt.perf.published import attention_utilisation, efficiency_calibration, tp_exposed
    instance = build_instance(run.document, f"<{run.id}>")
    calibration = efficiency_calibration({run.gpu: fit.compute[run.gpu]}, fit.memory_efficiency, tp_exposed(run),
                                         attention_utilisation(run), run.document["training"]["attention"])
    message_f, message_b, step_f, step_b = PerfModel(instance, calibration=calibration).context_parallel_steps(
        instance.plan, 0, 0)
    blocks = message_f > 0
    return float(max((message_f[blocks] / step_f[blocks]).max(), (message_b[blocks] / step_b[blocks]).max()))


def cp_validation(bf16_runs: list, cp_runs: list, ratios: dict[str, float], interference: float) -> dict:
    """Context-parallel rows (all fp8 here), held out twice over: the bf16 efficiencies fitted on every bf16
    family but the row's own stack's, and the fp8 GEMM ratio fitted on each source's fp8 rows without
    context parallelism (none of these rows is in any fit). Against the naive pricing (as_data_parallel)."""
    from chameleon_opt.perf.published import fit_efficiencies
    rows = []
    for r in cp_runs:
        own = r.family.removesuffix(" FP8")
        fit = fit_efficiencies(fitted_runs(bf16_runs, own), {b.id: step_terms_of(b) for b in bf16_runs})
        a, b = fp8_terms(r, fit, interference)
        naive_a, naive_b = fp8_terms(as_data_parallel(r), fit, interference)
        errors = {s: (a + b / ratio) / r.measured_step_s - 1 for s, ratio in ratios.items()}
        naive = {s: (naive_a + naive_b / ratio) / r.measured_step_s - 1 for s, ratio in ratios.items()}
        instance = build_instance(r.document, f"<{r.id}>")
        peak = max(c.memory_bytes for c in PerfModel(instance).evaluate(instance.plan).pipelines[0].stages) / GIB
        rows.append({"id": r.id, "source": r.source, "family": r.family, "label": r.label, "cp": context_parallel(r),
                     "measured_s": r.measured_step_s, "metric": r.metric,
                     **{f"error_fit_{s}": e for s, e in errors.items()},
                     **{f"naive_error_fit_{s}": e for s, e in naive.items()},
                     "ring_margin": ring_margin(r, fit), "predicted_peak_gib": peak,
                     "measured_mem_gib": r.measured_memory_gib})
    summary = {}
    for s in ratios:
        for key in (f"error_fit_{s}", f"naive_error_fit_{s}"):
            values = np.abs([row[key] for row in rows])
            summary[key] = {"median": float(np.median(values)), "worst": float(values.max())} if len(values) else {}
    return {"rows": rows, "ratios": ratios, "summary": summary}


def render_cp(found: dict) -> list[str]:
    """The context-parallel section (markdown, also printed)."""
    sources = list(found["ratios"])
    lines = ["## Context-parallel rows (ring attention), held out", "",
             "bf16 efficiencies fitted without the row's family; the fp8 ratio fitted on each source's fp8 rows "
             "without context parallelism. Naive: each cp rank priced as a data-parallel replica of s / cp-token "
             "sequences. Ring margin: largest K/V message / attention time of one ring step (below 1: hidden).", "",
             "| row | configuration | measured s | " + " | ".join(f"error ({s} ratio)" for s in sources)
             + " | " + " | ".join(f"naive ({s})" for s in sources) + " | ring margin | peak GiB (pred) |",
             "|---" * (5 + 2 * len(sources)) + "|"]
    for row in found["rows"]:
        lines.append(f"| {row['id']} | {row['label']} | {row['measured_s']:.3f} | "
                     + " | ".join(f"{row[f'error_fit_{s}']:+.1%}" for s in sources) + " | "
                     + " | ".join(f"{row[f'naive_error_fit_{s}']:+.1%}" for s in sources)
                     + f" | {row['ring_margin']:.2f} | {row['predicted_peak_gib']:.1f} |")
    lines.append("")
    for s in sources:
        model, naive = found["summary"][f"error_fit_{s}"], found["summary"][f"naive_error_fit_{s}"]
        if model:
            lines.append(f"- {s} ratio: median |error| {model['median']:.1%}, worst {model['worst']:.1%}; "
                         f"naive median {naive['median']:.1%}, worst {naive['worst']:.1%}")
    for line in lines:
        console.print(line)
    return lines + [""]


def proxy_die_runs(runs: list) -> list:
    """The runs on a die that no bf16 run (what fit_efficiencies fits) measures: priced at their proxy die's
    efficiency (published.PROXY_DIE) and fitted into nothing, not even the fp8 ratio."""
    from chameleon_opt.perf.published import CHIP, is_fp8
    measured = {CHIP[r.gpu] for r in runs if not is_fp8(r) and context_parallel(r) == 1}
    return [r for r in runs if CHIP[r.gpu] not in measured]


def as_published_gpu_count(run, directory: Path):
    """The run as its row's printed GPU count has it (DP = GPUs / (TP x PP x CP)) where the layout it is
    priced with (published.STATED_LAYOUT_TABLES) covers fewer GPUs; None where the two agree, and the reason
    where that count cannot have run the row (published.Refused: e.g. fewer sequences than replicas)."""
    from chameleon_opt.perf.published import Refused, load_rows, to_run
    row = next(r for r in load_rows(directory) if r["id"] == run.id)
    if int(row["hardware"]["num_gpus"]) == run.document["cluster"]["nodes"] * run.document["cluster"]["devices_per_node"]:
        return None
    try:
        return to_run({**row, "parallel": {**row["parallel"], "dp": None}})
    except Refused as why:
        return str(why)


def proxy_validation(bf16_runs: list, proxy_runs: list, ratios: dict[str, float], interference: float,
                     directory: Path) -> dict:
    """Rows on a die no fit measures, held out entirely: the bf16 efficiencies fitted on every bf16 family
    but the row's own stack's (the row's die at its proxy die's efficiency), each source's fp8 ratio (fitted
    on other devices' rows). Also each row priced on the GPU count its table printed where that contradicts
    the stated layout (the data-parallel size then follows from the count)."""
    from chameleon_opt.perf.published import CHIP, PROXY_DIE, fit_efficiencies, predict_calibrated
    rows = []
    for r in proxy_runs:
        own = r.family.removesuffix(" FP8")
        fit = fit_efficiencies(fitted_runs(bf16_runs, own), {b.id: step_terms_of(b) for b in bf16_runs})
        if r.gpu not in fit.borrowed:
            raise SystemExit(f"{r.id}: {r.gpu} has no proxy die fitted (published.PROXY_DIE)")

        def price(run, ratio):
            if ratio is None:
                return predict_calibrated(run, fit.compute[run.gpu], fit.memory_efficiency,
                                          interference if sharded(run) else None)
            a, b = fp8_terms(run, fit, interference)
            return a + b / ratio
        fp8 = "fp8" in r.document["training"]
        errors = {s: price(r, ratio if fp8 else None) / r.measured_step_s - 1 for s, ratio in ratios.items()}
        other = as_published_gpu_count(r, directory)
        impossible = other if isinstance(other, str) else None
        other = None if impossible else other
        other_errors = ({s: price(other, ratio if fp8 else None) / other.measured_step_s - 1
                         for s, ratio in ratios.items()} if other else None)
        instance = build_instance(r.document, f"<{r.id}>")
        peak = max(c.memory_bytes for p in PerfModel(instance).evaluate(instance.plan).pipelines for c in p.stages) / GIB
        rows.append({"id": r.id, "source": r.source, "gpu": r.gpu, "die": CHIP[r.gpu], "proxy_die": PROXY_DIE[CHIP[r.gpu]],
                     "compute_efficiency": fit.compute[r.gpu], "label": r.label, "measured_s": r.measured_step_s,
                     **{f"error_fit_{s}": e for s, e in errors.items()},
                     **({f"printed_gpus_error_fit_{s}": e for s, e in other_errors.items()} if other_errors else {}),
                     "printed_gpus_label": other.label if other else None, "printed_gpus_impossible": impossible,
                     "ring_margin": ring_margin(r, fit) if context_parallel(r) > 1 else None,
                     "predicted_peak_gib": peak, "memory_gib": r.document["cluster"]["device_type"]["memory_gib"]})
    devices = []
    for gpu in sorted({row["gpu"] for row in rows}):
        chosen = [row for row in rows if row["gpu"] == gpu]
        stats = {}
        for s in ratios:
            for key in (f"error_fit_{s}", f"printed_gpus_error_fit_{s}"):
                values = np.abs([row[key] for row in chosen if key in row])
                if len(values):
                    stats[key] = {"n": len(values), "median": float(np.median(values)), "worst": float(values.max())}
        devices.append({"gpu": gpu, "n": len(chosen), "proxy_die": chosen[0]["proxy_die"],
                        "printed_gpus_impossible": sum(bool(row["printed_gpus_impossible"]) for row in chosen),
                        "unfitted_proxy": len(chosen), "stats": stats,
                        "compute_efficiency": sorted({round(row["compute_efficiency"], 4) for row in chosen})})
    return {"rows": rows, "devices": devices, "ratios": ratios}


def render_proxy(found: dict) -> list[str]:
    """The per-device section of rows on a die no fit measures (markdown, also printed)."""
    if not found["rows"]:
        return []
    sources = list(found["ratios"])
    lines = ["## Devices no fit measures (proxy die), held out", "",
             "Nothing is fitted on these rows: the die's compute efficiency is its proxy die's (published.PROXY_DIE, "
             "fitted on the other families' bf16 rows), the fp8 ratio each source's (fitted on other devices' rows). "
             "Printed GPU count: the row priced on the GPU count its table printed where that contradicts the stated "
             "layout (DP then follows from the count; published.STATED_LAYOUT_TABLES).", ""]
    for d in found["devices"]:
        parts = []
        for s in sources:
            own, printed = d["stats"].get(f"error_fit_{s}"), d["stats"].get(f"printed_gpus_error_fit_{s}")
            parts.append(f"{s} ratio median {own['median']:.1%} worst {own['worst']:.1%}"
                         + (f" (printed GPU count, n {printed['n']}: {printed['median']:.1%} / {printed['worst']:.1%})"
                            if printed else ""))
        effs = ", ".join(f"{e:.3f}" for e in d["compute_efficiency"])
        lines.append(f"- {d['gpu']} (n {d['n']}, GPU unfitted (proxy) {d['unfitted_proxy']}: {d['proxy_die']}'s "
                     f"efficiency {effs}): " + "; ".join(parts)
                     + (f"; {d['printed_gpus_impossible']} rows cannot have run on their printed GPU count"
                        if d["printed_gpus_impossible"] else ""))
    lines += ["", "| row | configuration | measured s | " + " | ".join(f"error ({s} ratio)" for s in sources)
              + " | " + " | ".join(f"printed GPU count ({s})" for s in sources) + " | ring margin | peak GiB (pred) |",
              "|---" * (5 + 2 * len(sources)) + "|"]
    for row in found["rows"]:
        margin = "-" if row["ring_margin"] is None else f"{row['ring_margin']:.2f}"
        printed = " | ".join(f"{row[f'printed_gpus_error_fit_{s}']:+.1%}" if f"printed_gpus_error_fit_{s}" in row
                             else ("impossible" if row["printed_gpus_impossible"] else "-") for s in sources)
        lines.append(f"| {row['id']} | {row['label']} | {row['measured_s']:.3f} | "
                     + " | ".join(f"{row[f'error_fit_{s}']:+.1%}" for s in sources) + f" | {printed} | {margin} | "
                     f"{row['predicted_peak_gib']:.1f} of {row['memory_gib']:g} |")
    lines += [""] + [f"- {row['id']} on its printed GPU count: {row['printed_gpus_impossible']}"
                     for row in found["rows"] if row["printed_gpus_impossible"]]
    for line in lines:
        console.print(line)
    return lines + [""]


def peak_gib(run) -> float:
    """The model's largest stage peak for a published run (the catalogue calibration: memory needs no fit)."""
    instance = build_instance(run.document, f"<{run.id}>")
    found = PerfModel(instance).evaluate(instance.plan)
    return max(c.memory_bytes for p in found.pipelines for c in p.stages) / GIB


def held_out_estimate(r, fit, interference: float):
    """The model's estimate of a torchtitan run (bench/torchtitan_runs.py) with the torchtitan kernels,
    the compute and memory efficiencies of `fit` (fitted on other families) and the ZeRO-3 overlap
    interference given: nothing fitted on the run itself."""
    from chameleon_opt.instance.devices import CATALOGUE
    from chameleon_opt.perf import published as P
    from chameleon_opt.perf.calibration import DeviceFit, FrameworkCalibration
    device = r.document["cluster"]["device_type"]
    spec = device if isinstance(device, dict) else CATALOGUE[device].model_dump()
    calibration = FrameworkCalibration(
        "torchtitan (held out)", "flash", fit.memory_efficiency,
        {spec["name"]: DeviceFit(spec["peak_tflops"], spec["memory_bandwidth_gbps"], fit.compute[r.gpu], ())},
        overhead_gib=0.0, kernels="torchtitan",
        attention_utilisation={spec["name"]: P.ATTENTION_UTILISATION[(r.attention_kernel, r.gpu)]},
        sharded_interference=interference)
    instance = build_instance(r.document, f"<{r.id}>")
    return PerfModel(instance, calibration=calibration).evaluate(instance.plan)


def other_stacks_fit(others: list, interference: float):
    """The per-die compute and memory-traffic efficiencies fitted on the published tables' families
    (`others`: Megatron-LM, llm-foundry, NeMo; no torchtitan run is in them), ZeRO-3 runs at the
    overlap `interference`: what torchtitan's runs are priced with, held out."""
    from chameleon_opt.perf import published as P
    return P.fit_efficiencies(others, {r.id: P.step_terms(r, interference if sharded(r) else None) for r in others})


def torchtitan_calibration(fit, interference: float) -> dict:
    """The calibration a torchtitan import is priced with (models/calibration/torchtitan.json): the
    efficiencies of `fit` (other_stacks_fit), the ZeRO-3 overlap interference fitted on llm-foundry's
    runs, torchtitan's kernels and torch's FlashAttention-2 at its measured rates. What
    held_out_estimate prices torchtitan's runs with, without the framework overhead (the catalogue's
    stands: a user's device holds the CUDA context)."""
    from chameleon_opt.instance.devices import CATALOGUE
    from chameleon_opt.perf import published as P
    devices = {gpu: {"peak_tflops": CATALOGUE[gpu].peak_tflops,
                     "memory_bandwidth_gbps": CATALOGUE[gpu].memory_bandwidth_gbps,
                     "compute_efficiency": round(e, 6), "fitted_on": list(fit.fitted_on)}
               for gpu, e in sorted(fit.compute.items()) if ("flash-v2", gpu) in P.ATTENTION_UTILISATION}
    return {"format": 1, "framework": "torchtitan", "attention": "flash", "kernels": "torchtitan",
            "memory_efficiency": round(fit.memory_efficiency, 6), "devices": devices,
            "attention_utilisation": {gpu: P.ATTENTION_UTILISATION[("flash-v2", gpu)] for gpu in devices},
            "sharded_interference": round(interference, 6),
            "notes": ["written by bench/validate_perf.py --write-calibration from the published tables "
                      "(../shared/data/published): efficiencies fitted on " + ", ".join(fit.fitted_on) +
                      "; the ZeRO-3 overlap interference on llm-foundry's runs; no torchtitan run fitted",
                      "attention: torch's FlashAttention-2 SDPA backend at its rates measured on an H200 "
                      "(perf.published.FLASH_V2_H100_MEASURED) or the FlashAttention-2 paper's A100 figure"]}


def torchtitan_validation(fit, interference: float) -> dict:
    """torchtitan's published runs through its importer (bench/torchtitan_runs.py): refused
    rows by the key named; the rest priced with the torchtitan kernels, the efficiencies fitted on
    every other published family (`fit`: other_stacks_fit) and the ZeRO-3 overlap interference fitted
    on llm-foundry's runs (`interference`): none on these rows, all held out. Memory against max_reserved. Also fits
    the interference on its eager every-block rows (`fitted_interference`, fits_interference: what prices llm-foundry's)."""
    from bench.torchtitan_runs import import_rows, probe_runs
    runs, refused = import_rows()

    def estimate(r, x: float):
        return held_out_estimate(r, fit, x)

    def priced(r) -> dict:
        found = estimate(r, interference)
        peak = max(c.memory_bytes for p in found.pipelines for c in p.stages) / GIB
        return {"id": r.id, "family": r.family, "source": r.source, "fp8": r.fp8, "measured_s": r.measured_step_s,
                "predicted_s": found.iteration_time_s,
                "error_time": found.iteration_time_s / r.measured_step_s - 1,
                "measured_mem_gib": r.measured_memory_gib, "predicted_mem_gib": peak,
                "error_mem": peak / r.measured_memory_gib - 1 if r.measured_memory_gib else None}

    rows = [priced(r) for r in runs]
    fitted = interference_of([r for r in runs if fits_interference(r)], lambda r, x: estimate(r, x).iteration_time_s)
    return {"rows": rows, "refused": refused, "fitted_on": list(fit.fitted_on), "interference": interference,
            "fitted_interference": fitted, "h200_probe": [priced(r) for r in probe_runs()]}


def render_torchtitan(torchtitan: dict) -> list[str]:
    """torchtitan's rows held out, per benchmark file, bf16 and float8 apart (markdown, also printed): the
    float8 rows priced by perf/fp8.py's torchao casts at FP8_GEMM_RATIO (fitted on Transformer Engine rows),
    none fitted on them; and the rows still refused, by the setting named."""
    lines = ["## torchtitan's published runs, held out: bf16 and float8 per benchmark file", "",
             "| file | precision | n | time median | time worst | memory n | memory median | memory worst |",
             "|---|---|---|---|---|---|---|---|"]
    for source in sorted({r["source"] for r in torchtitan["rows"]}):
        for label in ("bf16", "float8 tensorwise"):
            chosen = [r for r in torchtitan["rows"] if r["source"] == source
                      and (r["fp8"] or "bf16") == label.removeprefix("float8 ")]
            if not chosen:
                continue
            time = np.abs([r["error_time"] for r in chosen])
            memory = np.abs([r["error_mem"] for r in chosen if r["error_mem"] is not None])
            cells = [source, label, str(len(chosen)), f"{np.median(time):.1%}", f"{time.max():.1%}",
                     str(len(memory)), f"{np.median(memory):.1%}" if len(memory) else "-",
                     f"{memory.max():.1%}" if len(memory) else "-"]
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| float8 row | recipe | measured s | predicted s | time error | memory measured / predicted GiB |",
              "|---|---|---|---|---|---|"]
    for r in (r for r in torchtitan["rows"] if r["fp8"]):
        memory = (f"{r['measured_mem_gib']:.1f} / {r['predicted_mem_gib']:.1f} ({r['error_mem']:+.1%})"
                  if r["error_mem"] is not None else "-")
        lines.append(f"| {r['id']} | {r['fp8']} | {r['measured_s']:.3f} | {r['predicted_s']:.3f} | "
                     f"{r['error_time']:+.1%} | {memory} |")
    lines += ["", "Still refused:", ""] + [f"- {i}: {key}" for i, key in sorted(torchtitan["refused"].items())]
    for line in lines:
        console.print(line)
    return lines + [""]


def render_published(published: dict, out: Path) -> list[str]:
    """The per-source and per-family tables (markdown lines, also printed) and the plot."""
    lines = ["## Published runs: step time, before and leave-one-family-out", ""]
    for key, title in (("by_source", "source"), ("by_family", "family")):
        table = Table(title=f"Published runs by {title}: |error| before (catalogue) and leave-one-family-out")
        for col in (title, "n", "median before", "worst before", "median LOFO", "worst LOFO", "GPU unfitted (proxy)"):
            table.add_column(col, justify="right")
        lines += [f"| {title} | n | median before | worst before | median LOFO | worst LOFO | GPU fitted nowhere else (proxy die) |",
                  "|---|---|---|---|---|---|---|"]
        for s in published[key]:
            cells = [s[title], str(s["n"]), f"{100 * s['median_before']:.1f}%", f"{100 * s['worst_before']:.1f}%",
                     f"{100 * s['median_lofo']:.1f}%", f"{100 * s['worst_lofo']:.1f}%",
                     str(s["gpu_not_fitted_elsewhere"])]
            table.add_row(*cells)
            lines.append("| " + " | ".join(cells) + " |")
        console.print(table)
        lines.append("")
    lines += ["Fits (each family's runs predicted from the others' fit):", ""]
    for family, fit in published["fits"].items():
        effs = ", ".join(f"{g} {e:.3f}" for g, e in sorted(fit["compute"].items()))
        lines.append(f"- held out {family}: compute efficiency {effs}; memory-traffic efficiency "
                     f"{fit['memory_efficiency']:.3f}; fitted on {', '.join(fit['fitted_on'])}"
                     + (f" ({', '.join(fit['borrowed'])}: its proxy die's, published.PROXY_DIE)" if fit["borrowed"] else ""))
    lines.append(f"- ZeRO-3 runs: overlap interference {published['sharded_interference']:.3f}, fitted on torchtitan's "
                 "published runs (the other FSDP family; PerfModel.overlap_sharded)")
    if published["report_only"]:
        lines.append(f"- report only (fitted into no other family): {', '.join(published['report_only'])}")
    if published["memory"]:
        lines += ["", "Published peak memory (rows that state one):", ""]
        lines += [f"- {m['id']} {m['label']}: measured {m['measured_gib']:.2f} GiB, predicted {m['predicted_gib']:.2f} "
                  f"GiB ({m['error']:+.1%})" + (" (its step time refused)" if m["time_refused"] else "")
                  for m in published["memory"]]
    lines += ["", "Refused rows (not priced as something else):", ""]
    lines += [f"- {n} x {why}" for why, n in sorted(published["refused"].items())]
    plot_published(published, out / "validate_perf_published.png")
    return lines + [""]


def plot_published(published: dict, path: Path) -> None:
    """Predicted against measured step time per family, before and leave-one-family-out (log-log)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 5.5))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2)
    families = sorted({r["family"] for r in published["rows"]})
    for ax, key, title in ((axes[0], "before_s", "before: catalogue FLOP efficiencies"),
                           (axes[1], "lofo_s", "after: fitted leave-one-family-out")):
        for k, family in enumerate(families):
            chosen = [r for r in published["rows"] if r["family"] == family]
            ax.scatter([r["measured_s"] for r in chosen], [r[key] for r in chosen], s=12, label=family,
                       marker="osD^v<>"[k % 7])
        low = min(min(r["measured_s"], r[key]) for r in published["rows"]) * 0.8
        high = max(max(r["measured_s"], r[key]) for r in published["rows"]) * 1.25
        ax.plot([low, high], [low, high], "k-", lw=0.8)
        ax.fill_between([low, high], [low * 0.85, high * 0.85], [low * 1.15, high * 1.15], color="grey", alpha=0.15,
                        label="±15%")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured step time (s)")
        ax.set_ylabel("predicted step time (s)")
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_torchtitan(torchtitan: dict, path: Path) -> None:
    """Predicted against measured step time and peak memory of torchtitan's published runs and of
    the H200 probe's steps, all held out (log-log)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 5.5))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2)
    groups = (("torchtitan published, bf16", [r for r in torchtitan["rows"] if not r["fp8"]], "o"),
              ("torchtitan published, float8", [r for r in torchtitan["rows"] if r["fp8"]], "s"),
              ("H200 probe (this project)", torchtitan["h200_probe"], "D"))
    for ax, (measured, predicted, unit) in zip(axes, (("measured_s", "predicted_s", "step time (s)"),
                                                      ("measured_mem_gib", "predicted_mem_gib", "peak memory (GiB)"))):
        shown = [r for _, rows, _ in groups for r in rows if r[measured]]
        for label, rows, marker in groups:
            rows = [r for r in rows if r[measured]]
            ax.scatter([r[measured] for r in rows], [r[predicted] for r in rows], s=16, marker=marker, label=label)
        low = min(min(r[measured], r[predicted]) for r in shown) * 0.8
        high = max(max(r[measured], r[predicted]) for r in shown) * 1.25
        ax.plot([low, high], [low, high], "k-", lw=0.8)
        ax.fill_between([low, high], [low * 0.85, high * 0.85], [low * 1.15, high * 1.15], color="grey", alpha=0.15,
                        label="±15%")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"measured {unit}")
        ax.set_ylabel(f"predicted {unit}")
        ax.set_title(f"{unit.split(' (')[0]}: held out (efficiencies fitted on other stacks)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sailor-dir", type=Path, default=ROOT.parent / "shared" / "data" / "sailor")
    parser.add_argument("--published-dir", type=Path, default=ROOT.parent / "shared" / "data" / "published")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    parser.add_argument("--write-calibration", action="store_true",
                        help="also write models/calibration/torchtitan.json (what torchtitan imports are priced with)")
    args = parser.parse_args()
    if args.published_dir.is_dir():
        from chameleon_opt.perf.model import SHARDED_OVERLAP_INTERFERENCE
        from chameleon_opt.perf.published import is_fp8
        args.out.mkdir(parents=True, exist_ok=True)
        runs, refused, memory_only = published_runs(args.published_dir)
        proxy_runs = proxy_die_runs(runs)  # their own section, in no fit
        runs = [r for r in runs if r not in proxy_runs]
        cp_runs = [r for r in runs if context_parallel(r) > 1]  # their own section, in no fit
        fp8_runs = [r for r in runs if is_fp8(r) and context_parallel(r) == 1]
        runs = [r for r in runs if not is_fp8(r) and context_parallel(r) == 1]  # fp8 rows: their own section
        terms = {r.id: step_terms_of(r) for r in runs}
        # The two FSDP families price each other: llm-foundry's fit prices torchtitan's runs, torchtitan's
        # (the model's SHARDED_OVERLAP_INTERFERENCE) prices llm-foundry's.
        foundry = published_interference(runs, terms)
        (held_out,) = foundry.values()
        fit = other_stacks_fit(fitted_runs(runs), held_out)
        torchtitan = torchtitan_validation(fit, held_out)
        if args.write_calibration:
            from chameleon_opt.perf.calibration import calibration_path
            path = calibration_path("torchtitan")
            path.write_text(json.dumps(torchtitan_calibration(fit, held_out), indent=1) + "\n")
            console.print(f"wrote {path}")
        (args.out / "validate_perf_torchtitan.json").write_text(json.dumps(torchtitan, indent=1))
        plot_torchtitan(torchtitan, args.out / "validate_perf_torchtitan.png")
        for r in torchtitan["rows"]:
            memory = "" if r["error_mem"] is None else f"  memory {r['error_mem']:+.1%}"
            console.print(f"torchtitan {r['id']:22s} time {r['error_time']:+.1%}{memory}")
        console.print(f"ZeRO-3 overlap interference: fitted on llm-foundry {held_out:.3f} (prices torchtitan), "
                      f"on torchtitan {torchtitan['fitted_interference']:.3f} (prices llm-foundry); "
                      f"model constant {SHARDED_OVERLAP_INTERFERENCE}")
        published = published_validation(runs, refused, terms, torchtitan["fitted_interference"], memory_only)
        args.out.mkdir(parents=True, exist_ok=True)
        lines = render_published(published, args.out) + render_torchtitan(torchtitan)
        twice = remeasured(published, args.published_dir)
        twice["earlier_only"] = earlier_only(published, args.published_dir)
        published["remeasured"] = twice
        lines += render_remeasured(twice)
        fp8 = fp8_validation(runs, fp8_runs, refused, torchtitan["fitted_interference"], torchtitan["refused"])
        lines += render_fp8(fp8)
        (args.out / "validate_perf_fp8.json").write_text(json.dumps(fp8, indent=1))
        found = cp_validation(runs, cp_runs, fp8["ratios"], torchtitan["fitted_interference"])
        lines += render_cp(found)
        (args.out / "validate_perf_cp.json").write_text(json.dumps(found, indent=1))
        proxy = proxy_validation(runs, proxy_runs, fp8["ratios"], torchtitan["fitted_interference"],
                                 args.published_dir)
        lines += render_proxy(proxy)
        (args.out / "validate_perf_proxy.json").write_text(json.dumps(proxy, indent=1))
        (args.out / "validate_perf_published.md").write_text("\n".join(lines) + "\n")
        (args.out / "validate_perf_published.json").write_text(json.dumps(published, indent=1))
    else:
        console.print(f"[yellow]no published tables at {args.published_dir}: skipping them[/]")
    sailor = sailor_validation(args.sailor_dir) if args.sailor_dir.is_dir() else None
    if sailor is None:
        console.print(f"[yellow]no Sailor data at {args.sailor_dir}: skipping the measured-plan check[/]")
    render(sailor, megatron_validation(), args.out)


if __name__ == "__main__":
    main()
