"""Sessions on disk (llmd/serving/session_store.py and its hooks in llmd/serving/sessions.py): the
file format and every way a file is refused, atomic writes, the disk budget, safe
names; then, on the real stack in this process (tiny model), eviction and shutdown
saving sessions that come back warm, and a failing disk degrading to in-memory
sessions; then, on real server processes (default model), the acceptance: three
conversations over two slots stay warm, a session survives SIGTERM and a restart,
and its temperature-0 output equals a fresh prefill's."""
from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import logging
import os
import signal
import struct
import threading
import time

import pytest
import pytest_asyncio

from llmd.serving import sessions
from llmd.serving import session_store
from llmd.serving.session_store import (CONFLICT, FORMAT_VERSION, LOCK_NAME, MAGIC, STALE_TEMP_SECONDS, SUFFIX,
                                        SessionStore, decode, encode, file_name, model_fingerprint, read_version,
                                        session_key)
from llmd.serving.sessions import SessionTable
from tests.conformance.client import Client
from tests.conftest import llmd_process
from tests.support.gguf_writer import build_tiny_gemma3, build_tiny_qwen35
from tests.support.stack import start_stack

FINGERPRINT = "f" * 64
PAYLOAD = bytes(range(256)) * 40
REPLIES = [("a" * 64, [1, 2, 3]), ("b" * 64, [4])]


def file_bytes(session_id: str = "s1", fingerprint: str = FINGERPRINT, n_ctx: int = 128,
               payload: bytes = PAYLOAD) -> bytes:
    return b"".join(bytes(p) for p in encode(session_id, fingerprint, n_ctx, 7, REPLIES, payload))


def listed(directory) -> list[str]:
    """The directory's files but the lock file every writer shares."""
    return sorted(n for n in os.listdir(directory) if n != LOCK_NAME)


# ---- the file format -------------------------------------------------------------------

def test_a_file_decodes_to_what_was_encoded():
    saved = decode(file_bytes(), "s1", FINGERPRINT, 128)
    assert bytes(saved.payload) == PAYLOAD
    assert saved.replies == REPLIES and saved.n_tokens == 7 and saved.key == "s1" and saved.version == 1
    assert saved.owner is None
    assert file_bytes()[:8] == MAGIC
    meta = json.loads(file_bytes()[28:28 + struct.unpack_from("<I", file_bytes(), 12)[0]])
    assert meta["model"] == FINGERPRINT and meta["kv_type"] == "f16" and meta["writer"] == session_store.WRITER


def test_a_file_whose_kv_cache_is_stored_another_way_is_refused():
    quantized = b"".join(bytes(p) for p in encode("s1", FINGERPRINT, 128, 7, REPLIES, PAYLOAD, kv_type="q8_0"))
    assert bytes(decode(quantized, "s1", FINGERPRINT, 128, "q8_0").payload) == PAYLOAD
    with pytest.raises(session_store.Refused, match="stored as 'q8_0'; this engine stores 'f16'"):
        decode(quantized, "s1", FINGERPRINT, 128)
    with pytest.raises(session_store.Refused, match="stored as 'f16'; this engine stores 'q8_0/f16'"):
        decode(file_bytes(), "s1", FINGERPRINT, 128, session_store.kv_type_name("q8_0", "f16"))


def test_a_file_of_the_format_before_kv_types_is_refused():
    """Version 2 files hold f16 keys and values without saying so: refused (the
    session then runs cold), never read as this engine's types."""
    old = bytearray(file_bytes())
    struct.pack_into("<I", old, 8, 2)
    with pytest.raises(session_store.Refused, match="format version 2; this llmd reads version 3"):
        decode(bytes(old), "s1", FINGERPRINT, 128)


def flipped(data: bytes, offset: int) -> bytes:
    b = bytearray(data)
    b[offset] ^= 0x01
    return bytes(b)


def other_version(data: bytes) -> bytes:
    b = bytearray(data)
    struct.pack_into("<I", b, 8, FORMAT_VERSION + 1)
    return bytes(b)


def with_metadata(meta: bytes, payload: bytes = PAYLOAD) -> bytes:
    """A file of this metadata, its checksum right: only what the metadata says is wrong."""
    import zlib
    return session_store._PREFIX.pack(MAGIC, FORMAT_VERSION, len(meta), len(payload),
                                      zlib.crc32(payload, zlib.crc32(meta))) + meta + payload


def metadata_of(replace: str) -> bytes:
    meta = json.dumps({"session_id": "s1", "model": FINGERPRINT, "kv_type": "f16", "n_ctx": 128, "n_tokens": 7,
                       "version": 1, "replies": []})
    return with_metadata(meta.replace('"n_tokens": 7', replace).encode())


