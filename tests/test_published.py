"""Published measured runs as instances: refused settings are named, measured times follow each row's
metric (skips without ../shared/data/published)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chameleon_opt.instance.load import build_instance
from chameleon_opt.perf.published import Refused, TimeRefused, load_rows, to_run
from chameleon_opt.workload.activations import kernels_for

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "published"


@pytest.fixture(scope="module")
def rows() -> dict[str, dict]:
    if not DATA.is_dir():
        pytest.skip(f"published tables absent ({DATA})")
    return {r["id"]: r for r in load_rows(DATA)}


def test_moe_and_lora_rows_are_refused_by_name(rows: dict[str, dict]) -> None:
    reasons = {}
    for key in ("megatron-041", "nemo-016", "nemo-013"):
        with pytest.raises(Refused) as refused:
            to_run(rows[key])
        reasons[key] = str(refused.value)
    assert "mixture of experts" in reasons["megatron-041"]
    assert "LoRA" in reasons["nemo-016"] and "packed" in reasons["nemo-013"]
    interleaved = to_run(rows["nemo-012"])  # context-parallel and interleaved: both priced
    assert interleaved.document["training"]["context_parallel"] > 1
    assert interleaved.document["training"]["virtual_stages"] > 1


def test_context_parallel_rows_are_priced_with_their_cp_groups(rows: dict[str, dict]) -> None:
    """Megatron-LM's Llama 3 8B FP8 row: 8 GPUs at CP 2, so DP 4 (world = tp x cp x pp x dp), 128 sequences
    of 8,192 tokens, 4,096 a rank; 8 pipelines of 32 micro-batches, cp ranks on neighbouring GPUs."""
    run = to_run(rows["megatron-038"])
    assert run.document["training"]["context_parallel"] == 2
    assert run.document["plan"]["layout"]["data_parallel"] == 4 and "CP2" in run.label
    instance = build_instance(run.document)
    assert instance.workload.sequence_length == 4096
    assert [p.stages[0].devices for p in instance.plan.pipelines[:2]] == [(0,), (1,)]
    assert sum(p.micro_batches for p in instance.plan.pipelines) == 2 * 128


def test_fp8_rows_carry_their_stacks_delayed_recipe(rows: dict[str, dict]) -> None:
    """NeMo's (Megatron-core TE layers: weights cast once per step) and llm-foundry's amp_fp8 (cast every
    forward); the NeMo long-sequence table's TFLOP/s back to seconds by Megatron 2024's model FLOPs."""
    nemo, foundry = to_run(rows["nemo-005"]), to_run(rows["llmfoundry-073"])
    assert nemo.document["training"]["fp8"] == {"recipe": "delayed", "weight_cast": "per_step"}
    assert foundry.document["training"]["fp8"] == {"recipe": "delayed", "weight_cast": "per_micro_batch"}
    assert nemo.family.endswith("FP8") and nemo.document["cluster"]["device_type"]["fp8_peak_tflops"] == 1979
    long = to_run(rows["nemo-027"])  # LLAMA2-7B s4096, 4 GPUs, GBS 1024, 768 TFLOP/s per GPU
    flops_per_token = 12 * 32 * 4096 ** 2 * (1 + 1 + 1 + 11008 / 4096 * 1.5 + 32000 / (2 * 32 * 4096))
    assert long.measured_step_s == pytest.approx(1024 * 4096 * flops_per_token / (768e12 * 4), rel=1e-6)


def test_fp8_row_on_a_gpu_without_fp8_tensor_cores_is_refused(rows: dict[str, dict]) -> None:
    row = {**rows["llmfoundry-073"], "hardware": {**rows["llmfoundry-073"]["hardware"], "gpu": "NVIDIA A100 80GB"}}
    with pytest.raises(Refused, match="no fp8 tensor cores"):
        to_run(row)


def test_megatron_2021_row_time_from_its_recompute_formula(rows: dict[str, dict]) -> None:
    """GPT-3 175B-class row: TFLOP/s under 96*B*s*l*h^2*(1+s/6h+V/16lh) back to seconds per step."""
    run = to_run(rows["megatron-021"])  # 1T, 3072 A100s, 163 TFLOP/s
    b, s, l, h, v = 3072, 2048, 128, 25600, 51200
    flops = 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    assert run.measured_step_s == pytest.approx(flops / (163e12 * 3072))
    assert run.document["training"]["recomputation"] == "full"
    # Megatron-LM's split: 128 / 64 = 2 blocks a stage, the embedding on the first and the head on the last
    assert run.document["plan"]["layout"] == {"pipeline_parallel": 64, "data_parallel": 6,
                                              "layers_per_stage": [3] + [2] * 62 + [3]}
    assert run.document["training"]["attention"] == "eager"  # 2021: before FlashAttention
    assert run.attention_kernel is None


def test_llm_foundry_rows_are_fsdp_with_their_sharding_strategy(rows: dict[str, dict]) -> None:
    """FULL_SHARD gathers again for the backward, SHARD_GRAD_OP keeps the gathered parameters; both run
    MPT's Triton flash attention (FlashAttention v1 class)."""
    full, grad_op = to_run(rows["llmfoundry-001"]), to_run(rows["llmfoundry-016"])
    assert (full.document["training"]["zero_stage"], full.document["training"]["reshard_after_forward"]) == (3, True)
    assert (grad_op.document["training"]["zero_stage"],
            grad_op.document["training"]["reshard_after_forward"]) == (3, False)
    assert full.attention_kernel == grad_op.attention_kernel == "flash-v1"
    # amp_bf16 rows ran on the torch 2.1 image (early-stopping recompute), bf16 / PURE rows on torch 1.13.1
    assert full.document["training"]["recompute_early_stop"] is True
    may_2023 = next(r for r in rows.values() if r["_source"] == "llm_foundry" and r["raw"]["Precision"] == "bf16")
    assert to_run(may_2023).document["training"]["recompute_early_stop"] is False


