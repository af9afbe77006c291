#!/usr/bin/env python3
"""Faults and hostile clients against the real `tandem serve`.

Starts the server binary (TANDEM_BIN, default target/release/tandem) on a
free port with short limits, and checks that slow, broken and hostile
clients each get a bounded wait, a clear 4xx or a correct answer, that the
server keeps serving everyone else, and that SIGTERM and SIGKILL leave
nothing broken. Runs every test_* function, prints 'N passed, N failed' and
exits non-zero on a failure; works under pytest too.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import runner  # noqa: E402 (tests/server/runner.py)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("TANDEM_BIN", os.path.join(ROOT, "target", "release", "tandem"))
PROMPT = "List the planets of the solar system, one per line."
HEADER_TIMEOUT = 2
BODY_TIMEOUT = 2
MAX_CONNECTIONS = 64


class Server:
    def __init__(self, *extra, ctx=2048):
        self.args = [BIN, "serve", "--port", "0", "-t", "2", "--ctx", str(ctx), *extra]
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log = []
        deadline = time.time() + 180
        self.host = self.port = None
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError("tandem serve exited before listening")
            self.log.append(line)
            m = re.search(r"listening on http://([\d.]+):(\d+)", line)
            if m:
                self.host, self.port = m.group(1), int(m.group(2))
                break
        if self.port is None:
            raise RuntimeError("tandem serve did not start")
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def url(self, path):
        return f"http://{self.host}:{self.port}{path}"

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_shared = None


def shared():
    """One server with short limits for the tests that do not stop it."""
    global _shared
    if _shared is None:
        _shared = Server(
            "--parallel", "4",
            "--header-timeout", str(HEADER_TIMEOUT),
            "--body-timeout", str(BODY_TIMEOUT),
            "--max-connections", str(MAX_CONNECTIONS),
        )
    return _shared


def post(s, path, body, timeout=300, headers=None):
    """POST JSON (or raw bytes); returns (status, parsed body or text)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(s.url(path), data=data, method="POST", headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        raw = e.read()
        status = e.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode("utf-8", "replace")


def chat_body(content=PROMPT, **kw):
    body = {"model": "tandem", "messages": [{"role": "user", "content": content}], "temperature": 0, "max_tokens": 16}
    body.update(kw)
    return body


def assert_serves(s):
    """A normal request gets a normal answer."""
    status, r = post(s, "/v1/chat/completions", chat_body(max_tokens=4), timeout=120)
    assert status == 200, (status, r)
    assert r["choices"][0]["message"]["content"], r


def raw_exchange(s, data, read_timeout):
    """Send raw bytes, then read until the server closes or read_timeout passes.
    Returns (bytes received, seconds until close or None if still open)."""
    sock = socket.create_connection((s.host, s.port), timeout=10)
    t0 = time.time()
    sock.sendall(data)
    sock.settimeout(read_timeout)
    got = b""
    closed_after = None
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                closed_after = time.time() - t0
                break
            got += chunk
    except socket.timeout:
        pass
    except ConnectionResetError:
        closed_after = time.time() - t0
    sock.close()
    return got, closed_after


def status_of(response):
    m = re.match(rb"HTTP/1\.[01] (\d{3})", response)
    return int(m.group(1)) if m else None


# --- slow and hostile clients ---------------------------------------------------


def test_headers_one_byte_a_second_are_cut_off():
    s = shared()
    request = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    sock = socket.create_connection((s.host, s.port), timeout=10)
    t0 = time.time()
    closed_after = None
    try:
        for b in request:
            sock.sendall(bytes([b]))
            time.sleep(1.0)
            if time.time() - t0 > HEADER_TIMEOUT + 6:
                break
    except (BrokenPipeError, ConnectionResetError):
        closed_after = time.time() - t0
    if closed_after is None:
        # the server may have answered and closed; reading tells
        sock.settimeout(5)
        try:
            rest = sock.recv(65536)
            if rest == b"" or status_of(rest) == 408:
                closed_after = time.time() - t0
        except socket.timeout:
            pass  # still open
        except ConnectionResetError:
            closed_after = time.time() - t0
    sock.close()
    assert closed_after is not None and closed_after < HEADER_TIMEOUT + 8, f"slow headers still open after {time.time() - t0:.1f} s"
    assert_serves(s)


def test_a_body_that_never_finishes_gets_408():
    s = shared()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"messages\":"
    got, _ = raw_exchange(s, head, read_timeout=BODY_TIMEOUT + 10)
    assert status_of(got) == 408, got[:200]
    assert b"request_timeout" in got, got[:400]
    assert_serves(s)


def test_many_idle_connections_are_bounded_and_closed():
    s = shared()
    rss0 = s.rss_kib()
    socks = []
    for _ in range(MAX_CONNECTIONS * 3):
        try:
            socks.append(socket.create_connection((s.host, s.port), timeout=5))
        except OSError:
            break
    # the server closes what it cannot hold at once, and the rest once their
    # header deadline passes
    deadline = time.time() + HEADER_TIMEOUT + 10
    open_socks = list(socks)
    while open_socks and time.time() < deadline:
        still = []
        for sock in open_socks:
            sock.setblocking(False)
            try:
                if sock.recv(1) == b"":
                    sock.close()
                    continue
            except BlockingIOError:
                pass
            except (ConnectionResetError, OSError):
                sock.close()
                continue
            still.append(sock)
        open_socks = still
        time.sleep(0.2)
    for sock in open_socks:
        sock.close()
    assert not open_socks, f"{len(open_socks)} of {len(socks)} idle connections still open after {HEADER_TIMEOUT + 10} s"
    assert_serves(s)
    assert s.rss_kib() - rss0 < 32 * 1024, f"RSS grew by {(s.rss_kib() - rss0) / 1024:.1f} MiB"
    with urllib.request.urlopen(s.url("/metrics"), timeout=30) as r:
        metrics = r.read().decode()
    m = re.search(r"^tandem_connections_rejected_total (\d+)", metrics, re.M)
    assert m and int(m.group(1)) > 0, "connections beyond --max-connections were not counted"


def test_oversized_headers_get_431():
    s = shared()
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (200 << 10) + b"\r\n\r\n"
    got, closed = raw_exchange(s, head, read_timeout=10)
    assert status_of(got) == 431 or (got == b"" and closed is not None), got[:200]
    assert_serves(s)


def test_deeply_nested_and_huge_json():
    s = shared()
    nested = b'{"messages": ' + b"[" * 100000 + b"]" * 100000 + b"}"
    status, r = post(s, "/v1/chat/completions", nested)
    assert status == 400, (status, str(r)[:300])
    # an oversized body is refused from its Content-Length, before it is sent
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5242880\r\n\r\n"
    got, _ = raw_exchange(s, head, read_timeout=10)
    assert status_of(got) == 413 and b"request_too_large" in got, got[:300]
    # ... and, sent chunked without a length, once it passes the limit
    chunk = b"x" * (1 << 20)
    chunked = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunked += (b"%x\r\n" % len(chunk) + chunk + b"\r\n") * 5 + b"0\r\n\r\n"
    try:
        got, _ = raw_exchange(s, chunked, read_timeout=10)
    except (BrokenPipeError, ConnectionResetError):
        got = b""
    assert got == b"" or (status_of(got) == 413 and b"request_too_large" in got), got[:300]
    # just under the body limit: a valid request whose prompt exceeds the context
    status, r = post(s, "/v1/chat/completions", chat_body("word " * 700000))
    assert status == 400 and r["error"]["code"] == "context_length_exceeded", (status, str(r)[:300])
    many_keys = json.dumps({"messages": [{"role": "user", "content": "hi"}], **{f"k{i}": i for i in range(50000)}}).encode()
    status, r = post(s, "/v1/chat/completions", many_keys)
    assert status == 400, (status, str(r)[:300])
    assert_serves(s)


def test_invalid_utf8_is_a_400():
    s = shared()
    body = b'{"model":"tandem","messages":[{"role":"user","content":"\xff\xfe bad"}],"max_tokens":4}'
    status, r = post(s, "/v1/chat/completions", body)
    assert status == 400, (status, r)
    status, r = post(s, "/v1/completions", b'{"prompt":"\xc3\x28","max_tokens":4}')
    assert status == 400, (status, r)
    assert_serves(s)


def test_stop_and_logprobs_at_their_limits():
    s = shared()
    stops = [f"never-{i}-" + "z" * 4000 for i in range(16)]
    status, r = post(s, "/v1/chat/completions", chat_body(stop=stops, max_tokens=24, logprobs=True, top_logprobs=20))
    assert status == 200, (status, str(r)[:300])
    tokens = r["choices"][0]["logprobs"]["content"]
    assert len(tokens) == r["usage"]["completion_tokens"] and all(len(t["top_logprobs"]) == 20 for t in tokens)
    status, r = post(s, "/v1/chat/completions", chat_body(stop=stops + ["one too many"]))
    assert status == 400 and r["error"]["param"] == "stop", (status, r)
    status, r = post(s, "/v1/chat/completions", chat_body(logprobs=True, top_logprobs=21))
    assert status == 400 and r["error"]["param"] == "top_logprobs", (status, r)
    status, r = post(s, "/v1/completions", {"prompt": "1, 2, 3,", "max_tokens": 8, "logprobs": 5, "temperature": 0})
    assert status == 200 and len(r["choices"][0]["logprobs"]["top_logprobs"][0]) == 5, (status, str(r)[:300])


def test_prompts_made_of_special_tokens():
    s = shared()
    specials = "<|im_start|>system\n<|im_end|><|endoftext|><|im_start|>assistant\n" * 20
    status, r = post(s, "/v1/chat/completions", chat_body(specials, max_tokens=8))
    assert status == 200 and r["choices"][0]["finish_reason"] in ("stop", "length"), (status, str(r)[:300])
    status, r = post(s, "/v1/completions", {"prompt": specials, "max_tokens": 8, "temperature": 0})
    assert status == 200, (status, str(r)[:300])
    status, r = post(s, "/v1/completions", {"prompt": [0, 1, 2, 1, 0], "max_tokens": 4, "temperature": 0})
    assert status == 200, (status, str(r)[:300])
    status, r = post(s, "/v1/completions", {"prompt": [10**9], "max_tokens": 4})
    assert status == 400 and r["error"]["param"] == "prompt", (status, r)


def test_max_tokens_racing_the_context_limit():
    s = shared()
    # a prompt that leaves a little room: max_tokens beyond it is refused, a
    # request that fits runs to the context's end at most
    words = "one two three four five six seven eight nine ten " * 190
    status, r = post(s, "/v1/completions", {"prompt": words, "max_tokens": 100000, "temperature": 0})
    assert status == 400 and r["error"]["code"] == "context_length_exceeded", (status, str(r)[:300])
    status, r = post(s, "/v1/completions", {"prompt": words, "temperature": 0, "max_tokens": 8})
    assert status in (200, 400), (status, str(r)[:300])
    if status == 200:
        u = r["usage"]
        assert u["prompt_tokens"] + u["completion_tokens"] <= 2048, u
    # without max_tokens: the default is capped by the room left
    status, r = post(s, "/v1/completions", {"prompt": words, "temperature": 0})
    assert status in (200, 400), (status, str(r)[:300])
    if status == 200:
        u = r["usage"]
        assert u["prompt_tokens"] + u["completion_tokens"] <= 2048, u
    assert_serves(s)


def test_disconnects_mid_prefill_and_mid_stream_under_load():
    s = shared()
    results = {}

    def steady(i):
        results[i] = post(s, "/v1/chat/completions", chat_body(f"Count to {i + 5}.", max_tokens=32))

    workers = [threading.Thread(target=steady, args=(i,)) for i in range(3)]
    for w in workers:
        w.start()
    long_prompt = "Summarise: " + "the quick brown fox jumps over the lazy dog. " * 150
    for i in range(6):
        body = json.dumps(chat_body(long_prompt, max_tokens=64, stream=(i % 2 == 0))).encode()
        head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        sock = socket.create_connection((s.host, s.port), timeout=10)
        sock.sendall(head + body)
        if i % 3 == 2:
            sock.settimeout(60)
            sock.recv(1024)  # first bytes of the stream (or the answer)
        else:
            time.sleep(0.05)  # mid-prefill
        sock.close()
    for w in workers:
        w.join(timeout=300)
    for i in range(3):
        status, r = results[i]
        assert status == 200 and r["choices"][0]["message"]["content"], (status, r)
    # the cancelled generations are freed: the server is idle again soon
    deadline = time.time() + 60
    while time.time() < deadline:
        with urllib.request.urlopen(s.url("/metrics"), timeout=30) as r:
            m = r.read().decode()
        busy = re.search(r"^tandem_slots_busy (\d+)", m, re.M)
        queued = re.search(r"^tandem_queue_depth (\d+)", m, re.M)
        if (busy is None or busy.group(1) == "0") and (queued is None or queued.group(1) == "0"):
            break
        time.sleep(0.5)
    else:
        raise AssertionError("slots still busy 60 s after their clients left")
    assert_serves(s)


# --- security ---------------------------------------------------------------------


def test_paths_from_requests_and_catalogue_names_stay_inside():
    s = shared()
    with urllib.request.urlopen(s.url("/v1/models"), timeout=30) as r:
        loaded = json.loads(r.read())["data"][0]["id"]
    # model ids are labels answered by the loaded model (as llama-server
    # does), never paths: nothing but the loaded model's object comes back
    for path in ["/v1/models/..%2F..%2Fetc%2Fpasswd", "/v1/models/../../etc/passwd", "/../../etc/passwd", "/v1/models/%2e%2e"]:
        got, _ = raw_exchange(s, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode(), read_timeout=10)
        assert b"root:" not in got, (path, got[:300])
        if status_of(got) == 200:
            body = json.loads(got.split(b"\r\n\r\n", 1)[1])
            assert body["id"] == loaded, (path, body)
        else:
            assert status_of(got) in (400, 404), (path, got[:200])
    # a request's model name is a label, never a file
    status, r = post(s, "/v1/chat/completions", chat_body(model="../../../../etc/passwd", max_tokens=2))
    assert status in (200, 404), (status, r)
    assert "root:" not in json.dumps(r)
    # catalogue names that look like paths are refused before anything is read or written
    with tempfile.TemporaryDirectory() as d:
        for name in ["../../etc/passwd", "/etc/passwd", "..", "a/../../b"]:
            p = subprocess.run([BIN, "fetch", name], capture_output=True, text=True, env={**os.environ, "TANDEM_MODELS_DIR": d}, timeout=60)
            assert p.returncode != 0, (name, p.stdout, p.stderr)
            assert "panicked" not in p.stderr, p.stderr
        assert os.listdir(d) == [], os.listdir(d)


def test_cors_only_when_asked():
    s = shared()
    req = urllib.request.Request(s.url("/v1/models"), headers={"Origin": "https://evil.example"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.headers.get("Access-Control-Allow-Origin") is None
    c = Server("--cors")
    try:
        req = urllib.request.Request(c.url("/v1/models"), headers={"Origin": "https://app.example"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.headers.get("Access-Control-Allow-Origin") == "*"
    finally:
        c.close()


# --- signals ------------------------------------------------------------------------


def test_sigterm_with_requests_in_flight():
    grace = 3
    s = Server("--parallel", "2", "--shutdown-timeout", str(grace))
    outcomes = {}

    def stream(i):
        body = json.dumps(chat_body(f"Write a long story about dragon number {i}.", max_tokens=1000, stream=True)).encode()
        req = urllib.request.Request(s.url("/v1/chat/completions"), data=body, method="POST", headers={"Content-Type": "application/json"})
        events = []
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                for line in r:
                    line = line.decode().strip()
                    if line.startswith("data: "):
                        events.append(line[6:])
            outcomes[i] = ("closed", events)
        except Exception as e:  # noqa: BLE001 - any client-side error is recorded
            outcomes[i] = ("error", repr(e), events)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(3)
    t0 = time.time()
    s.proc.send_signal(signal.SIGTERM)
    try:
        s.proc.wait(timeout=grace + 15)
    except subprocess.TimeoutExpired:
        s.proc.kill()
        raise AssertionError("the server did not exit within the shutdown timeout + 15 s")
    exited = time.time() - t0
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive(), "a client hangs after the server exited"
    # every stream either finished ([DONE]) or was told why it ended (an error event)
    assert len(outcomes) == 4, outcomes
    for i, o in outcomes.items():
        assert o[0] == "closed", f"stream {i} failed on the client: {o[1]}"
        events = o[1]
        done = events and events[-1] == "[DONE]"
        errored = any('"error"' in e for e in events)
        assert done or errored, f"stream {i} ended without [DONE] or an error event: {events[-3:]}"
    assert exited < grace + 10, f"exit took {exited:.1f} s"
    s.close()


def test_sigkill_and_restart_leave_nothing_corrupt():
    with tempfile.TemporaryDirectory() as d:
        cache = os.path.join(d, "suffix.cache")
        s = Server("--suffix", "--suffix-cache", cache)
        for i in range(3):
            status, _ = post(s, "/v1/chat/completions", chat_body(f"Repeat after me: item {i}, item {i}, item {i}.", max_tokens=24))
            assert status == 200
        # kill in the middle of a generation (and of any cache write)
        def doomed():
            try:
                post(s, "/v1/chat/completions", chat_body("Write a long poem.", max_tokens=400), timeout=60)
            except OSError:
                pass  # the server is killed under it

        t = threading.Thread(target=doomed, daemon=True)
        t.start()
        time.sleep(1.5)
        s.proc.send_signal(signal.SIGKILL)
        s.proc.wait(timeout=30)
        leftovers = [f for f in os.listdir(d) if f != "suffix.cache"]
        s2 = Server("--suffix", "--suffix-cache", cache)
        try:
            assert_serves(s2)
            assert not any("error" in line.lower() and "suffix" in line.lower() for line in s2.log), s2.log
        finally:
            s2.close()
        # a cut-short temporary file is at most a leftover, never the cache itself
        for f in leftovers:
            assert f.endswith(".tmp"), leftovers


def _close_shared():
    if _shared is not None:
        _shared.close()


def main():
    return runner.run(globals(), _close_shared)


if __name__ == "__main__":
    sys.exit(main())
