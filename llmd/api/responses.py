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

import base64
import binascii
import hashlib
import json
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable

from llmd.api import logprobs
from llmd.api.validation import (arguments_field, bool_field, ChatRequest, check_keys, int_field, MAX_TOP_LOGPROBS,
                                 Message, parse_common, parse_flat_tools, parse_json_object, parse_max_tokens,
                                 parse_prompt_cache_key, parse_reasoning, parse_response_format,
                                 named_tool_choice, parse_sampling, parse_stream, parse_tool_choice, required_field,
                                 ResponseFormat, Sampling, value_text, str_field, text_parts, Tool, ToolCall,
                                 UNSUPPORTED_PARTS)
from llmd.errors import (ApiError, invalid_request, invalid_type, missing_parameter, unknown_parameter,
                         unsupported_parameter)
from llmd.http import sse
from llmd.prompt.reasoning import ReasoningDelta
from llmd.prompt.tool_calls import ContentDelta, ToolCallDelta

if TYPE_CHECKING:
    from llmd.api.logprobs import TokenLogprob
    from llmd.api.reply import Reply

MAX_STORED = 256  # responses kept for previous_response_id, per server


@dataclass(frozen=True)
class StoredResponse:
    history: list[Message]        # the conversation so far, without instructions
    session_id: str | None        # where its KV cache lives, so a continuation is warm


class ResponseStore:
    """Stored responses, looked up only with the API key that made them (`scope`),
    `capacity` in all. Past it, the `group` that holds the most gives up its least
    recently used (made or continued). With API keys a key is its own group, so a key
    that makes many responses pushes out its own, never another's that holds fewer;
    without them all are one group (a client could name any number of scopes)."""

    def __init__(self, capacity: int = MAX_STORED) -> None:
        self.capacity = capacity
        # group -> (scope, response id) -> response, least recently used first
        self._groups: dict[str, OrderedDict[tuple[str, str], StoredResponse]] = {}
        self._count = 0

    def get(self, scope: str, response_id: str, group: str = "") -> StoredResponse | None:
        items = self._groups.get(group, {})
        item = items.get((scope, response_id))
        if item is not None:
            items.move_to_end((scope, response_id))
        return item

    def put(self, scope: str, response_id: str, item: StoredResponse, group: str = "") -> None:
        items = self._groups.setdefault(group, OrderedDict())
        self._count += (scope, response_id) not in items
        items[(scope, response_id)] = item
        items.move_to_end((scope, response_id))
        while self._count > self.capacity:
            largest = max(self._groups, key=lambda g: len(self._groups[g]))
            self._groups[largest].popitem(last=False)
            self._count -= 1
            if not self._groups[largest]:
                del self._groups[largest]


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
    stream_type = sse.MEDIA_TYPE
    ping = sse.PING

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
            self.on_done(self.id, Message("assistant", text or (None if calls else ""), None, calls,
                                          reasoning="".join(reply.output.reasoning) or None))

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
    stream_type = sse.MEDIA_TYPE
    ping = sse.PING

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


# --- the request ------------------------------------------------------------

@dataclass(frozen=True)
class ResponsesRequest:
    """A /v1/responses body: the conversation as a chat request, and what the
    Response object repeats back or the response store needs."""
    chat: ChatRequest
    input: list[Message]               # this request's own input items (without instructions)
    instructions: str | None
    previous_response_id: str | None
    store: bool
    echo: dict                         # request fields the Response object repeats
    summary: str | None = None         # reasoning.summary: the reasoning item carries a summary


