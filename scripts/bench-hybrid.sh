#!/usr/bin/env bash
# Prompt lookup in front of the support drafters, against each alone, on the
# shared dev prompts: ROUNDS rounds of the same settings back to back in one
# session (each run interleaves its own plain baseline per prompt, so every
# speedup is a ratio from one run; rounds show the run-to-run spread).
# Usage: scripts/bench-hybrid.sh [OUT_DIR] [N_PREDICT] [THREADS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${4:-2}
show="^overall:|EXACTNESS"
source scripts/bench-common.sh "${1:-docs/bench/hybrid}" "${2:-128}" "${3:-2}"
for r in $(seq 1 "$rounds"); do
    run "mtp-adaptive-r$r" --mtp "$mtp"
    run "lookup-mtp-r$r" --mtp "$mtp" --lookup --lookup-ngram-min 2 --lookup-ngram-max 8
    run "lookup-r$r" --lookup
    run "dspark-adaptive-r$r" --mtp "$dspark" --dspark
    run "lookup-dspark-r$r" --mtp "$dspark" --dspark --lookup --lookup-ngram-min 2 --lookup-ngram-max 8
done
run mtp-fixed1 --mtp "$mtp" --spec-fixed --mtp-draft 1