def test_megatron_2024_overlap_flags_mean_the_distributed_optimizer(rows: dict[str, dict]) -> None:
    run = to_run(rows["megatron-001"])  # --overlap-grad-reduce --overlap-param-gather --tp-comm-overlap
    training = run.document["training"]
    assert (training["zero_stage"], training["overlap_param_gather"], run.tp_comm_overlap) == (1, True, True)
    assert (training["attention"], run.attention_kernel) == ("flash", "te-fused")   # TE on Hopper: its fused attention
    # --tp-comm-overlap runs only under --sequence-parallel (Megatron's arguments.py asserts it): TP 1
    # has no sequence to split, the 314B row at TP 8 does, which divides its blocks' activations by 8.
    assert training["sequence_parallel"] is False
    big = to_run(rows["megatron-008"])
    assert big.tp_comm_overlap and big.document["training"]["sequence_parallel"] is True
    # NeMo 1.x's distributed Adam keeps 16-bit remainders of the fp32 master weights (10 optimizer bytes)
    # and its fp8 scripts reduce gradients in bf16; Megatron-Core's distributed optimizer keeps the defaults.
    nemo = to_run(rows["nemo-012"]).document["training"]
    assert nemo["optimizer"]["state_bytes_per_param"] == 10.0 and "grad_bytes_per_param" not in nemo
    llama3 = to_run(rows["megatron-039"]).document["training"]
    assert "grad_bytes_per_param" not in llama3 and "optimizer" not in llama3


