"""Fixtures of the API tests."""
from __future__ import annotations

import pytest_asyncio

from llmd.api.answers import transport_refusal
from llmd.api.routes import Api, App, Options
from llmd.http.server import HttpServer
from llmd.prompt import templates
from llmd.serving.metrics import ServerMetrics
from llmd.serving.runtime import Runtime
from llmd.serving.session_store import SessionStore
from llmd.serving.sessions import SessionTable
from tests.conformance.client import Client


@pytest_asyncio.fixture
async def stack(tiny_llama_factory):
    """Start servers over a tiny model; each records the generations it runs."""
    stops = []

    async def start(max_sessions=5, prefix_cache="key", model=tiny_llama_factory(n_ctx=512).path, store=None):
        runtime = Runtime(ServerMetrics())
        engine = await runtime.load(str(model), n_threads=1, max_sessions=max_sessions)
        if store is not None:
            store = SessionStore(store, 0, "tiny", engine.info.n_ctx)
            store.scan()
        table = SessionTable(engine, runtime.call, capacity=engine.info.max_sessions, store=store, save_delay=0)
        await table.start()
        app = App()
        app.api = Api(engine, runtime, table, templates.load_template(engine.info.chat_template, None, engine),
                      Options(["model"], prefix_cache=prefix_cache))
        server = HttpServer(app, refusal=transport_refusal)
        await server.start("127.0.0.1", 0)
        runtime.submitted, runtime.queue_lengths = [], []
        submit = runtime.submit

        def recording(g):
            runtime.submitted.append(g)
            submit(g)
            runtime.queue_lengths.append(runtime.queued)

        runtime.submit = recording

        async def stop():
            await server.close(grace=1)
            await table.close()
            await runtime.close()

        stops.append(stop)
        return Client(f"http://127.0.0.1:{server.port}/v1", model="model"), runtime, table

    yield start
    for stop in stops:
        await stop()
