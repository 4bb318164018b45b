"""Built-in device types, so instances can name a device instead of describing it.

Peak: dense bf16/fp16 tensor-core TFLOP/s from the vendors' data sheets. Efficiency: the sustained
fraction of peak a large transformer layer reaches. A100's 0.66 is calibrated on Megatron-LM's
published GPT-3 175B runs (bench/validate_perf.py); the others are assumptions of the same order
until a measurement calibrates them, and an instance may override any field.
fp8 peak: dense FP8 tensor-core TFLOP/s, NVIDIA H100 SXM5 and H200 data sheets (3958 with 2:4 sparsity,
1979 dense: twice bf16); GH200's Hopper die the same. Ampere, Volta and Turing have no fp8 tensor cores.
B200-180: the HGX / DGX B200 part (1000 W). NVIDIA's HGX B200 specification (nvidia.com/en-us/data-center/hgx,
8 GPUs: FP8 72 PFLOPS, FP16/BF16 36 PFLOPS, both "with sparsity") gives 4500 dense FP8 and 2250 dense BF16
TFLOP/s a GPU; the DGX B200 data sheet (nvidia.com/en-us/data-center/dgx-b200: 8 GPUs, 1,440 GB HBM3e,
64 TB/s HBM3e bandwidth, 14.4 TB/s aggregate NVLink) 180 GB and 8000 GB/s a GPU and fifth-generation
NVLink at 1.8 TB/s a GPU (900 GB/s each way; the published rows' network, perf/published.NETWORKS).
Its efficiency, like the Hopper parts', is assumed until a fit (perf/published.PROXY_DIE) supplies one.
"""

from __future__ import annotations

from chameleon_opt.instance.schema import DeviceType

CATALOGUE: dict[str, DeviceType] = {d.name: d for d in [
    DeviceType(name="A100-40", memory_gib=40, peak_tflops=312, efficiency=0.66, memory_bandwidth_gbps=1555),
    DeviceType(name="A100-80", memory_gib=80, peak_tflops=312, efficiency=0.66, memory_bandwidth_gbps=2039),
    DeviceType(name="H100-80", memory_gib=80, peak_tflops=989, fp8_peak_tflops=1979, efficiency=0.45, memory_bandwidth_gbps=3350),
    DeviceType(name="H200-141", memory_gib=141, peak_tflops=989, fp8_peak_tflops=1979, efficiency=0.45, memory_bandwidth_gbps=4800),
    DeviceType(name="B200-180", memory_gib=180, peak_tflops=2250, fp8_peak_tflops=4500, efficiency=0.45, memory_bandwidth_gbps=8000),
    DeviceType(name="GH-96", memory_gib=96, peak_tflops=989, fp8_peak_tflops=1979, efficiency=0.45, memory_bandwidth_gbps=4000),
    DeviceType(name="V100-16", memory_gib=16, peak_tflops=125, efficiency=0.45, memory_bandwidth_gbps=900),
    DeviceType(name="V100-32", memory_gib=32, peak_tflops=125, efficiency=0.45, memory_bandwidth_gbps=900),
    DeviceType(name="RTX-3090", memory_gib=24, peak_tflops=71, efficiency=0.5, memory_bandwidth_gbps=936),
    DeviceType(name="RTX-2080", memory_gib=8, peak_tflops=40, efficiency=0.5, memory_bandwidth_gbps=448),
    DeviceType(name="Titan-RTX", memory_gib=24, peak_tflops=130, efficiency=0.45, memory_bandwidth_gbps=672),
    # The paper's worked example: times come from the profile, memory is what the example needs.
    DeviceType(name="example", memory_gib=1, peak_tflops=1, efficiency=1.0, reserved_gib=0),
]}
