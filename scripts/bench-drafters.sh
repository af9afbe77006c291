#!/usr/bin/env bash
# Plain vs MTP vs DSpark on the shared dev prompts, back to back in one run
# (each run interleaves its own plain baseline per prompt).
# Usage: scripts/bench-drafters.sh [OUT_DIR] [N_PREDICT] [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-common.sh "${1:-bench-out/drafters}" "${2:-128}" "${3:-2}"
run mtp-adaptive --mtp "$mtp"
run mtp-fixed1 --mtp "$mtp" --spec-fixed --mtp-draft 1
run dspark-adaptive --mtp "$dspark" --dspark
run dspark-fixed --mtp "$dspark" --dspark --spec-fixed
run dspark-fixed2 --mtp "$dspark" --dspark --spec-fixed --dspark-block-size 2
run dspark-conf05 --mtp "$dspark" --dspark --spec-fixed --dspark-confidence 0.5
