#!/bin/sh
# Generate a tiny data set: the numbers 1..20, one per line.
set -eu
mkdir -p data
seq 1 20 > data/numbers.txt
echo "generated $(wc -l < data/numbers.txt) numbers"
