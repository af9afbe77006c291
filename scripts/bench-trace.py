#!/usr/bin/env python3
"""Trace benchmark for speculation that remembers across requests (suffix speculation).

Replays multi-turn coding-assistant conversations against a real `tandem serve`,
one configuration (set of serve flags) at a time, and reports decode tok/s and
draft acceptance overall, per turn and per trace kind. Greedy output must be
identical across configurations; the script checks it.

usage:
  scripts/bench-trace.py [--config NAME=FLAGS ...] [--configs NAME=FLAGS ...]
                         [--bin target/release/tandem] [-m MODEL] [-t 2]
                         [--rounds 1] [--max-tokens 256] [--edits N]
                         [--same-file 3] [--logs 1] [--quick]
                         [--prompts ../shared/bench/prompts-code-dev.jsonl]
                         [--serve-flags FLAGS] [--json OUT] [--out-md FILE] [--list]

  Configurations default to `plain=`, `lookup=--lookup`, `suffix=--suffix`.
  FLAGS are extra `tandem serve` flags, split like a shell would, e.g.
    scripts/bench-trace.py --config plain= --config lookup=--lookup \\
        --config 'mtp+lookup=--mtp models/support/smollm2-135m-instruct-mtp.gguf --lookup'
  The first configuration is the baseline for the speedup and the exactness check.
  Smoke test: scripts/bench-trace.py --quick --max-tokens 64 --config plain= --config lookup=--lookup

Traces (built deterministically from the prompts file; every request is a
non-streaming chat completion with temperature 0 and max_tokens = --max-tokens):
  - edit chains: one per rename/hints/comments prompt (taken round-robin over the
    three kinds, --edits limits the count), three turns: the prompt, a follow-up
    edit of the answer, a final edit; the whole history (with the server's own
    answers) is resent each turn, like a chat client.
  - the same file edited in other conversations: the code of a rename prompt;
    conversation A is the rename prompt; B (fresh, later) asks for the same
    change again, as an agent that retries or a second user would, with a
    different first sentence; C (fresh, later) asks for type hints on the same
    code, worded like the hints prompts. These rename prompts are not used for
    edit chains (A would otherwise repeat an edit chain's first turn).
  - a log summarised twice: a synthetic pytest log (~100 lines); conversation A
    asks for a summary, B (fresh, later) asks again after "the job failed
    again", C (fresh, later) asks for the list of failures instead.
Order on each fresh server: all A conversations, then the edit chains, then all
B conversations, then all C ones, so each comes several requests after its A. One client,
sequential requests. Each configuration gets a fresh server per round; with
--rounds R the configurations alternate round by round (A B C A B C ...) and the
tables show the median over rounds.

Decode tok/s uses the server's `tandem.decode_ms` and its decode-step count
(completion_tokens - 1: the first token comes from the prefill), the same
definition as `tandem.decode_tokens_per_second`; a group's tok/s is its total
steps / total decode time. Acceptance = accepted / drafted tokens, summed.
Exit status 1 if any configuration's replies differ from the first one's.
"""

import argparse
import ast
import http.client
import json
import os
import random
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIGS = ["plain=", "lookup=--lookup", "suffix=--suffix"]
FENCE = re.compile(r"```python\n(.*?)```", re.S)
HINTS_FALLBACK = ("Add type hints to the parameters and return value of this Python function. "
                  "Keep everything else unchanged and reply with the complete function.\n\n")

# ---------------------------------------------------------------------------
# Traces


