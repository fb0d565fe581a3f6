"""Sessions on disk (`--session-dir`): one file per named session, so that a session
pushed out of memory by eviction, alive when the server stopped, or served by another
instance that shares the directory, resumes warm.

A file wraps the engine's exported state (the ids in the KV cache, their keys and
values, and a hybrid model's recurrent state with its checkpoints,
native/src/memory/session_state.h) in what makes it safe to load:

    8 bytes   magic b"LLMDSESS"
    u32       format version (FORMAT_VERSION)
    u32       metadata length
    u64       payload length
    u32       CRC-32 of metadata + payload
    metadata  JSON: session_id (its session_key), model (fingerprint), kv_type (kv_type_name),
              n_ctx, n_tokens, version (1 for the session's first file, one more for
              each file that replaced it), writer (host:pid), saved_at, replies (the
              session's remembered replies: fingerprint, generated ids) and owner (the
              prefix cache scope of its last request, null: none)
    payload   the engine's state bytes

A file is loaded only when every check passes: magic, version, length, checksum,
the session it names, the model fingerprint (model_fingerprint), the KV type and
the context size; the engine checks the payload's shape once more as it imports it.
A file that fails any check is refused with a log line naming the reason, and the
request runs cold: it is never loaded into a session.

Several instances may share the directory (one model, several writers; the file
system must support flock, as local disks, NFSv4 and CephFS do). Theory of
operation:
- Writes are atomic: a temporary file with a name no other writer uses (host, pid,
  random), fsync, rename over the session's file, fsync of the directory. A crash
  leaves the old file or the new one, never a half file that loads; temporary files
  older than STALE_TEMP_SECONDS are a crashed writer's and are removed at start-up.
- Ownership is a version check: `save` replaces a session's file only if the file is
  absent, unreadable, or still holds the `version` the caller loaded or last wrote
  (checked and renamed under an exclusive flock of LOCK_NAME, held for that moment
  only). An instance that served the same session meanwhile has written a newer
  version: the save is refused (a conflict, counted and logged) rather than overwrite
  that turn, and the table reloads the newer file before the session's next request
  here. So no file is ever corrupt, and no turn is lost silently: a session's files
  form one line of versions, each written by an instance that held the one before.
- Disk use stays within max_bytes across all writers: before a write the directory
  is listed afresh and the least recently used files (by modification time, which a
  load refreshes) of the writer's API key group or of groups holding more are
  removed to make room (_make_room), or the session is not written. Another
  instance may remove or replace a file meanwhile; a file that vanishes is no
  error, and one whose modification time changed since the listing is left alone.
A file's name is a digest of its session_key (the API key's digest and the client's
id) after the start of the key's digest (file_name), so any id is a safe name, none
can reach outside the directory, and two API keys' sessions of one id are two files.
A write that fails (disk full, read-only directory, no permission) is a warning, and
the session is not kept, as without --session-dir; it is never an error for a client.

Every method does blocking file I/O: callers run them on a worker thread, never on
the event loop.
"""
from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import pathlib
import secrets
import socket
import stat
import struct
import threading
import time
import zlib
from dataclasses import dataclass
from typing import BinaryIO, Iterator

log = logging.getLogger("llmd.sessions")

MAGIC = b"LLMDSESS"
# 2: the payload carries the recurrent state of hybrid models; 3: its keys and values in
# the engine's KV types (session_state.h), which an older file cannot say.
FORMAT_VERSION = 3
SUFFIX = ".session"
LOCK_NAME = ".lock"
CONFLICT = 0  # what `save` returns when another writer's version is in the file
KEY_TAG = 8  # hex digits of an API key's digest that logs show
STALE_TEMP_SECONDS = 600.0  # a temporary file this old is a crashed writer's: a write takes seconds
_PREFIX = struct.Struct("<8sIIQI")  # magic, version, metadata length, payload length, crc32
_MAX_METADATA = 64 << 20            # far above what MAX_REPLIES replies take
_SAMPLES, _SAMPLE_BYTES = 64, 4096  # tensor data read into the model fingerprint


