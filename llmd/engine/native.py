"""A small Pythonic wrapper over the native engine (native/include/llmd.h).

Every native failure becomes an EngineError carrying the native message; the
subclasses name the failures callers handle differently. Calls release the GIL
(cffi does so for every call into the library), so the event loop keeps running
while the executor thread computes.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from llmd._native import ffi, lib


class EngineError(Exception):
    """A native call failed; `status` is the llmd_status code."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class CapacityError(EngineError):
    """No session slot left."""


class ContextFullError(EngineError):
    """The tokens do not fit the context."""


class TokenError(EngineError):
    """A token id outside the vocabulary."""


class UnsupportedError(EngineError):
    """The model asks for what the engine does not run (an architecture, a tensor
    type, a kind of pooling or attention)."""


POOLING_RANK = 4  # Engine.pooling_type() of a reranker: its classifier head scores the input


_ERRORS = {
    lib.LLMD_ERR_CAPACITY: CapacityError,
    lib.LLMD_ERR_CONTEXT_FULL: ContextFullError,
    lib.LLMD_ERR_TOKEN: TokenError,
    lib.LLMD_ERR_UNSUPPORTED: UnsupportedError,
}


def _check(status: int) -> None:
    if status != lib.LLMD_OK:
        message = ffi.string(lib.llmd_last_error()).decode("utf-8", "replace")
        raise _ERRORS.get(status, EngineError)(status, message)


def _string(ptr) -> str:
    return ffi.string(ptr).decode("utf-8", "replace") if ptr != ffi.NULL else ""


@dataclass(frozen=True)
class FimTokens:
    """A model's fill-in-the-middle tokens: the prefix, suffix and middle markers, and
    where it has them, the repository name's and the file separator (None without)."""
    pre: int
    suf: int
    mid: int
    rep: int | None
    sep: int | None


@dataclass(frozen=True)
class EngineInfo:
    architecture: str
    name: str
    chat_template: str
    tokenizer_pre: str
    kernels: str
    n_ctx_train: int
    n_ctx: int
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_threads: int
    bos_id: int
    eos_id: int
    add_bos: bool
    eog_ids: tuple[int, ...]
    weight_bytes: int
    kv_bytes_per_token: int  # of the paged layers: all but the sliding-window rings
    kv_ring_bytes: int       # fixed bytes of the sliding-window layers' rings
    bytes_per_session: int
    max_sessions: int
    add_eos: bool = False
    vocab_only: bool = False  # a GGUF without weights: tokenizes, refuses sessions
    n_recurrent_layers: int = 0  # layers with a recurrent state: sessions rewind only to checkpoints
    recurrent_bytes: int = 0     # per session: that state, room for its checkpoints and a verification's trail
    kv_block_positions: int = 0  # KV memory is paged in blocks of this many positions
    kv_block_bytes: int = 0      # bytes of one block
    kv_shares_prefixes: bool = False  # sessions can share prefixes (recurrent layers through snapshots)
    warnings: tuple[str, ...] = ()  # what the file holds that the engine leaves unused
    kv_type_k: str = "f16"       # how the KV cache stores keys (one of llmd.engine.KV_TYPES)
    kv_type_v: str = "f16"       # and values
    n_layer_nextn: int = 0       # multi-token-prediction blocks the file has
    draft_nextn: bool = False    # sessions run the first of them (Session.draft_nextn)
    fim: FimTokens | None = None  # None: the model has no fill-in-the-middle markers
    n_labels: int = 0            # a reranker's classifier head: its labels (0: none)
    rerank_template: str = ""    # a reranker's prompt with {query} and {document} in it ("": none)


@dataclass(frozen=True)
class KVStats:
    """The paged KV memory now (llmd_engine_kv_stats)."""
    blocks_live: int     # held by sessions, each block once
    blocks_retired: int  # the prefix cache's, held by none
    block_refs: int      # holds over all live blocks: refs - live blocks are shared holds
    snapshots: int = 0        # recurrent states kept at block boundaries (hybrid models' prefix cache)
    snapshot_bytes: int = 0   # their bytes
    snapshot_budget: int = 0  # the most they may take (counted in capacity)


