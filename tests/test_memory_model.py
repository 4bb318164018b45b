"""The memory model's terms against published numbers, measured peaks, and the checker."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from chameleon_opt.check import check_plan
from chameleon_opt.errors import InputError
from chameleon_opt.instance.load import build_instance
from chameleon_opt.perf.memory import in_flight_micro_batches, zero_shards
from chameleon_opt.perf.model import GIB, PerfModel, ScheduleOptions
from chameleon_opt.workload.model import Workload
from chameleon_opt.workload.schema import Architecture, WorkloadSpec

SAILOR = Path(__file__).resolve().parents[2] / "shared" / "data" / "sailor"

# GPT-3 175B as in Korthikanti et al. (arXiv 2205.05198) Table 3: a = 96, h = 12288, s = 2048; t = 8.
S, H, A, T, V = 2048, 12288, 96, 8, 51200


def gpt3(seq: int = S) -> Workload:
    arch = Architecture(layers=4, hidden=H, heads=A, ffn=4 * H, vocab=V, seq_len=seq)
    return Workload(WorkloadSpec(name="gpt3", architecture=arch), None, 2)


@pytest.mark.parametrize("tp, recompute, attention, sp, coefficient", [
    (1, "none", "eager", False, 34 + 5 * A * S / H),            # no parallelism: sbh(34 + 5as/h)
    (T, "none", "eager", False, 10 + 24 / T + 5 * A * S / (H * T)),  # tensor parallel
    (T, "none", "eager", True, (34 + 5 * A * S / H) / T),       # tensor + sequence parallel
    (T, "selective", "eager", False, 10 + 24 / T),              # tensor parallel + selective recompute
    (T, "selective", "eager", True, 34 / T),                    # tensor + sequence parallel + selective
    (T, "full", "eager", False, 2),                             # full recomputation: sbh * 2
    (T, "none", "flash", False, 10 + 24 / T),                   # flash keeps no a*s^2 tensors
])
def test_block_activations_reproduce_korthikanti_table_2(tp, recompute, attention, sp, coefficient):
    """Activation bytes per layer per sample (b = 1) are s*h times Table 2's coefficient."""
    block = gpt3().activation_bytes_per_sample(tp, recompute, attention, sp)[1]
    assert block == pytest.approx(S * H * coefficient)


def test_fp8_linears_save_one_byte_inputs_hand_worked():
    """GPT-3's block (q = h, f = 4h, ungated), TP 1, Megatron's kernels, linears in fp8 (Transformer
    Engine saves the fp8 cast of a linear's input). Flash, per token in units of h: norm inputs 2 x 2,
    QKV and MLP-in linear inputs 2 x 1 (not 2 x 2), dropout masks 2, Q K V 6, attention output 2 kept by
    the flash kernel + 1 for the out-projection's fp8 copy, GEMM-1 output 2 x 4 (the GeLU keeps it) +
    GEMM-2's fp8 input 4 (not 8): 29 against 34. Eager: the out-projection alone keeps the context (1,
    not 2), the a*s^2 terms are unchanged: 27 + 5as/h against 34 + 5as/h."""
    w = gpt3()
    assert w.activation_bytes_per_sample(1, "none", "flash", fp8_linears=True)[1] == pytest.approx(S * H * 29)
    assert w.activation_bytes_per_sample(1, "none", "eager", fp8_linears=True)[1] == pytest.approx(
        S * H * (27 + 5 * A * S / H))
    assert w.activation_bytes_per_sample(1, "full", "flash", fp8_linears=True)[1] == pytest.approx(2 * S * H)


def test_gpt3_175b_table_2_numbers_in_gib():
    """Table 2 at GPT-3 175B (5as/h = 80), t = 8: sbh x 114 bytes per layer without parallelism,
    sbh x 23 with TP alone, sbh x 4.25 with TP + SP + selective: the paper's 5x cut."""
    w = gpt3()
    none = w.activation_bytes_per_sample(1, "none", "eager")[1]
    tp_only = w.activation_bytes_per_sample(T, "none", "eager")[1]
    best = w.activation_bytes_per_sample(T, "selective", "eager", True)[1]
    assert none / (S * H) == pytest.approx(114.0)
    assert tp_only / (S * H) == pytest.approx(23.0)
    assert best == pytest.approx(S * H * 34 / 8)
    assert tp_only / best > 5


