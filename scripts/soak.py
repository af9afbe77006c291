#!/usr/bin/env python3
"""Soak test: mixed requests from several clients against the real
`tandem serve` on loopback, for a fixed time, with random cancellations.

Every answer is checked: JSON bodies parse and carry what the OpenAI API
promises (choices, finish_reason, usage), streams end with [DONE], and a
greedy request returns the same text every time it is sent. Reports
requests served, errors by kind, latency percentiles and server RSS per
minute (or per --window seconds), writes bench-out/soak/report.{json,md},
and exits non-zero on any lost or malformed answer, any 5xx, or RSS growth
of 32 MiB or more from the end of the first window to the end.

    scripts/soak.py --seconds 600            # the 10-minute soak
    scripts/soak.py --seconds 60 --window 10 # what CI runs
"""

import argparse
import http.client
import json
import os
import random
import re
import subprocess
import sys
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
BIN = os.environ.get("TANDEM_BIN", os.path.join(ROOT, "target", "release", "tandem"))

PROMPTS = [
    "List the planets of the solar system, one per line.",
    "Write a haiku about the sea.",
    "Explain what a hash map is in two sentences.",
    "Give three tips for writing clear emails.",
    "Write a Python function that reverses a string.",
    "Name five animals that live in the desert.",
    "What is the capital of France? Answer in one word.",
    "Summarise: the quick brown fox jumps over the lazy dog. " * 20,
]

RSS_LIMIT_MIB = 32

# Eight slots, and a K/V budget small enough that the prefix cache (which
# keeps prompts for reuse and grows to its budget by design) fills within the
# first minute: RSS growth after that is what a leak would show.
DEFAULT_SERVER_ARGS = ["--parallel", "8", "--ctx", "2048", "--kv-budget", "256M"]


def kv_bytes(host, port):
    """Bytes of K/V the server holds (live slots + kept prefixes), from /metrics."""
    try:
        conn = http.client.HTTPConnection(host, port, timeout=30)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
    except (OSError, http.client.HTTPException):
        return None
    total = 0
    for name in ("tandem_prefix_cache_bytes", "tandem_kv_live_bytes"):
        m = re.search(rf"^{name} (\d+)", text, re.M)
        if m:
            total += int(m.group(1))
    return total


