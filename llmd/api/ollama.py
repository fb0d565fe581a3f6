"""Ollama's API, for the tools written against Ollama (its Python and JavaScript
libraries, Open WebUI, Home Assistant, editor plugins): `POST /api/chat`, `POST
/api/generate`, `POST /api/embed`, and the served model as Ollama lists and shows
models (`GET /api/tags`, `GET /api/ps`, `POST /api/show`, `GET /api/version`); the
older `POST /api/embeddings` too.

A chat, and a generate request that is not `raw`, run as the OpenAI chat route's
requests do (the model's template; `system` as a system message); a `raw` one runs its
prompt as /v1/completions does, and `suffix` makes it a fill-in-the-middle prompt.
Streams are on unless `"stream": false`, as in Ollama, and are newline-delimited JSON
(application/x-ndjson): an object a line, the last with `"done": true`, `done_reason`
and the counts and durations (nanoseconds) Ollama reports. Sampling starts from
Ollama's defaults (temperature 0.8, top_k 40, top_p 0.9, repeat_penalty 1.1).
`options` that Ollama reads when it loads a model (num_ctx, num_gpu, num_thread, ...)
are fixed when llmd starts (--ctx, --threads) and are accepted without effect, as is
`keep_alive` (the model stays loaded), as are the options Ollama itself no longer reads;
samplers llmd does not run are refused unless they are off. Images are refused (an empty
list of them is none): no model llmd runs has vision.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

from llmd.api.embeddings import MAX_EMBEDDING_INPUTS, EmbeddingsRequest
from llmd.api.validation import (ChatRequest, CompletionRequest, ResponseFormat, Sampling, bool_field, check_keys,
                                 int_field, number_field, parse_continue_final, parse_json_object, parse_messages,
                                 parse_stop, parse_tools, required_field, str_field, value_text, INT32_MAX)
from llmd.errors import ApiError, invalid_request, invalid_type, unsupported_parameter
from llmd.prompt.reasoning import ReasoningDelta
from llmd.prompt.tool_calls import ContentDelta, ToolCallDelta

if TYPE_CHECKING:
    from llmd.api.reply import Reply

PATH = "/api/"  # the routes that answer errors in Ollama's shape: {"error": message}
NDJSON = "application/x-ndjson"
VERSION = "0.9.0"  # the Ollama API these routes follow (`think`, tools, schemas in `format`)

# Ollama's sampling defaults, where a request's options give none.
DEFAULTS = Sampling(temperature=0.8, top_k=40, top_p=0.9, repetition_penalty=1.1)
# option -> (Sampling field, lowest, highest, integer)
_SAMPLING = {"temperature": ("temperature", 0, 2, False), "top_k": ("top_k", 0, INT32_MAX, True),
             "top_p": ("top_p", 0, 1, False), "min_p": ("min_p", 0, 1, False),
             "seed": ("seed", -2**63, 2**63 - 1, True), "repeat_penalty": ("repetition_penalty", 1e-6, 1e9, False),
             "repeat_last_n": ("repeat_last_n", -1, INT32_MAX, True),
             "presence_penalty": ("presence_penalty", -2, 2, False),
             "frequency_penalty": ("frequency_penalty", -2, 2, False)}
# Options that do nothing here: those of loading a model (llmd's are set at its start),
# mirostat's parameters (its sampler off, below), the ones Ollama itself no longer reads.
_NO_EFFECT = frozenset({"num_ctx", "num_batch", "num_gpu", "main_gpu", "num_thread", "use_mmap", "use_mlock", "numa",
                        "low_vram", "vocab_only", "num_keep", "f16_kv", "logits_all", "embedding_only",
                        "mirostat_tau", "mirostat_eta", "penalize_newline"})
# Samplers llmd does not run, accepted at the value that turns them off.
_OFF = {"mirostat": 0, "typical_p": 1, "tfs_z": 1}
MAX_STOPS = 64  # Ollama sets no limit; code-completion clients send about ten
_CHAT_KEYS = frozenset({"model", "messages", "tools", "format", "options", "stream", "keep_alive", "think",
                        "logprobs", "top_logprobs"})
_GENERATE_KEYS = frozenset({"model", "prompt", "suffix", "system", "format", "options", "stream", "keep_alive",
                            "think", "raw", "images", "logprobs", "top_logprobs"})
_UNSUPPORTED = {"template": "'template' is not supported: the model's own template renders the prompt.",
                "context": "'context' (the ids of an earlier generate request) is not supported; send the "
                           "conversation to /api/chat instead."}


def parse_chat_request(body: bytes) -> ChatRequest:
    """Validate an /api/chat body; raise ApiError (400) naming the bad param."""
    obj = parse_json_object(body)
    check_keys(obj, _CHAT_KEYS, _UNSUPPORTED)
    turns = obj.get("messages", [])
    if not isinstance(turns, list):
        raise invalid_type("messages", "an array", turns)
    messages = parse_messages(_openai_messages(turns)) if turns else []
    tools = parse_tools(obj.get("tools"))
    return _chat(obj, messages, tools)


def parse_generate_request(body: bytes) -> ChatRequest | CompletionRequest:
    """Validate an /api/generate body: a chat request of `system` and `prompt`, or with
    `raw` (or a `suffix`) a completion of the prompt as it is."""
    obj = parse_json_object(body)
    check_keys(obj, _GENERATE_KEYS, _UNSUPPORTED)
    _no_images(obj.get("images"), "images")
    prompt = str_field(obj.get("prompt", ""), "prompt")
    suffix = str_field(obj.get("suffix", ""), "suffix")
    raw = obj.get("raw") is not None and bool_field(obj["raw"], "raw")
    if raw or suffix:
        _common(obj)
        for key in ("system", "think"):
            if obj.get(key) is not None:
                raise invalid_request(f"'{key}' goes into the model's template, which a raw prompt or one with a "
                                      f"suffix does not use.", key)
        sampling, max_tokens, stop = _options(obj.get("options"))
        return CompletionRequest(model=_model(obj), prompt=prompt, sampling=sampling, max_tokens=max_tokens, stop=stop,
                                 stream=_stream(obj), include_usage=True, session_id=None, suffix=suffix,
                                 response_format=_format(obj.get("format")))
    system = obj.get("system")
    turns = [{"role": "system", "content": str_field(system, "system")}] if system is not None else []
    return _chat(obj, parse_messages(turns + [{"role": "user", "content": prompt}]) if prompt else [], [])


def parse_embed_request(body: bytes) -> EmbeddingsRequest:
    """Validate an /api/embed body (`input`: a text or texts) as an embeddings request."""
    obj = parse_json_object(body)
    check_keys(obj, frozenset({"model", "input", "truncate", "options", "keep_alive", "dimensions"}), {})
    _common(obj)
    if obj.get("truncate") is not None and bool_field(obj["truncate"], "truncate"):
        raise unsupported_parameter("truncate", "'truncate': true is not supported: an input longer than the "
                                                "context is refused, never cut.")
    if obj.get("options") is not None:
        _options(obj["options"])
    texts = required_field(obj, "input", "input")
    if not isinstance(texts, (str, list)) or not texts:
        raise invalid_type("input", "a string or a non-empty array of strings", texts)
    if isinstance(texts, list) and len(texts) > MAX_EMBEDDING_INPUTS:
        raise invalid_request(f"Invalid value for 'input': at most {MAX_EMBEDDING_INPUTS} inputs are allowed in "
                              f"one request, not {len(texts)}.", "input")
    inputs = [texts] if isinstance(texts, str) else [str_field(t, f"input[{i}]") for i, t in enumerate(texts)]
    for i, text in enumerate(inputs):
        if not text:
            raise invalid_request(f"Invalid value for 'input[{i}]': an input must not be empty.", f"input[{i}]")
    dimensions = obj.get("dimensions")
    return EmbeddingsRequest(_model(obj), inputs, "float",
                             None if dimensions is None else int_field(dimensions, "dimensions", 1, INT32_MAX))


def parse_embeddings_request(body: bytes) -> EmbeddingsRequest:
    """Validate a body of /api/embeddings, which /api/embed superseded: one `prompt`,
    none when it is empty."""
    obj = parse_json_object(body)
    check_keys(obj, frozenset({"model", "prompt", "options", "keep_alive"}), {})
    _common(obj)
    if obj.get("options") is not None:
        _options(obj["options"])
    prompt = str_field(obj.get("prompt", ""), "prompt")
    return EmbeddingsRequest(_model(obj), [prompt] if prompt else [], "float")


def parse_show_request(body: bytes) -> str:
    """The model an /api/show body names (`model`, or the older `name`)."""
    obj = parse_json_object(body)
    check_keys(obj, frozenset({"model", "name", "verbose"}), {})
    if obj.get("model") is None and obj.get("name") is not None:
        return str_field(obj["name"], "name")
    return _model(obj)


def loaded(model: str, chat: bool, body: bytes) -> dict:
    """The answer to a request with nothing to generate, which Ollama's clients send to
    load a model (or with keep_alive 0 to unload it): done, the model staying loaded."""
    keep_alive = json.loads(body).get("keep_alive")
    unload = keep_alive in (0, "0", "0s", "0m") and not isinstance(keep_alive, bool)
    line = {"model": model, "created_at": created_at(),
            **({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""})}
    return {**line, "done_reason": "unload" if unload else "load", "done": True}


def _model(obj: dict) -> str:
    return str_field(required_field(obj, "model", "model"), "model")


def _stream(obj: dict) -> bool:
    return obj.get("stream") is None or bool_field(obj["stream"], "stream")


def _common(obj: dict) -> None:
    """The fields every request may carry that change nothing here: keep_alive (the model
    stays loaded), and logprobs turned off."""
    keep_alive = obj.get("keep_alive")
    if keep_alive is not None and (isinstance(keep_alive, bool) or not isinstance(keep_alive, (str, int, float))):
        raise invalid_type("keep_alive", "a duration (a string such as \"5m\", or seconds)", keep_alive)
    if obj.get("logprobs") is not None and bool_field(obj["logprobs"], "logprobs"):
        raise unsupported_parameter("logprobs", "'logprobs' is not supported on Ollama's routes; "
                                                "/v1/chat/completions answers them.")
    if obj.get("top_logprobs") is not None and int_field(obj["top_logprobs"], "top_logprobs", 0, INT32_MAX):
        raise unsupported_parameter("top_logprobs", "'top_logprobs' is not supported on Ollama's routes.")


def _no_images(v: Any, p: str) -> None:
    """`images`: absent or empty (some clients always send the array)."""
    if v is None or v == []:
        return
    if not isinstance(v, list):
        raise invalid_type(p, "an array of images", v)
    raise unsupported_parameter(p, "Images are not supported: no model llmd runs has vision.")


def _chat(obj: dict, messages: list, tools: list) -> ChatRequest:
    _common(obj)
    sampling, max_tokens, stop = _options(obj.get("options"))
    think = obj.get("think")
    if think is not None and not isinstance(think, bool) and think not in ("low", "medium", "high"):
        raise invalid_request(f"Invalid value for 'think': {value_text(think)}; expected true, false, 'low', "
                              "'medium' or 'high'.", "think")
    effort = isinstance(think, str)
    kwargs, params = ({"reasoning_effort": think}, {"reasoning_effort": "think"}) if effort else ({}, {})
    return ChatRequest(model=_model(obj), messages=messages, sampling=sampling, max_tokens=max_tokens, stop=stop,
                       stream=_stream(obj), include_usage=True, tools=tools, tool_choice="auto" if tools else "none",
                       parallel_tool_calls=True, session_id=None, response_format=_format(obj.get("format")),
                       template_kwargs=kwargs, template_params={"enable_thinking": "think", **params},
                       reasoning=None if think is None else think is not False, reasoning_param="think",
                       continue_final=parse_continue_final(obj, messages))


def _options(v: Any) -> tuple[Sampling, int | None, list[str]]:
    """(sampling, max_tokens, stop) of `options`."""
    if v is None:
        return DEFAULTS, None, []
    if not isinstance(v, dict):
        raise invalid_type("options", "an object", v)
    fields = {}
    max_tokens, stop = None, []
    for key, value in v.items():
        p = f"options.{key}"
        if key in _SAMPLING:
            name, lo, hi, integer = _SAMPLING[key]
            if integer and isinstance(value, float) and value.is_integer():  # Ollama reads 40.0 as 40
                value = int(value)
            fields[name] = int_field(value, p, lo, hi) if integer else number_field(value, p, lo, hi)
            if key == "seed" and value == -1:  # Ollama's: a random seed
                fields[name] = None
        elif key == "num_predict":
            n = int_field(value, p, -2, INT32_MAX)
            if n == 0:
                raise invalid_request(f"Invalid value for '{p}': at least 1 token (or -1 for as many as fit).", p)
            max_tokens = n if n > 0 else None
        elif key == "stop":
            stop = parse_stop(value, p, MAX_STOPS)
        elif key in _OFF:
            if isinstance(value, bool) or value != _OFF[key]:
                raise unsupported_parameter(p, f"'{p}' is only accepted as {_OFF[key]}: llmd does not run that "
                                               "sampler.")
        elif key not in _NO_EFFECT:
            raise invalid_request(f"Unrecognized option: '{key}'.", p, "unknown_parameter")
    sampling = Sampling(**{**DEFAULTS.__dict__, **fields})
    return sampling, max_tokens, stop


def _format(v: Any) -> ResponseFormat | None:
    """`format`: "json", or a JSON Schema the output follows."""
    if v is None or v == "":
        return None
    if v == "json":
        return ResponseFormat("json_object")
    if isinstance(v, dict):
        return ResponseFormat("json_schema", v)
    raise invalid_request(f"Invalid value for 'format': {value_text(v)}; expected \"json\" or a JSON Schema.",
                          "format")


def _openai_messages(turns: list) -> list:
    """Ollama's messages as the chat route's: tool calls given ids in order, each tool
    result answering the earliest call not answered yet (of its `tool_name`, if given),
    `thinking` as the turn's reasoning."""
    out, pending, n_calls = [], [], 0
    for i, m in enumerate(turns):
        p = f"messages[{i}]"
        if not isinstance(m, dict):
            raise invalid_type(p, "an object", m)
        check_keys(m, frozenset({"role", "content", "tool_calls", "thinking", "tool_name", "images"}), {})
        _no_images(m.get("images"), f"{p}.images")
        message = {"role": m.get("role"), "content": m.get("content", "")}
        if m.get("thinking") is not None:
            message["reasoning_content"] = str_field(m["thinking"], f"{p}.thinking")
        calls = m.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise invalid_type(f"{p}.tool_calls", "an array", calls)
            message["tool_calls"] = []
            for j, c in enumerate(calls):
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict):
                    raise invalid_type(f"{p}.tool_calls[{j}].function", "an object", fn)
                name = str_field(required_field(fn, "name", f"{p}.tool_calls[{j}].function.name"),
                                 f"{p}.tool_calls[{j}].function.name")
                arguments = fn.get("arguments", {})
                if not isinstance(arguments, dict):
                    raise invalid_type(f"{p}.tool_calls[{j}].function.arguments", "an object", arguments)
                n_calls += 1
                pending.append((f"call_{n_calls}", name))
                message["tool_calls"].append({"id": pending[-1][0], "type": "function", "function": {
                    "name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}})
        if m.get("role") == "tool":
            name = None if m.get("tool_name") is None else str_field(m["tool_name"], f"{p}.tool_name")
            match = next((k for k, (_, called) in enumerate(pending) if name in (None, called)), None)
            message["tool_call_id"] = pending.pop(match)[0] if match is not None else f"call_{i}"
            if name is not None:
                message["name"] = name
        out.append(message)
    return out


# --- the answer -----------------------------------------------------------------------------

_LINE_ENDS = str.maketrans({c: f"\\u{ord(c):04x}" for c in "\u0085\u2028\u2029"})


def created_at() -> str:
    """Now as Ollama writes it: RFC 3339 in UTC with nanoseconds."""
    ns = time.time_ns()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 10**9)) + f".{ns % 10**9:09d}Z"


class OllamaFormat:
    """A reply as Ollama's /api/chat (`message`) or /api/generate (`response`) objects:
    one when collected, newline-delimited ones when streamed. Tool calls come whole,
    in the line before the last, as Ollama sends them."""

    shows_reasoning = True  # as `thinking`
    stream_type = NDJSON

    def __init__(self, chat: bool, started: float, model: str) -> None:
        self.chat = chat
        self.remembers_replies = chat  # the client sends a chat's reply back
        self.prompt_param = "messages" if chat else "prompt"
        self.started = started  # time.perf_counter() when the request came
        self.id = ("chat-" if chat else "generate-") + uuid.uuid4().hex[:24]
        # While the prompt is processed: a line of no text, which a client reads as nothing
        # new (Ollama's clients parse every line, so SSE's comment would not do).
        self.ping = self._encode(self._line(model))

    def _line(self, model: str, content: str = "", thinking: str = "", calls: list | None = None) -> dict:
        obj: dict[str, Any] = {"model": model, "created_at": created_at()}
        if self.chat:
            obj["message"] = {"role": "assistant", "content": content}
            if thinking:
                obj["message"]["thinking"] = thinking
            if calls:
                obj["message"]["tool_calls"] = calls
        else:
            obj["response"] = content
            if thinking:
                obj["thinking"] = thinking
        return {**obj, "done": False}

    @staticmethod
    def _encode(obj: dict) -> bytes:
        """One line: JSON with the characters some clients' line readers also end lines
        at (U+0085, U+2028, U+2029; httpx's) escaped, as Ollama's encoder does."""
        return json.dumps(obj, ensure_ascii=False).translate(_LINE_ENDS).encode() + b"\n"

    def _stats(self, reply: Reply) -> dict:
        t = reply.g.timings()
        usage = reply.usage()
        return {"done": True, "done_reason": "length" if reply.finish_reason == "length" else "stop",
                "total_duration": int((time.perf_counter() - self.started) * 1e9), "load_duration": 0,
                "prompt_eval_count": usage["prompt_tokens"], "prompt_eval_duration": int(t["prompt_ms"] * 1e6),
                "eval_count": usage["completion_tokens"], "eval_duration": int(t["predicted_ms"] * 1e6)}

    @staticmethod
    def _calls(calls: list[dict]) -> list[dict]:
        """OpenAI-shaped tool calls as Ollama's: arguments as an object."""
        return [{"function": {"name": c["function"]["name"], "arguments": _arguments(c["function"]["arguments"])}}
                for c in calls]

    def body(self, reply: Reply) -> dict:
        c = reply.choices()[0]
        line = self._line(reply.model, c.output.content(), "".join(c.output.reasoning),
                          self._calls(c.output.tool_calls()))
        return {**line, **self._stats(reply)}

    def start(self, reply: Reply) -> list[bytes]:
        return []

    def deltas(self, reply: Reply, deltas: list[ContentDelta | ToolCallDelta | ReasoningDelta]) -> list[bytes]:
        return [self._encode(self._line(reply.model, d.text) if isinstance(d, ContentDelta)
                             else self._line(reply.model, thinking=d.text)) for d in deltas
                if isinstance(d, (ContentDelta, ReasoningDelta)) and d.text]

    def end(self, reply: Reply) -> list[bytes]:
        calls = self._calls(reply.output.tool_calls())
        return ([self._encode(self._line(reply.model, calls=calls))] if calls else []) + \
            [self._encode({**self._line(reply.model), **self._stats(reply)})]

    def error(self, reply: Reply, err: ApiError) -> list[bytes]:
        return [self._encode({"error": err.message})]

    def progress(self, reply: Reply, progress: dict) -> list[bytes]:
        return []


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text
