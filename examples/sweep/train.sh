#!/bin/sh
# A stand-in for a training loop, fast enough for tests: the validation loss falls with
# the steps towards a floor set by how far the learning rate is from 0.1 (in decades).
# Each step appends a metric line to $TACC_METRICS, as a real training loop would.
set -eu
lr="$1"
steps="${2:-18}"
mkdir -p out
step=1
while [ "$step" -le "$steps" ]; do
  loss=$(awk -v lr="$lr" -v s="$step" 'BEGIN { q = log(lr) / log(10) + 1; if (q < 0) q = -q; printf "%.4f", q + 2 / s }')
  echo "{\"step\": $step, \"val_loss\": $loss}" >> "$TACC_METRICS"
  echo "step $step val_loss $loss"
  sleep 0.1
  step=$((step + 1))
done
echo "lr=$lr val_loss=$loss" > out/model.txt
