"""The HF runtime executes each stage's memory relief (perf/relief_kinds.py) and the arithmetic stays
that of failure-free training: each mechanism checked in one process (what autograd saves, measured
with saved-tensor hooks; what the optimizer state is held in), then a 4-process run whose stages
each run another relief and whose recovery runs the relief the planner gave it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from chameleon_opt.perf.model import PerfModel  # noqa: E402
from tests.helpers import assert_failure_free, hf_reference_losses  # noqa: E402
from chameleon_opt.runtime import hf  # noqa: E402
from chameleon_opt.runtime.offload import ActivationOffload, HostAdamW  # noqa: E402
from chameleon_opt.runtime.pipelined import PipelinedController, runtime_instance  # noqa: E402

MODELS = Path(__file__).resolve().parent.parent / "models" / "hf"
ALL_RELIEFS = ["none", "selective", "full", "offload", "opt-offload"]
SDPA = torch.nn.functional.scaled_dot_product_attention  # the attention core transformers' sdpa calls


class Measured:
    """Bytes autograd saves in a forward (outside any checkpoint or offload of the stage's own),
    parameters apart, and how many of them the attention core (torch's SDPA) saved."""

    def __init__(self, parameters: list[torch.Tensor]) -> None:
        self.parameters = {p.untyped_storage().data_ptr() for p in parameters}
        self.activation_bytes = self.core_bytes = 0
        self.in_core = False
        self.saved: list[torch.Tensor] = []

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.untyped_storage().data_ptr() not in self.parameters:
            self.saved.append(tensor)
            size = tensor.numel() * tensor.element_size()
            self.activation_bytes += size
            self.core_bytes += size if self.in_core else 0
        return tensor


def nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def run_stage(family: str, mode: str, first: int, end: int, monkeypatch: pytest.MonkeyPatch
              ) -> tuple[Measured, dict[str, int], list[torch.Tensor], hf.Stage, list[torch.Tensor],
                         list[torch.Tensor]]:
    """Forward and backward of stage [first, end) under `mode` on fixed input: what was saved, how
    often each block and the attention core ran (a rerun block stops once it has recomputed what
    the backward needs: counted as it starts), the gradients, the stage, and the tensors the
    blocks and the attention core were given in the forward."""
    config = hf.load_config(MODELS / family / "config.json")
    stage = hf.Stage(hf.build_model(config, 0, torch.float64), config, first, end)
    stage.set_activation_mode(mode)
    measured = Measured(list(stage.parameters()))
    calls = {"blocks": 0, "core": 0}
    block_inputs: list[torch.Tensor] = []
    core_inputs: list[torch.Tensor] = []
    forward = [True]

    def counted_core(*args, **kwargs):
        calls["core"] += 1
        if forward[0]:
            core_inputs.extend(args[:3])
        measured.in_core = True
        try:
            return SDPA(*args, **kwargs)
        finally:
            measured.in_core = False

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counted_core)
    def given(_, args, kwargs):
        calls["blocks"] += 1
        if forward[0]:
            block_inputs.extend(t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor))

    for block in stage.blocks.values():
        block.register_forward_pre_hook(given, with_kwargs=True)
    if first == 0:
        x = hf.batch_tokens(config.vocab_size, 16, 0, 0, 2)
    else:
        x = torch.randn(2, 16, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(measured.pack, lambda t: t):
        out = stage(x)
    forward[0] = False
    (out * out).sum().backward()
    grads = [p.grad for p in stage.parameters()] + ([x.grad] if x.requires_grad else [])
    return measured, calls, grads, stage, block_inputs, core_inputs


def test_full_recomputation_keeps_only_the_block_inputs(monkeypatch):
    """Blocks 1-4 of tiny-llama: with `full` all autograd saves is what each checkpoint keeps of
    its block's inputs (the hidden states and position ids; the rotary cos and sin need no
    gradient), 66 kB instead of 1.4 MB, and every block runs twice (the backward reruns it); the
    gradients are bitwise those of keeping every activation."""
    kept, kept_calls, kept_grads, _, _, _ = run_stage("tiny-llama", "none", 1, 5, monkeypatch)
    full, full_calls, full_grads, _, inputs, _ = run_stage("tiny-llama", "full", 1, 5, monkeypatch)
    hidden = [t for t in inputs if t.dtype == torch.float64 and t.requires_grad]
    positions = [t for t in inputs if t.dtype == torch.int64]
    assert len(hidden) == len(positions) == 4
    assert {t.untyped_storage().data_ptr() for t in full.saved} == \
        {t.untyped_storage().data_ptr() for t in hidden + positions}
    assert full.activation_bytes == nbytes(hidden + positions) < kept.activation_bytes / 10
    assert kept_calls["blocks"] == 4 and full_calls["blocks"] == 8
    assert all(torch.equal(a, b) for a, b in zip(kept_grads, full_grads))


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-gpt2"])
def test_selective_recomputation_drops_exactly_the_attention_core(family, monkeypatch):
    """With `selective` nothing the attention core saved is kept, its checkpoint keeps its inputs
    Q, K and V instead, and everything else stays: the saved bytes are those of keeping every
    activation less the core's plus Q, K and V (tiny-llama: 1.42 MB - 201 kB + 131 kB); the core
    runs twice per block, the gradients are unchanged."""
    kept, kept_calls, kept_grads, _, _, _ = run_stage(family, "none", 1, 5, monkeypatch)
    chosen, chosen_calls, chosen_grads, _, _, qkv = run_stage(family, "selective", 1, 5, monkeypatch)
    assert kept.core_bytes > 0 and chosen.core_bytes == 0 and len(qkv) == 12
    assert chosen.activation_bytes == kept.activation_bytes - kept.core_bytes + nbytes(qkv)
    assert kept_calls == {"blocks": 4, "core": 4} and chosen_calls == {"blocks": 4, "core": 8}
    assert all(torch.equal(a, b) for a, b in zip(kept_grads, chosen_grads))


def test_offload_copies_every_saved_activation_to_host(monkeypatch):
    """With `offload` every activation autograd saves (the whole model's, embeddings and head
    included) is copied out, byte for byte what keeping them saves; a packed tensor is a copy (its
    own storage), a parameter is left in place; the gradients are unchanged."""
    kept, _, kept_grads, _, _, _ = run_stage("tiny-gpt2", "none", 0, 6, monkeypatch)
    moved, _, moved_grads, stage, _, _ = run_stage("tiny-gpt2", "offload", 0, 6, monkeypatch)
    assert moved.activation_bytes == 0 and stage.offload.copied_bytes == kept.activation_bytes > 0
    assert all(torch.equal(a, b) for a, b in zip(kept_grads, moved_grads))
    offload = ActivationOffload(stage.parameters())
    activation = torch.randn(3, 4)
    device, held = offload.pack(activation)
    assert held.untyped_storage().data_ptr() != activation.untyped_storage().data_ptr()
    assert torch.equal(offload.unpack((device, held)), activation)
    weight = next(stage.parameters())
    assert offload.pack(weight) == (None, weight)


def test_host_adamw_is_adamw_with_its_state_in_the_host_buffer():
    """Three steps of the host optimizer give bitwise the parameters and moments of torch's AdamW
    on the parameters themselves; its state lies in its own buffer, apart from the parameters."""
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(4, 3, generator=gen, dtype=torch.float64), torch.randn(5, generator=gen, dtype=torch.float64)]
    reference = [p.clone().requires_grad_() for p in params]
    optimizer = torch.optim.AdamW(reference, lr=3e-3, weight_decay=0.01, foreach=False)
    host = HostAdamW(params, [(torch.zeros_like(p), torch.zeros_like(p)) for p in params], 0, 3e-3, 0.01)
    for _ in range(3):
        grads = [torch.randn(p.shape, generator=gen, dtype=torch.float64) for p in params]
        for r, g in zip(reference, grads):
            r.grad = g.clone()
        optimizer.step()
        host.step(grads)
    buffer = host.buffer.untyped_storage().data_ptr()
    for i, (p, r) in enumerate(zip(params, reference)):
        assert torch.equal(p, r.detach())
        state = host.state(i)
        assert torch.equal(state["exp_avg"], optimizer.state[r]["exp_avg"])
        assert torch.equal(state["exp_avg_sq"], optimizer.state[r]["exp_avg_sq"])
        assert all(t.untyped_storage().data_ptr() == buffer for t in state.values())
        assert p.untyped_storage().data_ptr() != buffer



