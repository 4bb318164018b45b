"""The runtimes refuse, before any worker starts, a training setting the planner would price but
they would not carry out (interleaving, ZeRO, overlapped reduction, ...): one line naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from chameleon_opt.cli import app  # noqa: E402
from chameleon_opt.errors import InputError  # noqa: E402
from chameleon_opt.instance.load import build_instance  # noqa: E402
from chameleon_opt.runtime.controller import Controller  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TINY = json.loads((ROOT / "instances" / "runtime-cpu-4.json").read_text())


def _with(**training: object) -> dict:
    data = json.loads(json.dumps(TINY))
    data["training"].update(training)
    return data


@pytest.mark.parametrize("setting, field", [
    ({"virtual_stages": 2}, "training.virtual_stages"),
    ({"zero_stage": 1}, "training.zero_stage"),
    ({"distributed_optimizer": True}, "training.zero_stage"),
    ({"overlap_grad_reduce": True}, "training.overlap_grad_reduce"),
    ({"loss_chunks": 4}, "training.loss_chunks"),
    ({"fp8": {"recipe": "delayed"}}, "training.fp8"),
    ({"recomputation": "full"}, "training.recomputation"),
    ({"reliefs": ["none", "offload"]}, "training.reliefs"),
])
def test_tiny_runtime_refuses_what_it_would_not_run(setting, field):
    with pytest.raises(InputError) as error:
        Controller(build_instance(_with(**setting), "job.json"))
    assert error.value.field == field and error.value.file == "job.json"


def test_tiny_runtime_accepts_its_own_instance():
    Controller(build_instance(TINY, "runtime-cpu-4.json"))  # nothing started before run()


def test_demo_refusal_is_one_line_and_exit_2(tmp_path):
    job = tmp_path / "interleaved.json"
    job.write_text(json.dumps(_with(virtual_stages=2)))
    result = CliRunner().invoke(app, ["demo", str(job), "--steps", "5", "--kill", "1@2", "--no-compare"])
    assert result.exit_code == 2
    assert "training.virtual_stages" in result.output and "Traceback" not in result.output


def test_hf_runtime_refuses_zero_before_starting_workers():
    pytest.importorskip("transformers")
    from chameleon_opt.runtime.pipelined import PipelinedController, runtime_instance

    config = ROOT / "models" / "hf" / "tiny-llama" / "config.json"
    instance = runtime_instance(config, pipeline_parallel=2, data_parallel=2, tensor_parallel=1)
    data = instance.spec.model_dump(mode="json", exclude_none=True)
    data["training"]["zero_stage"] = 1
    with pytest.raises(InputError) as error:
        PipelinedController(build_instance(data), config)
    assert error.value.field == "training.zero_stage"


def test_hf_runtime_prices_and_checks_its_checkpoints_early_stop():
    """runtime_instance prices full recomputation as the workers' torch checkpoint reruns a block
    (tests/test_recompute_early_stop.py counts it); an instance that says otherwise is refused
    wherever full recomputation can run, and left alone where none can."""
    pytest.importorskip("transformers")
    from chameleon_opt.runtime.pipelined import PipelinedController, runtime_instance

    config = ROOT / "models" / "hf" / "tiny-gpt2" / "config.json"   # resid_pdrop 0: it stops early
    instance = runtime_instance(config, pipeline_parallel=2, data_parallel=1, tensor_parallel=1, recompute="full")
    assert instance.spec.training.recompute_early_stop is True
    PipelinedController(instance, config)  # nothing started before run()
    data = instance.spec.model_dump(mode="json", exclude_none=True)
    data["training"]["recompute_early_stop"] = False
    with pytest.raises(InputError) as error:
        PipelinedController(build_instance(data), config)
    assert error.value.field == "training.recompute_early_stop" and "set recompute_early_stop to true" in error.value.fix
    data["training"]["recomputation"] = "none"
    data["training"]["reliefs"] = ["none", "full", "opt-offload"]   # one the planner may give a stage
    with pytest.raises(InputError) as error:
        PipelinedController(build_instance(data), config)
    assert error.value.field == "training.recompute_early_stop"
    del data["training"]["reliefs"]
    PipelinedController(build_instance(data), config)  # no full recomputation anywhere: nothing to price
