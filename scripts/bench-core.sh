#!/usr/bin/env bash
# Plain-decoding benchmark of BENCHMARKS.md §1: tandem and llama.cpp side by
# side in one session, 2 threads. Usage:
#   scripts/bench-core.sh OUT_DIR [LLAMA_BIN_DIR ...]
# Each LLAMA_BIN_DIR holds a llama.cpp build's llama-bench. tandem runs with its
# run-time SIMD choice and again with TANDEM_SIMD=avx2 (no AVX-VNNI).
set -euo pipefail
out=${1:?out dir}; shift
mkdir -p "$out"
M=${M:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
T=${T:-target/release/tandem}
W=1,2,3,4,5,6,8,12,16
for simd in auto avx2; do
    TANDEM_SIMD=$simd "$T" bench -m "$M" --threads 2 --reps 3 --widths $W \
        > "$out/tandem-$simd.csv" 2> "$out/tandem-$simd.stderr"
done
for b in "$@"; do
    tag=$(basename "$b")
    "$b/llama-bench" -m "$M" -t 2 -p 8,64,128,512 -n 128 -r 3 -o csv > "$out/llama-$tag-main.csv" 2>/dev/null
    "$b/llama-bench" -m "$M" -t 2 -p ${W//,/,} -n 0 -r 5 -d 128 -o csv > "$out/llama-$tag-widths-d128.csv" 2>/dev/null
done
echo "done: $out"