def test_head_keeps_fp32_logits_as_in_section_4_3():
    """The output layer keeps 4*s*b*v/t bytes of fp32 logits (Korthikanti Sec. 4.3, with the
    norm and projection inputs 4sbh), plus the half-precision copy that coexists at the loss."""
    head = gpt3().activation_bytes_per_sample(T, "none", "flash")[-1]
    assert head == pytest.approx(4 * S * H + 4 * S * V / T + 2 * S * V / T)


def test_zero_reproduces_rajbhandari_figure_1():
    """ZeRO (SC'20) Fig. 1: 7.5B parameters, 64 GPUs, K = 12: 120 GB baseline, 31.4 GB (P_os),
    16.6 GB (P_os+g), 1.9 GB (P_os+g+p) per device."""
    psi, gb = 7.5e9, 1e9
    expected = {0: 120, 1: 31.4, 2: 16.6, 3: 1.9}
    for stage, value in expected.items():
        p_div, g_div, o_div = zero_shards(stage, 64)
        assert psi * (2 / p_div + 2 / g_div + 12 / o_div) / gb == pytest.approx(value, rel=0.02)


def test_interleaved_in_flight_matches_korthikanti_section_4_2_2():
    """The first stage of an interleaved schedule holds p(1 + (p-1)/(p v)) micro-batches' activations."""
    for p, v in ((4, 2), (8, 3), (12, 4)):
        assert in_flight_micro_batches(0, p, 100, virtual=v) == pytest.approx(p * (1 + (p - 1) / (p * v)))
    assert in_flight_micro_batches(0, 4, 100, virtual=1) == 4


# -- an OPT-350M job like Sailor's: TP 4, 2 stages, micro-batch 8 ------------------------------
def opt_document(memory_gib: float = 96.0, **training) -> dict:
    return {
        "format": 1, "name": "opt-2x4",
        "cluster": {"nodes": 2, "devices_per_node": 4,
                    "device_type": {"name": "GH-96", "memory_gib": memory_gib, "peak_tflops": 989,
                                    "memory_bandwidth_gbps": 4000},
                    "network": {"intra_node_gbps": 150, "inter_node_gbps": 20}},
        "workload": {"model": "opt-350m"},
        "training": {"global_batch": 32, "micro_batch_size": 8, "precision": "fp16", **training},
        "plan": {"tensor_parallel": 4, "layout": {"pipeline_parallel": 2, "data_parallel": 1,
                                                  "layers_per_stage": [12, 14]}},
    }


def old_model_need(instance, stage: int, first: int, end: int, stages: int) -> float:
    """The model before this change (Eq. 14 with flash activations s*h*(10 + 24/t), no logits,
    buffers or working set; the device's reserved_gib taken off the capacity instead)."""
    w, tp, mbs = instance.workload, 4, 8
    a = w.architecture
    act = np.array([w.sequence_length * a.hidden * 2.0]
                   + [w.sequence_length * a.hidden * (10 + 24 / tp)] * a.layers
                   + [w.sequence_length * a.vocab * 2.0 / tp]) * mbs
    static = w.params[first:end].sum() / tp * 16
    return static + (stages - stage) * act[first:end].sum() + instance.device_types[0].reserved_gib * GIB


def test_checker_rejects_a_plan_the_old_model_accepted_and_names_the_term():
    """On 20 GiB devices the old model put stage 0 at about 8 GiB: feasible. Eager attention keeps
    5as^2/t bytes per sample and layer, so the real need is about 25 GiB (Sailor measured 25.1 GiB
    for this plan on GH200): the checker rejects it and says activations overflow."""
    instance = build_instance(opt_document(memory_gib=20.0, attention="eager", framework_overhead_gib=4.39))
    old = old_model_need(instance, 0, 0, 12, 2)
    assert old < 10 * GIB < 20 * GIB
    report = check_plan(instance, instance.plan)
    assert not report.ok
    assert "largest term activations" in report.violations[0], report.violations
    estimate = PerfModel(instance).evaluate(instance.plan)
    assert "activations" in estimate.memory_violations()[0]
    need = estimate.pipelines[0].stages[0].memory_bytes
    assert 23 * GIB < need < 27 * GIB


