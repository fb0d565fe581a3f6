"""The OpenAI-compatible routes: validated request → prompt ids → runtime →
response (JSON or SSE). Errors raised anywhere before the first response byte
become one JSON error response; errors after SSE headers become one error event
followed by [DONE].
"""
from __future__ import annotations

import asyncio
import importlib.resources
import json
import logging
import random
import re
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import AsyncIterator, Callable, Mapping, TypeVar

from llmd import chat, constrain, errors, metrics, openai, sse
from llmd.engine import Engine, Sampling, Token
from llmd.errors import ApiError, as_api_error, error_body
from llmd.runtime import Generation, Runtime
from llmd.server import HttpRequest, Response, StreamResponse
from llmd.sessions import SessionTable, reply_fingerprint, session_id_of
from llmd.stops import StopMatcher
from llmd.text import Utf8Stream
from llmd.tools import ContentDelta, ToolCallDelta, ToolCallStream, merge_tool_calls

PING_SECONDS = 3.0  # `: ping` comments while the prompt is processed
PARSE_INLINE_BYTES = 64 * 1024  # bodies parsed on the event loop; bigger ones on a thread
DETOKENIZE_CHUNK = 4096  # ids turned into text per executor call, so other streams step in between
FINGERPRINT = "llmd-0.1.0"
# The status page's scripts and styles are inline; nothing may come from elsewhere.
PAGE_HEADERS = [("Cache-Control", "no-cache"), ("X-Content-Type-Options", "nosniff"),
                ("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; "
                                            "style-src 'unsafe-inline'; img-src data:")]

log = logging.getLogger("llmd.api")
T = TypeVar("T")


def json_response(obj: object, status: int = 200, headers: list[tuple[str, str]] | None = None,
                  log: dict | None = None) -> Response:
    return Response(status, json.dumps(obj, ensure_ascii=False).encode(), headers or [],
                    log=log if log is not None else {})


def error_response(err: ApiError) -> Response:
    return json_response(error_body(err), err.status, list(err.headers.items()))


async def parse(parser: Callable[[bytes], T], body: bytes) -> T:
    """parser(body); a big body is parsed on a worker thread, so that validating a
    million-element array does not hold up every stream on the event loop."""
    if len(body) <= PARSE_INLINE_BYTES:
        return parser(body)
    return await asyncio.to_thread(parser, body)


def route_label(pattern: re.Pattern) -> str:
    """A route as operators read it, e.g. "/v1/models/{model}"; bounded, unlike raw paths."""
    return re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", pattern.pattern.replace("(?:/v1)?", "/v1"))


@dataclass
class Options:
    model_ids: list[str]          # served id first, then aliases
    scratch_reuse: bool = False
    max_queue: int = 0            # generations waiting to start; more → 503 (0: no limit)
    max_tokens_limit: int = 0     # cap on any request's max_tokens (0: the context)
    log_prompts: bool = False     # log prompt and completion text (never logged otherwise)


@dataclass
class PromptIds:
    """A prompt as token ids, part by part. `replies` maps the index of a part that
    holds an earlier assistant reply to that reply's fingerprint, so the ids the
    session generated for it can stand in for the re-tokenized text."""

    parts: list[list[int]]
    bos: int | None = None  # prepended unless the prompt already starts with it
    replies: dict[int, str] = field(default_factory=dict)

    def ids(self, generated: Mapping[str, list[int]] | None = None) -> list[int]:
        ids: list[int] = []
        for i, part in enumerate(self.parts):
            fingerprint = self.replies.get(i)
            ids += generated[fingerprint] if generated and fingerprint in generated else part
        if self.bos is not None and (not ids or ids[0] != self.bos):
            ids.insert(0, self.bos)
        return ids


