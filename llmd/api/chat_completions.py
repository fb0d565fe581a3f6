"""The chat completions surface (`POST /v1/chat/completions`): the response object
and the `chat.completion.chunk` stream a finished or running reply becomes.

A format object is built per request and handed to the shared generation core
(`llmd.api.reply.Reply`), which calls it back with the reply's deltas; nothing here
touches the runtime or the session table.
"""
from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

from llmd.api import logprobs
from llmd.api.validation import (bool_field, CHAT_KEYS, CHAT_UNSUPPORTED, ChatRequest, check_keys, int_field,
                                 MAX_TOP_LOGPROBS, parse_cache_salt, parse_common, parse_continue_final,
                                 parse_json_object, parse_max_tokens, parse_messages, parse_n, parse_n_probs,
                                 parse_prompt_cache_key, parse_reasoning, parse_response_format, parse_return_progress,
                                 parse_sampling, parse_speculative, parse_stop, parse_stream, parse_template_kwargs,
                                 parse_timings_per_token, parse_tool_choice, parse_tools, required_field)
from llmd.errors import ApiError, error_body, invalid_request, invalid_type, unsupported_parameter
from llmd.http import sse
from llmd.prompt.reasoning import ReasoningDelta
from llmd.prompt.tool_calls import ContentDelta, ToolCallDelta

if TYPE_CHECKING:
    from llmd.api.logprobs import TokenLogprob
    from llmd.api.reply import Choice, Reply

FINGERPRINT = "llmd-0.1.0"


class ChunkStream:
    """What the chat completions and completions streams share: data-only chunks of
    one object type, a finish chunk after each choice, then after the last a usage
    chunk (if asked for) and [DONE]; a failure is one error chunk, then [DONE]."""

    chunk_object: str
    include_usage: bool
    timings_per_token: bool
    id: str
    stream_type = sse.MEDIA_TYPE
    ping = sse.PING

    def _chunk(self, reply: Reply, choice: dict | None, **extra) -> bytes:
        body = {"id": self.id, "object": self.chunk_object, "created": reply.created,
                "model": reply.model, "system_fingerprint": FINGERPRINT,
                "choices": [choice] if choice else [], **extra}
        if self.timings_per_token and choice:
            body["timings"] = reply.g.timings()
        return sse.event(json.dumps(body, ensure_ascii=False))

    def _finish(self, reply: Reply) -> bytes:
        raise NotImplementedError

    def _empty_choice(self, reply: Reply) -> dict:
        raise NotImplementedError

    def progress(self, reply: Reply, progress: dict) -> list[bytes]:
        """A chunk with llama.cpp's `prompt_progress` (total, cache, processed, time_ms)
        and an empty choice, sent before and after each prefill chunk."""
        return [self._chunk(reply, self._empty_choice(reply), prompt_progress=progress)]

    def end(self, reply: Reply) -> list[bytes]:
        out = [self._finish(reply)]
        if not reply.last:
            return out
        if self.include_usage:
            out.append(self._chunk(reply, None, usage=reply.usage(), **reply.extensions()))
        return out + [sse.DONE]

    def error(self, reply: Reply, err: ApiError) -> list[bytes]:
        return [sse.event(json.dumps(error_body(err))), sse.DONE]


class ChatCompletionFormat(ChunkStream):
    """A reply as a `chat.completion` object or a `chat.completion.chunk` stream."""

    prompt_param = "messages"  # what a prompt over the context is blamed on
    remembers_replies = True   # the client sends this reply back in its next request
    shows_reasoning = True     # as `reasoning_content`, llama.cpp's and DeepSeek's field
    chunk_object = "chat.completion.chunk"

    def __init__(self, include_usage: bool, logprobs: bool = False, timings_per_token: bool = False) -> None:
        self.id = "chatcmpl-" + uuid.uuid4().hex[:24]
        self.include_usage = include_usage
        self.logprobs = logprobs
        self.timings_per_token = timings_per_token

    def _logprobs(self, reply: Reply, tokens: list[TokenLogprob]) -> dict | None:
        if not self.logprobs:
            return None
        return {"content": logprobs.chat_content(tokens, reply.piece), "refusal": None}

    def _choice(self, reply: Reply, c: Choice) -> dict:
        text, calls = c.output.content(), c.output.tool_calls()
        message = {"role": "assistant", "content": text or (None if calls else ""), "refusal": None,
                   "annotations": []}
        if c.output.reasoning:
            message["reasoning_content"] = "".join(c.output.reasoning)
        if calls:
            message["tool_calls"] = calls
        return {"index": c.index, "message": message, "logprobs": self._logprobs(reply, c.logprobs),
                "finish_reason": c.finish_reason}

    def body(self, reply: Reply) -> dict:
        return {"id": self.id, "object": "chat.completion", "created": reply.created, "model": reply.model,
                "system_fingerprint": FINGERPRINT, "choices": [self._choice(reply, c) for c in reply.choices()],
                "usage": reply.usage(), **reply.extensions()}

    def _delta(self, reply: Reply, delta: dict, finish: str | None = None) -> bytes:
        # A chunk's logprobs are those of the tokens fed since the previous chunk.
        lp = self._logprobs(reply, reply.take_logprobs())
        return self._chunk(reply, {"index": reply.index, "delta": delta,
                                   "logprobs": lp if lp and lp["content"] else None, "finish_reason": finish})

    def start(self, reply: Reply) -> list[bytes]:
        return [self._delta(reply, {"role": "assistant", "content": ""})]

    def deltas(self, reply: Reply, deltas: list[ContentDelta | ToolCallDelta | ReasoningDelta]) -> list[bytes]:
        return [self._delta(reply, {"content": d.text} if isinstance(d, ContentDelta)
                            else {"reasoning_content": d.text} if isinstance(d, ReasoningDelta)
                            else {"tool_calls": [d.to_openai_delta()]}) for d in deltas]

    def _finish(self, reply: Reply) -> bytes:
        return self._delta(reply, {}, reply.finish_reason)

    def _empty_choice(self, reply: Reply) -> dict:
        return {"index": reply.index, "delta": {}, "logprobs": None, "finish_reason": None}


