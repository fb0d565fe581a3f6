"""The Anthropic Messages surface (`POST /v1/messages`, `/v1/messages/count_tokens`):
the request read into a chat request, and the reply as a Message object or as
Anthropic's event stream.

Request mapping: `system` becomes the first system message; a user turn's
`tool_result` blocks become tool messages (before the turn's own text); an assistant
turn's `tool_use` blocks become its tool calls (`input` as JSON text) and its
`thinking` blocks its reasoning, which only a template that renders past reasoning
reads (gpt-oss's before a tool call; the others leave it out); images and documents
are refused. `tool_choice` any/tool map to required/a named function. `thinking`
enabled needs a model whose template reasons (else 400); disabled turns a reasoning
template's `enable_thinking` off.

A reasoning model's `<think>` text becomes a `thinking` block before the answer (its
text left out with `display: "omitted"`; `signature` is empty: llmd signs nothing).

Stream: message_start, ping, then per content block content_block_start, its
deltas (thinking_delta, text_delta or input_json_delta) and content_block_stop, then message_delta
(stop_reason, output usage) and message_stop. Errors use Anthropic's shape
(llmd.errors.error_body with ANTHROPIC), as one `error` event once streaming.
"""
from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

from llmd.api.validation import (
    INT32_MAX,
    ChatRequest,
    Message,
    Sampling,
    ToolCall,
    bool_field,
    check_keys,
    int_field,
    number_field,
    named_tool_choice,
    parse_logit_bias,
    parse_tool_choice,
    required_field,
    value_text,
    str_field,
    parse_flat_tools,
    parse_continue_final,
    parse_json_object,
    text_parts,
)
from llmd.errors import ANTHROPIC, ApiError, error_body, invalid_request, invalid_type, unsupported_parameter
from llmd.http import sse
from llmd.prompt.reasoning import ReasoningDelta
from llmd.prompt.tool_calls import ContentDelta, ToolCallDelta

if TYPE_CHECKING:
    from llmd.api.reply import Reply

PATHS = ("/v1/messages", "/messages")  # routes that answer errors in Anthropic's shape
MAX_STOP_SEQUENCES = 16

_KEYS = frozenset({
    "model", "messages", "system", "max_tokens", "stop_sequences", "stream", "temperature",
    "top_p", "top_k", "tools", "tool_choice", "metadata", "service_tier", "thinking",
    "session_id", "prompt_cache_key", "seed", "min_p", "logit_bias"})
_UNSUPPORTED = {
    "container": "Code-execution containers are not supported.",
    "mcp_servers": "MCP servers are not supported.",
    "context_management": "'context_management' is not supported.",
}
_UNSUPPORTED_BLOCKS = ("image", "document", "search_result", "server_tool_use", "web_search_tool_result",
                       "container_upload")
_STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}


def parse_request(body: bytes, counting: bool = False) -> ChatRequest:
    """Validate a Messages body (a count_tokens body when `counting`: no max_tokens)
    into a chat request; raise ApiError (400) naming the bad param."""
    obj = parse_json_object(body)
    check_keys(obj, _KEYS, _UNSUPPORTED)
    model = str_field(required_field(obj, "model", "model"), "model")
    max_tokens = None if counting else int_field(required_field(obj, "max_tokens", "max_tokens"), "max_tokens", 1,
                                            INT32_MAX)
    reasoning, show = _parse_thinking(obj.get("thinking"), max_tokens)
    system = _parse_system(obj.get("system"))
    turns = required_field(obj, "messages", "messages")
    if not isinstance(turns, list):
        raise invalid_type("messages", "an array", turns)
    if not turns:
        raise invalid_request("Invalid value for 'messages': at least one message is required.", "messages")
    msgs = ([Message("system", system)] if system is not None else []) + \
        [m for i, turn in enumerate(turns) for m in _parse_turn(turn, f"messages[{i}]")]
    tools = parse_flat_tools(obj.get("tools"), (None, "custom"), "input_schema",
                             "only client tools with an input_schema")
    tool_choice, tool_name, parallel = _parse_anthropic_tool_choice(obj.get("tool_choice"), tools)
    stream = obj.get("stream")
    sid = obj.get("session_id")
    if sid is not None:
        str_field(sid, "session_id")
    key = obj.get("prompt_cache_key")
    return ChatRequest(
        model=model,
        messages=msgs,
        sampling=_parse_sampling(obj),
        max_tokens=max_tokens,
        stop=_parse_stop_sequences(obj.get("stop_sequences")),
        stream=False if stream is None else bool_field(stream, "stream"),
        include_usage=True,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        session_id=sid,
        tool_name=tool_name,
        prompt_cache_key=None if key is None else str_field(key, "prompt_cache_key"),
        reasoning=reasoning,
        reasoning_param="thinking",
        template_params={"enable_thinking": "thinking"},
        show_reasoning=show,
        continue_final=parse_continue_final(obj, msgs),  # a prefill, as Anthropic's API reads one
    )


