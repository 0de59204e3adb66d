#!/bin/bash
# On one lent GPU: LangFlow-v2 and ELF-v2 trained side by side on the v2 corpus (the two small networks
# leave one GPU mostly idle), each exported as a bf16 pipeline folder with its run's log and config, and returned
# as xz-compressed tar pieces of at most 15 MiB (the device returns at most 8 files, 64 MiB together).
#
# Here, before the call (docs/training.md, "Training the v2 models on a lent GPU"):
#   .venv/bin/untied-sc data build --out data/corpus-v2 --tokenizer-out data/tokenizer-v2-8k --sources v2
#   .venv/bin/python benchmarks/pack_v2_inputs.py --check        # .v2-inputs/: corpus, tokenizer, float16 MiniLM
#   benchmarks/device_tree.sh size .v2-inputs .whl && benchmarks/device_tree.sh slim
# The device call (carry [".v2-inputs", ".whl"], timeout_s 600):
#   bash benchmarks/gpu_train_v2.sh
# and straight afterwards, here:
#   benchmarks/device_tree.sh restore
#   mkdir -p runs && for m in langflow-v2 elf-v2; do cat FILES_AT/$m.tar.xz.part* | tar -xJ -C runs; done
# If the pieces did not all fit, the output names those left: `MODE=fetch bash benchmarks/gpu_train_v2.sh`
# returns them while the machine is still warm.
#
# Settings (defaults = the v2 recipe): DEVICE, BUDGET_MIN (training minutes per model, both at once), MODELS,
# LF_ARGS / ELF_ARGS (extra trainer arguments, appended: later ones win), PACK (the carried folder), WORK, PYTHON.
PACK=${PACK:-.v2-inputs}; WORK=${WORK:-/tmp/gpu-v2}; PYTHON=${PYTHON:-python3}; MODE=${MODE:-train}
DEVICE=${DEVICE:-cuda}; BUDGET_MIN=${BUDGET_MIN:-5.5}; MODELS=${MODELS:-langflow-v2 elf-v2}
PIECE=$((15 * 1048576)); RETURN_MAX=$((62 * 1048576)); RETURN_FILES=7  # the script's log is the 8th file
OUT=${OUT:-$WORK/returned}; mkdir -p "$OUT"

