#!/bin/bash
# Trainer throughput A/B on a quiet machine (run from the repo root, nothing else running):
# the default build vs --fused-loss vs the avx512-gemm build, 60 steps each from stage 8.
set -u
out=${OUT:-/tmp/ab/fused}; mkdir -p $out
common="train dspark --data target/train-data/mtp-p448.bin --init target/train-data/dspark-stage8.gguf --copy-ngram 4 --lr 1e-3 --hard-anchors 0.5 -t 2 --steps 60"
run() { # name binary extra-args
  /usr/bin/time -f "%e s %U user %S sys" -o $out/$1.time $2 $common $3 --out $out/$1.gguf > $out/$1.log 2>&1
}
for r in ${ROUNDS:-1 2}; do
  run base-$r target/release/tandem ""
  run fused-$r target/release/tandem "--fused-loss"
  run v4-$r target/avx512/release/tandem ""
  run v4fused-$r target/avx512/release/tandem "--fused-loss"
done
for f in $out/*.log; do echo "$(basename $f .log): $(grep -o 'step [0-9]*/[0-9]*, loss [0-9.]*, lr [^,]*, [0-9]* s' $f | tail -1) | $(cat ${f%.log}.time)"; done
