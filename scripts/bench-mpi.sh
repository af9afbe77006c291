#!/usr/bin/env bash
# Tensor parallelism on this host: one process with 2 threads against
# `mpirun -np 2` ranks with 1 thread each, alternating, ROUNDS times, on a
# catalogue model; decode speed, peak RSS per process and what the
# collectives cost (TANDEM_COMM_STATS), plus a speculative run (--lookup)
# whose cycle statistics come from rank 0 only.
#
#   scripts/bench-mpi.sh [NAME] [ROUNDS] [TOKENS]
#
# Needs Open MPI and a tandem built with the mpi feature in target/mpi
# (`CARGO_TARGET_DIR=target/mpi cargo build --release -p tandem-cli
# --no-default-features --features mpi`).
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:-smollm2-135m}
rounds=${2:-3}
n=${3:-128}
B=target/mpi/release/tandem
MPI=(mpirun --allow-run-as-root --oversubscribe -np 2)
P="Write a Python function that reverses a linked list, and explain how it works."
echo "model $name; $(nproc) CPUs;$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for r in $(seq 1 "$rounds"); do
    one=$(/usr/bin/time -f "RSS %M" "$B" -m "$name" -p "$P" -n "$n" --temp 0 -t 2 2>&1 >/dev/null)
    echo "round $r 1 process x 2 threads: $(grep -o 'decode: [0-9.]* tok/s' <<<"$one"), peak RSS $(grep -o 'RSS [0-9]*' <<<"$one" | awk '{printf "%.1f MiB", $2/1024}')"
    two=$(TANDEM_COMM_STATS=1 "${MPI[@]}" /usr/bin/time -f "RSS %M" "$B" -m "$name" -p "$P" -n "$n" --temp 0 -t 1 2>&1 >/dev/null)
    echo "round $r 2 ranks x 1 thread:   $(grep -o 'decode: [0-9.]* tok/s' <<<"$two"), peak RSS per rank $(grep -o 'RSS [0-9]*' <<<"$two" | awk '{printf "%.1f MiB ", $2/1024}')"
    grep "tensor parallel" <<<"$two" | sed "s/^/round $r   /"
done
echo "== speculative (--lookup) on 2 ranks: cycle statistics are rank 0's (the drafter runs there only)"
TANDEM_COMM_STATS=1 "${MPI[@]}" "$B" -m "$name" -p "$P" -n "$n" --temp 0 -t 1 --lookup --spec-stats 2>&1 >/dev/null | grep -E "^spec: cycles|tensor parallel|rank"