def test_recipes_with_the_distributed_optimizer_shard_it_and_the_rest_do_not(rows: dict[str, dict]) -> None:
    """NeMo's launcher configs (24.07 pretraining table, 24.03.01 long-sequence H100 rows), Megatron-LM's
    train_llama3_8b_h100_fp8.sh and the NeMo performance recipes its Llama table follows run the
    distributed optimizer with the parameter all-gather overlapped; the 2021 Selene rows (before
    Megatron-LM had one) and the 2020 rows stay plain data parallel."""
    for key in ("nemo-005", "nemo-011", "nemo-027", "nemo-035", "megatron-038", "megatron-039"):
        training = to_run(rows[key]).document["training"]
        assert (key, training["zero_stage"], training.get("overlap_param_gather")) == (key, 1, True)
    for key in ("megatron-012", "megatron-026"):
        training = to_run(rows[key]).document["training"]
        assert (key, training["zero_stage"], training.get("overlap_param_gather")) == (key, 0, None)


def test_unknown_hugging_face_family_is_refused() -> None:
    with pytest.raises(ValueError, match="no Hugging Face activation model for family 'bloom'"):
        kernels_for("hf", "bloom")


def test_dgx_a100_rows_published_before_the_80gb_part_are_40gb() -> None:
    """The A100 80 GB was announced 2020-11-16: an A100 row without a memory size from a table shown
    before then is a 40 GB part; after it, the 80 GB default stands (no shared data needed)."""
    from chameleon_opt.perf.published import _gpu
    old = {"hardware": {"gpu": "NVIDIA A100 (DGX-A100)"}, "source": {"file_date": "2020-09-11 .. 2021-01-11"}}
    new = {"hardware": {"gpu": "NVIDIA A100"}, "source": {"file_date": "2023-08-28 (last change to file)"}}
    stated = {"hardware": {"gpu": "NVIDIA A100 80GB"}, "source": {"file_date": "2020-09-11"}}
    assert (_gpu(old), _gpu(new), _gpu(stated)) == ("A100-40", "A100-80", "A100-80")


def test_a_die_with_no_fitted_rows_takes_its_proxy_dies_efficiency() -> None:
    """V100 (PROXY_DIE: A100) is predicted from the A100 fit when no V100 row is fitted; a fitted V100
    keeps its own value."""
    from chameleon_opt.perf.published import PublishedRun, fit_efficiencies

    def run(i: int, gpu: str, family: str) -> PublishedRun:
        return PublishedRun(f"r{i}", "s", family, gpu, "", {}, 1.0, "")
    # step = a / e_gpu + b / e_mem: the A100 rows say e = 0.8, e_mem = 0.1 exactly
    a100 = [run(i, "A100-80", "f") for i in range(3)]
    terms = {"r0": (0.4, 0.05, 0.0), "r1": (0.56, 0.03, 0.0), "r2": (0.72, 0.01, 0.0)}
    fit = fit_efficiencies(a100, terms)
    assert fit.compute["A100-80"] == pytest.approx(0.8) and fit.memory_efficiency == pytest.approx(0.1)
    assert fit.compute["V100-32"] == pytest.approx(0.8) and fit.borrowed == ("V100-32",)
    terms["r3"] = (0.6, 0.01, 0.0)   # a V100 row at e = 2/3
    fit = fit_efficiencies(a100 + [run(3, "V100-32", "g")], terms)
    assert fit.compute["V100-32"] == pytest.approx(2 / 3) and fit.borrowed == ()


def test_the_overlap_interference_fit_recovers_a_known_share_and_stays_in_bounds() -> None:
    """Runs whose steps are t0 + x (t1 - t0) with x = 0.6 give back 0.6; a fit asking for less than a free
    overlap or more than running compute and collectives apart is clipped to [0, 1]; runs x does not
    move (no ZeRO-3 collectives) fit nothing."""
    from chameleon_opt.perf.published import fit_interference
    at_zero, at_one = [1.0, 2.0, 4.0], [1.5, 2.2, 5.0]
    measured = [t0 + 0.6 * (t1 - t0) for t0, t1 in zip(at_zero, at_one)]
    assert fit_interference(measured, at_zero, at_one) == pytest.approx(0.6)
    assert fit_interference([0.9, 1.9, 3.9], at_zero, at_one) == 0.0
    assert fit_interference([2.0, 3.0, 6.0], at_zero, at_one) == 1.0
    assert fit_interference([1.0, 2.0], [1.0, 2.0], [1.0, 2.0]) == 0.0


