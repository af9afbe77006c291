#!/bin/bash
# Adaptive DSpark and MTP with the scheduler's calibration by case (after a miss or not)
# against the binary before it, 3 rounds each, interleaved, dev prompts, 128 tokens, 2 threads.
# Usage: docs/bench/case-calibration/ab.sh OLD_BINARY NEW_BINARY [OUT_DIR]
set -u
old=$1 new=$2 out=${3:-docs/bench/case-calibration}
ds=models/support/smollm2-135m-instruct-dspark.gguf
mtp=models/support/smollm2-135m-instruct-mtp.gguf
dev=../shared/bench/prompts-dev.jsonl
run() { local name=$1 bin=$2; shift 2
  $bin bench --prompts $dev -n 128 --threads 2 --spec-stats --rounds 3 --out-dir /tmp/ab/$name "$@" > $out/$name.log 2>&1
  echo "$name: $(grep -E '^rounds:' $out/$name.log)"
  echo "  $(grep -o 'cycles [0-9]* ([0-9]* plain).*' $out/$name.log | tail -1)"
  echo "  $(grep '^all rounds: costs' $out/$name.log)"
}
run ds-old-1 $old --mtp $ds --dspark
run ds-new-1 $new --mtp $ds --dspark
run mtp-old-1 $old --mtp $mtp
run mtp-new-1 $new --mtp $mtp
run ds-new-2 $new --mtp $ds --dspark
run ds-old-2 $old --mtp $ds --dspark
