#!/bin/bash
# The committed drafters (DSpark stage 8, MTP step 9) on the dev prompts, 3 rounds per
# setting (tandem bench --rounds 3: median, spread and pooled speedup), temperature 0,
# 2 threads, 128 tokens. Usage: docs/bench/rounds-stage8/eval.sh [OUT_DIR]
set -u
out=${1:-docs/bench/rounds-stage8}
ds=models/support/smollm2-135m-instruct-dspark.gguf
mtp=models/support/smollm2-135m-instruct-mtp.gguf
dev=../shared/bench/prompts-dev.jsonl
run() { local name=$1; shift
  target/release/tandem bench --prompts $dev -n 128 --threads 2 --spec-stats --rounds 3 --out-dir /tmp/rounds/$name "$@" > $out/$name.log 2>&1
  echo "$name: $(grep -E '^rounds:' $out/$name.log) | $(grep -o 'acceptance per draft position.*' $out/$name.log | tail -1)"
  echo "  $(grep "^all rounds: costs" $out/$name.log)"
}
run dspark-fixed --mtp $ds --dspark --spec-fixed
run dspark-fixed2 --mtp $ds --dspark --spec-fixed --dspark-block-size 2
run dspark-adaptive --mtp $ds --dspark
run dspark-adaptive2 --mtp $ds --dspark --dspark-block-size 2
run mtp-fixed1 --mtp $mtp --spec-fixed --mtp-draft 1
run mtp-adaptive --mtp $mtp
