"""The legacy completions surface (`POST /v1/completions`): the `text_completion`
object and stream a reply becomes (see llmd.chat_completions for the contract)."""
from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING

from llmd import sse
from llmd.chat_completions import FINGERPRINT
from llmd.errors import ApiError, error_body
from llmd.tools import ContentDelta, ToolCallDelta

if TYPE_CHECKING:
    from llmd.api import Reply


class CompletionFormat:
    """A reply as a `text_completion` object or stream of them."""

    prompt_param = "prompt"
    remembers_replies = False

    def __init__(self, include_usage: bool) -> None:
        self.id = "cmpl-" + uuid.uuid4().hex[:24]
        self.include_usage = include_usage

    def body(self, reply: Reply) -> dict:
        choice = {"index": 0, "text": reply.output.content(), "logprobs": None,
                  "finish_reason": reply.finish_reason}
        return {"id": self.id, "object": "text_completion", "created": reply.created, "model": reply.model,
                "system_fingerprint": FINGERPRINT, "choices": [choice], "usage": reply.usage(),
                **reply.extensions()}

    def _chunk(self, reply: Reply, choice: dict | None, **extra) -> bytes:
        body = {"id": self.id, "object": "text_completion", "created": reply.created, "model": reply.model,
                "system_fingerprint": FINGERPRINT, "choices": [choice] if choice else [], **extra}
        return sse.event(json.dumps(body, ensure_ascii=False))

    def _text(self, reply: Reply, text: str, finish: str | None = None) -> bytes:
        return self._chunk(reply, {"index": 0, "text": text, "logprobs": None, "finish_reason": finish})

    def start(self, reply: Reply) -> list[bytes]:
        return []

    def deltas(self, reply: Reply, deltas: list[ContentDelta | ToolCallDelta]) -> list[bytes]:
        return [self._text(reply, d.text) for d in deltas if isinstance(d, ContentDelta)]

    def end(self, reply: Reply) -> list[bytes]:
        out = [self._text(reply, "", reply.finish_reason)]
        if self.include_usage:
            out.append(self._chunk(reply, None, usage=reply.usage(), **reply.extensions()))
        return out + [sse.DONE]

    def error(self, reply: Reply, err: ApiError) -> list[bytes]:
        return [sse.event(json.dumps(error_body(err))), sse.DONE]
