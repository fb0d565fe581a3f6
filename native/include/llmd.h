/* llmd.h — the whole ABI between the Python control plane (llmd/) and the
 * native engine (native/). cffi reads this file, so it stays plain C: opaque
 * handles, sized integers, status codes. No C++ exception and no abort ever
 * crosses it; every failure is a status plus llmd_last_error().
 *
 * Threading: one engine and its sessions are driven from one thread at a time
 * (llmd's executor thread). llmd_session_stop() is the exception: any thread may
 * call it, and it is honoured at the next token boundary.
 */
#ifndef LLMD_H
#define LLMD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    LLMD_OK = 0,
    LLMD_ERR_INVALID_ARGUMENT = 1, /* null pointer, bad option, bad length */
    LLMD_ERR_IO = 2,               /* cannot open / map the file */
    LLMD_ERR_FORMAT = 3,           /* corrupt, truncated or hostile GGUF */
    LLMD_ERR_UNSUPPORTED = 4,      /* architecture or tensor type not supported */
    LLMD_ERR_OUT_OF_MEMORY = 5,
    LLMD_ERR_CAPACITY = 6,         /* no session slot left */
    LLMD_ERR_CONTEXT_FULL = 7,     /* the tokens do not fit in the context */
    LLMD_ERR_TOKEN = 8,            /* token id out of range */
    LLMD_ERR_HANDLE = 9,           /* freed or foreign session handle */
    LLMD_ERR_STATE = 10,           /* call not valid now (e.g. decode before prefill) */
    LLMD_ERR_INTERNAL = 11
} llmd_status;

/* Message for the last failed call on this thread ("" if none). */
const char *llmd_last_error(void);

typedef struct llmd_engine llmd_engine;
typedef struct llmd_session llmd_session;

/* ---- engine ------------------------------------------------------------ */

typedef struct {
    int32_t n_threads;      /* 0: one per core */
    int32_t n_ctx;          /* 0: the model's trained context length */
    int32_t max_sessions;   /* 0: as many as kv_budget_bytes allows */
    uint64_t kv_budget_bytes; /* 0: a default share of physical memory */
    uint64_t prefix_cache_bytes; /* retired prefix-cache blocks kept (LRU); 0: one context's worth */
    const char *kv_type_k;  /* how the KV cache stores keys: "f16", "q8_0" or "q4_0"; NULL or "": f16 */
    const char *kv_type_v;  /* and values, likewise (another name is LLMD_ERR_INVALID_ARGUMENT) */
    int32_t draft_nextn;    /* 1: sessions run the file's multi-token-prediction block beside the model, for
                               llmd_session_draft_nextn (a model without one is LLMD_ERR_UNSUPPORTED) */
} llmd_engine_options;

