#!/usr/bin/env bash
# Coverage-guided fuzzing with AFL++ through afl.rs (stable Rust): builds
# crates/fuzz/afl with `cargo afl build` (instrumented, its own target dir),
# makes the structured driver's seeds, and runs `cargo afl fuzz` on each
# target for SECONDS, one at a time. Prints executions, coverage (edges found
# and bitmap coverage), crashes and hangs per target; crashing inputs are
# left in bench-out/fuzz-afl/TARGET/default/crashes/ (copy them into
# tests/data/fuzz/regressions/TARGET/ with the fix, as for fuzz.sh).
#
#   scripts/fuzz-afl.sh [SECONDS] [TARGET ...]
#
# `support` is left out by default: its seeds (the real support files) are
# 6-16 MB, past AFL++'s 1 MB input limit; the structured driver covers it.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(gguf request tokenizer chat_template)
command -v cargo-afl >/dev/null 2>&1 || cargo install --locked cargo-afl
cargo afl config --build >/dev/null 2>&1 || true # already built: nothing to do
(cd crates/fuzz/afl && cargo afl build --release -q)
bin=$PWD/crates/fuzz/afl/target/release/tandem-fuzz-afl
out=bench-out/fuzz-afl
mkdir -p "$out"
cargo build --release -q -p tandem-fuzz
target/release/fuzz-seeds "$out/seeds" >/dev/null
for t in "${targets[@]}"; do
    rm -rf "${out:?}/$t"
    # -t: a run over 2 s counts as a hang (the structured driver saves > 1 s)
    AFL_SKIP_CPUFREQ=1 AFL_NO_UI=1 AFL_NO_AFFINITY=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 \
        TANDEM_FUZZ_TARGET=$t cargo afl fuzz -V "$secs" -t 2000 -i "$out/seeds/$t" -o "$out/$t" -- "$bin" \
        >"$out/$t.log" 2>&1 || { tail -20 "$out/$t.log"; exit 1; }
    stats=$out/$t/default/fuzzer_stats
    get() { awk -F': ' -v k="$1" '$1 ~ "^"k" *$" {print $2}' "$stats"; }
    echo "$t: $(get execs_done) executions in $(get run_time) s ($(get execs_per_sec)/s), edges $(get edges_found) of $(get total_edges) (bitmap $(get bitmap_cvg)), corpus $(get corpus_count), crashes $(get saved_crashes), hangs $(get saved_hangs)" |
        tee -a "$out/summary.txt"
done
