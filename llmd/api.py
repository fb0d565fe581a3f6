"""The OpenAI-compatible routes: validated request → prompt ids → runtime →
response (JSON or SSE). Errors raised anywhere before the first response byte
become one JSON error response; errors after SSE headers become one error event
followed by [DONE].
"""
from __future__ import annotations

import asyncio
import json
import random
import re
import time
import uuid
from dataclasses import asdict, dataclass
from typing import AsyncIterator

from llmd import chat, constrain, errors, openai, sse
from llmd.engine import Engine, Sampling
from llmd.errors import ApiError, as_api_error, error_body
from llmd.runtime import Generation, Runtime
from llmd.server import HttpRequest, Response, StreamResponse
from llmd.sessions import SessionTable, session_id_of
from llmd.stops import StopMatcher
from llmd.text import Utf8Stream
from llmd.tools import ContentDelta, ToolCallDelta, ToolCallStream, merge_tool_calls

PING_SECONDS = 3.0  # `: ping` comments while the prompt is processed
FINGERPRINT = "llmd-0.1.0"


def json_response(obj: object, status: int = 200, headers: list[tuple[str, str]] | None = None,
                  log: dict | None = None) -> Response:
    return Response(status, json.dumps(obj, ensure_ascii=False).encode(), headers or [],
                    log=log if log is not None else {})


def error_response(err: ApiError) -> Response:
    return json_response(error_body(err), err.status, list(err.headers.items()))


@dataclass
class Options:
    model_ids: list[str]          # served id first, then aliases
    scratch_reuse: bool = False


