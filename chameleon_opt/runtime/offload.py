"""Host offload as a GPU run does it, for the reliefs of perf/relief_kinds.py.

`ActivationOffload` (relief `offload`): saved-tensor hooks that copy every activation autograd
saves in the forward to a host tensor (pinned when CUDA is there, the copy non-blocking) and bring
it back to its device for the backward, as `torch.autograd.graph.save_on_cpu` does. Ours copies on
CPU too: `save_on_cpu` returns a CPU tensor itself (`tensor.cpu()` is no copy), which would leave
the original alive; here the forward's own tensor is always released and the backward reads the copy.
Parameters are not activations (they stay on the device for the next micro-batch): left in place.

`HostAdamW` (relief `+opt-offload`, ZeRO-Offload): the master parameters, both moments and the
gradients live in one host buffer; a step copies the gradients to it, runs torch's AdamW there and
copies the updated parameters back to the device. Element for element the same arithmetic as AdamW
on the device, so the losses do not change.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch


def _host_pinned() -> bool:
    """Page-locked host memory makes device<->host copies asynchronous; it needs CUDA."""
    return torch.cuda.is_available()


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (what holds its memory), any other tensor itself."""
    from torch.distributed.tensor import DTensor

    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


class ActivationOffload:
    """Saved-tensor hooks moving a stage's activations to host memory and back (see the module
    docstring). `copied_bytes` counts what went out, so a run can show the relief ran."""

    def __init__(self, parameters: Iterable[torch.Tensor]) -> None:
        self.parameter_storages = {_plain(p).untyped_storage().data_ptr() for p in parameters}
        self.copied_bytes = 0

    def pack(self, tensor: torch.Tensor) -> tuple[torch.device | None, torch.Tensor]:
        local = _plain(tensor)
        if local.device.type == "meta" or local.untyped_storage().data_ptr() in self.parameter_storages:
            return None, tensor
        if local is tensor:
            host = torch.empty(tensor.size(), dtype=tensor.dtype, layout=tensor.layout, pin_memory=_host_pinned())
            host.copy_(tensor, non_blocking=_host_pinned())
        else:  # a DTensor: its local shard copied, the placement kept
            host = tensor.to("cpu", copy=True)
        self.copied_bytes += local.numel() * local.element_size()
        return tensor.device, host

    def unpack(self, packed: tuple[torch.device | None, torch.Tensor]) -> torch.Tensor:
        device, held = packed
        if device is None or device.type == "cpu":
            return held
        return held.to(device, non_blocking=True)

    def hooks(self) -> AbstractContextManager[Any]:
        """The context to run the stage's forward in."""
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


class HostAdamW:
    """torch's AdamW on a host copy of the parameters (see the module docstring). `state(i)`: the
    i-th parameter's master copy and moments, views of `buffer`."""

    PARTS = 4  # master parameters, first moments, second moments, gradients

    def __init__(self, params: Sequence[torch.Tensor], moments: Sequence[tuple[torch.Tensor, torch.Tensor]],
                 steps_done: int, lr: float, weight_decay: float) -> None:
        dtypes = {p.dtype for p in params}
        if len(dtypes) != 1:
            raise ValueError(f"one dtype per stage expected for the host optimizer, got {sorted(map(str, dtypes))}")
        self.params = list(params)
        sizes = [p.numel() for p in self.params]
        total = sum(sizes)
        self.buffer = torch.empty(self.PARTS * total, dtype=dtypes.pop(), pin_memory=_host_pinned())
        parts = [list(torch.split(chunk, sizes)) for chunk in torch.split(self.buffer, total)]
        self.masters, self.exp_avg, self.exp_avg_sq, grads = (
            [view.view(p.shape) for view, p in zip(part, self.params)] for part in parts)
        self.optimizer = torch.optim.AdamW(self.masters, lr=lr, weight_decay=weight_decay, foreach=False)
        for i, (master, param, grad) in enumerate(zip(self.masters, self.params, grads)):
            master.copy_(param.detach())
            self.exp_avg[i].copy_(moments[i][0])
            self.exp_avg_sq[i].copy_(moments[i][1])
            master.grad = grad
            self.optimizer.state[master] = {"step": torch.tensor(float(steps_done)), "exp_avg": self.exp_avg[i],
                                            "exp_avg_sq": self.exp_avg_sq[i]}

    def state(self, i: int) -> dict[str, torch.Tensor]:
        return {"param": self.masters[i], "exp_avg": self.exp_avg[i], "exp_avg_sq": self.exp_avg_sq[i]}

    @torch.no_grad()
    def step(self, grads: Sequence[torch.Tensor]) -> None:
        """Gradients device -> host, the update on the host, parameters host -> device."""
        for master, grad in zip(self.masters, grads):
            master.grad.copy_(grad, non_blocking=_host_pinned())
        if self.params and self.params[0].is_cuda:
            torch.cuda.current_stream(self.params[0].device).synchronize()  # the gradients have landed
        self.optimizer.step()
        for param, master in zip(self.params, self.masters):
            param.copy_(master, non_blocking=_host_pinned())