typedef struct {
    const char *architecture;   /* strings are owned by the engine */
    const char *name;
    const char *chat_template;  /* "" if the model has none */
    const char *tokenizer_pre;
    const char *kernels;        /* the kernel variant in use, e.g. "avx2" (llmd_kernel_variant) */
    int32_t n_ctx_train;
    int32_t n_ctx;              /* context per session */
    int32_t n_vocab;
    int32_t n_embd;
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t n_threads;
    int32_t bos_id;             /* -1 if none */
    int32_t eos_id;             /* -1 if none */
    int32_t add_bos;            /* 1 if prompts start with BOS */
    int32_t n_eog;              /* end-of-generation ids (EOS, EOT, ...) */
    const int32_t *eog_ids;
    uint64_t weight_bytes;      /* mapped tensor bytes */
    uint64_t kv_bytes_per_token; /* of the paged layers: all but the sliding-window rings */
    uint64_t kv_ring_bytes;     /* fixed bytes of the sliding-window layers' rings at n_ctx */
    uint64_t bytes_per_session; /* KV cache + per-session buffers at n_ctx */
    int32_t max_sessions;       /* serving capacity, scratch session included */
    int32_t add_eos;            /* 1 if prompts end with EOS */
    int32_t vocab_only;         /* 1 for a GGUF without weights: it tokenizes, sessions are refused */
    int32_t n_recurrent_layers; /* layers that keep a recurrent state instead of keys and values */
    uint64_t recurrent_bytes;   /* per session: that state, room for its checkpoints and a verification's trail */
    int32_t kv_block_positions; /* KV memory is paged in blocks of this many positions */
    uint64_t kv_block_bytes;    /* bytes of one block (every layer that attends all positions) */
    int32_t kv_shares_prefixes; /* 1 if sessions can share prefixes (paged layers; recurrent ones by snapshots) */
    const char *warnings;       /* "" or one a line: what the file holds that the engine leaves unused */
    const char *kv_type_k;      /* the KV cache's storage of keys: "f16", "q8_0" or "q4_0" */
    const char *kv_type_v;      /* and of values */
    int32_t n_layer_nextn;      /* multi-token-prediction blocks the file has (after the n_layer) */
    int32_t draft_nextn;        /* 1 if sessions run the first of them (llmd_engine_options.draft_nextn) */
    /* Fill-in-the-middle tokens, -1 if none: the prefix, suffix and middle markers,
     * the repository name's and the file separator (the file's ids, else found by text) */
    int32_t fim_pre_id, fim_suf_id, fim_mid_id, fim_rep_id, fim_sep_id;
    int32_t n_labels;           /* a reranker's classifier head: its labels (rows); 0 without one */
    const char *rerank_template; /* a reranker's prompt with {query} and {document} in it
                                  * (tokenizer.chat_template.rerank); "" if none */
} llmd_engine_info;

llmd_status llmd_engine_open(const char *path, const llmd_engine_options *options,
                             llmd_engine **out);
void llmd_engine_free(llmd_engine *engine); /* frees its sessions too */
llmd_status llmd_engine_get_info(const llmd_engine *engine, llmd_engine_info *out);

/* The pooling the model file declares for embeddings (`<arch>.pooling_type`, as
 * GGUF numbers it: 0 none, 1 mean, 2 cls, 3 last, 4 rank); 0 when it declares none. */
llmd_status llmd_engine_pooling_type(const llmd_engine *engine, int32_t *pooling_type);

/* The generation limit set by memory (benchmarks): *bytes_per_token, the weight bytes
 * one decode step reads, and *read_bytes_per_s, how fast the engine's threads read a
 * buffer of `bytes` (median of `passes` passes). Runs on the engine's threads, like
 * prefill. bytes: 1 MiB .. 64 GiB; passes: 1 .. 100. */
llmd_status llmd_engine_bandwidth(llmd_engine *engine, uint64_t bytes, int32_t passes,
                                  uint64_t *bytes_per_token, double *read_bytes_per_s);

/* The pooled embedding of ids (out: n_embd floats, not normalised): the final-normed
 * hidden states (the output head's input) pooled as the file declares: the mean over
 * the ids, the first id's (cls) or the last id's. For rank pooling (a reranker) out
 * gets the classifier head's n_labels scores of the last id's state instead, softmaxed
 * where the family's are (Qwen3's: the first is the relevance). The ids run through
 * the session from position 0, or from where its cache already holds their start
 * (pooling that reads one id's state; the same numbers); it then holds them, with no
 * logits. LLMD_ERR_UNSUPPORTED for a model that declares no pooling, rank pooling
 * without a classifier head, or non-causal attention (`<arch>.attention.causal`
 * false). */
llmd_status llmd_session_embed(llmd_session *session, const int32_t *ids, size_t n, float *out,
                               size_t n_out);

/* The model file's size and the bytes before its tensor data (GGUF header, metadata
 * and tensor table): what llmd/session_store.py hashes into a model fingerprint. */
llmd_status llmd_engine_file_layout(const llmd_engine *engine, uint64_t *header_bytes, uint64_t *file_bytes);