class Output:
    """Turns a generation's token pieces into response text: UTF-8 assembly,
    stop-string hold-back, then (for chat with tools) tool-call extraction.
    Keeps what it produced: `text` pieces and the tool `calls` pieces."""

    def __init__(self, stops: list[str], tools: list[dict] | None):
        self.utf8 = Utf8Stream()
        self.stops = StopMatcher(stops)
        self.tools = ToolCallStream(tools) if tools else None
        self.text: list[str] = []
        self.calls: list[ToolCallDelta] = []

    def content(self) -> str:
        return "".join(self.text)

    def tool_calls(self) -> list[dict]:
        """The OpenAI `tool_calls` entries the pieces so far add up to."""
        return merge_tool_calls(self.calls)

    def feed(self, piece: bytes) -> tuple[list[ContentDelta | ToolCallDelta], bool]:
        text, hit = self.stops.feed(self.utf8.feed(piece))
        return self._route(text, final=False), hit

    def finish(self) -> list[ContentDelta | ToolCallDelta]:
        text, hit = self.stops.feed(self.utf8.flush())  # ("", True) once a stop was hit
        if not hit:
            text += self.stops.flush()
        return self._route(text, final=True)

    def _route(self, text: str, final: bool) -> list[ContentDelta | ToolCallDelta]:
        if self.tools is None:
            out = [ContentDelta(text)] if text else []
        else:
            out = self.tools.feed(text) if text else []
            if final:
                out += self.tools.finish()
        for d in out:
            (self.text.append(d.text) if isinstance(d, ContentDelta) else self.calls.append(d))
        return out


