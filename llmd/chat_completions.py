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

from llmd import logprobs, sse
from llmd.errors import ApiError, error_body
from llmd.tools import ContentDelta, ToolCallDelta

if TYPE_CHECKING:
    from llmd.api import Reply

FINGERPRINT = "llmd-0.1.0"


class ChatCompletionFormat:
    """A reply as a `chat.completion` object or a `chat.completion.chunk` stream."""

    prompt_param = "messages"  # what a prompt over the context is blamed on
    remembers_replies = True   # the client sends this reply back in its next request

    def __init__(self, include_usage: bool, logprobs: bool = False, timings_per_token: bool = False) -> None:
        self.id = "chatcmpl-" + uuid.uuid4().hex[:24]
        self.include_usage = include_usage
        self.logprobs = logprobs
        self.timings_per_token = timings_per_token

    def _logprobs(self, reply: Reply) -> dict | None:
        if not self.logprobs:
            return None
        return {"content": logprobs.chat_content(reply.take_logprobs(), reply.piece), "refusal": None}

    def body(self, reply: Reply) -> dict:
        text, calls = reply.output.content(), reply.output.tool_calls()
        message = {"role": "assistant", "content": text or (None if calls else ""), "refusal": None,
                   "annotations": []}
        if calls:
            message["tool_calls"] = calls
        choice = {"index": 0, "message": message, "logprobs": self._logprobs(reply),
                  "finish_reason": reply.finish_reason}
        return {"id": self.id, "object": "chat.completion", "created": reply.created, "model": reply.model,
                "system_fingerprint": FINGERPRINT, "choices": [choice], "usage": reply.usage(),
                **reply.extensions()}

    def _chunk(self, reply: Reply, choice: dict | None, **extra) -> bytes:
        body = {"id": self.id, "object": "chat.completion.chunk", "created": reply.created,
                "model": reply.model, "system_fingerprint": FINGERPRINT,
                "choices": [choice] if choice else [], **extra}
        if self.timings_per_token and choice:
            body["timings"] = reply.g.timings()
        return sse.event(json.dumps(body, ensure_ascii=False))

    def _delta(self, reply: Reply, delta: dict, finish: str | None = None) -> bytes:
        # A chunk's logprobs are those of the tokens fed since the previous chunk.
        lp = self._logprobs(reply)
        return self._chunk(reply, {"index": 0, "delta": delta, "logprobs": lp if lp and lp["content"] else None,
                                   "finish_reason": finish})

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
