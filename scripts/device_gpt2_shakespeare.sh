#!/usr/bin/env bash
# One seed pair of `lmckit reproduce gpt2-shakespeare` (the paper setting) on a GPU
# machine whose results come back through $OUT (the workplace's device tool), within one
# 10-minute call. Run from the repository root, with tinyshakespeare/ and gpt2_tokenizer/
# copied into an ignored .devdata/ folder and carried along:
#
#   bash scripts/device_gpt2_shakespeare.sh SEED
#
# Uses the machine's python3 (torch with CUDA) on this checkout's src/. Checkpoints are
# too large to come back, so $OUT gets the log, results.json, the figures and every
# stage's JSON (stages.tgz); a run cut short by the time limit still returns the stages
# it finished (the data-free ones run first). QUICK=1 runs the CPU-sized version instead
# (a dry run of the script anywhere).
set -uo pipefail
seed="${1:-0}"
out="runs/gpt2-seed${seed}"
dest="${OUT:?set OUT to the folder whose files come back}"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$dest/device.txt" 2>&1
timeout "${LIMIT:-540}" python3 -m lmckit reproduce gpt2-shakespeare \
  --data-root .devdata --out "$out" --seed "$seed" --quiet ${QUICK:+--quick} \
  > "$dest/log.txt" 2>&1
echo "exit status $?" >> "$dest/log.txt"
cp "$out"/results.json "$out"/*.png "$dest"/ 2>/dev/null
tar czf "$dest/stages.tgz" --exclude='*.safetensors' -C "$out" .
