#!/usr/bin/env bash
# The runtime benches on a lent machine with 16 CPU cores (one per worker): installs the carried
# wheels (.whl, cp312) into /tmp/site, then runs bench/runtime_steps_hf.py and bench/runtime_steps.py
# with their outputs in $OUT. Not part of the project's set-up: the device machine has no registry.
# The wheels (Python 3.12, x86-64): `pip download --no-deps --only-binary=:all: --python-version 3.12
# --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl` of the
# versions in this venv of pydantic, pydantic_core, annotated-types, typing-inspection, typing_extensions,
# PuLP (its other platforms' CBC binaries may be dropped from the wheel), ortools, protobuf, highspy,
# immutabledict, transformers, huggingface_hub and tokenizers.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
nproc; lscpu | grep -E "Model name|Thread|Core|Socket" ; python3 -c "import torch, transformers, ortools, pulp, highspy, pydantic; print('torch', torch.__version__, 'transformers', transformers.__version__)"
timeout "${HF_TIMEOUT:-330}" python3 bench/runtime_steps_hf.py --out "$OUT" ${HF_ARGS:-} 2>&1 | tee "$OUT/runtime_steps_hf.log"
if [ "${GPT_TIMEOUT:-120}" != 0 ]; then
  timeout "${GPT_TIMEOUT:-120}" python3 bench/runtime_steps.py --reprofile --steps 14 2>&1 | tee "$OUT/runtime_steps.log"
  cp bench/out/runtime_steps.json bench/out/runtime_steps.png "$OUT"/ 2>/dev/null
fi
true
