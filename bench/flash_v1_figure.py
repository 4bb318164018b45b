"""FlashAttention v1 per sequence length on A100, from the FlashAttention-2 paper's figure, as an experiment.

The model prices a FlashAttention v1 core on A100 at one share of peak for every length
(perf/published.py FLASH_V1_A100, the FlashAttention-2 abstract's 25-40% middle). The FlashAttention-2
paper (Dao 2023, arXiv 2307.08691) Figure 4, "Attention forward + backward speed (A100 80GB SXM4)",
labels every bar with its TFLOP/s (the flash-attention README shows it as
assets/flash2_a100_fwd_bwd_benchmark.png): causal panels (c) head dim 64 and (d) head dim 128, sequence
512 to 16k at 16k tokens per batch, hidden 2048. Its FLOP count is the model's: 4 s^2 d per head
forward, halved under the causal mask, the backward 2.5 times the forward (the paper's section 4.1;
benchmarks/benchmark_flash_attention.py flops()), so a bar over the A100's 312 TFLOP/s is the share
calibration.flash_attention_seconds takes.

Two sets of bars: "FlashAttention" (v1, CUDA) and "FlashAttention Triton", which is OpenAI's
triton.ops.flash_attention (the benchmark script's import), not flash-attn's flash_attn_triton.py that
MPT runs (llm-foundry's attn_impl triton); that file's docstring says its forward + backward is
"slightly slower than CUDA forward + backward". With --validate OUT, runs bench/validate_perf.py with
the chosen bars in place of the constant for the flash-v1 A100 rows (llm-foundry's MPT and
Megatron-DeepSpeed's flash rows), each row reading the head dimension nearest its own in log2.
Tested, not adopted: docs/performance-model.md, "FlashAttention v1 per sequence length".

Run: python bench/flash_v1_figure.py [--bars cuda|triton] [--validate OUT]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

A100_PEAK_TFLOPS = 312.0
FIGURE_4_CAUSAL_TFLOPS = {
    "cuda": {64: ((512, 58), (1024, 70), (2048, 77), (4096, 87), (8192, 92), (16384, 97)),
             128: ((512, 55), (1024, 62), (2048, 69), (4096, 76), (8192, 80), (16384, 83))},
    "triton": {64: ((512, 59), (1024, 75), (2048, 79), (4096, 76), (8192, 79), (16384, 80)),
               128: ((512, 50), (1024, 61), (2048, 68), (4096, 74), (8192, 78), (16384, 80))},
}
"""The bar labels of Figure 4 (c) (head dim 64) and (d) (head dim 128), causal, TFLOP/s per sequence length."""


def shares(bars: str) -> dict[int, tuple[tuple[int, float], ...]]:
    """Per head dimension, (sequence, share of the A100's peak): calibration.utilisation_at's table."""
    return {d: tuple((s, t / A100_PEAK_TFLOPS) for s, t in points)
            for d, points in FIGURE_4_CAUSAL_TFLOPS[bars].items()}


def nearest_head_dim(tables: dict[int, Any], head_dim: float) -> int:
    """The measured head dimension nearest `head_dim` in log2 (a d 80 row reads d 64's bars)."""
    return min(tables, key=lambda d: abs(math.log2(d / head_dim)))


def patch(bars: str) -> None:
    """Price the flash-v1 A100 rows at the figure's bars for their head dimension."""
    from chameleon_opt.perf import published as P
    tables = shares(bars)
    original = P.attention_utilisation

    def by_length(run: Any) -> dict[str, Any]:
        if run.attention_kernel != "flash-v1" or run.gpu not in ("A100-40", "A100-80"):
            return original(run)
        architecture = run.document["workload"]["inline"]["architecture"]
        return {run.gpu: tables[nearest_head_dim(tables, architecture["hidden"] / architecture["heads"])]}

    P.attention_utilisation = by_length


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bars", choices=sorted(FIGURE_4_CAUSAL_TFLOPS), default="cuda")
    parser.add_argument("--validate", type=Path, default=None, help="run validate_perf with the bars, to this folder")
    args = parser.parse_args()
    for d, table in shares(args.bars).items():
        print(f"{args.bars} d{d}: " + ", ".join(f"s{s} {u:.3f}" for s, u in table))
    if args.validate is not None:
        import runpy
        patch(args.bars)
        sys.argv = [str(ROOT / "bench" / "validate_perf.py"), "--out", str(args.validate)]
        runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
