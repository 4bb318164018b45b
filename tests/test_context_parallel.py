"""Context parallelism (training.context_parallel): one block's per-rank FLOPs and K/V bytes at cp 2,
the ring exchanges' exposed time, the layout's cp groups and the gradient ring over dp x cp, all
worked by hand on a toy model (2 blocks, hidden 64, 4 heads, FFN 256, vocabulary 128, 64 tokens)."""

from __future__ import annotations

import copy

import pytest

from chameleon_opt.errors import InputError
from chameleon_opt.instance.load import build_instance
from chameleon_opt.perf.comm import Link, ring_allreduce_time
from chameleon_opt.perf.model import PerfModel

DOC = {
    "format": 1, "name": "cp-toy",
    "cluster": {"nodes": 1, "devices_per_node": 4,
                "device_type": {"name": "toy", "memory_gib": 80, "peak_tflops": 1.0, "efficiency": 1.0},
                "network": {"intra_node_gbps": 1.0, "intra_node_latency_us": 0.0, "inter_node_gbps": 1.0,
                            "inter_node_latency_us": 0.0}},
    "workload": {"inline": {"name": "toy", "architecture": {"layers": 2, "hidden": 64, "heads": 4, "ffn": 256,
                                                            "vocab": 128, "seq_len": 64}}},
    "training": {"global_batch": 4, "micro_batch_size": 1, "context_parallel": 2},
    "plan": {"tensor_parallel": 1, "layout": {"pipeline_parallel": 1, "data_parallel": 2}},
}


def with_training(**changes: object) -> dict:
    doc = copy.deepcopy(DOC)
    doc["training"].update(changes)
    return doc


def test_one_block_per_rank_flops_and_kv_bytes_at_cp2() -> None:
    """A rank holds 32 of the 64 tokens: linears 2 x 32 x 49,152 weights (4 x 64^2 attention + 2 x 64 x
    256 MLP) = 3,145,728 FLOPs; attention 4 x 32 queries x 64 keys x 64 = 524,288 (half of cp 1's
    1,048,576, not a quarter); one ring message: K and V of 32 tokens x 64 x 2 bytes = 8,192."""
    one = build_instance(with_training(context_parallel=1)).workload
    two = build_instance(DOC).workload
    assert two.sequence_length == 32
    assert two.attention_core_flops_per_sample[1] == 524_288 == one.attention_core_flops_per_sample[1] / 2
    assert two.forward_flops_per_sample[1] == 3_145_728 + 524_288
    assert two.context_parallel_kv_bytes_per_sample(1)[1] == 8_192
    assert two.context_parallel_kv_bytes_per_sample(1)[0] == two.context_parallel_kv_bytes_per_sample(1)[-1] == 0


def test_ring_exchange_exposed_beyond_one_steps_attention() -> None:
    """At 1 TFLOP/s and 1 GB/s: a block's attention forward 524,288 FLOPs = 0.524288 us, 0.262144 us a
    step; its message 8.192 us, so (cp - 1) x (8.192 - 0.262144) = 7.929856 us shows per block, 2 blocks
    15.859712 us; backward K, V, dK, dV 16.384 us against 0.524288 us: 31.719424 us."""
    instance = build_instance(DOC)
    model = PerfModel(instance)
    forward, backward = model.context_parallel_exposed(instance.plan, 0, 0)
    assert forward == pytest.approx(15.859712e-6, rel=1e-9)
    assert backward == pytest.approx(31.719424e-6, rel=1e-9)
    estimate = model.evaluate(instance.plan)
    assert estimate.breakdown_s["context_parallel"] == pytest.approx(2 * (forward + backward), rel=1e-9)
    fast = copy.deepcopy(DOC)
    fast["cluster"]["network"]["intra_node_gbps"] = 1e6  # 8 ns a message: hidden behind the attention
    instance = build_instance(fast)
    assert PerfModel(instance).context_parallel_exposed(instance.plan, 0, 0) == (0.0, 0.0)


