#!/bin/bash
# Would the MTP head's first draft help DSpark? Per dev prompt, the spec logs of
# DSpark stage 8 (full blocks) and MTP step 9 (one-token drafts), greedy, 128 tokens.
# Both follow the same greedy text, so a position where both started a cycle has
# the same anchor; ana.py compares their first drafts there.
# Usage (repository root): OUT=/tmp/lead docs/bench/lead-estimate/run.sh && OUT=/tmp/lead python3 docs/bench/lead-estimate/ana.py
set -u
mkdir -p ${OUT:-/tmp/lead}
python3 - <<'PY' > ${OUT:-/tmp/lead}/prompts.txt
import json
for l in open('../shared/bench/prompts-dev.jsonl'):
    j=json.loads(l); print(j['id']+'\t'+json.dumps(j['user']))
PY
while IFS=$'\t' read -r id u; do
  p=$(python3 -c "import json,sys; print(json.loads(sys.argv[1]))" "$u")
  target/release/tandem -p "$p" -n 128 --temp 0 -t 2 --mtp models/support/smollm2-135m-instruct-dspark.gguf --dspark --spec-fixed --spec-log 2>&1 >/dev/null | grep '^spec cycle' > ${OUT:-/tmp/lead}/ds-$id.log
  target/release/tandem -p "$p" -n 128 --temp 0 -t 2 --mtp models/support/smollm2-135m-instruct-mtp.gguf --spec-fixed --mtp-draft 1 --spec-log 2>&1 >/dev/null | grep '^spec cycle' > ${OUT:-/tmp/lead}/mtp-$id.log
done < ${OUT:-/tmp/lead}/prompts.txt
