"""The session table: which engine session serves a request, admission, and the
lifetime of every engine session.

A request names its session (body `session_id`, else the first non-empty of the
SESSION_HEADERS) or none. Named sessions keep their KV cache between requests.
Session ids are per API key (session_key): two keys' "chat-1" are two sessions, and
no key can use, see, reset or delete another's.
Anonymous requests use the scratch slot, or, while it is busy and capacity is
free, a temporary slot that is freed afterwards, so concurrent anonymous
requests still run side by side; a request's extra choices (n > 1) take spare
temporary slots while more than one slot is free (spare). Capacity comes from
the engine: one slot stays for the scratch session, named sessions share the
rest. A full table evicts the least recently used idle named session of the
requesting API key or of one holding more (policy "lru"; _eviction_victim), else
answers 429 (and always under "none").

Every slot has an asyncio.Lock, so requests for one session run one at a time
in arrival order (asyncio locks wake waiters first-in first-out). `acquire`
returns a Lease; the generation that runs on it releases it when it ends (see
llmd.serving.runtime), and releasing twice does nothing.

Lifetime. The table alone opens and frees engine sessions, and it never does so
from a request's own await: admission is synchronous up to the moment capacity
is reserved (a new slot enters the table at once, so concurrent first requests
for one new id share it), the engine session is opened by a call the table owns
(a request that goes away while waiting does not cancel it), and a temporary,
deleted or evicted slot's session is freed by a call queued on the executor
without waiting for it. The executor runs calls in the order they were queued,
so a freed session is gone before any session opened after it: the engine never
holds more sessions than the table has reserved, whatever order clients and
operators act in. `engine_sessions` counts what the table holds; it equals the
engine's own `live_sessions()` whenever the executor is idle. With a draft model
(llmd.serving.draft_model), each slot's draft session is opened in the call that opens
its engine session and freed in the call that frees it, so the draft engine's
`live_sessions()` equals `engine_sessions` too.

Sessions on disk (llmd.serving.session_store, with --session-dir). A named session
idle for `save_delay` seconds (IDLE_SAVE_SECONDS; 0: at the end of every turn, see
turn_ended), evicted, or still in the table when the server closes, is exported on
the executor (before its engine session is freed) and its file written on a worker
thread, unless its file already holds what it holds; so a session evicted after a
pause costs its next request nothing, and a crash loses at most what came after the
last save. A new named slot reads the id's file while its engine session opens, then
loads it into the session if the store accepts it, so its first request finds
`resident` as the file left it. A slot remembers the version of the file its state
came from or last went to (`version`), which its saves must find in the file (the
store's ownership rule); before each request on a slot, a file that another instance
sharing the directory has advanced since is loaded into the session in place of what
it holds (the session moved away and back). DELETE and reset remove the file. Disk
operations for one id run in order (a load waits for the id's pending write or
removal), and never on the event loop.
"""
from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Iterable

from llmd import errors
from llmd.engine.native import Engine, EngineError, Session
from llmd.serving.draft_model import DraftSession, open_draft_session
from llmd.serving.session_store import CONFLICT, Saved, SessionStore, session_key, shown

log = logging.getLogger("llmd.sessions")

SESSION_HEADERS = ("x-executorch-session-id", "session_id", "x-session-affinity", "x-session-id")
MAX_SESSION_ID = 128
MAX_REPLIES = 64  # assistant replies remembered per session (their generated ids)
IDLE_SAVE_SECONDS = 10.0  # with a session store: a named session idle this long is written to it


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


