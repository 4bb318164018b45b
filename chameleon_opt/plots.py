"""Pictures of a decided plan: the 1F1B Gantt chart of its step and its migration rounds.

Both are matplotlib Figures built with the object API (no pyplot, no backend switch); the caller
writes them with output.save_figure. They draw what the performance model and the communication
schedule computed, nothing re-derived: operation times come from perf.pipeline's longest-path
simulation, transfers and rounds from comm.migration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chameleon_opt.describe import ranges
from chameleon_opt.perf.pipeline import OneFOneBSchedule, one_f_one_b_schedule
from chameleon_opt.plan import device_list

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from chameleon_opt.comm.transfers import Migration
    from chameleon_opt.perf.model import Estimate

FORWARD, BACKWARD, REROUTED, FAILED, SYNC = "#4C72B0", "#DD8452", "#C44E52", "#BBBBBB", "#8C8C8C"
MAX_GANTT_ROWS = 64
"""Rows (stage slots) drawn per panel after folding identical pipelines; beyond it the slowest
groups and those touched by the failure are kept, and the title says how many were left out."""


def _pipeline_groups(estimate: "Estimate", failed: frozenset[int]) -> list[list[int]]:
    """Pipelines that would draw the same rows (same stage times, layers, micro-batches, rerouted
    work and failed stages), grouped: one row set per group with its count, so that 127 identical
    data-parallel replicas take 16 rows, not 2,032. Groups are ordered slowest first, then those
    touched by the failure, then plan order; at most MAX_GANTT_ROWS rows are kept."""
    plan = estimate.plan
    groups: dict[tuple, list[int]] = {}
    for j, (pipe, cost) in enumerate(zip(plan.pipelines, estimate.pipelines)):
        key = (tuple((s.first, s.end, bool(failed.intersection(s.devices))) for s in pipe.stages),
               tuple((c.op_forward_s, c.op_backward_s) for c in cost.stages), pipe.micro_batches,
               tuple(cost.extra_micro_batches),
               tuple(sorted({(r.stage, r.from_pipeline) for r in plan.rerouted if r.to_pipeline == j})))
        groups.setdefault(key, []).append(j)
    hit = {r.from_pipeline for r in plan.rerouted} | {r.to_pipeline for r in plan.rerouted}
    slowest = max(range(len(plan.pipelines)), key=lambda j: estimate.pipelines[j].iteration_time_s)
    lost = {j for j, p in enumerate(plan.pipelines) if failed.intersection(p.devices)}
    order = sorted(groups.values(), key=lambda js: (slowest not in js, not lost.intersection(js),
                                                    not hit.intersection(js), js[0]))
    shown, rows = [], 0
    for members in order:
        if rows + len(plan.pipelines[members[0]].stages) > MAX_GANTT_ROWS and shown:
            break
        shown.append(members)
        rows += len(plan.pipelines[members[0]].stages)
    return sorted(shown, key=lambda js: js[0])


def draw_gantt(ax: "Axes", estimate: "Estimate", failed: frozenset[int], title: str) -> None:
    """One row per stage of each group of identical pipelines: its forwards and backwards over one
    step; rerouted work (hatched red) where the model charges it, after the pipeline's own 1F1B
    schedule; the gradient all-reduce and the optimizer step after the slowest pipeline."""
    plan = estimate.plan
    groups = _pipeline_groups(estimate, failed)
    labels: list[str] = []
    row = 0
    sources: dict[tuple[int, int], list[int]] = {}
    for r in plan.rerouted:
        sources.setdefault((r.to_pipeline, r.stage), []).append(r.from_pipeline)
    for members in groups:
        j = members[0]
        pipe, cost = plan.pipelines[j], estimate.pipelines[j]
        f = [c.op_forward_s for c in cost.stages]
        b = [c.op_backward_s for c in cost.stages]
        sched: OneFOneBSchedule = one_f_one_b_schedule(f, b, pipe.micro_batches)
        cursor = sched.makespan_s
        name = f"p{j}" if len(members) == 1 else f"{len(members)} x p{ranges(members)}"
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
                ax.text(cursor + width / 2, y, f"{extra:.3g} mb of p{ranges(sources[(j, s)])}",
                        ha="center", va="center", fontsize=6,
                        bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.8, "alpha": 0.85})
                cursor += width
            held = [d for k in members for d in plan.pipelines[k].stages[s].devices]
            shown = device_list(stage.devices) if len(members) == 1 else ranges(held)
            if len(shown) > 28:
                shown = shown[:26] + "..."
            labels.append(f"{name} s{s} [{shown}]" + (" failed" if dead else ""))
        row += len(pipe.stages)
        ax.axhline(row - 0.5, color="black", linewidth=0.4)
    pipeline_time = max(p.iteration_time_s for p in estimate.pipelines)
    ax.axvspan(pipeline_time, pipeline_time + estimate.data_parallel_s, color=SYNC, alpha=0.35, linewidth=0)
    ax.axvspan(pipeline_time + estimate.data_parallel_s, estimate.iteration_time_s, color=SYNC, alpha=0.6,
               linewidth=0)
    ax.axvline(estimate.iteration_time_s, color="black", linestyle="--", linewidth=0.8)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_ylabel("pipelines (count x ids), stage [devices]", fontsize=8)
    ax.set_xlabel("time in the step (s)")
    drawn = sum(len(members) for members in groups)
    left_out = len(plan.pipelines) - drawn
    ax.set_title(f"{title}: step {estimate.iteration_time_s:.3g} s, {len(plan.pipelines)} pipelines"
                 + (f" ({left_out} not drawn)" if left_out else ""), fontsize=9)


def gantt_figure(panels: list[tuple[str, "Estimate"]], failed: frozenset[int]) -> "Figure":
    """The Gantt chart of one or more plans (a hybrid decision: the interim rerouted plan, then
    the reconfigured one), on one time axis so their step times compare at a glance."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    heights = [sum(len(e.plan.pipelines[js[0]].stages) for js in _pipeline_groups(e, failed)) for _, e in panels]
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