def _megatron_deepspeed_row(activation_checkpointing: str | None) -> dict:
    """A hand-written Megatron-DeepSpeed row (the 1.3B rebase example: 16 V100, TP 2, DP 8)."""
    return {
        "_source": "deepspeed", "id": "ds-hand", "source": {"row_label": "hand-worked", "file_date": None},
        "model": {"name": "GPT-3 1.3B", "layers": 24, "hidden": 2048, "heads": 16, "kv_heads": None,
                  "ffn_hidden": 8192, "vocab": 50257, "seq_len": 2048},
        "hardware": {"gpu": "NVIDIA V100 (DGX-2)", "num_gpus": 16, "gpus_per_node": 16},
        "parallel": {"dp": 8, "zero_stage": 0, "tp": 2, "pp": 1, "notes": None},
        "batch": {"micro_batch": 2, "global_batch": 512},
        "precision": "fp16", "activation_checkpointing": activation_checkpointing, "notes": None,
        "measured": {"tflops_per_gpu": 23.11},
        "metric_definition": "TFLOPs per GPU printed by Megatron-DeepSpeed", "inferred": {},
    }


def test_megatron_deepspeed_tflops_back_to_seconds_by_hand() -> None:
    """Megatron-DeepSpeed prints 24 * k * B*s*l*h^2 * (1 + s/6h + V/16lh) / (t * GPUs), k = 4 with activation
    checkpointing (3 without), V padded to a multiple of 128 x TP: 50257 -> 50432 at TP 2."""
    b, s, l, h, v = 512, 2048, 24, 2048, 50432
    # DeepSpeed's --checkpoint-activations prints 4 passes; Megatron-LM's recompute flags were not tested by
    # the 2023 calculation (3 passes printed although the run recomputes)
    for checkpointing, passes in (("full", 4), (None, 3), ("full (--recompute-granularity full)", 3)):
        run = to_run(_megatron_deepspeed_row(checkpointing))
        flops = 24 * passes * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
        assert run.measured_step_s == pytest.approx(flops / (23.11e12 * 16))
    assert run.family == "GPT (Megatron-DeepSpeed)" and run.gpu == "V100-32"
    training = run.document["training"]
    # no flash flag on V100; DeepSpeed reduces gradients after the last backward
    assert (training["attention"], run.attention_kernel, training["overlap_grad_reduce"]) == ("eager", None, False)


def test_megatron_deepspeed_oom_and_unnamed_rows_are_refused_by_name(rows: dict[str, dict]) -> None:
    with pytest.raises(Refused, match="measured.oom"):
        to_run(rows["deepspeed-018"])
    with pytest.raises(Refused, match="model.name inferred"):
        to_run(rows["deepspeed-015"])
    # the rebase README's checkpointing A/B: its step time refused (2.6x below the stack's 260-hour 1.3B V100
    # run), its instance and max-allocated peak kept for the memory check
    for row_id, peak in (("deepspeed-008", 15241 / 1024), ("deepspeed-009", 12924 / 1024)):
        with pytest.raises(TimeRefused, match="checkpointing A/B") as refused:
            to_run(rows[row_id])
        assert refused.value.run.measured_memory_gib == pytest.approx(peak, abs=1e-3)
        assert refused.value.run.document["plan"]["tensor_parallel"] == 2
    from bench.validate_perf import published_runs
    runs, reasons, memory_only = published_runs(DATA)
    assert sorted(r.id for r in memory_only) == ["deepspeed-008", "deepspeed-009"]
    assert not {"deepspeed-008", "deepspeed-009"} & {r.id for r in runs}
    assert sum(n for why, n in reasons.items() if "checkpointing A/B" in why) == 2
    assert to_run(rows["deepspeed-011"]).attention_kernel == "flash-v1"   # FlashAttention 1.0.4
    assert to_run(rows["deepspeed-010"]).attention_kernel is None         # without FlashAttention


