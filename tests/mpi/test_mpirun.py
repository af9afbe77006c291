#!/usr/bin/env python3
"""Tensor parallelism under `mpirun -np 2`: the answers of a server split
over two ranks equal those of one process, bit for bit (greedy text and
token ids), with plain decoding, prompt lookup, the MTP head and the DSpark
drafter on the 24 dev prompts, and with seeded sampling; the CLI's output
too. A rank with another model file stops the run with a clear error, and
a rank killed mid-run ends the job instead of hanging it.
Sampling with a seed (and a fixed draft length) gives one process's text.

TANDEM_MPI_BIN: a tandem built with `--features mpi` (default
target/mpi/release/tandem). Runs as a script (exit status) or under pytest.
"""

import json
import os
import re
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("TANDEM_MPI_BIN", os.path.join(ROOT, "target", "mpi", "release", "tandem"))
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"]
MTP = os.path.join(ROOT, "models", "support", "smollm2-135m-instruct-mtp.gguf")
DSPARK = os.path.join(ROOT, "models", "support", "smollm2-135m-instruct-dspark.gguf")
N = 32


def prompts():
    with open(os.path.join(ROOT, "tests", "data", "prompts-dev.jsonl")) as f:
        rows = [json.loads(l) for l in f if l.strip()]
    return [r for r in rows if "_about" not in r]


class Server:
    def __init__(self, ranks, *extra):
        cmd = [BIN, "serve", "--port", "0", "-t", "1", "--ctx", "2048", *extra]
        if ranks > 1:
            cmd = MPIRUN + cmd
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.url = None
        deadline = time.time() + 180
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError(f"server exited before listening: {cmd}")
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                self.url = m.group(1)
                break
        if not self.url:
            raise RuntimeError("no listening line")

    def ask(self, p, **kw):
        body = {"max_tokens": N, "temperature": 0, "logprobs": True}
        if "user" in p:
            body["messages"] = [{"role": "user", "content": p["user"]}]
            path = "/v1/chat/completions"
        else:
            body["prompt"] = p["raw"]
            path = "/v1/completions"
        body.update(kw)
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            out = json.load(r)
        ch = out["choices"][0]
        text = ch["message"]["content"] if "message" in ch else ch["text"]
        lp = ch.get("logprobs") or {}
        toks = [c.get("logprob") for c in (lp.get("content") or [])] if isinstance(lp, dict) else []
        return text, toks, out.get("tandem", {}).get("speculative")

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.proc.stderr.close()


MODES = [
    ("plain", []),
    ("lookup", ["--lookup"]),
    ("mtp", ["--mtp", MTP]),
    ("dspark", ["--mtp", DSPARK, "--dspark"]),
]


def test_split_server_answers_equal_one_process():
    ps = prompts()
    assert len(ps) == 24
    for name, flags in MODES:
        answers = {}
        for ranks in (1, 2):
            s = Server(ranks, *flags)
            try:
                answers[ranks] = [s.ask(p) for p in ps]
            finally:
                s.close()
        for i, (a, b) in enumerate(zip(answers[1], answers[2])):
            assert a[0] == b[0], f"{name}: prompt {i}: split answer differs\n{a[0]!r}\n{b[0]!r}"
            assert a[1] == b[1], f"{name}: prompt {i}: log-probs differ"
        if name != "plain":
            assert any(a[2] for a in answers[2]), f"{name}: no speculative stats from the split server"
        print(f"{name}: {len(answers[2])} answers of 2 ranks equal 1 process")


def test_split_cli_output_equals_one_process():
    # each rank keeps its share of the K/V cache in the type asked for
    for kv in ("f32", "f16"):
        args = ["-p", "Why is the sky blue?", "-n", "40", "--temp", "0", "-t", "1", "--lookup", "--kv-type", kv]
        one = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=300)
        two = subprocess.run(MPIRUN + [BIN, *args], capture_output=True, text=True, timeout=300)
        assert one.returncode == 0 and two.returncode == 0, two.stderr
        assert one.stdout == two.stdout, f"--kv-type {kv}: split output differs"
        assert "rank 0 of 2" in two.stderr


def test_seeded_sampling_equals_one_process():
    # a fixed draft length: the adaptive one follows measured timings, and
    # with it the random numbers a sampled cycle draws
    base = ["-p", "What are three good habits for staying healthy?", "-n", "40", "--temp", "0.8", "--seed", "7", "-t", "1"]
    for flags in ([], ["--mtp", DSPARK, "--dspark", "--spec-fixed"], ["--lookup", "--spec-fixed"]):
        one = subprocess.run([BIN, *base, *flags], capture_output=True, text=True, timeout=300)
        two = subprocess.run(MPIRUN + [BIN, *base, *flags], capture_output=True, text=True, timeout=300)
        assert one.returncode == 0 and two.returncode == 0, two.stderr[-2000:]
        assert one.stdout == two.stdout, f"{flags}: sampled text differs"


def test_a_rank_with_another_model_is_a_clear_error():
    other = os.path.join(ROOT, "models", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    smol = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not (os.path.exists(other) and os.path.exists(smol)):
        print("skipped: the coder model is not here")
        return
    # rank 0 gets SmolLM2, rank 1 the coder (an MPMD launch)
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "1", BIN, "-m", smol, "-p", "hi", "-n", "4", ":",
           "-np", "1", BIN, "-m", other, "-p", "hi", "-n", "4"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "different model file" in r.stderr, r.stderr[-2000:]


def rank_pid(parent, rank):
    """The pid of `rank` among the processes `parent` (mpirun) started."""
    out = subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True).stdout.split()
    for pid in out:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
            return int(pid)
    return None


def test_a_dead_rank_ends_the_job():
    s = Server(2)
    try:
        assert s.ask(prompts()[0])[0]
        pid = rank_pid(s.proc.pid, 1)
        assert pid, "rank 1 not found"
        os.kill(pid, 9)
        # the next request cannot be answered; the job must end, not hang
        try:
            s.ask(prompts()[1])
        except Exception:  # noqa: BLE001
            pass
        code = s.proc.wait(timeout=120)
        assert code != 0, "mpirun exited 0 after a rank died"
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
        s.proc.stderr.close()


if __name__ == "__main__":
    failed = 0
    for name, fn in list(globals().items()):
        if name.startswith("test_") and callable(fn):
            try:
                fn()
                print(f"ok   {name}")
            except Exception as e:  # noqa: BLE001
                failed += 1
                print(f"FAIL {name}: {e}")
    sys.exit(1 if failed else 0)
