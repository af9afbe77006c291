#!/bin/bash
# Stage 9 (not committed) against stage 8 on the dev prompts, one session, quiet machine.
set -u
out=docs/bench/dspark-stage9
s8=models/support/smollm2-135m-instruct-dspark.gguf
s9=target/train-data/dspark-stage9.gguf
run() { local name=$1; shift
  target/release/tandem bench --prompts ../shared/bench/prompts-dev.jsonl -n 128 --threads 2 --spec-stats --out-dir $out/$name "$@" > $out/$name.log 2>&1
  echo "$name: $(grep -E '^overall:' $out/$name.log) | $(grep -o 'acceptance per draft position.*' $out/$name.log)"
}
run s8-fixed --mtp $s8 --dspark --spec-fixed
run s9-fixed --mtp $s9 --dspark --spec-fixed
run s8-fixed2 --mtp $s8 --dspark --spec-fixed --dspark-block-size 2
run s9-fixed2 --mtp $s9 --dspark --spec-fixed --dspark-block-size 2
run s9-adaptive --mtp $s9 --dspark
run mtp-fixed1 --mtp models/support/smollm2-135m-instruct-mtp.gguf --spec-fixed --mtp-draft 1
