#!/bin/bash
# Decoding on 48 held-out prompts of the trainers' split (seed 1, holdout 0.1, over the four
# data files of DSpark stage 8 in --data/--also-data order), every 17th held-out sequence.
set -eu
out=docs/bench/heldout-prompts
D=models/support/data
cargo run --release -p tandem-train --example heldout_prompts -- 48 1 0.1 \
  $D/mtp-x1500.tokens.gz $D/mtp-p1500-t1500.tokens.gz $D/mtp-t2000-s7.tokens.gz $D/mtp-to2000-s11.tokens.gz > $out/heldout48.jsonl
target/release/tandem bench --prompts $out/heldout48.jsonl -n 128 --threads 2 --spec-stats --out-dir /tmp/ho/s8 \
  --mtp models/support/smollm2-135m-instruct-dspark.gguf --dspark --spec-fixed > $out/s8-fixed.log 2>&1
target/release/tandem bench --prompts $out/heldout48.jsonl -n 128 --threads 2 --spec-stats --out-dir /tmp/ho/mtp \
  --mtp models/support/smollm2-135m-instruct-mtp.gguf --spec-fixed --mtp-draft 1 > $out/mtp-fixed1.log 2>&1
