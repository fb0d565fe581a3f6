"""A whole server in the test's own process: runtime, session table (with a session
store when given one), API and HTTP server on a free port, over a model file."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable

from llmd.api.access import AccessPolicy, Guard
from llmd.api.answers import transport_refusal
from llmd.api.routes import Api, App, Options
from llmd.engine.native import Engine
from llmd.http.server import HttpServer
from llmd.prompt import templates
from llmd.serving.metrics import ServerMetrics
from llmd.serving.runtime import Runtime
from llmd.serving.session_store import SessionStore
from llmd.serving.sessions import SessionTable
from tests.conformance.client import Client


@dataclass
class Stack:
    client: Client  # its base URL ends in /v1; the served model is "model"
    engine: Engine
    runtime: Runtime
    table: SessionTable
    server: HttpServer
    stop: Callable[[], Awaitable[None]]  # closes server, table and runtime; again does nothing


async def start_stack(model: Path, *, max_sessions: int, n_ctx: int = 0, kv_budget: int = 0,
                      speculative: str = "ngram", draft: bool = False, eviction: str = "lru",
                      prefix_cache: str = "key", store: Path | None = None, max_bytes: int = 0,
                      fingerprint: str = "tiny", save_delay: float = 0, api_keys: tuple[str, ...] = ()) -> Stack:
    """Serve `model` on one engine thread, speculating as `speculative` says (with
    `draft`, the model is its own draft model); with `store`, sessions go to files in
    that directory (SessionStore of max_bytes and fingerprint) `save_delay` seconds
    after their turns; with `api_keys`, every route but /health asks for one of them."""
    runtime = Runtime(ServerMetrics(), speculative="draft" if draft else speculative)
    engine = await runtime.load(str(model), str(model) if draft else None, n_threads=1, max_sessions=max_sessions,
                                n_ctx=n_ctx, kv_budget_bytes=kv_budget)
    session_store = None
    if store is not None:
        session_store = SessionStore(store, max_bytes, fingerprint, engine.info.n_ctx)
        session_store.scan()
    table = SessionTable(engine, runtime.call, capacity=runtime.capacity, eviction=eviction, store=session_store,
                         save_delay=save_delay, draft_engine=runtime.draft_engine)
    await table.start()
    app = App()
    app.api = Api(engine, runtime, table, templates.load_template(engine.info.chat_template, None, engine),
                  Options(["model"], prefix_cache=prefix_cache))
    server = HttpServer(Guard(app, AccessPolicy(api_keys)) if api_keys else app, refusal=transport_refusal)
    await server.start("127.0.0.1", 0)

    async def stop() -> None:
        if runtime.executor._shutdown:
            return
        await server.close(grace=1)
        await table.close()
        await runtime.close()

    return Stack(Client(f"http://127.0.0.1:{server.port}/v1", model="model"), engine, runtime, table, server, stop)