# --- the request ------------------------------------------------------------

def parse_chat_request(body: bytes) -> ChatRequest:
    """Validate a /v1/chat/completions body; raise ApiError (400) naming the bad param."""
    obj = parse_json_object(body)
    check_keys(obj, CHAT_KEYS, CHAT_UNSUPPORTED)
    model, session_id = parse_common(obj)
    messages = parse_messages(required_field(obj, "messages", "messages"))
    stream, include_usage = parse_stream(obj)

    max_tokens = parse_max_tokens(obj.get("max_tokens"), "max_tokens")
    max_completion = parse_max_tokens(obj.get("max_completion_tokens"), "max_completion_tokens")
    if max_tokens is not None and max_completion is not None and max_tokens != max_completion:
        raise invalid_request("'max_tokens' and 'max_completion_tokens' disagree; give one.",
                              "max_tokens")
    n = parse_n(obj.get("n"))

    logprobs = obj.get("logprobs") is not None and bool_field(obj["logprobs"], "logprobs")
    top_logprobs = obj.get("top_logprobs")
    if top_logprobs is not None:
        int_field(top_logprobs, "top_logprobs", 0, MAX_TOP_LOGPROBS)
        if not logprobs:
            raise invalid_request("'top_logprobs' needs 'logprobs' set to true.", "top_logprobs")
    n_probs = parse_n_probs(obj)
    response_format = parse_response_format(obj.get("response_format"))
    _parse_modalities(obj.get("modalities"))

    tools = parse_tools(obj.get("tools"))
    tool_choice, tool_name = parse_tool_choice(obj.get("tool_choice"), tools)
    ptc = obj.get("parallel_tool_calls")
    # `reasoning` as the Responses API (and OpenRouter's chat) write it: its effort is
    # reasoning_effort's, a summary asks for the reasoning (reasoning_content) itself.
    template_kwargs, template_params = parse_template_kwargs(obj), {}
    effort, summary = parse_reasoning(obj.get("reasoning"))
    if effort is not None:
        if template_kwargs.get("reasoning_effort", effort) != effort:
            raise invalid_request("'reasoning.effort' and 'reasoning_effort' disagree; give one.",
                                  "reasoning.effort")
        template_kwargs["reasoning_effort"] = effort
        template_params["reasoning_effort"] = "reasoning.effort"
    return ChatRequest(
        model=model,
        messages=messages,
        sampling=parse_sampling(obj),
        max_tokens=max_completion if max_completion is not None else max_tokens,
        stop=parse_stop(obj.get("stop")),
        stream=stream,
        include_usage=include_usage,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=True if ptc is None else bool_field(ptc, "parallel_tool_calls"),
        session_id=session_id,
        response_format=response_format,
        tool_name=tool_name,
        template_kwargs=template_kwargs,
        template_params=template_params,
        reasoning=True if summary is not None else None,
        reasoning_param="reasoning.summary",
        logprobs=(top_logprobs or 0) if logprobs else n_probs,
        timings_per_token=parse_timings_per_token(obj),
        return_progress=parse_return_progress(obj),
        prompt_cache_key=parse_prompt_cache_key(obj),
        n=n,
        cache_salt=parse_cache_salt(obj),
        speculative=parse_speculative(obj),
        continue_final=parse_continue_final(obj, messages),
    )


def _parse_modalities(v: Any) -> None:
    if v is None:
        return
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise invalid_type("modalities", "an array of strings", v)
    if set(v) - {"text"}:
        raise unsupported_parameter("modalities", "Only the 'text' modality is supported.")
