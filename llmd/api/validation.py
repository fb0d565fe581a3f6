"""Request validation shared by every API surface: raw body bytes in, a request
dataclass or an ApiError out. Each surface's own `parse_*_request` lives in its module
(chat_completions, completions, responses, anthropic, embeddings) and is built from the
JSON reading, field checks and shared fields here; the records the surfaces share
(Message, Tool, Sampling, ChatRequest, CompletionRequest) and the requests of the
llama.cpp-style extension routes (tokenize, detokenize, apply-template) are here too.

Everything here runs before the first response byte, so every refusal is a plain
HTTP 400 naming the offending parameter (`param`), e.g. "temperature",
"messages[1].content", "messages[2].content[0].type", "tools[0].function.name".

Theory of operation
-------------------
1. `parse_json_object` reads the body: strict UTF-8, standard JSON only. It refuses
   NaN/Infinity literals, numbers that overflow a double (1e400), nesting deeper than
   MAX_DEPTH (checked by a linear scan *before* parsing, so a hostile "[[[[..." never
   reaches the recursive parser), duplicate object keys (RFC 8259 leaves their meaning
   open; refusing closes the door on two layers reading different values), lone UTF-16
   surrogates ("\\ud800" cannot be encoded for the tokenizer), and a non-object top level.
2. `parse_*_request` checks each field's JSON type, then its range, and builds a frozen
   dataclass. `null` means "not given" for every optional field, as in OpenAI.
   Types are exact: `true` is not an integer, `1.0` is not an integer, `1` is a number.

Field policy (the reasoned choice):
- Known fields llmd honours are validated and used.
- Known OpenAI fields with no effect on the generated output (`user`, `metadata`,
  `store`, `service_tier`, `safety_identifier`, `prompt_cache_retention`) are accepted;
  `user` and `prompt_cache_retention` are checked. `prompt_cache_key` names the
  session when no session id is given. llama.cpp's `cache_prompt`, `id_slot` (-1
  only), `n_probs` (top logprobs), `timings_per_token` and `return_progress` (prompt
  progress chunks in a stream, as llama.cpp's server sends them) are accepted too,
  and so are `speculative` (false: no speculative decoding for this request) and
  llama.cpp's `speculative.n_max` / `speculative.n_min` (bounds on a proposal's length).
- Known OpenAI fields or values llmd cannot honour (`audio`, `modalities` other than
  ["text"], `prediction`, legacy `functions`/`function_call`, `web_search_options`,
  `verbosity`, tool_choice "allowed_tools"/custom, `suffix` for a model without
  fill-in-the-middle tokens, best_of > 1, image/audio/file content parts) are refused with 400
  `unsupported_parameter`, because the design says what cannot be honoured is never
  silently ignored. response_format json_object / json_schema and tool_choice
  "required" / a named function are honoured by constrained decoding (constrain.py,
  which also refuses schemas outside the supported subset). `chat_template_kwargs`
  (llama.cpp's extension, e.g. {"enable_thinking": false}) and `reasoning_effort` become
  variables of the chat template; the chat layer refuses them, naming the parameter,
  when the model's template does not read them.
- Top-level fields llmd does not know at all are refused with 400 `unknown_parameter`,
  as OpenAI itself does ("Unrecognized request argument supplied"). A vendor knob from
  another server (`n_predict`, `mirostat`, ...) would otherwise change nothing while the
  client believes it took effect.
- Inside a message, keys other than role/content/name/tool_calls/tool_call_id and an
  assistant's `reasoning_content` (a string, kept for templates that render past
  reasoning) are ignored: clients echo whole response messages back (`refusal`,
  `annotations`, ...) and those carry no generation knob. `audio` and `function_call`
  on a message are refused when non-null.

Other choices: text content parts are joined with "\\n" (as vLLM does); tool_choice
"auto" with no tools normalises to "none", a named function becomes "required" with
`tool_name` set; max_tokens and max_completion_tokens may both
be given only if equal; token ids are checked against the vocabulary later by
`check_vocab(request, n_vocab)`, because the vocabulary size lives in the engine.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Callable, Sequence, TypeVar

from llmd.errors import (
    ApiError,
    invalid_json,
    invalid_request,
    invalid_session_id,
    invalid_type,
    missing_parameter,
    unknown_parameter,
    unsupported_parameter,
)
from llmd.serving.speculative import MAX_DRAFT

MAX_DEPTH = 64           # JSON nesting; the top-level object is depth 1
PARSE_INLINE_BYTES = 64 * 1024  # bodies parsed on the event loop; bigger ones on a thread
MAX_STOPS = 4            # as OpenAI
INT32_MAX = 2**31 - 1    # bound for counts that reach the C ABI as int32
ROLES = ("system", "developer", "user", "assistant", "tool")


# --- records ----------------------------------------------------------------------

@dataclass(frozen=True)
class Sampling:
    """Sampler settings shared by chat and completions; defaults are OpenAI's."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0                     # 0 = off (extension)
    min_p: float = 0.0                 # 0 = off (extension)
    seed: int | None = None            # int64 range; None = server picks
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0    # 1 = off (extension)
    repeat_last_n: int = 64            # the tokens the penalties look back over (-1: all, 0: none)
    logit_bias: dict[int, float] = field(default_factory=dict)
    infill: bool = False               # llama.cpp's infill step (/infill's samplers)


