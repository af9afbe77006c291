#!/usr/bin/env bash
# Prompt lookup in front of the support drafters, against each alone, on the
# shared dev prompts: ROUNDS rounds of the same settings back to back in one
# session (each run interleaves its own plain baseline per prompt, so every
# speedup is a ratio from one run; rounds show the run-to-run spread).
# Usage: scripts/bench-hybrid.sh [OUT_DIR] [N_PREDICT] [THREADS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/bench/hybrid}
n=${2:-128}
t=${3:-2}
rounds=${4:-2}
prompts=../shared/bench/prompts-dev.jsonl
mtp=models/support/smollm2-135m-instruct-mtp.gguf
dspark=models/support/smollm2-135m-instruct-dspark.gguf
cargo build --release -q
bin=./target/release/tandem
run() {
    local name=$1; shift
    echo "== $name: $*" >&2
    "$bin" bench --prompts "$prompts" -n "$n" --threads "$t" --spec-stats --out-dir "$out/$name" "$@" 2>&1 | tee "$out/$name.log" | grep -E "^overall:|EXACTNESS" || true
}
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
    run "mtp-adaptive-r$r" --mtp "$mtp"
    run "lookup-mtp-r$r" --mtp "$mtp" --lookup --lookup-ngram-min 2 --lookup-ngram-max 8
    run "lookup-r$r" --lookup
    run "dspark-adaptive-r$r" --mtp "$dspark" --dspark
    run "lookup-dspark-r$r" --mtp "$dspark" --dspark --lookup --lookup-ngram-min 2 --lookup-ngram-max 8
done
run mtp-fixed1 --mtp "$mtp" --spec-fixed --mtp-draft 1