/* Sessions of this engine not yet freed. Any thread may call it (it is how a server
 * checks that its own bookkeeping agrees with the engine). */
llmd_status llmd_engine_live_sessions(const llmd_engine *engine, int32_t *n);

/* The paged KV memory now; any thread may call it. `live` blocks are held by
 * sessions (`refs` holds in all: a block several sessions share counts once in
 * live and once per session in refs); `retired` blocks are the prefix cache's,
 * held by none and kept for reuse under the engine's prefix_cache_bytes. A model
 * with recurrent layers also keeps `snapshots` of their state at block boundaries
 * (`snapshot_bytes` in all, within `snapshot_budget`, which capacity counts). */
typedef struct {
    int64_t blocks_live;
    int64_t blocks_retired;
    int64_t block_refs;
    int64_t snapshots;
    int64_t snapshot_bytes;
    int64_t snapshot_budget;
} llmd_kv_stats;
llmd_status llmd_engine_kv_stats(const llmd_engine *engine, llmd_kv_stats *out);

/* How many sessions fit in budget_bytes of KV memory at the engine's context. */
llmd_status llmd_engine_capacity(const llmd_engine *engine, uint64_t budget_bytes,
                                 int32_t *max_sessions, uint64_t *bytes_per_session);

/* Tokenize text (UTF-8, need not be NUL-terminated). With parse_special, control
 * tokens written in the text (<|im_start|>) become their ids; without, they stay
 * text (user-defined tokens are always matched, as in llama.cpp). No BOS or EOS
 * is added. Writes up to capacity ids; *n_out is the full count, and
 * LLMD_ERR_INVALID_ARGUMENT is returned if capacity was too small (call again
 * with *n_out). len + 1 ids suffice for byte-level BPE; SentencePiece writes a
 * space as U+2581, so up to 3 * (len + 1) may be needed. */
llmd_status llmd_tokenize(const llmd_engine *engine, const char *text, size_t len,
                          int32_t parse_special, int32_t *out, size_t capacity,
                          size_t *n_out);

/* Tokenize a chat prompt in one pass: as llmd_tokenize with parse_special, but a
 * control token's text becomes its id only where it lies wholly inside one of
 * the n_ranges byte ranges [ranges[2i], ranges[2i+1]) (sorted, not overlapping,
 * within len): the template's own markers, so that what a user typed stays text.
 * offsets (null, or capacity entries) gets per id the byte offset in text where
 * the token starts, or -1 where that cannot be told (a byte the vocabulary
 * reads as U+FFFD or as its unknown token). Capacity as for llmd_tokenize. */
llmd_status llmd_tokenize_marked(const llmd_engine *engine, const char *text, size_t len,
                                 const uint64_t *ranges, size_t n_ranges, int32_t *out,
                                 int64_t *offsets, size_t capacity, size_t *n_out);

/* The raw bytes of a token (may be part of a UTF-8 character). Control tokens
 * give their text only when special is non-zero, else an empty piece. The
 * pointer stays valid while the engine lives. */
llmd_status llmd_token_piece(const llmd_engine *engine, int32_t id, int32_t special,
                             const char **data, size_t *len);

/* ---- sessions ---------------------------------------------------------- */

typedef struct {
    float temperature;        /* <= 0: greedy */
    int32_t top_k;            /* <= 0: off */
    float top_p;              /* >= 1: off */
    float min_p;              /* <= 0: off */
    uint64_t seed;
    float repeat_penalty;     /* 1: off; applies to the last repeat_last_n ids */
    int32_t repeat_last_n;
    float presence_penalty;   /* 0: off; over the ids generated since set_sampling */
    float frequency_penalty;  /* 0: off */
    int32_t n_logit_bias;
    const int32_t *logit_bias_ids;
    const float *logit_bias_values; /* -inf bans a token */
    int32_t infill; /* 1: the fill-in-the-middle step after min-p (see sampler.h); greedy requests take
                       it too, weighing at temperature 1 and picking the most likely survivor */
} llmd_sampling;