@dataclass(frozen=True)
class Sampling:
    """Per-request sampling; temperature 0 is greedy."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = 0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    infill: bool = False  # llama.cpp's fill-in-the-middle step after min-p (llmd_sampling.infill)


@dataclass(frozen=True)
class Token:
    id: int
    piece: bytes  # raw bytes; may split a UTF-8 character; empty for control tokens
    is_eos: bool
    is_terminal: bool  # an end-of-generation id, or the token that completed the grammar
    stopped: bool
    forced: bool = False  # the grammar's token budget overruled the model's choice
    logprob: float | None = None  # when asked for: log p(id) under the model's logits
    top: tuple[tuple[int, float], ...] = ()  # (id, logprob) most likely first, when asked for
    error: EngineError | None = None  # this session's step failed (nothing else holds): why


def _token(t) -> Token:
    if t.failed:
        return Token(0, b"", False, False, False, error=_ERRORS.get(t.failed, EngineError)(t.failed, _string(t.error)))
    piece = bytes(ffi.buffer(t.piece, t.piece_len)) if t.piece_len else b""
    return Token(t.token_id, piece, bool(t.is_eos), bool(t.is_terminal), bool(t.stopped), bool(t.forced))


def grammar_match(grammar: str, text: bytes) -> int:
    """Run grammar text over bytes: 0 no prefix of a sentence, 1 a proper prefix,
    2 a sentence that may go on, 3 a sentence nothing may follow."""
    data = grammar.encode("ascii")
    result = ffi.new("int32_t *")
    _check(lib.llmd_grammar_match(data, len(data), text, len(text), result))
    return result[0]


def _fim(raw) -> FimTokens | None:
    if min(raw.fim_pre_id, raw.fim_suf_id, raw.fim_mid_id) < 0:
        return None
    return FimTokens(raw.fim_pre_id, raw.fim_suf_id, raw.fim_mid_id, raw.fim_rep_id if raw.fim_rep_id >= 0 else None,
                     raw.fim_sep_id if raw.fim_sep_id >= 0 else None)


class Engine:
    """A loaded model. Close it (or use `with`) to free weights and sessions."""

    def __init__(self, path: str, *, n_threads: int = 0, n_ctx: int = 0, max_sessions: int = 0,
                 kv_budget_bytes: int = 0, prefix_cache_bytes: int = 0, kv_type_k: str = "f16",
                 kv_type_v: str = "f16", draft_nextn: bool = False):
        names = [ffi.new("char[]", kv_type_k.encode()), ffi.new("char[]", kv_type_v.encode())]
        opts = ffi.new("llmd_engine_options *", {
            "n_threads": n_threads, "n_ctx": n_ctx, "max_sessions": max_sessions,
            "kv_budget_bytes": kv_budget_bytes, "prefix_cache_bytes": prefix_cache_bytes,
            "kv_type_k": names[0], "kv_type_v": names[1], "draft_nextn": int(draft_nextn)})
        out = ffi.new("llmd_engine **")
        _check(lib.llmd_engine_open(str(path).encode(), opts, out))
        self._handle = out[0]
        self._sessions: set[Session] = set()
        raw = ffi.new("llmd_engine_info *")
        _check(lib.llmd_engine_get_info(self._handle, raw))
        self.info = EngineInfo(
            architecture=_string(raw.architecture), name=_string(raw.name),
            chat_template=_string(raw.chat_template), tokenizer_pre=_string(raw.tokenizer_pre),
            kernels=_string(raw.kernels),
            n_ctx_train=raw.n_ctx_train, n_ctx=raw.n_ctx, n_vocab=raw.n_vocab, n_embd=raw.n_embd,
            n_layer=raw.n_layer, n_head=raw.n_head, n_head_kv=raw.n_head_kv,
            n_threads=raw.n_threads, bos_id=raw.bos_id, eos_id=raw.eos_id,
            add_bos=bool(raw.add_bos), eog_ids=tuple(raw.eog_ids[i] for i in range(raw.n_eog)),
            weight_bytes=raw.weight_bytes, kv_bytes_per_token=raw.kv_bytes_per_token,
            kv_ring_bytes=raw.kv_ring_bytes,
            bytes_per_session=raw.bytes_per_session, max_sessions=raw.max_sessions,
            add_eos=bool(raw.add_eos), vocab_only=bool(raw.vocab_only),
            n_recurrent_layers=raw.n_recurrent_layers, recurrent_bytes=raw.recurrent_bytes,
            kv_block_positions=raw.kv_block_positions, kv_block_bytes=raw.kv_block_bytes,
            kv_shares_prefixes=bool(raw.kv_shares_prefixes),
            warnings=tuple(w for w in _string(raw.warnings).split("\n") if w),
            kv_type_k=_string(raw.kv_type_k), kv_type_v=_string(raw.kv_type_v),
            n_layer_nextn=raw.n_layer_nextn, draft_nextn=bool(raw.draft_nextn), fim=_fim(raw),
            n_labels=raw.n_labels, rerank_template=_string(raw.rerank_template))
        self._token_out = ffi.new("llmd_token[]", 64)

    def close(self) -> None:
        if self._handle is not None:
            for s in self._sessions:
                s._handle = None
            self._sessions.clear()
            lib.llmd_engine_free(self._handle)
            self._handle = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def handle(self):
        if self._handle is None:
            raise EngineError(lib.LLMD_ERR_HANDLE, "the engine is closed")
        return self._handle

    def bandwidth(self, nbytes: int, passes: int = 5) -> tuple[int, float]:
        """(weight bytes one decode step reads, bytes per second the engine's threads
        read from a buffer of nbytes, median of `passes` passes)."""
        per_token, rate = ffi.new("uint64_t *"), ffi.new("double *")
        _check(lib.llmd_engine_bandwidth(self.handle, nbytes, passes, per_token, rate))
        return per_token[0], rate[0]

    def pooling_type(self) -> int:
        """The embedding pooling the file declares: 0 none, 1 mean, 2 cls, 3 last, 4 rank
        (POOLING_RANK)."""
        out = ffi.new("int32_t *")
        _check(lib.llmd_engine_pooling_type(self.handle, out))
        return out[0]

    def capacity(self, budget_bytes: int) -> tuple[int, int]:
        """(max sessions, bytes per session) for a KV memory budget."""
        n, per = ffi.new("int32_t *"), ffi.new("uint64_t *")
        _check(lib.llmd_engine_capacity(self.handle, budget_bytes, n, per))
        return n[0], per[0]

    def file_layout(self) -> tuple[int, int]:
        """(bytes before the tensor data: header, metadata, tensor table; file size)."""
        header, size = ffi.new("uint64_t *"), ffi.new("uint64_t *")
        _check(lib.llmd_engine_file_layout(self.handle, header, size))
        return header[0], size[0]

    def live_sessions(self) -> int:
        """Sessions of this engine not yet freed; safe from any thread."""
        n = ffi.new("int32_t *")
        _check(lib.llmd_engine_live_sessions(self.handle, n))
        return n[0]

    def kv_stats(self) -> KVStats:
        """The paged KV memory now; safe from any thread."""
        out = ffi.new("llmd_kv_stats *")
        _check(lib.llmd_engine_kv_stats(self.handle, out))
        return KVStats(out.blocks_live, out.blocks_retired, out.block_refs, out.snapshots, out.snapshot_bytes,
                       out.snapshot_budget)

    def tokenize(self, text: str | bytes, special: bool = False) -> list[int]:
        """Token ids of text; with special, control-token text becomes control ids. No BOS."""
        data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
        n = ffi.new("size_t *")
        capacity = len(data) + 1  # enough for byte-level BPE; SentencePiece may ask for more
        out = ffi.new("int32_t[]", capacity)
        status = lib.llmd_tokenize(self.handle, data, len(data), int(special), out, capacity, n)
        if status == lib.LLMD_ERR_INVALID_ARGUMENT and n[0] > capacity:
            capacity = n[0]
            out = ffi.new("int32_t[]", capacity)
            status = lib.llmd_tokenize(self.handle, data, len(data), int(special), out, capacity, n)
        _check(status)
        return list(ffi.unpack(out, n[0]))

    def tokenize_marked(self, text: bytes, markers: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
        """Token ids of a whole prompt, with control-token text matched only inside the
        `markers` byte ranges (sorted [begin, end) pairs), and per id the byte offset
        where it starts (-1 where the tokenizer cannot tell). No BOS."""
        n = ffi.new("size_t *")
        ranges = ffi.new("uint64_t[]", [bound for marker in markers for bound in marker])
        capacity = len(text) + 1
        for _ in range(2):  # again with the size asked for: SentencePiece may need more
            out, offsets = ffi.new("int32_t[]", capacity), ffi.new("int64_t[]", capacity)
            status = lib.llmd_tokenize_marked(self.handle, text, len(text), ranges, len(markers), out, offsets,
                                              capacity, n)
            if status != lib.LLMD_ERR_INVALID_ARGUMENT or n[0] <= capacity:
                break
            capacity = n[0]
        _check(status)
        return list(ffi.unpack(out, n[0])), list(ffi.unpack(offsets, n[0]))

    def piece(self, token_id: int, special: bool = False) -> bytes:
        data, size = ffi.new("const char **"), ffi.new("size_t *")
        _check(lib.llmd_token_piece(self.handle, token_id, int(special), data, size))
        return bytes(ffi.buffer(data[0], size[0])) if size[0] else b""

    def detokenize(self, ids: list[int], special: bool = False) -> bytes:
        return b"".join(self.piece(i, special) for i in ids)

    def new_session(self) -> Session:
        out = ffi.new("llmd_session **")
        _check(lib.llmd_session_new(self.handle, out))
        session = Session(self, out[0])
        self._sessions.add(session)
        return session

    def decode_batch(self, sessions: list[Session], logprobs: list[int | None] | None = None) -> list[Token]:
        """One step for several sessions at once; equals decode_one on each, but a session
        whose step fails gets a Token with its `error` instead of raising.
        logprobs[i], if not None, asks for session i's token logprob and that many top ones."""
        handles = ffi.new("llmd_session *[]", [s.handle for s in sessions])
        out = self._token_out if len(sessions) <= 64 else ffi.new("llmd_token[]", len(sessions))
        _check(lib.llmd_session_decode_batch(handles, len(sessions), out))
        tokens = [_token(out[i]) for i in range(len(sessions))]
        for i, n_top in enumerate(logprobs or ()):
            if n_top is not None and not tokens[i].stopped and tokens[i].error is None:
                logprob, top = sessions[i].token_logprobs(n_top)
                tokens[i] = dataclasses.replace(tokens[i], logprob=logprob, top=top)
        return tokens

    def decode_drafts(self, sessions: list[Session], drafts: list[list[int]],
                      logprobs: list[int | None] | None = None) -> list[list[Token]]:
        """Speculative decoding: for each session the steps decode_one would take, one
        to len(drafts[i]) + 1 of them, verified in one forward pass for all
        (llmd_session_decode_drafts): the tokens equal those decode_one calls would
        give, as long as they agree with the drafts; a session whose step fails ends its
        list with a Token holding the `error`. logprobs[i], if not None, gives session i's
        tokens their logprob and that many top ones."""
        n = len(sessions)
        handles = ffi.new("llmd_session *[]", [s.handle for s in sessions])
        rooms = [len(d) + 1 for d in drafts]
        out = ffi.new("llmd_token[]", sum(rooms))
        n_out = ffi.new("size_t[]", n)
        c_drafts = ffi.new("int32_t[]", [i for d in drafts for i in d])
        n_drafts = ffi.new("size_t[]", [len(d) for d in drafts])
        tops = [-1 if t is None else t for t in logprobs] if logprobs and any(t is not None for t in logprobs) else None
        n_top = ffi.new("int32_t[]", tops) if tops is not None else ffi.NULL
        lps = ffi.new("float[]", sum(rooms)) if tops is not None else ffi.NULL
        top_room = sum(r * max(t, 0) for r, t in zip(rooms, tops)) if tops is not None else 0
        top_ids, top_lps = ffi.new("int32_t[]", top_room), ffi.new("float[]", top_room)
        _check(lib.llmd_session_decode_drafts(handles, n, c_drafts, n_drafts, n_top, out, lps, top_ids, top_lps,
                                              n_out))
        result, at, top_at = [], 0, 0
        for i in range(n):
            tokens = [_token(out[at + j]) for j in range(n_out[i])]
            if tops is not None and tops[i] >= 0 and not tokens[0].stopped:
                t = tops[i]
                tokens = [tok if tok.error else
                          dataclasses.replace(tok, logprob=lps[at + j],
                                              top=tuple((top_ids[top_at + j * t + m], top_lps[top_at + j * t + m])
                                                        for m in range(t)))
                          for j, tok in enumerate(tokens)]
            result.append(tokens)
            at += rooms[i]
            top_at += rooms[i] * max(tops[i], 0) if tops is not None else 0
        return result


