#!/bin/bash
# The AVX2 packed kernels before and after this session's rewrite, on the dev
# prompts: 3 rounds per setting, temperature 0, 2 threads, 128 tokens; the
# two binaries alternate setting by setting. Each bench run measures plain
# decoding and the speculative setting prompt by prompt, so each speedup is a
# ratio within one binary's run.
# Usage: docs/bench/kernels-avx2/ab.sh OLD_BIN NEW_BIN [OUT_DIR]
set -u
old=$1; new=$2; out=${3:-docs/bench/kernels-avx2}
ds=models/support/smollm2-135m-instruct-dspark.gguf
mtp=models/support/smollm2-135m-instruct-mtp.gguf
dev=../shared/bench/prompts-dev.jsonl
run() { local bin=$1 name=$2; shift 2
  $bin bench --prompts $dev -n 128 --threads 2 --spec-stats --rounds 3 --out-dir /tmp/kab/$name "$@" > $out/$name.log 2>&1
  echo "$name: $(grep -E '^rounds:' $out/$name.log) | $(grep -o 'mean committed/cycle.*' $out/$name.log | tail -1)"
  echo "  $(grep "^all rounds: costs" $out/$name.log)"
}
date -u
for setting in "dspark-fixed:--mtp $ds --dspark --spec-fixed" "dspark-fixed2:--mtp $ds --dspark --spec-fixed --dspark-block-size 2" \
               "dspark-adaptive:--mtp $ds --dspark" "mtp-fixed1:--mtp $mtp --spec-fixed --mtp-draft 1" "mtp-adaptive:--mtp $mtp"; do
  name=${setting%%:*}; flags=${setting#*:}
  run $old old-$name $flags
  run $new new-$name $flags
done
date -u
