#!/usr/bin/env python3
"""Single-client decode throughput through `tandem serve` vs the CLI.

For each configuration (plain, --lookup) and each repetition, runs in turn:
  - `tandem -p PROMPT --temp 0 -n N` (decode tok/s from its stats line),
  - one streaming request to the server (client-side decode rate: tokens after
    the first / time from the first to the last content chunk),
  - one non-streaming request (the server's own decode rate, `tandem.decode_tokens_per_second`).
Interleaving keeps background load fair to both. Prints the best of the
repetitions (as the other benchmarks do) and the medians as a Markdown table.

usage: scripts/bench-server.py [--reps 5] [-n 200] [-t 2] [-p PROMPT] [--bin target/release/tandem]
"""

import argparse
import http.client
import json
import re
import statistics
import subprocess
import threading
import time

PROMPT = "Write a detailed story about a lighthouse keeper who finds a message in a bottle."


def start(bin_, extra, threads):
    p = subprocess.Popen([bin_, "serve", "--port", "0", "-t", str(threads), *extra],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while True:
        line = p.stderr.readline()
        if not line:
            raise SystemExit("server exited")
        m = re.search(r"listening on http://([\d.]+):(\d+)", line)
        if m:
            threading.Thread(target=p.stderr.read, daemon=True).start()
            return p, m.group(1), int(m.group(2))


def request(host, port, n, stream):
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": PROMPT}],
                       "temperature": 0, "max_tokens": n, "stream": stream,
                       "stream_options": {"include_usage": True} if stream else None})
    c = http.client.HTTPConnection(host, port, timeout=600)
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if not stream:
        v = json.loads(r.read())
        return v["usage"]["completion_tokens"], v["tandem"]["decode_tokens_per_second"], v["tandem"]
    first = last = None
    chunks = 0
    usage = None
    ext = None
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        v = json.loads(line[6:])
        if v.get("usage"):
            usage = v["usage"]
            ext = v.get("tandem")
        for ch in v.get("choices", []):
            if ch.get("delta", {}).get("content"):
                now = time.perf_counter()
                first = first or now
                last = now
                chunks += 1
    toks = usage["completion_tokens"]
    return toks, (toks - 1) / (last - first), ext


def cli(bin_, n, extra, threads):
    out = subprocess.run([bin_, "-p", PROMPT, "--temp", "0", "-n", str(n), "-t", str(threads), *extra],
                         capture_output=True, text=True, check=True)
    m = re.search(r"generated tokens: (\d+), decode: ([\d.]+) tok/s", out.stderr)
    return int(m.group(1)), float(m.group(2))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--bin", default="target/release/tandem")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-p", "--prompt", default=PROMPT)
    a = ap.parse_args()
    globals()["PROMPT"] = a.prompt
    rows = []
    for name, extra in [("plain", []), ("--lookup", ["--lookup"])]:
        srv, host, port = start(a.bin, extra, a.threads)
        try:
            request(host, port, 8, False)  # warm up
            res = {"cli": [], "stream": [], "server": []}
            accept = []
            for _ in range(a.reps):
                t1, r1 = cli(a.bin, a.n, extra, a.threads)
                t2, r2, _ = request(host, port, a.n, True)
                t3, r3, ext = request(host, port, a.n, False)
                assert t1 == t2 == t3, (t1, t2, t3)
                res["cli"].append(r1)
                res["stream"].append(r2)
                res["server"].append(r3)
                if ext.get("speculative"):
                    accept.append(ext["speculative"]["acceptance_rate"])
            rows.append((name, t1, res, statistics.median(accept) if accept else None))
        finally:
            srv.terminate()
            srv.wait()
    print("| mode | stat | tokens | CLI decode tok/s | server, streaming client-side tok/s | server, engine-reported tok/s | streaming / CLI | acceptance |")
    print("|---|---|---|---|---|---|---|---|")
    for name, t, res, acc in rows:
        for stat, f in [(f"best of {a.reps}", max), ("median", statistics.median)]:
            v = {k: f(x) for k, x in res.items()}
            ratio = v["stream"] / v["cli"]
            print(f"| {name} | {stat} | {t} | {v['cli']:.1f} | {v['stream']:.1f} | {v['server']:.1f} | {ratio * 100:.1f}% | {'' if acc is None else f'{acc:.2f}'} |")
    for name, _, res, _ in rows:
        print(f"raw {name}: " + json.dumps({k: [round(x, 1) for x in v] for k, v in res.items()}))


if __name__ == "__main__":
    main()
