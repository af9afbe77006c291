#!/bin/bash
# The committed DSpark drafter in Q8_0 (as committed) against its copy with the
# matrices in Q4_1 (tandem quantize, the Markov input table kept), on the dev
# prompts: 3 rounds per setting, temperature 0, 2 threads, 128 tokens; the
# two files alternate setting by setting.
# Usage: docs/bench/draft-q4_1/ab.sh [OUT_DIR]
set -u
out=${1:-docs/bench/draft-q4_1}
ds=models/support/smollm2-135m-instruct-dspark.gguf
q4=/tmp/dspark-q4_1.gguf
dev=../shared/bench/prompts-dev.jsonl
target/release/tandem quantize $ds $q4 --type q4_1 --keep markov_w1 2> $out/quantize.log
run() { local name=$1; shift
  target/release/tandem bench --prompts $dev -n 128 --threads 2 --spec-stats --rounds 3 --out-dir /tmp/draftq/$name "$@" > $out/$name.log 2>&1
  echo "$name: $(grep -E '^rounds:' $out/$name.log) | $(grep -o 'mean committed/cycle.*' $out/$name.log | tail -1) | $(grep -o 'acceptance per draft position.*' $out/$name.log | tail -1)"
  echo "  $(grep "^all rounds: costs" $out/$name.log)"
}
for setting in "fixed:--spec-fixed" "fixed2:--spec-fixed --dspark-block-size 2" "adaptive:"; do
  name=${setting%%:*}; flags=${setting#*:}
  run q8-$name --mtp $ds --dspark $flags
  run q41-$name --mtp $q4 --dspark $flags
done
