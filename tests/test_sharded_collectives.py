"""The data-parallel mechanisms the published runs exposed (issue 26): ZeRO-3 / FSDP collectives on every
micro-batch, rings that drive several NICs per node with NCCL's ring latency, Megatron's
--overlap-param-gather leaving only the reduce-scatter, and flash attention priced at the FLOPs its
kernel executes."""

from __future__ import annotations

import numpy as np
import pytest

from chameleon_opt.errors import InputError
from chameleon_opt.instance.devices import CATALOGUE
from chameleon_opt.instance.load import build_instance
from chameleon_opt.perf.calibration import DeviceFit, FrameworkCalibration, flash_attention_seconds
from chameleon_opt.perf.comm import (Link, ring_allgather_time, ring_allreduce_time, ring_latency,
                                     ring_link_across_nodes)
from chameleon_opt.perf.model import SHARDED_OVERLAP_INTERFERENCE, PerfModel

INTRA, INTER = Link(230e9, 5e-6), Link(25e9, 10e-6)


def fsdp_job(zero: int = 3, nodes: int = 1, reshard: bool = True, micro_batches: int = 4, inter_gbps: float = 25,
             **training) -> dict:
    """GPT-3 1.7B, one replica per device over `nodes` 8-GPU A100-80GB nodes (pure data parallelism)."""
    devices = 8 * nodes
    return {"format": 1, "name": "fsdp",
            "cluster": {"nodes": nodes, "devices_per_node": 8, "device_type": "A100-80",
                        "network": {"intra_node_gbps": 230, "inter_node_gbps": inter_gbps, "intra_node_latency_us": 5,
                                    "inter_node_latency_us": 10}},
            "workload": {"model": "gpt3-1.7b"},
            "training": {"global_batch": devices * micro_batches, "micro_batch_size": 1, "sequence_length": 2048,
                         "recomputation": "full", "zero_stage": zero, "reshard_after_forward": reshard, **training},
            "plan": {"tensor_parallel": 1, "layout": {"pipeline_parallel": 1, "data_parallel": devices}}}


def model_of(document: dict) -> tuple[PerfModel, object]:
    instance = build_instance(document, "<test>")
    return PerfModel(instance), instance.plan


def test_a_ring_drives_one_nic_per_rank_it_has_on_each_node_and_pays_the_network_latency_per_node() -> None:
    assert ring_link_across_nodes(INTRA, INTER, [8]) is INTRA
    assert ring_link_across_nodes(INTRA, INTER, [8, 8]).bandwidth == 200e9  # 8 NICs of 25 GB/s, under NVLink
    assert ring_link_across_nodes(INTRA, INTER, [1, 1, 1]).bandwidth == 25e9  # one rank a node: one NIC
    assert ring_link_across_nodes(INTRA, INTER, [4, 2]).bandwidth == 50e9  # the thinnest node decides
    # NCCL's ring: n - 1 steps, nodes - 1 of them across a boundary
    assert ring_latency(16, 2, INTRA, INTER) == pytest.approx(14 * 5e-6 + 10e-6)
    assert ring_latency(1, 1, INTRA, INTER) == 0.0
    assert ring_allgather_time(8e9, 8, INTRA) == pytest.approx(ring_allreduce_time(8e9, 8, INTRA) / 2)


def test_fsdp_gathers_twice_and_reduce_scatters_once_per_micro_batch() -> None:
    model, plan = model_of(fsdp_job())
    params = float(model.workload.params.sum())
    units = model.workload.num_layers
    one = units * 7 * 5e-6 + params * 2.0 * 7 / 8 / 230e9  # per collective: latencies + bf16 bytes over NVLink
    largest = 7 * 5e-6 + float(model.workload.params.max()) * 2.0 * 7 / 8 / 230e9
    forward, backward, unit_gather, unit_reduce = model.sharded_collective_times(plan, 0, 0)
    assert forward == pytest.approx(one)
    assert backward == pytest.approx(2 * one)  # the backward's gather and the gradients' reduce-scatter
    assert unit_gather == unit_reduce == pytest.approx(largest)
    estimate = model.evaluate(plan)
    assert estimate.data_parallel_s == 0.0  # nothing left at the step's end: synced in every backward
    # NVLink outpaces the compute: the first gather, the last reduce-scatter and the overlap's interference show
    stage = estimate.pipelines[0].stages[0]
    assert stage.forward_s > forward and stage.backward_s > backward
    shown = 2 * largest + SHARDED_OVERLAP_INTERFERENCE * (forward + backward)
    assert stage.sharded_s == pytest.approx(shown)
    assert estimate.breakdown_s["data_parallel"] == pytest.approx(4 * shown)  # four micro-batches
    # below ZeRO-3 nothing is gathered and the gradients are all-reduced once, at the end
    lower, lower_plan = model_of(fsdp_job(zero=1))
    assert lower.sharded_collective_times(lower_plan, 0, 0) == (0.0, 0.0, 0.0, 0.0)
    assert lower.evaluate(lower_plan).data_parallel_s > 0.0


