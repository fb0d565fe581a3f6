"""The legacy completions surface (`POST /v1/completions`): the `text_completion`
object and stream a reply becomes (see llmd.chat_completions for the contract)."""
from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING

from llmd import logprobs, sse
from llmd.chat_completions import FINGERPRINT
from llmd.errors import ApiError, error_body
from llmd.tools import ContentDelta, ToolCallDelta

if TYPE_CHECKING:
    from llmd.api import Reply


class CompletionFormat:
    """A reply as a `text_completion` object or stream of them."""

    prompt_param = "prompt"
    remembers_replies = False

    def __init__(self, include_usage: bool, echo: str = "", logprobs: bool = False,
                 timings_per_token: bool = False) -> None:
        self.id = "cmpl-" + uuid.uuid4().hex[:24]
        self.include_usage = include_usage
        self.echo = echo            # the prompt's text when `echo` asked for it
        self.logprobs = logprobs
        self.timings_per_token = timings_per_token
        self.offset = 0             # characters of the choice's text sent so far
        self.echoed = False

    def _logprobs(self, reply: Reply, text: str, echoing: bool = False) -> dict | None:
        """The logprobs of the tokens fed since the last call (of the prompt's tokens
        when echoing), placed at the current offset; moves the offset past text."""
        if not self.logprobs:
            self.offset += len(text)
            return None
        tokens = (logprobs.prompt_tokens(reply.g.prompt, reply.g.prompt_scores) if echoing
                  else reply.take_logprobs())
        out = logprobs.legacy(tokens, reply.piece, self.offset)
        self.offset += len(text)
        return out

    def body(self, reply: Reply) -> dict:
        text = reply.output.content()
        parts = ([self._logprobs(reply, self.echo, echoing=True)] if self.echo else []) + \
            [self._logprobs(reply, text)]
        merged = None
        if self.logprobs:
            merged = {key: [v for part in parts for v in part[key]] for key in parts[0]}
        choice = {"index": 0, "text": self.echo + text, "logprobs": merged,
                  "finish_reason": reply.finish_reason}
        return {"id": self.id, "object": "text_completion", "created": reply.created, "model": reply.model,
                "system_fingerprint": FINGERPRINT, "choices": [choice], "usage": reply.usage(),
                **reply.extensions()}

    def _chunk(self, reply: Reply, choice: dict | None, **extra) -> bytes:
        body = {"id": self.id, "object": "text_completion", "created": reply.created, "model": reply.model,
                "system_fingerprint": FINGERPRINT, "choices": [choice] if choice else [], **extra}
        if self.timings_per_token and choice:
            body["timings"] = reply.g.timings()
        return sse.event(json.dumps(body, ensure_ascii=False))

    def _text(self, reply: Reply, text: str, finish: str | None = None, echoing: bool = False) -> bytes:
        lp = self._logprobs(reply, text, echoing)
        return self._chunk(reply, {"index": 0, "text": text, "logprobs": lp if lp and lp["tokens"] else None,
                                   "finish_reason": finish})

    def start(self, reply: Reply) -> list[bytes]:
        return []

    def deltas(self, reply: Reply, deltas: list[ContentDelta | ToolCallDelta]) -> list[bytes]:
        # The echoed prompt goes first, once the prompt is processed (its logprobs are
        # known then): with the first token's deltas, or at the end if none came.
        out = [self._text(reply, self.echo, echoing=True)] if self.echo and not self.echoed else []
        self.echoed = True
        return out + [self._text(reply, d.text) for d in deltas if isinstance(d, ContentDelta)]

    def end(self, reply: Reply) -> list[bytes]:
        out = [self._text(reply, "", reply.finish_reason)]
        if self.include_usage:
            out.append(self._chunk(reply, None, usage=reply.usage(), **reply.extensions()))
        return out + [sse.DONE]

    def error(self, reply: Reply, err: ApiError) -> list[bytes]:
        return [sse.event(json.dumps(error_body(err))), sse.DONE]
