#!/usr/bin/env python3
"""The code benchmark: plain decoding against each speculative mode on the
code-dev prompts (complete, rename, hints, comments, explain), one
`tandem bench --prompts` per mode (each interleaves its own plain run per
prompt), then one table per kind and overall and two SVG plots.

    scripts/bench-code.py [-m qwen2.5-coder-0.5b] [-n 128] [--rounds 1]
        [--mode NAME=FLAGS ...] [--out bench-out/code]

Default modes: lookup (n-grams 1..8), suffix, and for every drafter the
catalogue names for the model (`tandem models`), the drafter alone, with
lookup in front and with suffix trees in front. Writes OUT/summary.md, OUT/speedup-by-kind.svg,
OUT/acceptance-by-position.svg and each mode's own files under OUT/NAME/.
Fails if any speculative output differs from plain decoding.
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = ["complete", "rename", "hints", "comments", "explain"]
COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f"]


def drafters_of(binary, model):
    """Drafter names `tandem models` lists under the model's entry."""
    out = subprocess.run([binary, "models"], capture_output=True, text=True, check=True).stdout
    names, inside = [], False
    for line in out.splitlines():
        if line.startswith("  --drafter"):
            if inside:
                names.append(line.split()[1])
        elif line and not line.startswith(" "):
            inside = line.split()[0] == model
    return names


def run_mode(binary, args, name, flags):
    out = os.path.join(args.out, name)
    cmd = [binary, "bench", "-m", args.model, "--prompts", args.prompts, "-n", str(args.n), "--threads", str(args.threads),
           "--spec-stats", "--rounds", str(args.rounds), "--out-dir", out] + flags
    print(f"== {name}: {' '.join(shlex.quote(c) for c in cmd)}", file=sys.stderr, flush=True)
    log = subprocess.run(cmd, capture_output=True, text=True)
    with open(os.path.join(args.out, f"{name}.log"), "w") as f:
        f.write(log.stdout + log.stderr)
    if log.returncode != 0:
        sys.exit(f"{name}: tandem bench failed:\n{log.stderr[-2000:]}")
    rounds = [os.path.join(out, f"round-{r}", "prompts.json") for r in range(1, args.rounds + 1)]
    files = [p for p in rounds if os.path.exists(p)] or [os.path.join(out, "prompts.json")]
    return [json.load(open(p))["report"] for p in files]


def kind_row(reports, kind):
    """Median over rounds of plain tok/s, spec tok/s, speedup and committed per cycle."""
    rows = []
    for r in reports:
        c = r["overall"] if kind == "overall" else next((c for c in r["categories"] if c["category"] == kind), None)
        if c:
            rows.append(c)
    if not rows:
        return None
    med = lambda k: statistics.median(c[k] for c in rows if c.get(k) is not None)
    return {"plain": med("plain_tps"), "spec": med("spec_tps"), "speedup": med("speedup"),
            "committed": med("mean_committed"), "acceptance": med("acceptance"),
            "identical": sum(c["identical"] for c in rows), "prompts": sum(c["prompts"] for c in rows)}


def per_position(reports):
    acc, ver = [], []
    for r in reports:
        s = r.get("spec_stats") or {}
        for i, (a, v) in enumerate(zip(s.get("pos_accepted", []), s.get("pos_verified", []))):
            while len(acc) <= i:
                acc.append(0)
                ver.append(0)
            acc[i] += a
            ver[i] += v
    return [(a / v if v else None, v) for a, v in zip(acc, ver)]


