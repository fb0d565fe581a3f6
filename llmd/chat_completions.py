"""The chat completions surface (`POST /v1/chat/completions`): the response object
and the `chat.completion.chunk` stream a finished or running reply becomes.

A format object is built per request and handed to the shared generation core
(`llmd.api.Reply`), which calls it back with the reply's deltas; nothing here
touches the runtime or the session table.
"""
from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING

from llmd import sse
from llmd.errors import ApiError, error_body
from llmd.tools import ContentDelta, ToolCallDelta

if TYPE_CHECKING:
    from llmd.api import Reply

FINGERPRINT = "llmd-0.1.0"


class ChatCompletionFormat:
    """A reply as a `chat.completion` object or a `chat.completion.chunk` stream."""

    prompt_param = "messages"  # what a prompt over the context is blamed on
    remembers_replies = True   # the client sends this reply back in its next request

    def __init__(self, include_usage: bool) -> None:
        self.id = "chatcmpl-" + uuid.uuid4().hex[:24]
        self.include_usage = include_usage

    def body(self, reply: Reply) -> dict:
        text, calls = reply.output.content(), reply.output.tool_calls()
        message = {"role": "assistant", "content": text or (None if calls else ""), "refusal": None}
        if calls:
            message["tool_calls"] = calls
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": reply.finish_reason}
        return {"id": self.id, "object": "chat.completion", "created": reply.created, "model": reply.model,
                "system_fingerprint": FINGERPRINT, "choices": [choice], "usage": reply.usage(),
                **reply.extensions()}

    def _chunk(self, reply: Reply, choice: dict | None, **extra) -> bytes:
        body = {"id": self.id, "object": "chat.completion.chunk", "created": reply.created,
                "model": reply.model, "system_fingerprint": FINGERPRINT,
                "choices": [choice] if choice else [], **extra}
        return sse.event(json.dumps(body, ensure_ascii=False))

    def _delta(self, reply: Reply, delta: dict, finish: str | None = None) -> bytes:
        return self._chunk(reply, {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish})

    def start(self, reply: Reply) -> list[bytes]:
        return [self._delta(reply, {"role": "assistant", "content": ""})]

    def deltas(self, reply: Reply, deltas: list[ContentDelta | ToolCallDelta]) -> list[bytes]:
        return [self._delta(reply, {"content": d.text} if isinstance(d, ContentDelta)
                            else {"tool_calls": [d.to_openai_delta()]}) for d in deltas]

    def end(self, reply: Reply) -> list[bytes]:
        out = [self._delta(reply, {}, reply.finish_reason)]
        if self.include_usage:
            out.append(self._chunk(reply, None, usage=reply.usage(), **reply.extensions()))
        return out + [sse.DONE]

    def error(self, reply: Reply, err: ApiError) -> list[bytes]:
        return [sse.event(json.dumps(error_body(err))), sse.DONE]