def test_fsdp_over_a_slow_network_waits_for_its_gathers() -> None:
    """Two nodes joined by 0.5 GB/s per device: the collectives outlast the compute and set the pace;
    the compute beside them adds its interference share."""
    model, plan = model_of(fsdp_job(nodes=2, inter_gbps=0.5))
    forward, backward, unit_gather, unit_reduce = model.sharded_collective_times(plan, 0, 0)
    compute_f, compute_b, _, _ = model.stage_times(plan.pipelines[0].stages[0].devices, 0, model.workload.num_layers)
    stage = model.evaluate(plan).pipelines[0].stages[0]
    lost = SHARDED_OVERLAP_INTERFERENCE
    assert stage.forward_s == pytest.approx(forward + lost * compute_f + unit_gather)
    assert stage.backward_s == pytest.approx(backward + lost * compute_b + unit_reduce)


def test_the_overlap_costs_its_interference_share_of_the_shorter_side() -> None:
    """max(compute, collectives) + x min(compute, collectives): x = 0 is a free overlap, x = 1 runs them
    one after the other; a calibration's sharded_interference sets x."""
    document = fsdp_job()
    instance = build_instance(document, "<test>")
    calibration = lambda x: FrameworkCalibration("t", "flash", 1.0, {}, sharded_interference=x)  # noqa: E731
    free, serial = (PerfModel(instance, calibration=calibration(x)) for x in (0.0, 1.0))
    assert free.sharded_interference == 0.0 and serial.sharded_interference == 1.0
    forward, backward, unit_gather, unit_reduce = free.sharded_collective_times(instance.plan, 0, 0)
    assert free.overlap_sharded(1.0, 2.0, (forward, backward, unit_gather, unit_reduce)) == pytest.approx(
        (1.0 + unit_gather, 2.0 + unit_reduce))
    assert serial.overlap_sharded(1.0, 2.0, (forward, backward, unit_gather, unit_reduce)) == pytest.approx(
        (1.0 + forward + unit_gather, 2.0 + backward + unit_reduce))


def test_shard_grad_op_gathers_once_and_holds_the_stage_parameters() -> None:
    full, plan = model_of(fsdp_job())
    kept, kept_plan = model_of(fsdp_job(reshard=False))
    f, b = full.sharded_collective_times(plan, 0, 0)[:2]
    kf, kb = kept.sharded_collective_times(kept_plan, 0, 0)[:2]
    assert (kf, kb) == pytest.approx((f, b / 2))
    params = float(full.workload.params.sum())
    held = kept.evaluate(kept_plan).pipelines[0].stages[0].memory.transient
    two_layers = full.evaluate(plan).pipelines[0].stages[0].memory.transient
    assert held - two_layers == pytest.approx((params - 2 * float(full.workload.params.max())) * 2.0)


def test_fsdp_reduce_scatters_in_its_reduce_dtype_and_keeps_its_gradients_in_theirs() -> None:
    """Composer's DEFAULT from 0.16.4: bf16 gathers, fp32 reduce-scatter (reduce_bytes_per_param 4). By hand,
    GPT-3 1.7B (1,770,250,752 parameters, 26 units) on one 8-GPU node: 26 x 7 x 5 us + 1.770e9 x 4 B x 7/8
    / 230 GB/s = 0.91 ms + 26.94 ms = 27.85 ms for the reduce-scatter, against 14.38 ms in bf16."""
    bf16, plan = model_of(fsdp_job())
    fp32, _ = model_of(fsdp_job(reduce_bytes_per_param=4))
    forward, backward, unit_gather, unit_reduce = fp32.sharded_collective_times(plan, 0, 0)
    assert float(fp32.workload.params.sum()) == 1_770_250_752
    assert forward == pytest.approx(0.014379, abs=1e-6)  # the gathers stay bf16
    assert backward - forward == pytest.approx(0.027848, abs=1e-6)
    assert bf16.sharded_collective_times(plan, 0, 0)[1] - forward == pytest.approx(0.014379, abs=1e-6)
    assert unit_reduce == pytest.approx(7 * 5e-6 + 122_683_392 * 4 * 7 / 8 / 230e9)
    assert unit_gather == bf16.sharded_collective_times(plan, 0, 0)[2]
    # the gradients kept after the reduce-scatter are still counted at the gradient precision
    assert fp32.evaluate(plan).pipelines[0].stages[0].memory == bf16.evaluate(plan).pipelines[0].stages[0].memory


