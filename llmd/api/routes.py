"""The OpenAI-compatible routes: validated request → prompt ids → runtime →
response (JSON or SSE). Errors raised anywhere before the first response byte
become one JSON error response; errors after SSE headers become one error event
followed by [DONE].
"""
from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import importlib.resources
import json
import logging
import random
import re
import time
from dataclasses import asdict, dataclass, field
from typing import AsyncIterator, Callable, Mapping, Protocol, TypeVar

from llmd.prompt import templates

from llmd.structured import constrain

from llmd.api import embeddings

from llmd import errors

from llmd.api import anthropic

from llmd.serving import metrics

from llmd.api import validation

from llmd.http import sse
from llmd.api.chat_completions import ChatCompletionFormat
from llmd.api.completions import CompletionFormat
from llmd.engine.native import Engine, Sampling, Token, UnsupportedError
from llmd.errors import ApiError, as_api_error, error_body, refusal_log
from llmd.api.logprobs import TokenLogprob
from llmd.serving.runtime import Generation, Runtime
from llmd.http.server import HttpRequest, Response, StreamResponse
from llmd.api.responses import CompactionFormat, ResponsesFormat, ResponseStore, StoredResponse, conversation_session
from llmd.serving.prefill import cache_scope
from llmd.serving.sessions import Lease, SessionTable, cache_key_session, reply_fingerprint, session_id_of
from llmd.prompt.stops import StopMatcher
from llmd.prompt.text import Utf8Stream
from llmd.prompt.reasoning import ReasoningDelta, ReasoningStream
from llmd.prompt.harmony import HarmonyStream
from llmd.prompt.tool_calls import ContentDelta, ToolCallDelta, call_stream, merge_tool_calls

Delta = ContentDelta | ToolCallDelta | ReasoningDelta  # what a token adds to a reply
PING_SECONDS = 3.0  # `: ping` comments while the prompt is processed
PARSE_INLINE_BYTES = 64 * 1024  # bodies parsed on the event loop; bigger ones on a thread
DETOKENIZE_CHUNK = 4096  # ids turned into text per executor call, so other streams step in between
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


def error_shape(path: str) -> str:
    """The error shape a route answers in: Anthropic's on the Messages routes."""
    return errors.ANTHROPIC if path.startswith(anthropic.PATHS) else errors.OPENAI


def error_response(err: ApiError, shape: str = errors.OPENAI) -> Response:
    """The JSON error answer for err, its access-log line saying why."""
    return json_response(error_body(err, shape), err.status, list(err.headers.items()), log=refusal_log(err))


def key_scope(request: HttpRequest) -> str:
    """Whose stored state a request may see: a digest of the API key it presented
    (the access guard has checked it), "" without one."""
    presented = request.headers.get("x-api-key")
    if presented is None:
        scheme, _, token = (request.headers.get("authorization") or "").strip().partition(" ")
        presented = token.strip() if scheme.lower() == "bearer" else ""
    return hashlib.sha256(presented.encode("latin-1")).hexdigest() if presented else ""


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
    prefix_cache: str = "key"     # who shares cached prompt prefixes (llmd.serving.prefill.cache_scope)


@dataclass
class PromptIds:
    """A prompt as token ids. `replies` maps the token span [start, end) of an earlier
    assistant reply to that reply's fingerprint, so the ids the session generated for
    it can stand in for the re-tokenized text."""

    tokens: list[int]
    bos: int | None = None  # prepended unless the prompt already starts with it
    replies: dict[tuple[int, int], str] = field(default_factory=dict)

    def ids(self, generated: Mapping[str, list[int]] | None = None) -> list[int]:
        ids: list[int] = []
        at = 0
        for (start, end), fingerprint in sorted(self.replies.items()):
            if generated and fingerprint in generated:
                ids += self.tokens[at:start] + generated[fingerprint]
                at = end
        ids += self.tokens[at:]
        if self.bos is not None and (not ids or ids[0] != self.bos):
            ids.insert(0, self.bos)
        return ids