def cache_key_session(prompt_cache_key: str | None) -> str | None:
    """The session a `prompt_cache_key` names when no session id is given: a digest,
    so any key is a valid id and never one a client chose by name."""
    if prompt_cache_key is None:
        return None
    return "pck-" + hashlib.sha256(prompt_cache_key.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def canonical_arguments(arguments: str) -> str:
    """Tool-call arguments in one form: compact JSON, keys in their order, non-ASCII as
    is. Clients re-serialise the arguments they send back (JSON.stringify, indent=2);
    comparing in this form recognises them as the call the model made. Text that is
    not JSON is its own form."""
    try:
        return json.dumps(json.loads(arguments), ensure_ascii=False, separators=(",", ":"))
    except ValueError:
        return arguments


def reply_fingerprint(content: str | None, calls: Iterable[tuple[str, str]]) -> str:
    """Identifies an assistant reply by what the client sees of it: its content and
    its tool calls as (name, arguments JSON text), the arguments in canonical form so
    that a client's re-serialisation still matches."""
    text = json.dumps([content or "", [[name, canonical_arguments(args)] for name, args in calls]],
                      ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(eq=False)
class Slot:
    """One engine session and what we know of its KV cache."""

    id: str | None                  # the client's id; None for the scratch slot and temporary slots
    session: Session | None = None  # None while it is being opened, and once freed
    draft: DraftSession | None = None  # its draft model's session, with a draft model (opened and freed with it)
    resident: list[int] = field(default_factory=list)  # ids in the KV cache, in order
    dirty: bool = False             # KV cache may disagree with `resident`: reset before use
    owner: str | None = None        # the scope (prefill.cache_scope) of the last request on it, None: none yet
    principal: str = ""             # the API key (digest) whose session it is, "" without keys
    temporary: bool = False
    deleted: bool = False           # left the table (DELETE or eviction); freed when unused
    users: int = 0                  # requests holding or waiting for the slot
    opening: asyncio.Future | None = None  # the engine call opening `session`
    failure: BaseException | None = None   # why opening failed
    freed: bool = False
    save: bool = False              # written to the session store when freed (evicted, shutdown)
    turns: int = 0                  # requests that ended on it (with a session store)
    saved_turns: int = -1           # `turns` when the store last wrote its file
    version: int = 0                # of the session's file its state came from or last went to (0: none)
    last_used: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # (reply_fingerprint, the ids the model generated for that reply), oldest first, so
    # a resent reply is fed back exactly as the cache holds it (re-tokenizing may
    # differ). One text may come with several lists of ids: a model can generate the
    # same text as other tokens (bytes of invalid UTF-8 all read U+FFFD).
    replies: list[tuple[str, list[int]]] = field(default_factory=list)

    @property
    def key(self) -> str | None:
        """Its name in the table and the store (session_key); None when unnamed."""
        return None if self.id is None else session_key(self.principal, self.id)

    def remember_reply(self, fingerprint: str, ids: list[int]) -> None:
        if (fingerprint, ids) in self.replies:
            self.replies.remove((fingerprint, ids))
        self.replies.append((fingerprint, ids))
        del self.replies[:-MAX_REPLIES]


class Lease:
    """A request's hold on a slot; `release()` gives it back, once."""

    def __init__(self, table: SessionTable, slot: Slot):
        self.table, self.slot = table, slot
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.table._release(self.slot)


class SessionTable:
    """Named sessions, the scratch slot, capacity admission, and engine session lifetime."""

    def __init__(self, engine: Engine, call: Callable[..., Awaitable], *, capacity: int,
                 eviction: str = "lru", scratch_reuse: bool = False, store: SessionStore | None = None,
                 save_delay: float = IDLE_SAVE_SECONDS, draft_engine: Engine | None = None):
        self.engine = engine
        self.draft_engine = draft_engine  # opens a draft session beside each engine session
        # Queues a function on the engine's executor thread at once and returns an
        # awaitable of its result (Runtime.call).
        self._call = call
        self.capacity = capacity        # slots in all, scratch included
        self.eviction = eviction
        self.scratch_reuse = scratch_reuse
        self.named: dict[str, Slot] = {}  # session_key -> slot
        self.temporary = 0              # temporary slots not yet freed
        self.retiring = 0               # deleted slots not yet freed (in use or opening)
        self.evictions = 0
        self.engine_sessions = 0        # engine sessions opened and not yet closed
        self.scratch: Slot | None = None
        self._pending: set[asyncio.Future] = set()  # engine calls and disk work the table queued
        self.store = store
        self.save_delay = save_delay    # seconds idle before a named session is saved (0: after each turn)
        self._disk: dict[str, asyncio.Future] = {}   # session_key -> its last disk operation
        self._closing = False

    async def start(self) -> None:
        scratch = Slot(None)
        self._open(scratch)
        await asyncio.shield(scratch.opening)
        if scratch.failure is not None:
            raise scratch.failure
        self.scratch = scratch

    def _free_slots(self) -> int:
        return self.capacity - 1 - len(self.named) - self.temporary - self.retiring

    async def acquire(self, session_id: str | None, principal: str = "") -> Lease:
        """A lease on the slot for a request made with the API key `principal`, locked
        for it; the request's generation releases it (Lease.release) when it ends.

        Raises ApiError 400 unsupported_session or 429 capacity_exhausted before
        the request has produced any output."""
        while True:
            slot = self._admit(session_id, principal)
            lease = await self._lease(slot)
            if not slot.deleted:
                return lease
            lease.release()  # deleted while we waited: start over with a fresh slot

    async def spare(self) -> Lease | None:
        """A lease on a new temporary slot, once its session is open, if the table has
        room for it and for the next request after it; else None, at once. It never
        waits for room, evicts, or takes the scratch slot or the last free one (which
        stays for a new session or a concurrent request). For work that may as well
        run later on a slot the request holds already (the choices of a reply with
        n > 1)."""
        return await self._lease(self._temporary()) if self._free_slots() > 1 else None

    async def _lease(self, slot: Slot) -> Lease:
        """The slot, locked for a request once its session is open (and, for a named
        one, up to date with its file)."""
        slot.users += 1
        try:
            await slot.lock.acquire()
        except BaseException:
            slot.users -= 1
            self._settle(slot)
            raise
        lease = Lease(self, slot)
        try:
            if slot.opening is not None:
                await asyncio.shield(slot.opening)
            if slot.failure is not None:
                raise slot.failure
            if self.store is not None and slot.id is not None and not slot.deleted:
                await self._refresh(slot)
        except BaseException:
            lease.release()
            raise
        return lease

    def _temporary(self) -> Slot:
        """A new temporary slot, its capacity reserved and its session opening."""
        self.temporary += 1
        slot = Slot(None, temporary=True)
        self._open(slot)
        return slot

    def _admit(self, session_id: str | None, principal: str) -> Slot:
        """The slot for a request, with capacity reserved; no await, so no other
        request can take the room between the check and the reservation."""
        if session_id is None:
            if self.scratch.users == 0 or self._free_slots() <= 0:
                return self.scratch
            return self._temporary()
        if (slot := self.get(session_id, principal)) is not None:
            return slot
        if self.capacity <= 1:
            raise errors.unsupported_session()
        if self._free_slots() <= 0:
            victim = self._eviction_victim(principal)
            if victim is None:
                raise errors.capacity_exhausted(
                    retry_after=1, message=f"all {self.capacity - 1} named session slots are in use")
            victim.save = True
            self._forget(victim)
            self.evictions += 1
        slot = Slot(session_id, principal=principal)
        self.named[slot.key] = slot
        self._open(slot)
        return slot

    def _eviction_victim(self, principal: str) -> Slot | None:
        """Under "lru", for a new session of the API key `principal`: an idle session of
        that key or of one holding more sessions than it, the least recently used of the
        key holding the most. So a key evicts only its own sessions or those of a key
        with more; never another's that holds as many or fewer, busy or not (then None:
        429). Without API keys, the least recently used idle session."""
        if self.eviction != "lru":
            return None
        held = collections.Counter(s.principal for s in self.named.values())
        idle = [s for s in self.named.values()
                if s.users == 0 and (s.principal == principal or held[s.principal] > held[principal])]
        return min(idle, key=lambda s: (-held[s.principal], s.last_used), default=None)

    # ---- engine session lifetime (see the module doc) -------------------------

    def _queue(self, work: Awaitable, done: Callable[[asyncio.Future], None] | None = None) -> asyncio.Future:
        future = asyncio.ensure_future(work)
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)
        if done is not None:
            future.add_done_callback(done)
        return future

    def _open(self, slot: Slot) -> None:
        opened = self._call(self._new_session, slot)  # queued now, in order with the frees
        if self.store is not None and slot.id is not None:
            opened = self._restore(slot, opened)
        slot.opening = self._queue(opened, lambda f: self._opened(slot, f))

    def _new_session(self, slot: Slot) -> Session:
        """On the executor thread: a new engine session for the slot, and its draft session."""
        session = self.engine.new_session()
        if self.draft_engine is not None:
            try:
                slot.draft = open_draft_session(self.draft_engine)
            except BaseException:
                session.close()
                raise
        return session

    def _free(self, slot: Slot, session: Session) -> None:
        """Queue the freeing of the slot's engine session and its draft session."""
        draft, slot.draft = slot.draft, None

        def close() -> None:
            session.close()
            if draft is not None:
                draft.session.close()

        self._queue(self._call(close), self._closed)

    async def _restore(self, slot: Slot, opened: Awaitable[Session]) -> Session:
        """The slot's new engine session, holding what its file saved, if the store
        accepts it; a refused or unreadable file leaves it empty (cold)."""
        loading = asyncio.ensure_future(self._load(slot))  # the file is read while the session opens
        try:
            session = await opened
        except BaseException:
            loading.cancel()
            raise
        try:
            saved, slot.version = await loading
            if saved is not None:
                def restore() -> list[int]:
                    session.import_state(saved.payload)
                    return session.tokens()

                slot.resident = await self._call(restore)
                slot.replies, slot.owner = list(saved.replies), saved.owner
                self.store.count_loaded()
                log.info("session %s restored from disk: %d tokens", shown(slot.key), len(slot.resident))
        except EngineError as exc:
            log.warning("the engine refused the saved state of session %s: %s; it starts cold", shown(slot.key), exc)
            self.store.count_refused()
        except BaseException:
            self.engine_sessions += 1  # counted here, as _opened would have: _closed uncounts it
            self._free(slot, session)
            raise
        return session

    async def _load(self, slot: Slot) -> tuple[Saved | None, int]:
        """The slot's saved session if the store accepts it, and the version of its file
        (0: none); a refused file's version too, so that a save may replace it."""
        if (earlier := self._disk.get(slot.key)) is not None:
            await asyncio.gather(earlier, return_exceptions=True)
        if (saved := await asyncio.to_thread(self.store.load, slot.key)) is not None:
            n_vocab = self.engine.info.n_vocab
            if all(0 <= i < n_vocab for _, ids in saved.replies for i in ids):
                return saved, saved.version
            log.warning("session file of %s refused: a reply it remembers holds a token id outside the "
                        "vocabulary; it starts cold", shown(slot.key))
            self.store.count_refused()
            return None, saved.version
        return None, await asyncio.to_thread(self.store.version, slot.key) or 0

    async def _refresh(self, slot: Slot) -> None:
        """Before a request on the slot: if another instance has written the session's
        file since this one loaded or wrote it, load that newer state into the session."""
        if (earlier := self._disk.get(slot.key)) is not None:  # this instance's own save first
            await asyncio.gather(earlier, return_exceptions=True)
        version = await asyncio.to_thread(self.store.version, slot.key)
        if version is None or version == slot.version:
            return
        saved, slot.version = await self._load(slot)
        if saved is None:
            return
        session = slot.session
        # Until the import has run, nothing of the cache is trusted: a request that
        # goes away meanwhile leaves the next one a dirty (cold) session, never a
        # `resident` that the cache does not hold.
        slot.resident, slot.dirty = [], True

        def restore() -> list[int]:
            session.import_state(saved.payload)
            return session.tokens()

        try:
            resident = await asyncio.shield(self._call(restore))
        except EngineError as exc:
            log.warning("the engine refused the saved state of session %s: %s; it runs cold", shown(slot.key), exc)
            self.store.count_refused()
            return
        slot.resident, slot.dirty, slot.replies, slot.owner = resident, False, list(saved.replies), saved.owner
        slot.saved_turns = slot.turns
        self.store.count_loaded()
        log.info("session %s reloaded from disk: version %d, written by another instance, %d tokens",
                 shown(slot.key), saved.version, len(resident))

    def _on_disk(self, key: str, work: Callable[[], Awaitable]) -> None:
        """Run work() after the session's earlier disk operations, tracked like engine calls."""
        earlier = self._disk.get(key)

        async def run() -> None:
            if earlier is not None:
                await asyncio.gather(earlier, return_exceptions=True)
            await work()

        future = self._disk[key] = self._queue(run())
        future.add_done_callback(lambda f: self._disk.pop(key) if self._disk.get(key) is f else None)

    def _save(self, slot: Slot, session: Session, why: str) -> None:
        """Export the slot's cache on the executor (queued before anything that follows,
        such as the session's free) and write it to the store on a worker thread;
        nothing to do when its file already holds what it holds."""
        if slot.dirty or not slot.resident or slot.saved_turns == slot.turns:
            return
        # `resident` is a prefix of what the cache holds: exactly that is saved.
        keep, replies, owner, turns = len(slot.resident), list(slot.replies), slot.owner, slot.turns
        exported = self._call(session.export_state, keep)
        slot.saved_turns = turns  # so that an eviction while this save runs does not export again

        async def write() -> None:
            try:
                payload = await exported
                # The base is read only now, after this id's earlier saves have run.
                version = await asyncio.to_thread(self.store.save, slot.key, payload, replies, keep,
                                                  slot.version, owner)
            except EngineError as exc:
                log.warning("session %s could not be exported: %s; not saved", shown(slot.key), exc)
                version = None
            if version is None:  # not written: try again at the next occasion
                if slot.saved_turns == turns:
                    slot.saved_turns = -1
            elif version != CONFLICT:  # (after a conflict, the next request here reloads the file)
                slot.version = version
                log.info("session %s saved to disk (%s): %d tokens, version %d", shown(slot.key), why, keep, version)

        self._on_disk(slot.key, write)

    def _save_idle(self, slot: Slot, turns: int, why: str = "idle") -> None:
        """Save a named session that has seen no request since `turns`."""
        if slot.turns == turns and not slot.users and not slot.deleted and slot.session is not None:
            self._save(slot, slot.session, why)

    def turn_ended(self, slot: Slot) -> Awaitable | None:
        """A request's generation has ended and its reply is complete and remembered
        (Slot.remember_reply), but not yet sent in full: with a save_delay of 0, save
        the session now. The save's completion, for the reply to wait for, so that a
        client that has its whole reply finds the turn on disk wherever it sends the
        next one; None when there is nothing to wait for. If the session's next request
        holds it already, that one's end saves both turns."""
        if self.store is None or slot.id is None or self.save_delay > 0 or slot.users:
            return None
        self._save_idle(slot, slot.turns, "turn")
        return self._disk.get(slot.key)

    def _opened(self, slot: Slot, future: asyncio.Future) -> None:
        slot.opening = None
        if future.cancelled():
            slot.failure = RuntimeError("the server is shutting down")
        elif future.exception() is not None:
            slot.failure = future.exception()
        else:
            slot.session = future.result()
            self.engine_sessions += 1
        if slot.failure is not None and not slot.temporary and not slot.deleted and slot.id is not None:
            self._forget(slot)  # requests waiting for it start over
        self._settle(slot)

    def _settle(self, slot: Slot) -> None:
        """Free a temporary or deleted slot's engine session, exactly once, as soon as
        no request holds or waits for it and it is open."""
        if not (slot.temporary or slot.deleted) or slot.users or slot.opening is not None or slot.freed:
            return
        slot.freed = True
        if slot.temporary:
            self.temporary -= 1
        else:
            self.retiring -= 1
        if slot.session is not None:
            session, slot.session = slot.session, None
            if slot.save and self.store is not None:
                self._save(slot, session, "shutdown" if self._closing else "evicted")
            self._free(slot, session)

    def _closed(self, future: asyncio.Future) -> None:
        self.engine_sessions -= 1
        if not future.cancelled() and future.exception() is not None:
            log.error("freeing an engine session failed: %s", future.exception())

    def _forget(self, slot: Slot) -> None:
        """Take a named slot out of the table; its session is freed once unused."""
        if self.named.get(slot.key) is slot:
            del self.named[slot.key]
        slot.deleted = True
        self.retiring += 1
        self._settle(slot)

    def _release(self, slot: Slot) -> None:
        slot.users -= 1
        slot.last_used = time.monotonic()
        slot.lock.release()
        if self.store is not None and slot.id is not None:
            slot.turns += 1
            if self.save_delay > 0:  # else the reply saves it (turn_ended)
                asyncio.get_running_loop().call_later(self.save_delay, self._save_idle, slot, slot.turns)
        self._settle(slot)

    # ---- operator actions ---------------------------------------------------------

    def sessions(self, principal: str) -> list[Slot]:
        """The named sessions of the API key `principal`."""
        return [s for s in self.named.values() if s.principal == principal]

    def get(self, session_id: str, principal: str) -> Slot | None:
        """The named session `session_id` of the API key `principal`, if in the table."""
        return self.named.get(session_key(principal, session_id))

    def delete(self, session_id: str, principal: str = "") -> bool:
        """Forget a named session at once: a later request with its id starts a new
        one. A request running on it finishes normally; the engine session is freed
        after it, and requests that were waiting for it run on the new session."""
        key = session_key(principal, session_id)
        slot = self.named.get(key)
        on_disk = self._unsave(key)
        if slot is None:
            return on_disk
        self._forget(slot)
        return True

    def _unsave(self, key: str) -> bool:
        """Remove the session's file (after its pending writes); whether the store lists
        one. The removal is queued even when it does not: an instance sharing the
        directory may have written it."""
        if self.store is None:
            return False
        listed = self.store.has(key) or key in self._disk
        self._on_disk(key, lambda: asyncio.to_thread(self.store.remove, key))
        return listed

    def reset(self, session_id: str, principal: str = "") -> bool:
        """Clear a named session's context; it keeps its slot. A request running on
        it finishes normally; the next one starts from an empty cache."""
        key = session_key(principal, session_id)
        slot = self.named.get(key)
        on_disk = self._unsave(key)
        if slot is None:
            return on_disk
        slot.replies.clear()
        slot.resident = []
        # An idle session's next request truncates its cache to `resident` anyway; a
        # running one still adds to `resident`, so the next request must not trust it.
        slot.dirty = slot.users > 0
        return True

    @property
    def in_use(self) -> int:
        """Slots counted against capacity: named (open or opening), temporary, and
        deleted ones not yet freed."""
        return self.capacity - 1 - self._free_slots()

    def _lasting_slots(self) -> list[Slot]:
        return [*self.named.values(), *([self.scratch] if self.scratch else [])]

    @property
    def waiting(self) -> int:
        """Requests waiting for a session that an earlier request holds."""
        return sum(s.users - s.lock.locked() for s in self._lasting_slots())

    @property
    def ring_bytes(self) -> int:
        """Bytes of the sliding-window rings of the sessions and draft sessions that hold
        tokens (their other layers' bytes are the engines' blocks, Engine.kv_stats)."""
        slots = self._lasting_slots()
        rings = sum(1 for s in slots if s.resident) * self.engine.info.kv_ring_bytes
        if self.draft_engine is not None:
            rings += sum(1 for s in slots if s.draft is not None and s.draft.resident) \
                * self.draft_engine.info.kv_ring_bytes
        return rings

    def kv_bytes(self, slot: Slot) -> int:
        """Bytes the slot's cache holds: the blocks its tokens fill (a block it shares
        with other sessions counted here too) and its rings."""
        info = self.engine.info
        if not slot.resident:
            return 0
        blocks = -(-len(slot.resident) // info.kv_block_positions) if info.kv_block_positions else 0
        return blocks * info.kv_block_bytes + info.kv_ring_bytes

    def describe(self, slot: Slot) -> dict:
        return {
            "id": slot.id,
            "object": "session",
            "resident_tokens": len(slot.resident),
            "kv_bytes": self.kv_bytes(slot),
            "idle_seconds": round(time.monotonic() - slot.last_used, 3) if slot.users == 0 else 0.0,
            "in_flight": slot.users,
        }

    async def close(self) -> None:
        """Free every session (saving named ones to the store, if any); returns once the
        engine has freed them and their files are written."""
        self._closing = True
        for slot in list(self.named.values()):
            if slot.deleted:  # left the table while an earlier one was written
                continue
            slot.save = True
            self._forget(slot)
            if (writing := self._disk.get(slot.key)) is not None:  # one exported cache in memory at a time
                await asyncio.gather(writing, return_exceptions=True)
        if self.scratch is not None:
            self.scratch.deleted = True
            self.retiring += 1
            self._settle(self.scratch)
            self.scratch = None
        while self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