DEVICE_VIEW_MAX = 64
"""Up to this many devices the migration is drawn transfer by transfer; beyond, by node pair."""


def migration_figure(migration: "Migration", devices_per_node: int, failed: frozenset[int], title: str,
                     num_devices: int) -> "Figure":
    """Transfers by round: bytes per round (intra- and inter-node) with each round's time, and
    below who sends to whom: every transfer as a line from source to destination device (every
    device of a job of up to DEVICE_VIEW_MAX, those that move nothing too), or, at scale, the
    gigabytes each node sends each node."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    transfers = migration.transfers
    if not transfers:
        figure = Figure(figsize=(8, 1.2))
        figure.text(0.5, 0.6, title, ha="center", fontsize=9)
        figure.text(0.5, 0.3, "nothing migrates: every device keeps the state it has", ha="center", fontsize=9)
        return figure
    figure = Figure(figsize=(12, 8))
    by_device = num_devices <= DEVICE_VIEW_MAX
    top, bottom = figure.subplots(2, 1, sharex=by_device, gridspec_kw={"height_ratios": [1, 2.4]})
    rounds = range(migration.rounds)
    intra = [0.0] * migration.rounds
    inter = [0.0] * migration.rounds
    for t in transfers:
        same_node = t.src // devices_per_node == t.dst // devices_per_node
        (intra if same_node else inter)[t.round] += t.nbytes / 1e9
    top.bar(rounds, intra, color="#55A868", label="intra-node GB")
    top.bar(rounds, inter, bottom=intra, color="#8172B2", label="inter-node GB")
    top.set_ylabel("GB moved")
    top.set_xlabel("round")
    top.xaxis.set_major_locator(MaxNLocator(integer=True))
    times = top.twinx()
    times.plot(rounds, migration.round_times_s, "k.-", linewidth=0.8, label="round time (s)")
    times.set_ylabel("round time (s)")
    times.set_ylim(bottom=0)
    handles = top.get_legend_handles_labels()[0] + times.get_legend_handles_labels()[0]
    top.legend(handles=handles, fontsize=7, loc="upper right")
    top.set_title(f"{title}: {migration.total_bytes / 1e9:,.1f} GB in {len(transfers):,} transfers, "
                  f"{migration.rounds} rounds, {migration.makespan_s:.3g} s (lower bound "
                  f"{migration.lower_bound_s:.3g} s)", fontsize=9)
    if by_device:
        _transfer_lines(bottom, migration, devices_per_node, failed, num_devices)
    else:
        _node_matrix(figure, bottom, migration, devices_per_node, failed)
    figure.tight_layout()
    return figure


def _transfer_lines(ax: "Axes", migration: "Migration", devices_per_node: int, failed: frozenset[int],
                    num_devices: int) -> None:
    """Every transfer as a line from its source device (left of its round) to its destination."""
    from matplotlib.collections import LineCollection
    from matplotlib.lines import Line2D

    transfers = migration.transfers
    largest = max(t.nbytes for t in transfers)
    segments = [[(t.round - 0.32, t.src), (t.round + 0.32, t.dst)] for t in transfers]
    colours = ["#55A868" if t.src // devices_per_node == t.dst // devices_per_node else "#8172B2" for t in transfers]
    widths = [0.4 + 2.6 * t.nbytes / largest for t in transfers]
    ax.add_collection(LineCollection(segments, colors=colours, linewidths=widths, alpha=0.8, capstyle="round"))
    ax.scatter([t.round - 0.32 for t in transfers], [t.src for t in transfers], s=6, c="black", marker="o")
    ax.scatter([t.round + 0.32 for t in transfers], [t.dst for t in transfers], s=9, c="black", marker=">")
    ax.set_xlim(-0.6, migration.rounds - 0.4)
    for d in failed:
        ax.axhspan(d - 0.5, d + 0.5, color="red", alpha=0.15, linewidth=0)
    for boundary in range(devices_per_node, num_devices, devices_per_node):
        ax.axhline(boundary - 0.5, color="grey", linewidth=0.4, linestyle=":")
    ax.set_yticks(range(num_devices), [f"{d}" + (" failed" if d in failed else "") for d in range(num_devices)],
                  fontsize=6 if num_devices > 32 else 7)
    ax.set_ylim(num_devices - 0.5, -0.5)
    ax.set_ylabel("device (dotted lines: node boundaries)")
    ax.set_xlabel("round (each line: one transfer, from its source device on the left to its destination on the "
                  "right; width ~ bytes)")
    ax.set_xticks(list(range(migration.rounds)))
    ax.legend(handles=[Line2D([], [], color="#55A868", label="intra-node"),
                       Line2D([], [], color="#8172B2", label="inter-node")], fontsize=7, loc="upper right")


def _node_matrix(figure: "Figure", ax: "Axes", migration: "Migration", devices_per_node: int,
                 failed: frozenset[int]) -> None:
    """Gigabytes each source node sends each destination node over the whole migration (log
    colour scale; blank: nothing); failed nodes' rows marked."""
    import numpy as np
    from matplotlib.colors import LogNorm

    nodes = max(max(t.src, t.dst) for t in migration.transfers) // devices_per_node + 1
    gigabytes = np.zeros((nodes, nodes))
    for t in migration.transfers:
        gigabytes[t.src // devices_per_node, t.dst // devices_per_node] += t.nbytes / 1e9
    shown = np.ma.masked_equal(gigabytes, 0.0)
    image = ax.imshow(shown, cmap="viridis", norm=LogNorm(vmin=shown.min(), vmax=shown.max()), aspect="auto",
                      interpolation="nearest", origin="upper")
    figure.colorbar(image, ax=ax, label="GB sent, source node -> destination node")
    for node in sorted({d // devices_per_node for d in failed if d // devices_per_node < nodes}):
        ax.axhline(node, color="red", linewidth=0.6, alpha=0.6)
    ax.set_xlabel(f"destination node ({devices_per_node} devices each)")
    ax.set_ylabel("source node (red: a node with a failed device)")
    ax.set_title(f"{len(migration.transfers):,} transfers between {int((gigabytes > 0).sum()):,} node pairs "
                 f"(diagonal: within a node)", fontsize=8)