REFUSALS = {
    "truncated": (lambda d: d[:-1], "truncated"),
    "truncated_to_the_header": (lambda d: d[:30], "truncated"),
    "empty": (lambda d: b"", "not an llmd session file"),
    "padded": (lambda d: d + b"\0", "truncated or padded"),
    "bit_flipped_payload": (lambda d: flipped(d, len(d) - 100), "checksum mismatch"),
    "bit_flipped_metadata": (lambda d: flipped(d, 40), "checksum mismatch"),
    "other_magic": (lambda d: b"GGUF" + d[4:], "not an llmd session file"),
    "other_version": (other_version, f"format version {FORMAT_VERSION + 1}"),
    "other_model": (lambda d: file_bytes(fingerprint="0" * 64), "another model file"),
    "other_context": (lambda d: file_bytes(n_ctx=256), "context of 256 tokens"),
    "other_session": (lambda d: file_bytes(session_id="s2"), "another session id"),
    "other_api_key": (lambda d: file_bytes(session_id=session_key("ab12", "s1")), "another session id or API key"),
    "owner_not_text": (lambda d: metadata_of('"n_tokens": 7, "owner": 5'), "unreadable metadata (TypeError"),
    # a count past every float (json reads 1e400 as infinity), and nesting past Python's stack
    "metadata_infinite_count": (lambda d: metadata_of('"n_tokens": 1e400'), "unreadable metadata (OverflowError"),
    "metadata_nested_deeply": (lambda d: metadata_of('"n_tokens": 7, "x": ' + "[" * 100000 + "]" * 100000),
                               "unreadable metadata (RecursionError"),
}


@pytest.mark.parametrize("name", list(REFUSALS))
def test_a_damaged_or_foreign_file_is_refused_with_its_reason(tmp_path, caplog, name):
    damage, reason = REFUSALS[name]
    store = SessionStore(tmp_path, 0, FINGERPRINT, 128)
    store.scan()
    (tmp_path / file_name("s1")).write_bytes(damage(file_bytes()))
    with caplog.at_level(logging.WARNING, "llmd.sessions"):
        assert store.load("s1") is None
    assert reason in caplog.text and "refused for session 's1'" in caplog.text and "starts cold" in caplog.text


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory"])
def test_a_session_path_that_is_not_a_regular_file_is_refused_without_waiting(tmp_path, kind):
    store = SessionStore(tmp_path, 0, FINGERPRINT, 128)
    store.scan()
    path = tmp_path / file_name("s1")
    if kind == "fifo":
        os.mkfifo(path)  # its open would wait for a writer that never comes
    elif kind == "symlink":
        (tmp_path / "elsewhere").write_bytes(file_bytes())
        path.symlink_to(tmp_path / "elsewhere")
    else:
        path.mkdir()
    done = []
    reader = threading.Thread(target=lambda: done.append((store.load("s1"), read_version(path))), daemon=True)
    reader.start()
    reader.join(10)
    assert done == [(None, None)] and store.refused == 1 and store.loaded == 0


def test_a_file_larger_than_any_session_of_the_engine_is_not_read(tmp_path, caplog):
    store = SessionStore(tmp_path, 0, FINGERPRINT, 128, max_file=1000)
    store.scan()
    (tmp_path / file_name("s1")).write_bytes(file_bytes())  # 10 KB of payload
    with caplog.at_level(logging.WARNING, "llmd.sessions"):
        assert store.load("s1") is None
    assert "more than a session of this engine holds (1000)" in caplog.text and store.refused == 1


# ---- the store --------------------------------------------------------------------------

def test_save_then_load_round_trips_and_leaves_no_temporary_file(tmp_path):
    store = SessionStore(tmp_path, 0, FINGERPRINT, 128)
    store.scan()
    assert store.save("s1", PAYLOAD, REPLIES, 7) == 1
    assert listed(tmp_path) == [file_name("s1")]
    assert oct(os.stat(tmp_path / file_name("s1")).st_mode & 0o777) == "0o600"
    saved = store.load("s1")
    assert bytes(saved.payload) == PAYLOAD and saved.replies == REPLIES
    assert store.load("never-saved") is None


@pytest.mark.parametrize("sid", ["../../etc/passwd", "a/b", "..", ".hidden", "x" * 128, "~!@#$%^&*()"])
def test_any_session_id_is_a_safe_file_name_inside_the_directory(tmp_path, sid):
    store = SessionStore(tmp_path / "dir", 0, FINGERPRINT, 128)
    store.scan()
    assert store.save(sid, PAYLOAD, [], 7)
    names = listed(tmp_path / "dir")
    assert names == [file_name(sid)] and not names[0].startswith(".") and names[0].endswith(SUFFIX)
    assert os.listdir(tmp_path) == ["dir"]
    assert bytes(store.load(sid).payload) == PAYLOAD


def test_scan_lists_saved_files_and_removes_only_temporaries_a_crashed_writer_left(tmp_path):
    store = SessionStore(tmp_path, 0, FINGERPRINT, 128)
    store.scan()
    store.save("s1", PAYLOAD, [], 7)
    crashed, writing = tmp_path / f".{file_name('s2')}.host-999-0a1b2c3d.tmp", tmp_path / f".{file_name('s3')}.x.tmp"
    for path in (crashed, writing):
        path.write_bytes(file_bytes("s2")[:50])
    old = time.time() - STALE_TEMP_SECONDS - 10
    os.utime(crashed, (old, old))
    again = SessionStore(tmp_path, 0, FINGERPRINT, 128)
    again.scan()
    assert again.count == 1 and again.has("s1") and not again.has("s2")
    assert again.bytes_used == (tmp_path / file_name("s1")).stat().st_size
    # Another instance's write in progress is left alone.
    assert listed(tmp_path) == sorted([file_name("s1"), writing.name])


