#!/bin/bash
# A/B of the scheduler change for block drafters (BENCHMARKS.md §7p): DSpark stage 8
# with the adaptive default, the binary before (OLD) and after (NEW) in turns
# (old, new, new, old, old, new), then fixed blocks of 2 for reference; dev prompts,
# 128 tokens, 2 threads, 3 rounds each.
# Usage (repository root): OLD=/path/tandem-old NEW=/path/tandem-new OUT=/tmp/sb docs/bench/sched-block/ab.sh
set -eu
OUT=${OUT:-/tmp/sched-block}
mkdir -p "$OUT"
DS=models/support/smollm2-135m-instruct-dspark.gguf
run() { # name binary args...
  local name=$1 bin=$2; shift 2
  echo "== $name $(date -u +%H:%M:%S)"
  "$bin" bench --prompts ../shared/bench/prompts-dev.jsonl -n 128 --threads 2 --spec-stats --rounds 3 \
    --out-dir "$OUT/$name" --mtp $DS --dspark "$@" > "$OUT/$name.log" 2>&1
  grep -E "^rounds:|mean committed/cycle|draft lengths|^all rounds: costs" "$OUT/$name.log"
}
run 1-old "$OLD"
run 2-new "$NEW"
run 3-new "$NEW"
run 4-old "$OLD"
run 5-old "$OLD"
run 6-new "$NEW"
run 7-fixed2 "$NEW" --spec-fixed --dspark-block-size 2
