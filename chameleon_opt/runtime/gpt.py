"""A small GPT whose layers are separate modules, indexed like a workload's layers.

Layer 0 is the embedding (tokens + learned positions), layers 1..L the transformer blocks,
layer L+1 the final norm and the (untied) head: the numbering of `chameleon_opt.workload` and of
the lowering's module names. Every layer is initialised from its own seed (`seed`, layer), so a
layer has the same initial weights wherever a plan puts it: the failure-free run and every
recovered run start from identical parameters. No dropout: a step is a deterministic function of
the parameters and the batch, which is what makes losses comparable across plans.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class GPTConfig:
    """Dimensions of the runtime's model (small enough for CPU processes)."""

    layers: int = 4
    hidden: int = 64
    heads: int = 4
    vocab: int = 256
    seq_len: int = 32

    @property
    def num_layers(self) -> int:
        """Workload layers: embedding + blocks + head."""
        return self.layers + 2

    def architecture(self) -> dict[str, object]:
        """The `architecture` object of a `models/` workload file for this model."""
        return {"layers": self.layers, "hidden": self.hidden, "heads": self.heads, "ffn": 4 * self.hidden,
                "vocab": self.vocab, "seq_len": self.seq_len, "tied_embeddings": False}


class Embedding(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.positions = nn.Embedding(cfg.seq_len, cfg.hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.tokens(tokens) + self.positions(positions)


class Block(nn.Module):
    """Pre-norm causal self-attention and MLP."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.norm1 = nn.LayerNorm(cfg.hidden)
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden)
        self.norm2 = nn.LayerNorm(cfg.hidden)
        self.up = nn.Linear(cfg.hidden, 4 * cfg.hidden)
        self.down = nn.Linear(4 * cfg.hidden, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, h))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Head(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(cfg.hidden)
        self.out = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


def build_layer(cfg: GPTConfig, layer: int, seed: int, dtype: torch.dtype = torch.float32) -> nn.Module:
    """Layer `layer` with weights drawn from its own generator: placement-independent."""
    torch.manual_seed(seed * 1009 + layer)
    module = Embedding(cfg) if layer == 0 else Head(cfg) if layer == cfg.num_layers - 1 else Block(cfg)
    return module.to(dtype)


def state_elements(cfg: GPTConfig, layer: int) -> int:
    """Elements of a layer's migrated state: its parameters and both AdamW moments."""
    return 3 * sum(p.numel() for p in build_layer(cfg, layer, 0).parameters())


def sample_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-sample mean token cross-entropy, shape (samples,): summed and divided by the global
    batch, it gives every sample the same weight whichever micro-batch or piece carries it."""
    per_token = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    return per_token.mean(dim=1)


def batch_tokens(cfg: GPTConfig, seed: int, step: int, global_batch: int) -> torch.Tensor:
    """Tokens (global_batch, seq_len + 1) of global batch `step`: a function of (seed, step) only,
    so every worker derives any sample it is given without a data loader."""
    generator = torch.Generator().manual_seed(seed * 7919 + step)
    # a learnable pattern (each token predicts the next in a noisy modular walk), so losses fall
    start = torch.randint(cfg.vocab, (global_batch, 1), generator=generator)
    stride = torch.randint(1, 4, (global_batch, 1), generator=generator)
    walk = (start + stride * torch.arange(cfg.seq_len + 1)) % cfg.vocab
    noise = torch.randint(cfg.vocab, walk.shape, generator=generator)
    keep = torch.rand(walk.shape, generator=generator) < 0.9
    return torch.where(keep, walk, noise)
