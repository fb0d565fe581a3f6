#include "memory/session_state.h"

#include <algorithm>
#include <cstring>

namespace llmd {
namespace {

constexpr uint32_t kHeaderWords = 10; // magic .. high

// The first position a layer's cache holds of [0, n_tokens) (KVCache::held_from).
int first_held(const KVCache &kv, const KVCache::Layer &L, int n_tokens) {
    return std::min(kv.held_from(L), n_tokens);
}

struct Writer {
    uint8_t *at;
    template <typename T> void put(T v) {
        std::memcpy(at, &v, sizeof v);
        at += sizeof v;
    }
};

struct Reader {
    const uint8_t *at, *end;
    bool take(void *out, size_t n) {
        if (static_cast<size_t>(end - at) < n) return false;
        if (n > 0) std::memcpy(out, at, n); // an empty session's ids: out may be null
        at += n;
        return true;
    }
};

// The checkpoint a state of the first n positions carries: the newest before n (where
// the previous prompt ended, what a rewritten reply resumes from), or none. Older ones
// are seldom resumed from and each costs a whole state; one at n is the state itself,
// and the next prefill takes it again.
const RecurrentState::Checkpoint *saved_checkpoint(const RecurrentState &rs, int n) {
    const RecurrentState::Checkpoint *newest = nullptr;
    for (const RecurrentState::Checkpoint &c : rs.checkpoints)
        if (c.pos < n) newest = &c;
    return newest;
}

// Bytes of the recurrent section: two counts, the state, and each checkpoint's.
size_t recurrent_section(size_t floats, size_t checkpoints) {
    return 8 + floats * sizeof(float) + checkpoints * (4 + floats * sizeof(float));
}

// Bytes of the header, the ids and the K/V of the first n_tokens positions (of the
// model's layers: a prediction block's memory is not part of a state).
size_t kv_section(const HParams &hp, const KVCache &kv, int n_tokens) {
    size_t bytes = (kHeaderWords + static_cast<size_t>(n_tokens)) * 4;
    for (int l = 0; l < hp.n_layer; ++l) {
        const KVCache::Layer &L = kv.layers[l];
        const size_t rows = static_cast<size_t>(n_tokens - first_held(kv, L, n_tokens)) * L.heads;
        bytes += 4 + rows * (L.k_row + L.v_row);
    }
    return bytes;
}

} // namespace

size_t state_bytes(const HParams &hp, const KVCache &kv, const RecurrentState &rs, int n_tokens) {
    return kv_section(hp, kv, n_tokens) + recurrent_section(rs.now.size(), saved_checkpoint(rs, n_tokens) ? 1 : 0);
}

void state_write(const HParams &hp, const KVCache &kv, const RecurrentState &rs, int n_ctx, const int32_t *tokens,
                 int n, uint8_t *out) {
    Writer w{out};
    for (const uint32_t word : {kStateMagic, kStateVersion, uint32_t(hp.n_layer), uint32_t(hp.n_head_kv),
                                uint32_t(hp.head_dim), uint32_t(n_ctx), kv.types.k, kv.types.v, uint32_t(n)})
        w.put(word);
    w.put(int32_t(n > 0 ? kv.high : -1));
    for (int i = 0; i < n; ++i) w.put(tokens[i]);
    for (int l = 0; l < hp.n_layer; ++l) {
        const KVCache::Layer &L = kv.layers[l];
        const int first = first_held(kv, L, n);
        w.put(uint32_t(first));
        // Keys then values, each head's positions in order: a position's key and value
        // go to their places in the two sections.
        const size_t rows = static_cast<size_t>(n - first) * L.heads;
        uint8_t *keys = w.at, *values = w.at + rows * L.k_row;
        for (int h = 0; h < L.heads; ++h)
            for (int p = first; p < n; ++p, keys += L.k_row, values += L.v_row) kv.load(l, h, p, keys, values);
        w.at = values;
    }
    const size_t floats = rs.now.size();
    w.put(uint32_t(floats));
    const RecurrentState::Checkpoint *saved = saved_checkpoint(rs, n);
    w.put(uint32_t(saved != nullptr ? 1 : 0));
    const auto put_state = [&](const std::vector<float> *state) { // null: the zero state at 0
        if (state != nullptr) std::memcpy(w.at, state->data(), floats * sizeof(float));
        else std::memset(w.at, 0, floats * sizeof(float));
        w.at += floats * sizeof(float);
    };
    put_state(floats > 0 ? rs.state_at(n) : nullptr);
    if (saved != nullptr) {
        w.put(int32_t(saved->pos));
        put_state(&saved->state);
    }
}

bool state_read(const HParams &hp, KVCache &kv, RecurrentState &rs, int n_ctx, const uint8_t *data, size_t len,
                std::vector<int32_t> *tokens, std::string *error) {
    const auto refuse = [&](const std::string &why) {
        *error = "session state: " + why;
        return false;
    };
    Reader r{data, data + len};
    uint32_t words[kHeaderWords - 1];
    int32_t high = 0;
    // The magic and version first: an older version's header is shorter.
    if (!r.take(words, 2 * sizeof(uint32_t))) return refuse("truncated header");
    if (words[0] != kStateMagic) return refuse("not a session state (bad magic)");
    if (words[1] != kStateVersion)
        return refuse("format version " + std::to_string(words[1]) + ", this build reads " +
                      std::to_string(kStateVersion));
    if (!r.take(words + 2, sizeof words - 2 * sizeof(uint32_t)) || !r.take(&high, sizeof high))
        return refuse("truncated header");
    const uint32_t want[] = {uint32_t(hp.n_layer), uint32_t(hp.n_head_kv), uint32_t(hp.head_dim), uint32_t(n_ctx)};
    const char *names[] = {"n_layer", "n_head_kv", "head_dim", "n_ctx"};
    for (int i = 0; i < 4; ++i)
        if (words[2 + i] != want[i])
            return refuse(std::string(names[i]) + " " + std::to_string(words[2 + i]) + " does not match this engine's " +
                          std::to_string(want[i]));
    const uint32_t types[] = {kv.types.k, kv.types.v};
    for (int i = 0; i < 2; ++i)
        if (words[6 + i] != types[i]) {
            const bool known = words[6 + i] == GGML_F16 || words[6 + i] == GGML_Q8_0 || words[6 + i] == GGML_Q4_0;
            return refuse(std::string(i == 0 ? "keys" : "values") + " stored as " +
                          (known ? kv_type_name(words[6 + i]) : "type " + std::to_string(words[6 + i])) +
                          ", this engine's cache keeps " + kv_type_name(types[i]));
        }
    const uint32_t n = words[8];
    if (n > static_cast<uint32_t>(n_ctx)) return refuse("more tokens than the context holds");
    const int count = static_cast<int>(n);
    if (count == 0 ? high != -1 : high < count - 1 || high >= n_ctx)
        return refuse("highest written position " + std::to_string(high) + " is impossible for " +
                      std::to_string(count) + " tokens");
    std::vector<int32_t> ids(count);
    if (!r.take(ids.data(), ids.size() * sizeof(int32_t))) return refuse("truncated token ids");
    for (const int32_t id : ids)
        if (id < 0 || id >= hp.n_vocab) return refuse("token id " + std::to_string(id) + " is outside the vocabulary");
    // Check the whole layout (and so the length) before writing a single row. The
    // rings start where the saved cache's did: at its ring_low, the oldest first of a
    // ring, or later where a ring wrapped since.
    std::vector<uint32_t> firsts;
    for (const uint8_t *at = r.at; firsts.size() < static_cast<size_t>(hp.n_layer);) {
        uint32_t first = 0;
        if (static_cast<size_t>(data + len - at) < sizeof first) return refuse("length does not match its header");
        std::memcpy(&first, at, sizeof first);
        if (first > n) return refuse("a layer holds positions from " + std::to_string(first) + ", past its tokens");
        const KVCache::Layer &L = kv.layers[firsts.size()];
        const size_t bytes = 4 + static_cast<size_t>(count - first) * L.heads * (L.k_row + L.v_row);
        if (static_cast<size_t>(data + len - at) < bytes) return refuse("length does not match its header");
        at += bytes;
        firsts.push_back(first);
    }
    KVCache probe;
    probe.types = kv.types;
    probe.layers = kv.layers;
    probe.high = high;
    for (int l = 0; l < hp.n_layer; ++l)
        if (kv.layers[l].paged < 0 && kv.layers[l].slots > 0 && firsts[l] < n)
            probe.ring_low = probe.ring_low == 0 ? static_cast<int>(firsts[l]) : std::min<int>(probe.ring_low, firsts[l]);
    // The recurrent section follows the layers: its counts, then states of this model's size.
    const size_t kv_bytes = kv_section(hp, probe, count);
    uint32_t counts[2] = {0, 0};
    if (len < kv_bytes + sizeof counts) return refuse("length does not match its header");
    std::memcpy(counts, data + kv_bytes, sizeof counts);
    if (counts[0] != rs.now.size())
        return refuse("a recurrent state of " + std::to_string(counts[0]) + " floats; this engine's holds " +
                      std::to_string(rs.now.size()));
    if (counts[1] > static_cast<uint32_t>(kMaxCheckpoints) || (rs.now.empty() && counts[1] > 0))
        return refuse(std::to_string(counts[1]) + " recurrent checkpoints; a session keeps at most " +
                      std::to_string(rs.now.empty() ? 0 : kMaxCheckpoints));
    if (len != kv_bytes + recurrent_section(counts[0], counts[1])) return refuse("length does not match its header");
    const size_t state_len = counts[0] * sizeof(float);
    const uint8_t *states = data + kv_bytes + sizeof counts;
    std::vector<int32_t> points(counts[1]);
    for (uint32_t c = 0; c < counts[1]; ++c) {
        std::memcpy(&points[c], states + state_len + c * (4 + state_len), 4);
        if (points[c] <= (c == 0 ? 0 : points[c - 1]) || points[c] > count)
            return refuse("recurrent checkpoint at " + std::to_string(points[c]) +
                          " is not in ascending order inside the session's positions");
    }
    for (int l = 0; l < hp.n_layer; ++l)
        if (firsts[l] != static_cast<uint32_t>(first_held(probe, kv.layers[l], count)))
            return refuse("layer " + std::to_string(l) + " holds positions from " + std::to_string(firsts[l]) +
                          ", which does not fit this engine's cache layout");
    if (count > 0 && probe.resume_floor() > count)
        return refuse("the sliding-window layers do not hold the window the next position attends");
    // The length is checked: the rows are read without further bounds checks, into
    // blocks of this session's own (any it held may be shared with others).
    kv.truncate(0);
    kv.sharing = false; // what it restores may be another scope's: not offered until emptied
    for (int p = 0; p < count; p += kKVBlock) kv.prepare(p);
    const uint8_t *at = r.at;
    for (int l = 0; l < hp.n_layer; ++l) {
        uint32_t first = 0;
        std::memcpy(&first, at, sizeof first);
        at += sizeof first;
        const KVCache::Layer &L = kv.layers[l];
        const size_t rows = static_cast<size_t>(count - static_cast<int>(first)) * L.heads;
        const uint8_t *keys = at, *values = at + rows * L.k_row;
        for (int h = 0; h < L.heads; ++h)
            for (int p = static_cast<int>(first); p < count; ++p, keys += L.k_row, values += L.v_row)
                kv.store(l, h, p, keys, values);
        at = values;
    }
    kv.high = high;
    kv.ring_low = probe.ring_low;
    if (!rs.empty()) {
        rs.reset();
        std::memcpy(rs.now.data(), states, state_len);
        rs.checkpoints.clear();
        for (uint32_t c = 0; c < counts[1]; ++c) {
            RecurrentState::Checkpoint cp{points[c], std::vector<float>(counts[0])};
            std::memcpy(cp.state.data(), states + state_len + c * (4 + state_len) + 4, state_len);
            rs.checkpoints.push_back(std::move(cp));
        }
        rs.pos = count;
    }
    *tokens = std::move(ids);
    return true;
}

} // namespace llmd