def model_fingerprint(model_path: str, header_bytes: int, file_bytes: int, engine_library: str,
                      kernels: str) -> str:
    """What a session file must have been written by: the model file's header,
    metadata and tensor table, its size, 64 samples of 4 KiB spread over its tensor
    data (two files that agree on all that hold the same weights in practice), and
    the engine library itself and its kernel variant in use, whose kernels computed
    the keys and values (a rebuilt engine or another CPU's variant may round
    differently, and a restored cache must equal a fresh prefill)."""
    h = hashlib.sha256(b"llmd model fingerprint 2\0")
    h.update(kernels.encode() + b"\0")
    h.update(file_bytes.to_bytes(8, "little"))
    with open(model_path, "rb") as f:
        left = header_bytes
        while left > 0 and (chunk := f.read(min(left, 8 << 20))):
            h.update(chunk)
            left -= len(chunk)
        data = file_bytes - header_bytes
        for i in range(_SAMPLES if data > 0 else 0):
            f.seek(header_bytes + data * i // _SAMPLES)
            h.update(f.read(_SAMPLE_BYTES))
    with open(engine_library, "rb") as f:
        h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


@dataclass(frozen=True)
class Saved:
    """A session as its file holds it."""

    key: str                            # session_key
    payload: memoryview                 # the engine's state bytes (Session.import_state)
    replies: list[tuple[str, list[int]]]
    owner: str | None                   # the prefix cache scope that filled it (Slot.owner)
    n_tokens: int
    version: int


WRITER = f"{socket.gethostname()}:{os.getpid()}"  # names the writer in a file's metadata


class Refused(Exception):
    """A session file that must not be loaded; the message says why."""


def session_key(principal: str, session_id: str) -> str:
    """A session's name in the session table and the store: the client's id after the
    digest of the API key the request presented (`principal`; "" without API keys:
    then the id alone). Ids hold no space, so no two keys' names meet."""
    return f"{principal} {session_id}" if principal else session_id


def shown(key: str) -> str:
    """A session_key as the logs show it: the client's id, quoted, and the first
    KEY_TAG hex digits of its API key's digest (as the access log's `key`), so that
    two keys' "chat-1" tell apart."""
    principal, _, session_id = key.rpartition(" ")
    return f"{session_id!r} of key {principal[:KEY_TAG]}" if principal else repr(session_id)


def file_name(key: str) -> str:
    """A session's file name: a digest of its session_key, safe whatever the id holds,
    after the start of the API key's digest (its group, for the disk budget)."""
    principal, _, _ = key.rpartition(" ")
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:40]
    return f"{principal[:16]}-{digest}{SUFFIX}" if principal else digest + SUFFIX


def group_of(name: str) -> str:
    """The API key group of a session file's name ("" for sessions without a key)."""
    group, dash, _ = name.partition("-")
    return group if dash else ""


def kv_type_name(kv_type_k: str, kv_type_v: str) -> str:
    """How a payload stores keys and values: "q8_0" for both, "q8_0/f16" for keys and
    values apart."""
    return kv_type_k if kv_type_k == kv_type_v else f"{kv_type_k}/{kv_type_v}"


def encode(key: str, fingerprint: str, n_ctx: int, n_tokens: int, replies: list[tuple[str, list[int]]],
           payload: bytes | memoryview, version: int = 1, kv_type: str = "f16",
           owner: str | None = None) -> list[bytes | memoryview]:
    """A session file's bytes, in pieces to write one after the other."""
    meta = json.dumps({"session_id": key, "model": fingerprint, "kv_type": kv_type, "n_ctx": n_ctx,
                       "n_tokens": n_tokens, "version": version, "writer": WRITER,
                       "saved_at": round(time.time(), 3), "replies": [[fp, ids] for fp, ids in replies],
                       "owner": owner}, separators=(",", ":")).encode()
    crc = zlib.crc32(payload, zlib.crc32(meta))
    return [_PREFIX.pack(MAGIC, FORMAT_VERSION, len(meta), len(payload), crc), meta, payload]


