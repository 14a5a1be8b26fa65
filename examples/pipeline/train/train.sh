#!/bin/sh
# "Train" a model on the generated numbers with learning rate $1: a stand-in for a
# training loop, fast enough for tests. The validation loss falls with the steps towards
# a floor set by how far the learning rate is from 0.1 (in decades); each step appends a
# metric line to $TACC_METRICS, which the sweep's early stopping reads.
set -eu
lr="$1"
steps=18
count=$(wc -l < inputs/generate/data/numbers.txt)
sum=0
while read -r n; do
  sum=$((sum + n))
done < inputs/generate/data/numbers.txt
step=1
while [ "$step" -le "$steps" ]; do
  loss=$(awk -v lr="$lr" -v s="$step" 'BEGIN { q = log(lr) / log(10) + 1; if (q < 0) q = -q; printf "%.4f", q + 2 / s }')
  echo "{\"step\": $step, \"val_loss\": $loss}" >> "$TACC_METRICS"
  echo "step $step val_loss $loss"
  sleep 0.1
  step=$((step + 1))
done
echo "mean=$((sum / count)) lr=$lr val_loss=$loss" > model.txt
echo "trained on $count numbers: $(cat model.txt)"
