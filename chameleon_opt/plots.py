"""Pictures of a decided plan: the 1F1B Gantt chart of its step and its migration rounds.

Both are matplotlib Figures built with the object API (no pyplot, no backend switch); the caller
writes them with output.save_figure. They draw what the performance model and the communication
schedule computed, nothing re-derived: operation times come from perf.pipeline's longest-path
simulation, transfers and rounds from comm.migration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chameleon_opt.perf.pipeline import OneFOneBSchedule, one_f_one_b_schedule
from chameleon_opt.plan import device_list

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from chameleon_opt.comm.migration import Migration
    from chameleon_opt.perf.model import Estimate

FORWARD, BACKWARD, REROUTED, FAILED, SYNC = "#4C72B0", "#DD8452", "#C44E52", "#BBBBBB", "#8C8C8C"
MAX_GANTT_ROWS = 48
"""Rows (stage slots) drawn per panel; beyond it the slowest pipelines and those touched by the
failure are kept, and the title says how many were left out (identical pipelines look alike)."""


def _shown_pipelines(estimate: "Estimate", failed: frozenset[int]) -> list[int]:
    """Pipeline indices to draw, at most MAX_GANTT_ROWS stage rows: the slowest, then those that
    lost a device, then those taking rerouted work, then the rest in plan order."""
    plan = estimate.plan
    hit = {j for j, p in enumerate(plan.pipelines) if failed.intersection(p.devices)}
    hit |= {r.from_pipeline for r in plan.rerouted}
    helping = {r.to_pipeline for r in plan.rerouted}
    slowest = max(range(len(plan.pipelines)), key=lambda j: estimate.pipelines[j].iteration_time_s)
    order = sorted(range(len(plan.pipelines)), key=lambda j: (j != slowest, j not in hit, j not in helping, j))
    shown, rows = [], 0
    for j in order:
        if rows + len(plan.pipelines[j].stages) > MAX_GANTT_ROWS and shown:
            break
        shown.append(j)
        rows += len(plan.pipelines[j].stages)
    return sorted(shown)


def draw_gantt(ax: "Axes", estimate: "Estimate", failed: frozenset[int], title: str) -> None:
    """One row per (pipeline, stage): its forwards and backwards over one step; rerouted work
    (hatched red) where the model charges it, after the pipeline's own 1F1B schedule; the gradient
    all-reduce and the optimizer step after the slowest pipeline."""
    plan = estimate.plan
    shown = _shown_pipelines(estimate, failed)
    schedules: dict[tuple, OneFOneBSchedule] = {}
    labels: list[str] = []
    row = 0
    sources: dict[tuple[int, int], list[int]] = {}
    for r in plan.rerouted:
        sources.setdefault((r.to_pipeline, r.stage), []).append(r.from_pipeline)
    for j in shown:
        pipe, cost = plan.pipelines[j], estimate.pipelines[j]
        f = [c.op_forward_s for c in cost.stages]
        b = [c.op_backward_s for c in cost.stages]
        key = (tuple(f), tuple(b), pipe.micro_batches)
        if key not in schedules:
            schedules[key] = one_f_one_b_schedule(f, b, pipe.micro_batches)
        sched = schedules[key]
        cursor = sched.makespan_s
        for s, stage in enumerate(pipe.stages):
            dead = bool(failed.intersection(stage.devices))
            y = row + s
            forwards = [(start, f[s]) for start in sched.forward_start[s]]
            backwards = [(start, b[s]) for start in sched.backward_start[s]]
            if dead:
                ax.broken_barh(forwards + backwards, (y - 0.4, 0.8), facecolors="none", edgecolors=FAILED,
                               hatch="//", linewidth=0.3)
            else:
                ax.broken_barh(forwards, (y - 0.4, 0.8), facecolors=FORWARD, edgecolors="white", linewidth=0.2)
                ax.broken_barh(backwards, (y - 0.4, 0.8), facecolors=BACKWARD, edgecolors="white", linewidth=0.2)
            extra = cost.extra_micro_batches[s]
            if extra:
                width = extra * (f[s] + b[s])
                ax.broken_barh([(cursor, width)], (y - 0.4, 0.8), facecolors="#F2C4C4", edgecolors=REROUTED,
                               hatch="xx", linewidth=0.6)
                ax.text(cursor + width / 2, y, f"{extra:.3g} mb of p{','.join(map(str, sources[(j, s)]))}",
                        ha="center", va="center", fontsize=6,
                        bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.8, "alpha": 0.85})
                cursor += width
            labels.append(f"p{j} s{s} [{device_list(stage.devices)}]" + (" failed" if dead else ""))
        row += len(pipe.stages)
        ax.axhline(row - 0.5, color="black", linewidth=0.4)
    pipeline_time = max(p.iteration_time_s for p in estimate.pipelines)
    ax.axvspan(pipeline_time, pipeline_time + estimate.data_parallel_s, color=SYNC, alpha=0.35, linewidth=0)
    ax.axvspan(pipeline_time + estimate.data_parallel_s, estimate.iteration_time_s, color=SYNC, alpha=0.6,
               linewidth=0)
    ax.axvline(estimate.iteration_time_s, color="black", linestyle="--", linewidth=0.8)
    ax.set_yticks(range(len(labels)), labels, fontsize=7 if len(labels) <= 24 else 5)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xlabel("time in the step (s)")
    left_out = len(plan.pipelines) - len(shown)
    ax.set_title(f"{title}: step {estimate.iteration_time_s:.4g} s"
                 + (f" ({left_out} of {len(plan.pipelines)} pipelines not drawn)" if left_out else ""), fontsize=9)


def gantt_figure(panels: list[tuple[str, "Estimate"]], failed: frozenset[int]) -> "Figure":
    """The Gantt chart of one or more plans (a hybrid decision: the interim rerouted plan, then
    the reconfigured one), on one time axis so their step times compare at a glance."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    heights = [min(sum(len(p.stages) for p in e.plan.pipelines), MAX_GANTT_ROWS) for _, e in panels]
    figure = Figure(figsize=(12, 1.2 + 0.22 * sum(heights) + 0.8 * len(panels)))
    axes = figure.subplots(len(panels), 1, sharex=True, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    for ax, (title, estimate) in zip(axes, panels):
        draw_gantt(ax, estimate, failed, title)
    axes[0].set_xlim(0, 1.01 * max(estimate.iteration_time_s for _, estimate in panels))  # shared by all panels
    legend = [Patch(facecolor=FORWARD, label="forward (+ send)"), Patch(facecolor=BACKWARD, label="backward (+ send)"),
              Patch(facecolor="#F2C4C4", edgecolor=REROUTED, hatch="xx", label="rerouted micro-batches (mb)"),
              Patch(facecolor="none", edgecolor=FAILED, hatch="//", label="failed slot (its work runs on peers)"),
              Patch(facecolor=SYNC, alpha=0.35, label="gradient all-reduce"),
              Patch(facecolor=SYNC, alpha=0.6, label="optimizer step")]
    figure.legend(handles=legend, loc="lower center", ncol=6, fontsize=7, frameon=False)
    figure.tight_layout(rect=(0, 0.04, 1, 1))
    return figure


def migration_figure(migration: "Migration", devices_per_node: int, failed: frozenset[int], title: str) -> "Figure":
    """Transfers by round: bytes per round (intra- and inter-node) with each round's time, and
    below every transfer as a line from its source device to its destination in its round."""
    from matplotlib.collections import LineCollection
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    transfers = migration.transfers
    if not transfers:
        figure = Figure(figsize=(8, 1.2))
        figure.text(0.5, 0.6, title, ha="center", fontsize=9)
        figure.text(0.5, 0.3, "nothing migrates: every device keeps the state it has", ha="center", fontsize=9)
        return figure
    figure = Figure(figsize=(12, 8))
    top, bottom = figure.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [1, 2.4]})
    rounds = range(migration.rounds)
    intra = [0.0] * migration.rounds
    inter = [0.0] * migration.rounds
    for t in transfers:
        same_node = t.src // devices_per_node == t.dst // devices_per_node
        (intra if same_node else inter)[t.round] += t.nbytes / 1e9
    top.bar(rounds, intra, color="#55A868", label="intra-node GB")
    top.bar(rounds, inter, bottom=intra, color="#8172B2", label="inter-node GB")
    top.set_ylabel("GB moved")
    times = top.twinx()
    times.plot(rounds, migration.round_times_s, "k.-", linewidth=0.8, label="round time (s)")
    times.set_ylabel("round time (s)")
    times.set_ylim(bottom=0)
    handles = top.get_legend_handles_labels()[0] + times.get_legend_handles_labels()[0]
    top.legend(handles=handles, fontsize=7, loc="upper right")
    top.set_title(f"{title}: {migration.total_bytes / 1e9:,.1f} GB in {len(transfers)} transfers, "
                  f"{migration.rounds} rounds, {migration.makespan_s:.3g} s (lower bound "
                  f"{migration.lower_bound_s:.3g} s)", fontsize=9)

    involved = sorted({t.src for t in transfers} | {t.dst for t in transfers} | set(failed))
    y = {d: i for i, d in enumerate(involved)}
    largest = max(t.nbytes for t in transfers)
    dense = len(transfers) > 400  # thousands of transfers: thin, faint lines and no end markers
    segments = [[(t.round - 0.32, y[t.src]), (t.round + 0.32, y[t.dst])] for t in transfers]
    colours = ["#55A868" if t.src // devices_per_node == t.dst // devices_per_node else "#8172B2" for t in transfers]
    widths = [(0.2 if dense else 0.4) + (0.6 if dense else 2.6) * t.nbytes / largest for t in transfers]
    bottom.add_collection(LineCollection(segments, colors=colours, linewidths=widths, alpha=0.25 if dense else 0.8,
                                         capstyle="round"))
    if not dense:
        bottom.scatter([t.round - 0.32 for t in transfers], [y[t.src] for t in transfers], s=6, c="black", marker="o")
        bottom.scatter([t.round + 0.32 for t in transfers], [y[t.dst] for t in transfers], s=9, c="black", marker=">")
    bottom.set_xlim(-0.6, migration.rounds - 0.4)
    for d in failed:
        bottom.axhspan(y[d] - 0.5, y[d] + 0.5, color="red", alpha=0.15, linewidth=0)
    if len(involved) <= 256:
        for node_start in range(devices_per_node, max(involved) + 1, devices_per_node):
            first = next((i for d, i in y.items() if d >= node_start), None)
            if first:
                bottom.axhline(first - 0.5, color="grey", linewidth=0.4, linestyle=":")
    if len(involved) <= 64:
        bottom.set_yticks(range(len(involved)), [f"{d}" + (" failed" if d in failed else "") for d in involved],
                          fontsize=6)
    bottom.set_ylim(len(involved) - 0.5, -0.5)
    bottom.set_ylabel("device" + (" (dotted lines: node boundaries)" if len(involved) <= 256 else ""))
    bottom.set_xlabel("round (each line: one transfer, from its source device on the left to its destination on the "
                      "right; width ~ bytes)")
    bottom.set_xticks(list(rounds))
    bottom.legend(handles=[Line2D([], [], color="#55A868", label="intra-node"),
                           Line2D([], [], color="#8172B2", label="inter-node")], fontsize=7, loc="upper right")
    figure.tight_layout()
    return figure
