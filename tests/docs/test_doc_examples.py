"""Every example in README.md and docs/ runs as shown against the default model.

The convention (docs/development/testing.md):
- a ```sh block is run, one command at a time, by bash; it may hold only `curl`
  commands (and comments), unless its first line is `# not run: <reason>`;
- a ```python block is run by this Python, when the `openai` package is importable;
- any other fence (```text, ```console, a bare ```) is not an example.
A server is started once for the module on a free port; the examples' host and port,
127.0.0.1:8000, are rewritten to it and nothing else is changed. Examples run in the
order they appear, file by file, so a later block may use a session an earlier one made.
"""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from tests.conftest import free_port

ROOT = pathlib.Path(__file__).resolve().parents[2]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
ADDRESS = "127.0.0.1:8000"
NOT_RUN = re.compile(r"#\s*not run:\s*(\S.*)")


def blocks(path: pathlib.Path) -> list[tuple[str, int, str]]:
    """(language, first line number, code) of each fenced block in a markdown file."""
    found, lines = [], path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^(`{3,})(\S*)\s*$", lines[i])
        if fence:
            end = i + 1
            while end < len(lines) and lines[end].strip() != fence.group(1):
                end += 1
            found.append((fence.group(2), i + 1, "\n".join(lines[i + 1:end])))
            i = end
        i += 1
    return found


def examples() -> list:
    params = []
    for path in FILES:
        for lang, line, code in blocks(path):
            if lang not in ("sh", "python"):
                continue
            name = f"{path.relative_to(ROOT)}:{line}"
            first = code.strip().splitlines()[0] if code.strip() else ""
            marks = []
            if m := NOT_RUN.match(first):
                marks.append(pytest.mark.skip(reason=f"marked not run: {m.group(1)}"))
            params.append(pytest.param(lang, code, id=name, marks=marks))
    return params


def commands(script: str) -> list[str]:
    """The shell commands of a block, comment lines dropped: a command goes on over a
    line that ends with a backslash or inside an open quote (a JSON body over lines)."""
    found, current = [], ""
    for line in script.splitlines():
        if not current and (not line.strip() or line.strip().startswith("#")):
            continue
        current += line + "\n"
        if current.rstrip().endswith("\\"):
            continue
        try:
            shlex.split(current)
        except ValueError:  # a quote is still open
            continue
        found.append(current.strip())
        current = ""
    assert not current, f"unterminated command: {current}"
    return found



@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`python -m llmd` on the default model; its address once /health says ok.
    The wait has no fixed length: it goes on while the server's log grows or /health
    answers "loading", and gives up after 120 s without either, or if the process ends."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("docs") / "llmd.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "llmd", "--port", str(port)], stdout=log,
                                stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        last_progress, seen = time.monotonic(), -1
        while True:
            if proc.poll() is not None:
                pytest.fail(f"llmd exited with {proc.returncode}:\n{log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as resp:
                    if json.load(resp).get("status") == "ok":
                        break
            except urllib.error.HTTPError as exc:  # 503 while loading
                if exc.code == 503:
                    last_progress = time.monotonic()
            except OSError:
                pass
            size = log_path.stat().st_size
            if size != seen:
                seen, last_progress = size, time.monotonic()
            if time.monotonic() - last_progress > 120:
                pytest.fail(f"llmd made no progress for 120 s:\n{log_path.read_text()[-2000:]}")
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def check_answer(command: str, out: str) -> None:
    """A curl's output is a sensible answer: JSON that is not an error, a stream of
    server-sent events that ends with [DONE], or the Prometheus text of /metrics."""
    assert out.strip(), f"empty answer to: {command}"
    if "/metrics" in command:
        assert "llmd_requests_total" in out
        return
    if out.lstrip().startswith(("data:", ":", "event:")):
        data = [line[5:].strip() for line in out.splitlines() if line.startswith("data:")]
        assert data and data[-1] == "[DONE]", f"stream did not end with [DONE]: {command}"
        events = [json.loads(d) for d in data[:-1]]
        assert not any("error" in e for e in events), out[-500:]
        text = "".join(c["delta"].get("content") or "" for e in events for c in e.get("choices", []))
        assert text.strip(), f"the stream carried no text: {command}"
        return
    body = json.loads(out)
    assert body.get("error") is None, body  # a Responses object carries "error": null
    for choice in body.get("choices", []):
        content = choice.get("message", {}).get("content") if "message" in choice else choice.get("text")
        assert content and content.strip(), f"empty reply: {body}"
        if '"response_format"' in command:  # constrained: the reply parses whatever the model
            json.loads(content)
    if body.get("object") == "response":
        assert any(part.get("text", "").strip() for item in body["output"] for part in item.get("content", [])), body
    if body.get("type") == "message":
        assert any(block.get("text", "").strip() for block in body["content"]), body
    if '"role": "assistant"' in command:  # a later turn of a conversation resumes warm
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, body["usage"]


@pytest.mark.parametrize("lang, code", examples())
def test_example_runs(server, lang, code, tmp_path):
    code = code.replace(ADDRESS, server)
    if lang == "sh":
        for command in commands(code):
            assert shlex.split(command)[0] == "curl", (
                f"a ```sh example may only run curl; mark it `# not run: <reason>` otherwise: {command}")
            result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=300)
            assert result.returncode == 0, f"{command}\n{result.stderr}"
            check_answer(command, result.stdout)
        return
    if importlib.util.find_spec("openai") is None:
        pytest.skip("the Python examples use the `openai` package, which is not installed (pip install openai)")
    script = tmp_path / "example.py"
    script.write_text(code)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip(), "the example printed nothing"
    for cached in re.findall(r"cached[^\d\n]*(\d+)", result.stdout):  # printed by the session examples
        assert int(cached) > 0, result.stdout