@dataclass(frozen=True)
class ToolCall:
    """A tool call an assistant message made earlier in the conversation."""
    id: str
    name: str
    arguments: str                     # JSON text, as OpenAI sends it


@dataclass(frozen=True)
class Message:
    role: str                          # one of ROLES
    content: str | None                # None only for an assistant with tool_calls
    name: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None    # set for role "tool"
    # An assistant turn's reasoning as the client sent it back (reasoning_content, a
    # reasoning item, a thinking block): read by a template that renders past reasoning
    # (gpt-oss's, as its `thinking`), left out by the others as they leave it out.
    reasoning: str | None = None


@dataclass(frozen=True)
class Tool:
    name: str
    description: str | None = None
    parameters: dict | None = None     # JSON Schema, passed to the template as is


@dataclass(frozen=True)
class ResponseFormat:
    type: str                          # "text" | "json_object" | "json_schema"
    schema: Any = None                 # json_schema: the JSON Schema ({} if not given)


@dataclass(frozen=True)
class Speculative:
    """A request's say on speculative decoding: off, or bounds on a proposal's length
    (None: the server's)."""

    enabled: bool = True
    n_max: int | None = None
    n_min: int | None = None


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: list[Message]
    sampling: Sampling
    max_tokens: int | None             # None = until the context is full
    stop: list[str]
    stream: bool
    include_usage: bool
    tools: list[Tool]
    tool_choice: str                   # "none" | "auto" | "required"
    parallel_tool_calls: bool
    session_id: str | None             # validated later by the sessions layer
    response_format: ResponseFormat | None = None
    tool_name: str | None = None       # the function a named tool_choice forces
    template_kwargs: dict = field(default_factory=dict)  # extra chat-template variables
    logprobs: int | None = None        # None: off; else how many top logprobs per token
    timings_per_token: bool = False    # every stream chunk carries `timings` (llama.cpp)
    return_progress: bool = False      # a stream reports prompt processing (llama.cpp's prompt_progress)
    prompt_cache_key: str | None = None  # names a session when nothing else does
    n: int = 1                         # choices, each with its own seed stream
    # The client asked for reasoning (True: refused on a model without it) or for none
    # (False: a reasoning template's `enable_thinking` off); None: the template's default.
    reasoning: bool | None = None
    reasoning_param: str | None = None  # the request field that asked, named in a refusal
    show_reasoning: bool = True        # False: reasoning blocks come without their text (Anthropic "omitted")
    # template variable -> the request field that set it (named when the template has no use for it)
    template_params: dict = field(default_factory=dict)
    cache_salt: str | None = None      # shares cached prefixes only with the same salt
    speculative: Speculative = Speculative()
    continue_final: bool = False       # the last message is a reply the model continues (continue_final)


@dataclass(frozen=True)
class CompletionRequest:
    model: str
    prompt: str | list[int]            # text, or token ids (range-checked by check_vocab)
    sampling: Sampling
    max_tokens: int | None             # default 16, as OpenAI; None: up to the context (/infill)
    stop: list[str]
    stream: bool
    include_usage: bool
    session_id: str | None
    suffix: str = ""                   # text after the completion: a fill-in-the-middle prompt
    response_format: ResponseFormat | None = None
    logprobs: int | None = None        # None: off; else how many top logprobs per token
    echo: bool = False                 # the prompt (and its logprobs) before the completion
    timings_per_token: bool = False
    return_progress: bool = False
    prompt_cache_key: str | None = None
    n: int = 1
    cache_salt: str | None = None
    speculative: Speculative = Speculative()


@dataclass(frozen=True)
class TokenizeRequest:
    content: str
    add_special: bool = False
    with_pieces: bool = False


@dataclass(frozen=True)
class DetokenizeRequest:
    tokens: list[int]


@dataclass(frozen=True)
class ApplyTemplateRequest:
    messages: list[Message]
    tools: list[Tool]
    tool_choice: str
    add_generation_prompt: bool = True
    template_kwargs: dict = field(default_factory=dict)
    continue_final: bool = False


# --- JSON -------------------------------------------------------------------------

T = TypeVar("T")


async def parse(parser: Callable[[bytes], T], body: bytes) -> T:
    """parser(body); a big body is parsed on a worker thread, so that validating a
    million-element array does not hold up every stream on the event loop."""
    if len(body) <= PARSE_INLINE_BYTES:
        return parser(body)
    return await asyncio.to_thread(parser, body)


# A string, or an unterminated one to the end: a match that could fail would be retried
# from every later quote, quadratic in an unclosed run of escaped quotes.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKET = re.compile(r'[^\[\]{}]+')
_MAYBE_SURROGATE = re.compile(r'\\u[dD][89a-fA-F]')


