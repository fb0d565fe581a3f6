"""llama.cpp's own completion surface: `POST /completion` (a prompt) and `POST /infill`
(code infilling, what editor plugins such as llama.vscode and llama.vim ask a llama.cpp
server for: the code before and after the cursor, and context from other files, in;
the code between them out). Both answer llama.cpp's completion object (`content`,
`stop_type`, `timings`, ...) rather than OpenAI's, with llama.cpp's field names and
sampling defaults.

The infill prompt is llmd.prompt.infill's layout. A request names the sampling steps
it wants (`samplers`) from those llmd has, in its order; `n_cmpl` choices come back as
an array; `response_fields` picks fields by path ("timings/prompt_n"), each under its
path as a key, as llama.cpp does.
"""
from __future__ import annotations

import dataclasses
import json
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmd.api.validation import (CompletionRequest, INT32_MAX, SAMPLING_KEYS, Sampling, check_keys,
                                 int_field, invalid_type, MAX_CHOICES, parse_cache_salt, parse_common,
                                 parse_json_object, parse_prompt_one, parse_sampling, parse_speculative,
                                 parse_stop, parse_stream, required_field, str_field)
from llmd.errors import ApiError, error_body, invalid_request, unknown_parameter, unsupported_parameter
from llmd.http import sse
from llmd.prompt.infill import ExtraFile

if TYPE_CHECKING:
    from llmd.api.reply import Choice, Delta, Reply

# The steps llmd's sampler can take, in the order it takes them; a request's
# `samplers` names some of them in this order. A step it leaves out is off
# (temperature: 1). llama.cpp's aliases are taken for their names, and its letters
# for them in a string of letters.
SAMPLERS = ("temperature", "top_k", "top_p", "min_p", "infill")
ALIASES = {"temp": "temperature", "top-k": "top_k", "topk": "top_k", "top-p": "top_p", "topp": "top_p",
           "nucleus": "top_p", "min-p": "min_p", "minp": "min_p"}
LETTERS = {"t": "temperature", "k": "top_k", "p": "top_p", "m": "min_p", "i": "infill"}
OFF = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
LLAMA_DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}  # llama.cpp's server's
MAX_EXTRA = 1024  # input_extra files
RANDOM_SEED = 2**32 - 1  # llama.cpp's LLAMA_DEFAULT_SEED: a random seed


@dataclass(frozen=True)
class Infill:
    """What /infill adds to a completion: its prompt, `prefix`, is the code before the gap."""
    suffix: str                    # input_suffix: the code after it
    middle: str                    # `prompt`: typed after the prefix, continued
    extra: list[ExtraFile]


@dataclass(frozen=True)
class LlamaRequest:
    completion: CompletionRequest  # the generation; n is n_cmpl
    samplers: tuple[str, ...]
    id_slot: int                   # >= 0: the session "slot-<id>", unless the request names one
    response_fields: list[str] | None
    n_indent: int
    t_max_predict_ms: int
    infill: Infill | None = None   # /infill's; None on /completion


_LLAMA_KEYS = SAMPLING_KEYS | frozenset({
    "model", "prompt", "n_predict", "n_cmpl", "stream", "stop", "samplers", "n_indent", "t_max_prompt_ms",
    "t_max_predict_ms", "response_fields", "cache_prompt", "id_slot", "session_id", "cache_salt", "speculative",
    "speculative.n_max", "speculative.n_min"})
_INFILL_KEYS = _LLAMA_KEYS | frozenset({"input_prefix", "input_suffix", "input_extra"})
_UNSUPPORTED = {"lora": "LoRA adapters are not supported.",
                "n_probs": "'n_probs' is not supported here; use /v1/completions for logprobs."}


def parse_completion_request(body: bytes) -> LlamaRequest:
    """Validate a /completion body; raise ApiError (400) naming the bad param."""
    obj = _object(body, _LLAMA_KEYS)
    return _request(obj, parse_prompt_one(required_field(obj, "prompt", "prompt"), "prompt"))


def parse_infill_request(body: bytes) -> LlamaRequest:
    """Validate an /infill body; raise ApiError (400) naming the bad param."""
    obj = _object(body, _INFILL_KEYS)
    infill = Infill(suffix=str_field(required_field(obj, "input_suffix", "input_suffix"), "input_suffix"),
                    middle="" if obj.get("prompt") is None else str_field(obj["prompt"], "prompt"),
                    extra=_parse_extra(obj.get("input_extra")))
    return _request(obj, str_field(required_field(obj, "input_prefix", "input_prefix"), "input_prefix"), infill)


