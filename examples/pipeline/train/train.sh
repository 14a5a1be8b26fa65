#!/bin/sh
# "Train" a model: the mean of the generated numbers.
set -eu
sum=0
count=0
while read -r n; do
  sum=$((sum + n))
  count=$((count + 1))
done < inputs/generate/data/numbers.txt
echo "mean=$((sum / count))" > model.txt
echo "trained on $count numbers: $(cat model.txt)"