typedef struct {
    int32_t token_id;
    const char *piece;   /* raw bytes, empty for control tokens; valid while the engine lives */
    size_t piece_len;
    int32_t is_eos;      /* the model's EOS id */
    int32_t is_terminal; /* any end-of-generation id, or the token that completed the grammar */
    int32_t stopped;     /* stop() was honoured: token 0, empty piece, nothing advanced */
    int32_t forced;      /* the grammar's token budget overruled the model's choice */
    int32_t failed;      /* 0, or the status this session's step failed with (its grammar, or logits that
                            are not finite); nothing else holds, and `error` says why */
    const char *error;   /* when failed: the message, valid until the session's next call */
} llmd_token;

/* Fails with LLMD_ERR_CAPACITY once max_sessions are live. */
llmd_status llmd_session_new(llmd_engine *engine, llmd_session **out);
void llmd_session_free(llmd_session *session); /* a freed handle is refused later */

/* Empty the KV cache and the pending token. */
llmd_status llmd_session_reset(llmd_session *session);

/* Append ids to the KV cache and compute the next-token logits. */
llmd_status llmd_session_prefill(llmd_session *session, const int32_t *ids, size_t n);

/* Set sampling parameters for the next decode steps, seed the RNG, clear the
 * generated-id history used by presence/frequency penalties and clear stop(). */
llmd_status llmd_session_set_sampling(llmd_session *session, const llmd_sampling *sampling);

/* One generation step. The sampled token is pending: it enters the KV cache at
 * the start of the next decode step (so the final token of a reply costs no
 * forward pass). position() counts only tokens in the KV cache. */
llmd_status llmd_session_decode_one(llmd_session *session, llmd_token *out);

/* One generation step for n sessions at once (weights read once per step).
 * Results equal n calls of decode_one. A session whose step fails (its grammar, or
 * logits that are not finite) gets a `failed` token and is left as a failed
 * decode_one leaves it; the others take their steps, and the call returns LLMD_OK.
 * decode_one returns such a failure as its status. */
llmd_status llmd_session_decode_batch(llmd_session *const *sessions, size_t n,
                                      llmd_token *out);

/* Speculative decoding: for each of n sessions, up to n_drafts[i] + 1 generation
 * steps, all in one forward pass. drafts holds, one session's after another, ids
 * guessed to follow each session's pending token (a drafter's proposal). The pending
 * tokens and the drafts run through the model together, with logits at every
 * position; then, position by position, each session samples as decode_one would
 * (same sampler and RNG, penalties, bias, grammar) and goes on while the sampled id
 * equals its draft there. Session i's sampled ids are its steps' tokens, n_out[i] of
 * them in out from offset sum over j < i of (n_drafts[j] + 1): those that matched a
 * draft enter the KV cache, the last is pending, and the session is exactly as after
 * n_out[i] decode_one calls, the same tokens included (a token's logits do not
 * depend on batching). It also stops after a terminal token. With logprobs (null,
 * or laid out as out) and n_top (n entries: -1 for none, else 0..LLMD_MAX_TOP_LOGPROBS;
 * null with logprobs) each token gets its log-probability and its top list as
 * llmd_session_token_logprobs would give after each step, session i's n_top[i] per
 * token in top_ids / top_logprobs from offset sum over j < i of (n_drafts[j] + 1) *
 * max(n_top[j], 0). Drafts need a pending token (decode one step first:
 * LLMD_ERR_STATE); a session with 0 drafts takes a plain step. Drafts past the
 * context are not verified. A stopped session gives one stopped step. n_drafts[i] <=
 * LLMD_MAX_DRAFT. With recurrent layers, a step keeps the states after a session's
 * first positions (the pending token's and the first draft's), and one that rejects a
 * draft goes back to the latest kept at or before the last token it keeps, running the
 * accepted tokens after it again (as one that passes a block boundary does to give
 * the prefix cache the state plain steps would offer there). A session that
 * fails to sample (its grammar, or logits that are not finite) has its tokens up to
 * the failure and then a `failed` token (in n_out), and is left as a failed decode_one
 * leaves it; the others take their steps, and the call returns LLMD_OK. */