def test_only_llm_foundrys_composer_0_17_tables_reduce_default_mode_in_fp32() -> None:
    from chameleon_opt.perf.published import _foundry_reduce_bytes
    row = {"raw": {"MP Mode": "DEFAULT"}, "source": {"section": "H100 80GB BF16 (Large Scale, >= 128 GPUs)"}}
    assert _foundry_reduce_bytes(row) == 4.0
    assert _foundry_reduce_bytes({**row, "raw": {"MP Mode": "PURE"}}) is None
    assert _foundry_reduce_bytes({**row, "source": {"section": "H100 80GB BF16"}}) is None  # v0.3.0: 0.16.3 or .4


def test_across_nodes_the_fsdp_ring_uses_every_nic_of_the_node() -> None:
    model, plan = model_of(fsdp_job(nodes=2))
    params = float(model.workload.params.sum())
    latency = 14 * 5e-6 + 10e-6
    forward = model.sharded_collective_times(plan, 0, 0)[0]
    assert forward == pytest.approx(model.workload.num_layers * latency + params * 2.0 * 15 / 16 / 200e9)


def test_overlap_param_gather_leaves_the_reduce_scatter() -> None:
    plain, plan = model_of(fsdp_job(zero=1, nodes=2))
    overlapped, _ = model_of(fsdp_job(zero=1, nodes=2, overlap_param_gather=True))
    assert overlapped.data_parallel_time(plan) == pytest.approx(plain.data_parallel_time(plan) / 2, rel=1e-3)
    with pytest.raises(InputError, match="overlap_param_gather"):
        build_instance(fsdp_job(zero=0, overlap_param_gather=True), "<test>")


def test_flash_attention_runs_the_causal_half_and_a_backward_of_two_and_a_half_forwards() -> None:
    forward, backward = flash_attention_seconds(np.array([4.0]), 1.0)
    assert (forward[0], backward[0]) == (2.0, 5.0)
    instance = build_instance(fsdp_job(), "<test>")
    device = CATALOGUE["A100-80"]
    fit = {"A100-80": DeviceFit(device.peak_tflops, device.memory_bandwidth_gbps, 0.8, ())}
    plain = FrameworkCalibration("t", "flash", 0.1, fit)
    kernel = FrameworkCalibration("t", "flash", 0.1, fit, attention_utilisation={"A100-80": 0.3})
    workload = instance.workload
    f0, b0 = plain.forward_backward(workload, "A100-80", 1)
    f1, b1 = kernel.forward_backward(workload, "A100-80", 1)
    core = workload.attention_core_flops_per_sample
    rate = device.peak_tflops * 1e12
    assert f1 - f0 == pytest.approx(core / 2 / (rate * 0.3) - core / (rate * 0.8))
    assert b1 - b0 == pytest.approx(core / 2 * 2.5 / (rate * 0.3) - 2 * core / (rate * 0.8))
    assert FrameworkCalibration.from_json("t", kernel.to_json()).attention_utilisation == {"A100-80": 0.3}


def test_each_rank_steps_only_its_shard_of_the_optimizer() -> None:
    """ZeRO >= 1 shards the optimizer state, so each replica steps 1/replicas of the parameters (before, the
    whole model's step was charged to every rank: llm-foundry's 70B on 64 GPUs paid 1.2 s a step for it)."""
    plain, plan = model_of(fsdp_job(zero=0))
    devices, layers = plan.pipelines[0].stages[0].devices, plain.workload.num_layers
    whole = plain.optimizer_time(devices, 0, layers)
    assert plain.optimizer_time(devices, 0, layers, replicas=8) == whole  # no ZeRO: every replica steps all
    for zero in (1, 2, 3):
        sharded, sharded_plan = model_of(fsdp_job(zero=zero))
        assert sharded.optimizer_time(devices, 0, layers, replicas=8) == pytest.approx(whole / 8)
        assert sharded.evaluate(sharded_plan).optimizer_s == pytest.approx(whole / 8)
    copies, copies_plan = model_of(fsdp_job(zero=3, shard_replicas=2))  # HSDP: two copies of 4 shards each
    assert copies.evaluate(copies_plan).optimizer_s == pytest.approx(whole / 4)
