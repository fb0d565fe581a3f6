"""The OpenAI Responses surface (`POST /v1/responses`): the Response object and its
event stream, and the bounded store that lets `previous_response_id` continue one.

A reply becomes output items: for a reasoning model, first one `reasoning` item holding
the reasoning text as one `reasoning_text` part (and, when `reasoning.summary` asks for
one, the same text as its `summary_text`: llmd does not summarise), then one `message`
item holding one `output_text` part for the text, then one `function_call` item per
tool call, in the order they appear. The stream announces each item
(`response.output_item.added`), streams its text, reasoning or arguments, and closes
it (`...done` events) before the next one starts, between
`response.created` / `response.in_progress` and `response.completed` (or
`response.incomplete` when `max_output_tokens` cut the reply). Every event carries
its `type` and a `sequence_number`, and is sent as a named SSE event.
"""
from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from llmd.api import logprobs
from llmd.api.validation import Message, ResponsesRequest, ToolCall, compaction_content
from llmd.errors import ApiError
from llmd.http import sse
from llmd.prompt.reasoning import ReasoningDelta
from llmd.prompt.tool_calls import ContentDelta, ToolCallDelta

if TYPE_CHECKING:
    from llmd.api.logprobs import TokenLogprob
    from llmd.api.reply import Reply

MAX_STORED = 256  # responses kept for previous_response_id, per server (oldest dropped first)


@dataclass(frozen=True)
class StoredResponse:
    history: list[Message]        # the conversation so far, without instructions
    session_id: str | None        # where its KV cache lives, so a continuation is warm


class ResponseStore:
    """Stored responses, bounded, looked up only with the API key that made them."""

    def __init__(self, capacity: int = MAX_STORED) -> None:
        self.capacity = capacity
        self._items: OrderedDict[tuple[str, str], StoredResponse] = OrderedDict()

    def get(self, scope: str, response_id: str) -> StoredResponse | None:
        item = self._items.get((scope, response_id))
        if item is not None:
            self._items.move_to_end((scope, response_id))
        return item

    def put(self, scope: str, response_id: str, item: StoredResponse) -> None:
        self._items[(scope, response_id)] = item
        self._items.move_to_end((scope, response_id))
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)


def conversation_session(scope: str, first_response_id: str) -> str:
    """The session a stored conversation runs in, named after its first response and
    the API key, so no other caller can name it by accident."""
    return "resp-" + hashlib.sha256(f"{scope}/{first_response_id}".encode()).hexdigest()[:32]


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage_of(reply: Reply) -> dict:
    """A reply's usage in the Responses shape."""
    u = reply.usage()
    return {"input_tokens": u["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": u["prompt_tokens_details"]["cached_tokens"]},
            "output_tokens": u["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": u["completion_tokens_details"]["reasoning_tokens"]},
            "total_tokens": u["total_tokens"]}