enum { LLMD_MAX_DRAFT = 32 };
llmd_status llmd_session_decode_drafts(llmd_session *const *sessions, size_t n, const int32_t *drafts,
                                       const size_t *n_drafts, const int32_t *n_top, llmd_token *out, float *logprobs,
                                       int32_t *top_ids, float *top_logprobs, size_t *n_out);

/* Drafts with the model's multi-token-prediction block (an engine opened with
 * draft_nextn; else LLMD_ERR_STATE): up to k (<= LLMD_MAX_DRAFT) ids to follow the
 * session's pending token (none: LLMD_ERR_STATE), each the block's most likely next
 * token under the session's logit bias (the lowest id on a tie), chained as
 * llama.cpp's Qwen3.5 drafting chains them: the pending token with the state of the
 * last position, then each draft with the block's own output state. *n_out is k, or
 * fewer where the context would not hold them verified. The session's tokens stay;
 * the block's keys and values past them are written, and a decode step replaces them. */
llmd_status llmd_session_draft_nextn(llmd_session *session, size_t k, int32_t *out, size_t *n_out);

/* Keep the first pos tokens of the KV cache; drop the pending token and logits.
 * A sliding-window layer keeps a ring of recent positions, so once it has wrapped,
 * pos must be 0 or at least resume_floor (else LLMD_ERR_INVALID_ARGUMENT and the
 * session is unchanged). A model with recurrent layers (n_recurrent_layers > 0)
 * rewinds only to 0, to one of its checkpoints, or to the current position; any
 * other pos is LLMD_ERR_STATE and the session is unchanged. */
llmd_status llmd_session_truncate(llmd_session *session, int32_t pos);
/* The smallest pos > 0 that truncate accepts now (0 when every one is). */
llmd_status llmd_session_resume_floor(const llmd_session *session, int32_t *pos);
/* The positions of the recurrent state's checkpoints, ascending (none for a model
 * without recurrent layers). Prefill and score take one where they start (the end of
 * a reply they continue) and one where they end; a session keeps the newest few, and
 * truncating to one forgets those after it. *n is the count; LLMD_ERR_INVALID_ARGUMENT
 * if capacity is smaller (call again with *n). */
llmd_status llmd_session_checkpoints(const llmd_session *session, int32_t *out, size_t capacity, size_t *n);
llmd_status llmd_session_position(const llmd_session *session, int32_t *pos);

/* The prefix cache. Joins the session to `scope` (bytes; sessions share only within
 * one scope), so that its full blocks of positions are offered to others of that
 * scope from now on; then, if the engine holds a longer prefix of ids than the
 * `keep` tokens the caller would reuse of the session's own cache (at most n - 1,
 * so one token is left to prefill), makes the session's cache that prefix and sets
 * *reused to its length; else leaves the session as it is and sets *reused to 0.
 * The prefix is whole blocks published in the scope (by any session, or retired
 * ones) and then the longest run of further ids another live session of the scope
 * holds, copied. A model with sliding-window layers (rings, not blocks) reuses a
 * prefix only up to where a live session of the scope holds it in its rings too
 * (at or past that session's resume floor), and copies those rings' window. A
 * model with recurrent layers reuses a prefix only where its recurrent state is held:
 * whole blocks up to the last one whose end the engine keeps a snapshot of the state
 * at (taken at the last block boundary of each prefill and the newest one of each
 * reply's decode), or up to where a live session of the scope (this one too) holds
 * the state, live or as a checkpoint, copied with its partly filled block.
 * What is reused is exactly what prefilling those ids computes.
 * An engine whose kv_shares_prefixes is 0 always answers 0. */
