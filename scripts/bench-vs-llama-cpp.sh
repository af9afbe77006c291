#!/usr/bin/env bash
# Plain decode and prefill of one catalogue model, tandem and llama.cpp side by
# side in one run, 2 threads, alternating the two engines ROUNDS times:
#
#   scripts/bench-vs-llama-cpp.sh NAME [OUT_DIR] [ROUNDS]
#
# tandem: `tandem bench --ctx 512 --gen 128` (pp512, then decode of 128 tokens
# after the 512-token prompt) and the cost of 5- and 6-row forwards relative to
# one row. llama.cpp 0c1e570 (scripts/build-llama-cpp.sh): llama-bench pp512 and
# tg128. Prints one line per run and the medians; raw output goes to OUT_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?catalogue name, e.g. qwen2.5-coder-0.5b}
out=${2:-bench-out/vs-llama-cpp-$name}
rounds=${3:-3}
mkdir -p "$out"
cargo build --release -q -p tandem-cli
T=target/release/tandem
model=$("$T" fetch "$name" 2>&1 | sed -n 's/^model ready: //p')
[[ -f "$model" ]] || { echo "could not fetch $name" >&2; exit 1; }
L=$(scripts/build-llama-cpp.sh llama-bench)
echo "model $model; $(nproc) CPUs; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
for r in $(seq 1 "$rounds"); do
    "$T" bench -m "$model" --threads 2 --ctx 512 --gen 128 --reps 3 --widths 1,2,3,5,6 \
        > "$out/tandem-$r.csv" 2> "$out/tandem-$r.stderr"
    awk -F, -v r="$r" 'NR==2 {printf "round %s tandem    pp512 %7.1f tok/s  tg128 %6.1f tok/s\n", r, $3, $5}' "$out/tandem-$r.csv"
    grep "batch width" "$out/tandem-$r.stderr" | sed "s/^/round $r tandem    /" || true
    "$L/llama-bench" -m "$model" -t 2 -p 512 -n 128 -r 3 -o csv > "$out/llama-$r.csv" 2> "$out/llama-$r.stderr"
    python3 - "$out/llama-$r.csv" "$r" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
tps = {("pp" if int(x["n_prompt"]) else "tg"): float(x["avg_ts"]) for x in rows}
print(f"round {sys.argv[2]} llama.cpp pp512 {tps['pp']:7.1f} tok/s  tg128 {tps['tg']:6.1f} tok/s")
PY
done | tee "$out/summary.txt"
python3 - "$out/summary.txt" <<'PY'
import re, statistics, sys
v = {}
for line in open(sys.argv[1]):
    m = re.match(r"round \d+ (tandem|llama\.cpp)\s+pp512\s+([\d.]+) tok/s\s+tg128\s+([\d.]+)", line)
    if m:
        v.setdefault(m[1], []).append((float(m[2]), float(m[3])))
med = {k: (statistics.median(p for p, _ in x), statistics.median(t for _, t in x)) for k, x in v.items()}
for k, (p, t) in med.items():
    print(f"median {k:9s} pp512 {p:7.1f} tok/s  tg128 {t:6.1f} tok/s")
if len(med) == 2:
    (tp, tt), (lp, lt) = med["tandem"], med["llama.cpp"]
    print(f"tandem / llama.cpp: prefill {tp / lp:.2f}x, decode {tt / lt:.2f}x")
PY