def bars_svg(title, groups, series, values, ymax, fmt, ref=None):
    """Grouped bars: values[s][g] for series s over groups g."""
    w, h, left, bottom, top = 120 + 90 * len(groups) * max(1, len(series)) // 2, 320, 50, 40, 40
    plot_w, plot_h = w - left - 20, h - top - bottom
    gw = plot_w / len(groups)
    bw = gw * 0.8 / max(1, len(series))
    y = lambda v: top + plot_h * (1 - v / ymax)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h + 20 * ((len(series) + 3) // 4)}" font-family="sans-serif" font-size="11">',
             f'<text x="{w / 2}" y="18" text-anchor="middle" font-size="13">{title}</text>',
             f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#333"/>']
    for t in range(0, 6):
        v = ymax * t / 5
        parts.append(f'<text x="{left - 4}" y="{y(v) + 4}" text-anchor="end">{fmt(v)}</text>')
        parts.append(f'<line x1="{left}" y1="{y(v)}" x2="{left + plot_w}" y2="{y(v)}" stroke="#ddd"/>')
    if ref is not None:
        parts.append(f'<line x1="{left}" y1="{y(ref)}" x2="{left + plot_w}" y2="{y(ref)}" stroke="#888" stroke-dasharray="4 3"/>')
    for gi, g in enumerate(groups):
        x0 = left + gi * gw + gw * 0.1
        parts.append(f'<text x="{left + gi * gw + gw / 2}" y="{top + plot_h + 15}" text-anchor="middle">{g}</text>')
        for si, _ in enumerate(series):
            v = values[si][gi]
            if v is None:
                continue
            x = x0 + si * bw
            parts.append(f'<rect x="{x:.1f}" y="{y(v):.1f}" width="{bw - 1:.1f}" height="{top + plot_h - y(v):.1f}" fill="{COLORS[si % len(COLORS)]}"><title>{series[si]} {g}: {fmt(v)}</title></rect>')
    for si, s in enumerate(series):
        lx, ly = left + (si % 4) * 150, h + 5 + 20 * (si // 4)
        parts.append(f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{COLORS[si % len(COLORS)]}"/><text x="{lx + 14}" y="{ly}">{s}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--prompts", default="../shared/bench/prompts-code-dev.jsonl")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--mode", action="append", default=[], help="NAME=FLAGS (repeatable); replaces the defaults")
    ap.add_argument("--out", default="bench-out/code")
    ap.add_argument("--no-build", action="store_true")
    args = ap.parse_args()
    os.chdir(ROOT)
    if not args.no_build:
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "tandem-cli"], check=True)
    binary = os.path.join(ROOT, "target", "release", "tandem")
    os.makedirs(args.out, exist_ok=True)
    modes = []
    for m in args.mode:
        name, _, flags = m.partition("=")
        modes.append((name, shlex.split(flags)))
    if not modes:
        modes = [("lookup", ["--lookup", "--lookup-ngram-max", "8"]), ("suffix", ["--suffix"])]
        for d in drafters_of(binary, args.model):
            modes.append((d, ["--drafter", d]))
            modes.append((f"{d}+lookup", ["--drafter", d, "--lookup", "--lookup-ngram-max", "8"]))
            modes.append((f"{d}+suffix", ["--drafter", d, "--suffix"]))
    results = {name: run_mode(binary, args, name, flags) for name, flags in modes}

    kinds = [k for k in KINDS if any(kind_row(r, k) for r in results.values())] + ["overall"]
    lines = [f"{args.model}, {args.threads} threads, {args.n} tokens per prompt, {args.rounds} round(s), "
             f"`scripts/bench-code.py {' '.join(shlex.quote(a) for a in sys.argv[1:])}`", ""]
    head = "| kind | plain tok/s | " + " | ".join(f"{n} tok/s (×, commit/cycle)" for n in results) + " | best |"
    lines += [head, "|" + "---|" * (3 + len(results))]
    identical = total = 0
    best_by_kind = {}
    for k in kinds:
        rows = {n: kind_row(r, k) for n, r in results.items()}
        plains = [r["plain"] for r in rows.values() if r]
        plain = statistics.median(plains) if plains else float("nan")
        cells = []
        for n, r in rows.items():
            if r is None:
                cells.append("–")
                continue
            cells.append(f"{r['spec']:.1f} ({r['speedup']:.2f}×, {r['committed']:.2f})")
            if k == "overall":
                identical += r["identical"]
                total += r["prompts"]
        best = max((n for n in rows if rows[n]), key=lambda n: rows[n]["speedup"])
        best_by_kind[k] = (best, rows[best]["speedup"])
        name = f"**{k}**" if k == "overall" else k
        lines.append(f"| {name} | {plain:.1f} | " + " | ".join(cells) + f" | {best} {rows[best]['speedup']:.2f}× |")
    lines += ["", "Plain tok/s: the median of the modes' own interleaved plain runs. × is each mode against its own plain run.",
              f"Identical to plain decoding: {identical}/{total} generations.", "", "Acceptance per draft position, all prompts (accepted / verified drafts at that position; the count in brackets):", "",
              "| mode | " + " | ".join(f"pos {i + 1}" for i in range(8)) + " |", "|" + "---|" * 9]
    pos = {n: per_position(r) for n, r in results.items()}
    for n, p in pos.items():
        cells = [f"{a:.0%} ({v})" if a is not None else "–" for a, v in p[:8]] + ["–"] * (8 - min(8, len(p)))
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    summary = "\n".join(lines) + "\n"
    open(os.path.join(args.out, "summary.md"), "w").write(summary)
    print(summary)

    names = list(results)
    sp = [[(kind_row(results[n], k) or {}).get("speedup") for k in kinds] for n in names]
    ymax = max([v for s in sp for v in s if v] + [1.0]) * 1.15
    open(os.path.join(args.out, "speedup-by-kind.svg"), "w").write(
        bars_svg(f"{args.model}: speedup over plain decoding by kind", kinds, names, sp, ymax, lambda v: f"{v:.1f}×", ref=1.0))
    depth = max((len(p) for p in pos.values()), default=0)
    depth = min(depth, 8)
    acc = [[(p[i][0] if i < len(p) else None) for i in range(depth)] for p in pos.values()]
    open(os.path.join(args.out, "acceptance-by-position.svg"), "w").write(
        bars_svg(f"{args.model}: acceptance by draft position", [f"pos {i + 1}" for i in range(depth)], names, acc, 1.0,
                 lambda v: f"{v:.0%}"))
    if identical != total:
        sys.exit(f"EXACTNESS: {total - identical} of {total} generations differ from plain decoding")


if __name__ == "__main__":
    main()
