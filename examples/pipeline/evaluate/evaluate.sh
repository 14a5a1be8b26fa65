#!/bin/sh
# Evaluate the model of the sweep's best trial (under inputs/train/); inputs are read-only.
set -eu
model=$(cat inputs/train/model.txt)
echo "evaluated $model on $(wc -l < inputs/generate/data/numbers.txt) numbers" > report.txt
if echo tampered >> inputs/train/model.txt 2>/dev/null; then
  echo "inputs/train/model.txt is writable" >&2
fi
cat report.txt
