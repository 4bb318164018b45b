"""torchtitan's memory terms, each against numbers worked by hand from its code (and, for the whole
peak, the H200 probe in bench/device/torchtitan_probe.py), and the published rows' check."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from chameleon_opt.workload.activations import (MEGATRON, TORCHTITAN, block_bytes_per_sample, block_terms,
                                                op_sac_recomputed_flops_per_token, op_sac_terms)
from chameleon_opt.workload.model import Workload
from chameleon_opt.workload.schema import Architecture, WorkloadSpec

LLAMA3_8B = Architecture(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256, seq_len=8192,
                         gated_mlp=True, learned_positions=False, family="llama")


def workload(arch: Architecture = LLAMA3_8B) -> Workload:
    return Workload(WorkloadSpec(name="llama3-8b", architecture=arch), arch.seq_len, 2)


def test_op_sac_keeps_block_input_wq_wv_sdpa_w1_w2():
    # 2 B each: input 4096, wq 4096, wv 1024, SDPA out 4096 (+ fp32 lse 32 heads), w1 14336, w2 4096
    per_token = 2 * (4096 + 4096 + 1024 + 4096 + 14336 + 4096) + 4 * 32
    assert sum(b for b, _ in op_sac_terms(LLAMA3_8B, 2.0).values()) == per_token == 63616
    assert block_bytes_per_sample(LLAMA3_8B, TORCHTITAN, 8192, 2.0, 1, recompute_core=True) == 8192 * 63616


def test_op_sac_under_tp_divides_only_the_column_parallel_outputs():
    # TP 2 with sequence parallelism: input / 2, w2's partial sum undivided, two reduce-scatter outputs / 2
    per_token = 2 * 4096 / 2 + 2 * (4096 + 1024 + 4096 + 14336) / 2 + 4 * 32 / 2 + 2 * 4096 + 2 * 2 * 4096 / 2
    assert block_bytes_per_sample(LLAMA3_8B, TORCHTITAN, 8192, 2.0, 2, sequence_parallel=True,
                                  recompute_core=True) == pytest.approx(8192 * per_token)


def test_op_sac_recomputes_wk_wo_w3():
    assert op_sac_recomputed_flops_per_token(LLAMA3_8B) == 2 * (4096 * 1024 + 4096 * 4096 + 4096 * 14336)
    w = workload()
    recomputed = w.recomputed_flops_per_sample("selective", TORCHTITAN)
    assert recomputed[1] == 8192 * 2 * (4096 * 1024 + 4096 * 4096 + 4096 * 14336) and recomputed[0] == recomputed[-1] == 0
    assert np.array_equal(w.recomputed_flops_per_sample("selective", MEGATRON), w.attention_core_flops_per_sample)


def test_loss_buffers_are_fourteen_bytes_per_logit():
    # log-softmax backward: saved fp32 output + fp32 incoming gradient + fp32 result (12 B), and the freed
    # bf16 logits' block the allocator keeps (2 B): 16384 tokens x 128256 x 14 B = 27.4 GiB
    w = workload()
    assert w.logit_bytes_per_entry(TORCHTITAN) == 14.0 and w.logit_bytes_per_entry(None) == 6.0
    head = w.activation_bytes_per_sample(1, "full", kernels=TORCHTITAN)[-1] * 2
    assert head == 2 * (4 * 8192 * 4096 + 14 * 8192 * 128256)
    assert head / 2**30 == pytest.approx(27.65, abs=0.01)


def test_loss_parallel_holds_eighteen_bytes_per_local_logit():
    # TP 8 shards the vocabulary (loss parallel): DTensor's decomposed backward keeps the saved fp32
    # log-probabilities, the zero-filled scatter, exp(x) and their sum alive together (16 B), plus the
    # bf16 logits' 2 B; per rank 8192 tokens x 128256 / 8 = 16032 entries each: 18 B x 8192 x 16032
    w = workload()
    assert w.logit_bytes_per_entry(TORCHTITAN, 8) == 18.0 and w.logit_bytes_per_entry(TORCHTITAN, 1) == 14.0
    assert w.logit_bytes_per_entry(MEGATRON, 8) == 6.0  # a stack without the field: one count at every TP
    head = w.activation_bytes_per_sample(8, "full", sequence_parallel=True, kernels=TORCHTITAN)[-1]
    assert head == 4 * 8192 * 4096 / 8 + 18 * 8192 * 16032
    assert 18 * 8192 * 16032 / 2**30 == pytest.approx(2.202, abs=0.001)


def test_torchtitan_rmsnorm_keeps_its_fp32_copy_without_checkpointing():
    terms = block_terms(LLAMA3_8B, TORCHTITAN, 8192, 2.0)
    assert terms["norm inputs (2 norms)"][0] == 2 * (4 + 2) * 4096


DATA = Path(__file__).resolve().parents[1] / "bench" / "data" / "torchtitan_published.json"


def test_published_rows_import_or_are_refused_by_name():
    from bench.torchtitan_runs import import_rows
    runs, refused = import_rows(DATA)
    assert {r.id for r in runs} >= {"tt24-8b-fsdp8", "tt24-8b-fsdp128"}
    # float8 tensorwise and Interleaved1F1B are priced; what is left refused is context parallelism (every
    # such row a float8 one) and the rowwise recipe (its GEMM rate is shape-dependent)
    assert refused == {**{i: "parallelism.context_parallel_degree" for i in (
        "tt24-8b-fsdp4-cp2", "tt24-8b-fsdp2-cp4", "tt24-8b-fsdp1-cp8", "tt24-405b-4d-fsdp4-cp2",
        "tt24-405b-4d-fsdp2-cp4", "tt24-405b-4d-fsdp1-cp8")},
        **{f"atp25-{m}-fp8-rowwise-{tp}": "float8.recipe_name"
           for m in ("8b", "70b") for tp in ("vanillatp", "asynctp")}}
    assert sum("fp8" in r.document["training"] for r in runs) == 14
    interleaved = next(r.document for r in runs if r.id == "tt24-405b-3d-interleaved1f1b")
    assert interleaved["training"]["virtual_stages"] == 2 and interleaved["plan"]["layout"]["layers_per_stage"] == [16] * 8
    compiled = {r.id: r.document["training"] for r in runs
                if ("compile" in r.id or "vanillatp" in r.id) and "fp8" not in r.document["training"]}
    assert set(compiled) == {"tt24-8b-fsdp8-compile", "tt24-8b-fsdp128-compile", "atp25-70b-bf16-vanillatp",
                             "atp25-8b-bf16-vanillatp"}
    assert all(t["kernels"] == "torchtitan-compiled" for t in compiled.values())
    # December 2024's torchtitan did not compile the loss; the 2025 runs' default components do
    assert [i for i, t in compiled.items() if t["compiled_loss"]] == ["atp25-70b-bf16-vanillatp",
                                                                       "atp25-8b-bf16-vanillatp"]


def test_imported_job_is_priced_with_torchtitan_kernels_as_a_user_gets_it():
    """`import torchtitan` sets training.kernels, so the plain import path (no calibration given)
    prices torchtitan's saved set and loss buffers: the 8-GPU 8B FSDP row's allocator peak
    (the total less the framework term, as max_reserved excludes it) within 10% of the measured."""
    from bench.torchtitan_runs import import_rows
    from chameleon_opt.instance.load import build_instance
    from chameleon_opt.perf.model import GIB, PerfModel

    runs, _ = import_rows(DATA)
    run = next(r for r in runs if r.id == "tt24-8b-fsdp8")
    assert run.document["training"]["kernels"] == "torchtitan"
    model = PerfModel(build_instance(run.document, "<tt24-8b-fsdp8>"))
    assert model.kernels is TORCHTITAN
    stage = model.evaluate(model.instance.plan).pipelines[0].stages[0]
    allocator = (stage.memory_bytes - stage.memory.framework) / GIB
    assert abs(allocator / run.measured_memory_gib - 1) < 0.10


def test_unfused_elementwise_bytes_of_llama3_8b_block_by_hand():
    """torchtitan's eager chains beyond their fused kernels, bf16, per token of one block: two
    RMSNorms 2 x 32 h, rotary 16 (q + kv), SwiGLU 4 f, K/V repeats 4 (kv + q), output copy 4 q.
    Megatron's fused kernels add nothing."""
    from chameleon_opt.workload.activations import unfused_elementwise_bytes_per_token
    by_hand = 2 * 32 * 4096 + 16 * (4096 + 1024) + 4 * 14336 + 4 * (1024 + 4096) + 4 * 4096
    assert unfused_elementwise_bytes_per_token(LLAMA3_8B, TORCHTITAN, 2.0) == by_hand == 438272
    assert unfused_elementwise_bytes_per_token(LLAMA3_8B, MEGATRON, 2.0) == 0.0
    per_layer = workload().unfused_elementwise_bytes_per_sample(2, TORCHTITAN)
    assert per_layer[0] == per_layer[-1] == 0.0 and per_layer[1] == 8192 * by_hand / 2


