"""examples/c/generate.c, compiled with the system's C compiler against
libtandem.a, answers the dev prompts with the same text as `tandem -p`,
with and without a drafter.

Run from the repository: `pytest tests/c` (builds the library with cargo
first; TANDEM_BIN names the CLI, default target/release/tandem).
"""

import json
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("TANDEM_BIN", os.path.join(ROOT, "target", "release", "tandem"))
MTP = os.path.join(ROOT, "models", "support", "smollm2-135m-instruct-mtp.gguf")
N = 48


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    subprocess.run(["cargo", "build", "--release", "-p", "tandem-capi"], cwd=ROOT, check=True)
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    assert cc, "no C compiler"
    out = str(tmp_path_factory.mktemp("c") / "generate")
    subprocess.run(
        [cc, "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-I", os.path.join(ROOT, "include"),
         os.path.join(ROOT, "examples", "c", "generate.c"), os.path.join(ROOT, "target", "release", "libtandem.a"),
         "-lm", "-lpthread", "-ldl", "-o", out],
        check=True,
    )
    return out


def dev_prompts():
    with open(os.path.join(ROOT, "tests", "data", "prompts-dev.jsonl")) as f:
        return [json.loads(line)["user"] for line in f if line.strip()]


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)


@pytest.mark.parametrize("drafter", [None, MTP], ids=["plain", "mtp"])
def test_the_c_example_answers_as_the_cli_does(example, drafter):
    for prompt in dev_prompts():
        c = run([example, "-t", "2", "-n", str(N)] + (["-d", drafter] if drafter else []) + [prompt])
        cli = run([BIN, "-p", prompt, "--temp", "0", "-n", str(N), "-t", "2"] + (["--drafter", drafter] if drafter else []))
        assert c.stdout == cli.stdout, prompt
        assert ("cycles" in c.stderr) == bool(drafter), c.stderr


def test_the_c_example_reports_errors(example):
    r = subprocess.run([example, "-m", "/no/such/model.gguf", "hi"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 1
    assert "error: opening the engine: " in r.stderr and "/no/such/model.gguf" in r.stderr
    r = subprocess.run([example, "-d", "/no/such/drafter.gguf", "hi"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 1 and "drafter.gguf" in r.stderr


def test_the_readme_c_program_runs_as_written(example, tmp_path):
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    section = readme[readme.index("## C API"):]
    program = re.search(r"```c\n(.*?)```", section, re.S).group(1)
    build = re.search(r"```sh\n.*?\n(cc .*?) && ./hello", section, re.S).group(1)
    (tmp_path / "hello.c").write_text(program)
    # the README's own compile command, run from the checkout with hello.c in it
    src = os.path.join(ROOT, "hello.c")
    shutil.copy(tmp_path / "hello.c", src)
    try:
        subprocess.run(build + " -Wall -Werror -o " + str(tmp_path / "hello"), shell=True, cwd=ROOT, check=True)
    finally:
        os.remove(src)
    r = run([str(tmp_path / "hello")])
    assert re.search(r"\[\d+ tokens, \d+ of \d+ drafted accepted\]", r.stdout), r.stdout
    # the program writes its conversation by hand (no system turn): the CLI's --raw
    prompt = "<|im_start|>user\nWhy is the sky blue?<|im_end|>\n<|im_start|>assistant\n"
    cli = run([BIN, "-p", prompt, "--raw", "--temp", "0", "-n", "256", "--drafter", MTP])
    assert r.stdout.startswith(cli.stdout[:-1]), (r.stdout, cli.stdout)
