"""The thin PyTorch runtime: worker processes that execute lowered plans over torch.distributed,
and the controller that injects failures and applies the planner's recovery decisions.

The only part of chameleon_opt that imports torch; nothing here is imported by the solver or by
the CLI's start-up (import the submodules you need).

Every module here (and each example trainer) imports `torch.distributed.nn.functional` before it
forms any process group. That module binds `group.WORLD` as a default argument when it is imported,
and torch imports it lazily (the first `optimizer.step`, through `torch._dynamo`). Imported after
`init_process_group`, it keeps the world group alive past `destroy_process_group`: gloo's threads
then outlive the group and free the last collective's tensors during interpreter teardown, which
aborts the process (SIGABRT, "terminate called without an active exception"; torch 2.13, about one
run in three of the shrinking torchrun example). Imported first, it binds None and
`destroy_process_group` joins gloo's threads. tests/test_runtime_teardown.py checks both orders.
"""
