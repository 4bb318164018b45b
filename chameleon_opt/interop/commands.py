"""The `import` and `export-plan` commands: from a running job's config to a recovery plan the
trainer can run, in two commands:

    chameleon-solve import torchtitan job.toml --world-size 16 --failed 13 -o job.json
    chameleon-solve export-plan job.json --format torchtitan -o recovery.json

Registered on the main app by `chameleon_opt.cli`; no torch here.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Any

import typer

from chameleon_opt.console import fail, stderr, stdout
from chameleon_opt.errors import ChameleonError, InputError
from chameleon_opt.incident import FAILED, FAILED_NODE, REPLACE_FAILURES, failed_devices
from chameleon_opt.plan import device_list

import_app = typer.Typer(no_args_is_help=True, help="Read a trainer's job config into an instance "
                         "(device ids = the trainer's global ranks).")


class Format(str, Enum):
    torchtitan = "torchtitan"
    megatron = "megatron"
    ranks = "ranks"


class ExportPolicy(str, Enum):
    auto = "auto"                # Eq. 8, as `plan` decides (the default); a hybrid exports its final plan
    reroute = "reroute"          # a rerouting can be exported as --format ranks only
    reconfigure = "reconfigure"  # a plan the trainer restarts into


def _write_json(document: dict[str, Any], output: Path | None, force: bool) -> None:
    """Print, or write under the project's output rule (never over a file without --force)."""
    from chameleon_opt.output import write_output

    text = json.dumps(document, indent=1) + "\n"
    if output is None:
        print(text, end="")
    else:
        write_output(output, "--output", force, lambda tmp: tmp.write_text(text))


def _report_failed(document: dict[str, Any]) -> None:
    """Name the stage and TP group of every failed rank (on stderr: stdout may carry the instance)."""
    from chameleon_opt.instance.load import build_instance
    from chameleon_opt.interop.common import locate_rank

    instance = build_instance(document)
    for event in document.get("failures", {}).get("events", []):
        for rank in event["devices"]:
            place = locate_rank(instance, rank)
            stderr.print(f"rank {rank}: pipeline (DP replica) {place.pipeline}, stage {place.stage}, TP rank "
                         f"{place.tp_rank} of group {list(place.tp_group)}, layers [{place.layers[0]}, "
                         f"{place.layers[1]})", highlight=False)


_OUT = typer.Option(None, "--output", "-o", help="instance file to write (default: stdout)")
_FAILED = typer.Option(None, "--failed", help="failed global ranks of the job, e.g. 13 or 8-11,13")
_WORLD = typer.Option(None, "--world-size", help="ranks of the job (the launcher's nnodes x nproc-per-node)")
_PER_NODE = typer.Option(8, "--devices-per-node", help="ranks per node")
_DEVICE = typer.Option("H100-80", "--device-type", help="a device type of the catalogue")
_MODEL = typer.Option(None, "--model", help="catalogue model name, workload file, or Hugging Face config.json")
_FORCE = typer.Option(False, "--force", help="overwrite an existing output file")


@import_app.command("torchtitan")
def import_torchtitan_command(file: Path = typer.Argument(..., help="torchtitan job config: a train_configs TOML, or "
                                                          "the JSON --debug.save_config_file writes"),
                              world_size: int = _WORLD, devices_per_node: int = _PER_NODE,
                              device_type: str = _DEVICE, model: str = _MODEL, failed: str = _FAILED,
                              output: Path = _OUT, force: bool = _FORCE) -> None:
    """An instance from a torchtitan job config (rank order: torchtitan's device mesh); a setting
    the planner cannot model is refused (exit 2) with the key to change."""
    from chameleon_opt.interop.common import ClusterOptions, parse_ranks
    from chameleon_opt.interop.torchtitan import import_torchtitan
    from chameleon_opt.output import check_output

    try:
        if output is not None:
            check_output(output, "--output", force)
        document = import_torchtitan(file, ClusterOptions(world_size, devices_per_node, device_type),
                                     parse_ranks(failed), model)
        _report_failed(document)
        _write_json(document, output, force)
    except ChameleonError as err:
        fail(err)


