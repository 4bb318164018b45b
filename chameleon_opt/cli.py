"""`chameleon-solve`: the operator's command line (contract: docs/cli-contract.md).

Solver, scheduling and simulation modules are imported inside the commands that use them, so
that start-up and `--help` stay fast (ortools alone takes half a second to import).

Human output is rich tables on stdout; `--json` prints exactly one JSON object on stdout. Every
ChameleonError becomes one line on stderr and its exit code; no traceback reaches the user.
torch is never imported here (start-up must stay fast).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import sys
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from typer.core import TyperGroup

from chameleon_opt.console import emit_json, fail, parse_kill, stderr, stdout
from chameleon_opt.describe import devices, duration, failure_title, layout_lines, percent, same_layout, sig
from chameleon_opt.errors import ChameleonError, InputError
from chameleon_opt.incident import (COMMAND_LINE, FAILED, FAILED_NODE, REPLACE_FAILURES, NothingFailed,
                                    failed_devices)
from chameleon_opt.instance.load import load_instance
from chameleon_opt.instance.schema import InstanceSpec
from chameleon_opt.perf.model import GIB, Estimate, PerfModel
from chameleon_opt.perf.reroute import even_reroute
from chameleon_opt.plan import device_list

if TYPE_CHECKING:
    from rich.table import Table

    from chameleon_opt.planning import RecoveryDecision
    from chameleon_opt.solve.backends import SolverOptions

PANELS = {
    "Failure": ("--failed", "--failed-node", "--replace-failures", "--after-failure", "--joined", "--next-fault-s",
                "--trace", "--suite", "--cadence", "--seeds", "--horizon-hours"),
    "Decision": ("--policy", "--target", "--time-limit", "--deterministic"),
    "Solver": ("--backend", "--threads", "--seed", "--solver-log", "--params"),
    "Output": ("--json", "--stages", "--gantt", "--migration-plot", "--plot", "--output", "--force", "--format",
               "--schema"),
}
"""Help panels of the commands an operator runs in an incident (PANELLED); an option keeps its
panel across commands, so `--time-limit` is under Decision wherever it appears."""
PANELLED = ("plan", "estimate", "export-plan", "simulate", "compare")
HELP_WIDTH = 110
"""Help is laid out at least this wide (TERMINAL_WIDTH overrides): at 80 columns Typer cut option
names and choices (`--kill-in-transit…`, `reconfigur e`)."""
_CLICK_ERROR = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
"""Click's usage-error base (BadParameter, NoSuchOption, MissingParameter...), wherever this
Typer version keeps Click (vendored since 0.23)."""


def _flag_help(make: Any) -> Any:
    """Click builds --help per context, after the flags were tidied: it shows no `<bool>` either."""
    def help_option(ctx: Any) -> Any:
        option = make(ctx)
        if option is not None:
            option.metavar = ""
        return option
    return help_option


class _Commands(TyperGroup):
    """Typer's command group, with the CLI contract kept for usage errors and the help tidied.

    A usage error (a bad flag value, an unknown option) is reported by Click before any command
    runs, so no command's `--json` handling sees it: here it gets the contract's one JSON object
    on stdout too. Flags show no `<bool>` type, and the incident commands' options are grouped
    into PANELS."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        panel_of = {name: panel for panel, names in PANELS.items() for name in names}
        order = {panel: rank for rank, panel in enumerate(PANELS, start=1)}
        for name, command in self.commands.items():
            for param in getattr(command, "params", ()):
                if getattr(param, "is_flag", False) and param.metavar is None:
                    param.metavar = ""
                long = next((o for o in getattr(param, "opts", ()) if o.startswith("--")), None)
                if name in PANELLED and long in panel_of:
                    param.rich_help_panel = panel_of[long]
            if name in PANELLED:  # panels in PANELS' order, after the arguments and unpanelled options
                command.params.sort(key=lambda param: order.get(getattr(param, "rich_help_panel", None), 0))
            command.get_help_option = _flag_help(command.get_help_option)
        self.get_help_option = _flag_help(self.get_help_option)

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        self.wants_json = "--json" in args
        try:
            return super().make_context(info_name, args, parent, **extra)
        except _CLICK_ERROR as err:
            self._usage_json(err)
            raise

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except _CLICK_ERROR as err:
            self._usage_json(err)
            raise

    def _usage_json(self, err: Any) -> None:
        if getattr(self, "wants_json", False):
            print(json.dumps({"format": 1, "error": type(err).__name__, "reason": err.format_message(),
                              "exit_code": err.exit_code}))


if "TERMINAL_WIDTH" not in os.environ:  # Typer reads it when it lays out help and usage errors
    os.environ["TERMINAL_WIDTH"] = str(max(shutil.get_terminal_size((HELP_WIDTH, 24)).columns, HELP_WIDTH))