give_back_pieces() {  # move pieces from $WORK/pieces to $OUT while they fit the device's return limits
  local total=0 count=0 size
  for piece in "$WORK"/pieces/*; do
    [ -f "$piece" ] || continue
    size=$(stat -c %s "$piece")
    if [ $((total + size)) -gt $RETURN_MAX ] || [ $count -ge $RETURN_FILES ]; then
      echo "LEFT ON THE MACHINE (run MODE=fetch now): $(basename "$piece")"; continue
    fi
    mv "$piece" "$OUT/"; total=$((total + size)); count=$((count + 1))
  done
  ls -la "$OUT"
}
if [ "$MODE" = fetch ]; then give_back_pieces; exit 0; fi
# xz where the machine has it (threads), else Python's lzma (the image is not ours to inspect beforehand)
unxz_to() {
  if command -v xz >/dev/null; then xz -dc "$1" > "$2"
  else $PYTHON -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" "$1" "$2"; fi
}
tar_xz() {  # tar_xz DIR NAME OUT: DIR/NAME as OUT
  if command -v xz >/dev/null; then tar -C "$1" -cf - "$2" | xz -T0 -6 > "$3"
  else $PYTHON -c "import sys, tarfile; t = tarfile.open(sys.argv[3], 'w:xz'); t.add(sys.argv[1] + '/' + sys.argv[2], sys.argv[2]); t.close()" "$@"; fi
}

run_all() {
T0=$(date +%s)
if ! $PYTHON -c "import diffusers" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  $PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 3
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/src PYTHONUNBUFFERED=1
[ "$DEVICE" = cpu ] || nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
$PYTHON -c "import torch, transformers, diffusers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'diffusers', diffusers.__version__)"
rm -rf "$WORK/runs" "$WORK/corpus" "$WORK/pieces" "$WORK/tokens"; mkdir -p "$WORK/runs" "$WORK/corpus" "$WORK/pieces"
for split in train validation heldout; do unxz_to "$PACK/corpus/$split.txt.xz" "$WORK/corpus/$split.txt" || return 4; done

# The recipes (docs/training.md and docs/training-elf.md say why; LangFlow's SC probability 0.75: the second GPU
# run). Both fix their step count from the first timed steps so that the cosine schedule ends with the budget; a
# retrain passes the count they settled on as --max-steps.
COMMON=(--device "$DEVICE" --corpus-dir "$WORK/corpus" --budget-minutes "$BUDGET_MIN" --batch-size 256
        --warmup-steps 500 --no-progress)
train() {
  local model=$1
  case $model in
    langflow-v2)
      $PYTHON -m untied_sc_lab.training.langflow train --run-dir "$WORK/runs/$model" "${COMMON[@]}" \
        --tokenizer-dir "$PACK/tokenizer-8k" --token-cache-dir "$WORK/tokens" \
        --hidden-size 384 --num-layers 6 --num-attention-heads 6 --lr 1e-3 --sc-prob 0.75 $LF_ARGS ;;
    elf-v2)
      $PYTHON -m untied_sc_lab.training.elf train --run-dir "$WORK/runs/$model" "${COMMON[@]}" \
        --encoder-dir "$PACK/minilm-fp16" --latent-cache-dir none \
        --hidden-size 256 --num-layers 7 --num-attention-heads 4 --bottleneck-dim 256 --p-mean -0.5 --p-std 1.0 \
        --lr 1.5e-3 $ELF_ARGS ;;
    *) echo "unknown model $model"; return 2 ;;
  esac
}
echo "== training $MODELS side by side, $BUDGET_MIN min each ($(( $(date +%s) - T0 )) s in)"
pids=()
if [ "$DEVICE" != cpu ]; then  # the trainers' CUDA tests, beside the runs (tiny); their result is printed at the end
  timeout 300 $PYTHON -m pytest -q -p no:cacheprovider tests/test_training_elf.py -k cuda > "$WORK/cuda-tests.log" 2>&1 &
fi
for model in $MODELS; do
  mkdir -p "$WORK/runs/$model"
  train "$model" > "$WORK/runs/$model/train.log" 2>&1 &
  pids+=($!)
done
wait "${pids[@]}"
[ -f "$WORK/cuda-tests.log" ] && { echo "-- CUDA tests:"; tail -3 "$WORK/cuda-tests.log"; }
for model in $MODELS; do echo "-- $model"; tail -4 "$WORK/runs/$model/train.log"; tail -1 "$WORK/runs/$model/loss_log.jsonl"; done

echo "== export and pack ($(( $(date +%s) - T0 )) s in)"
for model in $MODELS; do
  run="$WORK/runs/$model"; family=${model%%-*}
  [ -f "$run/checkpoint.pt" ] || { echo "$model: no checkpoint, nothing to export"; continue; }
  $PYTHON -m untied_sc_lab.training.$family export --run-dir "$run" --out "$WORK/export/$model/pipeline" --dtype bfloat16 \
    > "$run/export.log" 2>&1 || { echo "$model: export failed"; tail -5 "$run/export.log"; continue; }
  for file in config.json loss_log.jsonl train.log export.log latent_normalization.json; do
    [ -f "$run/$file" ] && cp "$run/$file" "$WORK/export/$model/"
  done
  tar_xz "$WORK/export" "$model" "$WORK/$model.tar.xz" || { echo "$model: packing failed"; continue; }
  split -b $PIECE -d -a 1 "$WORK/$model.tar.xz" "$WORK/pieces/$model.tar.xz.part"
  echo "$model: $(stat -c %s "$WORK/$model.tar.xz") bytes packed"
done
give_back_pieces
echo "== done after $(( $(date +%s) - T0 )) s"
}
run_all 2>&1 | tee "$OUT/train-v2.log"
