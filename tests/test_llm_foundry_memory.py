"""llm-foundry's MPT kernels (activations.LLM_FOUNDRY) against what MPT's block really saves, and the
memory the model gives its published benchmark runs.

The block is MPT's as llm-foundry ran it in its benchmark sweeps (llmfoundry/models/layers/gpt_blocks.py at
300cc5c58, blocks.py at b2a43a147): LayerNorm on the bf16 input (low_precision_layernorm), one Wqkv
linear chunked into Q, K and V, a flash kernel (here torch's CPU flash SDPA, which saves what the
Triton kernel saves: Q, K, V as views of Wqkv's output, the output and a float32 log-sum-exp),
out_proj, LayerNorm, a torch GELU MLP, and the residual dropouts at MPT's p = 0. Every storage
autograd saves inside the second block is summed (saved_tensors_hooks), as in test_activations_hf.py.
"""

from __future__ import annotations

import pytest

from chameleon_opt.workload.activations import LLM_FOUNDRY, MEGATRON, block_bytes_per_sample, kernels_for
from chameleon_opt.workload.model import Workload
from chameleon_opt.workload.schema import Architecture, WorkloadSpec

B, S, H, HEADS, VOCAB = 2, 64, 64, 4, 96


def mpt_block_saved_bytes() -> int:
    """Bytes of the storages autograd saves inside block 1 of two MPT-structured blocks (bf16, CPU)."""
    torch = pytest.importorskip("torch")
    functional = torch.nn.functional
    torch.set_num_threads(1)
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm_1, self.norm_2 = torch.nn.LayerNorm(H), torch.nn.LayerNorm(H)
            self.wqkv, self.out_proj = torch.nn.Linear(H, 3 * H), torch.nn.Linear(H, H)
            self.up_proj, self.down_proj = torch.nn.Linear(H, 4 * H), torch.nn.Linear(4 * H, H)
            self.resid_attn_dropout, self.resid_ffn_dropout = torch.nn.Dropout(0.0), torch.nn.Dropout(0.0)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = (t.view(B, S, HEADS, H // HEADS).transpose(1, 2)
                       for t in self.wqkv(self.norm_1(x)).chunk(3, dim=2))
            attention = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.resid_attn_dropout(self.out_proj(attention.transpose(1, 2).reshape(B, S, H)))
            return x + self.resid_ffn_dropout(self.down_proj(functional.gelu(self.up_proj(self.norm_2(x)))))

    blocks = torch.nn.ModuleList([Block(), Block()]).to(torch.bfloat16).train()
    fixed = {p.untyped_storage().data_ptr() for p in blocks.parameters()}
    state: dict[str, int | None] = {"block": None}
    saved: dict[int, dict[int, int]] = {0: {}, 1: {}}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if state["block"] is not None and storage.data_ptr() not in fixed:
            saved[state["block"]][storage.data_ptr()] = storage.nbytes()
        return tensor

    x = torch.randn(B, S, H, dtype=torch.bfloat16, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        for i, block in enumerate(blocks):
            state["block"] = i
            x = block(x)
    return sum(n for ptr, n in saved[1].items() if ptr not in saved[0])


def test_mpt_block_saves_what_the_llm_foundry_kernels_count() -> None:
    a = Architecture(layers=2, hidden=H, heads=HEADS, ffn=4 * H, vocab=VOCAB, seq_len=S)
    predicted = B * block_bytes_per_sample(a, LLM_FOUNDRY, S, 2.0, 1)
    # by hand, per token: 32 h bytes (norm inputs 2 x 2h, their outputs 2 x 2h, Q K V 6h, attention
    # output 2h, up-projection and GELU outputs 2 x 8h) plus the log-sum-exp 4 x heads
    assert predicted == B * S * (32 * H + 4 * HEADS) == 264_192
    measured = mpt_block_saved_bytes()
    # What the terms leave out: the two norms' per-token mean and rstd (measured 265,216: 0.4% more).
    assert predicted == pytest.approx(measured, rel=0.01), (predicted, measured)
    # Megatron's count has two dropout masks more (h bytes each per token)
    megatron = block_bytes_per_sample(a, MEGATRON.with_attention("flash"), S, 2.0, 1)
    assert megatron - predicted / B == S * (2 * H - 4 * HEADS)


def test_mpt_350m_head_and_embedding_by_hand() -> None:
    """MPT-350m at 2048 tokens (llm-foundry's A100-40 rows): the head holds its norm's input and output
    (4 h bytes a token) and the fused cross-entropy's bf16 logits and bf16 gradient (4 bytes a token and
    vocabulary entry), the embedding no dropout mask (emb_pdrop 0); Megatron's default counts fp32
    logits plus the bf16 ones (6) and a 1-byte mask."""
    a = Architecture(layers=24, hidden=1024, heads=16, ffn=4096, vocab=50368, seq_len=2048)
    w = Workload(WorkloadSpec(name="mpt-350m", architecture=a), 2048, 2)
    mpt = w.activation_bytes_per_sample(1, "none", "flash", kernels=kernels_for("llm-foundry", None))
    default = w.activation_bytes_per_sample(1, "none", "flash")
    assert mpt[0] == 0.0 and default[0] == 2048 * 1024
    assert mpt[-1] == 2048 * (4 * 1024 + 4 * 50368) == 421_003_264
    assert default[-1] - mpt[-1] == 2 * 2048 * 50368
    assert mpt[1] == 2048 * (32 * 1024 + 4 * 16) == 67_239_936
