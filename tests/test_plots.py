"""Pictures readable from 32 to 16,384 devices (issue 25): identical pipelines folded into one row
set with their count, the migration by node pair at scale, every axis labelled."""

from __future__ import annotations

from chameleon_opt.comm.transfers import Migration, Transfer
from chameleon_opt.instance.load import load_instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.perf.reroute import even_reroute
from chameleon_opt.plots import MAX_GANTT_ROWS, gantt_figure, migration_figure


def _labelled(figure) -> None:
    for ax in figure.axes:
        if ax.get_label() == "<colorbar>":
            continue
        assert ax.get_ylabel(), ax.get_title()
        assert ax.get_xlabel() or ax.get_shared_x_axes().get_siblings(ax) != [ax], ax.get_title()


def test_sixteen_thousand_devices_fold_into_a_readable_gantt():
    instance = load_instance("llama3-405b-16k")
    failed = frozenset(range(800, 808))  # node 100: one stage of pipeline 6
    estimate = PerfModel(instance).evaluate(even_reroute(instance.plan, failed), failed)
    figure = gantt_figure([("16k", estimate)], failed)
    (ax,) = figure.axes
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert len(labels) <= MAX_GANTT_ROWS and len(labels) == 2 * 16  # 127 helpers as one, the hit pipeline
    assert any(label.startswith("127 x p") for label in labels) and any("failed" in label for label in labels)
    assert min(t.get_fontsize() for t in ax.get_yticklabels()) >= 7
    assert "not drawn" not in ax.get_title()
    _labelled(figure)


def _migration(transfers: list[Transfer]) -> Migration:
    rounds = max(t.round for t in transfers) + 1
    return Migration(plan=None, transfers=tuple(transfers), rounds=rounds, makespan_s=1.0, fluid_makespan_s=1.0,
                     lower_bound_s=0.5, max_degree=1, round_times_s=(1.0 / rounds,) * rounds, release_after_round={},
                     solve=None)


def test_migration_by_device_shows_every_device_and_by_node_pair_at_scale():
    small = migration_figure(_migration([Transfer("layer1", 1, 0, 2, 9, 10 ** 9, 0)]), 8, frozenset({13}), "32", 32)
    lines = small.axes[1]
    assert len(lines.get_yticklabels()) == 32 and "13 failed" in [t.get_text() for t in lines.get_yticklabels()]
    _labelled(small)
    many = [Transfer(f"layer{k}", k, 0, k % 4096, (k * 37) % 4096, 10 ** 8 * (1 + k % 5), k % 7) for k in range(5000)]
    large = migration_figure(_migration(many), 8, frozenset(range(8)), "4096", 4096)
    matrix = large.axes[1]
    assert matrix.get_xlabel().startswith("destination node") and matrix.get_ylabel().startswith("source node")
    assert matrix.get_images()[0].get_array().shape == (512, 512)  # 4,096 devices, 8 per node
    _labelled(large)