class Session:
    """One conversation's KV cache and sampler; created by Engine.new_session()."""

    def __init__(self, engine: Engine, handle):
        self._engine = engine
        self._handle = handle
        self._token_out = ffi.new("llmd_token *")

    @property
    def handle(self):
        if self._handle is None:
            raise EngineError(lib.LLMD_ERR_HANDLE, "the session is closed")
        return self._handle

    def close(self) -> None:
        if self._handle is not None:
            lib.llmd_session_free(self._handle)
            self._handle = None
            self._engine._sessions.discard(self)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def position(self) -> int:
        """Tokens in the KV cache (a pending sampled token is not counted)."""
        pos = ffi.new("int32_t *")
        _check(lib.llmd_session_position(self.handle, pos))
        return pos[0]

    def reset(self) -> None:
        _check(lib.llmd_session_reset(self.handle))

    def truncate(self, pos: int) -> None:
        _check(lib.llmd_session_truncate(self.handle, pos))

    def draft_nextn(self, k: int) -> list[int]:
        """Up to k ids to follow the pending token, from the model's multi-token-prediction
        block (an engine opened with draft_nextn; llmd_session_draft_nextn)."""
        out, n = ffi.new("int32_t[]", max(k, 1)), ffi.new("size_t *")
        _check(lib.llmd_session_draft_nextn(self.handle, k, out, n))
        return list(ffi.unpack(out, n[0]))

    @property
    def resume_floor(self) -> int:
        """The smallest position > 0 that truncate() accepts (0: any): below it a
        sliding-window layer's ring no longer holds what the next token attends."""
        pos = ffi.new("int32_t *")
        _check(lib.llmd_session_resume_floor(self.handle, pos))
        return pos[0]

    @property
    def checkpoints(self) -> list[int] | None:
        """Where truncate() may rewind a model with recurrent layers besides 0 and the
        current position (ascending); None for a model without them (any position)."""
        if self._engine.info.n_recurrent_layers == 0:
            return None
        n = ffi.new("size_t *")
        out = ffi.new("int32_t[]", 64)
        status = lib.llmd_session_checkpoints(self.handle, out, 64, n)
        if status == lib.LLMD_ERR_INVALID_ARGUMENT and n[0] > 64:
            out = ffi.new("int32_t[]", n[0])
            status = lib.llmd_session_checkpoints(self.handle, out, n[0], n)
        _check(status)
        return list(ffi.unpack(out, n[0]))

    @property
    def resume_points(self) -> list[int] | None:
        """The positions truncate() accepts besides 0 on a model with recurrent layers:
        its checkpoints and the current position; None when it accepts any."""
        points = self.checkpoints
        return None if points is None else sorted({*points, self.position})

    def tokens(self) -> list[int]:
        """The ids in the KV cache, oldest first."""
        n = ffi.new("size_t *")
        out = ffi.new("int32_t[]", max(self.position, 1))
        _check(lib.llmd_session_tokens(self.handle, out, len(out), n))
        return list(ffi.unpack(out, n[0]))

    def export_state(self, n_tokens: int | None = None) -> memoryview:
        """The first n_tokens ids in the KV cache (default: all) and their keys and
        values, as the bytes import_state restores (native/src/memory/session_state.h); no
        checksum, no model identity: llmd.serving.session_store adds both. The session is
        not changed."""
        n = self.position if n_tokens is None else n_tokens
        size = ffi.new("size_t *")
        _check(lib.llmd_session_state_size(self.handle, n, size))
        out = ffi.new("uint8_t[]", size[0])
        _check(lib.llmd_session_export(self.handle, n, out, size[0]))
        return memoryview(ffi.buffer(out))

    def import_state(self, data: bytes | memoryview) -> None:
        """Replace the cache with exported bytes; EngineError (LLMD_ERR_FORMAT) with the
        reason, and the session unchanged, for bytes this engine cannot take."""
        _check(lib.llmd_session_import(self.handle, ffi.from_buffer(data), len(data)))

    def prefill(self, ids: list[int]) -> None:
        _check(lib.llmd_session_prefill(self.handle, ffi.new("int32_t[]", ids), len(ids)))

    def share_prefix(self, scope: str, ids: list[int], keep: int) -> int:
        """Join the prefix cache of `scope`; if it holds more of ids than the `keep`
        tokens of the session's own cache, make the cache that prefix and return its
        length, else 0 (the session unchanged). See llmd_session_share_prefix."""
        data = scope.encode("utf-8", "surrogatepass")
        out = ffi.new("int32_t *")
        _check(lib.llmd_session_share_prefix(self.handle, data, len(data), ffi.new("int32_t[]", ids), len(ids),
                                             keep, out))
        return out[0]

    def set_sampling(self, s: Sampling) -> None:
        ids = ffi.new("int32_t[]", list(s.logit_bias.keys()))
        values = ffi.new("float[]", list(s.logit_bias.values()))
        raw = ffi.new("llmd_sampling *", {
            "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p,
            "seed": s.seed & 0xFFFFFFFFFFFFFFFF, "repeat_penalty": s.repeat_penalty,
            "repeat_last_n": s.repeat_last_n, "presence_penalty": s.presence_penalty,
            "frequency_penalty": s.frequency_penalty, "n_logit_bias": len(s.logit_bias),
            "logit_bias_ids": ids, "logit_bias_values": values, "infill": int(s.infill)})
        _check(lib.llmd_session_set_sampling(self.handle, raw))

    def set_grammar(self, grammar: str | None, token_budget: int = 0) -> None:
        """Constrain the next decode steps to grammar text (llmd.structured.grammar); None removes
        it. token_budget > 0: always leave room to finish within that many tokens."""
        data = (grammar or "").encode("ascii")
        _check(lib.llmd_session_set_grammar(self.handle, data, len(data), token_budget))

    def grammar_mask(self, fast: bool = True) -> bytes:
        """Per token id: 0 rejected by the grammar, 1 allowed but over the budget, 2 allowed.
        fast walks the vocabulary trie (the sampler's path), else each token alone."""
        n = self._engine.info.n_vocab
        out = ffi.new("uint8_t[]", n)
        _check(lib.llmd_session_grammar_mask(self.handle, out, n, int(fast)))
        return bytes(ffi.buffer(out, n))

    def decode_one(self) -> Token:
        _check(lib.llmd_session_decode_one(self.handle, self._token_out))
        return _token(self._token_out)

    def decode_draft(self, draft: list[int], logprobs: int | None = None) -> list[Token]:
        """Speculative decoding of this session alone: Engine.decode_drafts."""
        return self._engine.decode_drafts([self], [draft], [logprobs])[0]

    def stop(self) -> None:
        """Thread-safe: the next decode step returns a stopped step."""
        if self._handle is not None:
            lib.llmd_session_stop(self._handle)

    def logits(self) -> list[float]:
        n = self._engine.info.n_vocab
        out = ffi.new("float[]", n)
        _check(lib.llmd_session_logits(self.handle, out, n))
        return list(ffi.unpack(out, n))

    def score(self, ids: list[int], first: int) -> list[float]:
        """Prefill ids; log p(ids[i+1] | ids[..i]) for i in [first, len(ids) - 1)."""
        if first < 0:  # cffi cannot pass a negative size_t; the engine checks the rest
            raise EngineError(lib.LLMD_ERR_INVALID_ARGUMENT, "score needs first >= 0")
        out = ffi.new("float[]", max(0, len(ids) - 1 - first))
        _check(lib.llmd_session_score(self.handle, ffi.new("int32_t[]", ids), len(ids), first, out))
        return list(ffi.unpack(out, len(ids) - 1 - first))

    def score_top(self, ids: list[int], first: int, n_top: int) -> list[tuple[float, tuple[tuple[int, float], ...]]]:
        """As score, with each position's n_top most likely (id, logprob), most likely first."""
        if first < 0:
            raise EngineError(lib.LLMD_ERR_INVALID_ARGUMENT, "score needs first >= 0")
        n = max(0, len(ids) - 1 - first)
        out = ffi.new("float[]", n)
        top_ids, top_lps = ffi.new("int32_t[]", n * max(n_top, 0)), ffi.new("float[]", n * max(n_top, 0))
        _check(lib.llmd_session_score_top(self.handle, ffi.new("int32_t[]", ids), len(ids), first, n_top, out,
                                          top_ids, top_lps))
        return [(out[k], tuple((top_ids[k * n_top + j], top_lps[k * n_top + j]) for j in range(n_top)))
                for k in range(n)]

    def embed(self, ids: list[int]) -> list[float]:
        """The pooled, unnormalised embedding of ids (n_embd floats) as the model file's
        pooling says, or for rank pooling the classifier head's scores (n_labels floats);
        the ids run from position 0, or from the start of them the cache holds already."""
        info = self._engine.info
        n = info.n_labels if self._engine.pooling_type() == POOLING_RANK else info.n_embd
        out = ffi.new("float[]", n)
        _check(lib.llmd_session_embed(self.handle, ffi.new("int32_t[]", ids), len(ids), out, n))
        return list(ffi.unpack(out, n))

    def token_logprobs(self, n_top: int) -> tuple[float, tuple[tuple[int, float], ...]]:
        """The pending token's logprob and the n_top most likely (id, logprob) of its step."""
        logprob = ffi.new("float *")
        top_ids, top_lps = ffi.new("int32_t[]", max(n_top, 1)), ffi.new("float[]", max(n_top, 1))
        _check(lib.llmd_session_token_logprobs(self.handle, n_top, logprob, top_ids, top_lps))
        return logprob[0], tuple((top_ids[j], top_lps[j]) for j in range(n_top))