def test_a_named_gpt3_size_without_dimensions_takes_its_scripts_configuration() -> None:
    """The rebase README's 2.7B rows name 'GPT-3 2.7B' and no dimensions; its script lists the 2.7B block
    (32 layers, hidden 2560, 32 heads), FFN 4 x hidden, the GPT-2 vocabulary, and the block's global batch
    where the row only carries one over from another run. A row with no size the script lists stays refused."""
    row = _megatron_deepspeed_row("full")
    row["model"] = {"name": "GPT-3 2.7B", "layers": None, "hidden": None, "heads": None, "kv_heads": None,
                    "ffn_hidden": None, "vocab": None, "seq_len": 2048}
    run = to_run(row)
    architecture = run.document["workload"]["inline"]["architecture"]
    assert (architecture["layers"], architecture["hidden"], architecture["heads"], architecture["ffn"],
            architecture["vocab"]) == (32, 2560, 32, 10240, 50257)
    assert run.document["training"]["global_batch"] == 512   # the row states it
    # A global batch carried over from another run ('same') is the 2.7B block's 512, not the row's 256: the
    # printed 121 TFLOP/s on 8 GPUs, 4 passes, V padded to 50432 at TP 2, is then a 12.78 x 2 s step.
    row["batch"], row["inferred"] = {"micro_batch": 2, "global_batch": 256}, {"batch.global_batch": "same"}
    row["hardware"] = {"gpu": "NVIDIA A100", "num_gpus": 8, "gpus_per_node": None}
    row["measured"] = {"tflops_per_gpu": 121.0}
    row["parallel"] = {"tp": 2, "pp": 2, "zero_stage": 1, "notes": None}
    run = to_run(row)
    b, s, l, h, v = 512, 2048, 32, 2560, 50432
    flops = 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    assert run.document["training"]["global_batch"] == 512
    assert run.measured_step_s == pytest.approx(flops / (121e12 * 8))
    assert run.measured_step_s == pytest.approx(25.555, abs=1e-3)
    row["model"] = {**row["model"], "name": "GPT-3 5B"}
    with pytest.raises(Refused, match="model.layers not stated"):
        to_run(row)


def test_megatron_2024_mfu_back_to_seconds_by_hand() -> None:
    """An MFU of Megatron-LM 2024's model FLOPs against the H100's 989.4 TFLOP/s dense bf16 peak: GPT 1.7B
    (24 x 2048, 4096 tokens, vocab 131072), 48 GPUs, batch 192, 41%."""
    row = {"_source": "megatron_lm", "id": "mfu-hand", "source": {"row_label": "hand", "file_date": None},
           "model": {"name": "GPT 1.7B", "layers": 24, "hidden": 2048, "heads": 16, "kv_heads": None,
                     "ffn_hidden": 8192, "vocab": 131072, "seq_len": 4096},
           "hardware": {"gpu": "NVIDIA H100", "num_gpus": 48, "gpus_per_node": 8},
           "parallel": {"tp": 1, "pp": 1, "notes": None}, "batch": {"micro_batch": 1, "global_batch": 192},
           "precision": "bf16", "activation_checkpointing": None, "notes": None, "inferred": {},
           "measured": {"mfu_pct": 41.0},
           "metric_definition": "MFU from Megatron-LM num_floating_point_operations ... relative to H100 bf16 dense peak"}
    b, s, l, h, v = 192, 4096, 24, 2048, 131072
    flops = 12 * b * s * l * h * h * ((1 + 1 + s / h) + 4 + v / (2 * l * h))
    assert to_run(row).measured_step_s == pytest.approx(flops / (0.41 * 989.4e12 * 48))


