#!/usr/bin/env bash
# Rebuild the training-data files behind the committed support models
# (target/train-data/*.bin) from their token files in models/support/data/,
# by one target pass per sequence: the same bytes as generating them, in a
# fraction of the time. The same pass writes the target-feature caches of
# LAYERS (used by `train dspark` and fused MTP heads); pass "" for none.
# Files that already exist are kept.
# Usage: scripts/rebuild-data.sh [LAYERS]   (default 2,10,20,29)
set -euo pipefail
cd "$(dirname "$0")/.."
layers=${1-2,10,20,29}
cargo build --release -q -p tandem-cli
mkdir -p target/train-data
for f in models/support/data/*.tokens.gz; do
    name=$(basename "$f" .tokens.gz)
    out=target/train-data/$name.bin
    if [ -e "$out" ]; then
        echo "$out exists, kept" >&2
        continue
    fi
    ./target/release/tandem train mtp --from-tokens "$f" --data "$out" \
        ${layers:+--fused-layers "$layers"} --gen-only --out target/train-data/unused.gguf
done
