"""fp8 linear layers (perf/fp8.py): a hand-worked block, the per-step weight cast, and refusal on a device
without fp8 tensor cores."""

from __future__ import annotations

import copy

import pytest

from chameleon_opt.errors import InputError
from chameleon_opt.instance.load import build_instance
from chameleon_opt.perf.fp8 import FP8_GEMM_RATIO
from chameleon_opt.perf.model import PerfModel

TOY = {
    "format": 1, "name": "fp8-hand",
    "cluster": {"nodes": 1, "devices_per_node": 1,
                "device_type": {"name": "toy", "memory_gib": 80, "peak_tflops": 100, "fp8_peak_tflops": 200,
                                "efficiency": 0.5, "memory_bandwidth_gbps": 1000},
                "network": {"intra_node_gbps": 100, "inter_node_gbps": 10}},
    "workload": {"inline": {"name": "toy", "architecture": {
        "layers": 2, "hidden": 1024, "heads": 8, "ffn": 4096, "vocab": 1000, "seq_len": 512}}},
    "training": {"global_batch": 1, "micro_batch_size": 1, "fp8": {"recipe": "delayed"}},
    "plan": {"tensor_parallel": 1, "layout": {"pipeline_parallel": 1, "data_parallel": 1}},
}


def _block_times(document: dict) -> tuple[float, float, float]:
    """(forward, backward, optimizer step) of the first transformer block (layer 1) on the one device."""
    instance = build_instance(document, "<toy>")
    model = PerfModel(instance)
    forward, backward, _, _ = model.stage_times((0,), 1, 2)
    return forward, backward, model.optimizer_time((0,), 1, 2)


def _bf16(document: dict) -> dict:
    plain = copy.deepcopy(document)
    del plain["training"]["fp8"]
    return plain


def test_a_block_by_hand_gemms_at_the_fp8_peak_plus_the_casts() -> None:
    """h 1024, f 4096, s 512, no gate, TP 1. Linear FLOPs per sample: 2 s (4 h^2 + 2 h f) = 12,884,901,888.
    bf16: / (100 TFLOP/s x 0.5); fp8: / (200 TFLOP/s x 0.5 x ratio): half the time at equal efficiency.
    Casts at 4 bytes an element over 1000 GB/s x 0.85: forward inputs h + q + h + f = 7168 per token and the
    weights' 12,582,912 elements (cast every micro-batch by default); backward output gradients
    (q + 2 kv) + h + f + h = 9216 per token."""
    flops = 2 * 512 * (4 * 1024 ** 2 + 2 * 1024 * 4096)
    assert flops == 12_884_901_888
    bf16 = flops / (100e12 * 0.5)
    fp8 = flops / (200e12 * 0.5 * FP8_GEMM_RATIO)
    stream = 1000e9 * 0.85
    cast_forward = (7168 * 512 + 12_582_912) * 4 / stream
    cast_backward = 9216 * 512 * 4 / stream
    f8, b8, _ = _block_times(TOY)
    f16, b16, _ = _block_times(_bf16(TOY))
    assert f8 - f16 == pytest.approx(fp8 - bf16 + cast_forward, rel=1e-9)
    assert b8 - b16 == pytest.approx(2 * (fp8 - bf16) + cast_backward, rel=1e-9)
    # At ratio 1 the GEMMs alone would take exactly half: fp8 - bf16 = -bf16 / 2.
    assert flops / (200e12 * 0.5) == pytest.approx(bf16 / 2)


def test_weights_cast_once_per_step_move_to_the_step_and_cost_their_copies() -> None:
    """weight_cast per_step: the weights' cast leaves the forward for the optimizer step, and the fp8 weight
    and its transpose (2 bytes a linear parameter) stay in memory."""
    per_step = copy.deepcopy(TOY)
    per_step["training"]["fp8"]["weight_cast"] = "per_step"
    f_mb, _, opt_mb = _block_times(TOY)
    f_st, _, opt_st = _block_times(per_step)
    weights = 12_582_912 * 4 / (1000e9 * 0.85)
    assert f_mb - f_st == pytest.approx(weights, rel=1e-9)
    assert opt_st - opt_mb == pytest.approx(weights, rel=1e-9)
    memory = {}
    for name, document in (("per_micro_batch", TOY), ("per_step", per_step)):
        instance = build_instance(document, "<toy>")
        memory[name] = PerfModel(instance).stage_memory_breakdown((0,), 1, 2, 0, 1, 1).parameters
    assert memory["per_step"] - memory["per_micro_batch"] == pytest.approx(2 * 12_582_912)


def test_fp8_on_a_device_without_an_fp8_peak_is_refused() -> None:
    no_fp8 = copy.deepcopy(TOY)
    del no_fp8["cluster"]["device_type"]["fp8_peak_tflops"]
    instance = build_instance(no_fp8, "<toy>")
    with pytest.raises(InputError) as refused:
        PerfModel(instance).evaluate(instance.plan)
    assert refused.value.field == "training.fp8" and "no fp8 peak" in refused.value.problem


def test_unknown_recipes_and_cached_torchao_weights_are_refused_by_the_schema() -> None:
    """torchao's tensorwise scaling is priced (tests/test_torchtitan_float8.py); rowwise (a shape-dependent
    GEMM rate, measured 14-28% slower than priced) and blockwise are not, and torchao casts its weights on
    every forward."""
    for recipe in ("rowwise", "blockwise"):
        unknown = copy.deepcopy(TOY)
        unknown["training"]["fp8"]["recipe"] = recipe
        with pytest.raises(InputError) as refused:
            build_instance(unknown, "<toy>")
        assert refused.value.field == "training.fp8.recipe" and "tensorwise" in refused.value.fix
    cached = copy.deepcopy(TOY)
    cached["training"]["fp8"] = {"recipe": "tensorwise", "weight_cast": "per_step"}
    with pytest.raises(Exception, match="per_step"):
        build_instance(cached, "<toy>")


def test_a_calibrated_stack_prices_the_same_change_at_its_fitted_efficiency_and_ratio() -> None:
    """Times from a framework calibration (the published runs' path): the GEMM change at the fitted
    efficiency 0.6 and the calibration's own fp8 ratio 0.8, the casts as before."""
    from chameleon_opt.perf.calibration import DeviceFit, FrameworkCalibration
    calibration = FrameworkCalibration("toy", "flash", 0.1, {"toy": DeviceFit(100, 1000, 0.6, ())}, fp8_ratio=0.8)
    flops = 12_884_901_888
    stream = 1000e9 * 0.85
    change = flops / (200e12 * 0.6 * 0.8) - flops / (100e12 * 0.6) + (7168 * 512 + 12_582_912) * 4 / stream
    times = {}
    for name, document in (("fp8", TOY), ("bf16", _bf16(TOY))):
        instance = build_instance(document, "<toy>")
        times[name] = PerfModel(instance, calibration=calibration).stage_times((0,), 1, 2)[0]
    assert times["fp8"] - times["bf16"] == pytest.approx(change, rel=1e-9)