def test_strong_scaling_rows_with_an_assumed_layout_are_refused(rows: dict[str, dict]) -> None:
    for key in ("megatron-010", "megatron-011"):
        with pytest.raises(Refused, match="assumed from another row"):
            to_run(rows[key])


def test_a_row_measured_twice_is_scored_against_both_runs_by_hand(tmp_path: Path) -> None:
    """llm-foundry's re-run A100 80GB rows (bench/validate_perf.remeasured): a row predicted 1.0 s against a
    measured 1.25 s (-20%) at 800 tokens/s/GPU, whose configuration an earlier run measured at 1000, is
    exactly on the earlier run (1.25 s x 800 / 1000 = 1.0 s); an unchanged configuration is not listed."""
    import json

    from bench.validate_perf import CONFIGURATION, remeasured
    config = dict(zip(CONFIGURATION, ("760m", "512", "8", "a100_80gb", "96", "2", "False")))
    same = {**config, "SeqLen (T)": "1024"}
    (tmp_path / "llm_foundry.json").write_text(json.dumps([
        {"id": "a", "raw": {**config, "Throughput (T/s/GPU)": "800"}},
        {"id": "b", "raw": {**same, "Throughput (T/s/GPU)": "500"}}]))
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"rows": [
        {**config, "Throughput (T/s/GPU)": "1000", "Precision": "bf16", "MP Mode": "PURE"},
        {**same, "Throughput (T/s/GPU)": "500", "Precision": "bf16", "MP Mode": "PURE"}]}))
    published = {"rows": [{"id": rid, "label": rid, "lofo_s": 1.0, "measured_s": 1.25, "error_lofo": -0.2}
                          for rid in ("a", "b")]}
    found = remeasured(published, tmp_path, earlier)
    (row,) = found["rows"]
    assert row["id"] == "a"
    assert row["change"] == pytest.approx(-0.2)
    assert row["error_lofo_earlier"] == pytest.approx(0.0)
    assert row["predicted_change"] == pytest.approx(0.0)
    assert found["changed_over_5pct"] == 1
    # checkpointed and re-run on torch 2.1: the earlier (bf16, torch 1.13) run is priced with the whole block
    # rerun, 1.1 s against its measured 1.25 x 800 / 1000 = 1.0 s: +10%, and a predicted change of +10%
    published["rows"][0]["lofo_full_recompute_s"] = 1.1
    (row,) = remeasured(published, tmp_path, earlier)["rows"]
    assert row["error_lofo_earlier"] == pytest.approx(0.1)
    assert row["predicted_change"] == pytest.approx(0.1)
    assert row["error_nearer_run"] == 0.0  # -20% against one run, +10% against the other: between them


def test_configurations_only_the_earlier_table_has_become_runs_of_their_stated_layout(rows: dict[str, dict]) -> None:
    """bench/validate_perf.earlier_only: the 29 A100 80GB configurations the October 2023 re-run dropped become
    MPT runs; README line 80 (30B, s 2048, 64 GPUs, micro-batch 16 x 3, global batch 3072, 876 tokens/s/GPU)
    by hand: 3072 x 2048 / (876 x 64) = 112.2 s a step, one FSDP group of 64 ranks."""
    from bench.validate_perf import earlier_only
    fit = {"MPT (llm-foundry FSDP)": {"compute": {"A100-80": 0.77}, "memory_efficiency": 0.11}}
    found = earlier_only({"fits": fit, "sharded_interference": 0.71}, DATA)
    assert len(found["rows"]) == 29
    line80 = next(r for r in found["rows"] if r["id"] == "llmfoundry-2023-05-line80")
    assert line80["measured_s"] == pytest.approx(3072 * 2048 / (876 * 64))
    assert line80["label"].startswith("MPT-30b A100-80 64g TP1 PP1 DP64 s2048 mbs16 full")
    assert 0.0 < found["median"] <= found["worst"]