def _object(body: bytes, known: frozenset[str]) -> dict:
    obj = parse_json_object(body)
    if obj.get("lora") == []:  # no adapters asked for
        obj.pop("lora")
    check_keys(obj, known, _UNSUPPORTED)
    return obj


def _request(obj: dict, prompt: str | list[int], infill: Infill | None = None) -> LlamaRequest:
    """The fields /completion and /infill share."""
    slot = -1 if obj.get("id_slot") is None else int_field(obj["id_slot"], "id_slot", -1, INT32_MAX)
    model, session_id = parse_common({**obj, "model": "" if obj.get("model") is None else obj["model"],
                                      "id_slot": None})
    if obj.get("t_max_prompt_ms") is not None:  # llama.cpp's server has no use for it either
        int_field(obj["t_max_prompt_ms"], "t_max_prompt_ms", -1, INT32_MAX)
    n_predict = -1 if obj.get("n_predict") is None else int_field(obj["n_predict"], "n_predict", -1, INT32_MAX)
    stream, _ = parse_stream({"stream": obj.get("stream")})
    samplers = _parse_samplers(obj.get("samplers"))
    return LlamaRequest(
        completion=CompletionRequest(
            model=model,
            prompt=prompt,
            sampling=_sampling(obj, samplers),
            max_tokens=None if n_predict < 0 else n_predict,
            stop=parse_stop(obj.get("stop")),
            stream=stream,
            include_usage=False,
            session_id=session_id,
            n=1 if obj.get("n_cmpl") is None else int_field(obj["n_cmpl"], "n_cmpl", 1, MAX_CHOICES),
            cache_salt=parse_cache_salt(obj),
            speculative=parse_speculative(obj)),
        samplers=samplers,
        id_slot=slot,
        response_fields=_parse_fields(obj.get("response_fields")),
        n_indent=0 if obj.get("n_indent") is None else int_field(obj["n_indent"], "n_indent", 0, INT32_MAX),
        t_max_predict_ms=0 if obj.get("t_max_predict_ms") is None else
        int_field(obj["t_max_predict_ms"], "t_max_predict_ms", 0, INT32_MAX),
        infill=infill,
    )


def _parse_samplers(v: Any) -> tuple[str, ...]:
    if v is None:
        return SAMPLERS[:-1]
    if isinstance(v, str):  # one letter a step, as llama.cpp reads a string
        for i, letter in enumerate(v):
            if letter not in LETTERS:
                raise unsupported_parameter("samplers", f"llmd has no sampler of letter {json.dumps(letter)} "
                                            f"(position {i}); it has {', '.join(LETTERS)}.")
        names = [LETTERS[letter] for letter in v]
    elif isinstance(v, list):
        names = [ALIASES.get(name, name) for name in (str_field(x, f"samplers[{i}]") for i, x in enumerate(v))]
    else:
        raise invalid_type("samplers", "an array of strings or a string of letters", v)
    for i, name in enumerate(names):
        if name not in SAMPLERS:
            raise unsupported_parameter(f"samplers[{i}]", f"llmd has no sampler {json.dumps(name)}; it has "
                                        f"{', '.join(SAMPLERS)}, applied in that order.")
    if names != sorted(set(names), key=SAMPLERS.index):
        raise unsupported_parameter("samplers", f"llmd applies its samplers once each, in this order: "
                                    f"{', '.join(SAMPLERS)}; name them in it.")
    return tuple(names)


def _sampling(obj: dict, samplers: tuple[str, ...]) -> Sampling:
    """The request's sampling with llama.cpp's defaults, the steps it left out off;
    llama.cpp's seed -1 (and 2^32 - 1, its default) asks for a random one."""
    given = parse_sampling(obj)
    settings = {key: getattr(given, key) if obj.get(key) is not None else default
                for key, default in LLAMA_DEFAULTS.items()}
    settings.update({key: off for key, off in OFF.items() if key not in samplers})
    seed = None if given.seed in (-1, RANDOM_SEED) else given.seed
    return dataclasses.replace(given, infill="infill" in samplers, seed=seed, **settings)


def _parse_extra(v: Any) -> list[ExtraFile]:
    if v is None:
        return []
    if not isinstance(v, list):
        raise invalid_type("input_extra", 'an array of {"filename": string, "text": string}', v)
    if len(v) > MAX_EXTRA:
        raise invalid_request(f"Invalid value for 'input_extra': at most {MAX_EXTRA} files, got {len(v)}.",
                              "input_extra")
    files = []
    for i, chunk in enumerate(v):
        p = f"input_extra[{i}]"
        if not isinstance(chunk, dict):
            raise invalid_type(p, "an object", chunk)
        for key in chunk:
            if key not in ("text", "filename", "time"):
                raise unknown_parameter(f"{p}.{key}")
        stamp = chunk.get("time")  # when the client took it, for its own bookkeeping
        if stamp is not None and (isinstance(stamp, bool) or not isinstance(stamp, (int, float))):
            raise invalid_type(f"{p}.time", "a number", stamp)
        text = str_field(required_field(chunk, "text", f"{p}.text"), f"{p}.text")
        name = "tmp" if chunk.get("filename") is None else str_field(chunk["filename"], f"{p}.filename")
        files.append(ExtraFile(text, name))
    return files


