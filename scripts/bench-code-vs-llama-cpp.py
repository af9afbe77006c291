#!/usr/bin/env python3
"""tandem against llama.cpp on the code benchmark: the same prompts, the same
rendered text, greedy, the same thread count.

    scripts/bench-code-vs-llama-cpp.py [-m qwen2.5-coder-0.5b] [-n 128] [--rounds 1]
        [--tandem NAME=FLAGS ...] [--out bench-out/code-vs-llama-cpp] [--no-build]

Each round runs tandem's modes (one `tandem bench --prompts` per mode, each
with its own interleaved plain decode; defaults: DSpark behind lookup, and
suffix), then llama.cpp 0c1e570 (scripts/build-llama-cpp.sh) on every prompt
in turn: plain (`llama-completion`), prompt lookup (`llama-lookup`), its
n-gram speculation (`llama-speculative-simple --spec-type ngram-mod`), and
its DSpark path with the catalogue's DSpark file for the model as the draft
(`--spec-type draft-dspark -md FILE`; a Qwen2 target is given to that mode
relabelled as `llama`, the one change that lets llama.cpp run a DFlash
drafter on it, see crates/tools/examples/qwen2_as_llama.rs). llama.cpp reads the text tandem's
tokenizer read (chat template applied by tandem, special tokens parsed).

Reports per kind and overall: tok/s of every mode of both engines (total
generated tokens over total decode time), tandem's best ÷ llama.cpp's best,
and whether each llama.cpp speculative output equals llama.cpp's plain output
on the same model file (for a relabelled target, its plain output on the
relabelled file, `plain-llama-arch`, which is not in the tok/s table), and
how many of llama.cpp's plain outputs equal tandem's. llama.cpp's kernels
are not batch-invariant, so a difference is reported, not fatal.
`--llama-batch-invariant` removes what of that llama.cpp lets a user remove:
a build without llamafile's sgemm (`LLAMA_CPP_NO_LLAMAFILE=1
scripts/build-llama-cpp.sh`), no weight repacking (`--no-repack`) and no
flash attention (`-fa off`). `--llama-modes` picks llama.cpp's modes (plain
always runs). Writes OUT/summary.md, OUT/summary.json and
OUT/tok-s-by-kind.svg; every llama.cpp run's output is kept under
OUT/llama/.
"""
import argparse
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("bench_code", os.path.join(ROOT, "scripts", "bench-code.py"))
bench_code = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_code)
KINDS = bench_code.KINDS
ANSI = re.compile(r"\x1b\[[0-9;]*m")
MODEL_FILES = {"smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf", "qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"}
# llama.cpp's qwen2 graph does not export the layer inputs a DFlash drafter
# reads (0c1e570 aborts: "layer input tensor is null"); its llama graph does,
# so its DSpark mode gets the same model relabelled (crates/tools/examples/qwen2_as_llama.rs)
QWEN2_MODELS = {"qwen2.5-coder-0.5b"}
PLAIN_RELABELLED = "plain-llama-arch"
DSPARK_FILES = {"smollm2-135m": "smollm2-135m-instruct-dspark.gguf", "qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b-instruct-dspark.gguf"}


def llama_modes(bin_dir, model_path, dspark_target, dspark, args):
    """(name, argv builder) for each llama.cpp mode; the builder takes the prompt file."""
    common = ["-m", model_path, "-t", str(args.threads), "-c", str(args.ctx), "--temp", "0", "-n", str(args.n), "--no-escape"]
    if args.llama_batch_invariant:
        common += ["--no-repack", "-fa", "off"]
    modes = [
        ("plain", lambda f: [os.path.join(bin_dir, "llama-completion"), *common, "-no-cnv", "--no-display-prompt", "-f", f]),
        ("lookup", lambda f: [os.path.join(bin_dir, "llama-lookup"), *common, "--spec-draft-n-max", str(args.draft_max), "-f", f]),
        ("ngram-mod", lambda f: [os.path.join(bin_dir, "llama-speculative-simple"), *common, "--spec-type", "ngram-mod", "-f", f]),
    ]
    if dspark:
        dcommon = ["-m", dspark_target] + common[2:]
        modes.append(("dspark", lambda f: [os.path.join(bin_dir, "llama-speculative-simple"), *dcommon, "--spec-type", "draft-dspark",
                                           "-md", dspark, "-f", f]))
        if dspark_target != model_path:
            # the reference for the DSpark mode: plain decoding of the file it runs
            modes.append((PLAIN_RELABELLED, lambda f: [os.path.join(bin_dir, "llama-completion"), *dcommon, "-no-cnv",
                                                       "--no-display-prompt", "-f", f]))
    wanted = set(args.llama_modes.split(",")) | {"plain"} if args.llama_modes else None
    if wanted:
        unknown = wanted - {n for n, _ in modes}
        if unknown:
            sys.exit(f"--llama-modes: unknown or unavailable mode(s) {', '.join(sorted(unknown))}")
        if "dspark" in wanted:
            wanted.add(PLAIN_RELABELLED)
        modes = [m for m in modes if m[0] in wanted]
    return modes


