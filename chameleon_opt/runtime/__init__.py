"""The thin PyTorch runtime: worker processes that execute lowered plans over torch.distributed,
and the controller that injects failures and applies the planner's recovery decisions.

The only part of chameleon_opt that imports torch; nothing here is imported by the solver or by
the CLI's start-up (import the submodules you need).
"""