def with_reliefs(instance, given: list[list[str]]):
    """The instance with its plan's stages given the reliefs `given[pipeline][stage]`."""
    plan = dataclasses.replace(instance.plan, pipelines=tuple(
        dataclasses.replace(pipe, stages=tuple(dataclasses.replace(st, relief=r) for st, r in zip(pipe.stages, names)))
        for pipe, names in zip(instance.plan.pipelines, given)))
    return dataclasses.replace(instance, plan=plan)

@pytest.mark.multiprocess
def test_a_bubble_filled_rerouting_splits_the_backward_of_relieved_stages():
    """Tiny-llama PP2 x DP2 (32 MiB devices: a rerouting fits), stages running checkpointed blocks,
    a host-offloaded forward and the checkpointed attention core, three with their optimizer on
    the host; device 1 dies in step 1 and policy reroute places its work on device 3 (blocks
    checkpointed) in the bubble schedule, the backward split into B and W through each relief.
    Losses equal failure-free training (1e-5 relative; measured 2e-16), every sample once, and
    each survivor keeps its relief."""
    from chameleon_opt.runtime.controller import Failure

    config = MODELS / "tiny-llama" / "config.json"
    instance = runtime_instance(config, pipeline_parallel=2, data_parallel=2, tensor_parallel=1,
                                reliefs=ALL_RELIEFS, memory_gib=32 / 1024, reserved_gib=0.0)
    given = [["full+opt-offload", "selective+opt-offload"], ["offload+opt-offload", "full"]]
    instance = with_reliefs(instance, given)
    steps = 3
    expected = hf_reference_losses(instance, config, steps)
    report = PipelinedController(instance, config, policy="reroute").run(steps, [Failure(1, (1,), after_ops=1)])
    assert_failure_free(report, expected, steps)
    (recovery,) = report.recoveries
    assert (recovery.policy, recovery.schedule) == ("reroute", "bubble-filled")
    assert recovery.reliefs == {0: "full+opt-offload", 2: "offload+opt-offload", 3: "full"}


