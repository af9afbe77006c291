#!/bin/bash
# Chained-anchor drafter (stage 8 + 800 steps with --chain-anchors 3; not committed)
# against the committed stage 8 on the dev prompts: temperature 0, 2 threads,
# 128 tokens, full blocks, one round each (the held-out figures had already
# come out below stage 8's, so only committed per cycle was wanted), one session.
# Usage: docs/bench/dspark-chain10/eval.sh [OUT_DIR]
set -u
out=${1:-docs/bench/dspark-chain10}
s8=models/support/smollm2-135m-instruct-dspark.gguf
c10=target/train-data/dspark-chain10.gguf
dev=../shared/bench/prompts-dev.jsonl
run() { local name=$1; shift
  target/release/tandem bench --prompts $dev -n 128 --threads 2 --spec-stats --out-dir /tmp/chain10/$name "$@" > $out/$name.log 2>&1
  echo "$name: $(grep -E '^overall:' $out/$name.log) | $(grep -o 'acceptance per draft position.*' $out/$name.log | tail -1)"
}
run s8-fixed --mtp $s8 --dspark --spec-fixed
run c10-fixed --mtp $c10 --dspark --spec-fixed
