#!/usr/bin/env bash
# The device check of the performance model on one H200 (bench/device/torchtitan_probe.py over a grid
# of torchtitan-style Llama steps): one process per configuration, one JSON line each in
# $OUT/probe.jsonl, priced here afterwards by bench/h200_probe.py. Not part of the project's set-up.
set -uo pipefail
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$OUT/gpu.txt"
while read -r flavor layers ac seq batch compiled; do
  [ -z "$flavor" ] && continue
  timeout "${PROBE_TIMEOUT:-150}" python3 bench/device/torchtitan_probe.py "$flavor" "$layers" "$ac" "$seq" "$batch" $compiled \
    >> "$OUT/probe.jsonl" 2>> "$OUT/probe.err" || echo "failed: $flavor $layers $ac $seq $batch $compiled" | tee -a "$OUT/probe.err"
  tail -n 1 "$OUT/probe.jsonl"
done < "${GRID:-bench/device/probe_grid.txt}"