def reference(mode, texts):
    """The plain output a speculative mode's output must equal: that of the same model file."""
    return texts[PLAIN_RELABELLED] if mode == "dspark" and PLAIN_RELABELLED in texts else texts["plain"]


def parse_llama(mode, stdout, stderr, prompt_text):
    """(generated text, tokens, decode seconds, drafted, accepted) from one llama.cpp run."""
    out = ANSI.sub("", stdout)
    if mode in ("plain", PLAIN_RELABELLED):
        # llama-completion ends its output with "\n\n", after " [end of text]\n" at an end of generation
        text = strip_suffixes(out, ["\n\n", " [end of text]\n"])
        m = re.findall(r"\beval time =\s*([\d.]+) ms /\s*(\d+) runs", stderr)
        if not m:
            raise ValueError("no eval time in llama-completion's log")
        ms, runs = float(m[-1][0]), int(m[-1][1])
        # the first token comes from the prompt's forward; the runs are the rest
        return text, runs, ms / 1000.0, None, None
    # the speculative examples print the prompt, then the output, then "\n\n"
    body = out.lstrip("\n")
    if body.startswith(prompt_text):
        body = body[len(prompt_text):]
    else:
        i = body.find(prompt_text)
        body = body[i + len(prompt_text):] if i >= 0 else body
    # then "\n\n" after the output and "\n\n" after the statistics
    text = strip_suffixes(body, ["\n\n", "\n\n"])
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", stderr)
    if not m:
        raise ValueError(f"no 'decoded N tokens' line in the {mode} log")
    drafted = re.search(r"n_drafted\s*=\s*(\d+)", stderr)
    accepted = re.search(r"n_accept\s*=\s*(\d+)", stderr)
    return (text, int(m.group(1)), float(m.group(2)), int(drafted.group(1)) if drafted else None,
            int(accepted.group(1)) if accepted else None)


def strip_suffixes(text, suffixes):
    """`text` without each of `suffixes` in turn, where it ends with it."""
    for x in suffixes:
        if text.endswith(x):
            text = text[:-len(x)]
    return text


