#!/usr/bin/env bash
# Plain vs MTP vs DSpark on the shared dev prompts, back to back in one
# session (each run interleaves its own plain baseline per prompt).
# Usage: scripts/bench-drafters.sh [OUT_DIR] [N_PREDICT] [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/bench/drafters}
n=${2:-128}
t=${3:-2}
prompts=../shared/bench/prompts-dev.jsonl
mtp=models/support/smollm2-135m-instruct-mtp.gguf
dspark=models/support/smollm2-135m-instruct-dspark.gguf
cargo build --release -q
bin=./target/release/tandem
run() {
    local name=$1; shift
    echo "== $name: $*" >&2
    "$bin" bench --prompts "$prompts" -n "$n" --threads "$t" --spec-stats --out-dir "$out/$name" "$@" 2>&1 | tee "$out/$name.log" | grep -E "overall|spec:|identical|EXACTNESS" || true
}
mkdir -p "$out"
run mtp-adaptive --mtp "$mtp"
run mtp-fixed1 --mtp "$mtp" --spec-fixed --mtp-draft 1
run dspark-adaptive --mtp "$dspark" --dspark
run dspark-fixed --mtp "$dspark" --dspark --spec-fixed
run dspark-fixed2 --mtp "$dspark" --dspark --spec-fixed --dspark-block-size 2
run dspark-conf05 --mtp "$dspark" --dspark --spec-fixed --dspark-confidence 0.5