llmd_status llmd_session_share_prefix(llmd_session *session, const char *scope, size_t scope_len,
                                      const int32_t *ids, size_t n, int32_t keep, int32_t *reused);

/* The ids in the KV cache, oldest first: writes up to capacity ids, *n_out is the
 * count (LLMD_ERR_INVALID_ARGUMENT when capacity was too small). */
llmd_status llmd_session_tokens(const llmd_session *session, int32_t *out, size_t capacity, size_t *n_out);

/* A session's state as bytes: the first n_tokens ids in its KV cache, their keys
 * and values, and the recurrent layers' state after them with the newest checkpoint
 * before them, in the canonical layout of native/src/memory/session_state.h (not the
 * cache's memory layout); n_tokens is 0 or a position truncate would accept (at most
 * position, at least resume_floor), else LLMD_ERR_INVALID_ARGUMENT; with recurrent
 * layers the position or a checkpoint, else LLMD_ERR_STATE. The session is
 * not changed. llmd_session_state_size gives the length; export writes exactly that
 * many bytes. Import restores such bytes into a session of an engine running the
 * same model shape at the same context and KV types, replacing its cache (the pending token and
 * logits are dropped, as by truncate): bytes of another shape, another context, KV
 * types or format version, a bad token id or a wrong length are LLMD_ERR_FORMAT with the
 * reason, and the session is left unchanged. The bytes carry no checksum and no
 * model identity: whoever stores them must (llmd/session_store.py). */
llmd_status llmd_session_state_size(const llmd_session *session, int32_t n_tokens, size_t *bytes);
llmd_status llmd_session_export(const llmd_session *session, int32_t n_tokens, uint8_t *out, size_t len);
llmd_status llmd_session_import(llmd_session *session, const uint8_t *data, size_t len);

/* Thread-safe: the next decode step returns a stopped step instead. */
void llmd_session_stop(llmd_session *session);

/* Constrain the following decode steps to a grammar, in the text form that
 * llmd/grammar.py writes (described in native/src/decode/grammar.h): a step samples only
 * a token whose bytes continue a sentence of the grammar, an end-of-generation id
 * only where the grammar may end, and the step whose token completes the grammar
 * is terminal. token_budget > 0 keeps room at every step to finish within that
 * many tokens, closing the output early if it must (the step says `forced`); 0
 * means no budget. len 0 removes the constraint. A malformed or hostile grammar
 * is LLMD_ERR_INVALID_ARGUMENT with the reason. The constraint stays until the
 * next call: prefill, truncate and set_sampling leave it alone. */
llmd_status llmd_session_set_grammar(llmd_session *session, const char *grammar, size_t len,
                                     int32_t token_budget);

/* What the session's grammar allows next, for each of the n_vocab ids: 0 rejected,
 * 1 allowed but over the token budget, 2 allowed. fast != 0 walks the vocabulary
 * trie as the sampler does; fast == 0 checks each token on its own (the reference). */
llmd_status llmd_session_grammar_mask(llmd_session *session, uint8_t *out, size_t n, int32_t fast);

/* Runs a grammar over text. *result: 0 the text is no prefix of a sentence, 1 a
 * proper prefix, 2 a sentence that may go on, 3 a sentence nothing may follow. */
llmd_status llmd_grammar_match(const char *grammar, size_t grammar_len, const char *text, size_t text_len,
                               int32_t *result);

/* Copy the current next-token logits (n_vocab floats). */
llmd_status llmd_session_logits(const llmd_session *session, float *out, size_t n);

/* Prefill ids and, for every i in [first, n - 1), write log p(ids[i+1] | ids[..i])
 * to logprobs[i - first]; the next-token logits after ids are then ready, as after
 * prefill. For perplexity and prompt log-probabilities. */
