"""The legacy completions surface (`POST /v1/completions`): the `text_completion`
object and stream a reply becomes (see llmd.api.chat_completions for the contract)."""
from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from llmd.api import logprobs
from llmd.api.chat_completions import FINGERPRINT, ChunkStream
from llmd.api.validation import (bool_field, CACHE_KEYS, check_keys, CompletionRequest, int_field, INT32_MAX,
                                 LLAMA_KEYS, MAX_TOP_LOGPROBS, parse_cache_salt, parse_common,
                                 parse_json_object, parse_max_tokens, parse_n, parse_n_probs,
                                 parse_prompt_cache_key, parse_prompt_one, parse_response_format,
                                 parse_return_progress, parse_sampling, parse_speculative, parse_stop, parse_stream,
                                 parse_timings_per_token, required_field, SAMPLING_KEYS, str_field)
from llmd.errors import unsupported_parameter
from llmd.prompt.tool_calls import ContentDelta, ToolCallDelta

if TYPE_CHECKING:
    from llmd.api.logprobs import TokenLogprob
    from llmd.api.reply import Choice, Reply


class CompletionFormat(ChunkStream):
    """A reply as a `text_completion` object or stream of them."""

    prompt_param = "prompt"
    remembers_replies = False
    shows_reasoning = False
    chunk_object = "text_completion"

    def __init__(self, include_usage: bool, echo: str = "", logprobs: bool = False,
                 timings_per_token: bool = False) -> None:
        self.id = "cmpl-" + uuid.uuid4().hex[:24]
        self.include_usage = include_usage
        self.echo = echo            # the prompt's text when `echo` asked for it
        self.logprobs = logprobs
        self.timings_per_token = timings_per_token
        self.offset = 0             # characters of the current choice's text sent so far
        self.echoed = False         # the current choice's echo is sent

    @staticmethod
    def _prompt_tokens(reply: Reply) -> list[TokenLogprob]:
        return logprobs.prompt_tokens(reply.first.prompt, reply.first.prompt_scores)

    def _logprobs(self, reply: Reply, text: str, echoing: bool = False) -> dict | None:
        """The logprobs of the tokens fed since the last call (of the prompt's tokens
        when echoing), placed at the current offset; moves the offset past text."""
        if not self.logprobs:
            self.offset += len(text)
            return None
        tokens = self._prompt_tokens(reply) if echoing else reply.take_logprobs()
        out = logprobs.legacy(tokens, reply.piece, self.offset)
        self.offset += len(text)
        return out

    def _choice(self, reply: Reply, c: Choice) -> dict:
        text, merged = c.output.content(), None
        if self.logprobs:
            parts = ([logprobs.legacy(self._prompt_tokens(reply), reply.piece, 0)] if self.echo else []) + \
                [logprobs.legacy(c.logprobs, reply.piece, len(self.echo))]
            merged = {key: [v for part in parts for v in part[key]] for key in parts[0]}
        return {"index": c.index, "text": self.echo + text, "logprobs": merged, "finish_reason": c.finish_reason}

    def body(self, reply: Reply) -> dict:
        return {"id": self.id, "object": "text_completion", "created": reply.created, "model": reply.model,
                "system_fingerprint": FINGERPRINT, "choices": [self._choice(reply, c) for c in reply.choices()],
                "usage": reply.usage(), **reply.extensions()}

    def _text(self, reply: Reply, text: str, finish: str | None = None, echoing: bool = False) -> bytes:
        lp = self._logprobs(reply, text, echoing)
        return self._chunk(reply, {"index": reply.index, "text": text,
                                   "logprobs": lp if lp and lp["tokens"] else None, "finish_reason": finish})

    def start(self, reply: Reply) -> list[bytes]:
        self.offset, self.echoed = 0, False
        return []

    def deltas(self, reply: Reply, deltas: list[ContentDelta | ToolCallDelta]) -> list[bytes]:
        # The echoed prompt goes first, once the prompt is processed (its logprobs are
        # known then): with the first token's deltas, or at the end if none came.
        out = [self._text(reply, self.echo, echoing=True)] if self.echo and not self.echoed else []
        self.echoed = True
        return out + [self._text(reply, d.text) for d in deltas if isinstance(d, ContentDelta)]

    def _finish(self, reply: Reply) -> bytes:
        return self._text(reply, "", reply.finish_reason)

    def _empty_choice(self, reply: Reply) -> dict:
        return {"index": reply.index, "text": "", "logprobs": None, "finish_reason": None}


# --- the request ------------------------------------------------------------

_COMPLETION_KEYS = SAMPLING_KEYS | frozenset({
    "model", "prompt", "max_tokens", "stream", "stream_options", "stop", "n", "best_of",
    "echo", "suffix", "logprobs", "user", "session_id", "response_format", "prompt_cache_key",
    "prompt_cache_retention"}) | LLAMA_KEYS | CACHE_KEYS


def parse_completion_request(body: bytes) -> CompletionRequest:
    """Validate a /v1/completions body; raise ApiError (400) naming the bad param."""
    obj = parse_json_object(body)
    check_keys(obj, _COMPLETION_KEYS, {})
    model, session_id = parse_common(obj)
    prompt = _parse_prompt(required_field(obj, "prompt", "prompt"))
    stream, include_usage = parse_stream(obj)
    n = parse_n(obj.get("n"))
    if obj.get("best_of") is not None and int_field(obj["best_of"], "best_of", 1, INT32_MAX) != 1:
        raise unsupported_parameter("best_of", "Only best_of=1 is supported.")
    echo = obj.get("echo") is not None and bool_field(obj["echo"], "echo")
    suffix = "" if obj.get("suffix") is None else str_field(obj["suffix"], "suffix")
    if suffix and echo:
        raise unsupported_parameter("suffix", "'suffix' cannot be used with 'echo'.")
    logprobs = None if obj.get("logprobs") is None else int_field(obj["logprobs"], "logprobs", 0, MAX_TOP_LOGPROBS)
    # Echo with max_tokens 0 scores the prompt alone (how evaluation harnesses ask).
    max_tokens = parse_max_tokens(obj.get("max_tokens"), "max_tokens", 0 if echo else 1)
    return CompletionRequest(
        model=model,
        prompt=prompt,
        sampling=parse_sampling(obj),
        max_tokens=16 if max_tokens is None else max_tokens,
        stop=parse_stop(obj.get("stop")),
        stream=stream,
        include_usage=include_usage,
        session_id=session_id,
        suffix=suffix,
        response_format=parse_response_format(obj.get("response_format")),
        logprobs=logprobs if logprobs is not None else parse_n_probs(obj),
        echo=echo,
        timings_per_token=parse_timings_per_token(obj),
        return_progress=parse_return_progress(obj),
        prompt_cache_key=parse_prompt_cache_key(obj),
        n=n,
        cache_salt=parse_cache_salt(obj),
        speculative=parse_speculative(obj),
    )


def _parse_prompt(v: Any) -> str | list[int]:
    # Accepted: "text", [ids...], ["text"], [[ids...]]. Several prompts are a batch.
    if isinstance(v, list) and v and all(isinstance(x, (str, list)) for x in v):
        if len(v) > 1:
            raise unsupported_parameter("prompt", "Batched prompts are not supported; "
                                        "send one prompt per request.")
        return parse_prompt_one(v[0], "prompt[0]")
    return parse_prompt_one(v, "prompt")
