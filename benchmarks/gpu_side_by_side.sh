#!/bin/bash
# On one lent GPU: our pipelines against the official ELF and LangFlow code at their full shapes (ELF-B, LangFlow OWT,
# L = 1024), bf16 autocast on every side, batch 4 and 32, 8 NFE: once with our noise drawn by a CPU generator, once by a
# CUDA generator. JSON + Markdown come back in $OUT (benchmarks/side_by_side.py says what is timed), and where a
# pipeline call waits for the GPU (benchmarks/host_syncs.py). GENERATORS=cuda skips the CPU-generator pass.
#
# Here, before the call: the official checkouts and einops inside the checkout, git-ignored, so that they can travel
# (they are never committed), the diffusers wheel, and the slim tree (the bundled models are not needed):
#   mkdir -p .official && cp -r /path/ELF .official/elf && cp -r /path/LangFlow .official/langflow
#   for r in elf langflow; do git -C .official/$r rev-parse HEAD > .official/$r/COMMIT; done  # .git does not travel
#   .venv/bin/pip download -q einops --no-deps -d /tmp/e && unzip -q -o /tmp/e/einops-*.whl -d .official/pydeps
#   .venv/bin/pip download -q "diffusers==$(.venv/bin/python -c 'import diffusers; print(diffusers.__version__)')" \
#       --no-deps -d .whl
#   benchmarks/device_tree.sh size .official .whl && benchmarks/device_tree.sh slim
# The device call (carry [".official", ".whl"], timeout_s 300): bash benchmarks/gpu_side_by_side.sh
# and afterwards: benchmarks/device_tree.sh restore; copy FILES_AT/side-by-side-* to benchmarks/results/.
# Dry run at a toy shape on this machine:
#   DEVICE=cpu BATCH_SIZES=1 REPEATS=1 GENERATORS=cpu EXTRA="--elf-layers 1 --langflow-layers 1 --length 32" \
#       OUT=/tmp/sbs PYTHON=.venv/bin/python bash benchmarks/gpu_side_by_side.sh
set -o pipefail
PYTHON=${PYTHON:-python3}; DEVICE=${DEVICE:-cuda}; BATCH_SIZES=${BATCH_SIZES:-4 32}; REPEATS=${REPEATS:-5}
GENERATORS=${GENERATORS:-cpu cuda}; OFFICIAL=${OFFICIAL:-.official}; OUT=${OUT:-/tmp/side-by-side}
mkdir -p "$OUT"
if ! $PYTHON -c "import diffusers" 2>/dev/null; then
  $PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 3
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/$OFFICIAL/pydeps:$PWD/src PYTHONUNBUFFERED=1
[ "$DEVICE" = cpu ] || nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
status=0
for generator in $GENERATORS; do
  # shellcheck disable=SC2086  # BATCH_SIZES and EXTRA are word lists
  $PYTHON benchmarks/side_by_side.py --elf-repo "$OFFICIAL/elf" --langflow-repo "$OFFICIAL/langflow" \
    --device "$DEVICE" --batch-sizes $BATCH_SIZES --repeats "$REPEATS" --generator-device "$generator" $EXTRA \
    --output "$OUT/side-by-side-$DEVICE-generator-$generator.json" 2>&1 | tee "$OUT/side-by-side-$generator.log" \
    | grep -v -E "^  (ELF|LangFlow)" || status=$?
done
# Where a call waits for the GPU (host reads of device values, copies), per sampler: small networks, seconds
$PYTHON benchmarks/host_syncs.py --device "$DEVICE" --output "$OUT/host-syncs-$DEVICE.json" \
  > "$OUT/host-syncs.log" 2>&1 || status=$?
tail -40 "$OUT/host-syncs.log"
ls -la "$OUT"
exit $status
