"""torchtitan's float8 (torchao Float8Linear): the importer's accepted and refused settings, and the
casts perf/fp8.py counts for a hand-worked block."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from chameleon_opt.errors import InputError
from chameleon_opt.instance.load import build_instance
from chameleon_opt.interop.common import ClusterOptions
from chameleon_opt.interop.torchtitan import import_torchtitan
from chameleon_opt.perf.fp8 import FP8_GEMM_RATIO, linear_params
from chameleon_opt.perf.model import PerfModel
from tests.test_fp8 import TOY as FP8_TOY

LLAMA8_FLOAT8 = """
[model]
name = "llama3"
flavor = "8B"
[training]
local_batch_size = 2
seq_len = 8192
[parallelism]
data_parallel_shard_degree = -1
[activation_checkpoint]
mode = "selective"
selective_ac_option = "op"
[compile]
enable = true
[float8]
enable_float8_linear = true
"""


def _import(tmp_path: Path, text: str) -> dict:
    path = tmp_path / "job.toml"
    path.write_text(text)
    return import_torchtitan(path, ClusterOptions(world_size=8), [])


def test_float8_jobs_are_imported_with_their_recipe(tmp_path):
    """2024's switch (tensorwise, output in bf16), 2025's converter with its recipe named, and the fp8
    all-gather with precomputed scales under FSDP."""
    assert _import(tmp_path, LLAMA8_FLOAT8)["training"]["fp8"] == {"recipe": "tensorwise", "fp8_all_gather": False}
    converter = LLAMA8_FLOAT8.replace("flavor = \"8B\"", "flavor = \"8B\"\nconverters = [\"float8\"]").replace(
        "enable_float8_linear = true", "recipe_name = \"tensorwise\"\nfilter_fqns = [\"output\"]")
    assert _import(tmp_path, converter)["training"]["fp8"] == {"recipe": "tensorwise", "fp8_all_gather": False}
    gathered = LLAMA8_FLOAT8 + "enable_fsdp_float8_all_gather = true\nprecompute_float8_dynamic_scale_for_fsdp = true\n"
    assert _import(tmp_path, gathered)["training"]["fp8"] == {"recipe": "tensorwise", "fp8_all_gather": True}
    v022 = LLAMA8_FLOAT8.replace("flavor = \"8B\"", "flavor = \"8B\"\nconverters = [\"quantize.linear.float8\"]")
    v022 = v022.replace("[float8]\nenable_float8_linear = true", "[quantize.linear.float8]\n"
                        "enable_fsdp_float8_all_gather = true\nprecompute_float8_dynamic_scale_for_fsdp = true\n"
                        "filter_fqns = [\"output\"]")
    assert _import(tmp_path, v022)["training"]["fp8"] == {"recipe": "tensorwise", "fp8_all_gather": True}
    assert "fp8" not in _import(tmp_path, LLAMA8_FLOAT8.replace("enable_float8_linear = true", ""))["training"]


@pytest.mark.parametrize("edit, key", [
    (("enable_float8_linear = true", "enable_float8_linear = true\nrecipe_name = \"rowwise\""), "float8.recipe_name"),
    (("enable_float8_linear = true", "enable_float8_linear = true\nrecipe_name = \"rowwise_with_gw_hp\""),
     "float8.recipe_name"),
    (("enable_float8_linear = true", "enable_float8_linear = true\nrecipe_name = \"blockwise\""),
     "float8.recipe_name"),
    (("enable_float8_linear = true", "enable_float8_linear = true\nscaling_type_input = \"delayed\""),
     "float8.scaling_type_input"),
    (("enable_float8_linear = true", "enable_float8_linear = true\nemulate = true"), "float8.emulate"),
    (("enable_float8_linear = true", "enable_float8_linear = true\nfilter_fqns = [\"attention.wq\"]"),
     "float8.filter_fqns"),  # the output layer in float8
    (("enable_float8_linear = true", "enable_float8_linear = true\nfilter_fqns = [\"output\", \"wq\"]"),
     "float8.filter_fqns"),  # a block linear kept in bf16
    (("enable_float8_linear = true", "enable_float8_linear = true\nenable_fsdp_float8_all_gather = true"),
     "float8.precompute_float8_dynamic_scale_for_fsdp"),
    (("enable_float8_linear = true", "enable_float8_linear = true\nrecipe_name = \"tensorwise\"\n"
      "enable_fsdp_float8_all_gather = true\nprecompute_float8_dynamic_scale_for_fsdp = true"),
     "float8.enable_fsdp_float8_all_gather"),  # torchtitan refuses the fp8 all-gather with a recipe name
    (("enable_float8_linear = true", "enable_float8_linear = true\nenable_magic = true"), "float8.enable_magic"),
    (("enable = true", "enable = false"), "compile.enable"),
    # the converters' default filter is empty: the output layer would run in float8
    (("flavor = \"8B\"\n", "flavor = \"8B\"\nconverters = [\"float8\"]\n"), None),
    (("flavor = \"8B\"", "flavor = \"8B\"\nconverters = [\"float8\", \"mx\"]"), "model.converters"),
    (("[float8]", "[mx]\nenable_mx_linear = true\n[float8]"), "mx.enable_mx_linear"),
])
def test_float8_settings_not_modelled_are_refused_by_name(tmp_path, edit, key):
    text = LLAMA8_FLOAT8.replace(*edit)
    if key is None:  # the converter without the 2024 switch and without a filter
        text, key = text.replace("enable_float8_linear = true", ""), "float8.filter_fqns"
    with pytest.raises(InputError) as err:
        _import(tmp_path, text)
    assert err.value.field == key


@pytest.mark.parametrize("converter", [False, True])
def test_the_rowwise_recipe_is_refused_with_its_measured_reason(tmp_path, converter):
    """rowwise's row-scaled GEMM runs at a shape-dependent rate the model does not have: priced like
    tensorwise, torchtitan's 4 published TP rows came out 14-28% fast, so the job is refused, never priced."""
    text = LLAMA8_FLOAT8.replace("enable_float8_linear = true",
                                 "enable_float8_linear = true\nrecipe_name = \"rowwise\"")
    if converter:
        text = text.replace("flavor = \"8B\"", "flavor = \"8B\"\nconverters = [\"quantize.linear.float8\"]").replace(
            "[float8]\nenable_float8_linear = true", "[quantize.linear.float8]\nfilter_fqns = [\"output\"]")
    with pytest.raises(InputError) as err:
        _import(tmp_path, text)
    assert err.value.field == ("quantize.linear.float8" if converter else "float8") + ".recipe_name"
    assert "shape" in err.value.problem and "14-28%" in err.value.problem
    assert "tensorwise" in err.value.fix and "bf16" in err.value.fix


