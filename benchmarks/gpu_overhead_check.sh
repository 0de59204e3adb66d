#!/bin/bash
# The GPU overhead and randomness check in one run (one GPU, ~8.5 min): overhead, device randomness, CUDA noise tests, calibration
# cost. On the lent device machine diffusers is missing: carry its wheel in .whl/ (see the device README); elsewhere
# no wheels are needed. Results land in $OUT (default: runs/gpu16). BUDGET: seconds the whole run may take (default 510).
OUT=${OUT:-runs/gpu16}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/src:$PWD PYTHONUNBUFFERED=1
T0=$(date +%s); left() { echo $(( ${BUDGET:-510} - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch; print(torch.__version__)"
echo "== overhead ($(left) s left)"
timeout 150 python3 benchmarks/overhead.py --device cuda --batch-sizes 4 32 --output $OUT/overhead-gpu.json 2>&1 | tail -25
echo "== overhead, ELF-B with a CUDA generator (device stream) ($(left) s left)"
timeout 90 python3 benchmarks/overhead.py --device cuda --models elf-b --batch-sizes 4 32 --generator-device cuda --output $OUT/overhead-gpu-cuda-stream.json 2>&1 | tail -8
echo "== randomness ($(left) s left)"
timeout 90 python3 benchmarks/gpu_randomness_check.py --output $OUT/gpu-randomness.json 2>&1 | tail -25
echo "== CUDA noise tests ($(left) s left)"
timeout 90 python3 -m pytest -q -x tests/test_noise_stream.py -p no:cacheprovider 2>&1 | tail -4
echo "== calibration, bank 256, CPU stream ($(left) s left)"
timeout 100 python3 benchmarks/calibration_cost.py elf-b-random --device cuda --dtype bfloat16 --bank-size 256 --no-progress --output $OUT/calibration-cost-bank256-cpu-stream.json 2>&1 | tail -6
echo "== calibration, bank 2048, CUDA stream ($(left) s left)"
timeout $(( $(left) - 10 )) python3 benchmarks/calibration_cost.py elf-b-random --device cuda --dtype bfloat16 --bank-size 2048 --generator-device cuda --no-progress --output $OUT/calibration-cost-bank2048-cuda-stream.json 2>&1 | tail -6
echo "== done after $(( $(date +%s) - T0 )) s"