def decode(data: bytes, key: str, fingerprint: str, n_ctx: int, kv_type: str = "f16") -> Saved:
    """The session a file's bytes hold, if they may be loaded for the session `key` by this
    model at this context with this KV type (kv_type_name); else Refused with the reason."""
    if len(data) < _PREFIX.size or data[:len(MAGIC)] != MAGIC:
        raise Refused("not an llmd session file")
    _, version, meta_len, payload_len, crc = _PREFIX.unpack_from(data)
    if version != FORMAT_VERSION:
        raise Refused(f"format version {version}; this llmd reads version {FORMAT_VERSION}")
    expected = _PREFIX.size + meta_len + payload_len
    if meta_len > _MAX_METADATA or len(data) != expected:
        raise Refused(f"truncated or padded: {len(data)} bytes where its header says {expected}")
    view = memoryview(data)
    meta_bytes, payload = view[_PREFIX.size:_PREFIX.size + meta_len], view[_PREFIX.size + meta_len:]
    if zlib.crc32(payload, zlib.crc32(meta_bytes)) != crc:
        raise Refused("checksum mismatch: the file is corrupted")
    try:
        meta = json.loads(bytes(meta_bytes))
        replies = [(str(fp), [int(i) for i in ids]) for fp, ids in meta["replies"]]
        saved_id, model, ctx, n_tokens = meta["session_id"], meta["model"], meta["n_ctx"], int(meta["n_tokens"])
        # Files from before several writers shared a directory: version 0.
        version, stored = int(meta.get("version", 0)), str(meta["kv_type"])
        owner = meta.get("owner")  # absent from files before scopes were kept
        if owner is not None and not isinstance(owner, str):
            raise TypeError(f"owner is a {type(owner).__name__}")
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError, RecursionError) as exc:
        raise Refused(f"unreadable metadata ({type(exc).__name__}: {exc})") from None
    if saved_id != key:
        raise Refused("it belongs to another session id or API key")
    if model != fingerprint:
        raise Refused("it was written for another model file or another llmd engine build")
    if stored != kv_type:
        raise Refused(f"its KV cache is stored as {stored!r}; this engine stores {kv_type!r}")
    if ctx != n_ctx:
        raise Refused(f"it was written at a context of {ctx} tokens; this server runs {n_ctx}")
    return Saved(key, payload, replies, owner, n_tokens, version)


