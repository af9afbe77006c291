#!/usr/bin/env bash
# Two MTP heads on the shared dev prompts, back to back in one session: the
# first draft over all positions (`--spec-fixed --mtp-draft 1`, every cycle
# proposes), the adaptive default, and both with prompt lookup in front. Each
# run interleaves its own plain baseline per prompt, so every speedup is a
# ratio from one run.
# Usage: scripts/bench-heads.sh OUT_DIR HEAD_A HEAD_B [N_PREDICT] [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
a=${2:?first head}
b=${3:?second head}
show="^overall:|EXACTNESS"
source scripts/bench-common.sh "${1:?out dir}" "${4:-128}" "${5:-2}"
lk=(--lookup --lookup-ngram-min 2 --lookup-ngram-max 8)
for h in a b; do
    f=${!h}
    run "$h-fixed1" --mtp "$f" --spec-fixed --mtp-draft 1
    run "$h-adaptive" --mtp "$f"
done
for h in a b; do
    f=${!h}
    run "$h-lookup" --mtp "$f" "${lk[@]}"
    run "$h-lookup-fixed1" --mtp "$f" "${lk[@]}" --spec-fixed --mtp-draft 1
done