def parse_json_object(body: bytes) -> dict:
    """Parse `body` as one JSON object, or raise a 400 ApiError saying why not."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise invalid_json(f"Request body is not valid UTF-8 (at byte {e.start}).") from None
    _check_depth(text)
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float,
                           object_pairs_hook=_object_without_duplicates)
    except ApiError:
        raise
    except (ValueError, RecursionError) as e:  # JSONDecodeError, int digit limit
        raise invalid_json(f"Request body is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise invalid_request("Request body must be a JSON object.", None, "invalid_type")
    if _MAYBE_SURROGATE.search(text):  # rare: only then walk the tree
        _check_no_lone_surrogates(value)
    return value


def _check_depth(text: str) -> None:
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return
    # Brackets inside strings do not nest; drop strings, keep only brackets, then take
    # the running maximum. Malformed JSON may miscount here, but json.loads refuses it.
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    depth = max(accumulate(1 if c in "[{" else -1 for c in brackets), default=0)
    if depth > MAX_DEPTH:
        raise invalid_json(f"Request body nests deeper than {MAX_DEPTH} levels.")


def _reject_constant(name: str) -> Any:
    raise invalid_json(f"Request body is not valid JSON: '{name}' is not a JSON number.")


def _finite_float(text: str) -> float:
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise invalid_json(f"Request body is not valid JSON: number {text[:40]} is out of range.")
    return value


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise invalid_json(f"Request body has a duplicate key '{key[:64]}'.")
            seen.add(key)
    return obj


def _check_no_lone_surrogates(value: Any) -> None:
    stack = [value]
    while stack:  # iterative: depth is bounded already, but no recursion is simpler
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise invalid_json("Request body contains a lone UTF-16 surrogate.") from None


# --- field checks -----------------------------------------------------------------

def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def value_text(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


def int_field(v: Any, param: str, lo: int, hi: int) -> int:
    if not is_int(v):
        raise invalid_type(param, "an integer", v)
    if not lo <= v <= hi:
        raise invalid_request(
            f"Invalid value for '{param}': expected an integer between {lo} and {hi}, "
            f"got {value_text(v)}.", param)
    return v


def number_field(v: Any, param: str, lo: float, hi: float, lo_open: bool = False) -> float:
    if not _is_number(v):
        raise invalid_type(param, "a number", v)
    # Compare before float(): float(10**400) would raise OverflowError.
    if not ((lo < v) if lo_open else (lo <= v)) or not v <= hi:
        low = f"greater than {lo}" if lo_open else f"at least {lo}"
        raise invalid_request(
            f"Invalid value for '{param}': expected a number {low} and at most {hi}, "
            f"got {value_text(v)}.", param)
    return float(v)


def bool_field(v: Any, param: str) -> bool:
    if not isinstance(v, bool):
        raise invalid_type(param, "a boolean", v)
    return v


def str_field(v: Any, param: str) -> str:
    if not isinstance(v, str):
        raise invalid_type(param, "a string", v)
    return v


def required_field(obj: dict, key: str, param: str) -> Any:
    v = obj.get(key)
    if v is None:
        raise missing_parameter(param)
    return v


def check_keys(body: dict, known: frozenset[str], unsupported: dict[str, str]) -> None:
    for key, value in body.items():
        if key in known:
            continue
        if key in unsupported:
            if value is not None:
                raise unsupported_parameter(key, unsupported[key])
            continue
        raise unknown_parameter(key)


# --- shared fields ----------------------------------------------------------------

SAMPLING_KEYS = frozenset({
    "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
    "frequency_penalty", "repetition_penalty", "logit_bias"})
_NO_EFFECT_KEYS = frozenset({
    "user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier",
    "prompt_cache_retention"})
# llama.cpp server fields: cache_prompt (llmd always reuses the cache), id_slot (refused
# unless -1, "any slot": sessions are named by session_id), n_probs (top logprobs),
# timings_per_token, return_progress (prompt progress chunks while a stream's prompt is processed).
LLAMA_KEYS = frozenset({"cache_prompt", "id_slot", "n_probs", "timings_per_token", "return_progress",
                        "speculative", "speculative.n_max", "speculative.n_min"})
# vLLM's cache_salt: only requests that send the same salt share cached prompt prefixes.
CACHE_KEYS = frozenset({"cache_salt"})
MAX_CACHE_SALT = 256
MAX_TOP_LOGPROBS = 20                  # the engine's bound (LLMD_MAX_TOP_LOGPROBS)
MAX_CHOICES = 16                       # n: each choice takes a session slot or a turn on the request's one
_CACHE_RETENTION = ("in_memory", "24h")
_TOKEN_KEY = re.compile(r"0|[1-9][0-9]{0,9}")


def parse_sampling(body: dict) -> Sampling:
    default = Sampling()

    def number(key: str, lo: float, hi: float, lo_open: bool = False) -> float:
        v = body.get(key)
        return getattr(default, key) if v is None else number_field(v, key, lo, hi, lo_open)

    def integer(key: str, lo: int, hi: int) -> int | None:
        v = body.get(key)
        return getattr(default, key) if v is None else int_field(v, key, lo, hi)

    return Sampling(
        temperature=number("temperature", 0, 2),
        top_p=number("top_p", 0, 1),
        top_k=integer("top_k", 0, INT32_MAX),
        min_p=number("min_p", 0, 1),
        seed=integer("seed", -2**63, 2**63 - 1),
        presence_penalty=number("presence_penalty", -2, 2),
        frequency_penalty=number("frequency_penalty", -2, 2),
        # it divides logits, as the engine's 32-bit float: 1e-6 keeps it from rounding to 0
        # there; 1e9 only keeps float() of a huge int away
        repetition_penalty=number("repetition_penalty", 1e-6, 1e9),
        logit_bias=parse_logit_bias(body.get("logit_bias")),
    )


def parse_logit_bias(v: Any) -> dict[int, float]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise invalid_type("logit_bias", "an object", v)
    bias: dict[int, float] = {}
    for key, value in v.items():
        if not _TOKEN_KEY.fullmatch(key):
            raise invalid_request(
                f"Invalid value for 'logit_bias': key {value_text(key)} is not a token id.",
                "logit_bias")
        bias[int(key)] = number_field(value, f"logit_bias.{key}", -100, 100)
    return bias


def parse_stop(v: Any, name: str = "stop", limit: int = MAX_STOPS) -> list[str]:
    """Stop sequences given as field `name`: a string or at most `limit` of them."""
    if v is None:
        return []
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list):
        raise invalid_type(name, "a string or an array of strings", v)
    if len(stops) > limit:
        raise invalid_request(f"Invalid value for '{name}': at most {limit} stop sequences "
                              f"are allowed, got {len(stops)}.", name)
    for i, s in enumerate(stops):
        param = name if isinstance(v, str) else f"{name}[{i}]"
        if not str_field(s, param):
            raise invalid_request(f"Invalid value for '{param}': a stop sequence must not "
                                  "be empty.", param)
    return list(stops)


def parse_stream(body: dict) -> tuple[bool, bool]:
    """Return (stream, include_usage)."""
    v = body.get("stream")
    stream = False if v is None else bool_field(v, "stream")
    opts = body.get("stream_options")
    if opts is None:
        return stream, False
    if not isinstance(opts, dict):
        raise invalid_type("stream_options", "an object", opts)
    for key in opts:
        if key not in ("include_usage", "include_obfuscation"):
            raise unknown_parameter(f"stream_options.{key}")
    usage = opts.get("include_usage")
    if opts.get("include_obfuscation") is not None:  # no effect: llmd never pads events
        bool_field(opts["include_obfuscation"], "stream_options.include_obfuscation")
    return stream, False if usage is None else bool_field(usage, "stream_options.include_usage")


def parse_max_tokens(v: Any, param: str, lo: int = 1) -> int | None:
    return None if v is None else int_field(v, param, lo, INT32_MAX)


def parse_timings_per_token(body: dict) -> bool:
    v = body.get("timings_per_token")
    return False if v is None else bool_field(v, "timings_per_token")


def parse_return_progress(body: dict) -> bool:
    v = body.get("return_progress")
    return False if v is None else bool_field(v, "return_progress")


def parse_speculative(body: dict) -> Speculative:
    """`speculative` (a boolean) and llama.cpp's `speculative.n_max` / `speculative.n_min`."""
    v = body.get("speculative")
    enabled = True if v is None else bool_field(v, "speculative")
    bounds = {}
    for key in ("n_max", "n_min"):
        v = body.get(f"speculative.{key}")
        bounds[key] = None if v is None else int_field(v, f"speculative.{key}", 0, MAX_DRAFT)
    if bounds["n_max"] is not None and bounds["n_min"] is not None and bounds["n_min"] > bounds["n_max"]:
        raise invalid_request("'speculative.n_min' must not exceed 'speculative.n_max'.", "speculative.n_min")
    return Speculative(enabled, **bounds)