class Output:
    """Turns a generation's token pieces into response text: UTF-8 assembly,
    stop-string hold-back, then (for a reasoning model's chat) the reasoning block
    split off, then (for chat with tools) tool-call extraction from the content; or,
    for gpt-oss ("harmony"), its channels split into reasoning, content and calls.
    Keeps what it produced: `text`, `reasoning` and the tool `calls` pieces.
    `reasoning` None means the output has no reasoning block; True or False says
    whether it starts inside one. `tool_format` is chat.tool_format's."""

    def __init__(self, stops: list[str], tools: list[dict] | None, reasoning: bool | None = None,
                 tool_format: str = "hermes"):
        self.utf8 = Utf8Stream()
        self.stops = StopMatcher(stops)
        self.harmony = HarmonyStream(tools) if tool_format == "harmony" else None
        self.thinking = ReasoningStream(reasoning) if reasoning is not None and self.harmony is None else None
        self.tools = call_stream(tool_format, tools) if tools and self.harmony is None else None
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.reasoning_tokens = 0
        self.calls: list[ToolCallDelta] = []

    @property
    def reads_markers(self) -> bool:
        """Whether the tool format's markers (chat.output_markers) must reach `feed` as text."""
        return self.tools is not None or self.harmony is not None

    def content(self) -> str:
        return "".join(self.text)

    def tool_calls(self) -> list[dict]:
        """The OpenAI `tool_calls` entries the pieces so far add up to."""
        return merge_tool_calls(self.calls)

    def feed(self, piece: bytes) -> tuple[list[Delta], bool]:
        """One token's piece; counts it in `reasoning_tokens` if it was part of the
        reasoning (a `<think>` block's tags included)."""
        inside = self._inside()
        text, hit = self.stops.feed(self.utf8.feed(piece))
        deltas = self._route(text, final=False)
        if inside or self._inside() or any(isinstance(d, ReasoningDelta) for d in deltas):
            self.reasoning_tokens += 1
        return deltas, hit

    def _inside(self) -> bool:
        return self.thinking is not None and self.thinking.state == "inside"

    def finish(self) -> list[Delta]:
        text, hit = self.stops.feed(self.utf8.flush())  # ("", True) once a stop was hit
        if not hit:
            text += self.stops.flush()
        return self._route(text, final=True)

    def _route(self, text: str, final: bool) -> list[Delta]:
        out: list[Delta] = []
        if self.harmony is not None:
            out += (self.harmony.feed(text) if text else []) + (self.harmony.finish() if final else [])
            text = ""
        if self.thinking is not None:
            pieces = (self.thinking.feed(text) if text else []) + (self.thinking.finish() if final else [])
            text = ""
            for kind, piece in pieces:
                out += [ReasoningDelta(piece)] if kind == "reasoning" else self._content(piece)
        out += self._content(text)
        if final and self.tools is not None:
            out += self.tools.finish()
        for d in out:
            if isinstance(d, ContentDelta):
                self.text.append(d.text)
            elif isinstance(d, ToolCallDelta):
                self.calls.append(d)
            else:
                self.reasoning.append(d.text)
        return out

    def _content(self, text: str) -> list[ContentDelta | ToolCallDelta]:
        if not text:
            return []
        return self.tools.feed(text) if self.tools is not None else [ContentDelta(text)]


