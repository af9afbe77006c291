#!/bin/bash
# Trainer throughput A/B on a quiet machine; run from the repo root.
set -u
out=/tmp/ab/trainer; mkdir -p $out
common="train dspark --data target/train-data/mtp-p448.bin --init target/train-data/dspark-stage5.gguf --copy-ngram 4 --lr 1e-3 -t 2"
for r in 1 2; do
  GLIBC_TUNABLES=glibc.malloc.check=0 CANDLE_BARRIER_POOL_SPIN_LIMIT=25000 /usr/bin/time -f "%e s %U user %S sys" -o $out/old-$r.time target/release/tandem $common --steps 60 --out $out/old-$r.gguf > $out/old-$r.log 2>&1
  /usr/bin/time -f "%e s %U user %S sys" -o $out/new-$r.time target/release/tandem $common --steps 60 --out $out/new-$r.gguf > $out/new-$r.log 2>&1
done
# hard anchors with revisits: memo (new binary) vs none (the binary before it)
for v in nomemo memo; do
  b=target/release/tandem; [ $v = nomemo ] && b=target/train-data/tandem-repro
  /usr/bin/time -f "%e s %U user %S sys" -o $out/hard-$v.time $b $common --steps 40 --batch 16 --anchors 4 --hard-anchors 0.5 --out $out/hard-$v.gguf > $out/hard-$v.log 2>&1
done
for f in $out/*.log; do echo "$(basename $f .log): $(grep -o 'step [0-9]*/[0-9]*, loss [0-9.]*, lr [^,]*, [0-9]* s' $f | tail -1) | $(cat ${f%.log}.time)"; done
for f in old-2 new-1 new-2; do target/release/tandem inspect $out/old-1.gguf --same-tensors $out/$f.gguf; done
target/release/tandem inspect $out/hard-nomemo.gguf --same-tensors $out/hard-memo.gguf