def parse_prompt_cache_key(body: dict) -> str | None:
    v = body.get("prompt_cache_key")
    return None if v is None else str_field(v, "prompt_cache_key")


def parse_cache_salt(body: dict) -> str | None:
    v = body.get("cache_salt")
    if v is None:
        return None
    salt = str_field(v, "cache_salt")
    if not 1 <= len(salt) <= MAX_CACHE_SALT:
        raise invalid_request(f"'cache_salt' must be 1 to {MAX_CACHE_SALT} characters.", "cache_salt")
    return salt


def parse_n_probs(body: dict) -> int | None:
    """llama.cpp's n_probs: that many top logprobs per token (0: off)."""
    v = body.get("n_probs")
    return None if v is None or int_field(v, "n_probs", 0, MAX_TOP_LOGPROBS) == 0 else v


def parse_n(v: Any) -> int:
    return 1 if v is None else int_field(v, "n", 1, MAX_CHOICES)


def parse_common(body: dict) -> tuple[str, str | None]:
    """Return (model, session_id); also type-checks `user`, `prompt_cache_retention`
    and the llama.cpp fields that need no further use (cache_prompt, id_slot)."""
    model = str_field(required_field(body, "model", "model"), "model")
    if body.get("user") is not None:
        str_field(body["user"], "user")
    retention = body.get("prompt_cache_retention")
    if retention is not None and str_field(retention, "prompt_cache_retention") not in _CACHE_RETENTION:
        raise invalid_request(f"Invalid value for 'prompt_cache_retention': {value_text(retention)}; expected "
                              "'in_memory' or '24h'.", "prompt_cache_retention")
    if body.get("cache_prompt") is not None:
        bool_field(body["cache_prompt"], "cache_prompt")
    if body.get("id_slot") is not None and int_field(body["id_slot"], "id_slot", -1, INT32_MAX) != -1:
        raise unsupported_parameter("id_slot", "'id_slot' is not supported: name a session with "
                                    "'session_id' (or the X-Session-ID header) to keep its cache.")
    sid = body.get("session_id")
    if sid is not None and not isinstance(sid, str):
        raise invalid_session_id("Invalid type for 'session_id': expected a string.")
    return model, sid


# --- chat completions -------------------------------------------------------------

