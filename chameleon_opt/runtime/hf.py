"""Hugging Face causal LMs (Llama and GPT-2 families) as pipeline stages with tensor parallelism.

A model is built from its config with random weights (`from_config`, offline), the same on every
process from one seed, then cut into workload layers (0: embeddings, 1..L: decoder blocks, L+1:
final norm + head, the numbering of `chameleon_opt.workload`). A stage keeps its layers, and with
TP > 1 its blocks are sharded by DTensor (`parallelize_module`): attention projections and the MLP's
first matrices column-wise, the output projections row-wise (Megatron's scheme); embeddings, norms
and the head stay replicated in the TP group. GPT-2's fused `c_attn` (a Conv1D) becomes a Linear
whose rows are regrouped so that each TP shard holds whole heads of q, k and v.

A tied embedding (GPT-2) and its head are separate copies in a stage; the runtime sums the
gradients of both copies (on one stage or across the first and last), so they stay equal.

A stage runs one activation mode of perf/relief_kinds.py (`Stage.set_activation_mode`): `full`
checkpoints each block (torch.utils.checkpoint, non-reentrant: only the block's input is kept and
the block is rerun in the backward), `selective` checkpoints each block's attention core (the
function transformers dispatches to with Q, K and V: its scores and the kernel's statistics are
not kept, Q, K and V are, Korthikanti et al.'s selective recomputation), `offload` copies the
forward's saved activations to host memory (runtime/offload.py). None changes the arithmetic.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from chameleon_opt.perf.relief_kinds import ACTIVATION_MODES
from chameleon_opt.runtime.offload import ActivationOffload

SELECTIVE_PREFIX = "chameleon-recompute-core-"

def load_config(path: str | Path) -> Any:
    """A transformers config from a config.json, offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoConfig

    data = json.loads(Path(path).read_text())
    implementation = data.pop("attn_implementation", "sdpa")
    config = AutoConfig.for_model(data.pop("model_type"), **data)
    config._attn_implementation = implementation
    return config


def family(config: Any) -> str:
    return "gpt2" if config.model_type == "gpt2" else "llama"


def num_blocks(config: Any) -> int:
    return config.n_layer if family(config) == "gpt2" else config.num_hidden_layers


def checkpoint_early_stops(config: Any) -> bool:
    """Whether a block checkpointed by `Stage` under `full` is rerun without its MLP output
    projection (Training.recompute_early_stop), so that the instance prices what runs. torch's
    non-reentrant checkpoint from 2.1 stops the rerun at the last tensor the forward saved; in a
    block that is the output projection's input unless a dropout with p > 0 follows it and saves a
    mask. transformers' GPT2MLP applies Dropout(resid_pdrop) after c_proj; the Llama-family MLPs
    (llama, mistral, qwen2, qwen3) return down_proj(act(gate(x)) * up(x)) and the decoder layer
    only adds the residual (modeling_*.py, transformers 4.57), so they always stop early."""
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    after_projection = float(config.resid_pdrop) if family(config) == "gpt2" else 0.0
    return (major, minor) >= (2, 1) and after_projection == 0.0


def build_model(config: Any, seed: int, dtype: torch.dtype, tp: int = 1) -> nn.Module:
    """The whole model, identical on every process for a seed (CPU init is deterministic), laid
    out for TP degree `tp` (GPT-2's fused attention projection depends on it)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if family(config) == "gpt2":
        for block in model.transformer.h:
            _linearise_gpt2(block, tp)
    return model.to(dtype).train()


def _linear_from_conv1d(conv: nn.Module, rows: torch.Tensor | None = None) -> nn.Linear:
    """transformers' Conv1D computes x @ W + b with W (in, out): a Linear with weight W^T."""
    weight = conv.weight.detach().t()
    bias = conv.bias.detach()
    if rows is not None:
        weight, bias = weight[rows], bias[rows]
    linear = nn.Linear(weight.shape[1], weight.shape[0], dtype=weight.dtype)
    with torch.no_grad():
        linear.weight.copy_(weight)
        linear.bias.copy_(bias)
    return linear


def _linearise_gpt2(block: nn.Module, tp: int) -> None:
    """Conv1D -> Linear. c_attn's rows [q | k | v] are regrouped as [q_r k_r v_r] for each TP shard
    r (the heads of shard r), so a column-wise shard holds whole heads of q, k and v and
    GPT2Attention's split by `split_size` (set per shard in `shard_stage`) still finds them; the
    identity for TP 1."""
    hidden = block.attn.c_attn.weight.shape[0]
    width = hidden // tp
    rows = torch.cat([torch.arange(part * hidden + r * width, part * hidden + (r + 1) * width)
                      for r in range(tp) for part in range(3)])
    block.attn.c_attn = _linear_from_conv1d(block.attn.c_attn, rows)
    block.attn.c_proj = _linear_from_conv1d(block.attn.c_proj)
    block.mlp.c_fc = _linear_from_conv1d(block.mlp.c_fc)
    block.mlp.c_proj = _linear_from_conv1d(block.mlp.c_proj)