@pytest.mark.multiprocess
def test_stages_run_their_reliefs_and_a_recovery_runs_the_planned_one():
    """Tiny-llama PP2 x DP2 on 1.5 MiB devices (a stage needs 1.8 MiB keeping its optimizer state):
    the four stages run four activation modes, each with its optimizer offloaded; device 3 dies in
    step 1 and the planner's recovery over three devices, which fits only with a relief, runs the
    reliefs it chose. Every step's loss equals failure-free training (1e-5 relative, as
    test_runtime_hf; measured 2e-16), every sample is seen once, and each worker reports the relief
    its plan gave it."""
    config = MODELS / "tiny-llama" / "config.json"
    instance = runtime_instance(config, pipeline_parallel=2, data_parallel=2, tensor_parallel=1,
                                reliefs=ALL_RELIEFS, memory_gib=1.5 / 1024, reserved_gib=0.0)
    given = [["full+opt-offload", "selective+opt-offload"], ["offload+opt-offload", "opt-offload"]]
    instance = with_reliefs(instance, given)
    steps = 2
    expected = hf_reference_losses(instance, config, steps)
    report = PipelinedController(instance, config).run(steps, {1: (3, 2)})
    assert_failure_free(report, expected, steps)

    def planned(p):
        return {d: st.relief for pipe in p.pipelines for st in pipe.stages for d in st.devices}

    (recovery,) = report.recoveries
    assert report.reliefs[0] == planned(instance.plan) and len(set(planned(instance.plan).values())) == 4
    assert recovery.reliefs == planned(recovery.plan) == report.reliefs[1]
    model = PerfModel(dataclasses.replace(instance, plan=recovery.plan))
    without = dataclasses.replace(recovery.plan, pipelines=tuple(
        dataclasses.replace(pipe, stages=tuple(dataclasses.replace(st, relief="none") for st in pipe.stages))
        for pipe in recovery.plan.pipelines))
    failed = frozenset({3})
    assert model.evaluate(recovery.plan, failed).memory_ok and not model.evaluate(without, failed).memory_ok


def test_a_relief_the_workers_cannot_execute_is_refused_before_any_starts():
    config = MODELS / "tiny-llama" / "config.json"
    instance = runtime_instance(config, pipeline_parallel=2, data_parallel=1, tensor_parallel=1)
    pipe = instance.plan.pipelines[0]
    plan = dataclasses.replace(instance.plan, pipelines=(dataclasses.replace(
        pipe, stages=(dataclasses.replace(pipe.stages[0], relief="swap"), pipe.stages[1])),))
    with pytest.raises(ValueError, match="unknown relief 'swap'"):
        PipelinedController(dataclasses.replace(instance, plan=plan), config)
