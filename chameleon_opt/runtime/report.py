"""What a runtime job shows its user: a JSON summary and a timeline plot (no torch here).

The plot has two panels over wall-clock time: throughput of every completed step (coloured by
generation, with the performance model's prediction as a dashed line per generation), and the
loss per step beside the failure-free run's. Kills are red lines; each recovery, from kill to the
first completed step after it, is a shaded band.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from chameleon_opt.runtime.controller import RunReport


def step_completions(report: "RunReport") -> list[float]:
    """Wall-clock second (since the job started) at which each committed step finished."""
    return [t for t, kind, _ in report.events if kind == "step"]


def loss_deviation(report: "RunReport", reference: "RunReport | None") -> float | None:
    """Largest relative difference of a step's loss from the failure-free run's."""
    if reference is None:
        return None
    return max(abs(a - b) / abs(a) for a, b in zip(reference.losses, report.losses))


def parameter_deviation(report: "RunReport", reference: "RunReport | None") -> float | None:
    """Largest absolute difference of a final parameter from the failure-free run's: recovery
    must leave the model where training without failures would have."""
    if reference is None:
        return None
    missing = set(reference.final_layers) ^ set(report.final_layers)
    if missing:
        raise AssertionError(f"layers {sorted(missing)} are missing from one run's final state (a bug)")
    return max((abs(a - b) for layer, params in reference.final_layers.items() for name, values in params.items()
                for a, b in zip(values, report.final_layers[layer][name])), default=0.0)


def report_json(report: "RunReport", reference: "RunReport | None", global_batch: int) -> dict[str, Any]:
    """The job as one JSON object: steps, generations (predicted vs measured), recoveries."""
    gens = []
    for g in report.generations:
        measured = sorted(g.step_times_s)[len(g.step_times_s) // 2] if g.step_times_s else None
        gens.append({"index": g.index, "policy": g.policy, "schedule": g.schedule, "first_step": g.first_step,
                     "pipelines": len(g.plan.pipelines), "devices": len(set(g.plan.devices) - set(report.dead)),
                     "predicted_step_s": g.predicted_step_s, "measured_median_step_s": measured,
                     "steps": len(g.step_times_s)})
    return {
        "format": 1,
        "steps": len(report.losses),
        "losses": report.losses,
        "failure_free_losses": reference.losses if reference else None,
        "max_relative_loss_difference": loss_deviation(report, reference),
        "samples_exactly_once": report.samples_exactly_once,
        "final_parameters_max_difference": parameter_deviation(report, reference),
        "replica_max_difference": report.replica_max_diff,
        "step_times_s": report.step_times_s,
        "samples_per_s": [global_batch / t for t in report.step_times_s],
        "dead": list(report.dead),
        "heartbeat_longest_s": report.heartbeat_longest_s,
        "generations": gens,
        "recoveries": [{"step": r.step, "dead": list(r.dead), "policy": r.policy, "reason": r.reason,
                        "predicted_step_s": float(r.predicted_step_s), "detection_s": r.detection_s,
                        "planning_s": r.planning_s, "group_rebuild_s": r.group_s, "migration_s": r.migration_s,
                        "first_step_s": r.first_step_s, "kill_to_first_step_s": r.total_s,
                        "aborted_transitions": r.aborted_transitions, "hung": list(r.hung)}
                       for r in report.recoveries],
        "events": [{"t_s": t, "kind": kind, "detail": detail} for t, kind, detail in report.events],
    }


def run_figure(report: "RunReport", reference: "RunReport | None", global_batch: int, title: str) -> "Figure":
    """The timeline plot as a matplotlib Figure (object API: no pyplot, no backend switch)."""
    from matplotlib import rcParams
    from matplotlib.figure import Figure

    done = step_completions(report)
    fig = Figure(figsize=(11, 6.5))
    top, bottom = fig.subplots(2, 1, sharex=False)
    colours = rcParams["axes.prop_cycle"].by_key()["color"]
    step = 0
    for g in report.generations:
        n = len(g.step_times_s)
        xs = done[step:step + n]
        ys = [global_batch / t for t in g.step_times_s]
        c = colours[g.index % len(colours)]
        top.plot(xs, ys, "o-", color=c, label=f"gen {g.index}: {g.policy}")
        if xs:
            top.hlines(global_batch / g.predicted_step_s, xs[0], xs[-1], colors=c, linestyles="dashed")
        step += n
    kills = [t for t, kind, _ in report.events if kind in ("kill", "failure detected")]
    for t in kills:
        top.axvline(t, color="red", linewidth=1)
    for r in report.recoveries:
        if r.step < len(done) and r.total_s:
            top.axvspan(done[r.step] - r.total_s, done[r.step], color="red", alpha=0.12)
    top.set_xlabel("wall-clock time since start (s)")
    top.set_ylabel("samples/s (dashed: predicted)")
    top.set_title(title)
    top.legend(loc="lower left", fontsize=8)
    steps = list(range(len(report.losses)))
    if reference is not None:
        bottom.plot(steps, reference.losses, "k--", linewidth=2, label="failure-free")
    bottom.plot(steps, report.losses, "o", label="with failures")
    for r in report.recoveries:
        bottom.axvline(r.step, color="red", linewidth=1)
    bottom.set_xlabel("step (global batch)")
    bottom.set_ylabel("loss")
    bottom.legend(fontsize=8)
    fig.tight_layout()
    return fig
