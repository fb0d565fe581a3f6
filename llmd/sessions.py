"""The session table: which engine session serves a request, and admission.

A request names its session (body `session_id`, else the first non-empty of the
SESSION_HEADERS) or none. Named sessions keep their KV cache between requests.
Anonymous requests use the scratch slot, or, while it is busy and capacity is
free, a temporary slot that is freed afterwards, so concurrent anonymous
requests still run side by side. Capacity comes from the engine: one slot stays
for the scratch session, named sessions share the rest. A full table evicts the
least recently used idle named session (policy "lru") or answers 429 ("none").

Every slot has an asyncio.Lock, so requests for one session run one at a time
in arrival order (asyncio locks wake waiters first-in first-out).
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Iterable

from llmd import errors
from llmd.engine import Engine, Session

SESSION_HEADERS = ("x-executorch-session-id", "session_id", "x-session-affinity", "x-session-id")
MAX_SESSION_ID = 128
MAX_REPLIES = 64  # assistant replies remembered per session (their generated ids)


def session_id_of(body_id: str | None, headers) -> str | None:
    """The request's session id (body first, then headers in order), validated."""
    sid = body_id
    if sid is None:
        sid = next((v for h in SESSION_HEADERS if (v := headers.get(h))), None)
    if sid is None:
        return None
    if not 1 <= len(sid) <= MAX_SESSION_ID or not all(0x21 <= ord(c) <= 0x7E for c in sid):
        raise errors.invalid_session_id(
            "session id must be 1-128 printable ASCII characters without spaces (0x21-0x7E)")
    return sid