CHAT_KEYS = SAMPLING_KEYS | _NO_EFFECT_KEYS | frozenset({
    "model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens",
    "stop", "n", "logprobs", "top_logprobs", "response_format", "tools", "tool_choice",
    "parallel_tool_calls", "modalities", "session_id", "chat_template_kwargs", "reasoning_effort",
    "reasoning", "continue_final_message"}) | LLAMA_KEYS | CACHE_KEYS
CHAT_UNSUPPORTED = {
    "audio": "Audio output is not supported: this server generates text only.",
    "prediction": "Predicted outputs ('prediction') are not supported.",
    "functions": "The legacy 'functions' parameter is not supported; use 'tools'.",
    "function_call": "The legacy 'function_call' parameter is not supported; use 'tool_choice'.",
    "web_search_options": "Web search is not supported.",
    "verbosity": "'verbosity' is not supported by this server.",
}
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
UNSUPPORTED_PARTS = ("image_url", "input_audio", "file", "input_image", "input_file")


_REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def parse_template_kwargs(obj: dict) -> dict:
    """`chat_template_kwargs` (an object) and `reasoning_effort` as template variables."""
    kwargs = obj.get("chat_template_kwargs")
    if kwargs is None:
        kwargs = {}
    elif not isinstance(kwargs, dict):
        raise invalid_type("chat_template_kwargs", "an object", kwargs)
    effort = obj.get("reasoning_effort")
    if effort is not None:
        if str_field(effort, "reasoning_effort") not in _REASONING_EFFORTS:
            raise invalid_request(f"'reasoning_effort' must be one of {', '.join(_REASONING_EFFORTS)}.",
                                  "reasoning_effort")
        kwargs = {**kwargs, "reasoning_effort": effort}
    return dict(kwargs)


def parse_messages(v: Any) -> list[Message]:
    if not isinstance(v, list):
        raise invalid_type("messages", "an array", v)
    if not v:
        raise invalid_request("Invalid value for 'messages': at least one message is required.",
                              "messages")
    return [_parse_message(m, f"messages[{i}]") for i, m in enumerate(v)]


def _parse_message(m: Any, p: str) -> Message:
    if not isinstance(m, dict):
        raise invalid_type(p, "an object", m)
    role = str_field(required_field(m, "role", f"{p}.role"), f"{p}.role")
    if role == "function":
        raise unsupported_parameter(f"{p}.role", "Legacy 'function' messages are not supported; "
                                    "use role 'tool'.")
    if role not in ROLES:
        raise invalid_request(f"Invalid value for '{p}.role': {value_text(role)}; expected one of "
                              f"{', '.join(ROLES)}.", f"{p}.role")
    for key in ("audio", "function_call"):
        if m.get(key) is not None:
            raise unsupported_parameter(f"{p}.{key}")
    name = None if m.get("name") is None else str_field(m["name"], f"{p}.name")

    tool_calls: tuple[ToolCall, ...] = ()
    if role == "assistant":
        tool_calls = _parse_tool_calls(m.get("tool_calls"), f"{p}.tool_calls")
    elif m.get("tool_calls") is not None:
        raise invalid_request(f"Invalid value for '{p}.tool_calls': only assistant messages "
                              f"may have tool_calls.", f"{p}.tool_calls")

    raw = m.get("content")
    if raw is None and not (role == "assistant" and tool_calls):
        raise missing_parameter(f"{p}.content")
    content = None if raw is None else _parse_content(raw, f"{p}.content")

    tool_call_id = None
    if role == "tool":
        tool_call_id = str_field(required_field(m, "tool_call_id", f"{p}.tool_call_id"), f"{p}.tool_call_id")
    # As llama.cpp reads it: a string on an assistant message, else nothing.
    reasoning = m.get("reasoning_content") if role == "assistant" and isinstance(m.get("reasoning_content"), str) \
        else None
    return Message(role, content, name, tool_calls, tool_call_id, reasoning)


def _parse_content(v: Any, p: str) -> str:
    if isinstance(v, str):
        return v
    return text_parts(v, p, {"text": "text"}, UNSUPPORTED_PARTS)


def text_parts(v: Any, p: str, kinds: dict[str, str], unsupported: Sequence[str], noun: str = "parts") -> str:
    """The text of an array of content parts joined with "\n". `kinds` maps each text
    part type to the key that holds its text; `unsupported` types (images, files) are
    refused as the served model reads text only; any other type is invalid."""
    if not isinstance(v, list):
        raise invalid_type(p, f"a string or an array of content {noun}", v)
    texts = []
    for j, part in enumerate(v):
        pp = f"{p}[{j}]"
        if not isinstance(part, dict):
            raise invalid_type(pp, "an object", part)
        kind = str_field(required_field(part, "type", f"{pp}.type"), f"{pp}.type")
        if kind in unsupported:
            raise unsupported_parameter(f"{pp}.type", f"Content {noun} of type '{kind}' are not "
                                        "supported: the served model reads text only.")
        if kind not in kinds:
            raise invalid_request(f"Invalid value for '{pp}.type': {value_text(kind)}; expected "
                                  f"{' or '.join(repr(k) for k in kinds)}.", f"{pp}.type")
        texts.append(str_field(required_field(part, kinds[kind], f"{pp}.{kinds[kind]}"), f"{pp}.{kinds[kind]}"))
    return "\n".join(texts)


