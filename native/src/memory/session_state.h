// session_state.h — a session's resident token ids, their keys and values, and the
// recurrent layers' state with its checkpoints as bytes, and back: what `--session-dir` writes to disk (llmd/session_store.py wraps
// these bytes in a file with the model fingerprint and a checksum).
//
// The bytes are canonical, independent of how a KVCache lays out its memory: rows
// are read and written as rows through KVCache::load() and store(), so a change of
// layout does not change the format. Little-endian throughout:
//
//   u32 magic "LKVS", u32 version, u32 n_layer, n_head_kv, head_dim (the widest), n_ctx,
//   u32 k_type, v_type (the KV types, GGUF type numbers: attention.h: KVTypes),
//   u32 n_tokens, i32 high (highest position the cache wrote, -1: none),
//   i32 tokens[n_tokens],
//   per layer of the model (a multi-token-prediction block's memory is not kept:
//     session.cpp zeroes it on import): u32 first (the first position stored), then keys as rows of k_type
//     (the layer's kv head, position in [first, n_tokens), kv_row_bytes(k_type, the layer's head width)),
//     then values alike as rows of v_type; none for a layer that keeps no keys and
//     values (a recurrent one, or one that reads an earlier layer's: KVCache::Layer::heads);
//   u32 floats (of one recurrent state: 0 for a model without recurrent layers),
//   u32 n_checkpoints, f32 state[floats] (after the n_tokens positions), then per
//   checkpoint (ascending positions in (0, n_tokens]): i32 pos, f32 state[floats].
//   The writer saves one checkpoint at most, the newest before n_tokens (a state of
//   Qwen3.5-0.8B is 20 MB); the reader takes up to kMaxCheckpoints.
//
// Version 2 added the recurrent section, version 3 the KV types; older versions, and
// keys or values of other types than the engine's, are refused with the reason (the
// cache is never converted: a quantized row cannot become the f16 one a prefill
// computes, nor the other way round).
//
// A layer that attends every position stores them all (first = 0). A sliding-window
// layer stores the positions its ring still holds, those above high − slots and from
// the cache's ring_low on (KVCache::held_from), so a restored session resumes exactly
// where the saved one could: the same positions, the same resume_floor().
#pragma once

#include "memory/kvcache.h"
#include "model/model.h"
#include "ops/recurrent.h"

#include <cstdint>
#include <string>
#include <vector>

namespace llmd {

constexpr uint32_t kStateMagic = 0x53564b4c; // "LKVS"
constexpr uint32_t kStateVersion = 3;

// Bytes state_write() writes for the first n_tokens positions.
size_t state_bytes(const HParams &hp, const KVCache &kv, const RecurrentState &rs, int n_tokens);

// Writes tokens[0, n), their K/V and the recurrent state after them (with the
// newest checkpoint before n) into out, which holds state_bytes() bytes. The session must
// be able to resume at n: n is 0, or at least kv.resume_floor() (as for a truncate),
// and with recurrent layers n is rs.pos or one of its checkpoints.
void state_write(const HParams &hp, const KVCache &kv, const RecurrentState &rs, int n_ctx, const int32_t *tokens,
                 int n, uint8_t *out);

// Checks every field of `data` against this model and context before it touches
// anything; then empties kv and fills it, rs and *tokens. False with *error (and kv,
// rs, *tokens unchanged) for bytes of another shape, another context or version, a
// bad token id or checkpoint, other KV types, or a wrong length. Throws bad_alloc when blocks cannot
// be had, kv then emptied.
bool state_read(const HParams &hp, KVCache &kv, RecurrentState &rs, int n_ctx, const uint8_t *data, size_t len,
                std::vector<int32_t> *tokens, std::string *error);

} // namespace llmd
