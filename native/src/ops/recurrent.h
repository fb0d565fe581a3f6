// recurrent.h — what a hybrid model's recurrent layers keep per session instead of keys
// and values, and the ops that read and update it.
//
// A recurrent layer folds every token into a fixed-size state (LFM2's short
// convolution keeps the last conv_len - 1 inputs of each channel; Qwen3.5's Gated
// DeltaNet those of its convolution and a head_dim² matrix per value head; Granite
// 4.0-H's Mamba-2 those of its convolution and a head_dim × d_state matrix per head).
// Unlike a KV cache, such a state cannot be cut back to an earlier position: the
// session therefore keeps checkpoints, copies of the whole state at chosen positions
// (the end of every prefill, and the end of a reply when the next prefill continues
// it), and can rewind only to one of them, to 0, or stay where it is.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

namespace llmd {

struct HParams;
struct LayerWeights;
struct Pass;
struct DeltaTokens;
struct SsmTokens;

constexpr int kMaxCheckpoints = 8; // per session; the oldest is dropped for a newer one
constexpr int kTrail = 2;          // states a verification keeps (RecurrentState::trail)

struct RecurrentState {
    std::vector<size_t> offset; // (n_layer) first float of a recurrent layer's state in `now`
    std::vector<float> now;     // every recurrent layer's state after positions 0..pos-1
    int pos = 0;
    struct Checkpoint {
        int pos;
        std::vector<float> state;
    };
    std::vector<Checkpoint> checkpoints; // ascending pos, none at 0, at most kMaxCheckpoints
    // A verification's trail: the states after positions [trail_from, trail_from +
    // trail_n), which the layers write as they fold those tokens in, so that a rejected
    // draft cuts the state back to one of them instead of running every accepted token
    // again (kTrail at most: a state is large, a Qwen3.5-0.8B's 18 MB).
    std::vector<float> trail;
    int trail_from = 0, trail_n = 0;

    // Sized for hp's recurrent layers (empty when it has none), at position 0.
    void init(const HParams &hp);
    bool empty() const { return now.empty(); }
    float *layer(int l) { return now.data() + offset[l]; }
    // Back to position 0: a zero state, no checkpoints.
    void reset();
    // Remembers the state at pos (once per position; nothing at 0), dropping the
    // oldest checkpoint when kMaxCheckpoints are kept.
    void checkpoint();
    bool has_checkpoint(int at) const;
    // The state of the checkpoint at `at`, forgetting the checkpoints after it.
    void restore(int at);
    // The state after positions 0..at-1 (`at` > 0) is `state`, a snapshot of another
    // session's: the checkpoints up to `valid` (where the tokens still agree) are kept.
    void adopt(int at, const std::vector<float> &state, int valid);
    // The state after the first `at` positions: `now` at pos, else a checkpoint's
    // (one must be at `at`), or null for 0 (a zero state).
    const std::vector<float> *state_at(int at) const;
    // Keeps the states after the n positions from `from` (a trail) in the next forward
    // pass; none when n is 0.
    void start_trail(int from, int n);
    // Where layer l's state after position p goes, or null when the trail keeps none.
    float *trail_at(int l, int p) {
        return p >= trail_from && p < trail_from + trail_n
                   ? trail.data() + static_cast<size_t>(p - trail_from) * now.size() + offset[l]
                   : nullptr;
    }
    // The state after position p from the trail (one kept there), now at p + 1.
    void back_to_trail(int p);

