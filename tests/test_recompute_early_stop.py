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


LLAMA = {"model_type": "llama", "hidden_size": H, "intermediate_size": FFN, "num_hidden_layers": 1,
         "num_attention_heads": HEADS, "num_key_value_heads": 2, "vocab_size": 64, "max_position_embeddings": S}
GPT2 = {"model_type": "gpt2", "n_embd": H, "n_layer": 1, "n_head": HEADS, "n_positions": S, "vocab_size": 64,
        "embd_pdrop": 0.0, "attn_pdrop": 0.0}


@pytest.mark.parametrize("config, attention, stops", [
    (LLAMA, "eager", True),                        # LlamaMLP ends in down_proj, the layer in the residual add
    (LLAMA, "sdpa", True),                         # the runtime's configs: the CPU SDPA kernel is not counted
    ({**GPT2, "resid_pdrop": 0.1}, "eager", False),  # GPT2MLP's Dropout(resid_pdrop) saves a mask after c_proj
    ({**GPT2, "resid_pdrop": 0.0}, "eager", True),   # the bench and demo GPT-2 configs
])
def test_hf_runtime_block_reruns_what_its_instance_prices(config: dict, attention: str, stops: bool) -> None:
    """The HF runtime's own `full` mode (hf.Stage: transformers' block from_config under torch's
    non-reentrant checkpoint) reruns the block less its MLP output projection exactly when
    hf.checkpoint_early_stops says so, which is what runtime_instance prices."""
    pytest.importorskip("transformers")
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoConfig

    from chameleon_opt.runtime import hf
    from chameleon_opt.workload.hf import architecture_from_hf

    torch.set_num_threads(1)
    hf_config = AutoConfig.for_model(**config)
    hf_config._attn_implementation = attention
    assert hf.checkpoint_early_stops(hf_config) is stops
    stage = hf.Stage(hf.build_model(hf_config, 0, torch.float32), hf_config, 1, 2)  # block 1 alone
    x = torch.randn(B, S, H, requires_grad=True)
    flops = {}
    for mode in ("none", "full"):
        stage.set_activation_mode(mode)
        y = stage(x)
        with FlopCounterMode(display=False) as counter:
            y.sum().backward()
        flops[mode] = counter.get_total_flops()
    w = Workload(WorkloadSpec(name="block", architecture=Architecture(**{**architecture_from_hf(config), "seq_len": S})),
                 S, 1)
    unseen = w.attention_core_flops_per_sample[1] if attention == "sdpa" else 0.0
    rerun = B * (w.recomputed_flops_per_sample("full", early_stop=stops)[1] - unseen)
    assert flops["full"] - flops["none"] == rerun
    # by hand, per sample: q, k, v, o 2*S*(2*H^2 + 2*H*16) = 98,304 (Llama, 2 KV heads of 8) or
    # 2*S*4*H^2 = 131,072 (GPT-2); scores and values 4*S^2*H = 32,768; the MLP output projection
    # 2*S*FFN*H = 131,072, Llama's gate and up 262,144, GPT-2's c_fc 131,072
    whole = (98_304 + 32_768 + 262_144 + 131_072) if config is LLAMA else (131_072 + 32_768 + 2 * 131_072)
    assert w.recomputed_flops_per_sample("full")[1] == whole


def test_full_recomputation_reruns_the_blocks_not_the_head() -> None:
    """A trainer checkpoints the blocks alone (torchtitan's apply_ac over model.layers, Megatron's
    recompute over its transformer layers): the head's logits GEMM (2*S*H*V per sample) runs once."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    from torch.utils.checkpoint import checkpoint
    from torch.utils.flop_counter import FlopCounterMode
    block, head = Block(), torch.nn.Linear(H, ARCH.vocab, bias=False)
    x = torch.randn(B, S, H, requires_grad=True)

    def backward(checkpointed: bool) -> int:
        y = head(checkpoint(block, x, use_reentrant=False) if checkpointed else block(x))
        with FlopCounterMode(display=False) as counter:
            y.sum().backward()
        return counter.get_total_flops()

    rerun = backward(True) - backward(False)
    w = Workload(WorkloadSpec(name="block", architecture=ARCH), S, 1)
    recomputed = w.recomputed_flops_per_sample("full", early_stop=True)   # torch's default
    assert w.forward_flops_per_sample[-1] == 2 * S * H * ARCH.vocab == 65_536   # the head's, by hand
    assert recomputed[0] == recomputed[-1] == 0.0
    assert rerun == B * recomputed.sum() == B * (425_984 - 131_072)