def test_the_budget_removes_the_least_recently_used_files_first(tmp_path):
    # room for three files but not four; a file's size varies by a byte or two with the
    # digits its saved_at time takes, so the budget is not an exact multiple of one
    budget = 3 * len(file_bytes()) + len(file_bytes()) // 2
    store = SessionStore(tmp_path, budget, FINGERPRINT, 128)
    store.scan()
    for i, sid in enumerate(["s1", "s2", "s3"]):
        store.save(sid, PAYLOAD, REPLIES, 7)
        os.utime(tmp_path / file_name(sid), (1000 + i, 1000 + i))
    store.scan()  # the index takes the times set above
    assert store.load("s1") is not None  # a load makes s1 the most recently used
    store.save("s4", PAYLOAD, REPLIES, 7)
    assert {sid for sid in ["s1", "s2", "s3", "s4"] if store.has(sid)} == {"s1", "s3", "s4"}
    assert not (tmp_path / file_name("s2")).exists()
    assert store.bytes_used <= budget


def test_a_key_that_saves_many_sessions_removes_its_own_files_not_anothers(tmp_path):
    budget = 4 * len(file_bytes(session_key("a" * 64, "s0"))) + 100  # four files, not five
    store = SessionStore(tmp_path, budget, FINGERPRINT, 128)
    store.scan()
    quiet, busy = session_key("a" * 64, "mine"), [session_key("b" * 64, f"s{i}") for i in range(8)]
    store.save(quiet, PAYLOAD, REPLIES, 7)
    os.utime(tmp_path / file_name(quiet), (1000, 1000))  # the oldest file of all
    for key in busy:
        store.save(key, PAYLOAD, REPLIES, 7)
    assert store.has(quiet) and [store.has(k) for k in busy] == [False] * 5 + [True] * 3
    assert file_name(quiet).startswith("a" * 16 + "-") and "-" not in file_name("mine")  # a key's group
    store.save(session_key("a" * 64, "second"), PAYLOAD, REPLIES, 7)  # 2 and 2 after it: the largest gives way
    assert store.has(quiet) and sum(store.has(k) for k in busy) == 2 and store.bytes_used <= budget


