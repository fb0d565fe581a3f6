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
import logging
import random
import re
import time
from dataclasses import asdict, dataclass, field
from typing import AsyncIterator, Callable, Sequence
from urllib.parse import unquote

from llmd import errors
from llmd.api import anthropic, embeddings, ollama, rerank, validation
from llmd.api.answers import error_response, error_shape, json_response
from llmd.api.chat_completions import ChatCompletionFormat, parse_chat_request
from llmd.api.completions import CompletionFormat, parse_completion_request
from llmd.api.grammar_queue import GrammarQueue
from llmd.api import llama_cpp
from llmd.api.reply import Choices, Format, Output, Reply, ReplyContext, ReplyStream
from llmd.api.responses import (CompactionFormat, ResponsesFormat, ResponseStore, StoredResponse, conversation_session,
                                 parse_compact_request, parse_responses_request)
from llmd.api.session_routes import SessionRoutes
from llmd.api.tokenizer import TextLimit, TokenizerRoutes
from llmd.api.validation import parse
from llmd.engine.native import POOLING_RANK, Engine, FimTokens, Sampling, UnsupportedError
from llmd.errors import ApiError
from llmd.http.server import HttpRequest, Response, StreamResponse
from llmd.prompt import infill, templates
from llmd.serving import metrics
from llmd.serving.prefill import cache_scope
from llmd.serving.runtime import Generation, Runtime, watch
from llmd.serving.sessions import Lease, SessionTable, cache_key_session, reply_fingerprint, session_id_of
from llmd.serving.speculative import N_MAX, DraftLimits
from llmd.structured import constrain

# The status page's scripts and styles are inline; nothing may come from elsewhere.
PAGE_HEADERS = [("Cache-Control", "no-cache"), ("X-Content-Type-Options", "nosniff"),
                ("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; "
                                            "style-src 'unsafe-inline'; img-src data:")]

log = logging.getLogger("llmd.api")


def key_scope(request: HttpRequest) -> str:
    """Whose stored state a request may see: the API key it authenticated with (the
    access guard's digest of it); on a server without API keys, a digest of the key the
    client presents ("" without one)."""
    if request.principal:
        return request.principal
    presented = request.headers.get("x-api-key")
    if presented is None:
        scheme, _, token = (request.headers.get("authorization") or "").strip().partition(" ")
        presented = token.strip() if scheme.lower() == "bearer" else ""
    return hashlib.sha256(presented.encode("latin-1")).hexdigest() if presented else ""


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
    draft_max: int = N_MAX        # longest speculative proposal unless a request says (--draft-max)
    speculative: str = "ngram"    # the drafter (--speculative)
    draft_model: str | None = None  # the draft model's id, with --speculative draft


