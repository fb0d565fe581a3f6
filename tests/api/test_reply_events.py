"""A reply's events from its generation: `: ping` comments while the generation is
silent (a long prompt being processed), and no event lost or reordered by them."""
import asyncio
from types import SimpleNamespace

from llmd.api import reply as reply_module
from llmd.api.reply import Reply


class QueueRuntime:
    """The runtime's hand-over of a generation's events (next_event), over a queue."""

    def __init__(self):
        self.events = asyncio.Queue()

    async def next_event(self, g) -> tuple[str, object]:
        return await self.events.get()


def reply_over(runtime: QueueRuntime) -> Reply:
    return Reply(SimpleNamespace(runtime=runtime, model="m"), SimpleNamespace(id="r"), g=None, output=None,
                 session_id=None, prompt="")


async def test_a_silent_generation_is_pinged_and_every_event_follows_in_order(monkeypatch):
    monkeypatch.setattr(reply_module, "PING_SECONDS", 0.02)
    runtime = QueueRuntime()
    loop = asyncio.get_running_loop()
    loop.call_later(0.1, runtime.events.put_nowait, ("progress", {}))  # after several ping intervals
    loop.call_later(0.1, runtime.events.put_nowait, ("token", 1))
    loop.call_later(0.2, runtime.events.put_nowait, ("token", 2))
    loop.call_later(0.2, runtime.events.put_nowait, ("end", "stop"))
    seen = [event async for event in reply_over(runtime)._events(ping=True)]
    assert seen[0] == ("ping", None)  # the first deadline comes before the first event
    assert [e for e in seen if e[0] != "ping"] == [("progress", {}), ("token", 1), ("token", 2), ("end", "stop")]
    assert runtime.events.empty()


async def test_without_pings_a_silent_generation_is_awaited(monkeypatch):
    monkeypatch.setattr(reply_module, "PING_SECONDS", 0.02)
    runtime = QueueRuntime()
    asyncio.get_running_loop().call_later(0.1, runtime.events.put_nowait, ("end", "length"))
    assert [event async for event in reply_over(runtime)._events(ping=False)] == [("end", "length")]