class Api:
    """Routes requests to handlers. Built once the model is loaded."""

    def __init__(self, engine: Engine, runtime: Runtime, table: SessionTable,
                 template: templates.ChatTemplate | templates.JinjaTemplate | templates.Unavailable, options: Options):
        self.engine = engine
        self.info = engine.info
        self.runtime = runtime
        self.table = table
        self.template = template
        self.options = options
        self.metrics = runtime.metrics
        self.metrics.watch(runtime, table)
        self.page_html = importlib.resources.files("llmd").joinpath("static/index.html").read_bytes()
        self.created = int(time.time())
        self.waiting = 0  # generation requests waiting for their session's slot
        # No token covers more text than the longest piece, so text longer than the
        # context times that cannot fit: it is refused before the executor spends
        # seconds tokenizing it while every stream waits.
        longest = max((len(self.engine.piece(i, special=True)) for i in range(self.info.n_vocab)), default=1)
        self.max_text_bytes = self.info.n_ctx * max(longest, 1)
        # The control tokens a chat's tool format writes reach its parser as their text
        # (a Mistral model's [TOOL_CALLS] opens its calls), and constrained calls write them.
        markers = () if isinstance(template, templates.Unavailable) else templates.output_markers(template)
        self.shown = templates.control_pieces(engine, markers)
        self.controls = {piece.decode(): i for i, piece in self.shown.items()}
        self.routes: list[tuple[re.Pattern, dict[str, object]]] = [
            (re.compile(r"/"), {"GET": self.page}),
            (re.compile(r"/metrics"), {"GET": self.metrics_text}),
            (re.compile(r"/health"), {"GET": self.health}),
            (re.compile(r"(?:/v1)?/models"), {"GET": self.models}),
            (re.compile(r"(?:/v1)?/models/(?P<model>[^/]+)"), {"GET": self.model}),
            (re.compile(r"(?:/v1)?/chat/completions"), {"POST": self.chat_completions}),
            (re.compile(r"(?:/v1)?/completions"), {"POST": self.completions}),
            (re.compile(r"(?:/v1)?/responses"), {"POST": self.create_response}),
            (re.compile(r"(?:/v1)?/responses/compact"), {"POST": self.compact_conversation}),
            (re.compile(r"(?:/v1)?/messages"), {"POST": self.create_message}),
            (re.compile(r"(?:/v1)?/messages/count_tokens"), {"POST": self.count_message_tokens}),
            (re.compile(r"(?:/v1)?/embeddings"), {"POST": self.embeddings}),
            (re.compile(r"/tokenize"), {"POST": self.tokenize}),
            (re.compile(r"/detokenize"), {"POST": self.detokenize}),
            (re.compile(r"/apply-template"), {"POST": self.apply_template}),
            (re.compile(r"/props"), {"GET": self.props}),
            (re.compile(r"/v1/sessions"), {"GET": self.list_sessions}),
            (re.compile(r"/v1/sessions/(?P<sid>[^/]+)"), {"GET": self.get_session, "DELETE": self.delete_session}),
            (re.compile(r"/v1/sessions/(?P<sid>[^/]+)/reset"), {"POST": self.reset_session}),
        ]
        self.route_labels = {pattern: route_label(pattern) for pattern, _ in self.routes}
        self.responses = ResponseStore()
        self.pooling = engine.pooling_type()  # 0: the model makes no embeddings

    async def __call__(self, request: HttpRequest) -> Response | StreamResponse:
        route, response = "unmatched", None
        shape = error_shape(request.path)
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
            response = error_response(err, shape)
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

    # ---- chat template (as llama.cpp's server shows it) ------------------------

    async def apply_template(self, request: HttpRequest) -> Response:
        """The exact prompt text a chat request with this body would be given."""
        req = await parse(validation.parse_apply_template_request, request.body)
        tools = [asdict(t) for t in req.tools] if req.tool_choice != "none" else []
        prompt = await asyncio.to_thread(self._render, req.messages, tools, req.add_generation_prompt,
                                         req.template_kwargs)
        return json_response({"prompt": prompt.text})

    async def props(self, request: HttpRequest) -> Response:
        """Model and server properties in the shape of llama.cpp's GET /props."""
        bos, eos = await self.runtime.call(lambda: tuple(
            self.engine.piece(i, special=True).decode("utf-8", "replace") if i >= 0 else ""
            for i in (self.info.bos_id, self.info.eos_id)))
        template = self.template
        return json_response({
            "default_generation_settings": {"n_ctx": self.info.n_ctx},
            "total_slots": self.table.capacity,
            "model_alias": self.options.model_ids[0],
            "modalities": {"vision": False, "audio": False},
            "chat_template": template.source if not isinstance(template, templates.Unavailable) else "",
            "bos_token": bos,
            "eos_token": eos,
            "build_info": "llmd",
            "chat_template_renderer": templates.renderer_name(template),
        })

    # ---- tokenizer -----------------------------------------------------------

    def _check_text(self, text: str, param: str) -> None:
        """Refuse text too long to fit the context whatever its tokens (see __init__)."""
        if len(text) * 4 > self.max_text_bytes:  # else it fits: no need to encode it
            n_bytes = len(text.encode("utf-8", "surrogatepass"))
            if n_bytes > self.max_text_bytes:
                raise errors.text_too_long(n_bytes, self.max_text_bytes, self.info.n_ctx, param)

    async def tokenize(self, request: HttpRequest) -> Response:
        req = await parse(validation.parse_tokenize_request, request.body)
        self._check_text(req.content, "content")
        ids = await self.runtime.call(self.engine.tokenize, req.content, True)
        if req.add_special:  # as llama-server: BOS and EOS where the model adds them
            bos = [self.info.bos_id] if self.info.add_bos else []
            ids = bos + ids + ([self.info.eos_id] if self.info.add_eos else [])
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

    def _parse_detokenize(self, body: bytes) -> validation.DetokenizeRequest:
        req = validation.parse_detokenize_request(body)
        validation.check_vocab(req, self.info.n_vocab)  # a pass over every id: with the parse
        return req

    # ---- sessions ----------------------------------------------------------

    async def list_sessions(self, request: HttpRequest) -> Response:
        data = [self.table.describe(s) for s in self.table.named.values()]
        # The engine's own count next to the table's: they differ only while frees
        # or opens are queued on the executor, so lasting disagreement is a leak.
        saved = {"saved_sessions": store.count, "saved_bytes": store.bytes_used} if (store := self.table.store) else {}
        return json_response({"object": "list", "data": data, "capacity": self.table.capacity - 1,
                              "engine_sessions": self.engine.live_sessions(),
                              "table_sessions": self.table.engine_sessions, **saved})

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
        req = await parse(validation.parse_chat_request, request.body)
        fmt = ChatCompletionFormat(req.include_usage, req.logprobs is not None, req.timings_per_token)
        return await self._chat(request, req, self._session_of(req, request), fmt)

    async def create_response(self, request: HttpRequest) -> Response | StreamResponse:
        req = await parse(validation.parse_responses_request, request.body)
        scope, chat_req, previous = key_scope(request), req.chat, None
        if req.previous_response_id is not None:
            previous = self.responses.get(scope, req.previous_response_id)
            if previous is None:
                raise errors.invalid_request(f"Previous response with id '{req.previous_response_id}' not "
                                             "found.", "previous_response_id", "previous_response_not_found")
            # Instructions do not carry over: each request's own come first.
            system = [validation.Message("system", req.instructions)] if req.instructions is not None else []
            chat_req = dataclasses.replace(chat_req, messages=system + previous.history + req.input)
        history = (previous.history if previous else []) + req.input
        fmt = ResponsesFormat(req, None)
        sid = self._session_of(chat_req, request) or (previous.session_id if previous else None)
        if sid is None and req.store and self.table.eviction == "lru":
            # A stored conversation gets a session of its own, so its continuation is warm;
            # an idle one is evicted when the table is full (its cache only, never the store).
            sid = conversation_session(scope, fmt.id)

        def store(response_id: str, reply: validation.Message) -> None:
            self.responses.put(scope, response_id, StoredResponse(history + [reply], sid))

        fmt.on_done = store if req.store else None
        return await self._chat(request, chat_req, sid, fmt)

    async def compact_conversation(self, request: HttpRequest) -> Response:
        """The conversation (a stored one and/or input items) as its user messages and
        one compaction item: the model's summary of the rest."""
        req = await parse(validation.parse_compact_request, request.body)
        chat_req, history = req.chat, req.input
        previous = None
        if req.previous_response_id is not None:
            previous = self.responses.get(key_scope(request), req.previous_response_id)
            if previous is None:
                raise errors.invalid_request(f"Previous response with id '{req.previous_response_id}' not "
                                             "found.", "previous_response_id", "previous_response_not_found")
            history = previous.history + req.input
            system = [validation.Message("system", req.instructions)] if req.instructions is not None else []
            chat_req = dataclasses.replace(chat_req, messages=system + history + chat_req.messages[-1:])
        fmt = CompactionFormat([m for m in history if m.role == "user"])
        sid = self._session_of(chat_req, request) or (previous.session_id if previous else None)
        return await self._chat(request, chat_req, sid, fmt)

    async def create_message(self, request: HttpRequest) -> Response | StreamResponse:
        req = await parse(anthropic.parse_request, request.body)
        return await self._chat(request, req, self._session_of(req, request), anthropic.MessagesFormat(req))

    async def count_message_tokens(self, request: HttpRequest) -> Response:
        req = await parse(anthropic.parse_count_request, request.body)
        self._check_model(req.model)
        validation.check_vocab(req, self.info.n_vocab)
        prompt, _, _ = await self._chat_prompt(req)
        return json_response({"input_tokens": len(prompt.ids())})

    async def embeddings(self, request: HttpRequest) -> Response:
        req = await parse(validation.parse_embeddings_request, request.body)
        self._check_model(req.model)
        if self.pooling == 0:
            raise errors.invalid_request("This model has no pooling: its GGUF declares no pooling type, so it "
                                         "makes no embeddings. Serve an embedding model.", "model",
                                         "model_has_no_pooling")
        if req.dimensions is not None and req.dimensions != self.info.n_embd:
            raise errors.unsupported_parameter(
                "dimensions", f"This model makes {self.info.n_embd}-dimensional embeddings and its GGUF declares "
                              f"no shortened ones: 'dimensions' may only be {self.info.n_embd}.")
        bos = self.info.bos_id if self.info.add_bos else None
        eos = self.info.eos_id if self.info.add_eos else None
        inputs: list[list[int]] = []
        for i, item in enumerate(req.inputs):
            param = "input" if len(req.inputs) == 1 else f"input[{i}]"
            if isinstance(item, str):
                self._check_text(item, param)
                item = embeddings.input_ids(await self.runtime.call(self.engine.tokenize, item), bos, eos)
            else:
                validation.check_token_ids(item, self.info.n_vocab, param)
            if len(item) > self.info.n_ctx:
                raise errors.context_length_exceeded(len(item), self.info.n_ctx, param)
            inputs.append(item)
        self._admit()
        self.waiting += 1
        try:
            lease = await self.table.acquire(None)
        finally:
            self.waiting -= 1
        slot, vectors = lease.slot, []
        try:
            # The cache ends up holding an embedding input, no conversation's prefix.
            slot.resident, slot.dirty = [], True
            for ids in inputs:  # one call per input: generations step in between
                vectors.append(embeddings.normalize(await self.runtime.call(slot.session.embed, ids)))
        except UnsupportedError as exc:  # rank pooling, non-causal attention: the engine says which
            raise errors.unsupported_parameter("model", f"This model's embeddings cannot be computed: {exc}.")
        finally:
            lease.release()
        return json_response(embeddings.body(vectors, req.encoding_format, self.options.model_ids[0],
                                             sum(map(len, inputs))))

    def _session_of(self, req: validation.ChatRequest | validation.CompletionRequest, request: HttpRequest) -> str | None:
        """The body's session_id, else a session header, else the prompt_cache_key's session."""
        return session_id_of(req.session_id, request.headers) or cache_key_session(req.prompt_cache_key)

    async def _chat(self, request: HttpRequest, req: validation.ChatRequest, sid: str | None,
                    fmt: Format) -> Response | StreamResponse:
        """Generate the assistant's reply to a conversation, shaped by fmt."""
        self._check_model(req.model)
        validation.check_vocab(req, self.info.n_vocab)
        prompt, text, tools = await self._chat_prompt(req)
        reasoning = templates.reasoning_start(self.template, text)
        if req.reasoning and reasoning is None and templates.tool_format(self.template) != "harmony":
            raise errors.unsupported_parameter(req.reasoning_param, f"'{req.reasoning_param}' asks for reasoning, "
                                               "but the served model does not reason: its chat template has no "
                                               "reasoning block.")
        # compiling may take a while
        grammar = await asyncio.to_thread(constrain.chat_grammar, req, templates.call_layout(self.template),
                                          self.controls)
        return await self._generate(request, prompt, text, req, sid, tools, grammar, fmt, reasoning=reasoning)

    async def _chat_prompt(self, req: validation.ChatRequest) -> tuple[PromptIds, str, list[dict] | None]:
        """The conversation rendered by the chat template: its ids, its text and the
        tools it offers (None when tool_choice is "none")."""
        tools = [asdict(t) for t in req.tools] if req.tool_choice != "none" else []
        kwargs = req.template_kwargs
        if req.reasoning is False and templates.tool_format(self.template) == "harmony":
            raise errors.unsupported_parameter(req.reasoning_param, f"'{req.reasoning_param}' turns reasoning off, "
                                               "but gpt-oss always reasons; ask for a low reasoning effort instead.")
        if req.reasoning is False and isinstance(self.template, templates.JinjaTemplate) and self.template.thinks:
            kwargs = {**kwargs, "enable_thinking": False}  # Qwen3's switch; a template without one refuses it
        # a Jinja template over a long conversation takes milliseconds: off the event loop
        rendered = await asyncio.to_thread(self._render, req.messages, tools, True, kwargs, req.template_params)
        self._check_text(rendered.text, "messages")
        tokens = await self.runtime.call(templates.tokenize_prompt, rendered, self.engine.tokenize_marked)
        prompt = self._prompt_ids(tokens.ids)
        for index, span in tokens.replies.items():
            m = req.messages[index]
            prompt.replies[span] = reply_fingerprint(m.content, [(c.name, c.arguments) for c in m.tool_calls])
        return prompt, rendered.text, tools or None

    async def completions(self, request: HttpRequest) -> Response | StreamResponse:
        req = await parse(validation.parse_completion_request, request.body)
        self._check_model(req.model)
        validation.check_vocab(req, self.info.n_vocab)
        sid = self._session_of(req, request)
        grammar = await asyncio.to_thread(constrain.completion_grammar, req)
        if isinstance(req.prompt, str):
            self._check_text(req.prompt, "prompt")
            prompt = self._prompt_ids(await self.runtime.call(self.engine.tokenize, req.prompt, True))
        else:
            prompt = PromptIds(list(req.prompt))
        if req.echo and not isinstance(req.prompt, str):
            echoed = (await self.runtime.call(self.engine.detokenize, req.prompt)).decode("utf-8", "replace")
        else:
            echoed = req.prompt if req.echo else ""
        return await self._generate(request, prompt, req.prompt, req, sid, None, grammar,
                                    CompletionFormat(req.include_usage, echoed, req.logprobs is not None,
                                                     req.timings_per_token),
                                    prompt_logprobs=req.logprobs if req.echo else None)

    def _render(self, messages: list[validation.Message], tools: list[dict], add_generation_prompt: bool = True,
                template_kwargs: dict | None = None, template_params: dict | None = None) -> templates.Prompt:
        """The chat prompt; 400 when there is no usable template or it refuses the input.
        template_params names the request field that set a template variable, for the
        400 when the template has no use for it."""
        if isinstance(self.template, templates.Unavailable):
            raise errors.invalid_request(self.template.reason, "messages")
        try:
            return templates.render_chat(self.template, [asdict(m) for m in messages], tools or None,
                                    add_generation_prompt, template_kwargs)
        except templates.UnsupportedToolsError as exc:
            raise errors.unsupported_parameter("tools" if tools else "messages", str(exc))
        except templates.UnusedVariableError as exc:
            param = (template_params or {}).get(exc.name) or (
                "reasoning_effort" if exc.name == "reasoning_effort" else f"chat_template_kwargs.{exc.name}")
            raise errors.unsupported_parameter(param, str(exc))
        except templates.ChatTemplateError as exc:
            raise errors.invalid_request(str(exc), "messages")

    def _prompt_ids(self, ids: list[int]) -> PromptIds:
        """A tokenized prompt, BOS first if the model wants it."""
        return PromptIds(ids, self.info.bos_id if self.info.add_bos else None)

    def _sampling(self, s: validation.Sampling) -> Sampling:
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

    async def _generate(self, request: HttpRequest, prompt: PromptIds, prompt_text: str | list[int],
                        req: validation.ChatRequest | validation.CompletionRequest, sid: str | None,
                        tools: list[dict] | None, grammar: str | None, fmt: Format,
                        prompt_logprobs: int | None = None,
                        reasoning: bool | None = None) -> Response | StreamResponse:
        n_ctx = self.info.n_ctx
        ids = prompt.ids()
        if not ids:
            raise errors.invalid_request("the prompt is empty", "prompt")
        if len(ids) >= n_ctx:
            raise errors.context_length_exceeded(len(ids), n_ctx, fmt.prompt_param)
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
            max_tokens = cap if req.max_tokens is None else min(req.max_tokens, cap)
            sampling = self._sampling(req.sampling)
            scope = cache_scope(self.options.prefix_cache, request.principal, req.cache_salt)

            def generation(index: int) -> Generation:
                """Choice `index`: its own seed; after the first, the prompt is in the slot's
                cache. The last choice holds the lease (Reply.close hands it on if the
                reply ends sooner)."""
                return Generation(slot, ids, dataclasses.replace(sampling, seed=(sampling.seed + index) & 2**64 - 1),
                                  max_tokens, reuse=reuse or index > 0, cache_scope=scope, grammar=grammar,
                                  logprobs=req.logprobs,
                                  prompt_logprobs=prompt_logprobs if index == 0 else None,
                                  progress=req.return_progress and req.stream and index == 0,
                                  lease=lease if index == req.n - 1 else None)

            g = generation(0)
            self.runtime.submit(g)  # from here a generation releases the lease when it ends
        except BaseException:
            lease.release()
            raise
        def new_output() -> Output:
            return Output(req.stop, tools, reasoning, templates.tool_format(self.template))
        reply = Reply(self, fmt, g, new_output(), sid, prompt_text, Choices(req.n, generation, new_output, lease))
        if req.stream:
            response = StreamResponse(200, ReplyStream(reply, request))
            reply.log = response.log
            return response
        try:
            return json_response(await reply.collect(request), log=reply.log)
        finally:
            reply.close()


