"""Measure a torchtitan-style Llama step on one GPU: its time and its allocated and reserved peaks
(FSDP2 over one rank, bf16 compute / fp32 master and reduce, fused AdamW, torchtitan's per-op
selective or full checkpointing, blocks optionally under torch.compile as torchtitan compiles them,
fp32 cross-entropy on the logits), to check the performance model's time and memory terms on a GPU it
was not fitted on. Llama 3 8B or 70B widths with few blocks so one GPU holds them.
Run: python bench/device/torchtitan_probe.py FLAVOR LAYERS AC TOKENS_PER_SEQ BATCH [compile]
(FLAVOR 8B or 70B, AC none | op | full). Prints one JSON line: the median of TIMED steps after
WARM_UP, timed with CUDA synchronisation, and the peaks over all steps."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections import defaultdict

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

FLAVORS = {"8B": (4096, 8, 32, 14336), "70B": (8192, 8, 64, 28672)}
"""torchtitan's llama3 flavours: (dim, n_kv_heads, n_heads, FFN hidden after ffn_dim_multiplier)."""
H, KV_HEADS, HEADS, FFN = FLAVORS[sys.argv[1] if len(sys.argv) > 1 else "8B"]
VOCAB = 128256
WARM_UP, TIMED = 3, 8


class RMSNorm(nn.Module):
    """torchtitan's 2024 `rmsnorm`: normalised in fp32, cast back, scaled."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        return (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6)).type_as(x) * self.weight


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        d = H // HEADS
        self.wq, self.wk = nn.Linear(H, H, bias=False), nn.Linear(H, KV_HEADS * d, bias=False)
        self.wv, self.wo = nn.Linear(H, KV_HEADS * d, bias=False), nn.Linear(H, H, bias=False)
        self.w1, self.w3 = nn.Linear(H, FFN, bias=False), nn.Linear(H, FFN, bias=False)
        self.w2 = nn.Linear(FFN, H, bias=False)
        self.n1, self.n2 = RMSNorm(H), RMSNorm(H)

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        d = H // HEADS
        y = self.n1(x)
        q, k, v = self.wq(y), self.wk(y), self.wv(y)
        q, k, v = q.view(b, s, HEADS, d), k.view(b, s, KV_HEADS, d), v.view(b, s, KV_HEADS, d)
        qc = torch.view_as_complex(q.float().reshape(b, s, HEADS, -1, 2))
        kc = torch.view_as_complex(k.float().reshape(b, s, KV_HEADS, -1, 2))
        q = torch.view_as_real(qc * freqs).flatten(3).type_as(v)
        k = torch.view_as_real(kc * freqs).flatten(3).type_as(v)
        rep = HEADS // KV_HEADS
        k = k[:, :, :, None, :].expand(b, s, KV_HEADS, rep, d).reshape(b, s, HEADS, d)
        v = v[:, :, :, None, :].expand(b, s, KV_HEADS, rep, d).reshape(b, s, HEADS, d)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.wo(o.transpose(1, 2).reshape(b, s, H))
        y = self.n2(x)
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


SAVE = {torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_flash_attention.default,
        torch.ops.aten._scaled_dot_product_efficient_attention.default}


def op_sac_context():
    counts = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        key = "recompute" if ctx.is_recompute else "forward"
        if func == torch.ops.aten.mm.default:
            counts[key] += 1
        keep = func in SAVE and not (func == torch.ops.aten.mm.default and counts[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE
    return create_selective_checkpoint_contexts(policy)


class Model(nn.Module):
    def __init__(self, layers: int, ac: str, seq: int, compiled: bool) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, H)
        self.layers = nn.ModuleList()
        for _ in range(layers):
            block = Block()
            if ac == "full":
                block = checkpoint_wrapper(block, preserve_rng_state=False)
            elif ac == "op":
                block = checkpoint_wrapper(block, context_fn=op_sac_context, preserve_rng_state=False)
            if compiled:   # torchtitan's order: checkpointing, then compile each block whole, then FSDP
                block.compile(fullgraph=True)
            self.layers.append(block)
        self.norm, self.out = RMSNorm(H), nn.Linear(H, VOCAB, bias=False)
        d = H // HEADS
        inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2).float() / d))
        angles = torch.outer(torch.arange(seq).float(), inv)
        self.register_buffer("freqs", torch.polar(torch.ones_like(angles), angles)[None, :, None, :], persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens)
        for block in self.layers:
            x = block(x, self.freqs)
        return self.out(self.norm(x))


def backend_context():
    """SDPA's backend as PROBE_SDPA names it (flash, cudnn or efficient), else torch's own choice; the
    backward runs the backend the forward chose."""
    from contextlib import nullcontext
    from torch.nn.attention import SDPBackend, sdpa_kernel
    chosen = os.environ.get("PROBE_SDPA", "")
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    return sdpa_kernel(backends[chosen]) if chosen else nullcontext()


def main() -> None:
    flavor, layers, ac, seq, batch = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    compiled = sys.argv[6:7] == ["compile"]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    with torch.device("meta"):
        model = Model(layers, ac, seq, compiled)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.layers:
        fully_shard(block, mp_policy=mp, reshard_after_forward=True)
    fully_shard(model, mp_policy=mp, reshard_after_forward=True)
    model.to_empty(device="cuda")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
        d = H // HEADS
        inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2, device="cuda").float() / d))
        angles = torch.outer(torch.arange(seq, device="cuda").float(), inv)
        model.freqs = torch.polar(torch.ones_like(angles), angles)[None, :, None, :]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    params = sum(p.numel() for p in model.parameters())
    seconds = []
    for step in range(WARM_UP + TIMED):
        torch.cuda.synchronize()
        start = time.perf_counter()
        tokens = torch.randint(0, VOCAB, (batch, seq), device="cuda")
        labels = torch.randint(0, VOCAB, (batch, seq), device="cuda")
        with backend_context():   # the backward too: a checkpointed block reruns its SDPA there
            pred = model(tokens)
            loss = F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
            del pred
            loss.backward()
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    stats = torch.cuda.memory_stats()
    timed = seconds[WARM_UP:]
    print(json.dumps({"flavor": flavor, "layers": layers, "ac": ac, "seq": seq, "batch": batch, "compile": compiled,
                      "params": params, "step_s": statistics.median(timed), "step_s_min": min(timed),
                      "step_s_max": max(timed), "gpu": torch.cuda.get_device_name(),
                      "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "torch": torch.__version__,
                      "sdpa": os.environ.get("PROBE_SDPA", "default"),
                      "max_allocated_gib": stats["allocated_bytes.all.peak"] / 2**30,
                      "max_active_gib": stats["active_bytes.all.peak"] / 2**30,
                      "max_reserved_gib": stats["reserved_bytes.all.peak"] / 2**30}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
