#!/usr/bin/env bash
# Plain decode and prefill of one catalogue model, tandem and llama.cpp side by
# side in one run, 2 threads, alternating the two engines ROUNDS times:
#
#   scripts/bench-vs-llama-cpp.sh NAME [OUT_DIR] [ROUNDS]
#
# tandem: `tandem bench --ctx 8,512 --gen 128`: prefill of a 512-token prompt,
# decode of 128 tokens after an 8-token prompt (tg128; llama-bench's tg128
# starts from an empty context) and after the 512-token prompt (tg128@d512),
# and the cost of 2- to 6-row forwards relative to one row. llama.cpp 0c1e570
# (scripts/build-llama-cpp.sh): llama-bench pp512, tg128 and tg128 at depth
# 512. Prints one line per run and the medians; raw output goes to OUT_DIR.
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
    "$T" bench -m "$model" --threads 2 --ctx 8,512 --gen 128 --reps 3 --widths 1,2,3,5,6 \
        > "$out/tandem-$r.csv" 2> "$out/tandem-$r.stderr"
    awk -F, -v r="$r" '$1 == 8 {tg = $5} $1 == 512 {pp = $3; tgd = $5}
        END {printf "round %s tandem    pp512 %7.1f tok/s  tg128 %6.1f tok/s  tg128@d512 %6.1f tok/s\n", r, pp, tg, tgd}' "$out/tandem-$r.csv"
    grep "batch width" "$out/tandem-$r.stderr" | sed "s/^/round $r tandem    /" || true
    "$L/llama-bench" -m "$model" -t 2 -p 512 -n 128 -d 0,512 -r 3 -o csv > "$out/llama-$r.csv" 2> "$out/llama-$r.stderr"
    python3 - "$out/llama-$r.csv" "$r" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
tps = {("pp" if int(x["n_prompt"]) else "tg", int(x["n_depth"])): float(x["avg_ts"]) for x in rows}
print(f"round {sys.argv[2]} llama.cpp pp512 {tps['pp', 0]:7.1f} tok/s  tg128 {tps['tg', 0]:6.1f} tok/s  tg128@d512 {tps['tg', 512]:6.1f} tok/s")
PY
done | tee "$out/summary.txt"
python3 - "$out/summary.txt" <<'PY'
import re, statistics, sys
v = {}
for line in open(sys.argv[1]):
    m = re.match(r"round \d+ (tandem|llama\.cpp)\s+pp512\s+([\d.]+) tok/s\s+tg128\s+([\d.]+) tok/s\s+tg128@d512\s+([\d.]+)", line)
    if m:
        v.setdefault(m[1], []).append(tuple(float(m[i]) for i in (2, 3, 4)))
med = {k: [statistics.median(r[i] for r in x) for i in range(3)] for k, x in v.items()}
for k, (p, t, d) in med.items():
    print(f"median {k:9s} pp512 {p:7.1f} tok/s  tg128 {t:6.1f} tok/s  tg128@d512 {d:6.1f} tok/s")
if len(med) == 2:
    a, b = med["tandem"], med["llama.cpp"]
    print(f"tandem / llama.cpp: prefill {a[0] / b[0]:.2f}x, decode {a[1] / b[1]:.2f}x, decode at depth 512 {a[2] / b[2]:.2f}x")
PY