def percentile(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


class Soak:
    def __init__(self, host, port, seconds, seed):
        self.host, self.port = host, port
        self.stop_at = time.time() + seconds
        self.start = time.time()
        self.lock = threading.Lock()
        self.events = []  # (t, kind, latency_s, detail)
        self.greedy_answers = {}  # key -> text
        self.seed = seed

    def record(self, kind, latency, detail=""):
        with self.lock:
            self.events.append((time.time() - self.start, kind, latency, detail))

    def request(self, rng):
        """One random request; returns (kind, detail)."""
        prompt = rng.choice(PROMPTS)
        endpoint = rng.choice(["chat", "chat", "chat", "completion"])
        stream = rng.random() < 0.5
        greedy = rng.random() < 0.6
        max_tokens = rng.choice([8, 16, 32, 64, 128])
        body = {"model": "tandem", "max_tokens": max_tokens, "stream": stream}
        if greedy:
            body["temperature"] = 0
        else:
            body.update(temperature=0.8, top_p=0.95, seed=rng.randrange(1 << 30))
        if endpoint == "chat":
            path = "/v1/chat/completions"
            body["messages"] = [{"role": "user", "content": prompt}]
            if rng.random() < 0.2:
                body.update(logprobs=True, top_logprobs=rng.choice([0, 1, 5]))
        else:
            path = "/v1/completions"
            body["prompt"] = prompt
        if rng.random() < 0.2:
            body["stop"] = rng.choice([["\n\n"], ["."], ["Mars", "Venus"]])
        if stream:
            body["stream_options"] = {"include_usage": True}
        cancel = stream and rng.random() < 0.25
        key = json.dumps(body, sort_keys=True) if greedy else None

        conn = http.client.HTTPConnection(self.host, self.port, timeout=300)
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            r = conn.getresponse()
            if r.status == 503:
                r.read()
                return "busy_503", ""
            if r.status >= 500:
                return "http_5xx", f"{r.status} {r.read()[:200]!r}"
            if r.status != 200:
                return "http_4xx", f"{r.status} {r.read()[:200]!r}"
            if not stream:
                try:
                    j = json.loads(r.read())
                except ValueError as e:
                    return "malformed", f"non-JSON body: {e}"
                return self.check_full(j, endpoint, key, body)
            # streaming: read events; maybe cancel partway
            text = []
            finish = None
            usage = None
            cut_after = rng.randrange(1, 6) if cancel else None
            events = 0
            done = False
            for raw in r:
                line = raw.decode("utf-8", "strict").rstrip("\r\n")
                if not line or line.startswith(":"):
                    continue
                if not line.startswith("data: "):
                    return "malformed", f"stream line {line[:80]!r}"
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    break
                try:
                    ev = json.loads(data)
                except ValueError:
                    return "malformed", f"stream event not JSON: {data[:80]!r}"
                if "error" in ev:
                    return "stream_error", str(ev["error"])[:200]
                events += 1
                for ch in ev.get("choices", []):
                    piece = ch.get("delta", {}).get("content") if endpoint == "chat" else ch.get("text")
                    if piece:
                        text.append(piece)
                    if ch.get("finish_reason"):
                        finish = ch["finish_reason"]
                if ev.get("usage"):
                    usage = ev["usage"]
                if cut_after is not None and events >= cut_after:
                    conn.close()
                    return "cancelled", ""
            if not done:
                return "lost", "stream ended without [DONE]"
            if finish not in ("stop", "length"):
                return "malformed", f"finish_reason {finish!r}"
            if not usage or usage.get("completion_tokens", -1) < 0 or usage["completion_tokens"] > max_tokens:
                return "malformed", f"usage {usage!r}"
            return self.check_greedy(key, "".join(text))
        except (ConnectionError, http.client.HTTPException, TimeoutError, OSError) as e:
            return "lost", repr(e)[:200]
        finally:
            conn.close()

    def check_full(self, j, endpoint, key, body):
        try:
            ch = j["choices"][0]
            text = ch["message"]["content"] if endpoint == "chat" else ch["text"]
            finish = ch["finish_reason"]
            u = j["usage"]
        except (KeyError, IndexError, TypeError) as e:
            return "malformed", f"missing field {e}"
        if not isinstance(text, str) or finish not in ("stop", "length"):
            return "malformed", f"text/finish {type(text)} {finish!r}"
        if u["completion_tokens"] > body["max_tokens"] or u["total_tokens"] != u["prompt_tokens"] + u["completion_tokens"]:
            return "malformed", f"usage {u}"
        if body.get("logprobs"):
            # one entry per returned token: all of them, less the tokens a
            # stop string cut (a stop string can span several tokens)
            lp = (ch.get("logprobs") or {}).get("content")
            n = u["completion_tokens"]
            if lp is None or not (len(lp) == n or (finish == "stop" and len(lp) < n)):
                return "malformed", f"{len(lp) if lp is not None else None} logprobs for {n} tokens ({finish})"
        return self.check_greedy(key, text)

    def check_greedy(self, key, text):
        if key is None:
            return "ok", ""
        with self.lock:
            first = self.greedy_answers.setdefault(key, text)
        if first != text:
            return "malformed", f"greedy answer changed: {first[:60]!r} vs {text[:60]!r}"
        return "ok", ""

    def client(self, i):
        rng = random.Random(self.seed * 1000 + i)
        while time.time() < self.stop_at:
            t0 = time.time()
            kind, detail = self.request(rng)
            self.record(kind, time.time() - t0, detail)
            if kind == "busy_503":
                time.sleep(0.5)


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--window", type=float, default=60, help="seconds per reporting window")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench-out", "soak"))
    ap.add_argument("server_args", nargs="*", help="`tandem serve` arguments (after --); default: " + " ".join(DEFAULT_SERVER_ARGS))
    a = ap.parse_args()
    if not a.server_args:
        a.server_args = DEFAULT_SERVER_ARGS

    args = [BIN, "serve", "--host", "127.0.0.1", "--port", "0", "-t", "2", *a.server_args]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    port = None
    log = []
    deadline = time.time() + 300
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        log.append(line)
        m = re.search(r"listening on http://[\d.]+:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    if port is None:
        print("".join(log), file=sys.stderr)
        sys.exit("tandem serve did not start")
    threading.Thread(target=lambda: [log.append(l) for l in proc.stderr], daemon=True).start()

    soak = Soak("127.0.0.1", port, a.seconds, a.seed)
    rss = [(0.0, rss_kib(proc.pid))]
    kv = [(0.0, kv_bytes("127.0.0.1", port))]

    def sample():
        while time.time() < soak.stop_at:
            time.sleep(min(5, a.window / 2))
            rss.append((time.time() - soak.start, rss_kib(proc.pid)))
            kv.append((time.time() - soak.start, kv_bytes("127.0.0.1", port)))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    clients = [threading.Thread(target=soak.client, args=(i,)) for i in range(a.clients)]
    for c in clients:
        c.start()
    for c in clients:
        c.join()
    end_rss = rss_kib(proc.pid)
    rss.append((time.time() - soak.start, end_rss))
    kv.append((time.time() - soak.start, kv_bytes("127.0.0.1", port)))
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()

    # per-window figures
    windows = []
    n_windows = max(1, int(round(a.seconds / a.window)))
    for w in range(n_windows):
        lo, hi = w * a.window, (w + 1) * a.window
        evs = [e for e in soak.events if lo <= e[0] < hi or (w == n_windows - 1 and e[0] >= hi)]
        lat = [e[2] for e in evs if e[1] == "ok"]
        rs = [r for t, r in rss if r is not None and t <= hi + 0.01]
        ks = [k for t, k in kv if k is not None and t <= hi + 0.01]
        windows.append({
            "window": w + 1,
            "end_s": hi,
            "requests": len(evs),
            "ok": sum(1 for e in evs if e[1] == "ok"),
            "cancelled": sum(1 for e in evs if e[1] == "cancelled"),
            "p50_s": percentile(lat, 50),
            "p99_s": percentile(lat, 99),
            "rss_mib": rs[-1] / 1024 if rs else None,
            "kv_mib": ks[-1] / 2**20 if ks else None,
        })
    kinds = {}
    for e in soak.events:
        kinds[e[1]] = kinds.get(e[1], 0) + 1
    failures = [e for e in soak.events if e[1] in ("lost", "malformed", "http_5xx", "stream_error", "http_4xx")]
    rss_first = windows[0]["rss_mib"]
    rss_last = end_rss / 1024 if end_rss else None
    growth = (rss_last - rss_first) if (rss_first is not None and rss_last is not None) else None
    report = {
        "seconds": a.seconds,
        "clients": a.clients,
        "server_args": a.server_args,
        "requests": len(soak.events),
        "by_kind": kinds,
        "rss_start_mib": rss[0][1] / 1024 if rss[0][1] else None,
        "rss_end_of_first_window_mib": rss_first,
        "rss_end_mib": rss_last,
        "rss_growth_mib": growth,
        "windows": windows,
        "failures": [{"t": round(e[0], 1), "kind": e[1], "detail": e[3]} for e in failures[:50]],
        "distinct_greedy_requests": len(soak.greedy_answers),
    }
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "report.json"), "w") as f:
        json.dump(report, f, indent=2)
    lines = [
        f"Soak: {a.clients} clients, {a.seconds:.0f} s, `tandem serve {' '.join(a.server_args)}` (default model, 2 threads, loopback).",
        "",
        f"Requests: {len(soak.events)} — " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) + ".",
        f"RSS: {report['rss_start_mib']:.1f} MiB at start, {rss_first:.1f} MiB after the first window, {rss_last:.1f} MiB at the end (growth {growth:+.1f} MiB).",
        "",
        "| window | ends at | requests | ok | cancelled | p50 latency | p99 latency | RSS | of which K/V |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for w in windows:
        p50 = f"{w['p50_s']:.2f} s" if w["p50_s"] is not None else "-"
        p99 = f"{w['p99_s']:.2f} s" if w["p99_s"] is not None else "-"
        rs = f"{w['rss_mib']:.1f} MiB" if w["rss_mib"] is not None else "-"
        kvs = f"{w['kv_mib']:.1f} MiB" if w["kv_mib"] is not None else "-"
        lines.append(f"| {w['window']} | {w['end_s']:.0f} s | {w['requests']} | {w['ok']} | {w['cancelled']} | {p50} | {p99} | {rs} | {kvs} |")
    md = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write(md)
    print(md)
    for e in failures[:20]:
        print(f"  {e[0]:7.1f} s  {e[1]}: {e[3]}", file=sys.stderr)
    bad = len(failures)
    if bad:
        print(f"FAIL: {bad} lost, malformed or error answers", file=sys.stderr)
    if growth is None or growth >= RSS_LIMIT_MIB:
        print(f"FAIL: RSS growth {growth} MiB (limit {RSS_LIMIT_MIB})", file=sys.stderr)
        bad += 1
    if kinds.get("ok", 0) == 0:
        print("FAIL: no request succeeded", file=sys.stderr)
        bad += 1
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