def reply_fingerprint(content: str | None, calls: Iterable[tuple[str, str]]) -> str:
    """Identifies an assistant reply by what the client sees of it: its content and
    its tool calls as (name, arguments JSON text)."""
    text = json.dumps([content or "", [list(c) for c in calls]], ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(eq=False)
class Slot:
    """One engine session and what we know of its KV cache."""

    id: str | None                  # None for the scratch slot and temporary slots
    session: Session
    resident: list[int] = field(default_factory=list)  # ids in the KV cache, in order
    dirty: bool = False             # KV cache may disagree with `resident`: reset before use
    temporary: bool = False
    deleted: bool = False
    users: int = 0                  # requests holding or waiting for the slot
    last_used: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # reply_fingerprint -> the ids the model generated for that reply, so a resent
    # reply is fed back exactly as the cache holds it (re-tokenizing may differ).
    replies: OrderedDict[str, list[int]] = field(default_factory=OrderedDict)

    def remember_reply(self, fingerprint: str, ids: list[int]) -> None:
        self.replies[fingerprint] = ids
        self.replies.move_to_end(fingerprint)
        while len(self.replies) > MAX_REPLIES:
            self.replies.popitem(last=False)


class SessionTable:
    """Named sessions, the scratch slot and capacity admission."""

    def __init__(self, engine: Engine, call: Callable[..., Awaitable], *, capacity: int,
                 eviction: str = "lru", scratch_reuse: bool = False):
        self.engine = engine
        self._call = call               # runs a function on the engine's executor thread
        self.capacity = capacity        # slots in all, scratch included
        self.eviction = eviction
        self.scratch_reuse = scratch_reuse
        self.named: dict[str, Slot] = {}
        self.temporary = 0
        self.creating = 0               # named slots being created (capacity reserved)
        self.retiring = 0               # deleted slots whose engine session is still in use
        self.evictions = 0
        self.scratch: Slot | None = None

    async def start(self) -> None:
        self.scratch = Slot(None, await self._call(self.engine.new_session))

    def _free_slots(self) -> int:
        return self.capacity - 1 - len(self.named) - self.temporary - self.creating - self.retiring

    async def acquire(self, session_id: str | None) -> Slot:
        """The slot for a request, locked for it; release() it when done.

        Raises ApiError 400 unsupported_session or 429 capacity_exhausted before
        the request has produced any output."""
        while True:
            slot = await self._admit(session_id)
            slot.users += 1
            try:
                await slot.lock.acquire()
            except BaseException:
                slot.users -= 1
                raise
            if not slot.deleted:
                return slot
            await self.release(slot)  # deleted while we waited: start over with a fresh slot

    async def _admit(self, session_id: str | None) -> Slot:
        if session_id is None:
            if (self.scratch.users == 0 and not self.scratch.lock.locked()) or self._free_slots() <= 0:
                return self.scratch
            self.temporary += 1
            try:
                return Slot(None, await self._call(self.engine.new_session), temporary=True)
            except BaseException:
                self.temporary -= 1
                raise
        if (slot := self.named.get(session_id)) is not None:
            return slot
        if self.capacity <= 1:
            raise errors.unsupported_session()
        if self._free_slots() <= 0:
            victim = self._eviction_victim()
            if victim is None:
                raise errors.capacity_exhausted(
                    retry_after=1, message=f"all {self.capacity - 1} named session slots are in use")
            await self.delete(victim.id)
            self.evictions += 1
        self.creating += 1
        try:
            slot = Slot(session_id, await self._call(self.engine.new_session))
        finally:
            self.creating -= 1
        # Another request may have created the same session while we awaited.
        if (existing := self.named.get(session_id)) is not None:
            await self._call(slot.session.close)
            return existing
        self.named[session_id] = slot
        return slot

    def _eviction_victim(self) -> Slot | None:
        if self.eviction != "lru":
            return None
        idle = [s for s in self.named.values() if s.users == 0]
        return min(idle, key=lambda s: s.last_used, default=None)

    async def release(self, slot: Slot) -> None:
        slot.users -= 1
        slot.last_used = time.monotonic()
        slot.lock.release()
        if slot.temporary or slot.deleted:
            await self._retire(slot)

    async def _retire(self, slot: Slot) -> None:
        """Free a temporary or deleted slot's engine session once nobody uses it."""
        if slot.users == 0 and slot.session is not None:
            session, slot.session = slot.session, None
            if slot.temporary:
                self.temporary -= 1
            else:
                self.retiring -= 1
            await self._call(session.close)

    async def delete(self, session_id: str) -> bool:
        """Forget a named session and free its memory (after its current request)."""
        slot = self.named.pop(session_id, None)
        if slot is None:
            return False
        slot.deleted = True
        self.retiring += 1  # until _retire closes its engine session
        if slot.users:
            slot.session.stop()  # its running generation ends at the next token
        await self._retire(slot)
        return True

    async def reset(self, session_id: str) -> bool:
        """Clear a named session's context; it keeps its slot."""
        slot = self.named.get(session_id)
        if slot is None:
            return False
        slot.replies.clear()
        if slot.users == 0:
            await self._call(slot.session.reset)
            slot.resident = []
            slot.dirty = False
        else:
            slot.dirty = True  # the next request starts from an empty cache
        return True

    @property
    def in_use(self) -> int:
        """Slots counted against capacity: named, temporary and being created."""
        return self.capacity - 1 - self._free_slots()

    def _lasting_slots(self) -> list[Slot]:
        return [*self.named.values(), *([self.scratch] if self.scratch else [])]

    @property
    def waiting(self) -> int:
        """Requests waiting for a session that an earlier request holds."""
        return sum(s.users - s.lock.locked() for s in self._lasting_slots())

    @property
    def resident_tokens(self) -> int:
        """Tokens held in the KV caches of named sessions and the scratch session."""
        return sum(len(s.resident) for s in self._lasting_slots())

    def describe(self, slot: Slot) -> dict:
        return {
            "id": slot.id,
            "object": "session",
            "resident_tokens": len(slot.resident),
            "kv_bytes": len(slot.resident) * self.engine.info.kv_bytes_per_token
                        + (self.engine.info.kv_ring_bytes if slot.resident else 0),
            "idle_seconds": round(time.monotonic() - slot.last_used, 3) if slot.users == 0 else 0.0,
            "in_flight": slot.users,
        }

    async def close(self) -> None:
        for sid in list(self.named):
            await self.delete(sid)
        if self.scratch is not None:
            await self._call(self.scratch.session.close)
            self.scratch = None