llmd_status llmd_session_score(llmd_session *session, const int32_t *ids, size_t n,
                               size_t first, float *logprobs);

/* Log-probabilities are the log-softmax of the model's logits, before any sampling
 * parameter (penalties, bias, temperature, grammar) touched them. A top list holds
 * the n_top most likely ids, most likely first, ties broken by the lower id;
 * 0 <= n_top <= LLMD_MAX_TOP_LOGPROBS. */
enum { LLMD_MAX_TOP_LOGPROBS = 20 };

/* As llmd_session_score, and for each scored position i - first also its top list:
 * top_ids / top_logprobs[(i - first) * n_top + j] (both may be null when n_top is 0). */
llmd_status llmd_session_score_top(llmd_session *session, const int32_t *ids, size_t n, size_t first,
                                   int32_t n_top, float *logprobs, int32_t *top_ids, float *top_logprobs);

/* The pending token's log-probability (the token the last decode step sampled,
 * from the logits that step sampled from), and the top list of that step. */
llmd_status llmd_session_token_logprobs(const llmd_session *session, int32_t n_top, float *logprob,
                                        int32_t *top_ids, float *top_logprobs);

/* ---- kernels (for tests comparing fast paths with the scalar reference) -- */

/* What the engine's traits table says of a GGUF tensor type: its name ("Q4_K"),
 * elements and bytes per block, and whether the engine has kernels for it (runs).
 * LLMD_ERR_INVALID_ARGUMENT for a number GGUF does not define. */
typedef struct {
    const char *name;
    int64_t block_elems;
    int64_t block_bytes;
    int32_t runs;
} llmd_tensor_type_info;
llmd_status llmd_tensor_type(int32_t type, llmd_tensor_type_info *out);

/* out = the n elements (a whole number of blocks) at `data`, of ggml type `type`,
 * by the type's scalar reference. */
llmd_status llmd_kernel_dequantize(int32_t type, const void *data, int64_t n, float *out);

/* Converts `rows` rows of `cols` elements of ggml type src_type at `src` into
 * dst_type at `dst` (rows times a destination row's bytes): each row decoded by the
 * source type's reference and encoded by the destination type's quantizer (the
 * published reference algorithms, deterministic whatever n_threads is), over
 * n_threads threads (0: one per core). LLMD_ERR_UNSUPPORTED for a type it cannot
 * read or write; LLMD_ERR_INVALID_ARGUMENT for a row length that is not whole blocks
 * of both types or a value that is not finite (naming the row). */
llmd_status llmd_quantize_rows(int32_t src_type, const void *src, int64_t rows, int64_t cols, int32_t dst_type,
                               void *dst, int32_t n_threads);

/* The kernel variants this build carries (i from 0 to count - 1, the scalar one first):
 * name ("scalar", "avx2", "avx-vnni", "avx512", "neon", "dotprod", "i8mm") and whether this CPU runs it. An
 * engine runs the fastest variant the CPU runs, or the one LLMD_KERNELS names (the
 * engine refuses to open when the CPU cannot run it). The kernel entry points below
 * take a variant's name, or NULL for the scalar references (summed in double):
 * LLMD_ERR_UNSUPPORTED names the variants when the CPU cannot run the one asked for. */
int32_t llmd_kernel_variant_count(void);
llmd_status llmd_kernel_variant(int32_t i, const char **name, int32_t *runs);

/* y[t * rows + r] = dot(row r of a rows x cols matrix of ggml type `type`,
 * x[t * cols ...]) for n tokens, by a variant's kernels: over the repacked panels
 * where the variant has a panel kernel for the type and `packed` is 1, else its row
 * kernels. */
llmd_status llmd_kernel_matmul(int32_t type, const void *weights, int32_t rows,
                               int32_t cols, const float *x, int32_t n, float *y, const char *kernels,
                               int32_t packed);