@dataclass
class PromptIds:
    """A prompt as token ids. `replies` maps the token span [start, end) of an earlier
    assistant reply to that reply's fingerprint, so the ids the session generated for
    it can stand in for the re-tokenized text."""

    tokens: list[int]
    bos: int | None = None  # prepended unless the prompt already starts with it
    replies: dict[tuple[int, int], str] = field(default_factory=dict)

    def ids(self, generated: Sequence[tuple[str, list[int]]] = (), resident: Sequence[int] = ()) -> list[int]:
        """The ids, each reply the session remembers (`generated`: Slot.replies) as it
        was generated. When it remembers one text generated as several lists of ids, the
        list its cache (`resident`) holds at that place is taken, else the newest."""
        ids = [self.bos] if self.bos is not None and self.tokens[:1] != [self.bos] else []
        at = 0
        for (start, end), fingerprint in sorted(self.replies.items()):
            known = [reply for fp, reply in generated if fp == fingerprint]
            if known:
                ids += self.tokens[at:start]
                ids += next((reply for reply in known if resident[len(ids):len(ids) + len(reply)] == reply), known[-1])
                at = end
        return ids + self.tokens[at:]


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
        watch(self.metrics, runtime, table, lambda: self.queued)
        self.page_html = importlib.resources.files("llmd").joinpath("static/index.html").read_bytes()
        self.created = int(time.time())
        self.waiting = 0  # generation requests waiting for their session's slot
        self.text_limit = TextLimit(engine)
        # The control tokens a chat's tool format writes reach its parser as their text
        # (a Mistral model's [TOOL_CALLS] opens its calls), and constrained calls write them.
        markers = () if isinstance(template, templates.Unavailable) else templates.output_markers(template)
        self.shown = templates.control_pieces(engine, markers)
        self.controls = {piece.decode(): i for i, piece in self.shown.items()}
        self.reply_context = ReplyContext(runtime, options.model_ids[0], engine.piece, self.shown,
                                          options.log_prompts, table.turn_ended)
        tokenizer, sessions = TokenizerRoutes(engine, runtime, self.text_limit), SessionRoutes(engine, table)
        self.routes: list[tuple[re.Pattern, dict[str, object]]] = [
            (re.compile(r"/"), {"GET": self.page}),
            (re.compile(r"/metrics"), {"GET": self.metrics_text}),
            (re.compile(r"/health"), {"GET": self.health}),
            (re.compile(r"(?:/v1)?/models"), {"GET": self.models}),
            (re.compile(r"(?:/v1)?/models/(?P<model>.+)"), {"GET": self.model}),  # ids may hold "/"
            (re.compile(r"(?:/v1)?/chat/completions"), {"POST": self.chat_completions}),
            (re.compile(r"(?:/v1)?/completions"), {"POST": self.completions}),
            (re.compile(r"(?:/v1)?/responses"), {"POST": self.create_response}),
            (re.compile(r"(?:/v1)?/responses/compact"), {"POST": self.compact_conversation}),
            (re.compile(r"(?:/v1)?/messages"), {"POST": self.create_message}),
            (re.compile(r"(?:/v1)?/messages/count_tokens"), {"POST": self.count_message_tokens}),
            (re.compile(r"(?:/v1)?/embeddings"), {"POST": self.embeddings}),
            (re.compile(r"(?:/v1)?/rerank"), {"POST": self.rerank}),
            (re.compile(r"(?:/v1)?/reranking"), {"POST": self.rerank}),  # llama.cpp's other name
            (re.compile(r"/api/chat"), {"POST": self.ollama_chat}),
            (re.compile(r"/api/generate"), {"POST": self.ollama_generate}),
            (re.compile(r"/api/embed"), {"POST": self.ollama_embed}),
            (re.compile(r"/api/embeddings"), {"POST": self.ollama_embeddings}),
            (re.compile(r"/api/tags"), {"GET": self.ollama_tags}),
            (re.compile(r"/api/ps"), {"GET": self.ollama_ps}),
            (re.compile(r"/api/show"), {"POST": self.ollama_show}),
            (re.compile(r"/api/version"), {"GET": self.ollama_version}),
            (re.compile(r"/completion"), {"POST": self.llama_completion}),
            (re.compile(r"/infill"), {"POST": self.infill}),
            (re.compile(r"/tokenize"), {"POST": tokenizer.tokenize}),
            (re.compile(r"/detokenize"), {"POST": tokenizer.detokenize}),
            (re.compile(r"/apply-template"), {"POST": self.apply_template}),
            (re.compile(r"/props"), {"GET": self.props}),
            (re.compile(r"/v1/sessions"), {"GET": sessions.list_sessions}),
            (re.compile(r"/v1/sessions/(?P<sid>[^/]+)"),
             {"GET": sessions.get_session, "DELETE": sessions.delete_session}),
            (re.compile(r"/v1/sessions/(?P<sid>[^/]+)/reset"), {"POST": sessions.reset_session}),
        ]
        self.route_labels = {pattern: route_label(pattern) for pattern, _ in self.routes}
        self.responses = ResponseStore()
        self.grammars = GrammarQueue()
        self.pooling = engine.pooling_type()  # 0: the model makes no embeddings

    def _route(self, path: str) -> tuple[re.Pattern, dict, re.Match] | None:
        """The route a path takes: its pattern, its handlers by method, and the match."""
        for pattern, methods in self.routes:
            if (m := pattern.fullmatch(path)) is not None:
                return pattern, methods, m
        return None

    async def __call__(self, request: HttpRequest) -> Response | StreamResponse:
        try:
            if (route := self._route(request.path)) is None:
                raise errors.not_found(f"no route for {request.path}")
            _, methods, m = route
            method = "GET" if request.method == "HEAD" else request.method
            handler = methods.get(method)
            if handler is None:
                raise errors.method_not_allowed(sorted(methods) + (["HEAD"] if "GET" in methods else []))
            # A path's parameters percent-decoded: a session id may hold "/", "?" or "%"
            return await handler(request, **{k: unquote(v) for k, v in m.groupdict().items()})
        except ApiError as err:
            return error_response(err, error_shape(request.path))

    def count(self, path: str | None, status: int) -> None:
        """Count an answer in llmd_requests_total under its route's pattern ("unmatched":
        no route, or refused before its path was read), so metrics stay bounded."""
        route = self._route(path) if path is not None else None
        self.metrics.requests.inc(route=self.route_labels[route[0]] if route else "unmatched", status=str(status))

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
                         "n_vocab": self.info.n_vocab, "max_sessions": self.table.capacity,
                         "kernels": self.info.kernels, "kv_type_k": self.info.kv_type_k,
                         "kv_type_v": self.info.kv_type_v, "kv_bytes_per_token": self.info.kv_bytes_per_token,
                         "bytes_per_session": self.info.bytes_per_session,
                         "speculative": self.options.speculative,
                         **({"draft_model": self.options.draft_model,
                             "draft_bytes_per_session": self.runtime.draft_engine.info.bytes_per_session}
                            if self.runtime.draft_engine is not None else {})}}

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
                                         req.template_kwargs, None, req.continue_final)
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

    # ---- generation ------------------------------------------------------------

    async def chat_completions(self, request: HttpRequest) -> Response | StreamResponse:
        req = await parse(parse_chat_request, request.body)
        fmt = ChatCompletionFormat(req.include_usage, req.logprobs is not None, req.timings_per_token)
        return await self._chat(request, req, self._session_of(req, request), fmt)

    async def create_response(self, request: HttpRequest) -> Response | StreamResponse:
        req = await parse(parse_responses_request, request.body)
        scope, chat_req, previous = key_scope(request), req.chat, None
        if req.previous_response_id is not None:
            previous = self.responses.get(scope, req.previous_response_id, request.principal)
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
            self.responses.put(scope, response_id, StoredResponse(history + [reply], sid), request.principal)

        fmt.on_done = store if req.store else None
        return await self._chat(request, chat_req, sid, fmt)

    async def compact_conversation(self, request: HttpRequest) -> Response:
        """The conversation (a stored one and/or input items) as its user messages and
        one compaction item: the model's summary of the rest."""
        req = await parse(parse_compact_request, request.body)
        chat_req, history = req.chat, req.input
        previous = None
        if req.previous_response_id is not None:
            previous = self.responses.get(key_scope(request), req.previous_response_id, request.principal)
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
        return json_response(await self._embed(await parse(embeddings.parse_embeddings_request, request.body),
                                               request))

    async def _embed(self, req: embeddings.EmbeddingsRequest, request: HttpRequest, normalized: bool = True) -> dict:
        """The embeddings list object of a request (/v1/embeddings, Ollama's /api/embed;
        its older /api/embeddings answers the vectors as pooled, not normalised)."""
        self._check_model(req.model)
        if self.pooling == 0:
            raise errors.invalid_request("This model has no pooling: its GGUF declares no pooling type, so it "
                                         "makes no embeddings. Serve an embedding model.", "model",
                                         "model_has_no_pooling")
        if self.pooling == POOLING_RANK:
            raise errors.invalid_request("This model is a reranker (its GGUF declares rank pooling): it scores "
                                         "documents against a query at POST /v1/rerank, and makes no embeddings.",
                                         "model", "model_is_reranker")
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
                self.text_limit.check(item, param)
                item = embeddings.input_ids(await self.runtime.call(self.engine.tokenize, item), bos, eos)
            else:
                validation.check_token_ids(item, self.info.n_vocab, param)
            if len(item) > self.info.n_ctx:
                raise errors.context_length_exceeded(len(item), self.info.n_ctx, param)
            inputs.append(item)
        async def each() -> AsyncIterator[list[int]]:
            for ids in inputs:
                yield ids

        try:
            vectors, _ = await self._pool(each(), request.disconnected)
        except UnsupportedError as exc:  # non-causal attention: the engine says why
            raise errors.unsupported_parameter("model", f"This model's embeddings cannot be computed: {exc}.")
        return embeddings.body([embeddings.normalize(v) for v in vectors] if normalized else vectors,
                               req.encoding_format, self.options.model_ids[0], sum(map(len, inputs)))

    async def rerank(self, request: HttpRequest) -> Response:
        req = await parse(rerank.parse_rerank_request, request.body)
        if req.model is not None:
            self._check_model(req.model)
        if self.pooling != POOLING_RANK or not self.info.n_labels:
            raise errors.invalid_request("This model is not a reranker: its GGUF declares no rank pooling "
                                         "(<arch>.pooling_type 4) with a classifier head. Serve a reranker such as "
                                         "Qwen3-Reranker.", "model", "model_not_reranker")
        if not self.info.rerank_template:
            raise errors.invalid_request("This reranker's GGUF has no rerank prompt (tokenizer.chat_template.rerank) "
                                         "to put the query and a document in.", "model", "model_not_reranker")
        self.text_limit.check(req.query, "query")
        param = "texts" if req.tei else "documents"
        for i, document in enumerate(req.documents):
            self.text_limit.check(document, f"{param}[{i}]")

        async def prompts() -> AsyncIterator[list[int]]:
            # Each prompt holds the query: made as its turn comes, one at a time in memory.
            for i, document in enumerate(req.documents):
                text, markers = rerank.prompt(self.info.rerank_template, req.query, document)
                ids, _ = await self.runtime.call(self.engine.tokenize_marked, text, markers)
                if len(ids) > self.info.n_ctx:
                    raise errors.context_length_exceeded(len(ids), self.info.n_ctx, f"{param}[{i}]")
                yield ids

        try:
            outputs, tokens = await self._pool(prompts(), request.disconnected)
        except UnsupportedError as exc:  # non-causal attention: the engine says why
            raise errors.unsupported_parameter("model", f"This reranker's scores cannot be computed: {exc}.")
        return json_response(rerank.body([labels[0] for labels in outputs], req, self.options.model_ids[0], tokens))

    async def _pool(self, inputs: AsyncIterator[list[int]], gone: asyncio.Event) -> tuple[list[list[float]], int]:
        """Each input's pooled output (Session.embed) from a session of its own lease,
        emptied first: an input resumes from the start it shares with the request's
        input before it (a reranker's documents), never from another request's, which
        another API key may have sent; and the inputs' tokens. The inputs stop once
        `gone` is set (the client went away)."""
        self._admit()
        self.waiting += 1
        try:
            lease = await self.table.acquire(None)
        finally:
            self.waiting -= 1
        slot, outputs, tokens = lease.slot, [], 0
        try:
            # The cache ends up holding an input, no conversation's prefix.
            slot.resident, slot.dirty = [], True
            await self.runtime.call(slot.session.reset)
            async for ids in inputs:  # one call per input: generations step in between
                if gone.is_set():
                    raise errors.client_closed()
                outputs.append(await self.runtime.call(slot.session.embed, ids))
                tokens += len(ids)
        finally:
            lease.release()
        return outputs, tokens

    # ---- Ollama's API (llmd/api/ollama.py) ---------------------------------------

    def _ollama_model(self, name: str) -> str:
        """A model name as Ollama's clients send it: the served id, or the id with
        Ollama's default tag (`id:latest`)."""
        bare = name.removesuffix(":latest")
        return bare if bare in self.options.model_ids and name not in self.options.model_ids else name

    async def ollama_chat(self, request: HttpRequest) -> Response | StreamResponse:
        started = time.perf_counter()
        req = await parse(ollama.parse_chat_request, request.body)
        req = dataclasses.replace(req, model=self._ollama_model(req.model))
        if not req.messages:  # Ollama's way to load a model: it is loaded
            self._check_model(req.model)
            return json_response(ollama.loaded(req.model, True, request.body))
        return await self._chat(request, req, self._session_of(req, request),
                                ollama.OllamaFormat(True, started, self.options.model_ids[0]))

    async def ollama_generate(self, request: HttpRequest) -> Response | StreamResponse:
        started = time.perf_counter()
        req = await parse(ollama.parse_generate_request, request.body)
        req = dataclasses.replace(req, model=self._ollama_model(req.model))
        fmt = ollama.OllamaFormat(False, started, self.options.model_ids[0])
        if isinstance(req, validation.CompletionRequest):
            self._check_model(req.model)
            if not req.prompt and not req.suffix:
                return json_response(ollama.loaded(req.model, False, request.body))
            return await self._completion(request, req, fmt)
        if not req.messages:
            self._check_model(req.model)
            return json_response(ollama.loaded(req.model, False, request.body))
        return await self._chat(request, req, self._session_of(req, request), fmt)

    async def ollama_embed(self, request: HttpRequest) -> Response:
        started = time.perf_counter()
        req = await parse(ollama.parse_embed_request, request.body)
        response = await self._embed(dataclasses.replace(req, model=self._ollama_model(req.model)), request)
        return json_response({"model": req.model, "embeddings": [d["embedding"] for d in response["data"]],
                              "total_duration": int((time.perf_counter() - started) * 1e9), "load_duration": 0,
                              "prompt_eval_count": response["usage"]["prompt_tokens"]})

    async def ollama_embeddings(self, request: HttpRequest) -> Response:
        req = await parse(ollama.parse_embeddings_request, request.body)
        req = dataclasses.replace(req, model=self._ollama_model(req.model))
        if not req.inputs:  # Ollama answers an empty prompt with no vector
            self._check_model(req.model)
            return json_response({"embedding": []})
        return json_response({"embedding": (await self._embed(req, request, normalized=False))["data"][0]["embedding"]})

    async def _ollama_models(self, running: bool) -> list[dict]:
        header_bytes, file_bytes = await self.runtime.call(self.engine.file_layout)
        digest = hashlib.sha256(f"{self.info.name}\0{header_bytes}\0{file_bytes}".encode()).hexdigest()
        family = self.info.architecture
        details = {"parent_model": "", "format": "gguf", "family": family, "families": [family],
                   "parameter_size": "", "quantization_level": ""}
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.created))
        return [{"name": m, "model": m, "size": file_bytes, "digest": digest, "details": details,
                 **({"expires_at": "2318-01-01T00:00:00Z", "size_vram": 0, "context_length": self.info.n_ctx}
                    if running else {"modified_at": when})}
                for m in self.options.model_ids]

    async def ollama_tags(self, request: HttpRequest) -> Response:
        return json_response({"models": await self._ollama_models(running=False)})

    async def ollama_ps(self, request: HttpRequest) -> Response:
        return json_response({"models": await self._ollama_models(running=True)})

    async def ollama_show(self, request: HttpRequest) -> Response:
        model = await parse(ollama.parse_show_request, request.body)
        self._check_model(self._ollama_model(model))
        template = self.template
        tools = isinstance(template, templates.ChatTemplate) or (
            isinstance(template, templates.JinjaTemplate) and "tools" in template.source)
        thinks = templates.reasoning_start(template, "") is not None or (
            not isinstance(template, templates.Unavailable) and templates.tool_format(template) == "harmony")
        capabilities = ["embedding"] if self.pooling else [
            "completion", *(["tools"] if tools else []), *(["insert"] if self.info.fim is not None else []),
            *(["thinking"] if thinks else [])]
        arch, listed = self.info.architecture, (await self._ollama_models(running=False))[0]
        return json_response({
            "license": "", "modelfile": "", "parameters": "",
            "template": "" if isinstance(template, templates.Unavailable) else template.source,
            "details": listed["details"],
            # the context served (a longer prompt is refused, where Ollama would cut it)
            "model_info": {"general.architecture": arch, "general.name": self.info.name,
                           f"{arch}.context_length": self.info.n_ctx,
                           f"{arch}.embedding_length": self.info.n_embd,
                           f"{arch}.block_count": self.info.n_layer, f"{arch}.attention.head_count": self.info.n_head,
                           f"{arch}.attention.head_count_kv": self.info.n_head_kv,
                           "tokenizer.ggml.bos_token_id": self.info.bos_id,
                           "tokenizer.ggml.eos_token_id": self.info.eos_id},
            "capabilities": capabilities, "modified_at": listed["modified_at"]})

    async def ollama_version(self, request: HttpRequest) -> Response:
        return json_response({"version": ollama.VERSION})

    def _session_of(self, req: validation.ChatRequest | validation.CompletionRequest,
                    request: HttpRequest) -> str | None:
        """The body's session_id, else a session header, else the prompt_cache_key's session."""
        return session_id_of(req.session_id, request.headers) or cache_key_session(req.prompt_cache_key)

    async def _chat(self, request: HttpRequest, req: validation.ChatRequest, sid: str | None,
                    fmt: Format) -> Response | StreamResponse:
        """Generate the assistant's reply to a conversation, shaped by fmt."""
        self._check_model(req.model)
        validation.check_vocab(req, self.info.n_vocab)
        validation.check_continuable(req)
        prompt, rendered, tools = await self._chat_prompt(req)
        reasoning = templates.reasoning_start(self.template, rendered.text, rendered.prefill)
        if req.reasoning and reasoning is None and templates.tool_format(self.template) != "harmony":
            raise errors.unsupported_parameter(req.reasoning_param, f"'{req.reasoning_param}' asks for reasoning, "
                                               "but the served model does not reason: its chat template has no "
                                               "reasoning block.")
        spec = constrain.chat_spec(req, templates.call_layout(self.template), self.controls, reasoning is True)
        grammar = await self.grammars.grammar(spec, request.principal, request.disconnected)
        return await self._generate(request, prompt, rendered.text, req, sid, tools, grammar, fmt,
                                    reasoning=reasoning)

    async def _chat_prompt(self, req: validation.ChatRequest) -> tuple[PromptIds, templates.Prompt,
                                                                        list[dict] | None]:
        """The conversation rendered by the chat template: its ids, the rendering and the
        tools it offers (None when tool_choice is "none")."""
        tools = [asdict(t) for t in req.tools] if req.tool_choice != "none" else []
        kwargs = req.template_kwargs
        if req.reasoning is False and templates.tool_format(self.template) == "harmony":
            raise errors.unsupported_parameter(req.reasoning_param, f"'{req.reasoning_param}' turns reasoning off, "
                                               "but gpt-oss always reasons; ask for a low reasoning effort instead.")
        if req.reasoning is False and isinstance(self.template, templates.JinjaTemplate) and self.template.thinks:
            kwargs = {**kwargs, "enable_thinking": False}  # Qwen3's switch; a template without one refuses it
        # a Jinja template over a long conversation takes milliseconds: off the event loop
        rendered = await asyncio.to_thread(self._render, req.messages, tools, True, kwargs, req.template_params,
                                           req.continue_final)
        self.text_limit.check(rendered.text, "messages")
        tokens = await self.runtime.call(templates.tokenize_prompt, rendered, self.engine.tokenize_marked)
        prompt = self._prompt_ids(tokens.ids)
        for index, span in tokens.replies.items():
            m = req.messages[index]
            prompt.replies[span] = reply_fingerprint(m.content, [(c.name, c.arguments) for c in m.tool_calls])
        return prompt, rendered, tools or None

    async def completions(self, request: HttpRequest) -> Response | StreamResponse:
        req = await parse(parse_completion_request, request.body)
        self._check_model(req.model)
        validation.check_vocab(req, self.info.n_vocab)
        if req.echo and not isinstance(req.prompt, str):
            echoed = (await self.runtime.call(self.engine.detokenize, req.prompt)).decode("utf-8", "replace")
        else:
            echoed = req.prompt if req.echo else ""
        fmt = CompletionFormat(req.include_usage, echoed, req.logprobs is not None, req.timings_per_token)
        return await self._completion(request, req, fmt, prompt_logprobs=req.logprobs if req.echo else None)

    async def _completion(self, request: HttpRequest, req: validation.CompletionRequest, fmt: Format,
                          prompt_logprobs: int | None = None) -> Response | StreamResponse:
        """A checked completion request's prompt (with a suffix, the code before the gap
        and after it, the model writing the middle), generated and shaped by fmt."""
        sid = self._session_of(req, request)
        grammar = await self.grammars.grammar(constrain.completion_spec(req), request.principal,
                                              request.disconnected)
        if req.suffix:
            if isinstance(req.prompt, str):
                self.text_limit.check(req.prompt, "prompt")
            self.text_limit.check(req.suffix, "suffix")
            fim = self._fim_tokens("suffix")
            prompt = self._prompt_ids((await self.runtime.call(infill.build, fim, self.engine.tokenize, req.prompt,
                                                               req.suffix)).ids)
        else:
            prompt = await self._completion_prompt(req.prompt)
        return await self._generate(request, prompt, req.prompt, req, sid, None, grammar, fmt,
                                    prompt_logprobs=prompt_logprobs)

    async def llama_completion(self, request: HttpRequest) -> Response | StreamResponse:
        req = await parse(llama_cpp.parse_completion_request, request.body)
        c = req.completion
        if c.model:  # optional here, as on llama.cpp's server
            self._check_model(c.model)
        validation.check_vocab(c, self.info.n_vocab)
        return await self._llama(request, req, await self._completion_prompt(c.prompt))

    async def infill(self, request: HttpRequest) -> Response | StreamResponse:
        req = await parse(llama_cpp.parse_infill_request, request.body)
        c, fill = req.completion, req.infill
        if c.model:
            self._check_model(c.model)
        validation.check_vocab(c, self.info.n_vocab)
        fim = self._fim_tokens(None)
        # The text typed after the prefix is kept whole; of the rest only what can fit is tokenized.
        self.text_limit.check(fill.middle, "prompt")
        prefix, suffix, extra, clipped = infill.clip(c.prompt, fill.suffix, fill.extra, self.text_limit.max_bytes)
        if sum(len(f.filename) for f in extra) > self.text_limit.max_bytes:
            raise errors.invalid_request("Invalid value for 'input_extra': its file names are longer than the "
                                         "whole context.", "input_extra")
        # Twice the tokens asked for (128 when it is not said; at most half the context)
        # stays free, as llama.cpp keeps it.
        n_ctx = self.info.n_ctx
        reserve = 2 * (infill.PREDICT if c.max_tokens is None else c.max_tokens)
        room = n_ctx - min(reserve, n_ctx // 2) - int(self.info.add_bos)
        built = await self.runtime.call(infill.build, fim, self.engine.tokenize, prefix, suffix, fill.middle, extra,
                                        room)
        return await self._llama(request, req, self._prompt_ids(built.ids), clipped or built.truncated)

    async def _llama(self, request: HttpRequest, req: llama_cpp.LlamaRequest, prompt: PromptIds,
                     truncated: bool = False) -> Response | StreamResponse:
        """A /completion or /infill reply, in llama.cpp's shape; `id_slot` N is the
        session slot-N unless the request names one."""
        c = req.completion
        shown = (await self.runtime.call(self.engine.detokenize, prompt.ids(), True)).decode("utf-8", "replace")
        sid = self._session_of(c, request) or (f"slot-{req.id_slot}" if req.id_slot >= 0 else None)
        return await self._generate(request, prompt, c.prompt, c, sid, None, None,
                                    llama_cpp.LlamaFormat(req, self.info.n_ctx, shown, truncated),
                                    limits=lambda: infill.LineLimits(req.n_indent, req.t_max_predict_ms))

    def _fim_tokens(self, param: str | None) -> FimTokens:
        """The model's fill-in-the-middle tokens; 400 naming `param` without them."""
        if self.info.fim is None:
            raise errors.invalid_request("This model has no fill-in-the-middle tokens (a prefix, a suffix and a "
                                         "middle marker in its vocabulary), so it cannot fill in code; serve a "
                                         "code model that has them, such as Qwen2.5-Coder.", param, "model_has_no_fim")
        return self.info.fim

    def _render(self, messages: list[validation.Message], tools: list[dict], add_generation_prompt: bool = True,
                template_kwargs: dict | None = None, template_params: dict | None = None,
                continue_final: bool = False) -> templates.Prompt:
        """The chat prompt (templates.render_chat); 400 when there is no usable template or
        it refuses the input. template_params names the request field that set a template
        variable, for the 400 when the template has no use for it."""
        if isinstance(self.template, templates.Unavailable):
            raise errors.invalid_request(self.template.reason, "messages")
        try:
            return templates.render_chat(self.template, [asdict(m) for m in messages], tools or None,
                                         add_generation_prompt, template_kwargs, continue_final)
        except templates.UnsupportedToolsError as exc:
            raise errors.unsupported_parameter("tools" if tools else "messages", str(exc))
        except templates.UnusedVariableError as exc:
            param = (template_params or {}).get(exc.name) or (
                "reasoning_effort" if exc.name == "reasoning_effort" else f"chat_template_kwargs.{exc.name}")
            raise errors.unsupported_parameter(param, str(exc))
        except templates.ChatTemplateError as exc:
            raise errors.invalid_request(str(exc), "messages")

    async def _completion_prompt(self, prompt: str | list[int]) -> PromptIds:
        """A completion's prompt: text, whose control-token text is read as those tokens
        (as llama.cpp's server reads it), BOS first if the model wants it; or ids as given."""
        if isinstance(prompt, list):
            return PromptIds(list(prompt))
        self.text_limit.check(prompt, "prompt")
        return self._prompt_ids(await self.runtime.call(self.engine.tokenize, prompt, True))

    def _prompt_ids(self, ids: list[int]) -> PromptIds:
        """A tokenized prompt, BOS first if the model wants it."""
        return PromptIds(ids, self.info.bos_id if self.info.add_bos else None)

    def _sampling(self, s: validation.Sampling) -> Sampling:
        return Sampling(
            temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p,
            seed=(s.seed if s.seed is not None else random.getrandbits(64)) & 0xFFFFFFFFFFFFFFFF,
            repeat_penalty=s.repetition_penalty, repeat_last_n=s.repeat_last_n, presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty, logit_bias=dict(s.logit_bias), infill=s.infill)

    def _draft_limits(self, s: validation.Speculative) -> DraftLimits | None:
        """A request's bounds on speculative proposals (None: it does not speculate)."""
        if not s.enabled:
            return None
        limits = DraftLimits(self.options.draft_max if s.n_max is None else s.n_max, s.n_min or 0)
        if limits.n_min > limits.n_max:
            raise errors.invalid_request(f"'speculative.n_min' ({limits.n_min}) exceeds the longest proposal "
                                         f"({limits.n_max})", "speculative.n_min")
        return limits

    @property
    def queued(self) -> int:
        """Generation requests waiting to start: for their session's slot, or for their
        first step."""
        return self.waiting + self.runtime.queued

    def _admit(self) -> None:
        """Refuse with 503 while max_queue generations wait to start."""
        queued = self.queued
        if self.options.max_queue and queued >= self.options.max_queue:
            raise errors.unavailable(f"{queued} generations are waiting to start, this server's "
                                     "limit; retry later", retry_after=1)

    async def _generate(self, request: HttpRequest, prompt: PromptIds, prompt_text: str | list[int],
                        req: validation.ChatRequest | validation.CompletionRequest, sid: str | None,
                        tools: list[dict] | None, grammar: str | None, fmt: Format,
                        prompt_logprobs: int | None = None, reasoning: bool | None = None,
                        limits: Callable[[], infill.LineLimits] | None = None) -> Response | StreamResponse:
        n_ctx = self.info.n_ctx
        ids = prompt.ids()
        if not ids:
            raise errors.invalid_request("the prompt is empty", "prompt")
        if len(ids) >= n_ctx:
            raise errors.context_length_exceeded(len(ids), n_ctx, fmt.prompt_param)
        self._admit()
        self.waiting += 1
        try:
            lease = await self.table.acquire(sid, request.principal)  # 400 / 429 here, before any byte
        finally:
            self.waiting -= 1
        try:
            slot = lease.slot
            # A session's own cache, and the replies it remembers, serve only the scope that
            # filled them (its API key and cache_salt, even with --prefix-cache off): another
            # scope's request starts it over (dirty: emptied before use, even should this
            # request end before its prefill).
            owner = cache_scope("key" if self.options.prefix_cache == "off" else self.options.prefix_cache,
                                request.principal, req.cache_salt)
            if slot.owner not in (None, owner):
                slot.dirty = True
                slot.replies.clear()
            slot.owner = owner
            reuse = not slot.temporary and (sid is not None or self.options.scratch_reuse)
            if reuse and prompt.replies and len(spliced := prompt.ids(slot.replies, slot.resident)) < n_ctx:
                ids = spliced
            # Like the room left in the context, the operator's cap clamps max_tokens;
            # finish_reason "length" tells the client it was reached.
            cap = min(self.options.max_tokens_limit or n_ctx, n_ctx - len(ids))
            max_tokens = cap if req.max_tokens is None else min(req.max_tokens, cap)
            sampling = self._sampling(req.sampling)
            speculative = self._draft_limits(req.speculative)
            scope = None if self.options.prefix_cache == "off" else owner  # the prefix cache's (cache_scope)

            def generation(index: int, spare: Lease | None = None) -> Generation:
                """Choice `index`, with its own seed. On the reply's slot, where after the
                first the prompt is in the cache, choice n - 1 holds the lease (Reply
                settles it when the reply ends otherwise: Choices.lease). On a `spare`
                slot, a fork: its generation holds that slot's lease, and the prefix cache
                gives it the prompt the first choice holds (Reply forks once that one decodes)."""
                return Generation(slot if spare is None else spare.slot, ids,
                                  dataclasses.replace(sampling, seed=(sampling.seed + index) & 2**64 - 1),
                                  max_tokens, reuse=spare is None and (reuse or index > 0), cache_scope=scope,
                                  grammar=grammar, logprobs=req.logprobs,
                                  prompt_logprobs=prompt_logprobs if index == 0 else None,
                                  progress=req.return_progress and req.stream and index == 0,
                                  speculative=speculative, fork=spare is not None,
                                  lease=spare or (lease if index == req.n - 1 else None))

            g = generation(0)
            self.runtime.submit(g)  # from here a generation releases the lease when it ends
        except BaseException:
            lease.release()
            raise
        def new_output() -> Output:
            return Output(req.stop, tools, reasoning, templates.tool_format(self.template),
                          limits() if limits else None)
        # The choices after the first run beside it on slots of their own while the table
        # has room, where the prefix cache hands them the first one's prompt; else after it.
        forks = req.n > 1 and scope is not None and self.runtime.warm_resume and self.info.kv_shares_prefixes
        reply = Reply(self.reply_context, fmt, g, new_output(), sid, prompt_text,
                      Choices(req.n, generation, new_output, lease, self.table.spare if forks else None))
        if req.stream:
            response = StreamResponse(200, ReplyStream(reply, request), content_type=fmt.stream_type)
            reply.log = response.log
            return response
        try:
            return json_response(await reply.collect(request), log=reply.log)
        finally:
            reply.close()


class App:
    """The HTTP application: answers /health with 503 until the model is loaded and
    again once the server drains for shutdown, then hands every request to the Api.
    While draining, requests already in flight run on; new ones but /metrics are
    refused with 503, which a balancer retries on another instance."""

    def __init__(self) -> None:
        self.api: Api | None = None
        self.draining = False

    def answered(self, path: str | None, status: int) -> None:
        """The HTTP server's report of an answer (refusals by it and the access guard
        included): counted once the model is loaded."""
        if self.api is not None:
            self.api.count(path, status)

    async def __call__(self, request: HttpRequest) -> Response | StreamResponse:
        if request.path == "/health" and (self.api is None or self.draining):
            return json_response({"status": "draining" if self.draining else "loading"}, 503,
                                 headers=[("Retry-After", "1")])
        if self.draining and request.path != "/metrics":
            return error_response(errors.unavailable("the server is shutting down", retry_after=1),
                                  error_shape(request.path))
        if self.api is not None:
            return await self.api(request)
        return error_response(errors.unavailable("the model is loading", retry_after=1))