def same_prefix(a, b):
    """Equal up to the shorter one (the examples may stop a token or two past -n)."""
    k = min(len(a), len(b))
    return a[:k] == b[:k]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--prompts", default="../shared/bench/prompts-code-dev.jsonl")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--draft-max", type=int, default=8, help="llama-lookup's --spec-draft-n-max")
    ap.add_argument("--tandem", action="append", default=[], help="NAME=FLAGS (repeatable); replaces the defaults")
    ap.add_argument("--out", default="bench-out/code-vs-llama-cpp")
    ap.add_argument("--llama-modes", help="comma-separated llama.cpp modes (plain, lookup, ngram-mod, dspark); default all")
    ap.add_argument("--llama-batch-invariant", action="store_true",
                    help="llama.cpp built without llamafile's sgemm, run with --no-repack -fa off")
    ap.add_argument("--no-build", action="store_true")
    args = ap.parse_args()
    os.chdir(ROOT)
    if not args.no_build:
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "tandem-cli"], check=True)
    binary = os.path.join(ROOT, "target", "release", "tandem")
    env = dict(os.environ, **({"LLAMA_CPP_NO_LLAMAFILE": "1"} if args.llama_batch_invariant else {}))
    b = subprocess.run([os.path.join(ROOT, "scripts", "build-llama-cpp.sh"), "llama-completion", "llama-lookup",
                        "llama-speculative-simple"], capture_output=True, text=True, env=env)
    if b.returncode != 0:
        sys.exit("llama.cpp could not be built:\n" + b.stderr[-3000:])
    bin_dir = b.stdout.strip().splitlines()[-1]
    subprocess.run([binary, "fetch", args.model], capture_output=True, check=True)
    mdir = os.environ.get("TANDEM_MODELS_DIR", os.path.join(ROOT, "models"))
    model_path = os.path.join(mdir, MODEL_FILES.get(args.model, args.model))
    dspark = os.path.join(ROOT, "models", "support", DSPARK_FILES[args.model]) if args.model in DSPARK_FILES else None
    if dspark and not os.path.exists(dspark):
        dspark = None
    os.makedirs(os.path.join(args.out, "llama"), exist_ok=True)
    dspark_target = model_path
    if dspark and args.model in QWEN2_MODELS:
        dspark_target = os.path.join(ROOT, "target", "llama.cpp", os.path.basename(model_path)[:-5] + ".llama-arch.gguf")
        if not os.path.exists(dspark_target):
            subprocess.run(["cargo", "run", "--release", "-q", "-p", "tandem-tools", "--example", "qwen2_as_llama", "--",
                            model_path, dspark_target], check=True)

    tandem_modes = []
    for m in args.tandem:
        name, _, flags = m.partition("=")
        tandem_modes.append((name, shlex.split(flags)))
    if not tandem_modes:
        tandem_modes = [("dspark+lookup", ["--drafter", "dspark", "--lookup", "--lookup-ngram-max", "8"]), ("suffix", ["--suffix"])]
    lmodes = llama_modes(bin_dir, model_path, dspark_target, dspark, args)

    # per engine-mode, per prompt: lists of (tokens, secs) over rounds
    runs = {}
    info = {}
    exact = {n: [0, 0] for n, _ in lmodes if n not in ("plain", PLAIN_RELABELLED)}
    vs_tandem = [0, 0]
    relabelled = [0, 0]
    parted = []
    tandem_same = [0, 0]
    log = []
    for rnd in range(1, args.rounds + 1):
        reports = {}
        for name, flags in tandem_modes:
            sub = argparse.Namespace(**{**vars(args), "rounds": 1})
            sub.out = os.path.join(args.out, f"tandem-round-{rnd}")
            os.makedirs(sub.out, exist_ok=True)
            reports[name] = bench_code.run_mode(binary, sub, name, flags)[0]
        first = next(iter(reports.values()))
        for name, rep in reports.items():
            for r in rep["rows"]:
                tandem_same[0] += bool(r["identical"])
                tandem_same[1] += 1
                info[r["id"]] = (r["category"], r["prompt_text"], r["plain_text"], r["prompt_tokens"])
                runs.setdefault(("tandem", name), {}).setdefault(r["id"], []).append((r["spec_gen_tokens"], r["spec_secs"]))
                runs.setdefault(("tandem", "plain"), {}).setdefault(r["id"], []).append((r["gen_tokens"], r["plain_secs"]))
        for i, r in enumerate(first["rows"]):
            pid = r["id"]
            pfile = os.path.join(args.out, "llama", f"{pid}.prompt.txt")
            with open(pfile, "w") as f:
                # `-f` drops one trailing newline; --no-escape keeps backslashes as they are
                f.write(r["prompt_text"] + "\n")
            texts = {}
            # rotate the order per prompt so that no mode always runs first
            order = lmodes[i % len(lmodes):] + lmodes[:i % len(lmodes)]
            for mname, argv in order:
                cmd = argv(pfile)
                t0 = time.time()
                p = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
                wall = time.time() - t0
                base = os.path.join(args.out, "llama", f"{pid}.{mname}.r{rnd}")
                open(base + ".out", "w").write(p.stdout)
                open(base + ".err", "w").write(p.stderr)
                if p.returncode != 0:
                    sys.exit(f"llama.cpp {mname} failed on {pid} (exit {p.returncode}):\n{' '.join(map(shlex.quote, cmd))}\n{p.stderr[-2000:]}")
                text, toks, secs, drafted, accepted = parse_llama(mname, p.stdout, p.stderr, r["prompt_text"])
                texts[mname] = text
                runs.setdefault(("llama.cpp", mname), {}).setdefault(pid, []).append((toks, secs, drafted, accepted))
                log.append(f"{pid} llama.cpp {mname}: {toks} tokens in {secs:.3f} s ({toks / max(secs, 1e-9):.1f} tok/s), wall {wall:.1f} s")
                print(log[-1], file=sys.stderr, flush=True)
            for mname in exact:
                exact[mname][1] += 1
                ref = reference(mname, texts)
                same = same_prefix(texts[mname], ref)
                exact[mname][0] += same
                if not same:
                    k = next(j for j, (x, y) in enumerate(zip(texts[mname], ref)) if x != y)
                    parted.append(f"{pid} {mname}: parts from plain at character {k} of {len(ref)}: "
                                  f"plain {ref[max(0, k - 30):k + 20]!r}, {mname} {texts[mname][max(0, k - 30):k + 20]!r}")
            vs_tandem[1] += 1
            vs_tandem[0] += same_prefix(texts["plain"], r["plain_text"])
            if PLAIN_RELABELLED in texts:
                relabelled[1] += 1
                relabelled[0] += same_prefix(texts["plain"], texts[PLAIN_RELABELLED])
    open(os.path.join(args.out, "llama.log"), "w").write("\n".join(log) + "\n")

    def tps(engine, mode, kind):
        toks = secs = 0.0
        for pid, rs in runs[(engine, mode)].items():
            if kind != "overall" and info[pid][0] != kind:
                continue
            for x in rs:
                toks += x[0]
                secs += x[1]
        return toks / secs if secs else None

    columns = [("tandem", "plain")] + [("tandem", n) for n, _ in tandem_modes] + [("llama.cpp", n) for n, _ in lmodes
                                                                                  if n != PLAIN_RELABELLED]
    kinds = [k for k in KINDS if any(v[0] == k for v in info.values())] + ["overall"]
    table = {k: {f"{e} {m}": tps(e, m, k) for e, m in columns} for k in kinds}
    lines = [f"{args.model}, {args.threads} threads, {args.n} tokens per prompt, {args.rounds} round(s), {len(info)} prompts, "
             f"`scripts/bench-code-vs-llama-cpp.py {' '.join(shlex.quote(a) for a in sys.argv[1:])}`", "",
             "| kind | " + " | ".join(f"{e} {m} tok/s" for e, m in columns) + " | tandem best ÷ llama.cpp best |",
             "|" + "---|" * (len(columns) + 2)]
    ratios = {}
    for k in kinds:
        row = table[k]
        tb = max((n for n in row if n.startswith("tandem")), key=lambda n: row[n] or 0)
        lb = max((n for n in row if n.startswith("llama.cpp")), key=lambda n: row[n] or 0)
        ratios[k] = (tb, lb, row[tb] / row[lb])
        name = f"**{k}**" if k == "overall" else k
        cells = [f"{row[f'{e} {m}']:.1f}" for e, m in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {row[tb] / row[lb]:.2f}× ({tb[7:]} ÷ {lb[10:]}) |")
    acc_lines = []
    for mname in exact:
        d = sum(x[2] or 0 for rs in runs[("llama.cpp", mname)].values() for x in rs)
        a = sum(x[3] or 0 for rs in runs[("llama.cpp", mname)].values() for x in rs)
        of = " of the relabelled file it runs" if mname == "dspark" and relabelled[1] else ""
        acc_lines.append(f"- llama.cpp {mname}: accepted {a} of {d} drafts ({a / d:.1%}); output equal to llama.cpp's plain output{of} "
                         f"on {exact[mname][0]}/{exact[mname][1]} prompts." if d else
                         f"- llama.cpp {mname}: no drafts; output equal to its plain output{of} on {exact[mname][0]}/{exact[mname][1]} prompts.")
    if relabelled[1]:
        acc_lines.append(f"- llama.cpp's plain output of the relabelled file equals that of the original on "
                         f"{relabelled[0]}/{relabelled[1]} prompts (llama's rotary order rounds differently).")
    if args.llama_batch_invariant:
        acc_lines.append("- llama.cpp built without llamafile's sgemm, run with `--no-repack -fa off` (`--llama-batch-invariant`).")
    lines += ["", "tok/s: generated tokens over decode time, summed over the kind's prompts (prompt evaluation excluded).",
              "tandem's modes each ran with their own plain decode (`tandem plain` is the sum of those runs);",
              "llama.cpp's modes ran prompt by prompt in rotating order.", ""] + acc_lines + [
              f"- tandem's speculative output equals its plain output on {tandem_same[0]}/{tandem_same[1]} generations.",
              f"- llama.cpp's plain output equals tandem's plain output on {vs_tandem[0]}/{vs_tandem[1]} prompts "
              "(two engines' arithmetic differ; they part at near ties)."]
    if parted:
        lines += ["", "Where llama.cpp's speculative output parts from its plain output:", ""] + [f"- {x}" for x in parted]
    summary = "\n".join(lines) + "\n"
    open(os.path.join(args.out, "summary.md"), "w").write(summary)
    json.dump({"table": table, "ratios": ratios, "exact": exact, "plain_vs_tandem": vs_tandem, "relabelled_plain_vs_plain": relabelled,
               "llama_batch_invariant": args.llama_batch_invariant, "parted": parted}, open(os.path.join(args.out, "summary.json"), "w"), indent=1)
    print(summary)
    names = [f"{e} {m}" for e, m in columns]
    vals = [[table[k][n] for k in kinds] for n in names]
    ymax = max(v for s in vals for v in s if v) * 1.15
    open(os.path.join(args.out, "tok-s-by-kind.svg"), "w").write(
        bench_code.bars_svg(f"{args.model}: tok/s by kind, tandem and llama.cpp", kinds, names, vals, ymax, lambda v: f"{v:.0f}"))
    if tandem_same[0] != tandem_same[1]:
        sys.exit(f"EXACTNESS: {tandem_same[1] - tandem_same[0]} of tandem's speculative generations differ from its plain decoding")
    # llama.cpp's verify batches are not batch-invariant, so its speculative
    # output may part from its own plain output at a near tie: reported, not fatal
    for m, (a, n) in exact.items():
        if a != n:
            print(f"note: llama.cpp {m} differs from llama.cpp plain on {n - a} of {n} prompts", file=sys.stderr)


if __name__ == "__main__":
    main()