class Output:
    """Turns a generation's token pieces into response text: UTF-8 assembly,
    stop-string hold-back, then (for chat with tools) tool-call extraction."""

    def __init__(self, stops: list[str], tools: list[dict] | None):
        self.utf8 = Utf8Stream()
        self.stops = StopMatcher(stops)
        self.tools = ToolCallStream(tools) if tools else None
        self.tool_calls = 0

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
            return [ContentDelta(text)] if text else []
        out = self.tools.feed(text) if text else []
        if final:
            out += self.tools.finish()
        self.tool_calls += sum(isinstance(d, ToolCallDelta) and d.id is not None for d in out)
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
        self.created = int(time.time())
        self.routes: list[tuple[re.Pattern, dict[str, object]]] = [
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

    async def __call__(self, request: HttpRequest) -> Response | StreamResponse:
        try:
            for pattern, methods in self.routes:
                if (m := pattern.fullmatch(request.path)) is None:
                    continue
                method = "GET" if request.method == "HEAD" else request.method
                handler = methods.get(method)
                if handler is None:
                    raise errors.method_not_allowed(sorted(methods) + (["HEAD"] if "GET" in methods else []))
                return await handler(request, **m.groupdict())
            raise errors.not_found(f"no route for {request.path}")
        except ApiError as err:
            return error_response(err)

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

    async def tokenize(self, request: HttpRequest) -> Response:
        req = openai.parse_tokenize_request(request.body)
        ids = await self.runtime.call(self.engine.tokenize, req.content, True)
        if req.add_special and self.info.add_bos:
            ids = [self.info.bos_id] + ids
        if not req.with_pieces:
            return json_response({"tokens": ids})
        pieces = []
        for i in ids:
            raw = self.engine.piece(i, special=True)
            try:
                pieces.append({"id": i, "piece": raw.decode("utf-8")})
            except UnicodeDecodeError:
                pieces.append({"id": i, "piece": list(raw)})
        return json_response({"tokens": pieces})

    async def detokenize(self, request: HttpRequest) -> Response:
        req = openai.parse_detokenize_request(request.body)
        openai.check_vocab(req, self.info.n_vocab)
        data = await self.runtime.call(self.engine.detokenize, req.tokens, True)
        return json_response({"content": data.decode("utf-8", "replace")})

    # ---- sessions ----------------------------------------------------------

    async def list_sessions(self, request: HttpRequest) -> Response:
        data = [self.table.describe(s) for s in self.table.named.values()]
        return json_response({"object": "list", "data": data, "capacity": self.table.capacity - 1})

    def _named(self, sid: str) -> str:
        return session_id_of(sid, {})

    async def get_session(self, request: HttpRequest, sid: str) -> Response:
        slot = self.table.named.get(self._named(sid))
        if slot is None:
            raise errors.session_not_found(sid)
        return json_response(self.table.describe(slot))

    async def delete_session(self, request: HttpRequest, sid: str) -> Response:
        deleted = await self.table.delete(self._named(sid))
        return json_response({"id": sid, "object": "session.deleted", "deleted": deleted})

    async def reset_session(self, request: HttpRequest, sid: str) -> Response:
        reset = await self.table.reset(self._named(sid))
        return json_response({"id": sid, "object": "session.reset", "reset": reset})

    # ---- generation ------------------------------------------------------------

    async def chat_completions(self, request: HttpRequest) -> Response | StreamResponse:
        req = openai.parse_chat_request(request.body)
        self._check_model(req.model)
        openai.check_vocab(req, self.info.n_vocab)
        sid = session_id_of(req.session_id, request.headers)
        if self.template is None:
            raise errors.invalid_request("this model has no chat template; use /v1/completions "
                                         "or start llmd with --chat-template", "messages")
        tools = [asdict(t) for t in req.tools] if req.tool_choice != "none" else []
        try:
            prompt = chat.render_chat(self.template, [asdict(m) for m in req.messages], tools or None)
        except chat.ChatTemplateError as exc:
            raise errors.unsupported_parameter("tools" if tools else "messages", str(exc))
        grammar = await asyncio.to_thread(constrain.chat_grammar, req)  # compiling may take a while
        ids = await self.runtime.call(self._tokenize_parts, prompt.parts)
        return await self._generate(request, "chat", ids, req, sid, tools or None, grammar)

    async def completions(self, request: HttpRequest) -> Response | StreamResponse:
        req = openai.parse_completion_request(request.body)
        self._check_model(req.model)
        openai.check_vocab(req, self.info.n_vocab)
        sid = session_id_of(req.session_id, request.headers)
        grammar = await asyncio.to_thread(constrain.completion_grammar, req)
        if isinstance(req.prompt, str):
            ids = await self.runtime.call(self._tokenize_parts, [(req.prompt, True)])
        else:
            ids = list(req.prompt)
        return await self._generate(request, "text", ids, req, sid, None, grammar)

    def _tokenize_parts(self, parts: list[tuple[str, bool]]) -> list[int]:
        """Markers as control tokens, content as plain text; BOS first if the model wants it."""
        ids: list[int] = []
        for text, is_marker in parts:
            ids += self.engine.tokenize(text, special=is_marker)
        if self.info.add_bos and (not ids or ids[0] != self.info.bos_id):
            ids.insert(0, self.info.bos_id)
        return ids

    def _sampling(self, s: openai.Sampling) -> Sampling:
        return Sampling(
            temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p,
            seed=(s.seed if s.seed is not None else random.getrandbits(64)) & 0xFFFFFFFFFFFFFFFF,
            repeat_penalty=s.repetition_penalty, presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty, logit_bias=dict(s.logit_bias))

    async def _generate(self, request: HttpRequest, kind: str, ids: list[int],
                        req: openai.ChatRequest | openai.CompletionRequest, sid: str | None,
                        tools: list[dict] | None, grammar: str | None) -> Response | StreamResponse:
        n_ctx = self.info.n_ctx
        if not ids:
            raise errors.invalid_request("the prompt is empty", "prompt")
        if len(ids) >= n_ctx:
            raise errors.context_length_exceeded(len(ids), n_ctx, "messages" if kind == "chat" else "prompt")
        room = n_ctx - len(ids)
        max_tokens = min(req.max_tokens or room, room)
        slot = await self.table.acquire(sid)  # 400 / 429 here, before any response byte
        reuse = not slot.temporary and (sid is not None or self.options.scratch_reuse)
        g = Generation(slot, ids, self._sampling(req.sampling), max_tokens, reuse=reuse, grammar=grammar)
        self.runtime.submit(g)
        reply = Reply(self, kind, g, Output(req.stop, tools), req.include_usage, sid)
        if req.stream:
            response = StreamResponse(200, reply.stream(request))
            reply.log = response.log
            return response
        try:
            return json_response(await reply.collect(request), log=reply.log)
        finally:
            await reply.close()


class Reply:
    """One generation's response, streamed as SSE chunks or collected into one object."""

    def __init__(self, api: Api, kind: str, g: Generation, output: Output, include_usage: bool,
                 session_id: str | None):
        self.api, self.kind, self.g, self.output = api, kind, g, output
        self.include_usage = include_usage
        self.session_id = session_id
        self.log: dict = {}  # access-log fields, shared with the HTTP response
        prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
        self.id = prefix + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.model = api.options.model_ids[0]
        self.finish_reason: str | None = None
        self.closed = False

    async def close(self) -> None:
        """Cancel the generation if it still runs, wait until the scheduler let go of
        it, and release the session slot."""
        if self.closed:
            return
        self.closed = True
        if not self.g.finished:
            self.api.runtime.cancel(self.g)
            while not self.g.finished:
                await self.g.events.get()
        await self.api.table.release(self.g.slot)
        t = self.g.timings()
        self.log.update(session=self.session_id or "-", prompt=len(self.g.prompt), cached=t["cache_n"],
                        generated=t["predicted_n"], ttft_ms=round(self.g.first_token_ms(), 1),
                        finish=self.finish_reason or "cancelled")

    async def _events(self, ping: bool) -> AsyncIterator[tuple[str, object]]:
        """The generation's events; ("ping", None) while nothing comes for a while."""
        while True:
            try:
                kind, value = await asyncio.wait_for(self.g.events.get(), PING_SECONDS if ping else None)
            except asyncio.TimeoutError:
                yield "ping", None
                continue
            yield kind, value
            if kind != "token":
                return

    def _finish_reason(self, reason: str) -> str:
        if self.output.tool_calls:
            return "tool_calls"
        return "stop" if reason == "cancelled" else reason

    def usage(self) -> dict:
        prompt, done = len(self.g.prompt), self.g.generated
        return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done,
                "prompt_tokens_details": {"cached_tokens": self.g.plan.keep}}

    def _extensions(self) -> dict:
        return {"timings": self.g.timings(), "session_reset_reason": self.g.plan.reason}

    async def collect(self, request: HttpRequest) -> dict:
        watcher = asyncio.create_task(self._cancel_on_disconnect(request))
        content: list[str] = []
        pieces: list[ToolCallDelta] = []
        reason = "stop"
        try:
            async for kind, value in self._events(ping=False):
                if kind == "token":
                    deltas, hit = self.output.feed(value.piece)
                    if hit:
                        self.api.runtime.cancel(self.g)
                elif kind == "error":
                    raise as_api_error(value)
                else:
                    reason = value
                    deltas = self.output.finish()
                for d in deltas:
                    (content.append(d.text) if isinstance(d, ContentDelta) else pieces.append(d))
        finally:
            watcher.cancel()
        text = "".join(content)
        calls = merge_tool_calls(pieces)
        finish = self.finish_reason = self._finish_reason(reason)
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
                    deltas, hit = self.output.feed(value.piece)
                    if hit:
                        self.api.runtime.cancel(self.g)
                    for chunk in self._render(deltas):
                        yield chunk
                elif kind == "error":
                    yield sse.event(json.dumps(error_body(as_api_error(value))))
                    yield sse.DONE
                    return
                else:
                    for chunk in self._render(self.output.finish()):
                        yield chunk
                    self.finish_reason = self._finish_reason(value)
                    yield self._delta_chunk({}, "", self.finish_reason)
            if self.include_usage:
                yield self._chunk(None, usage=self.usage(), **self._extensions())
            yield sse.DONE
        finally:
            await self.close()


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
