"""Server-sent events framing for OpenAI-style streams: data-only events, no `event:`."""
from __future__ import annotations

import re

DONE = b"data: [DONE]\n\n"
PING = b": ping\n\n"   # a comment line: keeps proxies and clients from timing out

_NEWLINE = re.compile(r"\r\n|\r|\n")


def event(data: str) -> bytes:
    """One `data:` event carrying `data` (normally a compact JSON text).

    A line break inside `data` would end the field early, so each line gets its own
    `data:` field; SSE clients join them back with "\\n".
    """
    lines = _NEWLINE.split(data)
    return "".join(f"data: {line}\n" for line in lines).encode("utf-8") + b"\n"
