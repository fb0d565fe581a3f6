"""Server-sent events framing: data-only events for chat completions and completions;
named events (`event:` then `data:`) for the Responses and Anthropic Messages streams."""
from __future__ import annotations

import re

MEDIA_TYPE = "text/event-stream"
DONE = b"data: [DONE]\n\n"
PING = b": ping\n\n"   # a comment line: keeps proxies and clients from timing out

_NEWLINE = re.compile(r"\r\n|\r|\n")


def event(data: str, name: str | None = None) -> bytes:
    """One `data:` event carrying `data` (normally a compact JSON text), named `name`
    (an `event:` field first) when given.

    A line break inside `data` would end the field early, so each line gets its own
    `data:` field; SSE clients join them back with "\\n".
    """
    lines = _NEWLINE.split(data)
    head = f"event: {name}\n" if name else ""
    return (head + "".join(f"data: {line}\n" for line in lines)).encode("utf-8") + b"\n"
