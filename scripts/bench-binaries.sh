#!/usr/bin/env bash
# Two tandem binaries (say, before and after a scheduler change) on the
# shared dev prompts with the committed support files, in the adaptive
# default: the MTP head, the DSpark drafter, lookup + MTP. Two rounds, the
# binaries alternating (A B, then B A), so a drift of the machine state
# shows. Each run interleaves its own plain baseline per prompt, so every
# speedup is a ratio from one run.
# Usage: scripts/bench-binaries.sh OUT_DIR BIN_A BIN_B [N_PREDICT] [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
bin_a=${2:?first binary}
bin_b=${3:?second binary}
show="^overall:|EXACTNESS"
source scripts/bench-common.sh "${1:?out dir}" "${4:-128}" "${5:-2}"
lk=(--lookup --lookup-ngram-min 2 --lookup-ngram-max 8)
for round in 1 2; do
    order="a b"
    [ "$round" = 2 ] && order="b a"
    for setting in mtp dspark lookup; do
        for h in $order; do
            v=bin_$h
            bin=${!v}
            case $setting in
                mtp) run "r$round-$h-mtp" --mtp "$mtp" ;;
                dspark) run "r$round-$h-dspark" --mtp "$dspark" --dspark ;;
                lookup) run "r$round-$h-lookup" --mtp "$mtp" "${lk[@]}" ;;
            esac
        done
    done
done
