#!/usr/bin/env python3
"""Drive `tandem serve` with the official `openai` Python package.

Starts the real server binary (TANDEM_BIN, default target/release/tandem) on a
free port, runs every test_* function, prints 'N passed, N failed' and exits
non-zero on any failure. Works with pytest too (`pytest tests/server`).
"""

import os
import re
import subprocess
import sys
import threading
import time

import openai

import runner  # noqa: E402 (tests/server/runner.py)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("TANDEM_BIN", os.path.join(ROOT, "target", "release", "tandem"))
PROMPT = "List the planets of the solar system, one per line."
N = 48


class Server:
    def __init__(self, *extra):
        self.proc = subprocess.Popen(
            [BIN, "serve", "--port", "0", "-t", "2", "--ctx", "2048", *extra],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.url = None
        deadline = time.time() + 120
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError("tandem serve exited before listening")
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                self.url = m.group(1) + "/v1"
                break
        if self.url is None:
            raise RuntimeError("tandem serve did not start")
        # keep draining stderr so the server never blocks on a full pipe
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()

    def client(self, key="unused"):
        return openai.OpenAI(base_url=self.url, api_key=key, max_retries=0, timeout=300)

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_servers = {}


def server(*extra):
    if extra not in _servers:
        _servers[extra] = Server(*extra)
    return _servers[extra]


def cli_greedy(prompt, n, *extra):
    out = subprocess.run(
        [BIN, "-p", prompt, "--temp", "0", "-n", str(n), "-t", "2", *extra],
        capture_output=True, text=True, check=True,
    ).stdout
    return out[:-1] if out.endswith("\n") else out


def chat(c, **kw):
    args = dict(model="tandem", messages=[{"role": "user", "content": PROMPT}], temperature=0, max_tokens=N)
    args.update(kw)
    return c.chat.completions.create(**args)


# --- tests -----------------------------------------------------------------

def test_models_lists_the_loaded_model():
    c = server().client()
    ids = [m.id for m in c.models.list()]
    assert ids == ["SmolLM2-135M-Instruct.Q4_1"], ids


def test_chat_non_streaming_with_usage():
    c = server().client()
    r = chat(c, model="gpt-4o")  # any model name is answered by the loaded model
    assert r.object == "chat.completion"
    msg = r.choices[0].message
    assert msg.role == "assistant" and msg.content
    assert r.choices[0].finish_reason in ("stop", "length")
    u = r.usage
    assert u.prompt_tokens > 0 and 0 < u.completion_tokens <= N
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.prompt_tokens_details.cached_tokens >= 0
    ext = r.model_extra["tandem"]
    assert ext["decode_tokens_per_second"] > 0
    assert ext["speculative"] is None


def test_chat_streaming_matches_non_streaming_and_reports_usage():
    c = server().client()
    full = chat(c).choices[0].message.content
    text, finish, usage, n_chunks = "", None, None, 0
    for chunk in chat(c, stream=True, stream_options={"include_usage": True}):
        n_chunks += 1
        if chunk.usage is not None:
            usage = chunk.usage
            assert chunk.choices == []
            continue
        d = chunk.choices[0].delta
        text += d.content or ""
        finish = chunk.choices[0].finish_reason or finish
    assert text == full, (text, full)
    assert finish in ("stop", "length")
    assert usage is not None and usage.completion_tokens > 0
    assert n_chunks > 3


def test_text_completion_non_streaming_and_streaming():
    c = server().client()
    r = c.completions.create(model="m", prompt="The capital of France is", temperature=0, max_tokens=8)
    assert r.object == "text_completion"
    text = r.choices[0].text
    assert text and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 8
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model="m", prompt="The capital of France is", temperature=0, max_tokens=8, stream=True) if ch.choices)
    assert streamed == text