def test_a_session_that_only_another_keys_files_could_make_room_for_is_not_written(tmp_path, caplog):
    one = len(file_bytes(session_key("a" * 64, "s0")))
    store = SessionStore(tmp_path, 3 * one + 100, FINGERPRINT, 128)
    store.scan()
    small = [session_key("a" * 64, f"s{i}") for i in range(2)]
    for key in small:
        store.save(key, PAYLOAD, REPLIES, 7)
    big = session_key("b" * 64, "big")
    with caplog.at_level(logging.WARNING, "llmd.sessions"):  # one file larger than all of key a's
        assert store.save(big, PAYLOAD * 2 + PAYLOAD[:len(PAYLOAD) // 2], REPLIES, 7) is None
    assert "share of --session-dir-max" in caplog.text
    assert all(store.has(k) for k in small) and not store.has(big) and store.failed == 1


def test_a_session_larger_than_the_budget_is_not_written(tmp_path, caplog):
    store = SessionStore(tmp_path, 1000, FINGERPRINT, 128)
    store.scan()
    with caplog.at_level(logging.WARNING, "llmd.sessions"):
        assert store.save("big", PAYLOAD, [], 7) is None
    assert "more than --session-dir-max" in caplog.text and listed(tmp_path) == []


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_a_failing_write_is_a_warning_and_leaves_the_old_file(tmp_path, monkeypatch, caplog, code):
    store = SessionStore(tmp_path, 0, FINGERPRINT, 128)
    store.scan()
    store.save("s1", PAYLOAD, REPLIES, 7)

    def failing_fsync(fd):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with caplog.at_level(logging.WARNING, "llmd.sessions"):
        assert store.save("s1", PAYLOAD[:100], [], 3, base=1) is None
    assert os.strerror(code) in caplog.text and "kept in memory only" in caplog.text
    assert listed(tmp_path) == [file_name("s1")]  # no temporary file left
    monkeypatch.undo()
    assert bytes(store.load("s1").payload) == PAYLOAD


def test_remove_deletes_the_file(tmp_path):
    store = SessionStore(tmp_path, 0, FINGERPRINT, 128)
    store.scan()
    store.save("s1", PAYLOAD, [], 7)
    assert store.remove("s1") and not store.has("s1") and listed(tmp_path) == []
    assert not store.remove("s1")


# ---- several instances sharing one directory ----------------------------------------------

def test_a_save_replaces_only_the_version_it_read_and_a_conflict_leaves_the_newer_file(tmp_path, caplog):
    a, b = SessionStore(tmp_path, 0, FINGERPRINT, 128), SessionStore(tmp_path, 0, FINGERPRINT, 128)
    a.scan(), b.scan()
    assert a.save("s1", PAYLOAD, REPLIES, 7) == 1
    assert b.load("s1").version == 1
    assert b.save("s1", PAYLOAD[:200], [], 3, base=1) == 2
    with caplog.at_level(logging.INFO, "llmd.sessions"):
        assert a.save("s1", PAYLOAD, REPLIES, 7, base=1) == CONFLICT
    assert "at version 2, written by another instance since this one's version 1" in caplog.text
    assert (a.conflicts, a.saved, a.failed) == (1, 1, 0)
    saved = a.load("s1")
    assert saved.version == 2 and bytes(saved.payload) == PAYLOAD[:200]
    assert listed(tmp_path) == [file_name("s1")]  # the refused write left no temporary file
    # A file that is unreadable, or gone (removed by the budget), may be written over.
    (tmp_path / file_name("s1")).write_bytes(b"LLMDSESS and then nothing")
    assert read_version(tmp_path / file_name("s1")) is None
    assert a.save("s1", PAYLOAD, REPLIES, 7, base=1) == 2
    assert a.remove("s1") and a.save("s1", PAYLOAD, REPLIES, 7, base=5) == 6


def test_two_writers_racing_on_one_session_never_corrupt_it_and_keep_one_line_of_versions(tmp_path):
    writers = [SessionStore(tmp_path, 0, FINGERPRINT, 128) for _ in range(2)]
    reader = SessionStore(tmp_path, 0, FINGERPRINT, 128)
    for store in (*writers, reader):
        store.scan()
    written: dict[int, bytes] = {}
    done = threading.Event()

    def write(i: int) -> None:
        store = writers[i]
        for n in range(40):
            payload = bytes([i, n]) * 3000
            if version := store.save("s1", payload, [], 7, base=store.version("s1") or 0):
                written[version] = payload

    def read() -> None:
        while not done.is_set():
            reader.load("s1")

    threads = [threading.Thread(target=write, args=(i,)) for i in range(2)]
    watcher = threading.Thread(target=read)
    for t in (*threads, watcher):
        t.start()
    for t in threads:
        t.join()
    done.set()
    watcher.join()
    final = reader.load("s1")
    saves = sum(w.saved for w in writers)
    # Every write that succeeded advanced the file by exactly one version; the others
    # were refused as conflicts; a reader never saw a half-written or damaged file.
    assert final.version == saves and bytes(final.payload) == written[final.version]
    assert saves + sum(w.conflicts for w in writers) == 80 and sum(w.failed for w in writers) == 0
    assert reader.refused == 0 and listed(tmp_path) == [file_name("s1")]


def test_two_instances_pruning_one_directory_at_once_stay_near_the_budget_without_errors(tmp_path, caplog):
    size = len(file_bytes())
    budget = 5 * size + size // 2
    stores = [SessionStore(tmp_path, budget, FINGERPRINT, 128) for _ in range(2)]
    for store in stores:
        store.scan()
    versions: list = []
    written: list[str] = []

    def write(i: int) -> None:
        for n in range(30):
            versions.append(stores[i].save(f"w{i}-{n}", PAYLOAD, REPLIES, 7))
            written.append(f"w{i}-{n}")

    with caplog.at_level(logging.WARNING, "llmd.sessions"):
        threads = [threading.Thread(target=write, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert versions == [1] * 60 and not caplog.records  # a file removed by the other is no error
    names = listed(tmp_path)
    # Each writer made room before its own write: at worst the other's write of that
    # moment is over the budget, never more.
    assert sum((tmp_path / n).stat().st_size for n in names) <= budget + size
    assert file_name(written[-1]) in names  # the newest stays


def test_the_fingerprint_changes_with_the_model_file_the_engine_and_its_kernels(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"H" * 100 + b"D" * 100000)
    library = tmp_path / "lib.so"
    library.write_bytes(b"engine")
    base = model_fingerprint(str(model), 100, 100100, str(library), "avx2")
    assert model_fingerprint(str(model), 100, 100100, str(library), "avx2") == base
    model.write_bytes(b"H" * 99 + b"h" + b"D" * 100000)
    assert model_fingerprint(str(model), 100, 100100, str(library), "avx2") != base
    model.write_bytes(b"H" * 100 + b"D" * 99999 + b"d")  # the last sample reads the end of the data
    assert model_fingerprint(str(model), 100, 100100, str(library), "avx2") != base
    model.write_bytes(b"H" * 100 + b"D" * 100000)
    assert model_fingerprint(str(model), 100, 100100, str(library), "avx512") != base
    library.write_bytes(b"engine, rebuilt")
    assert model_fingerprint(str(model), 100, 100100, str(library), "avx2") != base


# ---- the table with a store, in process on the tiny model ----------------------------------

@pytest_asyncio.fixture
async def stack(tiny_model, tmp_path):
    """Start/stop a server stack over a session dir; 2 named slots + scratch. No prefix
    cache: what is cached here came from the session or its file alone."""
    stacks = []

    async def start(store_dir=tmp_path / "sessions", max_bytes=0, fingerprint="tiny", model=tiny_model.path,
                    n_ctx=0, save_delay=sessions.IDLE_SAVE_SECONDS, api_keys=()):
        s = await start_stack(model, max_sessions=3, n_ctx=n_ctx, prefix_cache="off", store=store_dir,
                              max_bytes=max_bytes, fingerprint=fingerprint, save_delay=save_delay, api_keys=api_keys)
        stacks.append(s.stop)
        return s.client, s.table, s.stop

    yield start
    for stop in stacks:
        await stop()


async def turn(client: Client, sid: str, history: list, content: str | None, **params) -> dict:
    """One chat turn of a conversation; the reply joins the history (None: resend it as it is)."""
    if content is not None:
        history.append({"role": "user", "content": content})
    resp = await asyncio.to_thread(client.post_json, "/chat/completions",
                                   client.chat_body(history, session_id=sid, max_tokens=6, temperature=0, **params))
    assert resp.status == 200, resp.body
    body = resp.json()
    history.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
    return body["usage"]


def cached(usage: dict) -> int:
    return usage["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.asyncio
async def test_an_evicted_session_comes_back_warm_from_its_file(stack, tmp_path):
    client, table, _ = await stack()
    histories = {sid: [] for sid in "abc"}
    first = {sid: await turn(client, sid, histories[sid], f"hello from {sid}") for sid in "abc"}
    await asyncio.sleep(0)
    assert table.evictions == 1 and "a" not in table.named
    again = await turn(client, "a", histories["a"], "and again")
    assert cached(again) == first["a"]["prompt_tokens"] + first["a"]["completion_tokens"] - 1
    assert table.store.has("a")


@pytest.mark.asyncio
async def test_a_session_on_disk_is_restored_only_for_its_api_key_and_salt(stack, tmp_path, caplog):
    # Ids are per key: key-b's "s" is a session (and a file) of its own; and a file
    # keeps the scope that filled it, so another salt of the same key starts it over.
    client, table, _ = await stack(api_keys=("key-a", "key-b"))
    a, b = (Client(client.base_url, api_key=k, model="model") for k in ("key-a", "key-b"))
    history: list = []
    with caplog.at_level(logging.INFO):
        await turn(a, "s", history, "a secret: the PIN is 4815", cache_salt="t1")
        for sid in "xy":  # key-b's two sessions fill the table: its "x" goes to disk, as "s" (idle)
            await turn(b, sid, [], f"hello from {sid}")
        digest_a, digest_b = (hashlib.sha256(k).hexdigest() for k in (b"key-a", b"key-b"))
        key_a = session_key(digest_a, "s")
        for _ in range(400):  # the eviction's write runs on a thread of its own
            if table.store.has(key_a) and caplog.text.count("saved to disk") >= 2:
                break
            await asyncio.sleep(0.05)
    assert table.store.has(key_a) and not table.store.has("s")
    # The logs tell the two keys' sessions apart by the start of the key's digest.
    assert f"session 's' of key {digest_a[:8]} saved to disk" in caplog.text
    assert f"session 'x' of key {digest_b[:8]} saved to disk" in caplog.text
    access = [r.getMessage() for r in caplog.records if r.name == "llmd.access"]
    assert [m.split(" key=")[1][:8] for m in access] == [digest_a[:8]] + [digest_b[:8]] * 2
    assert all(" session=" in m.split(" key=")[1] for m in access)  # the key first, then the reply's fields
    assert cached(await turn(b, "s", list(history), None, cache_salt="t1")) == 0  # its own "s": new
    assert cached(await turn(a, "s", list(history), None, cache_salt="t2")) == 0  # another salt: over
    refill = await turn(a, "s", history, "once more", cache_salt="t1")  # t1's again, filled anew
    for sid in "xy":
        await turn(b, sid, [], f"{sid} again")
    warm = await turn(a, "s", history, "next", cache_salt="t1")  # restored for t1
    assert cached(warm) == refill["prompt_tokens"] + refill["completion_tokens"] - 1


@pytest.mark.asyncio
async def test_a_file_remembering_a_reply_outside_the_vocabulary_is_refused(stack, tmp_path):
    # its checksum right, so only the ids say it was not written by llmd
    client, table, _ = await stack()
    histories = {sid: [] for sid in "abc"}
    for sid in "abc":
        await turn(client, sid, histories[sid], f"hello from {sid}")
    for _ in range(400):  # the eviction's write runs on a thread of its own
        if table.store.has("a"):
            break
        await asyncio.sleep(0.05)
    assert "a" not in table.named and table.store.has("a")
    path = table.store.path("a")
    saved = decode(path.read_bytes(), "a", "tiny", table.engine.info.n_ctx)
    replies = [(fp, [table.engine.info.n_vocab]) for fp, _ in saved.replies]
    path.write_bytes(b"".join(bytes(p) for p in encode("a", "tiny", table.engine.info.n_ctx, saved.n_tokens, replies,
                                                       saved.payload, saved.version)))
    again = await turn(client, "a", histories["a"], "and again")
    assert cached(again) == 0 and table.store.refused == 1 and table.store.loaded == 0


@pytest.mark.asyncio
async def test_an_idle_session_is_saved_once_and_its_eviction_then_costs_no_export(stack, monkeypatch, caplog):
    client, table, _ = await stack(save_delay=0.05)
    history: list = []
    with caplog.at_level(logging.INFO, "llmd.sessions"):
        first = await turn(client, "idle", history, "hello")
        for _ in range(400):  # the log line follows the write, which runs on a thread of its own
            if "session 'idle' saved to disk (idle)" in caplog.text:
                break
            await asyncio.sleep(0.05)
        assert "session 'idle' saved to disk (idle)" in caplog.text and table.store.has("idle")
        await asyncio.sleep(0.2)  # no second save: nothing changed
        for sid in "bc":
            await turn(client, sid, [], "hi")  # "c" evicts "idle"
        await asyncio.gather(*table._disk.values())
    assert "idle" not in table.named
    assert caplog.text.count("session 'idle' saved to disk") == 1
    again = await turn(client, "idle", history, "again")
    assert cached(again) == first["prompt_tokens"] + first["completion_tokens"] - 1


@pytest.mark.asyncio
async def test_a_session_whose_rings_wrapped_comes_back_from_disk_and_equals_a_fresh_prefill(stack, tmp_path):
    model = build_tiny_gemma3(n_ctx=1024, window=32).write(tmp_path / "gemma3.gguf")
    client, table, _ = await stack(model=model, n_ctx=1024)

    async def complete(prompt: str, sid: str | None) -> dict:
        named = {"session_id": sid} if sid else {}
        resp = await asyncio.to_thread(client.post_json, "/completions",
                                       client.completion_body(prompt, max_tokens=6, temperature=0, **named))
        assert resp.status == 200, resp.body
        return resp.json()

    text = " ".join(f"w{i}" for i in range(150))
    first = await complete(text, "ring")
    assert first["usage"]["prompt_tokens"] > 288 + 32  # the sliding-window rings wrapped
    for sid in "bc":
        await complete("hello", sid)  # "c" evicts "ring"
    assert "ring" not in table.named
    longer = text + first["choices"][0]["text"] + " and more words"
    again = await complete(longer, "ring")
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= first["usage"]["prompt_tokens"]
    assert again["choices"][0]["text"] == (await complete(longer, None))["choices"][0]["text"]


@pytest.mark.asyncio
@pytest.mark.parametrize("n_expert", [0, 8], ids=["qwen35", "qwen35moe"])
async def test_a_hybrid_session_comes_back_from_disk_and_answers_as_one_that_never_left(stack, tmp_path, n_expert):
    model = build_tiny_qwen35(n_ctx=512, n_expert=n_expert).write(tmp_path / "qwen35.gguf")
    client, table, _ = await stack(model=model, n_ctx=512)
    histories = {sid: [] for sid in "abc"}
    for sid in "abc":
        await turn(client, sid, histories[sid], "the same first question" if sid != "c" else "hello")
    assert "a" not in table.named and "b" in table.named  # "c" evicted "a"
    kept = await turn(client, "b", histories["b"], "and a second one")
    back = await turn(client, "a", histories["a"], "and a second one")  # from its file
    assert table.store.loaded == 1
    assert cached(back) == cached(kept) > 0
    assert histories["a"] == histories["b"]


@pytest.mark.asyncio
async def test_sessions_alive_at_shutdown_are_restored_after_a_restart(stack):
    client, table, stop = await stack()
    history: list = []
    first = await turn(client, "kept", history, "remember this")
    await stop()
    client, table, _ = await stack()
    assert table.store.has("kept") and "kept" not in table.named
    listing = (await asyncio.to_thread(client.get_json, "/sessions")).json()
    assert listing["saved_sessions"] == 1 and listing["saved_bytes"] == table.store.bytes_used > 0
    again = await turn(client, "kept", history, "what did I say?")
    assert cached(again) == first["prompt_tokens"] + first["completion_tokens"] - 1


@pytest.mark.asyncio
async def test_delete_and_reset_remove_the_saved_file(stack):
    client, table, stop = await stack()
    for sid in ("gone", "cleared"):
        await turn(client, sid, [], "hi")
    await stop()
    client, table, _ = await stack()
    assert (await asyncio.to_thread(client.request, "DELETE", "/sessions/gone")).json()["deleted"] is True
    assert (await asyncio.to_thread(client.request, "POST", "/sessions/cleared/reset")).json()["reset"] is True
    await asyncio.gather(*table._disk.values())
    assert not table.store.has("gone") and not table.store.has("cleared")
    assert cached(await turn(client, "gone", [], "hi")) == 0
    assert (await asyncio.to_thread(client.request, "DELETE", "/sessions/never")).json()["deleted"] is False


@pytest.mark.asyncio
async def test_a_refused_file_is_logged_and_the_request_runs_cold(stack, tmp_path, caplog):
    client, table, stop = await stack()
    await turn(client, "victim", [], "hi")
    await stop()
    path = tmp_path / "sessions" / file_name("victim")
    path.write_bytes(flipped(path.read_bytes(), 200))
    client, table, _ = await stack()
    with caplog.at_level(logging.WARNING, "llmd.sessions"):
        usage = await turn(client, "victim", [], "hi")
    assert cached(usage) == 0 and "checksum mismatch" in caplog.text
    metrics = (await asyncio.to_thread(client.request, "GET", client.origin + "/metrics")).body.decode()
    assert "llmd_session_files_refused_total 1" in metrics and "llmd_session_files_loaded_total 0" in metrics


@pytest.mark.asyncio
async def test_a_file_of_another_model_is_refused_and_the_request_runs_cold(stack, caplog):
    client, table, stop = await stack()
    await turn(client, "s", [], "hi")
    await stop()
    client, table, _ = await stack(fingerprint="another model")
    with caplog.at_level(logging.WARNING, "llmd.sessions"):
        usage = await turn(client, "s", [], "hi")
    assert cached(usage) == 0 and "written for another model file" in caplog.text


@pytest.mark.asyncio
async def test_a_full_disk_degrades_to_in_memory_sessions_with_a_warning(stack, monkeypatch, caplog):
    client, table, _ = await stack()

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    histories = {sid: [] for sid in "abc"}
    with caplog.at_level(logging.WARNING, "llmd.sessions"):
        for rnd in range(2):
            for sid in "abc":  # each turn evicts the next one's session, which is not saved: cold
                assert cached(await turn(client, sid, histories[sid], f"round {rnd}")) == 0
        await asyncio.gather(*table._disk.values())
    assert "No space left on device" in caplog.text and table.store.count == 0
    assert table.store.failed >= 4 and table.store.saved == 0


@pytest.mark.asyncio
async def test_a_read_only_session_dir_still_restores_and_never_fails_a_request(stack, monkeypatch, caplog):
    client, table, stop = await stack()
    history: list = []
    first = await turn(client, "saved", history, "hi")
    await stop()
    client, table, _ = await stack()
    real_open = os.open

    def read_only(path, flags, *args):
        if flags & os.O_CREAT:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", read_only)
    with caplog.at_level(logging.WARNING, "llmd.sessions"):
        restored = await turn(client, "saved", history, "again")
        for sid in "bc":  # evicts "saved", whose new state cannot be written
            await turn(client, sid, [], "hi")
        await asyncio.gather(*table._disk.values())
    assert cached(restored) == first["prompt_tokens"] + first["completion_tokens"] - 1
    assert "Read-only file system" in caplog.text


async def settled(*tables: SessionTable) -> None:
    """Once the tables' disk work (saves after each turn) is done."""
    for table in tables:
        await asyncio.gather(*table._disk.values())


@pytest.mark.asyncio
async def test_with_a_save_after_each_turn_a_reply_ends_only_once_its_file_is_written(stack):
    client, table, _ = await stack(save_delay=0)
    history: list = []
    await turn(client, "now", history, "hi")
    assert table.store.version("now") == 1  # not waited for: the JSON body came after the write
    history.append({"role": "user", "content": "and now a stream"})
    stream = await asyncio.to_thread(client.chat_stream, history, session_id="now", max_tokens=4)
    assert stream.status == 200
    assert table.store.version("now") == 2  # [DONE] came after the write


@pytest.mark.asyncio
async def test_a_session_moves_to_another_instance_through_the_shared_dir_and_back(stack, caplog):
    (a, table_a, _), (b, table_b, _) = await stack(save_delay=0), await stack(save_delay=0)
    history: list = []
    with caplog.at_level(logging.INFO, "llmd.sessions"):
        first = await turn(a, "m", history, "hello")
        await settled(table_a)
        assert table_a.named["m"].version == 1
        # b does not hold the session: it resumes from the file a wrote after that turn.
        moved = await turn(b, "m", history, "moved")
        assert cached(moved) == first["prompt_tokens"] + first["completion_tokens"] - 1
        await settled(table_b)
        # a still holds version 1; b has written version 2: a reloads it first.
        back = await turn(a, "m", history, "and back")
        await settled(table_a)
    assert cached(back) == moved["prompt_tokens"] + moved["completion_tokens"] - 1
    assert "session 'm' reloaded from disk: version 2" in caplog.text
    assert table_a.named["m"].version == 3 and table_a.store.conflicts == table_b.store.conflicts == 0
    # The same conversation on one instance, never moved, has the same replies.
    reference: list = []
    for content in ("hello", "moved", "and back"):
        await turn(a, "ref", reference, content)
    assert reference == history


@pytest.mark.asyncio
async def test_delete_on_one_instance_removes_the_file_another_instance_wrote(stack):
    (a, table_a, _), (b, table_b, _) = await stack(save_delay=0), await stack(save_delay=0)
    await turn(b, "gone", [], "hi")
    await settled(table_b)
    assert not table_a.store.has("gone")  # a's listing has not seen b's file
    await asyncio.to_thread(a.request, "DELETE", "/sessions/gone")
    await settled(table_a)
    assert table_a.store.version("gone") is None
    assert cached(await turn(a, "gone", [], "hi")) == 0


@pytest.mark.asyncio
async def test_two_instances_serving_one_session_at_once_never_corrupt_its_file(stack):
    (a, table_a, _), (b, table_b, _) = await stack(save_delay=0), await stack(save_delay=0)
    history: list = []
    await turn(a, "both", history, "hi")
    await settled(table_a)
    for rnd in range(3):  # the same session's turns on both at once: one save of each pair may conflict
        await asyncio.gather(turn(a, "both", list(history), f"a {rnd}"), turn(b, "both", list(history), f"b {rnd}"))
        await settled(table_a, table_b)
    saves = table_a.store.saved + table_b.store.saved
    assert saves + table_a.store.conflicts + table_b.store.conflicts == 7
    final = table_a.store.load("both")  # checksum, session id, model: it loads
    assert final is not None and final.version == saves
    # Both go on serving the session, warm, from whichever state is newest.
    for client in (a, b):
        assert cached(await turn(client, "both", list(history), "next")) > 0


# ---- real server processes on the default model: the acceptance ------------------------------

MODEL = "SmolLM2-135M-Instruct"


def chat_turn(client: Client, sid: str, history: list, content: str) -> dict:
    history.append({"role": "user", "content": content})
    named = {"session_id": sid} if sid is not None else {}
    resp = client.post_json("/chat/completions", client.chat_body(history, max_tokens=24, temperature=0, **named))
    assert resp.status == 200, resp.body
    body = resp.json()
    history.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
    return body


def test_three_conversations_over_two_slots_stay_warm(tmp_path):
    with llmd_process("--max-sessions", "3", "--ctx", "2048", "--session-dir", str(tmp_path)) as server:
        client = Client(server.url + "/v1", model=MODEL)
        histories = {sid: [] for sid in ("x", "y", "z")}
        previous = {}
        for rnd in range(3):
            for sid in histories:
                usage = chat_turn(client, sid, histories[sid], f"Tell me one fact about the number {rnd * 3}.")["usage"]
                if sid in previous:
                    assert cached(usage) >= 0.9 * previous[sid]
                previous[sid] = usage["prompt_tokens"] + usage["completion_tokens"]


def test_a_session_dir_that_cannot_be_used_is_a_warning_and_sessions_stay_in_memory(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    log = tmp_path / "log"
    with open(log, "w") as stderr:
        with llmd_process("--max-sessions", "3", "--session-dir", str(blocked), stderr=stderr) as server:
            client = Client(server.url + "/v1", model=MODEL)
            history: list = []
            first = chat_turn(client, "s", history, "Hi")["usage"]
            assert cached(chat_turn(client, "s", history, "Again")["usage"]) >= 0.9 * (
                first["prompt_tokens"] + first["completion_tokens"])
    assert "cannot use --session-dir" in log.read_text() and "kept in memory only" in log.read_text()


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_a_session_survives_sigterm_and_a_restart_and_matches_a_fresh_prefill(tmp_path, kv_type):
    history: list = []
    log = tmp_path / "log"
    kv = ("--kv-type", kv_type)
    with open(log, "w") as stderr:
        with llmd_process("--max-sessions", "3", "--ctx", "2048", "--session-dir", str(tmp_path / "dir"), *kv,
                          stderr=stderr) as server:
            client = Client(server.url + "/v1", model=MODEL)
            for q in ("Name three colours.", "And three animals?"):
                first = chat_turn(client, "conv", history, q)["usage"]
            server.proc.send_signal(signal.SIGTERM)
            assert server.proc.wait(timeout=60) == 0
    assert "session 'conv' saved to disk" in log.read_text()
    question = "Which of them is largest?"
    with llmd_process("--max-sessions", "3", "--ctx", "2048", "--session-dir", str(tmp_path / "dir"), *kv) as server:
        client = Client(server.url + "/v1", model=MODEL)
        restored = chat_turn(client, "conv", list(history), question)
        total = first["prompt_tokens"] + first["completion_tokens"]
        assert cached(restored["usage"]) >= 0.9 * total
        fresh = chat_turn(client, None, list(history), question)  # the scratch slot: a cold prefill
        assert cached(fresh["usage"]) == 0
        assert restored["choices"][0]["message"]["content"] == fresh["choices"][0]["message"]["content"]


def test_a_session_file_of_another_kv_type_is_refused_with_the_reason_and_the_turn_runs_cold(tmp_path):
    history: list = []
    with llmd_process("--max-sessions", "3", "--ctx", "1024", "--session-dir", str(tmp_path / "dir"),
                      "--kv-type", "q8_0") as server:
        client = Client(server.url + "/v1", model=MODEL)
        chat_turn(client, "conv", history, "Name three colours.")
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=60) == 0
    log = tmp_path / "log"
    with open(log, "w") as stderr:
        with llmd_process("--max-sessions", "3", "--ctx", "1024", "--session-dir", str(tmp_path / "dir"),
                          stderr=stderr) as server:
            client = Client(server.url + "/v1", model=MODEL)
            assert cached(chat_turn(client, "conv", history, "And three animals?")["usage"]) == 0
    assert "its KV cache is stored as 'q8_0'; this engine stores 'f16'" in log.read_text()
