#!/usr/bin/env bash
# Run every fuzz harness for SECONDS each (two at a time), with seeds made
# by fuzz-seeds; prints one line per target and saves crashing or slow
# inputs under tests/data/fuzz/regressions/TARGET/ (commit them with a fix
# and they are replayed by `cargo test -p tandem-fuzz`).
#
#   scripts/fuzz.sh [SECONDS] [TARGET ...]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(gguf request tokenizer support chat_template)
cargo build --release -q -p tandem-fuzz
out=bench-out/fuzz
mkdir -p "$out"
target/release/fuzz-seeds "$out/seeds" >/dev/null
run() { target/release/fuzz-mutate "$1" "$secs" "$out/seeds/$1" 2>>"$out/$1.log" | tee -a "$out/summary.txt"; }
for ((i = 0; i < ${#targets[@]}; i += 2)); do
    run "${targets[i]}" &
    if ((i + 1 < ${#targets[@]})); then run "${targets[i + 1]}" & fi
    wait
done
