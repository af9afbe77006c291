"""The Python package against the CLI and under misuse.

Run from the repository (the default model is fetched into models/ on first
use): `pytest python/tests`. TANDEM_BIN names the CLI to compare with
(default target/release/tandem).
"""

import gc
import json
import os
import re
import sys
import signal
import subprocess
import threading
import time

import pytest

import tandem

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("TANDEM_BIN", os.path.join(ROOT, "target", "release", "tandem"))
MTP = os.path.join(ROOT, "models", "support", "smollm2-135m-instruct-mtp.gguf")
N = 48


def dev_prompts():
    with open(os.path.join(ROOT, "tests", "data", "prompts-dev.jsonl")) as f:
        return [json.loads(line)["user"] for line in f if line.strip()]


def cli_greedy(prompt, n, *extra):
    out = subprocess.run(
        [BIN, "-p", prompt, "--temp", "0", "-n", str(n), "-t", "2", *extra],
        capture_output=True, text=True, check=True,
    ).stdout
    return out[:-1] if out.endswith("\n") else out


@pytest.fixture(scope="module")
def model():
    return tandem.Model(threads=2, ctx=2048)


@pytest.fixture(scope="module")
def mtp_model():
    return tandem.Model(threads=2, ctx=2048, drafter=MTP)


def ask(m, prompt, max_tokens=N, **kw):
    return m.chat([{"role": "user", "content": prompt}], max_tokens=max_tokens, **kw)


@pytest.mark.parametrize("drafter", [None, MTP], ids=["plain", "mtp"])
def test_greedy_output_equals_the_cli_on_the_dev_prompts(model, mtp_model, drafter):
    m = mtp_model if drafter else model
    extra = ["--drafter", drafter] if drafter else []
    drafted = 0
    for prompt in dev_prompts():
        c = ask(m, prompt)
        assert c.text == cli_greedy(prompt, N, *extra), prompt
        drafted += c.stats.drafted
    assert (drafted > 0) == bool(drafter)


def test_streaming_yields_the_same_text(model, mtp_model):
    prompt = "Write a haiku about the sea."
    for m in (model, mtp_model):
        whole = ask(m, prompt)
        s = ask(m, prompt, stream=True)
        pieces = list(s)
        assert "".join(pieces) == whole.text
        assert s.completion.text == whole.text and s.completion.tokens == whole.tokens
        assert s.completion.stop == whole.stop


def test_raw_generation_and_token_ids(model):
    c = model.generate("The capital of France is", max_tokens=8)
    ids = model.tokenize("The capital of France is")
    assert model.generate(ids, max_tokens=8).text == c.text
    assert model.detokenize(c.tokens) == c.text
    assert c.stats.prompt_tokens == len(ids) and c.stop == "length"
    assert cli_greedy("The capital of France is", 8, "--raw") == c.text


def test_sampling_is_reproducible_with_a_seed(model):
    a = ask(model, "Tell me a joke.", temperature=0.9, seed=7)
    b = ask(model, "Tell me a joke.", temperature=0.9, seed=7)
    assert a.text == b.text


def test_bad_arguments_raise_clear_exceptions(model):
    with pytest.raises(ValueError, match="temperature"):
        model.generate("hi", temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        model.generate("hi", top_p=2.0)
    with pytest.raises(ValueError, match="out of range"):
        model.generate([1, 10**9])
    with pytest.raises(ValueError, match="out of range"):
        model.detokenize([10**9])
    with pytest.raises(ValueError, match="empty prompt"):
        model.generate([])
    with pytest.raises(ValueError, match="does not fit"):
        model.generate([1] * 3000)
    with pytest.raises(ValueError, match=r"messages\[1\]"):
        model.chat([{"role": "user", "content": "hi"}, {"role": "user"}])
    with pytest.raises(ValueError, match=r"messages\[0\]"):
        model.chat(["not a dict"])
    with pytest.raises(TypeError):
        model.generate(3.5)
    with pytest.raises(OverflowError):
        model.generate("hi", max_tokens=-1)
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        tandem.Model("no-such-model.gguf")
    with pytest.raises(ValueError, match="threads"):
        tandem.Model(threads=0)
    with pytest.raises(FileNotFoundError, match="not found"):
        tandem.Model(drafter="/no/such/drafter.gguf")
    with pytest.raises(tandem.TandemError, match="support file"):
        tandem.Model(drafter=os.path.join(ROOT, "tests", "data", "prompts-dev.jsonl"))
    # the model still works
    assert ask(model, "Say hi.").text


def test_an_abandoned_stream_frees_its_session(model):
    whole = ask(model, "Write a story about a robot.", max_tokens=200)
    s = model.chat([{"role": "user", "content": "Write a story about a robot."}], max_tokens=200, stream=True)
    next(s)
    next(s)
    assert model.sessions_in_use == 1
    del s
    gc.collect()
    assert model.sessions_in_use == 0
    # closing, and leaving a with-block, do the same
    with ask(model, "Count to fifty.", stream=True) as s:
        next(s)
    assert model.sessions_in_use == 0
    s = ask(model, "Count to fifty.", stream=True)
    next(s)
    s.close()
    assert model.sessions_in_use == 0 and list(s) == []
    # and the next generation is unaffected
    assert model.chat([{"role": "user", "content": "Write a story about a robot."}], max_tokens=200).text == whole.text


def test_the_gil_is_released_while_generating(model):
    ticks = 0
    done = threading.Event()

    def tick():
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0.001)

    t = threading.Thread(target=tick)
    t.start()
    t0 = time.time()
    model.generate("Once upon a time", max_tokens=128)
    elapsed = time.time() - t0
    done.set()
    t.join()
    # a thread blocked on the GIL would barely tick at all
    assert ticks > 0.3 * elapsed / 0.0011, (ticks, elapsed)


def test_ctrl_c_interrupts_a_generation(model):
    # Python's own Ctrl-C handler, also where the process started with SIGINT
    # ignored (a background job of a non-interactive shell)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
        timer.start()
        t0 = time.time()
        with pytest.raises(KeyboardInterrupt):
            model.generate("Once upon a time", max_tokens=1900)
        assert time.time() - t0 < 3.0
        assert model.sessions_in_use == 0
    finally:
        signal.signal(signal.SIGINT, before)


def test_the_readme_example_runs_as_written():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    example = re.search(r"```python\n(.*?)```", readme[readme.index("## Python"):], re.S).group(1)
    r = subprocess.run([sys.executable, "-c", example], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert re.search(r"\d+ of \d+ drafted tokens accepted", r.stdout), r.stdout
    answer = cli_greedy("Why is the sky blue?", 64)
    assert r.stdout.startswith(answer + "\n"), (r.stdout, answer)