def test_breakdown_terms_sum_and_layer_costs_agree():
    """stage_memory = the breakdown's total = what LayerCosts prices plus its stage constant."""
    instance = build_instance(opt_document(attention="eager", zero_stage=2))
    model = PerfModel(instance)
    devices = instance.plan.pipelines[0].stages[1].devices
    for replicas in (1, 4):
        breakdown = model.stage_memory_breakdown(devices, 12, 26, 1, 2, 4, replicas=replicas)
        costs = model.layer_costs(devices, replicas)
        priced = costs.static_bytes[12:26].sum() + 1 * costs.activation_bytes[12:26].sum() + costs.transient_bytes
        assert priced + costs.stage_constant_bytes == pytest.approx(breakdown.total)
        assert costs.capacity_bytes + costs.stage_constant_bytes == pytest.approx(costs.device_bytes)
        assert breakdown.logits > 0 and breakdown.transient > 0
    sharded = model.stage_memory_breakdown(devices, 12, 26, 1, 2, 4, replicas=4)
    assert sharded.gradients == pytest.approx(model.stage_memory_breakdown(devices, 12, 26, 1, 2, 4).gradients / 4)


def test_legacy_recomputation_flag_and_conflicts():
    instance = build_instance(opt_document(activation_recomputation=True))
    assert instance.spec.training.recompute == "full"
    with pytest.raises(InputError, match="recomputation"):
        build_instance(opt_document(activation_recomputation=True, recomputation="selective"))
    with pytest.raises(InputError, match="distributed_optimizer"):
        build_instance(opt_document(distributed_optimizer=True, zero_stage=0))
    assert build_instance(opt_document(distributed_optimizer=True)).spec.training.zero == 1


def test_estimate_json_names_assumptions_and_breakdown():
    instance = build_instance(opt_document())
    data = PerfModel(instance).evaluate(instance.plan).to_json()
    stage = data["pipelines"][0]["stages"][0]
    assert sum(stage["memory_breakdown_bytes"].values()) == pytest.approx(stage["memory_bytes"], abs=8)
    assert any("attention flash" in line for line in data["assumptions"])
    assert any("reserved_gib" in line for line in data["assumptions"])


@pytest.mark.skipif(not (SAILOR / "measured-plans").is_dir(), reason="Sailor data not present")
def test_sailor_peaks_within_targets_with_one_fitted_constant():
    """Issue 10's acceptance: median |error| <= 10%, worst <= 20%, leave-one-out median <= 15%."""
    from chameleon_opt.perf.sailor_fit import fit_overhead, measured_plans, peak_memory, sailor_document, sailor_network
    overhead, loo, _ = fit_overhead(SAILOR)
    network = sailor_network(SAILOR)
    errors, loo_errors = [], []
    for (name, plan), held in zip(measured_plans(SAILOR), loo):
        errors.append(peak_memory(sailor_document(name, plan, network, {"framework_overhead_gib": overhead}))
                      / plan["max_mem"] - 1)
        loo_errors.append(peak_memory(sailor_document(name, plan, network, {"framework_overhead_gib": held}))
                          / plan["max_mem"] - 1)
    assert 3.0 < overhead < 6.0
    assert np.median(np.abs(errors)) <= 0.10 and np.max(np.abs(errors)) <= 0.20
    assert np.median(np.abs(loo_errors)) <= 0.15