app = typer.Typer(cls=_Commands, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Plan recovery of DP x PP x TP training jobs from accelerator failures.")


def _print_version(value: bool) -> None:
    if value:
        from chameleon_opt import __version__

        print(f"chameleon-solve {__version__}")
        raise typer.Exit()


class LogLevel(str, Enum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


@app.callback()
def _options(version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                          help="print the version and exit"),
             log_level: LogLevel = typer.Option(LogLevel.warning, "--log-level",
                                                help="Python logging on stderr (the toolkit's and its libraries')")
             ) -> None:
    """Plan recovery of DP x PP x TP training jobs from accelerator failures."""
    import logging

    logging.basicConfig(level=log_level.value.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


POLICY_NAMES = ("chameleon", "chameleon-paper", "hybrid", "recycle", "oobleck", "bamboo", "checkpoint",
                "reroute-only", "reconfigure-only", "templates-ablation",
                "even-reroute-ablation", "redundancy-ablation")
"""Simulation policies (recovery.registry.POLICIES), named here so that `--help` stays fast."""


class Backend(str, Enum):
    cpsat = "cpsat"
    highs = "highs"
    cbc = "cbc"


class Policy(str, Enum):
    auto = "auto"  # reroute, reconfigure and the hybrid of both, chosen by Eq. 8
    reroute = "reroute"
    reconfigure = "reconfigure"


class Target(str, Enum):
    any = "any"                # the full plan space (rerouting, uneven pipelines, per-stage relief)
    megatron = "megatron"      # uniform replicas, equal micro-batches: what Megatron-LM runs as it is
    torchtitan = "torchtitan"  # the same restriction for torchtitan


@app.command()
def validate(file: Path = typer.Argument(..., help="instance file (JSON or YAML)")) -> None:
    """Check an instance file; exit 0 when valid, 2 with a one-line reason when not."""
    try:
        instance = load_instance(file)
    except ChameleonError as err:
        fail(err)
    plan = instance.plan
    stdout.print(f"[green]valid[/]: {instance.name}: {instance.num_devices} devices, workload "
                 f"{instance.workload.name} ({instance.workload.num_layers} layers), "
                 f"{len(plan.pipelines)} pipelines x up to {max(len(p.stages) for p in plan.pipelines)} stages, "
                 f"TP {plan.tensor_parallel}, {len(instance.failed_devices)} failed devices")


def _estimate_table(estimate: Estimate, title: str, failed: frozenset[int]) -> Table:
    from rich.table import Table

    table = Table(title=title)
    for column in ("pipe", "stage", "devices", "layers", "fwd s", "bwd s", "rerouted", "mem GiB", "cap GiB",
                   "relief", "relief +s"):
        table.add_column(column, justify="right")
    for j, (pipe, plan_pipe) in enumerate(zip(estimate.pipelines, estimate.plan.pipelines)):
        for s, (cost, stage) in enumerate(zip(pipe.stages, plan_pipe.stages)):
            shown = device_list(stage.devices)
            dead = sorted(failed.intersection(stage.devices))
            if dead:  # name the failed ones: in a TP group of two, "12,13 failed" would read as both
                shown = f"{shown} [red]({device_list(dead)} failed)[/]"
            over = cost.memory_bytes > cost.memory_capacity_bytes
            table.add_row(str(j) if s == 0 else "", str(s), shown, f"{stage.first}-{stage.end - 1}",
                          f"{cost.forward_s:.4g}", f"{cost.backward_s:.4g}",
                          sig(pipe.extra_micro_batches[s]) if pipe.extra_micro_batches[s] else "",
                          f"[red]{cost.memory_bytes / GIB:.2f}[/]" if over else f"{cost.memory_bytes / GIB:.2f}",
                          f"{cost.memory_capacity_bytes / GIB:.2f}", cost.relief, _relief_cost(cost))
        if len(estimate.pipelines) > 8 and j == 3:
            table.add_row("...", f"{len(estimate.pipelines) - 4} more pipelines", *[""] * 9)
            break
    return table


def _relief_cost(cost: Any) -> str:
    """What a stage's relief costs: seconds added per micro-batch (forward + backward, against
    keeping every activation on the device) and to the optimizer step."""
    parts = [f"{cost.relief_s:+.3g}/mb"] if cost.relief_s else []
    parts += [f"{cost.relief_optimizer_s:+.3g} opt"] if cost.relief_optimizer_s else []
    return " ".join(parts) or "0"


@app.command()
def estimate(file: Path = typer.Argument(..., help="instance file (JSON or YAML)"),
             as_json: bool = typer.Option(False, "--json", help="print one JSON object (docs/cli-contract.md)"),
             after_failure: bool = typer.Option(False, "--after-failure",
                                                help="evaluate the rerouted plan after the failures (implied by "
                                                     "--failed and --failed-node)"),
             failed_ids: list[str] = FAILED, failed_node: list[str] = FAILED_NODE,
             replace_failures: bool = REPLACE_FAILURES) -> None:
    """Predict step time, throughput and memory of the instance's current plan (or, after a
    failure, of its even rerouting)."""
    try:
        instance = load_instance(file)
        model = PerfModel(instance)
        plan, failed = instance.plan, frozenset()
        if after_failure or failed_ids or failed_node:
            after_failure = True
            failed = failed_devices(instance, failed_ids, failed_node, replace_failures)
            if not failed:
                raise NothingFailed(instance)
            plan = even_reroute(plan, failed)
        result = model.evaluate(plan, failed)
    except ChameleonError as err:
        fail(err, as_json)
    if as_json:
        emit_json(result.to_json())
        return
    title = (f"{instance.name}: after {devices(failed)} failed, rerouted by the even split (Eq. 12/13)"
             if after_failure else f"{instance.name}: current plan")
    stdout.print(_estimate_table(result, title, failed))
    b = result.breakdown_s
    stdout.print(f"step {sig(result.iteration_time_s)} s, {sig(result.throughput_samples_per_s)} samples/s, "
                 f"memory {'ok' if result.memory_ok else '[red]over capacity[/]'}")
    if after_failure:
        stdout.print("(the even split; `plan` also weighs solver-chosen shares and bubble filling, and its reroute "
                     "row names the one it keeps)", style="dim")
    stdout.print("breakdown: " + ", ".join(f"{k} {sig(v)} s" for k, v in b.items()), soft_wrap=True)
    stdout.print(_memory_table(result))
    for line in result.assumptions:
        stdout.print(f"assumed: {line}", markup=False, highlight=False)
    for line in result.memory_violations()[:5]:
        stdout.print(f"[red]memory:[/] {line}")


def _memory_table(estimate: Estimate) -> Table:
    """Per-stage memory by term (GiB) of the first pipeline, and of any other stage over capacity."""
    from rich.table import Table

    from chameleon_opt.perf.memory import MEMORY_TERMS

    table = Table(title="memory per device by term (GiB)")
    for column in ("pipe", "stage", *MEMORY_TERMS, "total", "cap"):
        table.add_column(column, justify="right")
    for j, pipe in enumerate(estimate.pipelines):
        for s, cost in enumerate(pipe.stages):
            over = cost.memory_bytes > cost.memory_capacity_bytes
            if cost.memory is None or (j > 0 and not over):
                continue
            terms = cost.memory.as_dict()
            table.add_row(str(j), str(s), *(f"{terms[t] / GIB:.2f}" for t in MEMORY_TERMS),
                          f"[red]{cost.memory_bytes / GIB:.2f}[/]" if over else f"{cost.memory_bytes / GIB:.2f}",
                          f"{cost.memory_capacity_bytes / GIB:.2f}")
    return table


@app.command()
def calibrate(sailor: Path = typer.Option(None, "--sailor", help="Sailor's data folder (measured-plans/, "
                                          "network_coeffs_all_homo.json): fits the framework memory overhead"),
              output: Path = typer.Option(None, "-o", "--output", help="default: models/calibration/sailor.json"),
              withhold: list[str] = typer.Option([], "--withhold", metavar="MODEL@DEVICE", help="MODEL@DEVICE profile to leave out"),
              force: bool = typer.Option(False, "--force", help="overwrite an existing file")) -> None:
    """Fit per-device time efficiencies from the catalogue's profiles and the framework's memory
    overhead from measured plans; write them next to the catalogue, saying what each came from."""
    from chameleon_opt.output import write_output
    from chameleon_opt.perf.calibration import calibration_path
    from chameleon_opt.perf.sailor_fit import calibrate_sailor
    try:
        pairs = set()
        for item in withhold:
            if "@" not in item:
                raise InputError(COMMAND_LINE, "--withhold", f"{item!r}", "give MODEL@DEVICE, e.g. opt-350m@GH-96")
            model_name, device = item.split("@", 1)
            pairs.add((model_name, device))
        if sailor is not None and not (sailor / "measured-plans").is_dir():
            raise InputError(sailor, "--sailor", "no measured-plans/ folder", "give Sailor's data folder")
        fitted = calibrate_sailor(sailor, pairs)
        path = output or calibration_path(fitted.name)
        if output is None:
            path.parent.mkdir(parents=True, exist_ok=True)  # the catalogue's calibration folder
        text = json.dumps({"format": 1, "framework": fitted.name, **fitted.to_json()}, indent=1) + "\n"
        write_output(path, "--output", force, lambda temporary: temporary.write_text(text))
    except ChameleonError as err:
        fail(err)
    stdout.print(f"wrote {path}: framework {fitted.name}, memory efficiency {fitted.memory_efficiency:.4f}, "
                 f"overhead {fitted.overhead_gib if fitted.overhead_gib is not None else '-'} GiB")
    for name, device in sorted(fitted.devices.items()):
        stdout.print(f"  {name}: compute efficiency {device.compute_efficiency:.4f} from "
                     f"{', '.join(device.fitted_on)}", markup=False, highlight=False)


def _solver_options(backend: str, threads: int, seed: int, solver_log: bool, params: list[str]) -> "SolverOptions":
    """--backend, --threads, --seed, --solver-log and --params KEY=VALUE as one SolverOptions."""
    from chameleon_opt.solve.backends import SolverOptions

    pairs = {}
    for item in params:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(COMMAND_LINE, "--params", f"{item!r} is not KEY=VALUE", "write e.g. --params mip_rel_gap=1e-4")
        pairs[key] = value
    return SolverOptions(backend, threads, seed, solver_log, pairs)


def _plan_pictures(name: str, decision: "RecoveryDecision", failed: frozenset[int], devices_per_node: int,
                   gantt: Path | None, migration_plot: Path | None, force: bool) -> list[Path]:
    """Draw and write the requested pictures of a decision; a hybrid's Gantt chart shows the
    interim rerouted step above the reconfigured one."""
    if gantt is None and migration_plot is None:
        return []
    from chameleon_opt.output import save_figure
    from chameleon_opt.plots import gantt_figure, migration_figure

    written = []
    if gantt is not None:
        panels = [(f"{name}: {decision.policy}", decision.estimate)]
        if decision.interim is not None:
            panels = [(f"{name}: now, rerouted (interim)", decision.interim.estimate),
                      (f"{name}: after the switch, reconfigured", decision.estimate)]
        written.append(save_figure(gantt_figure(panels, failed), gantt, "--gantt", force))
    if migration_plot is not None:
        assert decision.communication is not None
        figure = migration_figure(decision.communication.migration, devices_per_node, failed,
                                  f"{name}: {decision.policy} migration", decision.num_devices)
        written.append(save_figure(figure, migration_plot, "--migration-plot", force))
    return written


def _plan_join(instance: Any, failed: frozenset[int], joined: frozenset[int], options: Any, deadline: Any) -> Any:
    """The instance's failures recovered (the plan running when the devices come back), then the
    return of `joined` planned on top (rejoin.plan_join)."""
    from chameleon_opt.planning import plan_recovery
    from chameleon_opt.rejoin import plan_join

    stray = sorted(joined - failed)
    if stray:
        raise InputError(COMMAND_LINE, "--joined", f"device {stray[0]} has not failed in the instance",
                         f"pass failed devices ({sorted(failed)})")
    with stderr.status(f"planning the return of {sorted(joined)} to {instance.name}..."):
        running = plan_recovery(instance, failed, options, deadline.share(0.4))
        layout = dataclasses.replace(running.plan, rerouted=())
        return plan_join(dataclasses.replace(instance, plan=layout), running.plan, failed, joined, options, deadline)


@app.command()
def plan(file: Path = typer.Argument(..., help="instance file (JSON or YAML)"),
         policy: Policy = typer.Option(Policy.auto, help="auto: choose by Eq. 8; or force one candidate"),
         target: Target = typer.Option(Target.any, "--target",
                                       help="plan only what this trainer runs as it is (uniform replicas, equal "
                                            "micro-batches, no rerouting) and say what that costs"),
         time_limit: float = typer.Option(10.0, "--time-limit", min=0.01,
                                          help="seconds for the whole decision (search, rerouting, communication); "
                                               "what runs out of time says so in `stages`"),
         backend: Backend = typer.Option(Backend.cpsat, "--backend", help="the plan search's level model solver"),
         threads: int = typer.Option(1, min=1, help="solver threads"),
         seed: int = typer.Option(0, help="solver random seed"),
         solver_log: bool = typer.Option(False, "--solver-log", help="every solver's own log on stderr"),
         params: list[str] = typer.Option([], "--params", metavar="KEY=VALUE", help="KEY=VALUE passed to the --backend solver by its own "
                                          "option name (repeat), e.g. linearization_level=1 or mip_rel_gap=1e-3"),
         next_fault_s: float = typer.Option(None, "--next-fault-s", min=0.0,
                                            help="time to the next fault D (overrides the instance)"),
         gantt: Path = typer.Option(None, "--gantt", help="write the chosen plan's 1F1B step as a Gantt chart "
                                    "(PNG, SVG or PDF)"),
         migration_plot: Path = typer.Option(None, "--migration-plot",
                                             help="write the migration's transfers by round (PNG, SVG or PDF)"),
         force: bool = typer.Option(False, "--force", help="overwrite existing picture files"),
         joined: list[int] = typer.Option([], "--joined", metavar="ID", help="a failed device that is back without state "
                                          "(repeat): plan its return (keep running, take back rerouted slots, or "
                                          "scale up) instead of the failure"),
         as_json: bool = typer.Option(False, "--json", help="print one JSON object (docs/cli-contract.md)"),
         failed_ids: list[str] = FAILED, failed_node: list[str] = FAILED_NODE,
         replace_failures: bool = REPLACE_FAILURES,
         stages_table: bool = typer.Option(False, "--stages", help="also print each plan's per-stage times, "
                                           "memory and relief"),
         tp_degrees: str = typer.Option("", "--tp-degrees", metavar="T,T,...",
                                        help="TP degrees a reconfiguration may move to (e.g. 1,2,4; each divides the "
                                             "devices per node and the model's heads, KV heads and MLP size): each "
                                             "is searched, a change re-shards the state from the last step's "
                                             "checkpoint (network.checkpoint_read_gbps)")) -> None:
    """Plan the recovery from the failures (the file's and --failed/--failed-node), or, with
    --joined, the return of devices: candidates, scores, the chosen plan."""
    import time

    begun = time.perf_counter()  # the deadline counts from here: imports and loading are inside it
    if _STARTED is not None:  # or from the end of the start-up allowance, if that came first (a slow start)
        begun = min(begun, _STARTED + STARTUP_ALLOWANCE_S)
    from chameleon_opt.output import check_figure_output
    from chameleon_opt.planning import PlanningOptions, plan_recovery
    from chameleon_opt.solve.deadline import Deadline

    try:
        if gantt is not None:
            check_figure_output(gantt, "--gantt", force)
        if migration_plot is not None:
            check_figure_output(migration_plot, "--migration-plot", force)
        options = PlanningOptions(policy.value, time_limit, _solver_options(backend.value, threads, seed, solver_log, params),
                                  next_fault_s, target=target.value, tp_degrees=_degrees(tp_degrees))
        instance = load_instance(file)
        failed = failed_devices(instance, failed_ids, failed_node, replace_failures)
        if not failed:
            raise NothingFailed(instance)
        instance = dataclasses.replace(instance, failed_devices=failed)
        if joined:
            decision = _plan_join(instance, failed, frozenset(joined), options, Deadline.after(time_limit, begun))
            failed = decision.failed
        else:
            with stderr.status(f"planning recovery of {instance.name} ({len(failed)} failed devices)..."):
                decision = plan_recovery(instance, failed, options, Deadline.after(time_limit, begun))
        planned_s = time.perf_counter() - begun
        written = _plan_pictures(instance.name, decision, failed, instance.devices_per_node, gantt, migration_plot,
                                 force)
    except ChameleonError as err:
        fail(err, as_json)
    migration, allreduce_rounds = decision.communication.migration, [list(r) for r in decision.allreduce_rounds]
    assert decision.solve is not None and decision.communication is not None  # every option has both
    solve = decision.solve.to_json()
    if as_json:
        payload = {"format": 1, "policy": decision.policy, "reason": decision.reason,
                   "candidates": [c.to_json() for c in decision.candidates], "plan": decision.plan.to_json(),
                   "iteration_time_s": decision.iteration_time_s, "solve": solve,
                   "migration": migration.to_json(), "allreduce_rounds": allreduce_rounds,
                   "communication": decision.communication.to_json(),
                   "time_limit_s": time_limit, "wall_s": planned_s,
                   "stages": [stage.to_json() for stage in decision.stages],
                   "stopped_early": decision.stopped_early}
        if decision.reshard is not None:
            payload["tensor_parallel_change"] = decision.reshard.to_json()
        if decision.interim is not None:
            payload["interim"] = {"plan": decision.interim.plan.to_json(),
                                  "iteration_time_s": decision.interim.iteration_time_s,
                                  "solve": decision.interim.solve.to_json() if decision.interim.solve else None}
        if written:
            payload["files"] = [str(path) for path in written]
        emit_json(payload)
        return
    _print_decision(instance, decision, options, joined, planned_s, stages_table)
    for path in written:
        stdout.print(f"wrote {path}")


def _print_decision(instance: Any, decision: "RecoveryDecision", options: Any, joined: list[int], planned_s: float,
                    stages_table: bool) -> None:
    """The human answer: the candidates, what to do now and after the switch device by device,
    why, and what the solver proved; numbers rounded to what an operator acts on."""
    from rich.table import Table

    failed, chosen = decision.failed, next(c for c in decision.candidates if c.policy == decision.policy)
    title = (f"{instance.name}: return of {devices(joined)}" if joined else
             failure_title(instance.name, failed, instance.num_devices, instance.devices_per_node))
    table = Table(title=title, caption="pause: time without training; samples/s: Eq. 8's rate until the next fault")
    for column in ("policy", "usable", "step s", "pause s", "samples/s", "why"):
        table.add_column(column, justify="right" if column not in ("policy", "why") else "left")
    for c in decision.candidates:
        mark = "[bold green]" if c is chosen else ""
        table.add_row(f"{mark}{c.policy}", "yes" if c.feasible else "[red]no[/]",
                      sig(c.iteration_time_s) if c.estimate else "-", sig(c.transition_s) if c.feasible else "-",
                      sig(c.score) if c.feasible else "-", c.reason)
    stdout.print(table)
    migration = decision.communication.migration if decision.communication else None
    moves = ""
    if migration is not None and migration.transfers:
        moves = (f"{sig(migration.total_bytes / 1e9)} GB of layers move to "
                 f"{devices({t.dst for t in migration.transfers})} in {migration.rounds} rounds, "
                 f"{sig(migration.makespan_s)} s (lower bound {sig(migration.lower_bound_s)} s)")
    step = f"{sig(decision.iteration_time_s)} s per step"
    if decision.interim is not None:
        background = max(next(c for c in decision.candidates if c.policy == "reconfigure").transition_s
                         - decision.transition_s, 0.0)
        stdout.print(f"decision: [bold]{decision.policy}[/]: reroute now ({sig(decision.interim.iteration_time_s)} s "
                     f"per step); search and move state in the background for {sig(background)} s, then pause "
                     f"{sig(decision.transition_s)} s to switch to the new layout ({step})", soft_wrap=True)
        sections = [(f"now, rerouted ({sig(decision.interim.iteration_time_s)} s per step)", decision.interim),
                    (f"after the switch ({step})", decision)]
    elif same_layout(decision.plan, instance.plan) or not moves and decision.plan.rerouted:
        work = ", reroute the failed work now" if decision.plan.rerouted else ""
        stdout.print(f"decision: [bold]{decision.policy}[/]: keep the layout{work} ({step})", soft_wrap=True)
        sections = [(f"now ({step})", decision)]
    else:
        stdout.print(f"decision: [bold]{decision.policy}[/]: pause {sig(decision.transition_s)} s (search, state "
                     f"migration, process groups), then run the new layout ({step})", soft_wrap=True)
        sections = [(f"after the pause ({step})", decision)]
    stdout.print(f"why: {_why(instance, decision, options)}", highlight=False, soft_wrap=True)
    reshard = decision.reshard
    if reshard is not None:
        moves = (f"TP degree changes {reshard.from_tp} -> {reshard.to_tp}: every device reads its new shards from the "
                 f"last step's checkpoint, {sig(reshard.total_bytes / 1e9)} GB to "
                 f"{devices(set(reshard.bytes_per_device))}, {sig(reshard.read_s)} s at {sig(reshard.read_gbps)} GB/s "
                 "each (no peer-to-peer migration across TP degrees)")
    for heading, part in sections:
        stdout.print(f"\n[bold]{heading}[/]:")
        if part is decision and moves:
            when = "in the background, before the switch" if decision.interim is not None and reshard is None \
                else "during the pause"
            stdout.print(f"  {when}: {moves}", markup=False, highlight=False, soft_wrap=True)
        for line in layout_lines(part.plan, failed, instance.num_devices, instance.plan):
            stdout.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)
        if stages_table:
            stdout.print(_estimate_table(part.estimate, heading, failed))
    solve = decision.solve
    if solve is not None and not decision.plan.rerouted:  # a rerouting's row says how it was found
        bound = f"proven bound {sig(solve.bound)} s (gap {percent(solve.gap)})" if solve.bound is not None \
            else "no bound"
        found = "no plan" if solve.objective is None else f"step {sig(solve.objective)} s"
        stdout.print(f"\nsearch: {solve.backend} {solve.status.value}, {found}, {bound}, {sig(solve.wall_s)} s",
                     highlight=False)
    spent: dict[str, list[float]] = {}
    for st in decision.stages:  # the reconfiguration's and the final plan's communication are one line
        spent.setdefault(st.stage, [0.0, 0.0])[0] += st.wall_s
        spent[st.stage][1] += st.stopped_early
    stdout.print(f"planning took {planned_s:.2f} s of the {sig(options.time_limit_s)} s limit: " + ", ".join(
        f"{name} {wall:.2f} s" + (" [yellow](stopped early)[/]" if early else "") for name, (wall, early) in
        spent.items()), highlight=False, soft_wrap=True)
    if not stages_table:
        stdout.print("per-stage times and memory: --stages; everything: --json", style="dim")


def _degrees(text: str) -> tuple[int, ...]:
    """`--tp-degrees 1,2,4` as a tuple (empty: keep the job's degree)."""
    try:
        degrees = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise InputError(COMMAND_LINE, "--tp-degrees", f"{text!r} is not a list of integers", "write e.g. 1,2,4") \
            from None
    if any(tp < 1 for tp in degrees):
        raise InputError(COMMAND_LINE, "--tp-degrees", f"{text!r} holds a degree below 1", "write e.g. 1,2,4")
    return degrees


def _why(instance: Any, decision: "RecoveryDecision", options: Any) -> str:
    """Eq. 8 in words: the winner's rate against the others', the time to the next fault it
    assumed, and from which time to the next fault reconfiguring pays off."""
    from chameleon_opt.decision import break_even_next_fault, mean_next_fault_s

    scored = [c for c in decision.candidates if c.feasible]
    best = next(c for c in scored if c.policy == decision.policy)
    others = ", ".join(f"{c.policy} {sig(c.score)}" for c in scored if c is not best)
    explicit = options.next_fault_s if options.next_fault_s is not None else instance.spec.failures.next_fault_s
    survivors = instance.num_devices - len(decision.failed)
    mtbf = instance.spec.failures.mtbf_hours_per_device
    if explicit is not None:
        basis = f"the next fault in {duration(explicit)} (given)"
    elif mtbf is not None:
        basis = (f"the next fault expected in {duration(mean_next_fault_s(instance, survivors) or math.inf)} "
                 f"(MTBF {mtbf:,.0f} h per device over {survivors} survivors, exponential)")
    else:
        basis = "no fault statistics (steady throughput)"
    text = f"{best.policy} trains {sig(best.score)} samples/s" + (f" (vs {others})" if others else "") + f" with {basis}"
    rr = next((c for c in scored if c.policy == "reroute"), None)
    rc = next((c for c in scored if c.policy == "reconfigure"), None)
    if rr is not None and rc is not None:
        even = break_even_next_fault(rr.iteration_time_s, rc.iteration_time_s, rc.transition_s)
        text += f"; reconfiguring pays off when the next fault is more than {duration(even)} away"
    return text


@app.command()
def simulate(file: Path = typer.Argument(..., help="instance file (JSON or YAML)"),
             trace: str = typer.Option("instance", "--trace",
                                       help="instance | synthetic[:mtbf_hours=H,seed=S,repair_hours=R] | llama3 | "
                                            "opt175b | a JSON trace file"),
             policy: list[str] = typer.Option(["chameleon", "recycle", "oobleck"], "--policy", metavar="NAME",
                                              help="repeat to compare: " + ", ".join(POLICY_NAMES)),
             horizon_hours: float = typer.Option(24.0, "--horizon-hours", min=0.001, help="simulated training time"),
             time_limit: float = typer.Option(2.0, "--time-limit", min=0.01,
                                              help="seconds for each decision; 2 s, not plan's 10 s, because a "
                                                   "run makes one decision per failure and repair"),
             deterministic: bool = typer.Option(False, "--deterministic",
                                                help="charge each plan search the --time-limit (its worst case) "
                                                     "instead of its measured wall time, and let no stage stop on "
                                                     "the wall clock (solvers stop on work done), so identical runs "
                                                     "give identical results however loaded the machine (unless a "
                                                     "decision outlasts 10x the limit)"),
             plot: Path = typer.Option(None, "--plot", help="write throughput over time (PNG, SVG or PDF)"),
             force: bool = typer.Option(False, "--force", help="overwrite an existing plot file"),
             as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Replay failures (and repairs) over a training run under each policy: throughput, samples,
    time in transition."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from chameleon_opt.recovery.registry import POLICIES
    from chameleon_opt.output import check_figure_output
    from chameleon_opt.recovery.simulate import parse_trace, plot_timeline, simulate_policies

    try:
        unknown = [name for name in policy if name not in POLICIES]
        if unknown:
            raise InputError(COMMAND_LINE, "--policy", f"unknown policy {unknown[0]!r}", f"use {', '.join(POLICIES)}")
        if plot is not None:
            check_figure_output(plot, "--plot", force)
        instance = load_instance(file)
        horizon = horizon_hours * 3600.0
        events, mtbf = parse_trace(trace, instance, horizon)
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TimeElapsedColumn(), console=stderr, transient=True) as bar:
            tasks = {name: bar.add_task(f"simulating {name}", total=None) for name in policy}

            def tick(name: str, done: int, total: int) -> None:
                bar.update(tasks[name], completed=done, total=total)

            results = simulate_policies(instance, events, policy, horizon, mtbf_hours_per_device=mtbf,
                                        time_limit_s=time_limit, progress=tick,
                                        search_charge_s=time_limit if deterministic else None,
                                        deterministic=deterministic)
        if plot is not None:
            plot_timeline(results, plot, title=f"{instance.name}: {trace}", force=force)
    except ChameleonError as err:
        fail(err, as_json)
    if as_json:
        emit_json({"format": 1, "trace": trace, "horizon_s": horizon,
                   "search_charge": f"{time_limit} s per search" if deterministic else "measured",
                   "results": {name: r.to_json() for name, r in results.items()}})
        return
    table = Table(title=f"{instance.name}: {len(events)} trace events, {horizon_hours:g} h")
    for column in ("policy", "samples/s", "vs failure-free", "samples", "transitions", "in transition s",
                   "cascades", "fallbacks", "final step s"):
        table.add_column(column, justify="right")
    for name, r in results.items():
        table.add_row(name, f"{r.average_throughput:.4g}", f"{r.average_throughput / r.failure_free_throughput:.3f}",
                      f"{r.samples:,.0f}", str(r.num_transitions), f"{r.time_in_transition_s:,.0f}",
                      str(r.cascades), str(r.fallbacks), f"{r.final_step_s:.4g}")
    stdout.print(table)
    if plot is not None:
        stdout.print(f"wrote {plot}")


@app.command()
def compare(file: Path = typer.Argument(..., help="instance file (JSON or YAML) or a bundled name"),
            suite: list[str] = typer.Option(["card", "node"], "--suite", metavar="card|node", help="card | node (repeatable)"),
            cadence: list[str] = typer.Option(["6h", "3h", "1h", "30m", "10m", "llama3", "opt175b"], "--cadence", metavar="NAME",
                                              help="6h | 3h | 1h | 30m | 10m | llama3 | opt175b (repeatable)"),
            seeds: int = typer.Option(1, "--seeds", min=1, help="traces per suite and cadence"),
            time_limit: float = typer.Option(2.0, "--time-limit", min=0.01,
                                             help="seconds for each decision; 2 s, not plan's 10 s, because every "
                                                  "trace makes one decision per failure"),
            plot: Path = typer.Option(None, "--plot", help="write the comparison (PNG, SVG or PDF)"),
            force: bool = typer.Option(False, "--force", help="overwrite an existing plot file"),
            as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """The adaptive policy against Oobleck, ReCycle, Bamboo and checkpointing under card and node
    failures at Oobleck's cadences and published rates: ratios, post-failure window, regret."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from chameleon_opt.output import check_figure_output, save_figure
    from chameleon_opt.recovery.compare import CADENCES, PUBLISHED, SUITES, comparison_figure, run_one, summary
    from chameleon_opt.recovery.registry import BASELINES

    try:
        for name in suite:
            if name not in SUITES:
                raise InputError(COMMAND_LINE, "--suite", f"unknown suite {name!r}", f"use {' or '.join(SUITES)}")
        for name in cadence:
            if name not in CADENCES and name not in PUBLISHED:
                raise InputError(COMMAND_LINE, "--cadence", f"unknown cadence {name!r}",
                                 f"use {', '.join(list(CADENCES) + list(PUBLISHED))}")
        if plot is not None:
            check_figure_output(plot, "--plot", force)
        instance = load_instance(file)
        work = [(s, c, k) for s in suite for c in cadence for k in range(seeds)]
        runs = []
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TimeElapsedColumn(), console=stderr, transient=True) as bar:
            task = bar.add_task("comparing", total=len(work))
            for s, c, k in work:
                bar.update(task, description=f"{s} failures, cadence {c}, seed {k}")
                runs.append(run_one(instance, s, c, k, BASELINES, time_limit))
                bar.advance(task)
        rows = summary(runs)
        if plot is not None:
            save_figure(comparison_figure(runs, f"{instance.name}: adaptive vs baselines"), plot, "--plot", force)
    except ChameleonError as err:
        fail(err, as_json)
    if as_json:
        emit_json({"format": 1, "instance": instance.name, "rows": rows, "runs": [r.to_json() for r in runs]})
        return
    for name in suite:
        table = Table(title=f"{instance.name}: {name} failures (adaptive / baseline, average throughput; "
                            "post-failure window in brackets)")
        for column in ["cadence"] + [f"vs {b}" for b in BASELINES] + ["vs best", "blind vs best", "regret",
                                                                        "blind regret"]:
            table.add_column(column, justify="right")
        for row in (r for r in rows if r["suite"] == name):
            table.add_row(row["cadence"], *[f"{row[f'chameleon/{b}']:.3f} ({row[f'chameleon/{b} post-failure']:.3f})"
                                            for b in BASELINES],
                          f"{row['chameleon/best baseline']:.3f}", f"{row['chameleon-blind/best baseline']:.3f}",
                          f"{100 * row['chameleon regret']:.2f}%", f"{100 * row['chameleon-blind regret']:.2f}%")
        stdout.print(table)
    if plot is not None:
        stdout.print(f"wrote {plot}")


DEMO_INSTANCE = Path("runtime-cpu-6")
DEMO_KILLS = ["1@3", "4@7"]
"""A bundled instance, found by name (chameleon_opt.bundled) in a source tree and in a wheel alike."""


@app.command()
def demo(file: Path = typer.Argument(DEMO_INSTANCE, help="instance file or bundled name, with a GPT architecture and TP 1"),
         steps: int = typer.Option(12, "--steps", min=1, max=10_000, help="global batches to train"),
         kill: list[str] = typer.Option([], "--kill", metavar="DEVICE@STEP", help="DEVICE@STEP: SIGKILL the worker in that step "
                                        "(repeat; default: 1@3 and 4@7, none when --hang is given)", show_default=False),
         kill_in_transition: list[str] = typer.Option([], "--kill-in-transition", metavar="DEVICE@STEP",
                                                      help="DEVICE@STEP: the worker dies inside the first "
                                                           "transition (a recovery or a hybrid's switch) at or "
                                                           "after STEP"),
         hang: list[str] = typer.Option([], "--hang", metavar="DEVICE@STEP", help="DEVICE@STEP: the worker stops (SIGSTOP) in "
                                        "that step, alive and silent: the heartbeat watchdog finds it, kills it and the "
                                        "job recovers (repeat)"),
         rejoin: list[str] = typer.Option([], "--rejoin", metavar="DEVICE@STEP", help="DEVICE@STEP: a device killed (--kill) before STEP "
                                          "comes back as a fresh worker before STEP; the planner decides its return"),
         policy: Policy = typer.Option(Policy.auto, "--policy"),
         dtype: str = typer.Option("float32", "--dtype", help="float32 or float64"),
         seed: int = typer.Option(0, "--seed"),
         compare: bool = typer.Option(True, "--compare/--no-compare", help="also train failure-free and compare losses"),
         plot: Path = typer.Option(None, "--plot", show_default=False,
                                   help="timeline plot (PNG, SVG or PDF); never over an existing file without --force "
                                        "[default: chameleon-demo.png, none with --json]"),
         force: bool = typer.Option(False, "--force", help="overwrite an existing plot file"),
         as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
         hf: Path = typer.Option(None, "--hf", help="a Hugging Face config.json (e.g. models/hf/tiny-llama): "
                                 "train it with TP and torch pipelining instead (--hf-layout), recovering as "
                                 "--policy decides (a rerouting runs each rank's planned order)"),
         hf_layout: str = typer.Option("2x2x2", "--hf-layout", metavar="PPxDPxTP",
                                       help="with --hf: the layout, one process per device (2x2x2: 8 processes)"),
         restore: str = typer.Option("migration", "--restore", help="with --hf: migration, checkpoint (runs both "
                                     "and prints both latencies) or verify (migration checked against the "
                                     "checkpoint)"),
         tp_degrees: str = typer.Option("", "--tp-degrees", metavar="T,T,...",
                                        help="with --hf: TP degrees a recovery may move to (e.g. 1,2); a change "
                                             "re-shards the state from the checkpoint saved after every step"),
         mtbf_hours: float = typer.Option(None, "--mtbf-hours", min=1e-6, show_default=False,
                                          help="with --hf: each device's MTBF, which --policy auto weighs against "
                                               "the transitions (Eq. 8); without, auto compares steady throughputs "
                                               "and never picks the hybrid")) -> None:
    """Train a small GPT with one CPU process per device, kill workers, recover with the planner,
    and show the timeline (and write a plot)."""
    import importlib.util

    from rich.table import Table

    from chameleon_opt.output import check_figure_output, save_figure

    if not kill and not hang:  # a hang alone must not bring the default kills along
        kill = DEMO_KILLS
    try:
        if hf is not None:
            from chameleon_opt.runtime.hf_demo import hf_demo

            return hf_demo(hf / "config.json" if hf.is_dir() else hf, restore, steps, kill, seed, as_json,
                           kill_in_transition, hang, hf_layout, rejoin, _degrees(tp_degrees), policy.value,
                           mtbf_hours)
        if mtbf_hours is not None:
            raise InputError(COMMAND_LINE, "--mtbf-hours", "the tiny-GPT demo reads the MTBF from its instance file",
                             "set failures.mtbf_hours_per_device there, or use --mtbf-hours with --hf CONFIG")
        if tp_degrees:
            raise InputError(COMMAND_LINE, "--tp-degrees", "the tiny-GPT runtime runs TP 1 only",
                             "use --tp-degrees with --hf CONFIG")
        if importlib.util.find_spec("torch") is None:
            raise InputError(COMMAND_LINE, "demo", "torch is not installed", "pip install -e '.[runtime]'")
        if dtype not in ("float32", "float64"):
            raise InputError(COMMAND_LINE, "--dtype", f"unknown dtype {dtype!r}", "use float32 or float64")
        kills = [parse_kill(k, "--kill") for k in kill]
        in_transition = [parse_kill(k, "--kill-in-transition") for k in kill_in_transition]
        hangs = [parse_kill(k, "--hang") for k in hang]
        instance = load_instance(file)
        for option, pairs in (("--kill", kills), ("--kill-in-transition", in_transition), ("--hang", hangs)):
            for device, step in pairs:
                if device not in instance.plan.devices:
                    raise InputError(COMMAND_LINE, option, f"device {device} is not in the plan", "pick a device of the plan")
                if step >= steps:
                    raise InputError(COMMAND_LINE, option, f"step {step} is not before --steps {steps}, so it would never "
                                     "fire", f"pick a step below {steps} or raise --steps")
        rejoins = [parse_kill(r, "--rejoin") for r in rejoin]
        for device, step in rejoins:
            if not any(d == device and k < step for d, k in kills) or step >= steps:
                raise InputError(COMMAND_LINE, "--rejoin", f"device {device} is not killed (--kill) before step {step}, or "
                                 f"{step} is not before --steps {steps}", "bring back a killed device in a later step")
        if plot is None and not as_json:
            plot = Path("chameleon-demo.png")
        if plot is not None:
            check_figure_output(plot, "--plot", force)  # before training, which takes minutes
        from chameleon_opt.runtime.controller import Failure, Rejoin, run_training, runtime_model
        from chameleon_opt.runtime.report import loss_deviation, parameter_deviation, report_json, run_figure

        runtime_model(instance)  # bad workloads fail here, before any process starts
        failures = tuple([Failure(step, (d,), delay_s=0.005) for d, step in kills] +
                         [Failure(step, (d,), in_transition=True) for d, step in in_transition] +
                         # it stops after its first operation, so that its step cannot complete without it
                         [Failure(step, (d,), after_ops=1, hang=True) for d, step in hangs])
        options = {"policy": policy.value, "seed": seed, "dtype": dtype}
        reference = None
        if compare:
            with stderr.status("training failure-free for comparison..."):
                reference = run_training(instance, steps, (), **options)
        with stderr.status("training with failures...") as status:
            report = run_training(instance, steps, failures, tuple(Rejoin(step, (d,)) for d, step in rejoins),
                                  **options, progress=lambda line: status.update(line[:100]))
        batch = instance.spec.training.global_batch
        path = None
        if plot is not None:
            figure = run_figure(report, reference, batch, f"{instance.name}: {len(report.dead)} workers killed")
            path = save_figure(figure, plot, "--plot", force, dpi=110)
    except ChameleonError as err:
        fail(err, as_json)
    if as_json:
        emit_json({**report_json(report, reference, batch), "plot": None if path is None else str(path)})
        return
    timeline = Table(title=f"{instance.name}: timeline")
    for column in ("t s", "event", "detail"):
        timeline.add_column(column, justify="right" if column == "t s" else "left")
    for t, kind, detail in report.events:
        timeline.add_row(f"{t:.3f}", kind, detail)
    stdout.print(timeline)
    recoveries = Table(title="recoveries (kill to first completed step)")
    for column in ("step", "dead", "policy", "detect ms", "plan ms", "groups ms", "migrate ms", "first step ms",
                   "total ms", "aborted"):
        recoveries.add_column(column, justify="right")
    for r in report.recoveries:
        recoveries.add_row(str(r.step), str(list(r.dead)), r.policy, f"{r.detection_s * 1e3:.1f}",
                           f"{r.planning_s * 1e3:.1f}", f"{r.group_s * 1e3:.1f}", f"{r.migration_s * 1e3:.1f}",
                           f"{r.first_step_s * 1e3:.1f}", f"{r.total_s * 1e3:.1f}", str(r.aborted_transitions))
    stdout.print(recoveries)
    deviation = loss_deviation(report, reference)
    params = parameter_deviation(report, reference)
    stdout.print(f"{len(report.losses)} steps; every sample exactly once in every step: "
                 f"{all(report.samples_exactly_once)}; "
                 + (f"largest loss difference from failure-free: {deviation:.2e} (relative), final parameters "
                    f"{params:.2e} (absolute); " if deviation is not None and params is not None else "")
                 + f"wrote {path}")


class ExportFormat(str, Enum):
    mps = "mps"
    lp = "lp"
    proto = "proto"


@app.command()
def export(file: Path = typer.Argument(..., help="instance file (JSON or YAML)"),
           output: Path = typer.Option(..., "--output", "-o", help="file to write (never overwritten without --force)"),
           fmt: ExportFormat = typer.Option(ExportFormat.mps, "--format",
                                            help="mps or lp: the MILP; proto: the CP-SAT model (.txt suffix: text)"),
           force: bool = typer.Option(False, "--force", help="overwrite an existing output file")) -> None:
    """Write the reconfiguration search model for the instance's failures, for any solver."""
    from chameleon_opt.output import check_output, write_output
    from chameleon_opt.solve.levels import build_level_cpsat, build_level_milp
    from chameleon_opt.solve.search import level_model_for

    try:
        check_output(output, "--output", force)
        instance = load_instance(file)
        with stderr.status("building the search model..."):
            levels = level_model_for(instance, instance.failed_devices)
        if fmt is ExportFormat.proto:
            model, _ = build_level_cpsat(levels)
            unit = _proto_objective_unit(model)

            def write(path: Path) -> None:
                if not model.export_to_file(str(path)):
                    raise InputError(output, "--output", "CP-SAT could not write the model", "check the folder")
        else:
            problem, _ = build_level_milp(levels)
            unit = _milp_objective_unit(problem)

            def write(path: Path) -> None:
                (problem.writeMPS if fmt is ExportFormat.mps else problem.writeLP)(str(path))
        write_output(output, "--output", force, write)
    except ChameleonError as err:
        fail(err)
    cells = sum(len(w) for w in levels.windows)
    stdout.print(f"wrote {output} ({fmt.value}): {len(levels.templates)} templates, {cells} level cells, "
                 f"{levels.total} micro-batches; objective: {unit}")


def _proto_objective_unit(model: Any) -> str:
    """What the exported CP-SAT objective means, read from the model itself: W x (T + Y) +
    pipelines, T + Y the step time in integer microseconds, W a tie-break weight."""
    objective = model.proto.objective
    names = {i: v.name for i, v in enumerate(model.proto.variables)}
    weight = {names[v]: c for v, c in zip(objective.vars, objective.coeffs)}
    w = weight.get("T", 1)
    scale = objective.scaling_factor or 1.0
    return (f"{w} x (T + Y) + pipelines, T + Y = modelled step time in integer microseconds (rounded up); "
            f"step time in seconds = floor(objective{' / ' + format(scale, 'g') if scale != 1 else ''} / {w}) / 1e6; "
            "the pipeline count only breaks ties")


def _milp_objective_unit(problem: Any) -> str:
    """What the exported MILP objective means: the step time in seconds plus a tie-break below a
    microsecond per pipeline."""
    per_pipeline = max((c for v, c in problem.objective.items() if v.name.startswith("z_")), default=0.0)
    return (f"T + Y = modelled step time in seconds, plus {per_pipeline:.3g} per pipeline "
            "(a tie-break, under one microsecond in total)")


@app.command()
def schema() -> None:
    """Print the JSON Schema of instance files."""
    document = InstanceSpec.model_json_schema()
    # the loader accepts and ignores a top-level "$schema" (editors use it to find this schema)
    document["properties"] = {"$schema": {"type": "string", "title": "JSON Schema of this file (ignored)"},
                              **document["properties"]}
    print(json.dumps(document, indent=2))


from chameleon_opt.interop.commands import register as _register_interop  # noqa: E402 (listed after the above)

_register_interop(app)  # `import torchtitan|megatron`, `export-plan`


_STARTED: float | None = None
"""When the process running `main` started (`process_started`); unset when the commands are called
in-process (tests): `plan`'s deadline then counts from the command's start."""
STARTUP_ALLOWANCE_S = 0.4
"""`plan`'s deadline counts from the process's start plus at most this much: the CLI's start-up
(interpreter, imports, argument parsing: `--version` takes 0.28-0.37 s on this project's idle 2-core
machine) is not charged to the decision up to it, and beyond it (0.6-1.2 s under load) the excess
comes out of the decision's time, so a run ends by --time-limit + 0.4 s whatever the load. Charging
all of it (a deadline from the process's start) cost the 1 s answers: of 60 random instances at
`--time-limit 1`, 27 got slower plans and 10 no answer (docs/benchmarks.md)."""


def main() -> None:
    """Console-script entry: typer's own usage errors keep exit code 2; unexpected errors get one line."""
    global _STARTED
    from chameleon_opt.solve.deadline import process_started

    _STARTED = process_started()
    for stream in (sys.stdout, sys.stderr):
        # a name in an instance may hold a lone UTF-16 surrogate (valid JSON): print it escaped
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    try:
        app()  # standalone mode: ends in SystemExit with the command's code
    except KeyboardInterrupt:
        stderr.print("interrupted")
        sys.exit(130)
    except SystemExit as end:
        _exit(end.code)


def _exit(code: int | str | None) -> NoReturn:
    """Leave without the interpreter's teardown when nothing is left to finish.

    Tearing down the solver libraries' modules (ortools, HiGHS, pandas, numpy) takes 0.2-0.3 s
    after the answer is printed, outside any `--time-limit`. Once stdout, stderr and logging are
    flushed, the only work left would be atexit handlers and joins: so `os._exit` is used only
    when no other thread and no child process is alive (the demo's workers, a solver thread),
    and the ordinary `sys.exit` otherwise."""
    import logging
    import os
    import threading

    if isinstance(code, str):  # SystemExit("message"): Python prints it and exits 1
        print(code, file=sys.stderr)
        code = 1
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    children = sys.modules.get("multiprocessing")
    if threading.active_count() > 1 or (children is not None and children.active_children()):
        sys.exit(code)
    os._exit(code or 0)


if __name__ == "__main__":
    main()