def open_regular(path: str | os.PathLike) -> BinaryIO:
    """A session file opened for reading: a regular file, not a link, a FIFO (whose
    open would wait for a writer) or a device; else OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return open(fd, "rb")


def read_version(path: str | os.PathLike) -> int | None:
    """The version a session file holds, from its header and metadata alone; None when
    there is no file or it is unreadable (such a file may be replaced)."""
    try:
        with open_regular(path) as f:
            prefix = f.read(_PREFIX.size)
            if len(prefix) < _PREFIX.size or prefix[:len(MAGIC)] != MAGIC:
                return None
            _, version, meta_len, _, _ = _PREFIX.unpack(prefix)
            if version != FORMAT_VERSION or meta_len > _MAX_METADATA:
                return None
            meta = json.loads(f.read(meta_len))
        return int(meta.get("version", 0))
    except (OSError, ValueError, TypeError, AttributeError, OverflowError, RecursionError):
        return None


class SessionStore:
    """The session files of one directory, within a disk budget (see the module doc)."""

    def __init__(self, directory: str | os.PathLike, max_bytes: int, fingerprint: str, n_ctx: int,
                 kv_type: str = "f16", max_file: int | None = None):
        self.directory = pathlib.Path(directory)
        self.max_bytes = max_bytes  # 0: no limit
        self.max_file = max_file    # the largest file a session of the engine writes (None: unbounded)
        self.fingerprint = fingerprint
        self.n_ctx = n_ctx
        self.kv_type = kv_type  # kv_type_name of the engine's KV types
        self._files: dict[str, tuple[int, float]] = {}  # file name -> (bytes, mtime), as last listed
        self._lock = threading.Lock()        # guards _files and the counts
        # Files written, loaded, refused; failed writes; saves refused by the version check.
        self.saved = self.loaded = self.refused = self.failed = self.conflicts = 0
        self._write_lock = threading.Lock()  # one write at a time in this process: make room, then write

    def scan(self) -> None:
        """Create the directory if need be and list its session files; temporary files
        a crashed writer left behind are removed (not those another writer is writing).
        OSError if the directory cannot be listed."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._list(remove_stale=True)

    def _list(self, remove_stale: bool = False) -> list[tuple[float, str, int]]:
        """List the session files afresh: (mtime, name, bytes) of each, oldest first."""
        files, now = {}, time.time()
        for entry in os.scandir(self.directory):
            try:
                if entry.name.endswith(SUFFIX) and entry.is_file(follow_symlinks=False):
                    st = entry.stat(follow_symlinks=False)
                    files[entry.name] = (st.st_size, st.st_mtime)
                elif (remove_stale and entry.name.startswith(".") and entry.name.endswith(".tmp")
                      and now - entry.stat(follow_symlinks=False).st_mtime > STALE_TEMP_SECONDS):
                    self._unlink(entry.name)
            except FileNotFoundError:
                continue  # removed by another instance as we listed it
        with self._lock:
            self._files = files
        return sorted((mtime, name, size) for name, (size, mtime) in files.items())

    @property
    def count(self) -> int:
        return len(self._files)

    @property
    def bytes_used(self) -> int:
        with self._lock:
            return sum(size for size, _ in self._files.values())

    def has(self, key: str) -> bool:
        """Whether a file for the session is listed (no disk access; files other
        instances wrote since the last listing are not)."""
        return file_name(key) in self._files

    def path(self, key: str) -> pathlib.Path:
        return self.directory / file_name(key)

    def version(self, key: str) -> int | None:
        """The version the session's file holds now; None without a readable file."""
        return read_version(self.path(key))

    def load(self, key: str) -> Saved | None:
        """The saved session, or None when there is no file or it is refused (logged)."""
        name = file_name(key)
        path = self.directory / name
        try:
            with open_regular(path) as f:
                size = os.fstat(f.fileno()).st_size
                if self.max_file is not None and size > self.max_file:
                    raise Refused(f"{size} bytes, more than a session of this engine holds ({self.max_file})")
                data = f.read()
            saved = decode(data, key, self.fingerprint, self.n_ctx, self.kv_type)
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("cannot read the file of session %s (%s): %s; it starts cold", shown(key), path, exc)
            self.count_refused()
            return None
        except Refused as exc:
            log.warning("session file %s refused for session %s: %s; it starts cold", path, shown(key), exc)
            self.count_refused()
            return None
        try:  # a load is a use: the file is now the most recently used
            os.utime(path)
            with self._lock:
                self._files[name] = (len(data), time.time())
        except OSError:
            pass  # a read-only directory still restores; another instance may have removed it
        return saved

    def count_refused(self) -> None:
        """Count a file that was not loaded (also when the engine refused its payload)."""
        with self._lock:
            self.refused += 1

    def _count_failed(self) -> None:
        """Count a save that wrote nothing (too large, no room, or the disk failed)."""
        with self._lock:
            self.failed += 1

    def count_loaded(self) -> None:
        """Count a file whose session the engine took."""
        with self._lock:
            self.loaded += 1

    def save(self, key: str, payload: bytes | memoryview, replies: list[tuple[str, list[int]]],
             n_tokens: int, base: int = 0, owner: str | None = None) -> int | None:
        """Write the session's file atomically as version base + 1, if its file is
        absent, unreadable or still at version `base` (the version the caller loaded
        or last wrote; 0: none), removing the least recently used files if the budget
        needs room (_make_room); `owner` is Saved.owner. The version written; CONFLICT if
        another writer's version is there, None (logged) if nothing was written."""
        pieces = encode(key, self.fingerprint, self.n_ctx, n_tokens, replies, payload, base + 1, self.kv_type,
                        owner)
        size = sum(len(p) for p in pieces)
        if self.max_bytes and size > self.max_bytes:
            log.warning("session %s takes %d bytes, more than --session-dir-max (%d): not saved",
                        shown(key), size, self.max_bytes)
            self._count_failed()
            return None
        name = file_name(key)
        path = self.directory / name
        tmp = self.directory / f".{name}.{WRITER.replace(':', '-')}-{secrets.token_hex(4)}.tmp"
        written = False  # whether tmp exists, to be removed on failure
        with self._write_lock:
            try:
                if not self._make_room(name, size):
                    log.warning("session %s not saved: it would take more than its API key's share of "
                                "--session-dir-max (%d bytes)", shown(key), self.max_bytes)
                    self._count_failed()
                    return None
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                written = True
                with open(fd, "wb") as f:
                    for piece in pieces:
                        f.write(piece)
                    f.flush()
                    os.fsync(f.fileno())
                with self._locked():
                    current = read_version(path)
                    if current is not None and current != base:
                        self._unlink(tmp.name)
                        log.info("session %s not saved: its file is at version %d, written by another "
                                 "instance since this one's version %d; it is reloaded before its next "
                                 "request here", shown(key), current, base)
                        with self._lock:
                            self.conflicts += 1
                        return CONFLICT
                    os.replace(tmp, path)
                self._sync_directory()
            except OSError as exc:
                if written:
                    self._unlink(tmp.name)
                log.warning("cannot save session %s in %s: %s; it is kept in memory only, as without "
                            "--session-dir", shown(key), self.directory, exc)
                self._count_failed()
                return None
        with self._lock:
            self._files[name] = (size, time.time())
            self.saved += 1
        return base + 1

    def remove(self, key: str) -> bool:
        """Delete the session's file; whether there was one."""
        name = file_name(key)
        with self._lock:
            self._files.pop(name, None)
        return self._unlink(name)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Holds an exclusive flock of the directory's lock file, which every instance
        writing there takes, for a `with` block."""
        fd = os.open(self.directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # which releases the lock

    def _make_room(self, name: str, size: int) -> bool:
        """Remove files (not `name`, which the write replaces) until `size` more bytes
        fit the budget, listing the directory afresh: other instances write and remove
        files in it too. Each removal takes the least recently used file of the writer's
        API key group or of a group holding more bytes than it (the write counted in it),
        of the group holding the most first: a key that saves many sessions removes its
        own files, never another key's that hold as much or less. False (nothing to be
        written) when only such files could make room."""
        if not self.max_bytes:
            return True
        mine = group_of(name)
        groups: dict[str, collections.deque] = collections.defaultdict(collections.deque)  # oldest first
        held = collections.Counter({mine: size})
        for mtime, n, b in self._list():
            if n != name:
                groups[group_of(n)].append((mtime, n, b))
                held[group_of(n)] += b
        used = sum(held.values()) - size
        while used + size > self.max_bytes and groups:
            allowed = [g for g in groups if g == mine or held[g] > held[mine]]
            if not allowed:
                return False
            group = max(allowed, key=lambda g: held[g])
            mtime, victim, victim_bytes = groups[group].popleft()
            if not groups[group]:
                del groups[group]
            held[group] -= victim_bytes
            with self._locked():  # not between another writer's version check and its rename
                try:
                    # Written or loaded since the listing: no longer among the oldest.
                    fresh = os.stat(self.directory / victim).st_mtime != mtime
                except FileNotFoundError:  # another instance removed it first
                    fresh = False
                removed = not fresh and self._unlink(victim)
            if fresh:
                continue
            used -= victim_bytes
            with self._lock:
                self._files.pop(victim, None)
            if removed:
                log.info("removed session file %s to stay within --session-dir-max", victim)
        return True

    def _unlink(self, name: str) -> bool:
        try:
            os.unlink(self.directory / name)
            return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            log.warning("cannot remove %s: %s", self.directory / name, exc)
            return False

    def _sync_directory(self) -> None:
        """Make the rename itself durable."""
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