@dataclass(frozen=True)
class TensorType:
    """A GGUF tensor type as the engine's traits table describes it."""
    id: int
    name: str
    block_elems: int
    block_bytes: int
    runs: bool  # the engine has kernels for it

    def row_bytes(self, cols: int) -> int:
        """Bytes of a row of `cols` elements (a whole number of blocks)."""
        return cols // self.block_elems * self.block_bytes


def tensor_type(type_id: int) -> TensorType | None:
    """The engine's description of a GGUF type number, or None if GGUF defines no such type."""
    out = ffi.new("llmd_tensor_type_info *")
    if not 0 <= type_id < 2**31 or lib.llmd_tensor_type(type_id, out) != lib.LLMD_OK:  # an int32_t there
        return None
    return TensorType(type_id, ffi.string(out.name).decode(), out.block_elems, out.block_bytes, bool(out.runs))


def kernel_dequantize(type_id: int, data: bytes, n: int) -> list[float]:
    """n elements of a row of the type, by the engine's scalar reference (for tests)."""
    t = tensor_type(type_id)
    if t is not None and n > 0 and n % t.block_elems == 0 and len(data) < t.row_bytes(n):
        raise EngineError(lib.LLMD_ERR_INVALID_ARGUMENT, "data is shorter than n elements")
    out = ffi.new("float[]", max(n, 0))
    _check(lib.llmd_kernel_dequantize(type_id, data, n, out))
    return list(ffi.unpack(out, n))