def test_virtual_stage_rows_run_interleaved_with_their_stacks_settings(rows: dict[str, dict]) -> None:
    """NeMo's Llama 2 70B (TP4 PP4 VP20) and Megatron's Llama 3 70B (TP4 PP8 VP5) price interleaved 1F1B with the
    launcher's sequence parallelism and TP overlap; an uneven chunk split or a micro-batch count that is not a
    multiple of PP (Megatron's interleaved schedule raises) is refused by name."""
    llama2, llama3, small = to_run(rows["nemo-007"]), to_run(rows["megatron-039"]), to_run(rows["nemo-006"])
    assert [r.document["training"]["virtual_stages"] for r in (llama2, llama3, small)] == [20, 5, 10]
    assert llama2.tp_comm_overlap and llama2.document["training"]["sequence_parallel"]
    assert llama3.tp_comm_overlap and not small.tp_comm_overlap
    # NeMo's Llama 3 70B (TP4 PP4 CP2 VP5) ran llama/llama3_70b.yaml: sequence parallel with TP overlap
    nemo70 = to_run(rows["nemo-012"])
    assert nemo70.tp_comm_overlap and nemo70.document["training"]["sequence_parallel"]
    # GPT-3 175B: the 128-GPU row ran gpt3/175b.yaml (no TP overlap), the 512-GPU micro-batch-2 row 175b_mlperf.yaml
    # (TP overlap); both tokenize with the GPT-2 vocabulary the rows leave blank
    gpt128, gpt512 = to_run(rows["nemo-003"]), to_run(rows["nemo-004"])
    assert not gpt128.tp_comm_overlap and gpt512.tp_comm_overlap
    assert gpt128.document["workload"]["inline"]["architecture"]["vocab"] == 50257
    nemo = rows["nemo-007"]
    uneven = {**nemo, "parallel": {**nemo["parallel"], "vp": 3}}  # 80 layers over 4 x 3 chunks
    with pytest.raises(Refused, match="not a multiple of pp x vp"):
        to_run(uneven)
    odd = {**nemo, "batch": {**nemo["batch"], "global_batch": 120, "grad_accum": 30}}  # 30 micro-batches, PP4
    with pytest.raises(Refused, match="not a multiple of parallel.pp"):
        to_run(odd)


def test_b200_is_in_the_catalogue_with_its_vendor_numbers() -> None:
    """HGX / DGX B200 (devices.py): 2250 dense BF16 and 4500 dense FP8 TFLOP/s (half the data sheet's sparse
    36 / 72 PFLOPS over 8 GPUs), 180 GB at 8 TB/s (1,440 GB, 64 TB/s over 8), NVLink 5 twice NVLink 4."""
    from chameleon_opt.instance.devices import CATALOGUE
    from chameleon_opt.perf.published import CHIP, NETWORKS, PROXY_DIE, _gpu
    b200 = CATALOGUE["B200-180"]
    assert (b200.peak_tflops, b200.fp8_peak_tflops) == (36000 / 8 / 2, 72000 / 8 / 2)
    assert (b200.memory_gib, b200.memory_bandwidth_gbps) == (1440 / 8, 64000 / 8)
    assert NETWORKS["B200-180"]["intra_node_gbps"] == 2 * NETWORKS["H100-80"]["intra_node_gbps"]
    assert _gpu({"hardware": {"gpu": "NVIDIA B200 (DGX-B200)"}}) == "B200-180"
    with pytest.raises(Refused, match="not in the device catalogue"):
        _gpu({"hardware": {"gpu": "NVIDIA GB200 NVL72"}})
    assert PROXY_DIE[CHIP["B200-180"]] == "H100"


