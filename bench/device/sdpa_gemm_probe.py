"""Measure, on one GPU, the two rates the performance model prices a Llama block's time with: the
GEMMs' (bf16, the block's own shapes) and the causal attention core's under each SDPA backend that
runs (forward and forward + backward, FLOPs counted as the model counts what the kernel executes:
the causal half of 4 s^2 d per head, backward 2.5x the forward). Prints one JSON line per case.
Run: python bench/device/sdpa_gemm_probe.py"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def timed(fn, repeats: int = 10) -> float:
    """Median seconds of fn over `repeats` runs after 3 warm-ups, by CUDA events."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def gemm_cases() -> None:
    for tokens, k, n in ((8192, 4096, 14336), (8192, 14336, 4096), (8192, 4096, 4096), (8192, 8192, 28672),
                         (8192, 4096, 128256), (32768, 4096, 14336)):
        a = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        seconds = timed(lambda: a @ b)
        print(json.dumps({"case": "gemm", "m": tokens, "k": k, "n": n, "s": seconds,
                          "tflops": 2 * tokens * k * n / seconds / 1e12}), flush=True)


def attention_cases() -> None:
    for seq in (4096, 8192, 16384, 32768):
        heads, dim = 32, 128
        q, k, v = (torch.randn(1, heads, seq, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        grad = torch.randn(1, heads, seq, dim, device="cuda", dtype=torch.bfloat16)
        executed = 0.5 * 4 * seq * seq * dim * heads
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("efficient", SDPBackend.EFFICIENT_ATTENTION), ("default", None)):
            try:
                def forward():
                    with sdpa_kernel(backend) if backend is not None else torch.autocast("cuda", enabled=False):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

                def both():
                    forward().backward(grad)
                fwd, fwd_bwd = timed(lambda: forward()), timed(both)
            except RuntimeError as err:
                print(json.dumps({"case": "sdpa", "backend": name, "seq": seq, "error": str(err)[:120]}), flush=True)
                continue
            print(json.dumps({"case": "sdpa", "backend": name, "seq": seq, "fwd_s": fwd, "fwd_bwd_s": fwd_bwd,
                              "fwd_tflops": executed / fwd / 1e12,
                              "bwd_tflops": 2.5 * executed / (fwd_bwd - fwd) / 1e12,
                              "fwd_bwd_tflops": 3.5 * executed / fwd_bwd / 1e12}), flush=True)


if __name__ == "__main__":
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}), flush=True)
    gemm_cases()
    attention_cases()