class Format(Protocol):
    """How one API surface (chat_completions, completions, responses, messages) shapes
    a reply: one object when collected, SSE frames when streamed."""

    id: str
    prompt_param: str          # the parameter a prompt over the context is blamed on
    remembers_replies: bool    # the client sends the reply back: keep its generated ids
    shows_reasoning: bool      # reasoning deltas reach `deltas` (else only content and calls)

    def body(self, reply: Reply) -> dict: ...
    def start(self, reply: Reply) -> list[bytes]: ...
    def deltas(self, reply: Reply, deltas: list[Delta]) -> list[bytes]: ...
    def end(self, reply: Reply) -> list[bytes]: ...  # after each choice; the last also closes
    def error(self, reply: Reply, err: ApiError) -> list[bytes]: ...
    # prompt processing, for the surfaces whose requests can ask for it (return_progress)
    def progress(self, reply: Reply, progress: dict) -> list[bytes]: ...


@dataclass
class Choice:
    """One choice of a reply: its generation, output, finish reason and logprobs."""
    index: int
    g: Generation
    output: Output
    finish_reason: str | None
    logprobs: list[TokenLogprob]


@dataclass
class Choices:
    """How many choices a reply has (n), and how the next one starts: its generation
    on the same slot (the prompt is prefilled once) and a fresh output."""
    n: int
    generation: Callable[[int], Generation]
    output: Callable[[], Output]
    lease: Lease                   # the reply's hold on the slot, given to its last choice


