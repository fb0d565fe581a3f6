"""Shared pytest fixtures. Each block says who uses it; add yours in a block of its own."""
from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from tests.support.gguf_writer import TinyLlama, write_tiny_llama


# ---- tiny GGUF models (engine-layer tests: test_gguf, test_engine) ----------------

@pytest.fixture(scope="session")
def tiny_llama_factory(tmp_path_factory):
    """make(**write_tiny_llama options) -> TinyLlama; each distinct set of options is
    written once per test session."""
    cache: dict[str, TinyLlama] = {}

    def make(**options) -> TinyLlama:
        key = repr(sorted(options.items()))
        if key not in cache:
            path = tmp_path_factory.mktemp("tiny_llama") / "model.gguf"
            cache[key] = write_tiny_llama(path, **options)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def tiny_model(tiny_llama_factory) -> TinyLlama:
    """The default tiny llama: F32 weights, 300 tokens, 64 dims, 2 layers, n_ctx 128."""
    return tiny_llama_factory()


# ---- a real llmd server on the default model (conformance suite, API tests) -------

def free_port() -> int:
    """A TCP port of this machine that no one listens on now (servers the tests start)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Llmd:
    url: str                  # http://127.0.0.1:PORT
    proc: subprocess.Popen    # for signals, exit codes and /proc/PID


@contextlib.contextmanager
def llmd_process(*flags: str, timeout: float = 120.0, stderr=subprocess.DEVNULL,
                 env: dict[str, str] | None = None):
    """Run `python -m llmd --port 0 FLAGS` for the block; yields an Llmd once it is
    ready. `stderr` takes a file to keep the log; `env` adds environment variables."""
    proc = subprocess.Popen([sys.executable, "-m", "llmd", "--port", "0", *flags],
                            stdout=subprocess.PIPE, stderr=stderr, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    try:
        deadline = time.monotonic() + timeout
        url = None
        for line in proc.stdout:
            if m := re.search(r"llmd ready on (http://\S+)", line):
                url = m.group(1)
                break
            if time.monotonic() > deadline:
                break
        if url is None:
            raise RuntimeError(f"llmd did not start (exit code {proc.poll()})")
        yield Llmd(url, proc)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stdout.close()


@contextlib.contextmanager
def running_llmd(*flags: str, timeout: float = 120.0, stderr=subprocess.DEVNULL):
    """Run `python -m llmd --port 0 FLAGS` for the block; yields its base URL once ready.
    Its log goes to `stderr` (a file object), by default nowhere."""
    with llmd_process(*flags, timeout=timeout, stderr=stderr) as server:
        yield server.url


@pytest.fixture(scope="session")
def openai_server():
    """llmd on the default model, exported as OPENAI_BASE_URL unless one is given."""
    if os.environ.get("OPENAI_BASE_URL"):
        yield os.environ["OPENAI_BASE_URL"]
        return
    with running_llmd() as url:
        os.environ["OPENAI_BASE_URL"] = url + "/v1"
        try:
            yield os.environ["OPENAI_BASE_URL"]
        finally:
            del os.environ["OPENAI_BASE_URL"]


# ---- the default model in process (golden and real-model engine tests) -----------

@pytest.fixture(scope="session")
def default_engine():
    """The default model, opened once; its absence is an error (run `python -m llmd pull`)."""
    from llmd.engine import fetch
    from llmd.engine.native import Engine

    with Engine(str(fetch.default_model(fetch=False)), n_ctx=2048, max_sessions=8) as engine:
        yield engine
