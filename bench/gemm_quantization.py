"""Does cuBLAS's tile and wave quantization explain the published rows the model prices too fast?
An experiment, not part of the model (docs/performance-model.md, "GEMM tile and wave quantization").

cuBLAS computes an M x N GEMM output as ceil(M / tm) x ceil(N / tn) tiles, spread over the SMs in
waves; a partial last wave and partial edge tiles waste tensor-core time (NVIDIA, "Matrix Multiplication
Background User's Guide", its sections on tile and wave quantization, whose example is the A100's 108 SMs
and 256 x 128 tiles: https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/).
With the tile fixed, the useful share of one GEMM is derived, not fitted:

    q = M N / (waves x SMs x tm x tn),   waves = ceil(tiles / SMs)

and a linear layer's time is its FLOPs / (peak x e_die x q). A linear with input width K, output width N
over T tokens runs three GEMMs of equal FLOPs: the forward (output T x N), the input gradient (T x K) and
the weight gradient (N x K, reduced over T), which cuBLAS splits over the reduction (split-K) when its
tiles do not fill the SMs; `split_k` prices that split, else the weight gradient is tiled like the others.

Prints: the factor against this project's H200 GEMM rates (bench/data/h200_sdpa_gemm.jsonl), the groups of
llm-foundry rows whose per-GPU GEMMs are identical (one factor) but whose held-out errors differ, and,
with --validate OUT, runs bench/validate_perf.py with the factor in the calibrated block time
(FrameworkCalibration.forward_backward, the early-stop MLP term and the fp8 GEMM terms) to OUT.
Run: python bench/gemm_quantization.py [--tiles large|guide] [--no-split-k] [--validate OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SMS = {"A100-40": 108, "A100-80": 108, "H100-80": 132, "H200-141": 132, "GH200-96": 132, "V100-32": 80}
"""Streaming multiprocessors per GPU: A100 108 (NVIDIA A100 data sheet), H100 SXM5, H200 and GH200's
Hopper die 132 (H100 data sheet), V100 SXM2 80 (V100 data sheet)."""

TILES = {
    "large": ((256, 128), (128, 256)),
    # the guide's list of cuBLAS tile shapes, most to least efficient per tile
    "guide": ((256, 128), (128, 256), (128, 128), (256, 64), (64, 256), (128, 64), (64, 128), (64, 64)),
}
MAX_SPLIT_K = 16
MIN_SPLIT_K_DEPTH = 256  # no split leaves fewer reduction steps than one 256-deep slab


def wave_share(m: int, n: int, sms: int, tiles: tuple[tuple[int, int], ...], depth: int = 0) -> float:
    """Useful share of the SMs' tile slots for an m x n output, best over `tiles`; `depth` > 0 lets
    the reduction of that depth be split (split-K), each split a tile of its own."""
    best = 0.0
    for tm, tn in tiles:
        count = math.ceil(m / tm) * math.ceil(n / tn)
        splits = 1
        while splits < MAX_SPLIT_K and depth / (splits + 1) >= MIN_SPLIT_K_DEPTH:
            splits += 1
        for split in range(1, splits + 1 if depth else 2):
            waves = math.ceil(count * split / sms)
            best = max(best, m * n * split / (waves * sms * tm * tn))
    return min(best, 1.0)


def linear_shapes(hidden: int, q_dim: int, kv_dim: int, ffn: int, gated: bool, tp: int) -> list[tuple[int, int]]:
    """(input width K, output width N) of a block's linears on one TP rank (fused QKV, attention
    output, MLP up (and gate), MLP down)."""
    up = [(hidden, ffn // tp)] * (2 if gated else 1)
    return [(hidden, (q_dim + 2 * kv_dim) // tp), (q_dim // tp, hidden), *up, (ffn // tp, hidden)]


def inflation(tokens: int, shapes: list[tuple[int, int]], sms: int, tiles: tuple[tuple[int, int], ...],
              split_k: bool) -> tuple[float, float]:
    """(forward, backward) GEMM time over its unquantized time, FLOP-weighted over `shapes`."""
    flops = np.array([k * n for k, n in shapes], dtype=float)
    forward = np.array([1.0 / wave_share(tokens, n, sms, tiles) for k, n in shapes])
    data = np.array([1.0 / wave_share(tokens, k, sms, tiles) for k, n in shapes])
    weight = np.array([1.0 / wave_share(n, k, sms, tiles, tokens if split_k else 0) for k, n in shapes])
    return float(flops @ forward / flops.sum()), float(flops @ (data + weight) / 2.0 / flops.sum())


def h200_check(tiles: tuple[tuple[int, int], ...]) -> list[dict]:
    """The factor beside the rates measured on one H200 at six Llama GEMM shapes."""
    rows = [json.loads(line) for line in (ROOT / "bench" / "data" / "h200_sdpa_gemm.jsonl").open()]
    return [{"m": r["m"], "k": r["k"], "n": r["n"], "share_of_peak": r["tflops"] / 989.0,
             "q": wave_share(r["m"], r["n"], SMS["H200-141"], tiles)} for r in rows if r.get("case") == "gemm"]


def identical_gemm_groups(published: dict, rows: list[dict]) -> list[tuple[float, tuple, list[dict]]]:
    """llm-foundry rows (TP 1) grouped by (model, die, tokens per micro-batch): one factor per group, so
    a factor cannot move a row against the others of its group. (spread of held-out error, key, rows)."""
    from chameleon_opt.perf.published import CHIP
    source = {r["id"]: r for r in rows}
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in published["rows"]:
        if r["source"] != "llm_foundry":
            continue
        row = source[r["id"]]
        tokens = row["batch"]["micro_batch"] * row["model"]["seq_len"]
        groups[(row["model"]["name"], CHIP[r["gpu"]], tokens)].append(r)
    found = []
    for key, members in groups.items():
        errors = [m["error_lofo"] for m in members]
        if len(members) > 1:
            found.append((max(errors) - min(errors), key, members))
    return sorted(found, key=lambda t: -t[0])


def patch_model(tiles: tuple[tuple[int, int], ...], split_k: bool) -> None:
    """Put the factor into the calibrated block time: the blocks' linears and the head at their own
    shapes, the attention core (a flash kernel's, or eager batched GEMMs) left as it is."""
    import chameleon_opt.perf.calibration as C
    import chameleon_opt.perf.model as M
    state = {"mbs": 1}
    memo: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

    def layer_factors(w, device: str, tp: int, mbs: int) -> tuple[np.ndarray, np.ndarray]:
        a = w.architecture
        key = (w.name, a.hidden, a.ffn, a.layers, a.vocab, w.sequence_length, device, tp, mbs)
        if key not in memo:
            f, b = np.ones(w.num_layers), np.ones(w.num_layers)
            if device in SMS:
                tokens = w.sequence_length * mbs
                f[1:-1], b[1:-1] = inflation(tokens, linear_shapes(a.hidden, a.q_dim, a.kv_dim, a.ffn, a.gated_mlp, tp),
                                             SMS[device], tiles, split_k)
                f[-1], b[-1] = inflation(tokens, [(a.hidden, a.vocab // tp)], SMS[device], tiles, split_k)
            memo[key] = (f, b)
        return memo[key]

    transfer = C.FrameworkCalibration.transfer

    def transfer_with_mbs(self, workload, device, micro_batch_size, tp, withheld=frozenset()):
        state["mbs"] = micro_batch_size
        return transfer(self, workload, device, micro_batch_size, tp, withheld)

    def forward_backward(self, workload, device, tp):
        fit = self.devices.get(device)
        if fit is None:
            return None
        flops, traffic = self.layer_work(workload, tp)
        rate = fit.peak_tflops * 1e12
        core = 3.0 * workload.attention_core_flops_per_sample / tp
        linear, attention_f, attention_b = flops - core, np.zeros_like(flops), np.zeros_like(flops)
        utilisation = self.flash_utilisation(device, workload.sequence_length)
        if utilisation:
            attention_f, attention_b = C.flash_attention_seconds(core / 3.0, rate * utilisation)
            core = np.zeros_like(flops)
        f, b = layer_factors(workload, device, tp, state["mbs"])
        gemm, memory = rate * fit.compute_efficiency, fit.memory_bandwidth_gbps * 1e9 * self.memory_efficiency
        eager = self.elementwise_forward_s(workload, device, tp)
        forward = (linear * f + core) / 3.0 / gemm + traffic / 3.0 / memory + attention_f + eager
        backward = (linear * b + core) * 2.0 / 3.0 / gemm + traffic * 2.0 / 3.0 / memory + attention_b
        return forward, backward + eager * C.ELEMENTWISE_BACKWARD_RATIO

    mlp_output = M.PerfModel._mlp_output_s

    def mlp_output_s(self, device, tp, fwd, from_flops):
        found = mlp_output(self, device, tp, fwd, from_flops)
        if from_flops and self.workload.architecture is not None:
            found = found * layer_factors(self.workload, device.name, tp, self.micro_batch_size)[0]
        return found

    def fp8_terms(price):
        def priced(workload, tp, mbs, peak, fp8_peak, efficiency, *rest):
            device = {312: "A100-80", 989: "H100-80"}.get(round(peak))   # the die, by its bf16 peak
            if device is not None and workload.architecture is not None:
                f, b = layer_factors(workload, device, tp, mbs)
                efficiency = efficiency / ((f + 2.0 * b) / 3.0)
            return price(workload, tp, mbs, peak, fp8_peak, efficiency, *rest)
        return priced

    C.FrameworkCalibration.transfer = transfer_with_mbs
    C.FrameworkCalibration.forward_backward = forward_backward
    M.PerfModel._mlp_output_s = mlp_output_s
    M.fp8_block_seconds = fp8_terms(M.fp8_block_seconds)
    M.torchao_block_seconds = fp8_terms(M.torchao_block_seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiles", choices=sorted(TILES), default="large")
    parser.add_argument("--no-split-k", action="store_true", help="tile the weight gradients like the others")
    parser.add_argument("--published", type=Path, default=None,
                        help="a validate_perf_published.json to group rows by (default: none, groups skipped)")
    parser.add_argument("--published-dir", type=Path, default=ROOT.parent / "shared" / "data" / "published")
    parser.add_argument("--validate", type=Path, default=None, help="run validate_perf with the factor, to this folder")
    args = parser.parse_args()
    tiles = TILES[args.tiles]
    print("H200 GEMMs (bench/data/h200_sdpa_gemm.jsonl): measured share of 989 TFLOP/s against the factor q")
    for r in h200_check(tiles):
        print(f"  {r['m']:>6} x {r['k']:>6} x {r['n']:>7}: measured {r['share_of_peak']:.3f}, q {r['q']:.3f}")
    if args.published is not None:
        rows = json.loads((args.published_dir / "llm_foundry.json").read_text())
        groups = identical_gemm_groups(json.loads(args.published.read_text()), rows)
        print(f"llm-foundry groups with identical per-GPU GEMMs: {len(groups)}, "
              f"{sum(1 for g in groups if g[0] > 0.10)} with held-out errors more than 10 points apart")
        for spread, key, members in groups[:6]:
            cells = ", ".join(f"{m['label'].split(' ', 2)[2]} {m['error_lofo']:+.1%}" for m in members)
            print(f"  {key[0]} {key[1]} {key[2]} tokens: {spread:.1%} apart: {cells}")
    if args.validate is not None:
        patch_model(tiles, not args.no_split_k)
        import runpy
        sys.argv = [str(ROOT / "bench" / "validate_perf.py"), "--out", str(args.validate)]
        runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
