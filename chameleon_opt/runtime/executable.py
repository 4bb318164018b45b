"""What the runtimes cannot execute, refused before a worker starts.

The planner prices every training setting of an instance; a runtime that silently ran something
else (plain 1F1B for an interleaved job, replicated optimizer state for a ZeRO job) would make every
step it measures a measurement of another plan. Both controllers call `refuse_unexecuted` with the
instance they are given; each refusal names the field and the setting the runtime does run.
"""

from __future__ import annotations

from chameleon_opt.errors import InputError
from chameleon_opt.instance.load import Instance


def unexecuted_settings(instance: Instance, *, relief: bool, early_stop: bool | None = None
                        ) -> list[tuple[str, str, str]]:
    """(field, what the runtime does instead, fix) for each setting it would not carry out.
    `relief`: whether the runtime executes per-stage memory relief (the HF runtime does).
    `early_stop`: whether the runtime's full recomputation stops before the MLP output projection
    (`hf.checkpoint_early_stops`); the instance must say the same wherever full recomputation
    can run, or its backward is priced one GEMM per block off."""
    training = instance.spec.training
    found: list[tuple[str, str, str]] = []
    if training.virtual_stages > 1:
        found.append(("training.virtual_stages", f"interleaved 1F1B ({training.virtual_stages} chunks per device) "
                      "is priced but the runtimes run plain 1F1B", "set virtual_stages to 1"))
    if training.zero > 0:
        found.append(("training.zero_stage", f"ZeRO stage {training.zero} is priced but the runtimes keep whole "
                      "optimizer state, gradients and parameters on every replica", "set zero_stage to 0 and "
                      "distributed_optimizer to false"))
    if training.overlap_grad_reduce:
        found.append(("training.overlap_grad_reduce", "the runtimes all-reduce gradients after the last backward, "
                      "not overlapped with it", "set overlap_grad_reduce to false"))
    if training.sequence_parallel:
        found.append(("training.sequence_parallel", "the HF runtime's tensor parallelism shards the linears only",
                      "set sequence_parallel to false"))
    if training.fp8 is not None:
        found.append(("training.fp8", "fp8 linears are priced but the runtimes compute in float32 / float64",
                      "drop training.fp8"))
    if training.context_parallel > 1:
        found.append(("training.context_parallel", "context parallelism is priced but the runtimes give every "
                      "rank whole sequences", "set context_parallel to 1"))
    if training.loss_chunks > 1:
        found.append(("training.loss_chunks", "the runtimes compute the head and loss over the whole micro-batch",
                      "set loss_chunks to 1"))
    if not relief:
        chosen = set(training.reliefs or []) - {"none"}
        staged = {s.relief for p in instance.plan.pipelines for s in p.stages} - {None, "none"}
        if training.recompute != "none" or chosen or staged:
            found.append(("training.recomputation" if training.recompute != "none" else
                          "training.reliefs" if chosen else "plan.pipelines[].stages[].relief",
                          "the tiny-GPT runtime keeps every activation (no recomputation or offload)",
                          "drop the relief, or run the Hugging Face runtime (demo --hf)"))
    if early_stop is not None and training.recompute_early_stop != early_stop and full_recompute_possible(instance):
        done = "stops before" if early_stop else "reruns"
        found.append(("training.recompute_early_stop", f"the runtime's checkpointed blocks {done} the MLP output "
                      "projection in the recompute (torch's non-reentrant checkpoint and the config's dropout after "
                      "it)", f"set recompute_early_stop to {str(early_stop).lower()}"))
    return found


def full_recompute_possible(instance: Instance) -> bool:
    """Whether some stage may run full recomputation: the training's own, a relief the planner
    may choose, or one the plan names."""
    training = instance.spec.training
    staged = {s.relief for p in instance.plan.pipelines for s in p.stages if s.relief is not None}
    chosen = set(training.reliefs or []) | staged
    return training.recompute == "full" or any("full" in name.split("+") for name in chosen)


def refuse_unexecuted(instance: Instance, *, relief: bool, early_stop: bool | None = None) -> None:
    """Raise an InputError for the first setting the runtime would not execute (`unexecuted_settings`)."""
    found = unexecuted_settings(instance, relief=relief, early_stop=early_stop)
    if found:
        raise InputError(instance.path, *found[0])