def quantize_rows(src_type: int, src, rows: int, cols: int, dst_type: int, n_threads: int = 0) -> bytearray:
    """`rows` rows of `cols` elements of src_type (any buffer) re-encoded as dst_type
    by the engine's quantizers (quantize.h), over n_threads threads (0: one per core)."""
    src_info, dst_info = tensor_type(src_type), tensor_type(dst_type)
    if src_info is None or dst_info is None or rows < 0 or cols <= 0 or cols % dst_info.block_elems:
        raise EngineError(lib.LLMD_ERR_INVALID_ARGUMENT, f"cannot convert rows of {cols} elements from type "
                          f"{src_type} to {dst_type}")
    if cols % src_info.block_elems or len(src) != rows * src_info.row_bytes(cols):
        raise EngineError(lib.LLMD_ERR_INVALID_ARGUMENT, f"the source holds {len(src)} bytes, not {rows} rows of "
                          f"{cols} {src_info.name} elements")
    out = bytearray(rows * dst_info.row_bytes(cols))
    with ffi.from_buffer(src) as p_src, ffi.from_buffer(out) as p_out:
        _check(lib.llmd_quantize_rows(src_type, p_src, rows, cols, dst_type, p_out, n_threads))
    return out


@dataclass(frozen=True)
class KernelVariant:
    name: str   # "scalar", "avx2", "avx-vnni", "avx512", ...
    runs: bool  # this CPU has its instructions