@import_app.command("megatron", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def import_megatron_command(ctx: typer.Context, world_size: int = _WORLD, devices_per_node: int = _PER_NODE,
                            device_type: str = _DEVICE, model: str = _MODEL, failed: str = _FAILED,
                            output: Path = _OUT, force: bool = _FORCE) -> None:
    """An instance from Megatron-LM arguments: the launch line's arguments, a file of them, or the
    bash launch script (its variables expanded); rank order tp-dp-pp, or tp-pp-dp with
    --use-tp-pp-dp-mapping. Without --vocab-size (the tokenizer's), pass --model."""
    from chameleon_opt.interop.common import ClusterOptions, parse_ranks
    from chameleon_opt.interop.megatron import import_megatron
    from chameleon_opt.output import check_output

    try:
        if not ctx.args:
            raise InputError(None, "ARGS", "no Megatron-LM arguments", "give the launch line's arguments or a file")
        if output is not None:
            check_output(output, "--output", force)
        document = import_megatron(list(ctx.args), ClusterOptions(world_size, devices_per_node, device_type),
                                   parse_ranks(failed), model)
        _report_failed(document)
        _write_json(document, output, force)
    except ChameleonError as err:
        fail(err)


def export_plan_command(file: Path = typer.Argument(None, help="instance file (its failures are planned for)"),
                        fmt: Format = typer.Option(Format.ranks, "--format", help="the trainer's vocabulary"),
                        output: Path = typer.Option(None, "--output", "-o",
                                                    help="file to write: .json, or .toml (torchtitan, uniform plan)"),
                        policy: ExportPolicy = typer.Option(ExportPolicy.auto, "--policy",
                                                            help="the same default decision as `plan` (auto)"),
                        time_limit: float = typer.Option(10.0, "--time-limit", min=0.01,
                                                         help="seconds for the whole decision, as `plan`"),
                        target: str = typer.Option(None, "--target", metavar="any|megatron|torchtitan",
                                                   help="the plan space (default: the --format's trainer, so the "
                                                        "export runs as it is; `any` for every plan)"),
                        schema: bool = typer.Option(False, "--schema", help="print the format's JSON Schema"),
                        force: bool = _FORCE, failed_ids: list[str] = FAILED, failed_node: list[str] = FAILED_NODE,
                        replace_failures: bool = REPLACE_FAILURES) -> None:
    """Write the plan a trainer runs: the recovery plan for the failed ranks (the file's and
    --failed/--failed-node; with none, the current plan) as parallelism settings when uniform,
    per-rank module lists and micro-batch counts always. Says what it wrote (on stderr when the
    plan itself goes to stdout)."""
    from chameleon_opt.interop.export import export_plan, export_schema

    if schema:
        print(json.dumps(export_schema(fmt.value), indent=1))
        return
    try:
        if file is None:
            raise InputError(None, "FILE", "no instance given", "give an instance file, or --schema")
        from chameleon_opt.instance.load import load_instance
        from chameleon_opt.output import check_output, write_output

        if output is not None:
            check_output(output, "--output", force)
        toml = output is not None and output.suffix.lower() == ".toml"
        if toml and fmt is not Format.torchtitan:
            raise InputError(output, "--output", "TOML is torchtitan's format", "write .json for this format")
        instance = load_instance(file)
        failed = failed_devices(instance, failed_ids, failed_node, replace_failures)
        if failed:
            from chameleon_opt.api import Planner

            space = target or (fmt.value if fmt.value in ("megatron", "torchtitan") else "any")
            decision = Planner(instance, policy=policy.value, time_limit_s=time_limit,
                               target=space).on_failure(sorted(failed))
            lowered, chosen = decision.rank_plans, decision.policy
        else:
            from chameleon_opt.planning import current_rank_plans
            from chameleon_opt.solve.deadline import Deadline

            lowered, chosen = current_rank_plans(instance, Deadline.after(time_limit)), "initial"
        document = export_plan(instance, lowered, fmt.value, chosen)
        if toml:
            from chameleon_opt.interop.torchtitan import settings_toml

            if not document["uniform"]:
                raise InputError(output, "--output", "the plan is uneven: torchtitan's degrees cannot express it",
                                 "write .json (per-rank module lists)")
            source = instance.spec.trainer
            if source is not None and source.era == "python":
                raise InputError(output, "--output", "the job was imported from a Python-era torchtitan config, "
                                 "which torchtitan no longer reads from TOML", "write .json and set its `config` "
                                 "values in your config function")
            header = [f"chameleon-solve export-plan {file.name}: {chosen} plan, {document['world_size']} ranks",
                      "new rank <- old rank: " + ", ".join(f"{r['rank']}<-{r['device']}" for r in document["ranks"]),
                      "launch node by node (static rendezvous; ranks are consecutive per node):"]
            header += [f"  node {n['node']}: CUDA_VISIBLE_DEVICES={n['cuda_visible_devices']} torchrun "
                       + " ".join(n["torchrun"]) + " ..." for n in document["nodes"]]
            text = settings_toml(document["config"], header)
            write_output(output, "--output", force, lambda tmp: tmp.write_text(text))
        else:
            _write_json(document, output, force)
    except ChameleonError as err:
        fail(err)
    decided = "the final plan of the hybrid decision (the layout after its switch)" if chosen == "hybrid" else \
        f"the {chosen} plan"
    what = f"{decided} for failed ranks {device_list(sorted(failed))}" if failed else "the current plan (nothing failed)"
    (stderr if output is None else stdout).print(
        f"{'wrote ' + str(output) if output else 'printed'}: {what}, {fmt.value} format, {document['world_size']} "
        f"ranks, {'uniform' if document['uniform'] else 'uneven (per-rank module lists only)'}",
        highlight=False, markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.add_typer(import_app, name="import")
    app.command("export-plan")(export_plan_command)