def _parse_thinking(v: Any, max_tokens: int | None) -> tuple[bool | None, bool]:
    """`thinking` as (reasoning asked for: True enabled, False disabled, None adaptive or
    absent; whether its text is shown). budget_tokens is checked as Anthropic checks it;
    thinking and the answer share max_tokens."""
    if v is None:
        return None, True
    if not isinstance(v, dict):
        raise invalid_type("thinking", "an object", v)
    kind = str_field(required_field(v, "type", "thinking.type"), "thinking.type")
    allowed = {"enabled": ("type", "budget_tokens", "display"), "adaptive": ("type", "display"),
               "disabled": ("type",)}.get(kind)
    if allowed is None:
        raise invalid_request(f"Invalid value for 'thinking.type': {value_text(kind)}; expected enabled, adaptive or "
                              "disabled.", "thinking.type")
    for key in v:
        if key not in allowed:
            raise invalid_request(f"'thinking.{key}' is not allowed with thinking type {kind!r}.", f"thinking.{key}")
    if kind == "enabled":
        budget = int_field(required_field(v, "budget_tokens", "thinking.budget_tokens"), "thinking.budget_tokens", 1024,
                      INT32_MAX)
        if max_tokens is not None and budget >= max_tokens:
            raise invalid_request("'thinking.budget_tokens' must be less than 'max_tokens'.",
                                  "thinking.budget_tokens")
    display = v.get("display")
    if display is not None and str_field(display, "thinking.display") not in ("summarized", "omitted"):
        raise invalid_request(f"Invalid value for 'thinking.display': {value_text(display)}; expected summarized or "
                              "omitted.", "thinking.display")
    return {"enabled": True, "disabled": False}.get(kind), display != "omitted"


def parse_count_request(body: bytes) -> ChatRequest:
    """Validate a count_tokens body: a Messages body without max_tokens."""
    return parse_request(body, counting=True)


def _parse_sampling(obj: dict) -> Sampling:
    """Anthropic's temperature runs 0..1 (default 1); top_p, top_k as in OpenAI."""
    def get(key: str, default, parse):
        v = obj.get(key)
        return default if v is None else parse(v, key)
    return Sampling(
        temperature=get("temperature", 1.0, lambda v, k: number_field(v, k, 0, 1)),
        top_p=get("top_p", 1.0, lambda v, k: number_field(v, k, 0, 1)),
        top_k=get("top_k", 0, lambda v, k: int_field(v, k, 0, INT32_MAX)),
        min_p=get("min_p", 0.0, lambda v, k: number_field(v, k, 0, 1)),
        seed=get("seed", None, lambda v, k: int_field(v, k, -2**63, 2**63 - 1)),
        logit_bias=parse_logit_bias(obj.get("logit_bias")),
    )


def _parse_system(v: Any) -> str | None:
    if v is None or isinstance(v, str):
        return v
    return _text_blocks(v, "system")


def _text_blocks(v: Any, p: str) -> str:
    return text_parts(v, p, {"text": "text"}, _UNSUPPORTED_BLOCKS, "blocks")