def kernel_variants() -> list[KernelVariant]:
    """The kernel variants this build carries, the scalar one first (the kernel_*
    functions below take one's name, or None for the scalar references)."""
    found = []
    for i in range(lib.llmd_kernel_variant_count()):
        name, runs = ffi.new("const char **"), ffi.new("int32_t *")
        _check(lib.llmd_kernel_variant(i, name, runs))
        found.append(KernelVariant(_string(name[0]), bool(runs[0])))
    return found


def _variant(kernels: str | None):
    return ffi.NULL if kernels is None else kernels.encode()


def kernel_attention(q: list[list[float]], k: list[float], v: list[float], n_pos: int, head_dim: int,
                     n_ranges: int, kernels: str | None, run: int = 0, kv_type_k: str = "f16",
                     kv_type_v: str = "f16", sinks: list[float] | None = None,
                     softcap: float = 0.0) -> list[list[float]]:
    """Attention of the query heads q over n_pos key and value rows (k, v: n_pos x
    head_dim floats) stored as a KV cache of those types stores them, the rows split
    into n_ranges ranges and stored in runs of `run` positions (0: one run), with a
    sink logit per query head in its softmax's denominator if given and each score
    soft-capped to softcap · tanh(score / softcap) if softcap > 0, by a kernel variant
    or the scalar reference (None) (for tests)."""
    if any(len(h) != head_dim for h in q) or min(len(k), len(v)) < n_pos * head_dim:
        raise EngineError(lib.LLMD_ERR_INVALID_ARGUMENT, "q, k or v do not match n_pos x head_dim")
    if sinks is not None and len(sinks) != len(q):
        raise EngineError(lib.LLMD_ERR_INVALID_ARGUMENT, "sinks must hold one logit per query head")
    out = ffi.new("float[]", len(q) * head_dim)
    _check(lib.llmd_kernel_attention(ffi.new("float[]", [x for h in q for x in h]), len(q), ffi.new("float[]", k),
                                     ffi.new("float[]", v), n_pos, head_dim, kv_type_k.encode(), kv_type_v.encode(),
                                     n_ranges, run, ffi.NULL if sinks is None else ffi.new("float[]", sinks), softcap,
                                     out, _variant(kernels)))
    flat = list(ffi.unpack(out, len(q) * head_dim))
    return [flat[g * head_dim:(g + 1) * head_dim] for g in range(len(q))]