class Api:
    """Routes requests to handlers. Built once the model is loaded."""

    def __init__(self, engine: Engine, runtime: Runtime, table: SessionTable,
                 template: chat.ChatTemplate | None, options: Options):
        self.engine = engine
        self.info = engine.info
        self.runtime = runtime
        self.table = table
        self.template = template
        self.options = options
        self.metrics = runtime.metrics
        self.metrics.watch(runtime, table, self.info.kv_bytes_per_token)
        self.page_html = importlib.resources.files("llmd").joinpath("static/index.html").read_bytes()
        self.created = int(time.time())
        self.waiting = 0  # generation requests waiting for their session's slot
        # No token covers more text than the longest piece, so text longer than the
        # context times that cannot fit: it is refused before the executor spends
        # seconds tokenizing it while every stream waits.
        longest = max((len(self.engine.piece(i, special=True)) for i in range(self.info.n_vocab)), default=1)
        self.max_text_bytes = self.info.n_ctx * max(longest, 1)
        self.routes: list[tuple[re.Pattern, dict[str, object]]] = [
            (re.compile(r"/"), {"GET": self.page}),
            (re.compile(r"/metrics"), {"GET": self.metrics_text}),
            (re.compile(r"/health"), {"GET": self.health}),
            (re.compile(r"(?:/v1)?/models"), {"GET": self.models}),
            (re.compile(r"(?:/v1)?/models/(?P<model>[^/]+)"), {"GET": self.model}),
            (re.compile(r"(?:/v1)?/chat/completions"), {"POST": self.chat_completions}),
            (re.compile(r"(?:/v1)?/completions"), {"POST": self.completions}),
            (re.compile(r"/tokenize"), {"POST": self.tokenize}),
            (re.compile(r"/detokenize"), {"POST": self.detokenize}),
            (re.compile(r"/v1/sessions"), {"GET": self.list_sessions}),
            (re.compile(r"/v1/sessions/(?P<sid>[^/]+)"), {"GET": self.get_session, "DELETE": self.delete_session}),
            (re.compile(r"/v1/sessions/(?P<sid>[^/]+)/reset"), {"POST": self.reset_session}),
        ]
        self.route_labels = {pattern: route_label(pattern) for pattern, _ in self.routes}

    async def __call__(self, request: HttpRequest) -> Response | StreamResponse:
        route, response = "unmatched", None
        try:
            for pattern, methods in self.routes:
                if (m := pattern.fullmatch(request.path)) is None:
                    continue
                route = self.route_labels[pattern]
                method = "GET" if request.method == "HEAD" else request.method
                handler = methods.get(method)
                if handler is None:
                    raise errors.method_not_allowed(sorted(methods) + (["HEAD"] if "GET" in methods else []))
                response = await handler(request, **m.groupdict())
                return response
            raise errors.not_found(f"no route for {request.path}")
        except ApiError as err:
            response = error_response(err)
            return response
        finally:  # a handler's unexpected exception becomes a 500 in the HTTP layer
            self.metrics.requests.inc(route=route, status=str(response.status if response else 500))

    # ---- status page and metrics ----------------------------------------------

    async def page(self, request: HttpRequest) -> Response:
        return Response(200, self.page_html, list(PAGE_HEADERS), content_type="text/html; charset=utf-8")

    async def metrics_text(self, request: HttpRequest) -> Response:
        return Response(200, self.metrics.render().encode(), content_type=metrics.CONTENT_TYPE)

    # ---- models and health -------------------------------------------------

    async def health(self, request: HttpRequest) -> Response:
        return json_response({"status": "ok"})

    def _model_object(self, model_id: str) -> dict:
        return {"id": model_id, "object": "model", "created": self.created, "owned_by": "llmd",
                "meta": {"n_ctx": self.info.n_ctx, "n_ctx_train": self.info.n_ctx_train,
                         "n_vocab": self.info.n_vocab, "max_sessions": self.table.capacity}}

    async def models(self, request: HttpRequest) -> Response:
        return json_response({"object": "list", "data": [self._model_object(m) for m in self.options.model_ids]})

    async def model(self, request: HttpRequest, model: str) -> Response:
        self._check_model(model)
        return json_response(self._model_object(model))

    def _check_model(self, model: str) -> None:
        if model not in self.options.model_ids:
            raise errors.ApiError(404, f"The model '{model}' does not exist; this server serves "
                                       f"{', '.join(self.options.model_ids)}.",
                                  "not_found_error", "model", "model_not_found")

    # ---- tokenizer -----------------------------------------------------------

    def _check_text(self, text: str, param: str) -> None:
        """Refuse text too long to fit the context whatever its tokens (see __init__)."""
        if len(text) * 4 > self.max_text_bytes:  # else it fits: no need to encode it
            n_bytes = len(text.encode("utf-8", "surrogatepass"))
            if n_bytes > self.max_text_bytes:
                raise errors.text_too_long(n_bytes, self.max_text_bytes, self.info.n_ctx, param)

    async def tokenize(self, request: HttpRequest) -> Response:
        req = await parse(openai.parse_tokenize_request, request.body)
        self._check_text(req.content, "content")
        ids = await self.runtime.call(self.engine.tokenize, req.content, True)
        if req.add_special and self.info.add_bos:
            ids = [self.info.bos_id] + ids
        if not req.with_pieces:
            return json_response({"tokens": ids})
        pieces = []
        for i in range(0, len(ids), DETOKENIZE_CHUNK):
            pieces += await self.runtime.call(self._pieces, ids[i:i + DETOKENIZE_CHUNK])
        return json_response({"tokens": pieces})

    def _pieces(self, ids: list[int]) -> list[dict]:
        pieces = []
        for i in ids:
            raw = self.engine.piece(i, special=True)
            try:
                pieces.append({"id": i, "piece": raw.decode("utf-8")})
            except UnicodeDecodeError:
                pieces.append({"id": i, "piece": list(raw)})
        return pieces

    async def detokenize(self, request: HttpRequest) -> Response:
        req = await parse(self._parse_detokenize, request.body)
        data = b"".join([await self.runtime.call(self.engine.detokenize, req.tokens[i:i + DETOKENIZE_CHUNK], True)
                         for i in range(0, len(req.tokens), DETOKENIZE_CHUNK)])
        return json_response({"content": data.decode("utf-8", "replace")})

    def _parse_detokenize(self, body: bytes) -> openai.DetokenizeRequest:
        req = openai.parse_detokenize_request(body)
        openai.check_vocab(req, self.info.n_vocab)  # a pass over every id: with the parse
        return req

    # ---- sessions ----------------------------------------------------------

    async def list_sessions(self, request: HttpRequest) -> Response:
        data = [self.table.describe(s) for s in self.table.named.values()]
        # The engine's own count next to the table's: they differ only while frees
        # or opens are queued on the executor, so lasting disagreement is a leak.
        return json_response({"object": "list", "data": data, "capacity": self.table.capacity - 1,
                              "engine_sessions": self.engine.live_sessions(),
                              "table_sessions": self.table.engine_sessions})

    def _named(self, sid: str) -> str:
        return session_id_of(sid, {})

    async def get_session(self, request: HttpRequest, sid: str) -> Response:
        slot = self.table.named.get(self._named(sid))
        if slot is None:
            raise errors.session_not_found(sid)
        return json_response(self.table.describe(slot))

    async def delete_session(self, request: HttpRequest, sid: str) -> Response:
        deleted = self.table.delete(self._named(sid))
        return json_response({"id": sid, "object": "session.deleted", "deleted": deleted})

    async def reset_session(self, request: HttpRequest, sid: str) -> Response:
        reset = self.table.reset(self._named(sid))
        return json_response({"id": sid, "object": "session.reset", "reset": reset})

    # ---- generation ------------------------------------------------------------

    async def chat_completions(self, request: HttpRequest) -> Response | StreamResponse:
        req = await parse(openai.parse_chat_request, request.body)
        self._check_model(req.model)
        openai.check_vocab(req, self.info.n_vocab)
        sid = session_id_of(req.session_id, request.headers)
        if self.template is None:
            raise errors.invalid_request("this model has no chat template; use /v1/completions "
                                         "or start llmd with --chat-template", "messages")
        tools = [asdict(t) for t in req.tools] if req.tool_choice != "none" else []
        try:
            rendered = chat.render_chat(self.template, [asdict(m) for m in req.messages], tools or None)
        except chat.ChatTemplateError as exc:
            raise errors.unsupported_parameter("tools" if tools else "messages", str(exc))
        self._check_text(rendered.text, "messages")
        grammar = await asyncio.to_thread(constrain.chat_grammar, req)  # compiling may take a while
        prompt = await self.runtime.call(self._tokenize_parts, rendered.parts)
        for index, part in rendered.replies.items():
            m = req.messages[index]
            prompt.replies[part] = reply_fingerprint(m.content, [(c.name, c.arguments) for c in m.tool_calls])
        return await self._generate(request, "chat", prompt, rendered.text, req, sid, tools or None, grammar)

    async def completions(self, request: HttpRequest) -> Response | StreamResponse:
        req = await parse(openai.parse_completion_request, request.body)
        self._check_model(req.model)
        openai.check_vocab(req, self.info.n_vocab)
        sid = session_id_of(req.session_id, request.headers)
        grammar = await asyncio.to_thread(constrain.completion_grammar, req)
        if isinstance(req.prompt, str):
            self._check_text(req.prompt, "prompt")
            prompt = await self.runtime.call(self._tokenize_parts, [(req.prompt, True)])
        else:
            prompt = PromptIds([list(req.prompt)])
        return await self._generate(request, "text", prompt, req.prompt, req, sid, None, grammar)

    def _tokenize_parts(self, parts: list[tuple[str, bool]]) -> PromptIds:
        """Markers as control tokens, content as plain text; BOS first if the model wants it."""
        return PromptIds([self.engine.tokenize(text, special=is_marker) for text, is_marker in parts],
                         self.info.bos_id if self.info.add_bos else None)

    def _sampling(self, s: openai.Sampling) -> Sampling:
        return Sampling(
            temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p,
            seed=(s.seed if s.seed is not None else random.getrandbits(64)) & 0xFFFFFFFFFFFFFFFF,
            repeat_penalty=s.repetition_penalty, presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty, logit_bias=dict(s.logit_bias))

    def _admit(self) -> None:
        """Refuse with 503 while max_queue generations wait to start (for their
        session's slot, or for their first step)."""
        queued = self.waiting + self.runtime.queued
        if self.options.max_queue and queued >= self.options.max_queue:
            raise errors.unavailable(f"{queued} generations are waiting to start, this server's "
                                     "limit; retry later", retry_after=1)

    async def _generate(self, request: HttpRequest, kind: str, prompt: PromptIds, prompt_text: str | list[int],
                        req: openai.ChatRequest | openai.CompletionRequest, sid: str | None,
                        tools: list[dict] | None, grammar: str | None) -> Response | StreamResponse:
        n_ctx = self.info.n_ctx
        ids = prompt.ids()
        if not ids:
            raise errors.invalid_request("the prompt is empty", "prompt")
        if len(ids) >= n_ctx:
            raise errors.context_length_exceeded(len(ids), n_ctx, "messages" if kind == "chat" else "prompt")
        self._admit()
        self.waiting += 1
        try:
            lease = await self.table.acquire(sid)  # 400 / 429 here, before any response byte
        finally:
            self.waiting -= 1
        try:
            slot = lease.slot
            reuse = not slot.temporary and (sid is not None or self.options.scratch_reuse)
            if reuse and prompt.replies and len(spliced := prompt.ids(slot.replies)) < n_ctx:
                ids = spliced
            # Like the room left in the context, the operator's cap clamps max_tokens;
            # finish_reason "length" tells the client it was reached.
            cap = min(self.options.max_tokens_limit or n_ctx, n_ctx - len(ids))
            max_tokens = min(req.max_tokens or cap, cap)
            g = Generation(slot, ids, self._sampling(req.sampling), max_tokens, reuse=reuse, grammar=grammar,
                           lease=lease)
            self.runtime.submit(g)  # from here the generation releases the lease when it ends
        except BaseException:
            lease.release()
            raise
        reply = Reply(self, kind, g, Output(req.stop, tools), req.include_usage, sid, prompt_text)
        if req.stream:
            response = StreamResponse(200, ReplyStream(reply, request))
            reply.log = response.log
            return response
        try:
            return json_response(await reply.collect(request), log=reply.log)
        finally:
            reply.close()