def _parse_fields(v: Any) -> list[str] | None:
    if v is None:
        return None
    if not isinstance(v, list):
        raise invalid_type("response_fields", "an array of strings", v)
    return [str_field(x, f"response_fields[{i}]") for i, x in enumerate(v)]


def picked(obj: dict, paths: list[str]) -> dict:
    """The fields at `paths` ("timings/prompt_n"), each under its path; paths that
    lead nowhere are left out."""
    out = {}
    for path in paths:
        value: Any = obj
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            out[path] = value
    return out


class LlamaFormat:
    """A reply as llama.cpp's completion object (an array of them for several
    choices), or as its stream: `data:` events with each piece of content, the last
    the whole object with `stop: true`; no [DONE]."""

    prompt_param = "prompt"  # (an infill prompt's other parts are fitted to the context)
    remembers_replies = False
    shows_reasoning = False
    stream_type = sse.MEDIA_TYPE
    ping = sse.PING

    def __init__(self, req: LlamaRequest, n_ctx: int, prompt_text: str, truncated: bool) -> None:
        self.id = ("infill-" if req.infill else "cmpl-") + uuid.uuid4().hex[:24]
        self.req = req
        self.n_ctx = n_ctx
        self.prompt_text = prompt_text  # the prompt as text, markers by name (llama.cpp's `prompt`)
        self.truncated = truncated

    def _settings(self, choice: Choice) -> dict:
        c = self.req.completion
        s = c.sampling
        return {"n_ctx": self.n_ctx, "n_predict": -1 if c.max_tokens is None else c.max_tokens,
                "seed": choice.g.sampling.seed,
                "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p,
                "samplers": list(self.req.samplers), "stop": c.stop, "stream": c.stream,
                "n_indent": self.req.n_indent, "t_max_predict_ms": self.req.t_max_predict_ms}

    def _object(self, reply: Reply, c: Choice, streamed: bool = False) -> dict:
        """The choice's whole object; once streamed, its content is empty (it went in pieces)."""
        text = c.output.content()
        stop_word = c.output.stops.matched
        limited = c.output.limits is not None and c.output.limits.hit
        stop_type = ("word" if stop_word is not None else "limit" if limited or c.finish_reason == "length"
                     else "eos" if c.finish_reason == "stop" else "none")
        obj = {"index": c.index, "content": "" if streamed else text, "tokens": [], "id_slot": self.req.id_slot,
               "stop": True, "model": reply.model, "tokens_predicted": c.completion_tokens,
               "tokens_evaluated": len(c.g.prompt),
               "generation_settings": self._settings(c), "prompt": self.prompt_text, "has_new_line": "\n" in text,
               "truncated": self.truncated, "stop_type": stop_type, "stopping_word": stop_word or "",
               # the last token drawn is not in the cache yet
               "tokens_cached": len(c.g.prompt) + max(c.g.generated - 1, 0), "timings": c.g.timings()}
        return picked(obj, self.req.response_fields) if self.req.response_fields else obj  # [] as llama.cpp

    def body(self, reply: Reply) -> dict | list[dict]:
        objects = [self._object(reply, c) for c in reply.choices()]
        return objects[0] if len(objects) == 1 else objects

    def _event(self, obj: dict) -> bytes:
        return sse.event(json.dumps(obj, ensure_ascii=False))

    def start(self, reply: Reply) -> list[bytes]:
        return []

    def deltas(self, reply: Reply, deltas: list[Delta]) -> list[bytes]:
        return [self._event({"index": reply.index, "content": d.text, "tokens": [], "stop": False,
                             "id_slot": self.req.id_slot, "tokens_predicted": reply.completion_tokens,
                             "tokens_evaluated": len(reply.g.prompt)}) for d in deltas]

    def end(self, reply: Reply) -> list[bytes]:
        return [self._event(self._object(reply, reply.choices()[-1], streamed=True))]

    def error(self, reply: Reply, err: ApiError) -> list[bytes]:
        return [self._event(error_body(err))]

    def progress(self, reply: Reply, progress: dict) -> list[bytes]:
        return []
