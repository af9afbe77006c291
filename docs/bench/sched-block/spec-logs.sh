#!/bin/bash
# Full-block spec logs of DSpark stage 8 on every dev prompt (greedy, 128 tokens):
# the input of the scheduler replay (crates/spec/examples/sched_replay.rs, BENCHMARKS.md §7p).
# Usage (repository root): docs/bench/sched-block/spec-logs.sh [OUT]   (default docs/bench/sched-block/spec-logs)
set -eu
OUT=${1:-docs/bench/sched-block/spec-logs}
mkdir -p "$OUT"
python3 - <<'PY' > "$OUT/prompts.tsv"
import json
for l in open('../shared/bench/prompts-dev.jsonl'):
    j=json.loads(l); print(j['id']+'\t'+json.dumps(j['user']))
PY
while IFS=$'\t' read -r id u; do
  p=$(python3 -c "import json,sys; print(json.loads(sys.argv[1]))" "$u")
  target/release/tandem -p "$p" -n 128 --temp 0 -t 2 --mtp models/support/smollm2-135m-instruct-dspark.gguf \
    --dspark --spec-fixed --spec-log 2>&1 >/dev/null | grep '^spec cycle' > "$OUT/ds-$id.log"
done < "$OUT/prompts.tsv"
rm "$OUT/prompts.tsv"