class Reply:
    """One generation's response, streamed as SSE chunks or collected into one object;
    its format builds the surface's objects and frames. With n > 1 the choices run
    one after another on the reply's slot; `g`, `output`, `finish_reason` and the
    logprobs are the current choice's, `done` holds the finished ones."""

    def __init__(self, api: Api, fmt: Format, g: Generation, output: Output,
                 session_id: str | None, prompt: str | list[int], choices: Choices | None = None):
        self.api, self.fmt, self.g, self.output = api, fmt, g, output
        self.more = choices
        self.n = choices.n if choices else 1
        self.index = 0                   # the current choice
        self.done: list[Choice] = []
        self.session_id = session_id
        self.prompt = prompt  # as the client gave it (text or ids), for --log-prompts
        self.log: dict = {}  # access-log fields, shared with the HTTP response
        self.id = fmt.id
        self.created = int(time.time())
        self.model = api.options.model_ids[0]
        self.finish_reason: str | None = None
        self.generated_ids: list[int] = []  # the reply's ids, without a terminal token
        self.logprobs: list[TokenLogprob] = []  # of the reply's tokens, when asked for
        self._logprobs_taken = 0
        self.stop_hit = False  # a stop string ended the reply (the generation is cancelled)
        self.closed = False

    def close(self) -> None:
        """Cancel the generation if it still runs (it releases its session as it ends)
        and fill in the access-log fields. Never waits, so no interruption of the
        handler can leave the session held."""
        if self.closed:
            return
        self.closed = True
        lease = self.more.lease if self.more else None
        if not self.g.finished:
            self.api.runtime.cancel(self.g)
            if lease is not None and self.g.lease is None:  # a choice before the last: it
                self.g.lease = lease                         # gives the slot back as it ends
        elif lease is not None:
            lease.release()
        t = self.g.timings()
        self.log.update(session=self.session_id or "-", prompt=len(self.g.prompt), cached=t["cache_n"],
                        generated=self.usage()["completion_tokens"], ttft_ms=round(self.g.first_token_ms(), 1),
                        finish=self.finish_reason or "cancelled")
        if self.api.options.log_prompts:
            completion = self.output.content() + "".join(
                f"<tool_call>{json.dumps(c['function'], ensure_ascii=False)}</tool_call>"
                for c in self.output.tool_calls())
            log.info("%s prompt_text=%s completion_text=%s", self.id, json.dumps(self.prompt, ensure_ascii=False),
                     json.dumps(completion, ensure_ascii=False))

    async def _events(self, ping: bool) -> AsyncIterator[tuple[str, object]]:
        """The generation's events up to its end; ("ping", None) while nothing comes
        for a while."""
        while True:
            try:
                kind, value = await asyncio.wait_for(self.api.runtime.next_event(self.g),
                                                     PING_SECONDS if ping else None)
            except asyncio.TimeoutError:
                yield "ping", None
                continue
            yield kind, value
            if kind not in ("token", "progress"):
                return

    def piece(self, token_id: int) -> bytes:
        """A token's bytes as logprobs show them (control tokens by name)."""
        return self.api.engine.piece(token_id, special=True)

    def take_logprobs(self) -> list[TokenLogprob]:
        """The logprobs of tokens fed since the last call."""
        new = self.logprobs[self._logprobs_taken:]
        self._logprobs_taken = len(self.logprobs)
        return new

    def _feed(self, token: Token) -> list[Delta]:
        if not token.is_terminal:
            self.generated_ids.append(token.id)
        # an end-of-turn token is no text; a control token the parser reads is
        if token.logprob is not None and (token.piece or token.id in self.api.shown):
            self.logprobs.append(TokenLogprob(token.id, token.logprob, token.top))
        piece = self.api.shown.get(token.id, token.piece) if self.output.reads_markers else token.piece
        deltas, hit = self.output.feed(piece)
        if hit:
            self.stop_hit = True
            self.api.runtime.cancel(self.g)
        return deltas

    def _shown(self, deltas: list[Delta]) -> list[Delta]:
        """The deltas the format shows: reasoning only where the surface has a field for it."""
        return deltas if self.fmt.shows_reasoning else [d for d in deltas if not isinstance(d, ReasoningDelta)]

    def _end(self, reason: str) -> list[Delta]:
        """The last deltas; sets finish_reason and remembers a complete chat reply.
        A generation cancelled for any reason but a stop string was cut short: that is
        an error, never a normal finish."""
        if reason == "cancelled" and not self.stop_hit:
            raise errors.unavailable("the generation was cancelled before it finished")
        deltas = self.output.finish()
        self.finish_reason = "tool_calls" if self.output.calls else "stop" if reason == "cancelled" else reason
        # A reply cut by a stop string ("cancelled") holds ids the client never saw, and
        # one with reasoning holds ids of text the client does not send back.
        if self.fmt.remembers_replies and self.g.reuse and reason in ("stop", "length") and not self.output.reasoning:
            calls = [(c["function"]["name"], c["function"]["arguments"]) for c in self.output.tool_calls()]
            self.g.slot.remember_reply(reply_fingerprint(self.output.content(), calls), self.generated_ids)
        return deltas

    @property
    def last(self) -> bool:
        """The current choice is the reply's last."""
        return self.index == self.n - 1

    def choices(self) -> list[Choice]:
        """The finished choices and the current one, in order."""
        return self.done + [Choice(self.index, self.g, self.output, self.finish_reason, self.logprobs)]

    def _next_choice(self) -> None:
        self.done = self.choices()
        self.index += 1
        self.g, self.output = self.more.generation(self.index), self.more.output()
        self.finish_reason, self.generated_ids, self.logprobs, self._logprobs_taken = None, [], [], 0
        self.stop_hit = False
        self.api.runtime.submit(self.g)

    @property
    def first(self) -> Generation:
        """The first choice's generation: it prefilled (and scored) the prompt."""
        return self.done[0].g if self.done else self.g

    def usage(self) -> dict:
        prompt, done = len(self.g.prompt), sum(c.g.generated for c in self.choices())
        return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done,
                "prompt_tokens_details": {"cached_tokens": self.first.plan.keep},
                "completion_tokens_details": {"reasoning_tokens": sum(c.output.reasoning_tokens
                                                                      for c in self.choices())}}

    def extensions(self) -> dict:
        return {"timings": self.first.timings(), "session_reset_reason": self.first.plan.reason}

    async def collect(self, request: HttpRequest) -> dict:
        watcher = asyncio.create_task(self._cancel_on_disconnect(request))
        try:
            for i in range(self.n):
                if i:
                    if request.disconnected.is_set():
                        break
                    self._next_choice()
                async for kind, value in self._events(ping=False):
                    if kind == "token":
                        self._feed(value)
                    elif kind == "error":
                        raise as_api_error(value)
                    elif kind == "end":
                        self._end(value)
        finally:
            watcher.cancel()
        return self.fmt.body(self)

    async def _cancel_on_disconnect(self, request: HttpRequest) -> None:
        await request.disconnected.wait()
        self.api.runtime.cancel(self.g)

    async def stream(self, request: HttpRequest) -> AsyncIterator[bytes]:
        try:
            for i in range(self.n):
                if i:
                    self._next_choice()
                for frame in self.fmt.start(self):
                    yield frame
                async for kind, value in self._events(ping=True):
                    if kind == "ping":
                        yield sse.PING
                    elif kind == "progress":
                        for frame in self.fmt.progress(self, value):
                            yield frame
                    elif kind == "token":
                        for frame in self.fmt.deltas(self, self._shown(self._feed(value))):
                            yield frame
                    else:
                        try:
                            if kind == "error":
                                raise as_api_error(value)
                            frames = self.fmt.deltas(self, self._shown(self._end(value)))
                        except ApiError as err:
                            for frame in self.fmt.error(self, err):
                                yield frame
                            return
                        for frame in frames:
                            yield frame
                for frame in self.fmt.end(self):
                    yield frame
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
