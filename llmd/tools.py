"""Tool calls in model output: the Hermes `<tool_call>{json}</tool_call>` convention.

Theory of operation. The model answers with text in which each call is a block

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

A block is a call when its body is a JSON object whose `name` is one of the declared
tools and whose `arguments` is an object (or a JSON string holding one; missing means
{}). Any other block, and a block never closed, stays in the content as written.
Whitespace between content and a call block is layout, not content, and is dropped.

`ToolCallStream` works on text deltas for SSE: text outside blocks is released at
once, except a tail that could still become a block (trailing whitespace, a partial
`<tool_call>`); a block is held until its closing tag and then released as one tool
call with its full arguments, or as content when invalid. `parse_tool_calls` runs
the same machine over the whole text, so streamed and non-streamed answers agree.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Union

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ContentDelta:
    """Text for `delta.content`."""

    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """One complete tool call; `arguments` is a JSON object as a string."""

    index: int
    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI `tool_calls` entry, without the streaming-only `index`."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}

    def to_openai_delta(self) -> dict[str, Any]:
        """The entry for a streamed `delta.tool_calls` list."""
        return {"index": self.index, **self.to_openai()}


ToolEvent = Union[ContentDelta, ToolCallDelta]


def new_call_id() -> str:
    """A fresh OpenAI-style call id: `call_` and 24 hex digits."""
    return "call_" + secrets.token_hex(12)


def tool_names(tools: Iterable[dict[str, Any]] | None) -> frozenset[str]:
    """Names of the declared function tools, OpenAI-shaped or flat {name, ...} records."""
    return frozenset(t.get("function", t)["name"] for t in tools or ())


def decode_call(body: str, names: frozenset[str]) -> tuple[str, str] | None:
    """(name, arguments JSON) for a valid block body, else None."""
    try:
        call = json.loads(body)
    except ValueError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    if call["name"] not in names:
        return None
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return call["name"], json.dumps(arguments, ensure_ascii=False)


def _partial_open_len(text: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of OPEN_TAG."""
    for n in range(min(len(OPEN_TAG) - 1, len(text)), 0, -1):
        if text.endswith(OPEN_TAG[:n]):
            return n
    return 0


class ToolCallStream:
    """Incremental tool-call parser: `feed` text deltas, then `finish` once."""

    def __init__(self, tools: Iterable[dict[str, Any]] | None,
                 new_id: Callable[[], str] = new_call_id) -> None:
        self._names = tool_names(tools)
        self._new_id = new_id
        self._buf = ""          # outside: held-back tail; inside: block body so far
        self._inside = False
        self._lead_ws = ""      # whitespace before the open block, dropped if it is a call
        self._after_call = False
        self.calls = 0          # tool calls emitted so far

    def feed(self, text: str) -> list[ToolEvent]:
        """Events that `text` makes certain; consecutive content is merged."""
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> list[ToolEvent]:
        """Release everything still held: an unclosed block becomes content."""
        return self._drain(final=True)

    def _drain(self, final: bool) -> list[ToolEvent]:
        events: list[ToolEvent] = []

        def content(text: str) -> None:
            if not text:
                return
            if events and isinstance(events[-1], ContentDelta):
                events[-1] = ContentDelta(events[-1].text + text)
            else:
                events.append(ContentDelta(text))

        while True:
            if self._inside:
                end = self._buf.find(CLOSE_TAG)
                if end < 0:
                    if final:
                        content(self._lead_ws + OPEN_TAG + self._buf)
                        self._buf, self._inside = "", False
                    return events
                body, self._buf = self._buf[:end], self._buf[end + len(CLOSE_TAG):]
                self._inside = False
                call = decode_call(body, self._names)
                if call is None:
                    content(self._lead_ws + OPEN_TAG + body + CLOSE_TAG)
                    self._after_call = False
                else:
                    events.append(ToolCallDelta(self.calls, self._new_id(), *call))
                    self.calls += 1
                    self._after_call = True
                continue

            if self._after_call:
                stripped = self._buf.lstrip()
                if not stripped:
                    self._buf = ""
                    return events
                self._buf, self._after_call = stripped, False

            start = self._buf.find(OPEN_TAG)
            if start >= 0:
                before = self._buf[:start]
                kept = before.rstrip()
                content(kept)
                self._lead_ws = before[len(kept):]
                self._buf, self._inside = self._buf[start + len(OPEN_TAG):], True
                continue

            if final:
                content(self._buf)
                self._buf = ""
                return events
            cut = len(self._buf) - _partial_open_len(self._buf)
            while cut > 0 and self._buf[cut - 1].isspace():
                cut -= 1
            content(self._buf[:cut])
            self._buf = self._buf[cut:]
            return events


def parse_tool_calls(text: str, tools: Iterable[dict[str, Any]] | None,
                     new_id: Callable[[], str] = new_call_id
                     ) -> tuple[str | None, list[dict[str, Any]]]:
    """Split a finished answer into (content, OpenAI `tool_calls` entries).

    With no valid call, content is `text` unchanged and the list is empty. With calls,
    content is the text outside them, or None when that is empty.
    """
    stream = ToolCallStream(tools, new_id)
    events = stream.feed(text) + stream.finish()
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    calls = [e.to_openai() for e in events if isinstance(e, ToolCallDelta)]
    if calls and not content:
        return None, calls
    return content, calls