def test_stop_sequences_cut_and_do_not_leak():
    c = server().client()
    full = chat(c).choices[0].message.content
    stop = full[len(full) // 2: len(full) // 2 + 3]
    want = full[: full.index(stop)]
    r = chat(c, stop=[stop, "NEVER-THERE"])
    assert r.choices[0].message.content == want, (r.choices[0].message.content, want, stop)
    assert r.choices[0].finish_reason == "stop"
    text = "".join(ch.choices[0].delta.content or "" for ch in chat(c, stop=stop, stream=True) if ch.choices)
    assert text == want and stop not in text


def test_logprobs_chat_and_completion():
    c = server().client()
    r = chat(c, max_tokens=6, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == 6
    for t in content:
        assert t.logprob <= 0
        assert len(t.top_logprobs) == 3
        assert t.top_logprobs[0].token == t.token  # greedy picks the most likely token
    assert "".join(t.token for t in content) == r.choices[0].message.content
    r = c.completions.create(model="m", prompt="One, two,", temperature=0, max_tokens=4, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 4 and len(lp.token_logprobs) == 4 and len(lp.top_logprobs[0]) == 2


def test_prefix_reuse_reported_in_usage():
    c = server().client()
    first = chat(c, max_tokens=8)
    msgs = [{"role": "user", "content": PROMPT},
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "Which one is the largest?"}]
    r = chat(c, messages=msgs, max_tokens=4)
    assert r.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens, r.usage


def test_seed_reproducible():
    c = server().client()
    a = chat(c, temperature=1.0, seed=11, max_tokens=16).choices[0].message.content
    b = chat(c, temperature=1.0, seed=11, max_tokens=16).choices[0].message.content
    assert a == b


def test_greedy_identical_to_cli():
    want = cli_greedy(PROMPT, N)
    got = chat(server().client()).choices[0].message.content
    assert got == want, (got, want)


def test_greedy_identical_to_cli_with_lookup():
    want = cli_greedy(PROMPT, N, "--lookup")
    assert want == cli_greedy(PROMPT, N)
    r = chat(server("--lookup").client())
    assert r.choices[0].message.content == want
    spec = r.model_extra["tandem"]["speculative"]
    assert spec["drafter"] and spec["drafted_tokens"] >= spec["accepted_tokens"] >= 0, spec


def test_errors_map_to_openai_exceptions():
    c = server().client()
    try:
        chat(c, extra_body={"frobnicate": 1})
        raise AssertionError("unknown field accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and "frobnicate" in str(e)
    try:
        chat(c, messages=[])
        raise AssertionError("empty messages accepted")
    except openai.BadRequestError as e:
        assert "messages" in str(e)
    try:
        chat(c, max_tokens=100000)
        raise AssertionError("max_tokens beyond the context accepted")
    except openai.BadRequestError as e:
        assert "context length is 2048" in str(e)


def test_api_key():
    s = server("--api-key", "k-123")
    try:
        s.client("wrong").models.list()
        raise AssertionError("wrong key accepted")
    except openai.AuthenticationError as e:
        assert e.status_code == 401
    assert chat(s.client("k-123"), max_tokens=2).choices[0].message.content is not None



# --- many clients at once (continuous batching) -------------------------------

PROMPTS = [
    "List the planets of the solar system, one per line.",
    "Write a haiku about the sea.",
    "Explain what a hash map is in two sentences.",
    "Give three tips for writing clear emails.",
    "What is the boiling point of water at sea level?",
    "Write a Python function that reverses a string.",
    "Name five animals that live in the desert.",
    "Describe the color blue to someone who cannot see.",
]


def _request(j, spec):
    """Request j of 16: its prompt, length, streaming and stop strings vary."""
    kw = dict(messages=[{"role": "user", "content": PROMPTS[j % len(PROMPTS)]}], max_tokens=16 + 9 * (j % 5))
    if j % 3 == 0:
        kw["stop"] = ["\n\n", "sea"]
    return dict(kw, stream=(j % 2 == 1))


def _run(c, kw):
    kw = dict(kw)
    stream = kw.pop("stream")
    if not stream:
        r = chat(c, **kw)
        return r.choices[0].message.content, r.choices[0].finish_reason
    text, finish = "", None
    for ch in chat(c, stream=True, **kw):
        if ch.choices:
            text += ch.choices[0].delta.content or ""
            finish = ch.choices[0].finish_reason or finish
    return text, finish


def _metric(s, name):
    import urllib.request
    body = urllib.request.urlopen(s.url[: -len("/v1")] + "/metrics", timeout=30).read().decode()
    for line in body.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            if name + " " in line or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1]) if line.startswith(name + " ") else line
    return None


def _outcome(s, outcome):
    import urllib.request
    body = urllib.request.urlopen(s.url[: -len("/v1")] + "/metrics", timeout=30).read().decode()
    m = re.search(r'tandem_generations_total\{outcome="%s"\} (\d+)' % outcome, body)
    return int(m.group(1))


def _concurrent_equals_lone(*extra):
    s = server("--parallel", "8", *extra)
    c = s.client()
    reqs = [_request(j, extra) for j in range(16)]
    lone = [_run(c, kw) for kw in reqs]
    got = [None] * 16

    def go(j):
        got[j] = _run(c, reqs[j])

    threads = [threading.Thread(target=go, args=(j,)) for j in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    for j in range(16):
        assert got[j] == lone[j], (j, reqs[j], got[j], lone[j])
    steps, seqs = _metric(s, "tandem_batch_steps_total"), _metric(s, "tandem_batch_sequences_total")
    assert seqs > steps, "requests never shared a forward"
    assert _metric(s, "tandem_requests_running") == 0


def test_parallel_8_sixteen_concurrent_requests_equal_lone_ones():
    _concurrent_equals_lone()


def test_parallel_8_sixteen_concurrent_speculative_requests_equal_lone_ones():
    _concurrent_equals_lone("--suffix")
    _concurrent_equals_lone("--lookup")


def test_parallel_8_cancelling_half_mid_stream_leaves_the_others_unchanged():
    s = server("--parallel", "8")
    c = s.client()
    kws = [dict(messages=[{"role": "user", "content": PROMPTS[j % len(PROMPTS)]}], max_tokens=60) for j in range(16)]
    lone = [_run(c, dict(kw, stream=True)) for kw in kws[1::2]]
    cancelled_before = _outcome(s, "cancelled")
    got = [None] * 16

    def go(j):
        if j % 2 == 0:
            # read a few chunks, then go away
            stream = chat(c, stream=True, **kws[j])
            n = 0
            for ch in stream:
                n += 1
                if n >= 3:
                    break
            stream.close()
            got[j] = "gone"
        else:
            got[j] = _run(c, dict(kws[j], stream=True))

    threads = [threading.Thread(target=go, args=(j,)) for j in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    for k, j in enumerate(range(1, 16, 2)):
        assert got[j] == lone[k], (j, got[j], lone[k])
    deadline = time.time() + 30
    while time.time() < deadline and (_metric(s, "tandem_requests_running") != 0 or _outcome(s, "cancelled") < cancelled_before + 8):
        time.sleep(0.2)
    assert _metric(s, "tandem_requests_running") == 0, "slots still busy"
    assert _outcome(s, "cancelled") >= cancelled_before + 8
    # the freed slots serve again
    assert _run(c, dict(kws[1], stream=False)) == (lone[0][0], lone[0][1])



def test_parallel_shared_system_prompt_is_evaluated_once_within_the_kv_budget():
    budget = 160 << 20
    s = server("--parallel", "4", "--kv-budget", str(budget))
    c = s.client()
    system = " ".join(f"Rule {i}: answer briefly and politely." for i in range(120))
    ask = lambda q: chat(c, messages=[{"role": "system", "content": system}, {"role": "user", "content": q}], max_tokens=8)
    first = ask("Name a color.")
    assert first.usage.prompt_tokens > 1000, first.usage
    second = ask("Name a fruit.")
    cached = second.usage.prompt_tokens_details.cached_tokens
    own = second.usage.prompt_tokens - cached
    assert cached > 1000 and own < 30, second.usage
    t1, t2 = first.model_extra["tandem"], second.model_extra["tandem"]
    assert t2["evaluated_prompt_tokens"] == own
    assert t2["prefill_ms"] < t1["prefill_ms"] / 3, (t1["prefill_ms"], t2["prefill_ms"])
    # other prompts move the slots on; kept prefixes stay under the budget
    for j in range(12):
        ask(f"Question {j}: " + "tell me something new. " * (j + 1))
        assert _metric(s, "tandem_kv_live_bytes") + _metric(s, "tandem_prefix_cache_bytes") <= budget
    again = ask("Name an animal.")
    assert again.usage.prompt_tokens_details.cached_tokens > 1000, again.usage


def _close_servers():
    for s in _servers.values():
        s.close()


def main():
    return runner.run(globals(), _close_servers)


if __name__ == "__main__":
    sys.exit(main())