def _parse_tool_calls(v: Any, p: str) -> tuple[ToolCall, ...]:
    if v is None:
        return ()
    if not isinstance(v, list):
        raise invalid_type(p, "an array", v)
    calls = []
    for i, c in enumerate(v):
        cp = f"{p}[{i}]"
        if not isinstance(c, dict):
            raise invalid_type(cp, "an object", c)
        kind = c.get("type")
        if kind is not None and str_field(kind, f"{cp}.type") != "function":
            raise unsupported_parameter(f"{cp}.type", f"Tool calls of type {value_text(kind)} "
                                        "are not supported.")
        fn = required_field(c, "function", f"{cp}.function")
        if not isinstance(fn, dict):
            raise invalid_type(f"{cp}.function", "an object", fn)
        calls.append(ToolCall(
            id=str_field(required_field(c, "id", f"{cp}.id"), f"{cp}.id"),
            name=str_field(required_field(fn, "name", f"{cp}.function.name"), f"{cp}.function.name"),
            arguments=arguments_field(required_field(fn, "arguments", f"{cp}.function.arguments"),
                                       f"{cp}.function.arguments"),
        ))
    return tuple(calls)


def arguments_field(v: Any, param: str) -> str:
    """A tool call's arguments: a string, whose JSON (when it is JSON) holds no lone UTF-16
    surrogate either, as the body may not: the reply is fingerprinted and rendered as text."""
    text = str_field(v, param)
    if _MAYBE_SURROGATE.search(text):
        try:
            _check_no_lone_surrogates(json.loads(text))
        except ApiError:
            raise invalid_request(f"Invalid value for '{param}': its JSON holds a lone UTF-16 surrogate.",
                                  param) from None
        except (ValueError, RecursionError):
            pass  # not JSON: kept as the text it is
    return text


def parse_tools(v: Any) -> list[Tool]:
    if v is None:
        return []
    if not isinstance(v, list):
        raise invalid_type("tools", "an array", v)
    tools: list[Tool] = []
    names: set[str] = set()
    for i, t in enumerate(v):
        p = f"tools[{i}]"
        if not isinstance(t, dict):
            raise invalid_type(p, "an object", t)
        kind = str_field(required_field(t, "type", f"{p}.type"), f"{p}.type")
        if kind != "function":
            raise unsupported_parameter(f"{p}.type", f"Tools of type {value_text(kind)} are not "
                                        "supported; only 'function'.")
        fn = required_field(t, "function", f"{p}.function")
        if not isinstance(fn, dict):
            raise invalid_type(f"{p}.function", "an object", fn)
        name = str_field(required_field(fn, "name", f"{p}.function.name"), f"{p}.function.name")
        if not _TOOL_NAME.fullmatch(name):
            raise invalid_request(f"Invalid value for '{p}.function.name': {value_text(name)}; names "
                                  "are 1-64 characters of a-z, A-Z, 0-9, '_' and '-'.",
                                  f"{p}.function.name")
        if name in names:
            raise invalid_request(f"Invalid value for '{p}.function.name': duplicate tool name "
                                  f"{value_text(name)}.", f"{p}.function.name")
        names.add(name)
        desc = fn.get("description")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise invalid_type(f"{p}.function.parameters", "an object", params)
        if fn.get("strict") is not None:  # arguments always follow the schema when constrained
            bool_field(fn["strict"], f"{p}.function.strict")
        tools.append(Tool(name, None if desc is None else str_field(desc, f"{p}.function.description"),
                          params))
    return tools


def parse_tool_choice(v: Any, tools: list[Tool]) -> tuple[str, str | None]:
    """Return (tool_choice, the forced function's name or None)."""
    if v is None or v == "auto":
        return ("auto" if tools else "none"), None
    if v == "none":
        return "none", None
    if v == "required":
        if not tools:
            raise invalid_request("tool_choice 'required' needs at least one tool in 'tools'.",
                                  "tool_choice")
        return "required", None
    if isinstance(v, dict):
        kind = v.get("type")
        if kind in ("allowed_tools", "custom"):
            raise unsupported_parameter("tool_choice", f"tool_choice of type '{kind}' is not supported.")
        if kind != "function":
            raise invalid_request("Invalid value for 'tool_choice.type': expected 'function'.",
                                  "tool_choice.type")
        fn = required_field(v, "function", "tool_choice.function")
        if not isinstance(fn, dict):
            raise invalid_type("tool_choice.function", "an object", fn)
        return named_tool_choice(fn, tools, "tool_choice.function.name")
    if isinstance(v, str):
        raise invalid_request(f"Invalid value for 'tool_choice': {value_text(v)}; expected 'none', "
                              "'auto' or 'required'.", "tool_choice")
    raise invalid_type("tool_choice", "a string or an object", v)


def named_tool_choice(v: dict, tools: list[Tool], param: str) -> tuple[str, str]:
    """A tool_choice that names one of the tools (its "name" field, at `param`):
    ("required", the name)."""
    name = str_field(required_field(v, "name", param), param)
    if name not in {t.name for t in tools}:
        raise invalid_request(f"Invalid value for '{param}': {value_text(name)} is not one of the tools.", param)
    return "required", name


_SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def parse_response_format(v: Any) -> ResponseFormat | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        raise invalid_type("response_format", "an object", v)
    kind = str_field(required_field(v, "type", "response_format.type"), "response_format.type")
    if kind not in ("text", "json_object", "json_schema"):
        raise invalid_request(f"Invalid value for 'response_format.type': {value_text(kind)}.",
                              "response_format.type")
    for key in v:
        if key not in ("type", "json_schema") or (key == "json_schema" and kind != "json_schema"):
            raise unknown_parameter(f"response_format.{key}")
    if kind != "json_schema":
        return ResponseFormat(kind)
    spec = required_field(v, "json_schema", "response_format.json_schema")
    if not isinstance(spec, dict):
        raise invalid_type("response_format.json_schema", "an object", spec)
    for key in spec:
        if key not in ("name", "description", "schema", "strict"):
            raise unknown_parameter(f"response_format.json_schema.{key}")
    name = str_field(required_field(spec, "name", "response_format.json_schema.name"),
                "response_format.json_schema.name")
    if not _SCHEMA_NAME.fullmatch(name):
        raise invalid_request("Invalid value for 'response_format.json_schema.name': names are "
                              "1-64 characters of a-z, A-Z, 0-9, '_' and '-'.",
                              "response_format.json_schema.name")
    if spec.get("description") is not None:
        str_field(spec["description"], "response_format.json_schema.description")
    if spec.get("strict") is not None:  # the output always follows the schema
        bool_field(spec["strict"], "response_format.json_schema.strict")
    schema = spec.get("schema")
    if schema is not None and not isinstance(schema, (dict, bool)):
        raise invalid_type("response_format.json_schema.schema", "an object", schema)
    return ResponseFormat(kind, {} if schema is None else schema)


# --- completions ------------------------------------------------------------------


def parse_prompt_one(v: Any, p: str) -> str | list[int]:
    if isinstance(v, str):
        if not v:
            raise invalid_request(f"Invalid value for '{p}': the prompt must not be empty.", p)
        return v
    if not isinstance(v, list):
        raise invalid_type(p, "a string or an array of token ids", v)
    if not v:
        raise invalid_request(f"Invalid value for '{p}': the prompt must not be empty.", p)
    return [int_field(t, f"{p}[{i}]", 0, INT32_MAX) for i, t in enumerate(v)]


# --- tokenize / detokenize (llama.cpp-style extensions) ------------------------------

def parse_tokenize_request(body: bytes) -> TokenizeRequest:
    """Validate a /tokenize body: {"content": str, "add_special"?: bool, "with_pieces"?: bool}."""
    obj = parse_json_object(body)
    check_keys(obj, frozenset({"content", "add_special", "with_pieces", "model"}), {})
    if obj.get("model") is not None:
        str_field(obj["model"], "model")
    content = str_field(required_field(obj, "content", "content"), "content")
    special, pieces = obj.get("add_special"), obj.get("with_pieces")
    return TokenizeRequest(
        content=content,
        add_special=False if special is None else bool_field(special, "add_special"),
        with_pieces=False if pieces is None else bool_field(pieces, "with_pieces"),
    )


def parse_detokenize_request(body: bytes) -> DetokenizeRequest:
    """Validate a /detokenize body: {"tokens": [int, ...]} (ids range-checked by check_vocab)."""
    obj = parse_json_object(body)
    check_keys(obj, frozenset({"tokens", "model"}), {})
    if obj.get("model") is not None:
        str_field(obj["model"], "model")
    tokens = required_field(obj, "tokens", "tokens")
    if not isinstance(tokens, list):
        raise invalid_type("tokens", "an array of integers", tokens)
    return DetokenizeRequest([int_field(t, f"tokens[{i}]", 0, INT32_MAX) for i, t in enumerate(tokens)])


def parse_apply_template_request(body: bytes) -> ApplyTemplateRequest:
    """Validate a /apply-template body: a chat completions body (model optional; the
    generation fields are checked and unused, as llama.cpp's server takes the same body)
    plus `add_generation_prompt` (default true). Without a generation prompt the
    conversation is shown as it stands, so a final assistant message is continued only
    with one."""
    obj = parse_json_object(body)
    check_keys(obj, CHAT_KEYS | {"add_generation_prompt"}, CHAT_UNSUPPORTED)
    if obj.get("model") is not None:
        str_field(obj["model"], "model")
    messages = parse_messages(required_field(obj, "messages", "messages"))
    tools = parse_tools(obj.get("tools"))
    tool_choice, _ = parse_tool_choice(obj.get("tool_choice"), tools)
    generation_prompt = obj.get("add_generation_prompt")
    generation_prompt = True if generation_prompt is None else bool_field(generation_prompt, "add_generation_prompt")
    continue_final = parse_continue_final(obj, messages, generation_prompt)
    if continue_final and not generation_prompt:
        raise invalid_request("'continue_final_message' continues the final message after the generation prompt; "
                              "it cannot be given with 'add_generation_prompt' false.", "continue_final_message")
    return ApplyTemplateRequest(messages, tools, tool_choice, generation_prompt, parse_template_kwargs(obj),
                                continue_final)


