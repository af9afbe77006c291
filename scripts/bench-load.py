#!/usr/bin/env python3
"""Many clients against one server: `tandem serve --parallel P`, and
llama-server with the same number of slots, on the same load.

For each client count (default 1, 2, 4, 8, 16) the same requests (every
prompt of the set, repeated to at least --per-client per client) are shared out
to that many concurrent streaming clients, each taking the next request as
it finishes its last. Reported per level: aggregate generated tokens per
second (all completion tokens over the level's wall time), time to first
token and inter-token time (gaps between content chunks) at p50 and p99,
and how many answers are complete and equal to the one-client answer for
the same prompt (greedy decoding: a server whose output does not depend on
the batch answers every request the same at every level).

With --long-prompt it also measures what a 2,000-token prompt arriving
while 4 clients decode does to their inter-token p99 (the prompt is
evaluated in chunks between their steps).

usage: scripts/bench-load.py [-m MODEL] [--clients 1,2,4,8,16] [--parallel 8]
                             [-n 128] [--prompts FILE] [--llama-server auto|none|PATH]
                             [--long-prompt] [--only-long] [--out-md FILE] [--json FILE] [--quick]
"""

import argparse
import http.client
import json
import math
import os
import queue
import re
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
BIN = os.path.join(ROOT, "target", "release", "tandem")


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


class Server:
    """A server process on a free port; `kind` is tandem or llama."""

    def __init__(self, kind, cmd, ready_re, port=None):
        self.kind = kind
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log = []
        deadline = time.time() + 600
        self.host, self.port = "127.0.0.1", port
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                raise SystemExit(f"{kind} server exited:\n" + "".join(self.log[-20:]))
            self.log.append(line)
            m = re.search(ready_re, line)
            if m:
                if m.groups():
                    self.host, self.port = m.group(1), int(m.group(2))
                break
        threading.Thread(target=self._drain, daemon=True).start()
        if kind == "llama":
            # llama-server answers /health with 503 while the model loads
            while time.time() < deadline:
                try:
                    c = http.client.HTTPConnection(self.host, self.port, timeout=5)
                    c.request("GET", "/health")
                    if c.getresponse().status == 200:
                        break
                except OSError:
                    pass
                time.sleep(0.2)

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)
            if len(self.log) > 2000:
                del self.log[:1000]

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def stream(server, body, path="/v1/chat/completions"):
    """One streaming request: (text, completion tokens, ttft, gaps, finish)."""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    c = http.client.HTTPConnection(server.host, server.port, timeout=1200)
    t0 = time.perf_counter()
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        return None, 0, None, [], f"HTTP {r.status}: {r.read()[:200]!r}"
    text, usage, finish, times = "", None, None, []
    for raw in r:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        v = json.loads(line[6:])
        if v.get("usage"):
            usage = v["usage"]
        for ch in v.get("choices") or []:
            piece = (ch.get("delta") or {}).get("content") if "delta" in ch else ch.get("text")
            if piece:
                text += piece
                times.append(time.perf_counter())
            finish = ch.get("finish_reason") or finish
    c.close()
    n = usage["completion_tokens"] if usage else len(times)
    ttft = times[0] - t0 if times else None
    gaps = [b - a for a, b in zip(times, times[1:])]
    return text, n, ttft, gaps, finish


