"""The grammar queue (llmd/api/grammar_queue.py): compiles run one at a time, the API
keys take turns, cached grammars and free output never wait, and a compile whose
request went away is skipped."""
import asyncio
import threading

import pytest

from llmd.api.grammar_queue import GrammarQueue
from llmd.errors import ApiError
from llmd.structured import constrain


@pytest.fixture
def compiles(monkeypatch):
    """Compiles that wait for the test: `started` lists their specs in the order the
    thread took them; `gate.set()` lets them all run."""
    started, gate = [], threading.Event()

    def compile_spec(spec: str) -> str:
        started.append(spec)
        gate.wait(30)
        if spec == "bad":
            raise ValueError("no grammar")
        return f"grammar of {spec}"

    monkeypatch.setattr(constrain, "compile_spec", compile_spec)
    monkeypatch.setattr(constrain, "cached", lambda spec: "cached grammar" if spec == "known" else None)
    return started, gate


async def until(condition) -> None:
    for _ in range(3000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


async def test_keys_take_turns_and_nothing_cached_waits(compiles):
    started, gate = compiles
    queue = GrammarQueue()
    first = asyncio.ensure_future(queue.grammar("b0", "busy"))
    await until(lambda: started == ["b0"])  # on the thread, holding it
    flood = [asyncio.ensure_future(queue.grammar(f"b{i}", "busy")) for i in range(1, 5)]
    quiet = asyncio.ensure_future(queue.grammar("q0", "quiet"))
    await asyncio.sleep(0)
    assert await queue.grammar(None, "quiet") is None and await queue.grammar("known", "quiet") == "cached grammar"
    gate.set()
    assert await quiet == "grammar of q0" and await first == "grammar of b0"
    assert [await f for f in flood] == [f"grammar of b{i}" for i in range(1, 5)]
    assert started == ["b0", "b1", "q0", "b2", "b3", "b4"]  # the quiet key's turn came after one of busy's


async def test_a_failed_compile_fails_its_request_alone_and_gone_ones_are_skipped(compiles):
    started, gate = compiles
    queue = GrammarQueue()
    running = asyncio.ensure_future(queue.grammar("first", "k"))
    await until(lambda: started == ["first"])
    left = asyncio.Event()
    bad, cancelled, disconnected, good = (asyncio.ensure_future(queue.grammar(spec, "k", gone))
                                          for spec, gone in (("bad", None), ("cancelled", left),
                                                             ("disconnected", left), ("good", None)))
    await asyncio.sleep(0)
    cancelled.cancel()  # its request ended while it waited (its client gone too)
    left.set()  # its client went away while it waited
    gate.set()
    with pytest.raises(ValueError, match="no grammar"):
        await bad
    with pytest.raises(ApiError) as info:
        await asyncio.wait_for(disconnected, 30)
    assert info.value.status == 499
    assert await running == "grammar of first" and await asyncio.wait_for(good, 30) == "grammar of good"
    assert started == ["first", "bad", "good"]