class ResponsesFormat:
    """A reply as a Response object or its event stream (see module doc)."""

    prompt_param = "input"
    remembers_replies = True
    shows_reasoning = True   # as a reasoning output item

    def __init__(self, req: ResponsesRequest, on_done: Callable[[str, Message], None] | None) -> None:
        self.id = _item_id("resp")
        self.req = req
        self.created_at = int(time.time())
        self.on_done = on_done      # stores the finished reply (response id, assistant message)
        self.sequence = 0
        self.items: list[dict] = []   # output items so far; the last may still be open
        self.open: dict | None = None
        self.calls: dict[int, dict] = {}  # tool call index -> its function_call item

    # ---- the Response object ----------------------------------------------------

    def _response(self, reply: Reply, status: str, output: list[dict]) -> dict:
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        usage = usage_of(reply) if status != "in_progress" else None
        completed_at = int(time.time()) if status in ("completed", "incomplete") else None
        return {"id": self.id, "object": "response", "created_at": self.created_at, "completed_at": completed_at,
                "status": status,
                "background": False, "error": None, "incomplete_details": incomplete,
                "model": reply.model, "output": output, "previous_response_id": self.req.previous_response_id,
                "store": self.req.store, "usage": usage, **self.req.echo}

    def _status(self, reply: Reply) -> str:
        return "incomplete" if reply.finish_reason == "length" else "completed"

    def _finish(self, reply: Reply) -> None:
        calls = tuple(ToolCall(c["id"], c["function"]["name"], c["function"]["arguments"])
                      for c in reply.output.tool_calls())
        text = reply.output.content()
        if self.on_done is not None:
            self.on_done(self.id, Message("assistant", text or (None if calls else ""), None, calls))

    def _logprobs(self, reply: Reply, tokens: list[TokenLogprob]) -> list[dict]:
        """Logprob entries of the output text (empty unless asked for), as chat shows them."""
        return logprobs.chat_content(tokens, reply.piece) if self.req.chat.logprobs is not None else []

    def body(self, reply: Reply) -> dict:
        output = []
        if reply.output.reasoning:
            output.append(self._reasoning_item("".join(reply.output.reasoning), "completed"))
        text = reply.output.content()
        if text or not reply.output.calls:
            output.append(self._message_item(text, "completed", lp=self._logprobs(reply, reply.logprobs)))
        output += [self._call_item(c["id"], c["function"]["name"], c["function"]["arguments"], "completed")
                   for c in reply.output.tool_calls()]
        self._finish(reply)
        return self._response(reply, self._status(reply), output)

    @staticmethod
    def _text_part(text: str, lp: list[dict] | None = None) -> dict:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": lp or []}

    def _message_item(self, text: str, status: str, item_id: str | None = None, lp: list[dict] | None = None) -> dict:
        content = [self._text_part(text, lp)] if status == "completed" else []
        return {"type": "message", "id": item_id or _item_id("msg"), "status": status, "role": "assistant",
                "content": content}

    def _summary(self, text: str) -> list[dict]:
        return [{"type": "summary_text", "text": text}] if self.req.summary is not None else []

    def _reasoning_item(self, text: str, status: str, item_id: str | None = None) -> dict:
        """A reasoning item; it has no `encrypted_content`, as llmd encrypts nothing (the
        text is in `content`)."""
        done = status == "completed"
        return {"type": "reasoning", "id": item_id or _item_id("rs"), "status": status,
                "summary": self._summary(text) if done else [],
                "content": [{"type": "reasoning_text", "text": text}] if done else []}

    @staticmethod
    def _call_item(call_id: str, name: str, arguments: str, status: str, item_id: str | None = None) -> dict:
        return {"type": "function_call", "id": item_id or _item_id("fc"), "call_id": call_id, "name": name,
                "arguments": arguments, "status": status}

    # ---- the event stream -------------------------------------------------------------

    def _event(self, kind: str, **fields) -> bytes:
        body = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return sse.event(json.dumps(body, ensure_ascii=False), kind)

    def start(self, reply: Reply) -> list[bytes]:
        snapshot = self._response(reply, "in_progress", [])
        return [self._event("response.created", response=snapshot),
                self._event("response.in_progress", response=snapshot)]

    def _close(self, reply: Reply) -> list[bytes]:
        """Events that finish the open item, if any."""
        item, self.open = self.open, None
        if item is None:
            return []
        index = len(self.items) - 1
        if item["type"] == "reasoning":
            text = item.pop("_text")
            item.update(self._reasoning_item(text, "completed", item["id"]))
            out = [self._event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                               content_index=0, text=text)]
            for part in item["summary"]:
                where = {"item_id": item["id"], "output_index": index, "summary_index": 0}
                out += [self._event("response.reasoning_summary_part.added", **where,
                                    part={"type": "summary_text", "text": ""}),
                        self._event("response.reasoning_summary_text.delta", **where, delta=text),
                        self._event("response.reasoning_summary_text.done", **where, text=text),
                        self._event("response.reasoning_summary_part.done", **where, part=part)]
            return out + [self._event("response.output_item.done", output_index=index, item=item)]
        if item["type"] == "message":
            text = item.pop("_text")
            lp = self._logprobs(reply, reply.logprobs)
            part = self._text_part(text, lp)
            item.update(status="completed", content=[part])
            return [self._event("response.output_text.done", item_id=item["id"], output_index=index,
                                content_index=0, text=text, logprobs=lp),
                    self._event("response.content_part.done", item_id=item["id"], output_index=index,
                                content_index=0, part=part),
                    self._event("response.output_item.done", output_index=index, item=item)]
        item["status"] = "completed"
        return [self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                            name=item["name"], arguments=item["arguments"]),
                self._event("response.output_item.done", output_index=index, item=item)]

    def _add(self, reply: Reply, item: dict) -> list[bytes]:
        out = self._close(reply)
        self.items.append(item)
        self.open = item
        shown = {k: v for k, v in item.items() if not k.startswith("_")}
        return out + [self._event("response.output_item.added", output_index=len(self.items) - 1, item=shown)]

    def deltas(self, reply: Reply, deltas: list[ContentDelta | ToolCallDelta | ReasoningDelta]) -> list[bytes]:
        out: list[bytes] = []
        for d in deltas:
            if isinstance(d, ReasoningDelta):
                if self.open is None or self.open["type"] != "reasoning":
                    item = self._reasoning_item("", "in_progress")
                    item["_text"] = ""
                    out += self._add(reply, item)
                self.open["_text"] += d.text
                out.append(self._event("response.reasoning_text.delta", item_id=self.open["id"],
                                       output_index=len(self.items) - 1, content_index=0, delta=d.text))
            elif isinstance(d, ContentDelta):
                if self.open is None or self.open["type"] != "message":
                    item = self._message_item("", "in_progress")
                    item["_text"] = ""
                    out += self._add(reply, item)
                    out.append(self._event("response.content_part.added", item_id=item["id"],
                                           output_index=len(self.items) - 1, content_index=0,
                                           part=self._text_part("")))
                self.open["_text"] += d.text
                out.append(self._event("response.output_text.delta", item_id=self.open["id"],
                                       output_index=len(self.items) - 1, content_index=0, delta=d.text,
                                       logprobs=self._logprobs(reply, reply.take_logprobs())))
            else:
                if d.id is not None:
                    item = self._call_item(d.id, d.name or "", "", "in_progress")
                    self.calls[d.index] = item
                    out += self._add(reply, item)
                item = self.calls[d.index]
                item["arguments"] += d.arguments
                if d.arguments:
                    out.append(self._event("response.function_call_arguments.delta", item_id=item["id"],
                                           output_index=self.items.index(item), delta=d.arguments))
        return out

    def end(self, reply: Reply) -> list[bytes]:
        out = self._close(reply)
        if all(item["type"] == "reasoning" for item in self.items):  # no answer is still one (empty) message
            out += self.deltas(reply, [ContentDelta("")]) + self._close(reply)
        self._finish(reply)
        status = self._status(reply)
        done = self._response(reply, status, self.items)
        return out + [self._event("response.completed" if status == "completed" else "response.incomplete",
                                  response=done)]

    def error(self, reply: Reply, err: ApiError) -> list[bytes]:
        failed = self._response(reply, "failed", self.items)
        failed["error"] = {"code": err.code or err.type, "message": err.message}
        return [self._event("error", code=err.code, message=err.message, param=err.param),
                self._event("response.failed", response=failed)]


class CompactionFormat:
    """The compacted conversation (`POST /v1/responses/compact`, never streamed): the
    user's messages as they were, then one `compaction` item holding the reply, the
    model's summary of the conversation (see llmd.api.validation's responses/compact)."""

    prompt_param = "input"
    remembers_replies = False  # the summary is never sent back as a reply
    shows_reasoning = False    # a reasoning model's thinking is not part of the summary

    def __init__(self, user_messages: list[Message]) -> None:
        self.id = _item_id("resp")
        self.user_messages = user_messages

    def body(self, reply: Reply) -> dict:
        output = [{"type": "message", "id": _item_id("msg"), "status": "completed", "role": "user",
                   "content": [{"type": "input_text", "text": m.content or ""}]} for m in self.user_messages]
        output.append({"type": "compaction", "id": _item_id("cmp"),
                       "encrypted_content": compaction_content(reply.output.content().strip())})
        return {"id": self.id, "object": "response.compaction", "created_at": reply.created, "output": output,
                "usage": usage_of(reply)}
