"""Grammar compiles for requests: one at a time on a thread of their own, taken from
the API keys in turn.

A large schema compiles for seconds of pure Python (the GIL lets no second thread go
faster), and in asyncio's shared pool a few of them would hold up every request's
template rendering, so compiles get a thread of their own. Its queue is fair between
API keys: each key's compiles wait in a line of their own and the thread takes the
next compile from each key in turn, so a key sending many new schemas delays another
key's by the compile running and one of its own at most, not by all of them. A
grammar compiled before (llmd.structured.constrain's cache) is taken at once, without
queueing; a compile whose client has reset (or whose request was cancelled) is skipped.
"""
from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor

from llmd import errors
from llmd.structured import constrain

COMPILER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmd-grammar")


class GrammarQueue:
    def __init__(self) -> None:
        # API key -> its compiles waiting (spec, the future its request awaits, its client's
        # disconnected event); the next key first
        self._lines: OrderedDict[str, deque[tuple[str, asyncio.Future, asyncio.Event]]] = OrderedDict()
        self._busy = False  # a compile of this queue runs on the thread

    async def grammar(self, spec: str | None, key: str = "", gone: asyncio.Event | None = None) -> str | None:
        """The grammar text of a constrain spec for a request made with the API key
        `key` (`gone`: set when its client disconnects): cached at once, else compiled
        in the key's turn; None for free output."""
        if spec is None:
            return None
        if (text := constrain.cached(spec)) is not None:
            return text
        done = asyncio.get_running_loop().create_future()
        self._lines.setdefault(key, deque()).append((spec, done, gone or asyncio.Event()))
        self._next()
        return await done

    def _next(self) -> None:
        """Start the next key's first waiting compile, if none runs."""
        while not self._busy and self._lines:
            key, line = next(iter(self._lines.items()))
            spec, done, gone = line.popleft()
            if line:
                self._lines.move_to_end(key)
            else:
                del self._lines[key]
            if done.done():  # its request was cancelled
                continue
            if gone.is_set():
                done.set_exception(errors.client_closed())
                continue
            self._busy = True
            job = asyncio.get_running_loop().run_in_executor(COMPILER, constrain.compile_spec, spec)
            job.add_done_callback(lambda job, done=done: self._finished(job, done))

    def _finished(self, job: asyncio.Future, done: asyncio.Future) -> None:
        self._busy = False
        if not done.done():
            if job.cancelled():
                done.cancel()
            elif job.exception() is not None:
                done.set_exception(job.exception())
            else:
                done.set_result(job.result())
        self._next()