def test_eager_chains_are_priced_at_hbm_bandwidth_only_for_eager_stacks():
    """A calibration with torchtitan's kernels adds the chains (forward once, backward twice) at
    ELEMENTWISE_HBM_SHARE of the HBM bandwidth; the same calibration on Megatron's kernels does not."""
    from chameleon_opt.perf.calibration import ELEMENTWISE_HBM_SHARE, DeviceFit, FrameworkCalibration
    devices = {"A100-80": DeviceFit(312.0, 2039.0, 0.7, ())}
    eager = FrameworkCalibration("t", "flash", 0.1, devices, kernels="torchtitan")
    fused = FrameworkCalibration("m", "flash", 0.1, devices)
    (ef, eb), (ff, fb) = eager.forward_backward(workload(), "A100-80", 1), fused.forward_backward(workload(), "A100-80", 1)
    chain = 8192 * 438272 / (2039e9 * ELEMENTWISE_HBM_SHARE)
    assert np.allclose(ef[1:-1] - ff[1:-1], chain) and np.allclose(eb[1:-1] - fb[1:-1], 2 * chain)
    assert ef[0] == ff[0] and eb[-1] == fb[-1]


def test_importer_priced_job_adds_the_eager_chains_to_its_flop_time():
    """Without a calibration (a user's plain import), the torchtitan kernels' unfused chains are added
    to the catalogue-efficiency FLOP time: the Llama 2 13B no-checkpointing row's one-GPU stage takes
    (forward + backward) 3 x the chains' HBM time more than the same job on Megatron's fused kernels."""
    import copy
    from bench.torchtitan_runs import import_rows
    from chameleon_opt.instance.load import build_instance
    from chameleon_opt.perf.calibration import ELEMENTWISE_HBM_SHARE
    from chameleon_opt.perf.model import PerfModel

    runs, _ = import_rows(DATA)
    run = next(r for r in runs if r.id == "tt24a-l2-13b-none")
    plain = copy.deepcopy(run.document)
    del plain["training"]["framework"]   # the import names torchtitan's calibration: priced without it here
    fused_document = copy.deepcopy(plain)
    fused_document["training"]["kernels"] = "megatron"
    eager, fused = (PerfModel(build_instance(d, "<13b>")) for d in (plain, fused_document))
    devices, layers = (0,), eager.workload.num_layers
    (ef, eb, _, _), (ff, fb, _, _) = eager.stage_times(devices, 0, layers), fused.stage_times(devices, 0, layers)
    w, mbs = eager.workload, eager.micro_batch_size
    chains = float(w.unfused_elementwise_bytes_per_sample(1, TORCHTITAN).sum()) * mbs
    bandwidth = eager.stage_device(devices).memory_bandwidth_gbps * 1e9 * ELEMENTWISE_HBM_SHARE
    assert chains > 0 and np.isclose((ef + eb) - (ff + fb), 3 * chains / bandwidth)


