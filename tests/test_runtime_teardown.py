"""The process-group teardown rule of chameleon_opt.runtime (its __init__ says why): with
torch.distributed.nn.functional imported before the first group, destroy_process_group joins
gloo's threads; imported after it, they outlive the group (the torch behaviour the rule avoids)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("torch")

PROBE = """
import os, sys, tempfile
import torch
import torch.distributed as dist
if sys.argv[1] == "first":
    import torch.distributed.nn.functional
torch.set_num_threads(1)
store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
model(torch.ones(2, 4)).sum().backward()
for p in model.parameters():
    dist.all_reduce(p.grad)
optimizer.step()  # imports torch._dynamo, and with it torch.distributed.nn.functional
dist.destroy_process_group()
names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
print(sum(name.startswith(("pt_gloo", "gloo")) for name in names))
"""


def gloo_threads_after_destroy(orders: list[str]) -> list[int]:
    """Per import order, the gloo threads left after destroy; the probes run side by side (each is
    mostly a torch import, so on two cores this halves the test's wall time)."""
    probes = [subprocess.Popen([sys.executable, "-c", PROBE, order], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True) for order in orders]
    counts = []
    for probe in probes:
        out, err = probe.communicate(timeout=120)
        assert probe.returncode == 0, err[-2000:]
        counts.append(int(out.split()[-1]))
    return counts


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads through /proc")
def test_importing_first_lets_destroy_join_gloo_threads() -> None:
    first, later = gloo_threads_after_destroy(["first", "later"])
    assert first == 0
    assert later > 0  # the behaviour that aborted the shrinking example


def test_runtime_and_examples_import_it_before_any_group() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for path in ["chameleon_opt/runtime/worker.py", "chameleon_opt/runtime/pipelined.py",
                 "chameleon_opt/runtime/profile.py", "examples/torchrun_train.py", "examples/torchrun_shrink.py"]:
        text = (root / path).read_text()
        assert "import torch.distributed.nn.functional" in text, path
        assert text.index("import torch.distributed.nn.functional") < text.index("init_process_group("), path
