#!/usr/bin/env bash
# Rebuild the training-data files behind the committed support models
# (target/train-data/*.bin) from their token files in models/support/data/,
# by one target pass per sequence: the same bytes as generating them, in a
# fraction of the time. The same pass writes the target-feature caches of
# LAYERS (used by `train dspark` and fused MTP heads); pass "" for none.
# A file is kept when it exists with its feature cache; a data file whose
# cache is missing is rebuilt beside it (same bytes) to write the cache.
# Usage: scripts/rebuild-data.sh [LAYERS]   (default 2,10,20,29)
set -euo pipefail
cd "$(dirname "$0")/.."
layers=${1-2,10,20,29}
cargo build --release -q -p tandem-cli
mkdir -p target/train-data
for f in models/support/data/*.tokens.gz; do
    name=$(basename "$f" .tokens.gz)
    out=target/train-data/$name.bin
    feats=${layers:+target/train-data/$name.dspark-l${layers//,/-}.feats}
    if [ -e "$out" ] && { [ -z "$feats" ] || [ -e "$feats" ]; }; then
        echo "$out exists${feats:+ with $feats}, kept" >&2
        continue
    fi
    dst=$out
    if [ -e "$out" ]; then
        # the data file is there but not its feature cache: rebuild both
        # elsewhere and move them in (the data file comes out the same)
        dst=target/train-data/rebuild-tmp/$name.bin
        mkdir -p target/train-data/rebuild-tmp
        rm -f target/train-data/rebuild-tmp/"$name".*
    fi
    ./target/release/tandem train mtp --from-tokens "$f" --data "$dst" \
        ${layers:+--fused-layers "$layers"} --gen-only --out target/train-data/unused.gguf
    if [ "$dst" != "$out" ]; then
        mv target/train-data/rebuild-tmp/"$name".* target/train-data/
        rmdir target/train-data/rebuild-tmp
    fi
done