def test_compiled_blocks_fuse_their_chains_and_keep_the_fused_saved_set():
    """torch.compile of the blocks: no unfused chain traffic but the complex rotary's (Inductor runs the
    complex multiply as an ATen fallback: 16 B per element of Q and K, Llama 3 8B 16 x (4096 + 1024) per
    token and block, the eager count's rotary term); without checkpointing a block keeps the
    fused norm's bf16 input (2 h, not eager's fp32 copy 6 h, per norm) and the fused gated MLP's three
    tensors (3 x 2 f, not SwiGLU's four): Llama 3 8B, per token, 2 x 4 h + 2 f less; the per-op
    policy's saved set does not change."""
    from chameleon_opt.workload.activations import TORCHTITAN_COMPILED
    w = workload()
    per_block = w.unfused_elementwise_bytes_per_sample(1, TORCHTITAN_COMPILED)
    assert np.allclose(per_block[1:-1], w.sequence_length * 16 * (4096 + 1024)) and per_block[[0, -1]].sum() == 0.0
    eager = block_bytes_per_sample(LLAMA3_8B, TORCHTITAN, 8192, 2.0, 1)
    compiled = block_bytes_per_sample(LLAMA3_8B, TORCHTITAN_COMPILED, 8192, 2.0, 1)
    assert eager - compiled == 8192 * (2 * 4 * 4096 + 2 * 14336)
    assert block_bytes_per_sample(LLAMA3_8B, TORCHTITAN, 8192, 2.0, 1, recompute_core=True) == \
        block_bytes_per_sample(LLAMA3_8B, TORCHTITAN_COMPILED, 8192, 2.0, 1, recompute_core=True)