    // Bytes of one state, and of a session's: its state and room for every checkpoint
    // and a verification's trail.
    static uint64_t state_bytes(const HParams &hp);
    static uint64_t session_bytes(const HParams &hp) { return state_bytes(hp) * (1 + kMaxCheckpoints + kTrail); }
};

// The prefix cache of a hybrid model (kvpool.h holds its attention layers' part):
// copies of the recurrent state after the tokens of a chain of published blocks,
// each keyed by the serial of the chain's last block. A serial is never reused and a
// published block never changes, so a snapshot found by the serial of a block the
// pool matched for a prompt is the state a fresh prefill of that prompt's first
// (block index + 1) · kKVBlock tokens computes. Kept least recently used first out
// within a byte budget; a snapshot whose block the pool dropped is never found again
// and leaves in its turn.
class SnapshotCache {
public:
    explicit SnapshotCache(uint64_t budget_bytes) : budget_(budget_bytes) {}
    // Keeps a copy of `state` under `serial` (replacing one there, and the snapshot
    // under `replaces` if not 0), then drops the least recently used while over
    // budget (this one too, if it alone exceeds it).
    void put(uint64_t serial, const std::vector<float> &state, uint64_t replaces = 0);
    // The snapshot under `serial`, now the most recently used; null if none.
    const std::vector<float> *find(uint64_t serial);
    // Any thread may read these (metrics).
    int64_t count() const { return count_.load(); }
    int64_t bytes() const { return bytes_.load(); }

private:
    struct Entry {
        uint64_t serial;
        std::vector<float> state;
    };
    std::vector<float> take(std::list<Entry>::iterator it); // removes the entry, returns its storage
    uint64_t budget_;
    std::atomic<int64_t> count_{0}, bytes_{0};
    std::list<Entry> lru_; // most recently used first
    std::unordered_map<uint64_t, std::list<Entry>::iterator> index_;
};

// The short-convolution block of LFM2, for layer `layer` of the pass: with
// xb = rmsnorm(x), (b, c, u) = xb · conv_inᵀ split in three, each channel of b * u
// convolved over its last conv_len positions (the earlier ones from the session's
// state, which then moves on), and x += (c * conv) · conv_outᵀ.
void short_conv(const Pass &p, const LayerWeights &L, int layer);

// n consecutive tokens of one session through a causal convolution of dim channels:
// token i's output (at out + i · out_stride) is, for each channel d, Σ_j w[d][j] ·
// window_j[d] over its conv_len positions, accumulated in that order: the conv_len - 1
// inputs before it (the state's rows, oldest first, then the run's own inputs at
// in + k · in_stride) and its own input. The state (conv_len - 1 rows, `stride` floats
// apart, of which the first dim are these channels') then holds the run's last inputs.
void conv_run(const float *w, int conv_len, float *state, size_t stride, const float *in, size_t in_stride, float *out,
              size_t out_stride, int n, int dim);

// n tokens of one session, in order, through one Gated DeltaNet head (kernels.h:
// DeltaTokens says where each token's inputs and output are). m (hd × hd) holds the
// delta rule's state transposed (row j is column j of S), so that every step reads rows:
//   m *= decay;  delta_j = (v_j - m_j · k) · beta;  m_j += delta_j · k;  out_j = (m_j · q) · scale
// A row never reads another, so a fast scan takes a few rows through every token while
// they stay in cache, rather than every row through one token; each row's arithmetic is
// that of its token alone, so a token's result is the same in a run of any length.
// The kernel in use (kernels.h; delta_scan_ref is the scalar reference, summing in
// index order); each variant's fixed sums make its result independent of anything but
// its arguments.
void delta_scan(float *m, const DeltaTokens &x, int n, int hd, float scale);

// The Gated DeltaNet block of Qwen3.5, for layer `layer`: with xb = rmsnorm(x), the
// mixed q, k, v = xb · delta_inᵀ go through a causal convolution over conv_len positions
// (the session's state holds the earlier ones) and SiLU; q and k are L2-normalised per
// head; each value head's state decays by exp(softplus(xb · alphaᵀ + dt) · a) and learns
// at rate sigmoid(xb · betaᵀ) (delta_scan); its output is RMS-normed, gated by
// silu(xb · delta_gateᵀ), and x += that · delta_outᵀ.
void gated_delta_net(const Pass &p, const LayerWeights &L, int layer);

// n tokens of one session, in order, through one Mamba-2 head (kernels.h: SsmTokens
// says where each token's inputs and output are). s (head_dim × d_state) is the head's
// state, row i that of channel i. Per token,
//   s_i = s_i · decay + B · (x_i · dt);  y_i = s_i · C
// A row never reads another, so a fast scan takes a few rows through every token while
// they stay in cache; each row's arithmetic is that of its token alone, so a token's
// result is the same in a run of any length. The kernel in use (kernels.h; ssm_scan_ref
// is the scalar reference, summing in index order).
void ssm_scan(float *s, const SsmTokens &x, int n, int head_dim, int d_state);

// The Mamba-2 block of Granite 4.0-H, for layer `layer`, over xb (n, dim, already
// normed): xb · ssm_inᵀ gives z, then x, B and C (the convolved channels), then dt per
// head; x, B and C go through a causal convolution over conv_len positions (the
// session's state holds the earlier ones), its optional bias and SiLU; each head's
// state scans its tokens (ssm_scan: dt = softplus(dt + ssm_dt), decay exp(dt · ssm_a),
// head h reading group h / (heads / groups) of B and C); y = (y + x · ssm_d) · silu(z),
// RMS-normed over each group's inner / groups channels by ssm_norm; out (n, dim) =
// y · ssm_outᵀ. out may be xb.
void mamba2(const Pass &p, const LayerWeights &L, int layer, float *out);

} // namespace llmd
