"""The status and chat page at / in a real headless chromium, against a running llmd.

Chromium is driven over the DevTools protocol on a pipe rather than with
`--dump-dom --virtual-time-budget`: virtual time keeps running while a streamed
response body is still arriving, so a dump taken that way can cut a reply short.
"""
from __future__ import annotations

import base64
import fcntl
import http.server
import json
import os
import re
import select
import shutil
import subprocess
import threading
import time
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.conftest import running_llmd

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1280,900", "--remote-debugging-pipe"]
MODEL = "SmolLM2-135M-Instruct"
PAGE = Path(__file__).resolve().parents[2] / "llmd" / "static" / "index.html"

class Browser:
    """Headless chromium; DevTools commands go in on its fd 3, replies come out on fd 4,
    each message a JSON text ended by a NUL byte."""

    def __init__(self, profile: Path):
        commands_in, self.commands = os.pipe()
        self.replies, replies_out = os.pipe()
        # Move the child's ends above the stdio range so placing them at 3 and 4 in the
        # child cannot overwrite one with the other.
        high_in = fcntl.fcntl(commands_in, fcntl.F_DUPFD_CLOEXEC, 10)
        high_out = fcntl.fcntl(replies_out, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(commands_in)
        os.close(replies_out)
        self.proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            close_fds=False, preexec_fn=lambda: (os.dup2(high_in, 3), os.dup2(high_out, 4)))
        os.close(high_in)
        os.close(high_out)
        self.buffer = b""
        self.next_id = 0
        self.session: str | None = None

    def send(self, method: str, timeout: float = 30.0, **params) -> dict:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if self.session:
            message["sessionId"] = self.session
        os.write(self.commands, json.dumps(message).encode() + b"\0")
        reply = self._receive(lambda m: m.get("id") == self.next_id, method, timeout)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply["result"]

    def _receive(self, wanted, what: str, timeout: float) -> dict:
        """The first message for which wanted(message) is true; others are dropped."""
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self.buffer:
                raw, self.buffer = self.buffer.split(b"\0", 1)
                message = json.loads(raw)
                if wanted(message):
                    return message
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.replies], [], [], left)[0]:
                raise TimeoutError(f"chromium: no {what} within {timeout}s")
            data = os.read(self.replies, 1 << 20)
            if not data:
                raise RuntimeError("chromium exited")
            self.buffer += data

    def open(self, url: str) -> None:
        """Load url in a new tab and wait for its load event."""
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.send("Page.enable")
        self.send("Page.navigate", url=url)
        self._receive(lambda m: m.get("method") == "Page.loadEventFired", "load event", 30)

    def evaluate(self, expression: str, timeout: float = 30.0):
        """The value of a JS expression in the page; a promise is awaited."""
        result = self.send("Runtime.evaluate", timeout=timeout + 5, expression=expression,
                           awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, condition: str, timeout: float = 60.0) -> None:
        """Poll a JS condition in the page until it is true."""
        ok = self.evaluate(f"""new Promise((resolve) => {{
            const end = Date.now() + {int(timeout * 1000)};
            const check = () => ({condition}) ? resolve(true)
                : Date.now() > end ? resolve(false) : setTimeout(check, 50);
            check(); }})""", timeout)
        assert ok, f"timed out waiting for {condition}"

    def key(self, key: str, code: str, text: str = "") -> None:
        for kind in ("keyDown", "keyUp"):
            self.send("Input.dispatchKeyEvent", type=kind, key=key, code=code, text=text if kind == "keyDown" else "",
                      windowsVirtualKeyCode=13 if key == "Enter" else 0)

    def dom(self) -> str:
        return self.evaluate("document.documentElement.outerHTML")

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"]))

    def close(self) -> None:
        try:
            self.session = None
            self.send("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.commands)
        os.close(self.replies)


class Elements(HTMLParser):
    """Text and attributes of the elements that have an id or a class, from a DOM dump."""

    def __init__(self, html: str):
        super().__init__()
        self.found: list[dict] = []
        self.open: list[dict] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        element = {"tag": tag, **{k: v or "" for k, v in attrs}, "text": ""}
        if tag not in ("meta", "link", "input", "br"):
            self.open.append(element)
        self.found.append(element)

    def handle_endtag(self, tag):
        if self.open and self.open[-1]["tag"] == tag:
            self.open.pop()

    def handle_data(self, data):
        for element in self.open:
            element["text"] += data

    def by_class(self, cls: str) -> list[dict]:
        return [e for e in self.found if cls in e.get("class", "").split()]

    def by_id(self, ident: str) -> dict:
        return next(e for e in self.found if e.get("id") == ident)


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


@pytest.fixture
def browser(tmp_path):
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip("chromium is not installed (apt-get install chromium)")
    b = Browser(tmp_path / "profile")
    yield b
    b.close()


@pytest.fixture(scope="module")
def server():
    with running_llmd("--max-sessions", "3", "--ctx", "512") as url:
        yield url


def test_page_is_one_self_contained_html_document(server):
    with urllib.request.urlopen(server + "/", timeout=10) as response:
        html = response.read().decode()
        assert response.headers["Content-Type"] == "text/html; charset=utf-8"
        assert "default-src 'self'" in response.headers["Content-Security-Policy"]
    assert html == PAGE.read_text()
    assert html.startswith("<!doctype html>") and '<html lang="en">' in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # no external assets
    assert not re.search(r"""@import|url\(\s*["']?(https?:)?//""", html)
    page = Elements(html)
    for field in page.found:
        if field["tag"] in ("textarea", "input"):
            assert any(e["tag"] == "label" and e.get("for") == field["id"] for e in page.found), field["id"]


def test_page_streams_a_reply_with_its_stats_and_resumes_warm(browser, server, tmp_path):
    prompt = "Name three colors."
    browser.open(f"{server}/?prompt={prompt.replace(' ', '%20')}&max_tokens=12&temperature=0")
    browser.wait_for("document.querySelector('.msg.assistant[data-state=done] .stats')")
    page = Elements(browser.dom())
    expected = post(server + "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 12, "temperature": 0})

    reply = page.by_class("assistant")[0]
    assert page.by_class("user")[0]["text"] == "You" + prompt
    assert reply["data-state"] == "done"
    assert page.by_class("content")[1]["text"] == expected["choices"][0]["message"]["content"] != ""
    stats = page.by_class("stats")[0]
    assert int(stats["data-prompt"]) == expected["usage"]["prompt_tokens"]
    assert int(stats["data-generated"]) == expected["usage"]["completion_tokens"]
    assert stats["data-cached"] == "0"
    assert float(stats["data-ttft-ms"]) > 0 and float(stats["data-tok-s"]) > 0
    assert "first token" in stats["text"] and "tok/s" in stats["text"]

    session = page.by_id("session-id")["text"]
    listed = json.loads(urllib.request.urlopen(server + "/v1/sessions", timeout=10).read())["data"]
    assert [s["id"] for s in listed] == [session]
    assert listed[0]["resident_tokens"] >= expected["usage"]["prompt_tokens"]

    # A follow-up typed and sent with the keyboard resumes the same session warm.
    browser.evaluate("document.getElementById('prompt').focus()")
    browser.send("Input.insertText", text="And one more?")
    browser.key("Enter", "Enter", "\r")
    browser.wait_for("document.querySelectorAll('.msg.assistant[data-state=done] .stats').length == 2")
    browser.wait_for("document.querySelector('#sessions tbody tr.mine')")
    page = Elements(browser.dom())
    second = page.by_class("stats")[1]
    assert int(second["data-cached"]) >= int(stats["data-prompt"])
    assert int(second["data-prompt"]) > int(stats["data-prompt"]) + int(stats["data-generated"])
    assert page.by_class("mine")[0]["text"].startswith(session + " (this chat)")
    browser.screenshot(tmp_path / "page.png")
    assert (tmp_path / "page.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Reset empties the session's cache and the transcript; the session keeps its slot.
    browser.evaluate("document.getElementById('reset').click()")
    browser.wait_for("document.querySelectorAll('.msg').length == 0")
    listed = json.loads(urllib.request.urlopen(server + "/v1/sessions", timeout=10).read())["data"]
    assert [(s["id"], s["resident_tokens"]) for s in listed] == [(session, 0)]

    # Delete frees the session on the server and starts a new one in the page.
    browser.evaluate("document.getElementById('delete').click()")
    browser.wait_for(f"document.getElementById('session-id').textContent != {json.dumps(session)}")
    listed = json.loads(urllib.request.urlopen(server + "/v1/sessions", timeout=10).read())["data"]
    assert listed == []


class FakeServer(http.server.BaseHTTPRequestHandler):
    """Serves the page and answers /v1 routes only with the right bearer key."""

    seen: list[str] = []

    def do_GET(self):
        if self.path == "/":
            return self._reply(200, PAGE.read_bytes(), "text/html")
        FakeServer.seen.append(self.headers.get("Authorization", ""))
        if self.headers.get("Authorization") != "Bearer sekret":
            body = {"error": {"message": "Invalid API key.", "type": "authentication_error",
                              "param": None, "code": "invalid_api_key"}}
            return self._reply(401, json.dumps(body).encode(), "application/json")
        if self.path == "/v1/models":
            body = {"object": "list", "data": [{"id": "fake-model", "meta": {"n_ctx": 64, "max_sessions": 2}}]}
        else:
            body = {"object": "list", "data": [], "capacity": 1}
        self._reply(200, json.dumps(body).encode(), "application/json")

    def _reply(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_page_sends_the_saved_api_key_as_a_bearer_token(browser):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        browser.open(f"http://127.0.0.1:{server.server_port}/")
        browser.wait_for("!document.getElementById('error').hidden")
        assert "API key" in Elements(browser.dom()).by_id("error")["text"]
        browser.evaluate("document.getElementById('api-key').value = 'sekret';"
                         "document.getElementById('settings').requestSubmit()")
        browser.wait_for("document.getElementById('model-name').textContent == 'fake-model'")
        browser.wait_for("document.getElementById('error').hidden")  # once the sessions load too
        assert FakeServer.seen[0] == "" and FakeServer.seen[-1] == "Bearer sekret"
        assert browser.evaluate("localStorage.getItem('llmd.apiKey')") == "sekret"
        assert Elements(browser.dom()).by_id("error")["text"] == ""
    finally:
        server.shutdown()
        server.server_close()