def test_layout_groups_cp_ranks_next_to_tp_and_reduces_gradients_over_dp_x_cp() -> None:
    """dp 2 x cp 2 on 4 devices: pipelines (0), (1) are one sequence's cp ranks, (2), (3) the other's,
    each running its replica's 2 micro-batches; the gradients are reduced over all 4 ranks."""
    instance = build_instance(DOC)
    assert [p.stages[0].devices for p in instance.plan.pipelines] == [(0,), (1,), (2,), (3,)]
    assert [p.micro_batches for p in instance.plan.pipelines] == [2, 2, 2, 2]
    model = PerfModel(instance)
    grads = float(instance.workload.params.sum()) * 2.0
    assert model.data_parallel_time(instance.plan) == pytest.approx(ring_allreduce_time(grads, 4, Link(1e9, 0.0)))


def test_distributed_optimizer_shards_over_dp_x_cp_and_reduce_scatters() -> None:
    """Megatron's distributed optimizer at dp 2 x cp 2: the toy's 120,704 parameters (embedding 128 x 64 +
    64 x 64 = 12,288, two blocks of 50,048, head 128 x 64 + 2 x 64 = 8,320) on each of the 4 ranks keep
    bf16 parameters and gradients whole, 241,408 bytes each, and a quarter of the 12-byte fp32 master
    and Adam moments, 362,112 bytes (1,448,448 unsharded). The gradients (241,408 bytes) are
    reduce-scattered over the 4 ranks at 1 GB/s: 3 steps of 60,352 bytes = 181.056 us; the parameter
    all-gather runs behind the next forward (overlap_param_gather). Without overlap both halves count,
    an all-reduce's 362.112 us. Each rank steps a quarter of the parameters."""
    plain = build_instance(DOC)
    instance = build_instance(with_training(zero_stage=1, overlap_param_gather=True))
    assert float(instance.workload.params.sum()) == 12_288 + 2 * 50_048 + 8_320 == 120_704
    stage = instance.plan.pipelines[0].stages[0]
    sharded, whole = PerfModel(instance), PerfModel(plain)
    memory = sharded.stage_memory_breakdown(stage.devices, stage.first, stage.end, 0, 1, 2, replicas=4)
    assert (memory.parameters, memory.gradients, memory.optimizer) == (241_408, 241_408, 362_112)
    unsharded = whole.stage_memory_breakdown(stage.devices, stage.first, stage.end, 0, 1, 2, replicas=4)
    assert unsharded.optimizer == 1_448_448
    assert sharded.data_parallel_time(instance.plan) == pytest.approx(181.056e-6, rel=1e-9)
    no_overlap = build_instance(with_training(zero_stage=1))
    assert PerfModel(no_overlap).data_parallel_time(no_overlap.plan) == pytest.approx(362.112e-6, rel=1e-9)
    step = whole.optimizer_time(stage.devices, stage.first, stage.end, replicas=4)
    assert sharded.optimizer_time(stage.devices, stage.first, stage.end, replicas=4) == pytest.approx(step / 4)


def test_pipeline_stages_keep_cp_ranks_adjacent_and_explicit_groups_must_match() -> None:
    """PP 2 x CP 2 (order tp-pp-dp, cp inserted after tp: tp-cp-pp-dp): cp ranks 0, 1 hold stage 0 and
    2, 3 stage 1. An explicit plan's cp groups must repeat the same stages and micro-batches."""
    doc = copy.deepcopy(DOC)
    doc["plan"]["layout"] = {"pipeline_parallel": 2, "data_parallel": 1}
    plan = build_instance(doc).plan
    assert [[s.devices for s in p.stages] for p in plan.pipelines] == [[(0,), (2,)], [(1,), (3,)]]
    doc["plan"] = {"tensor_parallel": 1, "pipelines": [
        {"micro_batches": 4, "stages": [{"devices": [0], "layers": [0, 4]}]},
        {"micro_batches": 4, "stages": [{"devices": [1], "layers": [0, 2]}, {"devices": [2], "layers": [2, 4]}]}]}
    with pytest.raises(InputError, match="plan.pipelines.*context_parallel 2"):
        build_instance(doc)


def test_refusals_name_the_field() -> None:
    with pytest.raises(InputError, match="training"):
        build_instance(with_training(attention="eager"))
    with pytest.raises(InputError, match="training.context_parallel"):
        build_instance(with_training(context_parallel=3, global_batch=6))  # 64 tokens in 6 chunks
    from chameleon_opt.decision import refuse_context_parallel
    with pytest.raises(InputError, match="training.context_parallel.*planner"):
        refuse_context_parallel(build_instance(DOC))