# -- schedules ----------------------------------------------------------------------------------
def test_schedule_options_default_to_todays_numbers_and_change_what_they_should():
    document = opt_document()
    document["training"]["global_batch"] = 128
    document["cluster"]["nodes"] = 4
    document["plan"]["layout"]["data_parallel"] = 2
    instance = build_instance(document)
    base = PerfModel(instance)
    plain = base.evaluate(instance.plan)
    assert base.with_options(ScheduleOptions()).evaluate(instance.plan).iteration_time_s == plain.iteration_time_s
    overlapped = base.with_options(ScheduleOptions(overlap_grad_reduce=True)).evaluate(instance.plan)
    assert overlapped.data_parallel_s <= plain.data_parallel_s
    assert overlapped.iteration_time_s <= plain.iteration_time_s
    selective = base.with_options(ScheduleOptions(recomputation="selective")).evaluate(instance.plan)
    assert selective.iteration_time_s > plain.iteration_time_s
    interleaved = base.with_options(ScheduleOptions(virtual_stages=2)).evaluate(instance.plan)
    assert interleaved.pipelines[0].stages[0].memory.activations > plain.pipelines[0].stages[0].memory.activations
    # The head's logits stay at one micro-batch on the last stage, interleaved or not (Megatron runs
    # the head chunk's backward right after its forward); its other activations take the interleaved
    # count (2 (p - s - 1) + (v - 1) p + 1) / v = (0 + 2 + 1) / 2 = 1.5 at p = 2, v = 2.
    last, last_plain = interleaved.pipelines[0].stages[-1], plain.pipelines[0].stages[-1]
    assert last_plain.memory.logits > 0
    assert last.memory.logits == pytest.approx(last_plain.memory.logits)
    assert last.memory.activations == pytest.approx(1.5 * last_plain.memory.activations)
    # The solvers' memory relaxation stays below that need on every last-stage range (a lower bound).
    from chameleon_opt.solve.bounds import MemoryRelaxation
    model = base.with_options(ScheduleOptions(virtual_stages=2))
    groups = [tuple(range(i * 4, i * 4 + 4)) for i in range(4)]
    relaxation, layers = MemoryRelaxation(model, groups, 1), model.workload.num_layers
    for first in range(1, layers):
        b = model.stage_memory_breakdown(groups[0], first, layers, 1, 2, 8)
        need = b.total - b.framework - b.comm_buffers - b.transient
        assert relaxation.need(first, layers, in_flight_micro_batches(1, 2, 8, virtual=2)) <= need


def test_interleaved_time_is_narayanan_closed_form_for_identical_stages():
    """(m + (p - 1)/v)(t_f + t_b) without communication (Narayanan et al., SC'21, Sec. 2.2)."""
    from chameleon_opt.perf.model import StageCost
    p, m, tf, tb = 4, 8, 1.0, 2.0
    costs = [StageCost(tf, tb, tf + tb, 0.0, 0.0, 0.0, 0.0, 1.0)] * p
    for v in (1, 2, 4):
        assert PerfModel.pipeline_time(costs, m, v) == pytest.approx((m + (p - 1) / v) * (tf + tb))


def test_interleaved_hand_worked_p4_v2_m8_with_overlapped_sends():
    """p = 4 devices, v = 2 chunks, m = 8 micro-batches, every chunk's forward and backward 1 s, every
    send 0.1 s. Megatron's interleaved order (schedules.py, microbatch groups of p) keeps each device
    busy once filled: 16 chunk forwards + 16 chunk backwards = 32 s of work on device 0, plus the
    fill and drain of (p - 1) = 3 chunk ops each way: (m v + p - 1)(1 + 1) = 38 s of compute.
    With overlap_p2p_comm (on whenever virtual stages are set) a send delays only its receiver: the
    first micro-batch's forward crosses 2 x 3 stage boundaries and 1 wrap from device 3 to device 0
    (7 sends), the last one's backward the same 7: 38 + 14 x 0.1 = 39.4 s."""
    from chameleon_opt.perf.model import StageCost
    p, v, m, send = 4, 2, 8, 0.1
    costs = [StageCost(2.0, 2.0, 4.0, 0.0, send if s < p - 1 else 0.0, send if s > 0 else 0.0, 0.0, 1.0)
             for s in range(p)]
    assert PerfModel.pipeline_time(costs, m, v) == pytest.approx(39.4)
    # Megatron's warm-up on rank r: 2 (p - r - 1) + (v - 1) p chunk forwards, then one more before the
    # first backward, each chunk 1/v of the stage's activations: 11 / 2 on rank 0, 5 / 2 on rank 3.
    assert in_flight_micro_batches(0, p, m, virtual=v) == pytest.approx(5.5)
    assert in_flight_micro_batches(p - 1, p, m, virtual=v) == pytest.approx(2.5)