def test_a_compiled_job_under_the_eager_stacks_calibration_prices_no_chains():
    """The calibration names torchtitan's (eager) kernels; a job that compiles its blocks is priced
    with the compiled form: the compile row's stage is the eager twin's less 4 x the HBM time of the
    chains that compile fuses, every chain but the complex rotary (forward, backward twice, and the
    per-op policy's rerun), and its
    loss buffers stay eager's 14 B per logit (the loss not compiled); compiling the loss makes
    them COMPILED_LOSS_LOGIT_BYTES."""
    import copy
    from bench.torchtitan_runs import import_rows
    from chameleon_opt.instance.load import build_instance
    from chameleon_opt.perf.calibration import ELEMENTWISE_HBM_SHARE, DeviceFit, FrameworkCalibration
    from chameleon_opt.perf.model import PerfModel
    from chameleon_opt.workload.activations import COMPILED_LOSS_LOGIT_BYTES

    runs = {r.id: r for r in import_rows(DATA)[0]}
    eager_doc, compiled_doc = runs["tt24-8b-fsdp8"].document, runs["tt24-8b-fsdp8-compile"].document
    spec = eager_doc["cluster"]["device_type"]
    calibration = FrameworkCalibration("t", "flash", 0.1, {spec["name"]: DeviceFit(
        spec["peak_tflops"], spec["memory_bandwidth_gbps"], 0.6, ())}, kernels="torchtitan")
    eager, compiled = (PerfModel(build_instance(d, "<8b>"), calibration=calibration) for d in (eager_doc, compiled_doc))
    assert compiled.kernels.name == "torchtitan-compiled" and compiled.kernels.logit_bytes == 14.0
    devices, layers = (0,), eager.workload.num_layers
    (ef, eb, _, _), (cf, cb, _, _) = eager.stage_times(devices, 0, layers), compiled.stage_times(devices, 0, layers)
    fused = eager.workload.unfused_elementwise_bytes_per_sample(1, TORCHTITAN) - \
        eager.workload.unfused_elementwise_bytes_per_sample(1, compiled.kernels)
    seconds = float(fused.sum()) * eager.micro_batch_size / (spec["memory_bandwidth_gbps"] * 1e9 * ELEMENTWISE_HBM_SHARE)
    assert np.isclose((ef + eb) - (cf + cb), 4 * seconds)
    loss_doc = copy.deepcopy(compiled_doc)
    loss_doc["training"]["compiled_loss"] = True
    compiled_loss = PerfModel(build_instance(loss_doc, "<8b>")).kernels
    # a compiled loss keeps its 4 B under TP too (its loss-parallel graph is not derived apart)
    assert compiled_loss.logit_bytes == COMPILED_LOSS_LOGIT_BYTES and compiled_loss.loss_parallel_logit_bytes is None


def test_async_tp_exposes_each_collectives_excess_over_its_matmul_and_one_step():
    """torchtitan async TP on the 2025 8B row (TP 8, per-op checkpointing): per block the four
    collectives, each half a ring all-reduce of the micro-batch's s x h activation, pair with
    wq/wk/wv, wo, w1/w3 and w2; by hand max(c - g, 0) + min(c, g) / 8 each, forward and backward
    alike; the embedding's collective stays whole. Without async TP (the vanilla twin) every
    collective shows whole, so the async row's TP time is below the vanilla one's."""
    from bench.torchtitan_runs import import_rows
    from chameleon_opt.instance.load import build_instance
    from chameleon_opt.perf.comm import ring_allreduce_time
    from chameleon_opt.perf.model import PerfModel

    runs = {r.id: r for r in import_rows(DATA)[0]}
    doc = runs["atp25-8b-bf16-asynctp"].document
    assert doc["training"]["tp_async"] and not runs["atp25-8b-bf16-vanillatp"].document["training"]["tp_async"]
    asynchronous, vanilla = (PerfModel(build_instance(runs[i].document, "<8b>"))
                             for i in ("atp25-8b-bf16-asynctp", "atp25-8b-bf16-vanillatp"))
    device = asynchronous.stage_device(tuple(range(8)))
    mbs, s, h = asynchronous.micro_batch_size, 8192, 4096
    c = ring_allreduce_time(s * h * 2 * mbs, 8, asynchronous.intra) / 2
    rate = device.peak_tflops * 1e12 * device.efficiency
    flops = 2 * s * np.array([h * (4096 + 2 * 1024), 4096 * h, 2 * h * 14336, 14336 * h])
    g = flops * mbs / 8 / rate
    by_hand = float(np.sum(np.maximum(c - g, 0) + np.minimum(c, g) / 8))
    table = asynchronous._tables(device, 8)
    tp_fwd, tp_bwd = np.diff(table["tp_fwd"]), np.diff(table["tp_bwd"])
    assert np.isclose(tp_fwd[1], by_hand) and np.isclose(tp_bwd[1], by_hand)
    assert np.isclose(tp_fwd[0], np.diff(vanilla._tables(device, 8)["tp_fwd"])[0])
    assert tp_fwd[1] < np.diff(vanilla._tables(device, 8)["tp_fwd"])[1]
