"""Tiny urllib helpers for the conformance suite, and the shape checks its tests share.

Black-box: nothing here imports llmd. `Client` talks to any OpenAI-compatible base URL
(".../v1"); `iter_sse` reads a stream strictly, the way a naive OpenAI client would.
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from email.message import Message
from typing import Any, Iterable, Iterator

TIMEOUT = 60.0          # seconds, for every connect and every read
MAX_TOKENS = 16         # generation stays short everywhere


class SSEError(AssertionError):
    """The byte stream is not OpenAI-style SSE framing."""


@dataclass
class Response:
    status: int
    headers: Message
    body: bytes

    @property
    def content_type(self) -> str:
        return (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError as exc:
            raise AssertionError(
                f"HTTP {self.status} body is not JSON: {self.body[:300]!r}") from exc


@dataclass
class Stream:
    """A fully read streaming response. `chunks` holds every parsed `data:` payload
    before `[DONE]`; for a non-200 answer it is empty and `body` holds the response."""
    status: int
    headers: Message
    chunks: list[Any] = field(default_factory=list)
    body: bytes = b""

    @property
    def content_type(self) -> str:
        return (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()

    def json(self) -> Any:
        return Response(self.status, self.headers, self.body).json()


class Client:
    def __init__(self, base_url: str, api_key: str | None = None, model: str | None = None):
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.model = model

    @property
    def origin(self) -> str:
        """The base URL without its trailing /v1 (where llmd's extension routes live)."""
        return self.base_url[:-3] if self.base_url.endswith("/v1") else self.base_url

    def url(self, path: str) -> str:
        return path if path.startswith(("http://", "https://")) else self.base_url + path

    def _open(self, method: str, path: str, body: Any = None, headers: dict | None = None):
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url(path), data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        for name, value in (headers or {}).items():
            req.add_header(name, value)
        try:
            return urllib.request.urlopen(req, timeout=TIMEOUT)
        except urllib.error.HTTPError as err:   # a non-2xx answer is still an answer
            return err

    def request(self, method: str, path: str, body: Any = None,
                headers: dict | None = None) -> Response:
        with self._open(method, path, body, headers) as resp:
            return Response(resp.status, resp.headers, resp.read())

    def get_json(self, path: str) -> Response:
        return self.request("GET", path)

    def post_json(self, path: str, body: Any) -> Response:
        return self.request("POST", path, body)

    def post_stream(self, path: str, body: Any) -> Stream:
        with self._open("POST", path, body) as resp:
            if resp.status != 200:
                return Stream(resp.status, resp.headers, body=resp.read())
            return Stream(resp.status, resp.headers, chunks=list(iter_sse(resp)))

    def post_events(self, path: str, body: Any, headers: dict | None = None) -> Stream:
        """A stream of named events (Responses, Anthropic Messages): `chunks` holds
        (event name, parsed data) pairs."""
        with self._open("POST", path, body, headers) as resp:
            if resp.status != 200:
                return Stream(resp.status, resp.headers, body=resp.read())
            return Stream(resp.status, resp.headers, chunks=list(iter_named_sse(resp)))

    # --- request builders: the configured model, greedy, short ----------------------

    def chat_body(self, messages: list[dict], **params: Any) -> dict:
        return {"model": self.model, "messages": messages,
                "max_tokens": MAX_TOKENS, "temperature": 0, **params}

    def chat(self, messages: list[dict], **params: Any) -> Response:
        return self.post_json("/chat/completions", self.chat_body(messages, **params))

    def chat_stream(self, messages: list[dict], **params: Any) -> Stream:
        body = self.chat_body(messages, stream=True, **params)
        return self.post_stream("/chat/completions", body)

    def completion_body(self, prompt: Any, **params: Any) -> dict:
        return {"model": self.model, "prompt": prompt,
                "max_tokens": MAX_TOKENS, "temperature": 0, **params}

    def completion(self, prompt: Any, **params: Any) -> Response:
        return self.post_json("/completions", self.completion_body(prompt, **params))

    def completion_stream(self, prompt: Any, **params: Any) -> Stream:
        body = self.completion_body(prompt, stream=True, **params)
        return self.post_stream("/completions", body)


def iter_sse(lines: Iterable[bytes]) -> Iterator[Any]:
    """Yield the parsed JSON payload of each event, checking OpenAI-style framing.

    Accepted: `data: <json>` lines (one per event), `:` comment lines, blank lines that
    end events, LF or CRLF line ends. Refused with SSEError: `event:`/`id:`/`retry:` or
    any other field, `data:` without the space, an event spread over several data lines
    (naive clients parse line by line), a payload that is not JSON, an event not ended
    by a blank line, anything after `data: [DONE]`, and a stream without `[DONE]`.
    """
    data: str | None = None
    done = False
    for n, raw in enumerate(lines, 1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SSEError(f"line {n} is not UTF-8: {raw[:200]!r}") from exc
        if text.endswith("\r\n"):
            line = text[:-2]
        elif text.endswith("\n"):
            line = text[:-1]
        else:
            raise SSEError(f"stream ended inside line {n}: {text[:200]!r}")
        if done:
            if line:
                raise SSEError(f"line {n} comes after data: [DONE]: {line[:200]!r}")
            continue
        if line == "":
            if data is None:
                continue
            payload, data = data, None
            if payload == "[DONE]":
                done = True
                continue
            try:
                yield json.loads(payload)
            except ValueError as exc:
                raise SSEError(
                    f"data payload before line {n} is not JSON: {payload[:200]!r}") from exc
            continue
        if line.startswith(":"):
            continue
        if not line.startswith("data: "):
            raise SSEError(f"line {n} is not 'data: ...' nor a ':' comment: {line[:200]!r}")
        if data is not None:
            raise SSEError(f"line {n}: two data lines in one event (missing blank line?)")
        data = line[len("data: "):]
    if data is not None:
        raise SSEError(f"last event is not terminated by a blank line: {data[:200]!r}")
    if not done:
        raise SSEError("stream ended without data: [DONE]")


def iter_named_sse(lines: Iterable[bytes]) -> Iterator[tuple[str, Any]]:
    """Yield (event name, parsed JSON data) of each event of a named-event stream.

    Each event must be one `event:` line, then one `data:` line with JSON whose `type`
    equals the event name, then a blank line; `:` comments may come between events.
    Refused with SSEError: other fields, a missing name or data, a type that
    disagrees with the name, a `[DONE]` sentinel (these streams end without one).
    """
    name: str | None = None
    data: str | None = None
    for n, raw in enumerate(lines, 1):
        text = raw.decode("utf-8")
        if not text.endswith("\n"):
            raise SSEError(f"stream ended inside line {n}: {text[:200]!r}")
        line = text.rstrip("\r\n")
        if line == "":
            if name is None and data is None:
                continue
            if name is None or data is None:
                raise SSEError(f"event before line {n} lacks an event name or data: {name!r} {data!r}")
            payload = json.loads(data)
            if not isinstance(payload, dict) or payload.get("type") != name:
                raise SSEError(f"event {name!r} carries data of type {payload.get('type')!r}")
            yield name, payload
            name = data = None
        elif line.startswith(":"):
            continue
        elif line.startswith("event: ") and name is None and data is None:
            name = line[len("event: "):]
        elif line.startswith("data: ") and name is not None and data is None:
            data = line[len("data: "):]
            if data == "[DONE]":
                raise SSEError("named-event streams end without data: [DONE]")
        else:
            raise SSEError(f"line {n} is out of place: {line[:200]!r}")
    if name is not None or data is not None:
        raise SSEError("last event is not terminated by a blank line")


# --- shape checks shared by the tests --------------------------------------------------

FINISH_REASONS = {"stop", "length", "tool_calls"}


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def assert_recent(created: Any) -> None:
    """`created` is a Unix time in whole seconds, within a day of this machine's clock."""
    assert is_int(created), f"created must be an integer, got {created!r}"
    assert abs(created - time.time()) < 86400, f"created={created} is not a current Unix time"


def assert_error(resp: Response | Stream, status: int, param: Any = ...,
                 code: Any = ...) -> dict:
    """An OpenAI error answer: this status, a JSON body {"error": {message, type, param,
    code}} with all four keys; `param`/`code` are compared when given. Returns the error."""
    assert resp.status == status, f"expected HTTP {status}, got {resp.status}: {resp.body[:300]!r}"
    assert resp.content_type == "application/json", f"error Content-Type {resp.content_type!r}"
    body = resp.json()
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), body
    err = body["error"]
    missing = {"message", "type", "param", "code"} - err.keys()
    assert not missing, f"error object lacks {sorted(missing)}: {err}"
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    assert err["param"] is None or isinstance(err["param"], str), err
    assert err["code"] is None or isinstance(err["code"], (str, int)), err
    if param is not ...:
        assert err["param"] == param, f"expected param {param!r}: {err}"
    if code is not ...:
        assert err["code"] == code, f"expected code {code!r}: {err}"
    return err


def assert_ok(resp: Response) -> Any:
    """HTTP 200 with a JSON body; returns the body."""
    assert resp.status == 200, f"HTTP {resp.status}: {resp.body[:500]!r}"
    assert resp.content_type == "application/json", f"Content-Type {resp.content_type!r}"
    return resp.json()


def assert_usage(usage: Any, max_completion: int | None = MAX_TOKENS) -> None:
    """OpenAI usage: non-negative integer counts, total = prompt + completion, and
    prompt_tokens_details.cached_tokens an integer within the prompt."""
    assert isinstance(usage, dict), f"usage must be an object, got {usage!r}"
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert is_int(usage.get(key)) and usage[key] >= 0, f"usage.{key}: {usage}"
    assert usage["prompt_tokens"] > 0, usage
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], usage
    if max_completion is not None:
        assert usage["completion_tokens"] <= max_completion, usage
    details = usage.get("prompt_tokens_details")
    assert isinstance(details, dict), f"usage.prompt_tokens_details missing: {usage}"
    cached = details.get("cached_tokens")
    assert is_int(cached) and 0 <= cached <= usage["prompt_tokens"], usage


def assert_no_error_chunk(chunks: list[Any]) -> None:
    """No in-stream `data: {"error": ...}` event (a failure after the headers were sent)."""
    for chunk in chunks:
        assert not (isinstance(chunk, dict) and "error" in chunk), f"error event: {chunk}"


def assert_tool_call(call: Any, names: set[str]) -> None:
    """One complete tool call of a non-streaming message."""
    assert isinstance(call, dict), call
    assert isinstance(call.get("id"), str) and call["id"].startswith("call_"), call
    assert call.get("type") == "function", call
    fn = call.get("function")
    assert isinstance(fn, dict), call
    assert fn.get("name") in names, f"tool name {fn.get('name')!r} not among {sorted(names)}"
    assert_arguments(fn.get("arguments"))


def assert_arguments(arguments: Any) -> None:
    """function.arguments is a string holding a JSON object."""
    assert isinstance(arguments, str), f"arguments must be a JSON string, got {arguments!r}"
    try:
        parsed = json.loads(arguments)
    except ValueError as exc:
        raise AssertionError(f"arguments is not JSON: {arguments!r}") from exc
    assert isinstance(parsed, dict), f"arguments is not a JSON object: {arguments!r}"