def load_prompts(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def fenced_code(user):
    m = FENCE.search(user)
    if not m:
        raise SystemExit(f"no ```python fence in prompt: {user[:80]!r}")
    return m.group(1)


def identifiers(code):
    """(function name, parameters, local variables in first-assignment order)."""
    f = ast.parse(code).body[0]
    a = f.args
    params = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    params += [x.arg for x in (a.vararg, a.kwarg) if x]
    local = []
    for n in ast.walk(f):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id not in params and n.id not in local:
            local.append(n.id)
    return f.name, params, local


def rename_something(code):
    """An instruction renaming one identifier: a local variable, else a parameter, else the function."""
    name, params, local = identifiers(code)
    multi = [v for v in local if len(v) > 1]
    if multi or local:
        v = (multi or local)[0]
        return f"the local variable `{v}` to `{v}_new` everywhere"
    ps = [p for p in params if p not in ("self", "cls")]
    if ps:
        return f"the parameter `{ps[0]}` to `{ps[0]}_new` everywhere"
    return f"the function to `{name}_v2`"


def follow_ups(p):
    """The two follow-up user turns of an edit chain, per prompt kind."""
    code = fenced_code(p["user"])
    name, _, _ = identifiers(code)
    hints = "Finally, add type hints to the parameters and the return value, and show the whole function again."
    if p["kind"] == "rename":
        return [f"Now also rename the function to `{name}_v2` and show the whole function again.", hints]
    if p["kind"] == "hints":
        return ["Now add a docstring to the function as well and show the whole function again.",
                f"Finally, rename {rename_something(code)} and show the whole function again."]
    if p["kind"] == "comments":
        return [f"Now rename {rename_something(code)} and show the whole function again.", hints]
    raise ValueError(p["kind"])


def synth_log(prompts, seed):
    """A deterministic pytest-like log: ~100 lines, mostly PASSED lines with small variations."""
    rng = random.Random(seed)
    tests = []
    for p in prompts:
        mod, func = p["source"].split(":")
        mod = mod.removesuffix(".py")
        for variant in ("basic", "edge_cases"):
            tests.append((mod, f"test_{func.lstrip('_')}_{variant}", func))
    seen = set()
    tests = [t for t in tests if not (t in seen or seen.add(t))]
    rng.shuffle(tests)
    tests = tests[:48]
    tests.sort()
    failing = sorted(rng.sample(range(len(tests)), 4))
    skipped = [i for i in rng.sample(range(len(tests)), 3) if i not in failing]
    out = ["============================= test session starts ==============================",
           "platform linux -- Python 3.11.9, pytest-8.2.1, pluggy-1.5.0 -- /usr/bin/python3",
           "cachedir: .pytest_cache",
           "rootdir: /home/dev/stdlib-port",
           "configfile: pyproject.toml",
           "plugins: cov-5.0.0, xdist-3.6.1",
           f"collected {len(tests)} items",
           ""]
    status = {}
    for i, (mod, name, _) in enumerate(tests):
        s = "FAILED" if i in failing else "SKIPPED" if i in skipped else "PASSED"
        status[i] = s
        pct = (i + 1) * 100 // len(tests)
        out.append(f"tests/test_{mod}.py::{name} {s}{' ' * (9 - len(s))}[{pct:3d}%]")
    out += ["", "=================================== FAILURES ==================================="]
    excs = [("AssertionError", "assert {a} == {b}"), ("ValueError", "invalid literal for int() with base 10: '{a}x'"),
            ("AssertionError", "assert {a} == {b}"), ("TypeError", "unsupported operand type(s) for +: 'int' and 'str'")]
    failures = []
    for k, i in enumerate(failing):
        mod, name, func = tests[i]
        exc, msg = excs[k]
        a, b = rng.randint(2, 999), rng.randint(2, 999)
        msg = msg.format(a=a, b=b)
        failures.append((mod, name, exc, msg))
        line = rng.randint(20, 400)
        out += [f"_{'_' * 20} {name} {'_' * 20}", "",
                f"    def {name}():",
                f"        result = {func}(*CASES[{k}])",
                f">       assert result == EXPECTED[{k}]" if exc == "AssertionError" else ">       check(result)",
                f"E       {exc}: {msg}", "",
                f"tests/test_{mod}.py:{line}: {exc}"]
        if k == 0:  # the first traceback is printed twice, as a rerun plugin would
            out += ["----------------------------- Captured log call ------------------------------",
                    f"WARNING  {mod}:{mod}.py:{line + 7} retrying {name} once",
                    f"_{'_' * 20} {name} (rerun) {'_' * 20}", "",
                    f"    def {name}():",
                    f"        result = {func}(*CASES[{k}])",
                    f">       assert result == EXPECTED[{k}]" if exc == "AssertionError" else ">       check(result)",
                    f"E       {exc}: {msg}", "",
                    f"tests/test_{mod}.py:{line}: {exc}"]
    out += ["=============================== warnings summary ==============================="]
    warn_mods = sorted({tests[i][0] for i in rng.sample(range(len(tests)), 4)})
    for mod in warn_mods:
        out += [f"tests/test_{mod}.py::{n}" for m, n, _ in tests if m == mod][:2]
        out += [f"  /home/dev/stdlib-port/{mod}.py:{rng.randint(30, 900)}: DeprecationWarning: "
                f"'{mod}.legacy_mode' is deprecated and will be removed in 3.14", ""]
    out += ["-- Docs: https://docs.pytest.org/en/stable/how-to/capture-warnings.html",
            "=========================== short test summary info ============================"]
    for mod, name, exc, msg in failures:
        out.append(f"FAILED tests/test_{mod}.py::{name} - {exc}: {msg}")
    n_pass = sum(1 for s in status.values() if s == "PASSED")
    out.append(f"============ {len(failing)} failed, {n_pass} passed, {len(skipped)} skipped, "
               f"{len(warn_mods)} warnings in {rng.uniform(1, 9):.2f}s ============")
    return "\n".join(out) + "\n"


def build_traces(prompts, n_edits, n_same, n_logs):
    """Conversations in the order they are sent: A conversations, edit chains, B conversations.

    Each conversation is a dict: id, kind (edit|file-A|file-B|file-C|log-A|log-B|log-C), turns (user texts).
    """
    by_kind = {k: [p for p in prompts if p["kind"] == k] for k in ("rename", "hints", "comments")}
    hints_head = next((p["user"][:FENCE.search(p["user"]).start()] for p in by_kind["hints"]), HINTS_FALLBACK)
    same = by_kind["rename"][::-1][:n_same]  # from the end, leaving the first ones to the edit chains
    used = {p["id"] for p in same}
    pools = [[p for p in by_kind[k] if p["id"] not in used] for k in ("rename", "hints", "comments")]
    edits = []
    for i in range(max(map(len, pools), default=0)):
        edits += [pool[i] for pool in pools if i < len(pool)]
    edits = edits[:n_edits] if n_edits is not None else edits
    a_convs, b_convs, c_convs = [], [], []
    for p in same:
        code = fenced_code(p["user"])
        name = p["id"].removeprefix("code-dev-")
        a_convs.append({"id": f"file-{name}-A", "kind": "file-A", "turns": [p["user"]]})
        b_convs.append({"id": f"file-{name}-B", "kind": "file-B",
                        "turns": [f"Another copy of this file needs the same change. {p['user']}"]})
        c_convs.append({"id": f"file-{name}-C", "kind": "file-C",
                        "turns": [f"{hints_head}```python\n{code}```"]})
    for i in range(n_logs):
        log = synth_log(prompts, seed=i)
        summary = f"Summarise this test log: which tests failed and why?\n\n```\n{log}```"
        a_convs.append({"id": f"log-{i + 1}-A", "kind": "log-A", "turns": [summary]})
        b_convs.append({"id": f"log-{i + 1}-B", "kind": "log-B", "turns": [f"The CI job failed again. {summary}"]})
        c_convs.append({"id": f"log-{i + 1}-C", "kind": "log-C",
                        "turns": [f"List the failing tests and the exception each raised.\n\n```\n{log}```"]})
    chains = [{"id": f"edit-{p['id'].removeprefix('code-dev-')}", "kind": "edit",
               "turns": [p["user"], *follow_ups(p)]} for p in edits]
    return a_convs + chains + b_convs + c_convs


# ---------------------------------------------------------------------------
# Server


def start(bin_, flags, threads):
    """Start `tandem serve` on a free port; returns (process, host, port)."""
    cmd = [bin_, "serve", "--port", "0", "-t", str(threads), *flags]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen = []
    while True:
        line = p.stderr.readline()
        if not line:
            p.wait()
            sys.stderr.write("".join(seen[-20:]))
            raise SystemExit(f"server exited ({p.returncode}): {shlex.join(cmd)}")
        seen.append(line)
        m = re.search(r"listening on http://([\w.\-]+|\[[\da-fA-F:]+\]):(\d+)", line)
        if m:
            threading.Thread(target=p.stderr.read, daemon=True).start()
            return p, m.group(1).strip("[]"), int(m.group(2))


def stop(p):
    p.terminate()
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def chat(host, port, messages, max_tokens):
    body = json.dumps({"model": "m", "messages": messages, "temperature": 0, "max_tokens": max_tokens})
    c = http.client.HTTPConnection(host, port, timeout=3600)
    try:
        c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
    finally:
        c.close()
    if r.status != 200:
        raise SystemExit(f"HTTP {r.status}: {data[:500].decode(errors='replace')}")
    return json.loads(data)


def run_config(name, flags, rnd, traces, a):
    """All traces on one fresh server; returns one record per request."""
    srv, host, port = start(a.bin, flags, a.threads)
    recs = []
    try:
        if not a.no_warmup:  # first-touch costs (page faults, allocations) out of the measurements
            chat(host, port, [{"role": "user", "content": "Say hello."}], 4)
        for conv in traces:
            messages = []
            for turn, user in enumerate(conv["turns"], 1):
                messages.append({"role": "user", "content": user})
                t0 = time.perf_counter()
                v = chat(host, port, messages, a.max_tokens)
                wall = time.perf_counter() - t0
                reply = v["choices"][0]["message"]["content"] or ""
                messages.append({"role": "assistant", "content": reply})
                u, ext = v["usage"], v.get("tandem") or {}
                spec = ext.get("speculative") or {}
                rec = {
                    "config": name, "round": rnd, "trace": conv["id"], "kind": conv["kind"], "turn": turn,
                    "prompt_tokens": u["prompt_tokens"],
                    "cached_tokens": (u.get("prompt_tokens_details") or {}).get("cached_tokens",
                                                                             ext.get("cached_prompt_tokens", 0)),
                    "completion_tokens": u["completion_tokens"],
                    "finish_reason": v["choices"][0].get("finish_reason"),
                    "prefill_ms": ext.get("prefill_ms"), "decode_ms": ext.get("decode_ms"),
                    "decode_tokens_per_second": ext.get("decode_tokens_per_second"),
                    "queue_ms": ext.get("queue_ms"), "wall_s": wall,
                    "drafter": spec.get("drafter"), "cycles": spec.get("cycles", 0),
                    "drafted_tokens": spec.get("drafted_tokens", 0), "accepted_tokens": spec.get("accepted_tokens", 0),
                    "reply": reply,
                }
                recs.append(rec)
                acc = f", acc {rec['accepted_tokens'] / rec['drafted_tokens']:.2f}" if rec["drafted_tokens"] else ""
                print(f"  [{name} r{rnd}] {conv['id']} t{turn}: {rec['prompt_tokens']} prompt "
                      f"({rec['cached_tokens']} cached), {rec['completion_tokens']} gen, "
                      f"{rec['decode_tokens_per_second'] or 0:.1f} tok/s{acc}", file=sys.stderr)
    finally:
        stop(srv)
    return recs


# ---------------------------------------------------------------------------
# Report

COLUMNS = [  # (header, record filter)
    ("edit t1", lambda r: r["kind"] == "edit" and r["turn"] == 1),
    ("edit t2", lambda r: r["kind"] == "edit" and r["turn"] == 2),
    ("edit t3", lambda r: r["kind"] == "edit" and r["turn"] == 3),
    ("edit all", lambda r: r["kind"] == "edit"),
    ("file A", lambda r: r["kind"] == "file-A"),
    ("file B", lambda r: r["kind"] == "file-B"),
    ("file C", lambda r: r["kind"] == "file-C"),
    ("log A", lambda r: r["kind"] == "log-A"),
    ("log B", lambda r: r["kind"] == "log-B"),
    ("log C", lambda r: r["kind"] == "log-C"),
]


def tps(recs):
    steps = sum(max(r["completion_tokens"] - 1, 0) for r in recs)
    secs = sum((r["decode_ms"] or 0) for r in recs) / 1e3
    return steps / secs if secs > 0 else None


def acceptance(recs):
    d = sum(r["drafted_tokens"] for r in recs)
    return sum(r["accepted_tokens"] for r in recs) / d if d else None


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, spec=".1f"):
    return "–" if x is None else format(x, spec)