class Stage(nn.Module):
    """Workload layers [first, end) of a causal LM: input ids (first stage) or hidden states in,
    hidden states or logits (last stage) out."""

    def __init__(self, model: nn.Module, config: Any, first: int, end: int) -> None:
        super().__init__()
        self.kind, self.first, self.end = family(config), first, end
        last = num_blocks(config) + 1
        self.has_embedding, self.has_head = first == 0, end == last + 1
        core = model.transformer if self.kind == "gpt2" else model.model
        blocks = core.h if self.kind == "gpt2" else core.layers
        self.blocks = nn.ModuleDict({str(i): blocks[i - 1] for i in range(max(first, 1), min(end, last))})
        if self.has_embedding:
            self.embed = core.wte if self.kind == "gpt2" else core.embed_tokens
            if self.kind == "gpt2":
                self.positions = core.wpe
        if self.has_head:
            self.norm = core.ln_f if self.kind == "gpt2" else core.norm
            head = model.lm_head  # always an own copy: a tied one gets the summed gradient
            self.head = nn.Linear(head.in_features, head.out_features, bias=False, dtype=head.weight.dtype)
            with torch.no_grad():
                self.head.weight.copy_(head.weight)
        if self.kind == "llama":
            self.rotary = core.rotary_emb
        self.activation_mode = "none"
        self.offload: ActivationOffload | None = None

    def attention_modules(self) -> list[nn.Module]:
        return [block.self_attn if self.kind == "llama" else block.attn for block in self.blocks.values()]

    def set_activation_mode(self, mode: str) -> None:
        """Run the forward under `mode` from now on (the module docstring says what each keeps).
        Call it after sharding: offload leaves the parameters (by storage) on the device."""
        if mode not in ACTIVATION_MODES:
            raise ValueError(f"unknown activation mode {mode!r}: use one of {', '.join(ACTIVATION_MODES)}")
        for attention in self.attention_modules():
            # the blocks share the model's config: each gets its own, naming its attention function
            base = attention.config._attn_implementation.removeprefix(SELECTIVE_PREFIX)
            attention.config = copy.copy(attention.config)
            attention.config._attn_implementation = selective_attention(base) if mode == "selective" else base
        self.activation_mode = mode
        self.offload = ActivationOffload(self.parameters()) if mode == "offload" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.offload is not None:
            with self.offload.hooks():
                return self._forward(x)
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.has_embedding:
            ids = x
            x = self.embed(ids)
            if self.kind == "gpt2":
                x = x + self.positions(torch.arange(ids.shape[1]))
        positions = torch.arange(x.shape[1]).unsqueeze(0)
        rotary = self.rotary(x, positions) if self.kind == "llama" else None
        for block in self.blocks.values():
            if self.activation_mode == "full":
                x = checkpoint(_run_block, block, x, rotary, positions, use_reentrant=False)
            else:
                x = _run_block(block, x, rotary, positions)
        if self.has_head:
            x = self.head(self.norm(x))
        return x

    def layer_of(self, name: str) -> int:
        """The workload layer a parameter name of this stage belongs to."""
        if name.startswith("blocks."):
            return int(name.split(".")[1])
        return 0 if name.startswith(("embed", "positions")) else self.end - 1


def _run_block(block: nn.Module, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor] | None,
               positions: torch.Tensor) -> torch.Tensor:
    out = block(x, position_embeddings=rotary, position_ids=positions) if rotary is not None else block(x)
    return out[0] if isinstance(out, tuple) else out


def selective_attention(base: str) -> str:
    """The name of an attention function that runs transformers' `base` one (sdpa, eager, ...)
    under a non-reentrant checkpoint, registered on first use: the core's inputs Q, K and V (and
    the mask) are what the backward keeps, the core is rerun from them."""
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    name = SELECTIVE_PREFIX + base
    if name not in ALL_ATTENTION_FUNCTIONS:
        def recomputed(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            core = sys.modules[type(module).__module__].eager_attention_forward if base == "eager" \
                else ALL_ATTENTION_FUNCTIONS[base]
            return checkpoint(core, module, *args, use_reentrant=False, **kwargs)

        AttentionInterface.register(name, recomputed)
    return name


def shard_stage(stage: Stage, mesh: Any) -> None:
    """Megatron-style TP over `mesh` (a 1-D DeviceMesh) for every block of the stage."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    tp = mesh.size()
    for block in stage.blocks.values():
        if stage.kind == "llama":
            plan = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
                    "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
                    "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
                    "mlp.down_proj": RowwiseParallel()}
        else:
            plan = {"attn.c_attn": ColwiseParallel(), "attn.c_proj": RowwiseParallel(),
                    "mlp.c_fc": ColwiseParallel(), "mlp.c_proj": RowwiseParallel()}
            block.attn.split_size = block.attn.embed_dim // tp
        parallelize_module(block, mesh, plan)


def sample_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-sample mean token cross-entropy, shape (samples,)."""
    return F.cross_entropy(logits.transpose(1, 2), targets, reduction="none").mean(dim=1)


def batch_tokens(vocab: int, seq_len: int, seed: int, step: int, global_batch: int) -> torch.Tensor:
    """Tokens (global_batch, seq_len + 1) of global batch `step`: a function of (seed, step) only."""
    generator = torch.Generator().manual_seed(seed * 7919 + step)
    start = torch.randint(vocab, (global_batch, 1), generator=generator)
    stride = torch.randint(1, 4, (global_batch, 1), generator=generator)
    walk = (start + stride * torch.arange(seq_len + 1)) % vocab
    noise = torch.randint(vocab, walk.shape, generator=generator)
    return torch.where(torch.rand(walk.shape, generator=generator) < 0.9, walk, noise)