def level(server, jobs, clients):
    """Run `jobs` (prompt index, body) over `clients` concurrent clients."""
    q = queue.Queue()
    for j in jobs:
        q.put(j)
    results, lock = [], threading.Lock()

    def client():
        while True:
            try:
                idx, body = q.get_nowait()
            except queue.Empty:
                return
            r = stream(server, body)
            with lock:
                results.append((idx,) + r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.perf_counter() - t0


def run_level(server, prompts, args, model_name, k, ref):
    """One level: the shared requests over k clients. `ref` holds the
    one-client answers (filled by the first one-client level)."""
    body = lambda p: {"model": model_name, "messages": [{"role": "user", "content": p}], "temperature": 0, "max_tokens": args.n}
    total = max(len(prompts), args.per_client * k)
    jobs = [(i % len(prompts), body(prompts[i % len(prompts)])) for i in range(total)]
    results, wall = level(server, jobs, k)
    if k == 1 and not ref:
        for r in results:
            ref.setdefault(r[0], r[1])
    return {
        "clients": k, "requests": len(results), "tokens": sum(r[2] for r in results), "wall_s": wall,
        "ttft": [r[3] for r in results if r[3] is not None], "gaps": [g for r in results for g in r[4]],
        "lost": sum(1 for r in results if r[1] is None or r[5] not in ("stop", "length")),
        "same": sum(1 for r in results if r[1] is not None and ref.get(r[0]) == r[1]),
    }


def summarize(kind, runs, clients):
    """Per level over the rounds: median tok/s, median ratio to the same
    round's one-client rate, latencies pooled over the rounds."""
    rows = []
    for k in clients:
        mine = [r for r in runs if r["clients"] == k]
        tps = [r["tokens"] / r["wall_s"] for r in mine]
        ratios = []
        for rnd, r in enumerate(mine):
            one = [x for x in runs if x["clients"] == 1 and x["round"] == r["round"]]
            if one:
                ratios.append((r["tokens"] / r["wall_s"]) / (one[0]["tokens"] / one[0]["wall_s"]))
        ttft = [t for r in mine for t in r["ttft"]]
        gaps = [g for r in mine for g in r["gaps"]]
        rows.append({
            "server": kind, "clients": k, "rounds": len(mine), "requests": sum(r["requests"] for r in mine),
            "tok_s": statistics.median(tps), "tok_s_all": tps,
            "speedup": statistics.median(ratios) if ratios else float("nan"), "speedups": ratios,
            "ttft_p50_ms": pct(ttft, 50) * 1e3, "ttft_p99_ms": pct(ttft, 99) * 1e3,
            "itl_p50_ms": pct(gaps, 50) * 1e3, "itl_p99_ms": pct(gaps, 99) * 1e3,
            "lost": sum(r["lost"] for r in mine), "equal_to_one_client": sum(r["same"] for r in mine),
        })
    return rows


LONG_ANSWERS = [
    "Write a detailed story about a lighthouse keeper who finds a message in a bottle.",
    "Write a long essay about the history of the printing press.",
    "Describe, step by step and in detail, how to bake a loaf of sourdough bread.",
    "Write a detailed travel guide to a city of your choice, with many recommendations.",
]


def long_prompt(server, prompts, args, model_name):
    """4 clients decode; then again with a 2,000-token prompt arriving."""
    text = open(os.path.join(ROOT, "tests", "data", "perplexity_text_python.txt")).read()
    body = lambda p: {"model": model_name, "messages": [{"role": "user", "content": p}], "temperature": 0,
                      "max_tokens": args.long_n}
    out = {}
    for with_long in (False, True, False, True):
        results = [None] * 4
        long_info = {}

        def dec(i):
            results[i] = stream(server, body(LONG_ANSWERS[i]))

        def longreq():
            time.sleep(args.long_delay)
            # a fresh prefix each time, so nothing of it is cached
            salt = f"# run {time.time_ns()}\n"
            r = stream(server, {"model": model_name, "prompt": salt + text[: args.long_chars], "temperature": 0,
                                "max_tokens": 1}, "/v1/completions")
            long_info["ttft"] = r[2]

        ts = [threading.Thread(target=dec, args=(i,)) for i in range(4)]
        if with_long:
            ts.append(threading.Thread(target=longreq))
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        gaps = [g for r in results for g in r[3]]
        key = "with" if with_long else "without"
        out.setdefault(key, []).append({"itl_p50_ms": pct(gaps, 50) * 1e3, "itl_p99_ms": pct(gaps, 99) * 1e3,
                                        "itl_max_ms": max(gaps) * 1e3, "long_ttft_s": long_info.get("ttft")})
    best = lambda k, f: min(x[f] for x in out[k])
    res = {"server": server.kind, "without_p99_ms": best("without", "itl_p99_ms"), "with_p99_ms": best("with", "itl_p99_ms"),
           "without_p50_ms": best("without", "itl_p50_ms"), "with_p50_ms": best("with", "itl_p50_ms"),
           "long_ttft_s": min(x["long_ttft_s"] or float("nan") for x in out["with"]), "runs": out}
    res["ratio"] = res["with_p99_ms"] / res["without_p99_ms"]
    print(f"  {server.kind}: 4 decoding clients, ITL p99 {res['without_p99_ms']:.1f} ms alone, "
          f"{res['with_p99_ms']:.1f} ms with a long prompt arriving ({res['ratio']:.2f}x); "
          f"the long prompt's first token after {res['long_ttft_s']:.2f} s", flush=True)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("--clients", default="1,2,4,8,16")
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096, help="context per slot")
    ap.add_argument("--prompts", default=os.path.join(ROOT, "tests", "data", "prompts-dev.jsonl"))
    ap.add_argument("--llama-server", default="auto", help="auto (build with scripts/build-llama-cpp.sh), none, or a path")
    ap.add_argument("--long-prompt", action="store_true")
    ap.add_argument("--only-long", action="store_true")
    ap.add_argument("--long-chars", type=int, default=7000, help="characters of the long prompt (about 2,000 tokens)")
    ap.add_argument("--long-n", type=int, default=200)
    ap.add_argument("--long-delay", type=float, default=0.5)
    ap.add_argument("--extra", default="", help="more tandem serve flags, e.g. --extra=--suffix")
    ap.add_argument("--bin", default=BIN)
    ap.add_argument("--out-md")
    ap.add_argument("--json")
    ap.add_argument("--per-client", type=int, default=8,
                    help="requests per client at least (the level's end, where fewer clients are left, is then a small part)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of all levels, alternating the servers")
    ap.add_argument("--quick", action="store_true", help="8 prompts, 48 tokens, clients 1,4,8, one round")
    args = ap.parse_args()
    args.clients = [int(x) for x in args.clients.split(",")]
    prompts = [json.loads(l)["user"] for l in open(args.prompts) if l.strip() and '"user"' in l]
    if args.quick:
        prompts, args.n, args.clients, args.rounds, args.per_client = prompts[:8], 48, [1, 4, 8], 1, 3

    # the model file (llama-server needs it): a catalogue name is fetched first
    files = {"smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf", "qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"}
    path = args.model
    if not os.path.exists(path):
        subprocess.run([args.bin, "-m", args.model, "-p", "hi", "-n", "1"], capture_output=True, check=True)
        mdir = os.environ.get("TANDEM_MODELS_DIR", os.path.join(ROOT, "models"))
        path = os.path.join(mdir, files.get(args.model, args.model))
    name = os.path.basename(path)
    print(f"model {name}; {args.parallel} slots of {args.ctx} positions; {len(prompts)} prompts, {args.n} tokens each", flush=True)

    label = "tandem " + args.extra if args.extra else "tandem"
    servers = [("tandem", lambda: Server(label, [args.bin, "serve", "-m", args.model, "--port", "0", "-t", str(args.threads),
                                                    "--ctx", str(args.ctx), "--parallel", str(args.parallel),
                                                    "--max-queue", "64", *args.extra.split()],
                                         r"listening on http://([\d.]+):(\d+)"))]
    llama = args.llama_server
    if llama == "auto":
        b = subprocess.run([os.path.join(ROOT, "scripts", "build-llama-cpp.sh"), "llama-server"], capture_output=True, text=True)
        llama = os.path.join(b.stdout.strip(), "llama-server") if b.returncode == 0 else "none"
        if llama == "none":
            print("llama-server could not be built; tandem only:\n" + b.stderr[-2000:], flush=True)
    if llama != "none" and path:
        import socket
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        servers.append(("llama", lambda: Server("llama", [llama, "-m", path, "--port", str(port), "-t", str(args.threads),
                                                          "-c", str(args.ctx * args.parallel), "-np", str(args.parallel),
                                                          "--no-webui"],
                                                r"server is listening|HTTP server listening|listening on", port)))
    report = {"model": name, "parallel": args.parallel, "ctx": args.ctx, "n": args.n, "prompts": len(prompts),
              "rounds": args.rounds, "levels": [], "long": []}
    started = []
    try:
        for kind, make in servers:
            started.append(make())
        body = {"model": name, "messages": [{"role": "user", "content": prompts[0]}], "temperature": 0, "max_tokens": args.n}
        for srv in started:
            # warm up (the first forwards of each width pay for page faults)
            stream(srv, body)
        if not args.only_long:
            runs = {srv.kind: [] for srv in started}
            refs = {srv.kind: {} for srv in started}
            # rounds alternate the servers; within a round, every level in turn
            for rnd in range(args.rounds):
                for srv in started:
                    for k in args.clients:
                        r = run_level(srv, prompts, args, name, k, refs[srv.kind])
                        r["round"] = rnd
                        runs[srv.kind].append(r)
                        print(f"  round {rnd + 1} {srv.kind:8} {k:2} clients: {r['tokens'] / r['wall_s']:7.1f} tok/s, "
                              f"{r['same']}/{r['requests']} equal to one client, {r['lost']} lost", flush=True)
            for srv in started:
                report["levels"] += summarize(srv.kind, runs[srv.kind], args.clients)
        if args.long_prompt or args.only_long:
            for srv in started:
                report["long"].append(long_prompt(srv, prompts, args, name))
    finally:
        for srv in started:
            srv.close()

    md = []
    if report["levels"]:
        md.append(f"{name}, {args.parallel} slots, {len(prompts)} prompts, ≥{args.per_client} requests per client, {args.n} tokens, greedy, streaming; "
                  f"medians of {args.rounds} rounds (× 1 client: the median of each round's ratio), latencies pooled\n")
        md.append("| server | clients | requests | tok/s | × 1 client (range) | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | equal to 1-client answer | lost |")
        md.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in report["levels"]:
            rng = f"{min(r['speedups']):.2f}–{max(r['speedups']):.2f}" if r["speedups"] else ""
            md.append(f"| {r['server']} | {r['clients']} | {r['requests']} | {r['tok_s']:.1f} | {r['speedup']:.2f}× ({rng}) | "
                      f"{r['ttft_p50_ms']:.0f} / {r['ttft_p99_ms']:.0f} | {r['itl_p50_ms']:.1f} / {r['itl_p99_ms']:.1f} | "
                      f"{r['equal_to_one_client']}/{r['requests']} | {r['lost']} |")
    if report["long"]:
        md.append("\nA ~2,000-token prompt arriving while 4 clients decode (best of 2 runs each way):\n")
        md.append("| server | ITL p50 / p99 without (ms) | ITL p50 / p99 with (ms) | p99 ratio | long prompt's first token (s) |")
        md.append("|---|---:|---:|---:|---:|")
        for r in report["long"]:
            md.append(f"| {r['server']} | {r['without_p50_ms']:.1f} / {r['without_p99_ms']:.1f} | {r['with_p50_ms']:.1f} / "
                      f"{r['with_p99_ms']:.1f} | {r['ratio']:.2f}× | {r['long_ttft_s']:.2f} |")
    text = "\n".join(md) + "\n"
    print("\n" + text)
    if args.out_md:
        open(args.out_md, "w").write(text)
    if args.json:
        json.dump(report, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())