def parse_continue_final(obj: dict, messages: list[Message], default: bool = True) -> bool:
    """Whether the model continues the final message, an assistant's reply the client
    began (a prefill): as `continue_final_message` says (vLLM's flag), else, with
    `default`, whenever the conversation ends with an assistant message of content
    alone (as llama.cpp's server and Anthropic's API read one; one with tool calls or
    reasoning is a finished turn). 400 when the flag asks to continue a message that
    cannot be: none, another role's, one with tool calls (they wait for results) or
    one with reasoning (a reply is continued from its content)."""
    asked = obj.get("continue_final_message")
    last = messages[-1] if messages else None
    ends_in_reply = last is not None and last.role == "assistant"
    if asked is None:
        return default and ends_in_reply and not last.tool_calls and last.reasoning is None
    if not bool_field(asked, "continue_final_message"):
        return False
    if not ends_in_reply:
        raise invalid_request("'continue_final_message' needs a conversation that ends with an assistant message.",
                              "continue_final_message")
    param = f"messages[{len(messages) - 1}]"
    if last.tool_calls:
        raise invalid_request("A final assistant message with tool calls cannot be continued: its calls wait for "
                              "their results in tool messages.", param)
    if last.reasoning is not None:
        raise unsupported_parameter(param, "A final assistant message is continued from its content (a prefill), "
                                           "and its reasoning cannot be continued: send it without reasoning.")
    return True


def check_continuable(req: ChatRequest) -> None:
    """400 for a continued final message (ChatRequest.continue_final) with output
    constrained from the reply's start: a response format or a forced tool call."""
    if not req.continue_final:
        return
    if req.response_format is not None and req.response_format.type != "text":
        param = "response_format"
    elif req.tool_choice == "required" or req.tool_name is not None:
        param = "tool_choice"
    else:
        return
    raise unsupported_parameter(param, f"'{param}' constrains a reply from its start, and this one is continued "
                                       "from the final assistant message (a prefill); send one or the other.")


# --- vocabulary checks (need the engine's n_vocab) -------------------------------------

def check_token_ids(ids: Sequence[int], n_vocab: int, param: str) -> None:
    """Raise 400 naming `param[i]` for the first id outside [0, n_vocab)."""
    for i, t in enumerate(ids):
        if not 0 <= t < n_vocab:
            raise invalid_request(f"Invalid value for '{param}[{i}]': token id {t} is out of "
                                  f"range [0, {n_vocab}).", f"{param}[{i}]")


def check_vocab(request: ChatRequest | CompletionRequest | DetokenizeRequest, n_vocab: int) -> None:
    """Raise 400 if any token id in `request` (prompt ids, logit_bias keys, tokens) is
    outside [0, n_vocab); the parse_* functions only check that ids are non-negative."""
    if isinstance(request, DetokenizeRequest):
        check_token_ids(request.tokens, n_vocab, "tokens")
        return
    if isinstance(request, CompletionRequest) and isinstance(request.prompt, list):
        check_token_ids(request.prompt, n_vocab, "prompt")
    for t in request.sampling.logit_bias:
        if t >= n_vocab:
            raise invalid_request(f"Invalid value for 'logit_bias': token id {t} is out of range "
                                  f"[0, {n_vocab}).", "logit_bias")


# --- responses ----------------------------------------------------------------------


_SUMMARIES = ("auto", "concise", "detailed")


def parse_reasoning(v: Any) -> tuple[str | None, str | None]:
    """`reasoning` as (effort, summary); `generate_summary` is summary's older name."""
    if v is None:
        return None, None
    if not isinstance(v, dict):
        raise invalid_type("reasoning", "an object", v)
    for key in v:
        if key not in ("effort", "summary", "generate_summary"):
            raise unknown_parameter(f"reasoning.{key}")
    effort = v.get("effort")
    if effort is not None and str_field(effort, "reasoning.effort") not in _REASONING_EFFORTS:
        raise invalid_request(f"'reasoning.effort' must be one of {', '.join(_REASONING_EFFORTS)}.",
                              "reasoning.effort")
    summary = None
    for key in ("summary", "generate_summary"):
        if v.get(key) is not None:
            if str_field(v[key], f"reasoning.{key}") not in _SUMMARIES:
                raise invalid_request(f"'reasoning.{key}' must be one of {', '.join(_SUMMARIES)}.",
                                      f"reasoning.{key}")
            summary = v[key]
    return effort, summary


def parse_flat_tools(v: Any, kinds: Sequence[str | None], schema_key: str, why: str) -> list[Tool]:
    """Tools written flat ({type, name, description, <schema_key>}), as the Responses
    and Anthropic APIs write them, checked as chat tools; a type outside `kinds` is
    refused with `why`."""
    if v is None:
        return []
    if not isinstance(v, list):
        raise invalid_type("tools", "an array", v)
    nested = []
    for i, t in enumerate(v):
        if not isinstance(t, dict):
            raise invalid_type(f"tools[{i}]", "an object", t)
        kind = t.get("type")
        if kind not in kinds:
            raise unsupported_parameter(f"tools[{i}].type",
                                        f"Tools of type {value_text(kind)} are not supported; {why}.")
        fn = {"name": t.get("name"), "description": t.get("description"), "parameters": t.get(schema_key),
              "strict": t.get("strict")}
        nested.append({"type": "function", "function": {k: x for k, x in fn.items() if x is not None}})
    return parse_tools(nested)


# --- responses/compact ---------------------------------------------------------------
# POST /v1/responses/compact has the model summarise a conversation; the answer keeps
# the user's messages and replaces everything else with one `compaction` item carrying
# the summary. Sent back as input, that item becomes an assistant message with the
# summary. Its `encrypted_content` is not encrypted (the client holds the conversation
# anyway): the summary in base64 behind a prefix that marks it as llmd's.


# --- embeddings ---------------------------------------------------------------------