def _parse_turn(turn: Any, p: str) -> list[Message]:
    if not isinstance(turn, dict):
        raise invalid_type(p, "an object", turn)
    role = str_field(required_field(turn, "role", f"{p}.role"), f"{p}.role")
    if role not in ("user", "assistant"):
        raise invalid_request(f"Invalid value for '{p}.role': {value_text(role)}; expected 'user' or 'assistant'.",
                              f"{p}.role")
    content = required_field(turn, "content", f"{p}.content")
    if isinstance(content, str):
        return [Message(role, content)]
    if not isinstance(content, list):
        raise invalid_type(f"{p}.content", "a string or an array of content blocks", content)
    texts, calls, results, thinking = [], [], [], []
    for j, block in enumerate(content):
        bp = f"{p}.content[{j}]"
        if not isinstance(block, dict):
            raise invalid_type(bp, "an object", block)
        kind = str_field(required_field(block, "type", f"{bp}.type"), f"{bp}.type")
        if kind == "text":
            texts.append(str_field(required_field(block, "text", f"{bp}.text"), f"{bp}.text"))
        elif kind == "thinking" and role == "assistant":  # the turn's reasoning, sent back
            thinking.append(str_field(required_field(block, "thinking", f"{bp}.thinking"), f"{bp}.thinking"))
        elif kind == "redacted_thinking" and role == "assistant":
            continue  # encrypted elsewhere: nothing llmd can read
        elif kind == "tool_use" and role == "assistant":
            args = required_field(block, "input", f"{bp}.input")
            if not isinstance(args, dict):
                raise invalid_type(f"{bp}.input", "an object", args)
            calls.append(ToolCall(str_field(required_field(block, "id", f"{bp}.id"), f"{bp}.id"),
                                  str_field(required_field(block, "name", f"{bp}.name"), f"{bp}.name"),
                                  json.dumps(args, ensure_ascii=False)))
        elif kind == "tool_result" and role == "user":
            raw = block.get("content")
            text = "" if raw is None else raw if isinstance(raw, str) else _text_blocks(raw, f"{bp}.content")
            if block.get("is_error") is not None and bool_field(block["is_error"], f"{bp}.is_error") and text:
                text = "Error: " + text
            call_id = str_field(required_field(block, "tool_use_id", f"{bp}.tool_use_id"), f"{bp}.tool_use_id")
            results.append(Message("tool", text, None, (), call_id))
        elif kind in _UNSUPPORTED_BLOCKS:
            raise unsupported_parameter(f"{bp}.type", f"Content blocks of type '{kind}' are not supported: "
                                        "the served model reads text only.")
        else:
            raise invalid_request(f"Invalid value for '{bp}.type': {value_text(kind)} is not a {role} content block.",
                                  f"{bp}.type")
    text = "\n".join(texts)
    if role == "assistant":
        return [Message("assistant", text or (None if calls else ""), None, tuple(calls),
                        reasoning="\n".join(thinking) or None)]
    return results + ([Message("user", text)] if texts or not results else [])


def _parse_anthropic_tool_choice(v: Any, tools) -> tuple[str, str | None, bool]:
    """(tool_choice, forced name, parallel tool calls) from {type: auto|any|tool|none}."""
    if v is None:
        return parse_tool_choice(None, tools) + (True,)
    if not isinstance(v, dict):
        raise invalid_type("tool_choice", "an object", v)
    kind = str_field(required_field(v, "type", "tool_choice.type"), "tool_choice.type")
    disable = v.get("disable_parallel_tool_use")
    parallel = not (disable is not None and bool_field(disable, "tool_choice.disable_parallel_tool_use"))
    if kind == "tool":
        return named_tool_choice(v, tools, "tool_choice.name") + (parallel,)
    choice = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
    if choice is None:
        raise invalid_request(f"Invalid value for 'tool_choice.type': {value_text(kind)}; expected auto, any, "
                              "tool or none.", "tool_choice.type")
    return parse_tool_choice(choice, tools) + (parallel,)


def _parse_stop_sequences(v: Any) -> list[str]:
    if v is None:
        return []
    if not isinstance(v, list):
        raise invalid_type("stop_sequences", "an array of strings", v)
    if len(v) > MAX_STOP_SEQUENCES:
        raise invalid_request(f"Invalid value for 'stop_sequences': at most {MAX_STOP_SEQUENCES} are "
                              "allowed.", "stop_sequences")
    for i, s in enumerate(v):
        if not str_field(s, f"stop_sequences[{i}]"):
            raise invalid_request(f"Invalid value for 'stop_sequences[{i}]': must not be empty.",
                                  f"stop_sequences[{i}]")
    return list(v)