def kernel_glu(gelu: bool, gate: list[float], up: list[float] | None, kernels: str | None) -> list[float]:
    """act(gate) * up elementwise (act(gate) when up is None), act SiLU or GELU (tanh
    approximation), by a kernel variant or the scalar reference (None) (for tests)."""
    if up is not None and len(gate) != len(up):
        raise EngineError(lib.LLMD_ERR_INVALID_ARGUMENT, "gate and up differ in length")
    out = ffi.new("float[]", gate)
    up_ptr = ffi.NULL if up is None else ffi.new("float[]", up)
    _check(lib.llmd_kernel_glu(int(gelu), out, up_ptr, len(gate), _variant(kernels)))
    return list(ffi.unpack(out, len(gate)))


def kernel_rmsnorm(x: list[float], weight: list[float], eps: float, kernels: str | None) -> list[float]:
    """x / rms(x) * weight, by a kernel variant or the scalar reference (None) (for tests)."""
    if len(x) != len(weight):
        raise EngineError(lib.LLMD_ERR_INVALID_ARGUMENT, "x and weight differ in length")
    out = ffi.new("float[]", max(1, len(x)))
    _check(lib.llmd_kernel_rmsnorm(ffi.new("float[]", x), ffi.new("float[]", weight), len(x), eps, out,
                                   _variant(kernels)))
    return list(ffi.unpack(out, len(x)))


