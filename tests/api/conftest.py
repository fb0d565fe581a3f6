"""Fixtures of the API tests."""
from __future__ import annotations

import pytest_asyncio

from tests.support.stack import start_stack


@pytest_asyncio.fixture
async def stack(tiny_llama_factory):
    """Start servers over a tiny model; each records the generations it runs."""
    stops = []

    async def start(max_sessions=5, prefix_cache="key", model=tiny_llama_factory(n_ctx=512).path, store=None):
        s = await start_stack(model, max_sessions=max_sessions, prefix_cache=prefix_cache, store=store)
        runtime = s.runtime
        runtime.submitted, runtime.queue_lengths = [], []
        submit = runtime.submit

        def recording(g):
            runtime.submitted.append(g)
            submit(g)
            runtime.queue_lengths.append(runtime.queued)

        runtime.submit = recording
        stops.append(s.stop)
        return s.client, runtime, s.table

    yield start
    for stop in stops:
        await stop()
