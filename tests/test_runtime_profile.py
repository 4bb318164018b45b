"""The runtime's profiler: per-layer measurements, the workload file, the instance, the network fit."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from chameleon_opt.errors import InputError  # noqa: E402
from chameleon_opt.instance.load import MODELS_DIR, build_instance, load_workload_file  # noqa: E402
from chameleon_opt.perf.model import PerfModel  # noqa: E402
from chameleon_opt.runtime.gpt import GPTConfig, build_layer  # noqa: E402
from chameleon_opt.runtime.profile import (  # noqa: E402
    LayerProfile,
    fit_alpha_beta,
    fit_ring,
    main,
    measure_allreduce,
    measure_network,
    measure_schedule_overhead,
    profile_layers,
    runtime_instance,
    stage_compute_ratio,
    write_profile,
)
from chameleon_opt.workload.model import Workload  # noqa: E402

CFG = GPTConfig(layers=2, hidden=32, heads=2, vocab=64, seq_len=16)
NETWORK = {"intra_node_gbps": 5.0, "intra_node_latency_us": 40.0, "inter_node_gbps": 5.0,
           "inter_node_latency_us": 40.0}


@pytest.fixture(scope="module")
def profile() -> LayerProfile:
    return profile_layers(CFG, (1, 2), repeats=2, warmup=1)


def test_profile_layers_times_and_sizes(profile: LayerProfile) -> None:
    assert sorted(profile.forward_s) == [1, 2]
    for mbs in (1, 2):
        assert len(profile.forward_s[mbs]) == len(profile.backward_s[mbs]) == CFG.num_layers
        assert all(t > 0 for t in profile.forward_s[mbs] + profile.backward_s[mbs])
    assert len(profile.update_s) == CFG.num_layers and all(t > 0 for t in profile.update_s)
    expected = [sum(p.numel() for p in build_layer(CFG, i, 0).parameters()) for i in range(CFG.num_layers)]
    assert list(profile.params) == expected
    # every layer but the head sends its (seq, hidden) fp32 output; the head sends nothing
    assert list(profile.boundary_bytes_per_sample) == [CFG.seq_len * CFG.hidden * 4] * (CFG.num_layers - 1) + [0]
    # a block keeps several (seq, hidden)-sized tensors; the head at least its fp32 logits
    assert all(a > CFG.seq_len * CFG.hidden * 4 for a in profile.activation_bytes_per_sample[1:-1])
    assert profile.activation_bytes_per_sample[-1] >= CFG.seq_len * CFG.vocab * 4


def test_profile_layers_restores_the_thread_count() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        profile_layers(GPTConfig(layers=1, hidden=8, heads=2, vocab=16, seq_len=4), (1,), repeats=1, warmup=0)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_write_profile_loads_and_refuses_to_overwrite(profile: LayerProfile, tmp_path: Path) -> None:
    out = tmp_path / "tiny.json"
    write_profile(out, CFG, profile, name="tiny")
    text = out.read_text()
    with pytest.raises(InputError, match="file exists"):
        write_profile(out, CFG, profile, name="tiny")
    assert out.read_text() == text
    write_profile(out, CFG, profile, name="tiny", force=True)
    spec = load_workload_file(out)
    assert spec.profiles[0].device_type == "cpu-core" and "torch" in spec.profiles[0].source
    workload = Workload(spec, None, 4)
    assert workload.num_layers == CFG.num_layers
    assert list(workload.params) == list(profile.params)
    table = workload.profile_table("cpu-core", 2, 1)
    assert table is not None and (table.forward_s > 0).all()


def test_runtime_instance_loads_and_evaluates(profile: LayerProfile, tmp_path: Path) -> None:
    path = tmp_path / "tiny.json"
    write_profile(path, CFG, profile, name="tiny")
    layout = runtime_instance(CFG, path, global_batch=8, micro_batch_size=2, network=NETWORK, pp=2, dp=2,
                              mtbf_hours_per_device=10.0)
    explicit = runtime_instance(CFG, path, global_batch=8, micro_batch_size=2, network=NETWORK,
                                pipelines=[[(0, 2), (2, 4)], [(0, 3), (3, 4)]], micro_batches=[3, 1])
    for data in (layout, explicit):
        instance = build_instance(data)
        assert instance.num_devices == 4
        estimate = PerfModel(instance).evaluate(instance.plan)
        assert math.isfinite(estimate.iteration_time_s) and 0 < estimate.iteration_time_s < 1.0
        assert estimate.memory_ok
    with pytest.raises(InputError, match="GPTConfig"):
        runtime_instance(GPTConfig(), path, global_batch=8, micro_batch_size=2, network=NETWORK, pp=2, dp=2)
    with pytest.raises(InputError, match="micro_batches"):
        runtime_instance(CFG, path, global_batch=8, micro_batch_size=2, network=NETWORK,
                         pipelines=[[(0, 4)], [(0, 4)]], micro_batches=[4])


def test_committed_profile_predicts_the_example_step() -> None:
    instance = build_instance(runtime_instance(GPTConfig(), MODELS_DIR / "tiny-gpt-cpu.json", global_batch=16,
                                               micro_batch_size=2, network=NETWORK, pp=2, dp=2))
    step = PerfModel(instance).evaluate(instance.plan).iteration_time_s
    assert 1e-4 < step < 1.0


def test_fit_alpha_beta_recovers_a_line() -> None:
    sizes = [64, 1 << 12, 1 << 16, 1 << 20]
    latency, bandwidth = fit_alpha_beta(sizes, [30e-6 + n / 2e9 for n in sizes])
    assert latency == pytest.approx(30e-6, rel=1e-6) and bandwidth == pytest.approx(2e9, rel=1e-6)


def test_measure_network_between_two_processes() -> None:
    fit = measure_network(sizes=(64, 1 << 16, 1 << 20), rounds=3)
    assert fit.latency_s >= 0 and fit.bandwidth_bytes_per_s > 0 and len(fit.one_way_s) == 3
    assert len(fit.helper_cpu_s) == 3 and min(fit.helper_cpu_s) >= 0
    assert min(fit.helper_cpu_s) <= fit.helper_cpu_at(1 << 10) <= max(fit.helper_cpu_s)
    network = fit.network()
    assert network["intra_node_gbps"] > 0 and set(network) == set(NETWORK)


def test_fit_ring_recovers_a_ring_over_two_world_sizes() -> None:
    lat, bw = 50e-6, 1e9
    points = [(w, n, 2 * (w - 1) * lat + 2 * (w - 1) / w * n / bw) for w in (2, 4) for n in (1 << 16, 1 << 22)]
    latency, bandwidth = fit_ring(points)
    assert latency == pytest.approx(lat, rel=1e-6) and bandwidth == pytest.approx(bw, rel=1e-6)


def test_measure_allreduce_fits_a_ring_the_model_then_charges(profile: LayerProfile, tmp_path: Path) -> None:
    """Two gloo processes: a fit with one point per size, carried by the network's collective fields
    into the gradient all-reduce of a DP 2 plan, which it slows (never speeds: the link bounds it)."""
    fit = measure_allreduce((2,), sizes=(1 << 12, 1 << 18), rounds=2)
    assert [p[:2] for p in fit.points] == [(2, 1 << 12), (2, 1 << 18)]
    assert fit.step_latency_s >= 0 and fit.bus_bytes_per_s > 0
    assert fit.time(1 << 18, 2) > fit.time(1 << 12, 2)
    path = tmp_path / "tiny.json"
    write_profile(path, CFG, profile, name="tiny")

    def dp_time(network: dict[str, float]) -> float:
        instance = build_instance(runtime_instance(CFG, path, global_batch=8, micro_batch_size=2, network=network,
                                                   pp=1, dp=2))
        return PerfModel(instance).evaluate(instance.plan).data_parallel_s

    slow = {**NETWORK, "collective_gbps": 0.5, "collective_latency_us": 400.0}
    fast = {**NETWORK, "collective_gbps": 50.0, "collective_latency_us": 0.0}
    assert dp_time(slow) > dp_time(NETWORK) > 0
    assert dp_time(fast) == pytest.approx(dp_time(NETWORK))


def test_stage_scaling_slows_stages_by_their_bytes_never_speeds_them(profile: LayerProfile, tmp_path: Path) -> None:
    path = tmp_path / "tiny.json"
    write_profile(path, CFG, profile, name="tiny")

    def compute(points: list[list[float]]) -> float:
        data = runtime_instance(CFG, path, global_batch=8, micro_batch_size=2, network=NETWORK, pp=1, dp=1)
        data["cluster"]["device_type"]["stage_scaling"] = points
        instance = build_instance(data)
        return PerfModel(instance).evaluate(instance.plan).breakdown_s["compute"]

    whole = float(sum(profile.params)) * 4   # float32 bytes of the one stage
    base = compute([])
    assert compute([[whole / 100, 1.0], [whole, 1.5]]) == pytest.approx(1.5 * base)
    assert compute([[whole / 100, 1.2], [whole * 10, 1.2]]) == pytest.approx(1.2 * base)
    assert compute([[whole / 100, 0.5], [whole, 0.8]]) == pytest.approx(base)   # at least 1
    assert compute([[whole / 100, 1.4], [whole, 1.0]]) == pytest.approx(1.2 * base)   # pooled, not 1.4


def test_non_decreasing_pools_adjacent_violators() -> None:
    from chameleon_opt.perf.model import non_decreasing

    assert non_decreasing([1.0, 1.2, 1.0, 1.3]) == pytest.approx([1.0, 1.1, 1.1, 1.3])
    assert non_decreasing([2.0, 1.0]) == pytest.approx([1.5, 1.5])


def test_stage_compute_ratio_is_a_ratio_per_range() -> None:
    pytest.importorskip("transformers")
    config = Path(__file__).resolve().parent.parent / "models" / "hf" / "tiny-llama" / "config.json"
    ratios = stage_compute_ratio(config, 8, [(0, 2), (1, 3)], rounds=1, micro_batches=2)
    assert set(ratios) == {(0, 2), (1, 3)} and all(0.1 < r < 10 for r in ratios.values())


def test_schedule_overhead_is_measured_and_charged_per_operation(profile: LayerProfile, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    config = Path(__file__).resolve().parent.parent / "models" / "hf" / "tiny-llama" / "config.json"
    overhead = measure_schedule_overhead(config, 8, micro_batches=2, rounds=2)
    assert 0.0 <= overhead < 0.1
    path = tmp_path / "tiny.json"
    write_profile(path, CFG, profile, name="tiny")

    def step(us: float) -> float:
        network = {**NETWORK, "schedule_overhead_us": us}
        instance = build_instance(runtime_instance(CFG, path, global_batch=8, micro_batch_size=2, network=network,
                                                   pp=2, dp=1))
        return PerfModel(instance).evaluate(instance.plan).iteration_time_s

    # 4 micro-batches over 2 stages: 1F1B's longest path runs (4 + 2 - 1) forwards and backwards
    assert step(1000.0) - step(0.0) == pytest.approx(2 * (4 + 2 - 1) * 1e-3, rel=1e-6)


def test_command_line_writes_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.json"
    args = ["-o", str(out), "--layers", "1", "--hidden", "16", "--heads", "2", "--vocab", "32", "--seq-len", "8",
            "--micro-batch-sizes", "1,2", "--repeats", "1", "--warmup", "0"]
    assert main(args) == 0 and load_workload_file(out).name == "cli"
    assert main(args) == 2
    assert "file exists" in capsys.readouterr().err
    assert main(["-o", str(tmp_path / "bad.json"), "--hidden", "30", "--heads", "4"]) == 2
    assert "multiple of heads" in capsys.readouterr().err
