#!/usr/bin/env python3
"""Overhead of the Python package against the CLI for one generation.

For each round and each prompt (dev prompts as chats, greedy, -n tokens),
runs in turn:
  - `tandem -p PROMPT --temp 0 -n N`: its decode time, from its stats line
    (process start, model load and prefill excluded),
  - `model.chat(...)` in this process: wall-clock time of the call minus the
    engine's prefill time (what is left: rendering and tokenizing, the
    generation thread, every piece through the channel and into Python
    objects, and the decode itself),
  - the same with `stream=True`, iterating the pieces.
"its engine" is the decode time the package's engine measured inside the
plain call: the call's wall time over it is the binding's own cost, free of
the run-to-run noise between processes.
Prefill is left out of both sides because the package keeps its session
between calls and reuses the chat template's shared prefix, which the CLI,
starting afresh, cannot. Both sides generate the same tokens (checked).
Prints per-token times summed over the prompts, their ratios per round and
the median ratio, as Markdown.

usage: scripts/bench-python.py [--rounds 3] [--prompts 8] [-n 256] [-t 2] [--bin target/release/tandem]
Needs the package installed (`pip install ./python`).
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import time

import tandem

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
STATS = re.compile(r"prompt tokens: (\d+) \((\d+) evaluated\), prefill: ([\d.]+) tok/s, generated tokens: (\d+), decode: ([\d.]+) tok/s")


def cli(bin_, prompt, n, threads):
    r = subprocess.run([bin_, "-p", prompt, "--temp", "0", "-n", str(n), "-t", str(threads)],
                       capture_output=True, text=True, check=True)
    m = STATS.search(r.stderr)
    gen, decode_tps = int(m.group(4)), float(m.group(5))
    return (gen - 1) / decode_tps, gen, r.stdout[:-1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "tandem"))
    a = ap.parse_args()
    with open(os.path.join(ROOT, "tests", "data", "prompts-dev.jsonl")) as f:
        prompts = [json.loads(line)["user"] for line in f if line.strip()][: a.prompts]
    model = tandem.Model(threads=a.t)
    model.generate("warm up", max_tokens=8)
    rows = []
    for r in range(a.rounds):
        t_cli = t_py = t_stream = t_engine = 0.0
        tokens = 0
        for p in prompts:
            secs, gen, text = cli(a.bin, p, a.n, a.t)
            msgs = [{"role": "user", "content": p}]
            t0 = time.perf_counter()
            c = model.chat(msgs, max_tokens=a.n)
            t1 = time.perf_counter()
            s = model.chat(msgs, max_tokens=a.n, stream=True)
            pieces = list(s)
            t2 = time.perf_counter()
            assert c.text == text and "".join(pieces) == text, p
            assert c.stats.generated_tokens == gen
            t_cli += secs
            t_py += t1 - t0 - c.stats.prefill_ms / 1e3
            t_stream += t2 - t1 - s.completion.stats.prefill_ms / 1e3
            t_engine += c.stats.decode_ms / 1e3
            tokens += gen - 1
        rows.append((r + 1, tokens, t_cli, t_py, t_stream, t_engine))
    print(f"{len(prompts)} dev prompts as chats, -n {a.n}, {a.t} threads, greedy; time per decoded token (prefill excluded), summed over the prompts\n")
    print("| round | decoded tokens | CLI (ms/tok) | Python (ms/tok) | its engine (ms/tok) | Python stream (ms/tok) | Python / CLI | stream / CLI |")
    print("|---|---|---|---|---|---|---|---|")
    for r, tok, c, p, s, e in rows:
        print(f"| {r} | {tok} | {1e3 * c / tok:.3f} | {1e3 * p / tok:.3f} | {1e3 * e / tok:.3f} | {1e3 * s / tok:.3f} | {p / c:.3f} | {s / c:.3f} |")
    mp = statistics.median(p / c for _, _, c, p, _, _ in rows)
    ms = statistics.median(s / c for _, _, c, _, s, _ in rows)
    me = statistics.median(p / e for _, _, _, p, _, e in rows)
    print(f"\nmedian overhead against the CLI: Python {100 * (mp - 1):+.1f}%, Python stream {100 * (ms - 1):+.1f}%;")
    print(f"the call against its own engine's decode time: {100 * (me - 1):+.1f}%")


if __name__ == "__main__":
    main()