class Reply:
    """One generation's response, streamed as SSE chunks or collected into one object."""

    def __init__(self, api: Api, kind: str, g: Generation, output: Output, include_usage: bool,
                 session_id: str | None, prompt: str | list[int]):
        self.api, self.kind, self.g, self.output = api, kind, g, output
        self.include_usage = include_usage
        self.session_id = session_id
        self.prompt = prompt  # as the client gave it (text or ids), for --log-prompts
        self.log: dict = {}  # access-log fields, shared with the HTTP response
        prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
        self.id = prefix + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.model = api.options.model_ids[0]
        self.finish_reason: str | None = None
        self.generated_ids: list[int] = []  # the reply's ids, without a terminal token
        self.stop_hit = False  # a stop string ended the reply (the generation is cancelled)
        self.closed = False

    def close(self) -> None:
        """Cancel the generation if it still runs (it releases its session as it ends)
        and fill in the access-log fields. Never waits, so no interruption of the
        handler can leave the session held."""
        if self.closed:
            return
        self.closed = True
        if not self.g.finished:
            self.api.runtime.cancel(self.g)
        t = self.g.timings()
        self.log.update(session=self.session_id or "-", prompt=len(self.g.prompt), cached=t["cache_n"],
                        generated=t["predicted_n"], ttft_ms=round(self.g.first_token_ms(), 1),
                        finish=self.finish_reason or "cancelled")
        if self.api.options.log_prompts:
            completion = self.output.content() + "".join(
                f"<tool_call>{json.dumps(c['function'], ensure_ascii=False)}</tool_call>"
                for c in self.output.tool_calls())
            log.info("%s prompt_text=%s completion_text=%s", self.id, json.dumps(self.prompt, ensure_ascii=False),
                     json.dumps(completion, ensure_ascii=False))

    async def _events(self, ping: bool) -> AsyncIterator[tuple[str, object]]:
        """The generation's events; ("ping", None) while nothing comes for a while."""
        while True:
            try:
                kind, value = await asyncio.wait_for(self.api.runtime.next_event(self.g),
                                                     PING_SECONDS if ping else None)
            except asyncio.TimeoutError:
                yield "ping", None
                continue
            yield kind, value
            if kind != "token":
                return

    def _feed(self, token: Token) -> list[ContentDelta | ToolCallDelta]:
        if not token.is_terminal:
            self.generated_ids.append(token.id)
        deltas, hit = self.output.feed(token.piece)
        if hit:
            self.stop_hit = True
            self.api.runtime.cancel(self.g)
        return deltas

    def _end(self, reason: str) -> list[ContentDelta | ToolCallDelta]:
        """The last deltas; sets finish_reason and remembers a complete chat reply.
        A generation cancelled for any reason but a stop string was cut short: that is
        an error, never a normal finish."""
        if reason == "cancelled" and not self.stop_hit:
            raise errors.unavailable("the generation was cancelled before it finished")
        deltas = self.output.finish()
        self.finish_reason = "tool_calls" if self.output.calls else "stop" if reason == "cancelled" else reason
        # A reply cut by a stop string ("cancelled") holds ids the client never saw.
        if self.kind == "chat" and self.g.reuse and reason in ("stop", "length"):
            calls = [(c["function"]["name"], c["function"]["arguments"]) for c in self.output.tool_calls()]
            self.g.slot.remember_reply(reply_fingerprint(self.output.content(), calls), self.generated_ids)
        return deltas

    def usage(self) -> dict:
        prompt, done = len(self.g.prompt), self.g.generated
        return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done,
                "prompt_tokens_details": {"cached_tokens": self.g.plan.keep}}

    def _extensions(self) -> dict:
        return {"timings": self.g.timings(), "session_reset_reason": self.g.plan.reason}

    async def collect(self, request: HttpRequest) -> dict:
        watcher = asyncio.create_task(self._cancel_on_disconnect(request))
        try:
            async for kind, value in self._events(ping=False):
                if kind == "token":
                    self._feed(value)
                elif kind == "error":
                    raise as_api_error(value)
                else:
                    self._end(value)
        finally:
            watcher.cancel()
        text = self.output.content()
        calls = self.output.tool_calls()
        finish = self.finish_reason
        if self.kind == "chat":
            message = {"role": "assistant", "content": text or (None if calls else ""), "refusal": None}
            if calls:
                message["tool_calls"] = calls
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": FINGERPRINT, "choices": [choice], "usage": self.usage(),
                **self._extensions()}

    async def _cancel_on_disconnect(self, request: HttpRequest) -> None:
        await request.disconnected.wait()
        self.api.runtime.cancel(self.g)

    def _chunk(self, choice: dict | None, **extra) -> bytes:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        body = {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": FINGERPRINT, "choices": [choice] if choice else [], **extra}
        return sse.event(json.dumps(body, ensure_ascii=False))

    def _delta_chunk(self, delta: dict | None, text: str | None, finish: str | None) -> bytes:
        if self.kind == "chat":
            return self._chunk({"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish})
        return self._chunk({"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish})

    def _render(self, deltas: list[ContentDelta | ToolCallDelta]) -> list[bytes]:
        out = []
        for d in deltas:
            if isinstance(d, ContentDelta):
                out.append(self._delta_chunk({"content": d.text}, d.text, None))
            else:
                out.append(self._delta_chunk({"tool_calls": [d.to_openai_delta()]}, None, None))
        return out

    async def stream(self, request: HttpRequest) -> AsyncIterator[bytes]:
        try:
            if self.kind == "chat":
                yield self._delta_chunk({"role": "assistant", "content": ""}, None, None)
            async for kind, value in self._events(ping=True):
                if kind == "ping":
                    yield sse.PING
                elif kind == "token":
                    for chunk in self._render(self._feed(value)):
                        yield chunk
                else:
                    try:
                        if kind == "error":
                            raise as_api_error(value)
                        chunks = self._render(self._end(value))
                    except ApiError as err:
                        yield sse.event(json.dumps(error_body(err)))
                        yield sse.DONE
                        return
                    for chunk in chunks:
                        yield chunk
                    yield self._delta_chunk({}, "", self.finish_reason)
            if self.include_usage:
                yield self._chunk(None, usage=self.usage(), **self._extensions())
            yield sse.DONE
        finally:
            self.close()


class ReplyStream:
    """A Reply's SSE chunks for the HTTP layer. Closing it closes the reply even if the
    stream never started (a client that reset before the response head), which a
    bare async generator would not do."""

    def __init__(self, reply: Reply, request: HttpRequest):
        self.reply = reply
        self.chunks = reply.stream(request)

    def __aiter__(self) -> ReplyStream:
        return self

    async def __anext__(self) -> bytes:
        return await self.chunks.__anext__()

    async def aclose(self) -> None:
        try:
            await self.chunks.aclose()
        finally:
            self.reply.close()


class App:
    """The HTTP application: answers /health with 503 until the model is loaded,
    then hands every request to the Api."""

    def __init__(self) -> None:
        self.api: Api | None = None

    async def __call__(self, request: HttpRequest) -> Response | StreamResponse:
        if self.api is not None:
            return await self.api(request)
        if request.path == "/health":
            return json_response({"status": "loading"}, 503)
        return error_response(errors.unavailable("the model is loading", retry_after=1))