_RESPONSES_KEYS = frozenset({
    "model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "tools",
    "tool_choice", "parallel_tool_calls", "text", "stream", "stream_options", "store",
    "previous_response_id", "metadata", "user", "safety_identifier", "service_tier",
    "prompt_cache_key", "prompt_cache_retention", "truncation", "reasoning", "include",
    "session_id", "top_logprobs", "background", "max_tool_calls", "top_k", "min_p", "seed",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias"})


_RESPONSES_UNSUPPORTED = {
    "conversation": "'conversation' objects are not supported; chain responses with "
                    "'previous_response_id'.",
    "prompt": "Prompt templates ('prompt') are not supported.",
}


_RESPONSE_PARTS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}


def parse_responses_request(body: bytes) -> ResponsesRequest:
    """Validate a /v1/responses body; raise ApiError (400) naming the bad param."""
    obj = parse_json_object(body)
    check_keys(obj, _RESPONSES_KEYS, _RESPONSES_UNSUPPORTED)
    model, session_id = parse_common(obj)
    for key, why in (("background", "Background responses are not supported."),
                     ("max_tool_calls", "'max_tool_calls' is not supported.")):
        v = obj.get(key)
        if v is not None and v is not False:
            raise unsupported_parameter(key, why)
    top_logprobs = obj.get("top_logprobs")
    top_logprobs = 0 if top_logprobs is None else int_field(top_logprobs, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    with_logprobs = _parse_include(obj.get("include")) or top_logprobs > 0
    effort, summary = parse_reasoning(obj.get("reasoning"))
    truncation = obj.get("truncation")
    if truncation is not None and str_field(truncation, "truncation") != "disabled":
        raise unsupported_parameter("truncation", "Only truncation 'disabled' is supported: a prompt "
                                    "over the context is refused, never cut.")
    instructions = None if obj.get("instructions") is None else str_field(obj["instructions"], "instructions")
    items = _parse_input(required_field(obj, "input", "input"))
    stream, _ = parse_stream(obj)
    tools = parse_flat_tools(obj.get("tools"), ("function",), "parameters", "only 'function'")
    tool_choice, tool_name = _parse_response_tool_choice(obj.get("tool_choice"), tools)
    text = obj.get("text")
    if text is not None and not isinstance(text, dict):
        raise invalid_type("text", "an object", text)
    for key in text or {}:
        if key not in ("format", "verbosity"):
            raise unknown_parameter(f"text.{key}")
    if (text or {}).get("verbosity") not in (None, "medium"):
        raise unsupported_parameter("text.verbosity", "'text.verbosity' is not supported.")
    text_format = (text or {}).get("format")
    response_format = _parse_text_format(text_format)
    store = obj.get("store")
    previous = obj.get("previous_response_id")
    ptc = obj.get("parallel_tool_calls")
    chat = ChatRequest(
        model=model,
        messages=([Message("system", instructions)] if instructions is not None else []) + items,
        sampling=parse_sampling(obj),
        max_tokens=parse_max_tokens(obj.get("max_output_tokens"), "max_output_tokens"),
        stop=[],
        stream=stream,
        include_usage=True,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=True if ptc is None else bool_field(ptc, "parallel_tool_calls"),
        session_id=session_id,
        response_format=response_format,
        tool_name=tool_name,
        prompt_cache_key=parse_prompt_cache_key(obj),
        logprobs=top_logprobs if with_logprobs else None,
        # the effort is the template's `reasoning_effort`, as in chat completions
        template_kwargs={"reasoning_effort": effort} if effort is not None else {},
        template_params={"reasoning_effort": "reasoning.effort"},
        reasoning=True if summary is not None else None,
        reasoning_param="reasoning.summary",
    )
    echo = {
        "instructions": instructions,
        "max_output_tokens": chat.max_tokens,
        "max_tool_calls": None,
        "metadata": obj.get("metadata") or {},
        "parallel_tool_calls": chat.parallel_tool_calls,
        "temperature": chat.sampling.temperature,
        "top_p": chat.sampling.top_p,
        "presence_penalty": chat.sampling.presence_penalty,
        "frequency_penalty": chat.sampling.frequency_penalty,
        "top_logprobs": top_logprobs,
        "text": {"format": text_format or {"type": "text"}},
        "tool_choice": obj.get("tool_choice") or ("auto" if tools else "none"),
        "tools": [{"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters,
                   "strict": raw.get("strict")} for t, raw in zip(tools, obj.get("tools") or [])],
        "truncation": "disabled",
        "reasoning": {"effort": effort, "summary": summary},
        "service_tier": "default",
        "safety_identifier": obj.get("safety_identifier"),
        "prompt_cache_key": chat.prompt_cache_key,
        "user": obj.get("user"),
    }
    return ResponsesRequest(
        chat=chat,
        input=items,
        instructions=instructions,
        previous_response_id=None if previous is None else str_field(previous, "previous_response_id"),
        store=True if store is None else bool_field(store, "store"),
        echo=echo,
        summary=summary,
    )


def _parse_include(v: Any) -> bool:
    """Whether `include` asks for the output text's logprobs."""
    if v is None:
        return False
    if not isinstance(v, list):
        raise invalid_type("include", "an array of strings", v)
    for i, item in enumerate(v):
        # llmd's reasoning items carry their text, never encrypted content: nothing to add.
        if str_field(item, f"include[{i}]") not in ("reasoning.encrypted_content", "message.output_text.logprobs"):
            raise unsupported_parameter(f"include[{i}]", f"include {value_text(item)} is not supported.")
    return "message.output_text.logprobs" in v


def _parse_input(v: Any) -> list[Message]:
    """Input items as chat messages: consecutive function calls become one assistant
    message's tool calls; a call's output becomes a tool message; a reasoning item's text
    becomes the reasoning of the assistant turn it precedes (Message.reasoning)."""
    if isinstance(v, str):
        if not v:
            raise invalid_request("Invalid value for 'input': the input must not be empty.", "input")
        return [Message("user", v)]
    if not isinstance(v, list):
        raise invalid_type("input", "a string or an array of input items", v)
    if not v:
        raise invalid_request("Invalid value for 'input': at least one item is required.", "input")
    messages: list[Message] = []
    reasoning: str | None = None  # of the assistant turn the next item opens
    for i, item in enumerate(v):
        p = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid_type(p, "an object", item)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            message = _parse_input_message(item, p)
            messages.append(replace(message, reasoning=reasoning) if message.role == "assistant" else message)
        elif kind == "function_call":
            call = ToolCall(id=str_field(required_field(item, "call_id", f"{p}.call_id"), f"{p}.call_id"),
                            name=str_field(required_field(item, "name", f"{p}.name"), f"{p}.name"),
                            arguments=arguments_field(required_field(item, "arguments", f"{p}.arguments"),
                                                      f"{p}.arguments"))
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant" and reasoning is None:
                messages[-1] = replace(last, tool_calls=last.tool_calls + (call,))
            else:
                messages.append(Message("assistant", None, None, (call,), reasoning=reasoning))
        elif kind == "function_call_output":
            output = required_field(item, "output", f"{p}.output")
            content = output if isinstance(output, str) else _parse_output_parts(output, f"{p}.output")
            messages.append(Message("tool", content, None, (),
                                    str_field(required_field(item, "call_id", f"{p}.call_id"), f"{p}.call_id")))
        elif kind == "reasoning":
            reasoning = _reasoning_text(item, p)
            continue
        elif kind == "compaction":
            summary = _compaction_summary(required_field(item, "encrypted_content", f"{p}.encrypted_content"),
                                          f"{p}.encrypted_content")
            messages.append(Message("assistant", COMPACTED + summary))
        elif kind is None:
            raise missing_parameter(f"{p}.type")
        else:
            raise unsupported_parameter(f"{p}.type", f"Input items of type {value_text(kind)} are not supported.")
        reasoning = None
    return messages


def _reasoning_text(item: dict, p: str) -> str | None:
    """A reasoning item's text: its reasoning_text parts (llmd's own items carry them),
    else its summary's text, joined; None when it has neither (encrypted content only)."""
    for key, kind in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key)
        if parts:
            return text_parts(parts, f"{p}.{key}", {kind: "text"}, ())
    return None


def _parse_input_message(item: dict, p: str) -> Message:
    role = str_field(required_field(item, "role", f"{p}.role"), f"{p}.role")
    if role not in ("user", "assistant", "system", "developer"):
        raise invalid_request(f"Invalid value for '{p}.role': {value_text(role)}; expected user, assistant, "
                              "system or developer.", f"{p}.role")
    raw = required_field(item, "content", f"{p}.content")
    content = raw if isinstance(raw, str) else _parse_output_parts(raw, f"{p}.content")
    return Message(role, content)


def _parse_output_parts(v: Any, p: str) -> str:
    """Input and output text parts (and refusals an assistant turn may carry)."""
    return text_parts(v, p, _RESPONSE_PARTS, UNSUPPORTED_PARTS)


def _parse_response_tool_choice(v: Any, tools: list[Tool]) -> tuple[str, str | None]:
    if isinstance(v, dict) and v.get("type") == "function" and "function" not in v:
        return named_tool_choice(v, tools, "tool_choice.name")
    return parse_tool_choice(v, tools)


def _parse_text_format(v: Any) -> ResponseFormat | None:
    """text.format: {type: text | json_object | json_schema, name, schema, strict}."""
    if v is None:
        return None
    if not isinstance(v, dict):
        raise invalid_type("text.format", "an object", v)
    kind = v.get("type")
    if kind != "json_schema":
        return parse_response_format(v)
    spec = {k: v[k] for k in ("name", "description", "schema", "strict") if k in v}
    for key in v:
        if key not in ("type", "name", "description", "schema", "strict"):
            raise unknown_parameter(f"text.format.{key}")
    return parse_response_format({"type": "json_schema", "json_schema": spec})


COMPACTION_PREFIX = "llmd-compaction-v1:"


COMPACTED = "Summary of the conversation so far:\n"  # heads the summary when it is fed back


COMPACT_PROMPT = ("Summarize the conversation so far for your own later use, so that it can continue from the "
                  "summary alone: keep every fact, decision, name, number, tool result and open task; leave out "
                  "pleasantries. Write only the summary.")


COMPACT_MAX_TOKENS = 512  # tokens of a summary


def compaction_content(summary: str) -> str:
    """A compaction item's `encrypted_content` for summary."""
    return COMPACTION_PREFIX + base64.b64encode(summary.encode("utf-8")).decode("ascii")


def _compaction_summary(v: Any, p: str) -> str:
    text = str_field(v, p)
    if text.startswith(COMPACTION_PREFIX):
        try:
            return base64.b64decode(text[len(COMPACTION_PREFIX):], validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            pass
    raise invalid_request(f"Invalid value for '{p}': not a compaction this server made (with "
                          "/v1/responses/compact); another server's encrypted content cannot be read here.", p)


@dataclass(frozen=True)
class CompactRequest:
    """A /v1/responses/compact body: `chat` asks for the summary of the conversation
    (instructions, input items, then COMPACT_PROMPT)."""
    chat: ChatRequest
    input: list[Message]               # this request's own input items
    instructions: str | None
    previous_response_id: str | None


_COMPACT_KEYS = frozenset({"model", "input", "instructions", "previous_response_id", "prompt_cache_key",
                           "prompt_cache_retention", "service_tier", "session_id"})


def parse_compact_request(body: bytes) -> CompactRequest:
    """Validate a /v1/responses/compact body; raise ApiError (400) naming the bad param."""
    obj = parse_json_object(body)
    check_keys(obj, _COMPACT_KEYS, {})
    model, session_id = parse_common(obj)
    instructions = None if obj.get("instructions") is None else str_field(obj["instructions"], "instructions")
    previous = obj.get("previous_response_id")
    previous = None if previous is None else str_field(previous, "previous_response_id")
    if obj.get("input") is None and previous is None:
        raise invalid_request("Either 'input' or 'previous_response_id' is required: there is nothing to "
                              "compact.", "input", "missing_required_parameter")
    items = [] if obj.get("input") is None else _parse_input(obj["input"])
    chat = ChatRequest(
        model=model,
        messages=([Message("system", instructions)] if instructions is not None else []) + items +
        [Message("user", COMPACT_PROMPT)],
        sampling=Sampling(temperature=0.0),  # a summary to build on: the most likely one
        max_tokens=COMPACT_MAX_TOKENS,
        stop=[],
        stream=False,
        include_usage=True,
        tools=[],
        tool_choice="none",
        parallel_tool_calls=True,
        session_id=session_id,
        prompt_cache_key=parse_prompt_cache_key(obj),
    )
    return CompactRequest(chat, items, instructions, previous)