def test_nemo_b200_row_is_priced_on_its_stated_layout(rows: dict[str, dict]) -> None:
    """NeMo's LLAMA3-8B B200 8K row prints 8 GPUs beside TP1 PP1 CP1 DP2 (the table's first version printed
    2): priced on the stated layout, its 1,671 TFLOP/s back to seconds over those 2 GPUs, with TE's fused
    attention, NeMo 2.0's distributed optimizer and fp32 gradients; the same DP contradiction in a table not
    known to have printed the stated count is refused."""
    from chameleon_opt.perf.model import PerfModel
    run = to_run(rows["nemo-019"])
    assert run.gpu == "B200-180" and run.attention_kernel == "te-fused" and "2g" in run.label
    assert run.document["plan"]["layout"]["data_parallel"] == 2
    training = run.document["training"]
    assert training["fp8"]["recipe"] == "delayed" and training["grad_bytes_per_param"] == 4.0
    assert training["overlap_param_gather"] and "optimizer" not in training
    flops_per_token = 12 * 32 * 4096 ** 2 * (1 + 8 / 32 + 8192 / 4096 + 14336 / 4096 * 1.5 + 128256 / (2 * 32 * 4096))
    assert run.measured_step_s == pytest.approx(512 * 8192 * flops_per_token / (1671e12 * 2), rel=1e-6)
    instance = build_instance(run.document)
    assert PerfModel(instance).evaluate(instance.plan).iteration_time_s > 0
    elsewhere = {**rows["nemo-019"], "source": {**rows["nemo-019"]["source"], "section": "another table"}}
    with pytest.raises(Refused, match="contradicts its GPU count"):
        to_run(elsewhere)


def test_b200_takes_the_h100_fit_when_no_b200_row_is_fitted() -> None:
    """No bf16 row runs on B200, so its compute efficiency is always borrowed from H100 (PROXY_DIE)."""
    from chameleon_opt.perf.published import PublishedRun, fit_efficiencies
    h100 = [PublishedRun(f"r{i}", "s", "f", "H100-80", "", {}, 1.0, "") for i in range(2)]
    fit = fit_efficiencies(h100, {"r0": (0.4, 0.05, 0.0), "r1": (0.56, 0.03, 0.0)})  # e = 0.8, e_mem = 0.1
    assert fit.compute["B200-180"] == fit.compute["H100-80"] == pytest.approx(0.8)
    assert "B200-180" in fit.borrowed


def test_nemo_sizes_without_dimensions_take_their_launcher_configs(rows: dict[str, dict]) -> None:
    """GPT3-5B/20B and Nemotron-8B/22B (NeMo 24.07) name a size only: priced with their launcher configs'
    dimensions (Nemotron: squared-ReLU MLP, not gated; RoPE; 256k vocabulary), which the rows' own cells
    confirm (Model TFLOP/s / tokens/s = model FLOPs per token, within 0.3%); Nemotron-340B is refused by name."""
    from chameleon_opt.perf.published import _flops_2024
    for key in ("nemo-001", "nemo-002", "nemo-008", "nemo-009"):
        run, row = to_run(rows[key]), rows[key]
        a = run.document["workload"]["inline"]["architecture"]
        model = {**row["model"], "layers": a["layers"], "hidden": a["hidden"], "heads": a["heads"],
                 "ffn_hidden": a["ffn"], "vocab": a["vocab"]}
        stated = row["measured"]["tflops_per_gpu"] * 1e12 / row["measured"]["tokens_per_s_per_gpu"]
        assert _flops_2024(1, model["seq_len"], model) / model["seq_len"] == pytest.approx(stated, rel=3e-3)
        nemotron = "Nemotron" in row["model"]["name"]
        assert not a["gated_mlp"] and a["learned_positions"] is not nemotron
        assert a["vocab"] == (256000 if nemotron else 50257)
    nemotron_8b = to_run(rows["nemo-008"])
    assert nemotron_8b.tp_comm_overlap and nemotron_8b.document["training"]["sequence_parallel"]
    with pytest.raises(Refused, match="overlap_p2p_comm False"):
        to_run(rows["nemo-010"])