def kernel_kv_row(kv_type: str, x: list[float], kernels: str | None) -> bytes:
    """x as the KV cache writes a key or value of that type (f16 bits, or Q8_0 / Q4_0
    blocks), by a kernel variant or the scalar reference (None) (for tests)."""
    capacity = 2 * len(x) + 2
    out, written = ffi.new("uint8_t[]", capacity), ffi.new("size_t *")
    _check(lib.llmd_kernel_kv_row(kv_type.encode(), ffi.new("float[]", x), len(x), out, capacity, written,
                                  _variant(kernels)))
    return bytes(ffi.buffer(out, written[0]))


def kernel_quantize(x: list[float], group: int, kernels: str | None) -> tuple[list[int], list[float], list[int]]:
    """x quantized as the integer kernels read activations: (int8 values, a scale per
    block of 32, (sum, sum of the first 16) per block), by a kernel variant or the
    scalar reference (None) (for tests)."""
    blocks = max(1, len(x) // 32)
    qs, d, sums = ffi.new("int8_t[]", 32 * blocks), ffi.new("float[]", blocks), ffi.new("int32_t[]", 2 * blocks)
    _check(lib.llmd_kernel_quantize(ffi.new("float[]", x), len(x), group, qs, d, sums, _variant(kernels)))
    return list(ffi.unpack(qs, len(x))), list(ffi.unpack(d, len(x) // 32)), list(ffi.unpack(sums, 2 * (len(x) // 32)))


def kernel_matmul(type_id: int, weights: bytes, rows: int, cols: int, xs: list[list[float]],
                  kernels: str | None, packed: bool = True) -> list[list[float]]:
    """Each x in xs times the matrix, by the scalar reference (kernels None) or a kernel
    variant: over repacked panels where it has them for the type and `packed`, else
    its row kernels (for tests)."""
    # The engine checks type and shape; only here are the buffer lengths known.
    t = tensor_type(type_id)
    elems, size = (t.block_elems, t.block_bytes) if t is not None else (1, 0)
    if rows > 0 and cols > 0 and cols % elems == 0 and (
            any(len(x) != cols for x in xs) or len(weights) < rows * (cols // elems) * size):
        raise EngineError(lib.LLMD_ERR_INVALID_ARGUMENT, "weights or x do not match rows x cols")
    y = ffi.new("float[]", max(rows, 0) * len(xs))
    x = ffi.new("float[]", [v for x in xs for v in x])
    _check(lib.llmd_kernel_matmul(type_id, weights, rows, cols, x, len(xs), y, _variant(kernels), int(packed)))
    flat = list(ffi.unpack(y, max(rows, 0) * len(xs)))
    return [flat[t * rows:(t + 1) * rows] for t in range(len(xs))]