/* Attention of n_q query heads (q: n_q x head_dim floats) over n_pos positions
 * (k, v: n_pos x head_dim floats), stored as a KV cache stores them: keys as
 * kv_type_k, values as kv_type_v ("f16", "q8_0", "q4_0"), by the reference's writes
 * (llmd_kernel_kv_row with kernels "scalar"). The rows are split into n_ranges
 * ranges whose partial results are combined: out (n_q x head_dim); every other range
 * is attended as cold (asking for its memory ahead), the rest as warm. run > 0 (a
 * multiple of 16) stores the rows in runs of that many positions, each in a buffer
 * of its own, as a paged cache's blocks are; 0 stores them in one. sinks, if not
 * NULL, holds a logit per query head (n_q) that joins its softmax's denominator, as
 * gpt-oss's attention sinks do. softcap > 0 soft-caps each score s (q.k / sqrt(head_dim))
 * to softcap * tanh(s / softcap), as Gemma 2 does; 0 leaves it. */
llmd_status llmd_kernel_attention(const float *q, int32_t n_q, const float *k, const float *v, int32_t n_pos,
                                  int32_t head_dim, const char *kv_type_k, const char *kv_type_v, int32_t n_ranges,
                                  int32_t run, const float *sinks, float softcap, float *out, const char *kernels);

/* n tokens in order through one Gated DeltaNet head: at token t the state m (hd x hd
 * floats, updated in place) decays by decay[t], learns v[t] (hd) from k[t] (hd) at rate
 * beta[t], and answers q[t] (hd) into out[t] (hd), scaled by 1/sqrt(hd); q, k, v and
 * out are n x hd. */
llmd_status llmd_kernel_delta_scan(float *m, const float *q, const float *k, const float *v, const float *decay,
                                   const float *beta, int32_t n, int32_t hd, float *out, const char *kernels);
/* n tokens in order through one Mamba-2 head: at token t the state s (head_dim x
 * d_state floats, updated in place; row i that of channel i) decays by decay[t] and
 * takes in b[t] (d_state) times x[t][i] * dt[t]; y[t][i] (head_dim) is row i · c[t]
 * (d_state). x and y are n x head_dim, b and c n x d_state. */
llmd_status llmd_kernel_ssm_scan(float *s, const float *x, const float *b, const float *c, const float *dt,
                                 const float *decay, int32_t n, int32_t head_dim, int32_t d_state, float *y,
                                 const char *kernels);
/* gate[i] = act(gate[i]) * up[i] for n elements, act SiLU (gelu == 0) or GELU's tanh
 * approximation (gelu == 1); act(gate[i]) alone when up is NULL. */
llmd_status llmd_kernel_glu(int32_t gelu, float *gate, const float *up, int64_t n, const char *kernels);
/* out (n) = x / sqrt(mean(x²) + eps) * weight, the sum of squares by a variant. */
llmd_status llmd_kernel_rmsnorm(const float *x, const float *weight, int32_t n, float eps, float *out,
                                const char *kernels);
/* n floats as the KV cache writes a key or value of KV type `type` ("f16": f16 bits
 * rounded to nearest even; "q8_0", "q4_0": GGUF blocks, n a multiple of 32) into out,
 * which holds its bytes (2 n, n / 32 * 34, n / 32 * 18); *written gets their count. */
llmd_status llmd_kernel_kv_row(const char *type, const float *x, int32_t n, uint8_t *out, size_t capacity,
                               size_t *written, const char *kernels);
/* A row of n floats quantized as the integer kernels read activations: per block of
 * 32 the int8 values qs (n), the scale d (n / 32) and the sums of the block's values
 * and of its first 16 (sums: 2 per block), one scale d = max |x| / 127 per `group`
 * elements (32 or 256, dividing n). */
llmd_status llmd_kernel_quantize(const float *x, int64_t n, int32_t group, int8_t *qs, float *d, int32_t *sums,
                                 const char *kernels);

#ifdef __cplusplus
}
#endif
#endif