def _tool_input(arguments: str) -> dict:
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class MessagesFormat:
    """A reply as an Anthropic Message object or its event stream (see module doc)."""

    prompt_param = "messages"
    remembers_replies = True
    shows_reasoning = True   # as a thinking block
    stream_type = sse.MEDIA_TYPE
    ping = sse.PING

    def __init__(self, req: ChatRequest) -> None:
        self.id = "msg_" + uuid.uuid4().hex[:24]
        self.show_thinking = req.show_reasoning  # else thinking blocks come empty (display "omitted")
        self.blocks = 0            # content blocks started so far
        self.open: str | None = None  # "thinking", "text" or "tool_use" while a block is open
        self.calls: dict[int, int] = {}  # tool call index -> its block index

    def _stop(self, reply: Reply) -> tuple[str, str | None]:
        matched = reply.output.stops.matched
        if matched is not None and reply.finish_reason == "stop":
            return "stop_sequence", matched
        return _STOP_REASONS.get(reply.finish_reason or "stop", "end_turn"), None

    def _usage(self, reply: Reply, output_tokens: int) -> dict:
        cached = reply.g.plan.keep if reply.g.plan else 0
        return {"input_tokens": len(reply.g.prompt) - cached, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": cached, "output_tokens": output_tokens,
                "cache_creation": {"ephemeral_1h_input_tokens": 0, "ephemeral_5m_input_tokens": 0},
                "output_tokens_details": {"thinking_tokens": reply.output.reasoning_tokens}, "server_tool_use": None,
                "inference_geo": None, "service_tier": "standard"}

    def _message(self, reply: Reply, content: list[dict], stop: tuple[str | None, str | None],
                 output_tokens: int) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": reply.model,
                "content": content, "stop_reason": stop[0], "stop_sequence": stop[1], "stop_details": None,
                "container": None, "usage": self._usage(reply, output_tokens)}

    def _thinking(self, text: str) -> dict:
        return {"type": "thinking", "thinking": text if self.show_thinking else "", "signature": ""}

    def body(self, reply: Reply) -> dict:
        text = reply.output.content()
        content = [self._thinking("".join(reply.output.reasoning))] if reply.output.reasoning else []
        content += [{"type": "text", "text": text, "citations": None}] if text or not reply.output.calls else []
        content += [{"type": "tool_use", "id": c["id"], "name": c["function"]["name"], "caller": {"type": "direct"},
                     "input": _tool_input(c["function"]["arguments"])} for c in reply.output.tool_calls()]
        return self._message(reply, content, self._stop(reply), reply.completion_tokens)

    def _event(self, kind: str, **fields) -> bytes:
        return sse.event(json.dumps({"type": kind, **fields}, ensure_ascii=False), kind)

    def start(self, reply: Reply) -> list[bytes]:
        return [self._event("message_start", message=self._message(reply, [], (None, None), 0)),
                self._event("ping")]

    def _close(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [self._event("content_block_stop", index=self.blocks - 1)]

    def _begin(self, kind: str, block: dict) -> list[bytes]:
        out = self._close()
        self.open = kind
        self.blocks += 1
        return out + [self._event("content_block_start", index=self.blocks - 1, content_block=block)]

    def deltas(self, reply: Reply, deltas: list[ContentDelta | ToolCallDelta | ReasoningDelta]) -> list[bytes]:
        out: list[bytes] = []
        for d in deltas:
            if isinstance(d, ReasoningDelta):
                if self.open != "thinking":
                    out += self._begin("thinking", self._thinking(""))
                if self.show_thinking:
                    out.append(self._event("content_block_delta", index=self.blocks - 1,
                                           delta={"type": "thinking_delta", "thinking": d.text}))
                continue
            if isinstance(d, ContentDelta):
                if self.open != "text":
                    out += self._begin("text", {"type": "text", "text": "", "citations": None})
                out.append(self._event("content_block_delta", index=self.blocks - 1,
                                       delta={"type": "text_delta", "text": d.text}))
                continue
            if d.id is not None:
                out += self._begin("tool_use", {"type": "tool_use", "id": d.id, "name": d.name,
                                                "caller": {"type": "direct"}, "input": {}})
                self.calls[d.index] = self.blocks - 1
            if d.arguments:
                out.append(self._event("content_block_delta", index=self.calls[d.index],
                                       delta={"type": "input_json_delta", "partial_json": d.arguments}))
        return out

    def end(self, reply: Reply) -> list[bytes]:
        out = self._close()
        stop_reason, stop_sequence = self._stop(reply)
        return out + [self._event("message_delta", delta={"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                                  usage={"output_tokens": reply.completion_tokens}),
                      self._event("message_stop")]

    def error(self, reply: Reply, err: ApiError) -> list[bytes]:
        return [sse.event(json.dumps(error_body(err, ANTHROPIC)), "error")]
