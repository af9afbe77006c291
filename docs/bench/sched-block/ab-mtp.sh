#!/bin/bash
# The same A/B for the MTP head (step 9, adaptive default), whose drafts cost per
# token: only the cost model (speed times relative cost per width) applies to it.
# Usage (repository root): OLD=/path/tandem-old NEW=/path/tandem-new OUT=/tmp/sbm docs/bench/sched-block/ab-mtp.sh
set -eu
OUT=${OUT:-/tmp/sched-block-mtp}
mkdir -p "$OUT"
MTP=models/support/smollm2-135m-instruct-mtp.gguf
run() { # name binary args...
  local name=$1 bin=$2; shift 2
  echo "== $name $(date -u +%H:%M:%S)"
  "$bin" bench --prompts ../shared/bench/prompts-dev.jsonl -n 128 --threads 2 --spec-stats --rounds 3 \
    --out-dir "$OUT/$name" --mtp $MTP "$@" > "$OUT/$name.log" 2>&1
  grep -E "^rounds:|mean committed/cycle|draft lengths|^all rounds: costs" "$OUT/$name.log"
}
run 1-old "$OLD"
run 2-new "$NEW"
run 3-new "$NEW"
run 4-old "$OLD"