TOY = {**FP8_TOY, "name": "torchao-hand",
       "training": {**FP8_TOY["training"], "fp8": {"recipe": "tensorwise"}}}
"""test_fp8's hand-worked one-device toy, under torchao's tensorwise recipe."""


def _block(document: dict) -> tuple[float, float]:
    forward, backward, _, _ = PerfModel(build_instance(document, "<toy>")).stage_times((0,), 1, 2)
    return forward, backward


def test_the_casts_of_a_block_by_hand():
    """h 1024, f 4096 (no gate), s 512, TP 1: the linears' FLOPs 12,884,901,888 per sample go from the bf16
    rate (100 TFLOP/s x 0.5) to the fp8 one (200 x 0.5 x FP8_GEMM_RATIO). Cast elements per token: inputs
    h (wq, wk, wv share it) + q (wo) + h (w1) + f (w2) = 7168; output gradients q + 2 kv + f + h + h = 9216;
    weights 12,582,912; streamed at 1000 GB/s x 0.85. Bytes per element (forward, backward), torchao's
    roofline with the compiled blocks' fusions: weight (5, 3), inputs (4, 0), gradients (0, 4)."""
    weight, inputs, gradients = (5, 3), (4, 0), (0, 4)
    flops = 2 * 512 * (4 * 1024 ** 2 + 2 * 1024 * 4096)
    gemm = flops / (200e12 * 0.5 * FP8_GEMM_RATIO) - flops / (100e12 * 0.5)
    stream = 1000e9 * 0.85
    elements = np.array([7168 * 512, 9216 * 512, 12_582_912])
    cast = [elements @ np.array([inputs[k], gradients[k], weight[k]]) / stream for k in (0, 1)]
    toy = copy.deepcopy(TOY)
    plain = copy.deepcopy(TOY)
    del plain["training"]["fp8"]
    (f8, b8), (f16, b16) = _block(toy), _block(plain)
    assert f8 - f16 == pytest.approx(gemm + cast[0], rel=1e-9)
    assert b8 - b16 == pytest.approx(2 * gemm + cast[1], rel=1e-9)


def test_the_fp8_all_gather_moves_the_linear_weights_in_one_byte():
    """ZeRO-3 with fp8_all_gather: a block gathers its linear weights at 1 byte, its norms at 2; the
    backward's weight cast is only the gathered weight's column-major copy (2 bytes an element)."""
    doc = copy.deepcopy(TOY)
    doc["training"].update(zero_stage=3, fp8={"recipe": "tensorwise", "fp8_all_gather": True})
    model = PerfModel(build_instance(doc, "<toy>"))
    params, linear = model.workload.params, linear_params(model.workload)
    assert np.allclose(model.gathered_bytes, 2 * params - linear)
    assert model.gathered_bytes[1] == pytest.approx(linear[1] + 2 * (params[1] - linear[1]))
    with pytest.raises(InputError, match="tensorwise"):
        build_instance({**doc, "training": {**doc["training"], "fp8": {"recipe": "delayed", "fp8_all_gather": True}}})


def test_float8_tp_casts_the_sequence_shard_before_the_all_gather():
    """TP 2, sequence parallel: tensorwise (torchao's float8 TP) casts the attention and MLP inputs on their
    h / 2 shard and the row-parallel outputs' gradients before the backward all-gather (h / 2). Inputs
    h/2 + q/2 + h/2 + f/2, gradients (q + 2 kv)/2 + f/2 + 2 h/2; TP 1 casts h."""
    from chameleon_opt.perf.fp8 import torchao_cast_elements

    workload = PerfModel(build_instance(TOY, "<toy>")).workload
    assert torchao_cast_elements(workload, 2) == (512 + 512 + 512 + 2048, 1536 + 2048 + 1024)
    assert torchao_cast_elements(workload, 1) == (1024 + 1024 + 1024 + 4096, 3072 + 4096 + 2048)