def report(configs, records, rounds):
    """Markdown tables: medians over rounds of per-round figures."""
    per = {}  # config -> dict of metric -> median
    for name, _ in configs:
        rs = [[r for r in records if r["config"] == name and r["round"] == k] for k in range(1, rounds + 1)]
        m = {"overall": median([tps(x) for x in rs]), "acc": median([acceptance(x) for x in rs])}
        for head, f in COLUMNS:
            m[head] = median([tps([r for r in x if f(r)]) for x in rs])
        m["tpc"] = median([(sum(r["completion_tokens"] for r in x) / c if (c := sum(r["cycles"] for r in x)) else None)
                           for x in rs])
        x = rs[0]
        m["requests"] = len(x)
        m["gen"] = sum(r["completion_tokens"] for r in x)
        m["prompt"] = sum(r["prompt_tokens"] for r in x)
        m["cached"] = sum(r["cached_tokens"] for r in x)
        m["decode_s"] = median([sum(r["decode_ms"] or 0 for r in y) / 1e3 for y in rs])
        m["prefill_s"] = median([sum(r["prefill_ms"] or 0 for r in y) / 1e3 for y in rs])
        m["drafted"] = sum(r["drafted_tokens"] for r in x)
        m["accepted"] = sum(r["accepted_tokens"] for r in x)
        per[name] = m
    base = per[configs[0][0]]["overall"]
    stat = "median of %d rounds" % rounds if rounds > 1 else "1 round"
    lines = [f"Decode tok/s ({stat}); columns after acceptance: edit-chain turns, then trace kinds.", "",
             "| config | tok/s | speedup | acceptance | " + " | ".join(h for h, _ in COLUMNS) + " |",
             "|---|" + "---:|" * (3 + len(COLUMNS))]
    for name, _ in configs:
        m = per[name]
        sp = m["overall"] / base if m["overall"] and base else None
        lines.append(f"| {name} | {fmt(m['overall'])} | {fmt(sp, '.2f') + ('×' if sp else '')} | {fmt(m['acc'], '.3f')} | "
                     + " | ".join(fmt(m[h]) for h, _ in COLUMNS) + " |")
    lines += ["", "Totals (round 1; times are medians over rounds):", "",
              "| config | requests | prompt tok | cached | generated | prefill s | decode s | drafted | accepted | tok/cycle |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, _ in configs:
        m = per[name]
        lines.append(f"| {name} | {m['requests']} | {m['prompt']} | {m['cached']} | {m['gen']} | "
                     f"{m['prefill_s']:.2f} | {m['decode_s']:.2f} | {m['drafted']} | {m['accepted']} | "
                     f"{fmt(m['tpc'], '.2f')} |")
    return "\n".join(lines)


def exactness(configs, records):
    """Every reply compared with the first configuration's round-1 reply; returns the differences."""
    key = lambda r: (r["trace"], r["turn"])
    ref = {key(r): r["reply"] for r in records if r["config"] == configs[0][0] and r["round"] == 1}
    diffs = []
    for r in records:
        want = ref.get(key(r))
        if want is None or r["reply"] == want:
            continue
        got = r["reply"]
        i = next((k for k, (x, y) in enumerate(zip(want, got)) if x != y), min(len(want), len(got)))
        diffs.append(f"- {r['config']} round {r['round']}: {r['trace']} turn {r['turn']}: first difference at "
                     f"char {i}: expected {want[max(0, i - 20):i + 30]!r}, got {got[max(0, i - 20):i + 30]!r}")
    return diffs


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def parse_configs(items):
    out = []
    for it in items:
        name, sep, flags = it.partition("=")
        if not sep or not name:
            raise SystemExit(f"bad configuration {it!r}: expected NAME=FLAGS")
        if any(n == name for n, _ in out):
            raise SystemExit(f"duplicate configuration name {name!r}")
        out.append((name, shlex.split(flags)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="See the module docstring for the traces and the measures.")
    ap.add_argument("--config", action="append", default=[], metavar="NAME=FLAGS",
                    help="a configuration: name and extra `tandem serve` flags (repeatable)")
    ap.add_argument("--configs", nargs="+", default=[], metavar="NAME=FLAGS", help="several configurations at once")
    ap.add_argument("--bin", default=str(ROOT / "target/release/tandem"))
    ap.add_argument("-m", "--model", help="passed to serve as -m (default: the server's default model)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--serve-flags", default="", help="extra serve flags for every configuration")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=256, help="max_tokens per turn")
    ap.add_argument("--edits", type=int, help="number of edit chains (default: all)")
    ap.add_argument("--same-file", type=int, default=3, help="same-file conversation pairs")
    ap.add_argument("--logs", type=int, default=1, help="log conversation pairs")
    ap.add_argument("--quick", action="store_true", help="smoke test: 2 edit chains, 1 same-file pair, 1 log pair")
    ap.add_argument("--prompts", default=str(ROOT.parent / "shared/bench/prompts-code-dev.jsonl"))
    ap.add_argument("--no-warmup", action="store_true", help="skip the short warm-up request on each server")
    ap.add_argument("--list", action="store_true", help="print the conversations and exit (no server)")
    ap.add_argument("--json", help="write every request's record (replies included) here")
    ap.add_argument("--out-md", help="also write the Markdown report here")
    a = ap.parse_args()
    if a.quick:
        a.edits, a.same_file, a.logs = 2, 1, 1
    configs = parse_configs(a.config + a.configs or DEFAULT_CONFIGS)
    common = shlex.split(a.serve_flags) + (["-m", a.model] if a.model else [])
    traces = build_traces(load_prompts(a.prompts), a.edits, a.same_file, a.logs)

    n_req = sum(len(c["turns"]) for c in traces)
    kinds = {}
    for c in traces:
        kinds[c["kind"]] = kinds.get(c["kind"], 0) + 1
    print(f"{len(traces)} conversations ({', '.join(f'{v} {k}' for k, v in kinds.items())}), "
          f"{n_req} requests per configuration and round", file=sys.stderr)
    if a.list:
        for c in traces:
            print(f"{c['id']:<28} {c['kind']:<7} " + " | ".join(f"t{i}: {len(u)} chars" for i, u in enumerate(c["turns"], 1)))
            for i, u in enumerate(c["turns"][1:], 2):
                print(f"{'':<37}t{i}: {u}")
        return

    records = []
    for rnd in range(1, a.rounds + 1):
        for name, flags in configs:
            print(f"round {rnd}/{a.rounds}: {name} ({shlex.join(flags) or 'no flags'})", file=sys.stderr)
            records += run_config(name, common + flags, rnd, traces, a)

    diffs = exactness(configs, records)
    cmdline = shlex.join([sys.argv[0], *sys.argv[1:]])
    md = "\n".join([
        f"CPU: {cpu_model()} ({os.cpu_count()} logical CPUs), -t {a.threads}",
        f"command: {cmdline}",
        f"configurations: " + "; ".join(f"{n} = `{shlex.join(common + f)}`" for n, f in configs),
        f"traces: {len(traces)} conversations, {n_req} requests, max_tokens {a.max_tokens}", "",
        report(configs, records, a.rounds), "",
        "Exactness: " + ("all replies identical to the first configuration's." if not diffs
                         else f"{len(diffs)} replies differ from the first configuration's:"),
        *diffs,
    ])
    print(md)
    if a.out_md:
        Path(a.out_md).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out_md).write_text(md + "\n")
    if a.json:
        meta = {"command": cmdline, "cpu": cpu_model(), "threads": a.threads, "max_tokens": a.max_tokens,
                "rounds": a.rounds, "configs": {n: common + f for n, f in configs},
                "traces": traces, "exactness_differences": diffs}
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"meta": meta, "requests": records}, indent=1))
    sys.exit(1 if diffs else 0)


if __name__ == "__main__":
    main()
