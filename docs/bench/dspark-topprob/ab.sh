#!/bin/bash
# A/B of the DSpark drafter's greedy confidences (BENCHMARKS.md §7q): the binary
# before (OLD: confidence head) and after (NEW: the draft's own probability of
# its token), adaptive default, in turns (old, new, new, old, ...), N pairs;
# dev prompts, 128 tokens, 2 threads, 3 rounds each.
# Usage (repository root): OLD=/path/tandem-old NEW=/path/tandem-new OUT=/tmp/tp [N=6] docs/bench/dspark-topprob/ab.sh
set -eu
OUT=${OUT:-/tmp/topprob}
N=${N:-6}
mkdir -p "$OUT"
DS=models/support/smollm2-135m-instruct-dspark.gguf
run() { # name binary args...
  local name=$1 bin=$2; shift 2
  echo "== $name $(date -u +%H:%M:%S)"
  "$bin" bench --prompts ../shared/bench/prompts-dev.jsonl -n 128 --threads 2 --spec-stats --rounds 3 \
    --out-dir "$OUT/$name" --mtp $DS --dspark "$@" > "$OUT/$name.log" 2>&1
  grep -E "^rounds:|mean committed/cycle|draft lengths|^all rounds: costs" "$OUT/$name.log"
}
for i in $(seq 1 "$N"); do
  if [ $((i % 2)) = 1 ]; then run "$i-old" "$OLD"; run "$i-new" "$NEW"; else run "$i-new" "$NEW"; run "$i-old" "$OLD"; fi
done
