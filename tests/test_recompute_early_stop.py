"""Full recomputation under torch's non-reentrant checkpoint (Training.recompute_early_stop), against
what torch really reruns: a pre-norm block written in plain torch ops is checkpointed and the matmul
FLOPs of its backward are counted (torch.utils.flop_counter) with and without the early stop; the
rerun must be what Workload.recomputed_flops_per_sample gives, by hand 2/3 of the block's linears."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from chameleon_opt.workload.model import Workload  # noqa: E402
from chameleon_opt.workload.schema import Architecture, WorkloadSpec  # noqa: E402

B, S, H, HEADS, FFN = 2, 16, 32, 4, 128
ARCH = Architecture(layers=1, hidden=H, heads=HEADS, ffn=FFN, vocab=64, seq_len=S)


class Block(torch.nn.Module):
    """MPT's block (llmfoundry/models/layers/blocks.py at b2a43a147): LayerNorm, QKV, scores and softmax,
    output projection, LayerNorm, GELU MLP, no biases, the residual dropout at MPT's resid_pdrop 0 (it
    saves nothing), residual adds last."""

    def __init__(self) -> None:
        super().__init__()
        self.norm_1, self.norm_2 = torch.nn.LayerNorm(H), torch.nn.LayerNorm(H)
        self.qkv, self.out = torch.nn.Linear(H, 3 * H, bias=False), torch.nn.Linear(H, H, bias=False)
        self.up, self.down = torch.nn.Linear(H, FFN, bias=False), torch.nn.Linear(FFN, H, bias=False)
        self.resid_ffn_dropout = torch.nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.reshape(B, S, HEADS, H // HEADS).transpose(1, 2) for t in self.qkv(self.norm_1(x)).chunk(3, -1))
        attention = torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
        x = x + self.out(attention.transpose(1, 2).reshape(B, S, H))
        return x + self.resid_ffn_dropout(self.down(torch.nn.functional.gelu(self.up(self.norm_2(x)))))


def backward_flops(block: Block, x: torch.Tensor, checkpointed: bool, early_stop: bool) -> int:
    from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop
    from torch.utils.flop_counter import FlopCounterMode
    with set_checkpoint_early_stop(early_stop):
        y = checkpoint(block, x, use_reentrant=False) if checkpointed else block(x)
        with FlopCounterMode(display=False) as counter:
            y.sum().backward()
    return counter.get_total_flops()


def test_early_stop_reruns_the_block_but_its_mlp_output_projection() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    block, x = Block(), torch.randn(B, S, H, requires_grad=True)
    plain = backward_flops(block, x, checkpointed=False, early_stop=True)
    rerun_whole = backward_flops(block, x, checkpointed=True, early_stop=False) - plain
    rerun_early = backward_flops(block, x, checkpointed=True, early_stop=True) - plain
    w = Workload(WorkloadSpec(name="block", architecture=ARCH), S, 1)
    # by hand, per sample: linears 2*S*(3H^2 + H^2 + 2*H*FFN) = 393,216; scores and values 4*S^2*H = 32,768;
    # the MLP output projection 2*S*FFN*H = 131,072 is not rerun
    assert w.forward_flops_per_sample[1] == 393_216 + 32_768
    assert w.mlp_output_flops_per_sample[1] == 131_072
    assert rerun_whole == B * w.recomputed_flops_per_sample("full")[1] == B * 425_984
    assert rerun_early == B * w.recomputed_flops_per_sample("full", early_stop=True)[1] == B * (425_984 - 131_072)
    assert w.recomputed_flops_per_sample("full", early_stop=True)[0] == 0.0  # the embedding reruns nothing
