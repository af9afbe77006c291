#!/usr/bin/env python3
"""First-draft acceptance of two drafters on the same text, by category.

Reads two `tandem bench --prompts FILE --spec-log LOG` cycle logs (JSON
lines, plain or gzipped) of the same prompts at temperature 0, so both decode the same text,
and compares the first draft position: its acceptance per category for each,
and, at the positions where both drafted, how often only one was right.

Usage: scripts/first-slot-vs-mtp.py PROMPTS.jsonl LOG_A LOG_B
(e.g. a DSpark run with --spec-fixed and an MTP run with --spec-fixed
--mtp-draft 1; docs/experiments/005-dspark.md §7g).
"""
import gzip
import json
import sys


def cycles(path, n):
    """Per prompt: {anchor position: first draft accepted}; the last n prompts
    (the bench decodes a warm-up prompt first)."""
    opener = gzip.open if path.endswith(".gz") else open
    runs = []
    with opener(path, "rt") as f:
        for line in f:
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            if r["cycle"] == 1:
                runs.append({})
            if r["plan"]["verify"] > 0:
                runs[-1][r["pos"]] = r["verification"]["accepted"] > 0
    return runs[-n:]


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    cats = [json.loads(l)["category"] for l in open(sys.argv[1]) if l.strip()]
    a, b = cycles(sys.argv[2], len(cats)), cycles(sys.argv[3], len(cats))
    if len(a) != len(cats) or len(b) != len(cats):
        sys.exit("the logs do not hold one run per prompt")
    rows = {}
    for c, x, y in zip(cats, a, b):
        r = rows.setdefault(c, [0] * 7)
        common = set(x) & set(y)
        r[0] += len(x)
        r[1] += sum(x.values())
        r[2] += len(y)
        r[3] += sum(y.values())
        r[4] += len(common)
        r[5] += sum(1 for p in common if x[p] and not y[p])
        r[6] += sum(1 for p in common if y[p] and not x[p])
    rows["all"] = [sum(r[i] for r in rows.values()) for i in range(7)]
    print("category   A first  (cycles)  B first  (cycles)  both drafted  only A right  only B right")
    for c, r in rows.items():
        print(f"{c:10s} {r[1] / r[0]:7.1%}  ({r[0]:5d})  {r[3] / r[2]:7.1%}  ({r[2]:5d})  {r[4]:12d}  {r[5]:12d}  {r[6]:12d}")


if __name__ == "__main__":
    main()
