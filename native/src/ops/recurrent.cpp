// recurrent.cpp — see recurrent.h: a session's recurrent state with its checkpoints,
// and the recurrent blocks of the hybrid architectures (short convolution, Gated
// DeltaNet, Mamba-2).
#include "ops/recurrent.h"

#include "kernels/kernels.h"

#include "model/model.h"


#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <type_traits>

namespace llmd {

// ---- the state and its checkpoints ----------------------------------------

void RecurrentState::init(const HParams &hp) {
    offset.assign(hp.n_layer, 0);
    size_t floats = 0;
    for (int l = 0; l < hp.n_layer; ++l) {
        offset[l] = floats;
        floats += static_cast<size_t>(hp.state[l]);
    }
    now.assign(floats, 0.0f);
    checkpoints.clear();
    pos = 0;
}

void RecurrentState::reset() {
    std::fill(now.begin(), now.end(), 0.0f);
    checkpoints.clear();
    pos = 0;
}

void RecurrentState::checkpoint() {
    if (pos == 0 || empty() || has_checkpoint(pos)) return;
    if (static_cast<int>(checkpoints.size()) == kMaxCheckpoints) { // reuse the oldest one's storage
        Checkpoint oldest = std::move(checkpoints.front());
        checkpoints.erase(checkpoints.begin());
        oldest.pos = pos;
        std::copy(now.begin(), now.end(), oldest.state.begin());
        checkpoints.push_back(std::move(oldest));
        return;
    }
    checkpoints.push_back({pos, now});
}

bool RecurrentState::has_checkpoint(int at) const {
    return std::any_of(checkpoints.begin(), checkpoints.end(), [&](const Checkpoint &c) { return c.pos == at; });
}

void RecurrentState::restore(int at) {
    const auto it = std::find_if(checkpoints.begin(), checkpoints.end(), [&](const Checkpoint &c) { return c.pos == at; });
    if (it == checkpoints.end()) throw std::logic_error("no recurrent checkpoint at position " + std::to_string(at));
    std::copy(it->state.begin(), it->state.end(), now.begin());
    pos = at;
    checkpoints.erase(it + 1, checkpoints.end());
}

void RecurrentState::adopt(int at, const std::vector<float> &state, int valid) {
    if (state.size() != now.size()) throw std::logic_error("a recurrent snapshot of another shape");
    std::copy(state.begin(), state.end(), now.begin());
    pos = at;
    checkpoints.erase(std::remove_if(checkpoints.begin(), checkpoints.end(),
                                     [&](const Checkpoint &c) { return c.pos > valid || c.pos > at; }),
                      checkpoints.end());
}

const std::vector<float> *RecurrentState::state_at(int at) const {
    if (at == 0) return nullptr;
    if (at == pos) return &now;
    const auto it = std::find_if(checkpoints.begin(), checkpoints.end(), [&](const Checkpoint &c) { return c.pos == at; });
    if (it == checkpoints.end()) throw std::logic_error("no recurrent checkpoint at position " + std::to_string(at));
    return &it->state;
}

void RecurrentState::start_trail(int from, int n) {
    trail_from = from;
    trail_n = n;
    trail.resize(static_cast<size_t>(n) * now.size());
}

void RecurrentState::back_to_trail(int p) {
    if (p < trail_from || p >= trail_from + trail_n)
        throw std::logic_error("no recurrent state kept after position " + std::to_string(p));
    const auto kept = trail.begin() + static_cast<std::ptrdiff_t>((p - trail_from) * now.size());
    std::copy(kept, kept + static_cast<std::ptrdiff_t>(now.size()), now.begin());
    pos = p + 1;
}

uint64_t RecurrentState::state_bytes(const HParams &hp) {
    uint64_t floats = 0;
    for (int l = 0; l < hp.n_layer; ++l) floats += static_cast<uint64_t>(hp.state[l]);
    return floats * sizeof(float);
}

// ---- the prefix cache's snapshots -------------------------------------------

void SnapshotCache::put(uint64_t serial, const std::vector<float> &state, uint64_t replaces) {
    std::vector<float> copy; // storage of a snapshot that leaves, if one does: no new pages to touch
    if (const auto it = index_.find(serial); it != index_.end()) copy = take(it->second); // refreshed
    if (const auto it = index_.find(replaces); replaces != 0 && it != index_.end()) {
        std::vector<float> old = take(it->second);
        if (copy.empty()) copy = std::move(old);
    }
    if (copy.empty() && !lru_.empty() && static_cast<uint64_t>(bytes_) + state.size() * sizeof(float) > budget_)
        copy = take(std::prev(lru_.end())); // the oldest makes room, and lends its storage
    copy.assign(state.begin(), state.end());
    bytes_ += static_cast<int64_t>(copy.size() * sizeof(float));
    ++count_;
    lru_.push_front({serial, std::move(copy)});
    index_[serial] = lru_.begin();
    while (static_cast<uint64_t>(bytes_) > budget_ && !lru_.empty()) take(std::prev(lru_.end()));
}

const std::vector<float> *SnapshotCache::find(uint64_t serial) {
    const auto it = index_.find(serial);
    if (it == index_.end()) return nullptr;
    lru_.splice(lru_.begin(), lru_, it->second);
    return &it->second->state;
}

std::vector<float> SnapshotCache::take(std::list<Entry>::iterator it) {
    std::vector<float> state = std::move(it->state);
    bytes_ -= static_cast<int64_t>(state.size() * sizeof(float));
    --count_;
    index_.erase(it->serial);
    lru_.erase(it);
    return state;
}

namespace {

// After the token at position pos: `rows` runs of `width` floats, `stride` apart from
// `at`, of layer l's state into the same place of the trail's state for pos, if it
// keeps one (each task of a layer keeps the part of the state it wrote).
void keep(RecurrentState *rs, int l, int pos, size_t at, int rows, size_t stride, size_t width) {
    float *to = rs->trail_at(l, pos);
    if (to == nullptr) return;
    const float *from = rs->layer(l);
    for (int r = 0; r < rows; ++r) std::copy_n(from + at + r * stride, width, to + at + r * stride);
}

// The last token u of the tokens [t, u] that one scan call takes: consecutive tokens
// of t's session, up to the first whose state the trail keeps (it is kept after the
// call), else the last of the session's run in the batch.
int scan_end(const Pass &p, int l, int t) {
    RecurrentState *rs = p.batch[t].rs;
    int u = t;
    while (u + 1 < p.n && p.batch[u + 1].rs == rs && rs->trail_at(l, p.batch[u].pos) == nullptr) ++u;
    return u;
}

} // namespace

// ---- short convolutions (LFM2's block; Gated DeltaNet's and Mamba-2's too) ----

void conv_run(const float *w, int conv_len, float *state, size_t stride, const float *in, size_t in_stride, float *out,
              size_t out_stride, int n, int dim) {
    const int rows = conv_len - 1;
    // Row k of the run's window sequence: the state's rows, oldest first, then the inputs.
    const auto sequence = [&](int k) {
        return k < rows ? state + static_cast<size_t>(k) * stride : in + static_cast<size_t>(k - rows) * in_stride;
    };
    // A block of M channels at a time (kLanes, then the rest one by one), its filters
    // transposed (taps[j][c]) so that each tap multiplies contiguous channels, through
    // a chunk of tokens at a time, whose rows stay in cache for every block.
    constexpr int kLanes = 16, kChunk = 64;
    const auto block = [&](auto lanes, int d0, int i0, int i1) {
        constexpr int M = decltype(lanes)::value;
        float taps[64][M]; // conv_len <= 64 (load.cpp)
        for (int c = 0; c < M; ++c)
            for (int j = 0; j < conv_len; ++j) taps[j][c] = w[static_cast<size_t>(d0 + c) * conv_len + j];
        for (int i = i0; i < i1; ++i) {
            float acc[M] = {}, s[M];
            for (int j = 0; j <= rows; ++j) { // the window, then the token's own input
                std::memcpy(s, sequence(i + j) + d0, sizeof s);
                for (int c = 0; c < M; ++c) acc[c] += taps[j][c] * s[c];
            }
            std::memcpy(out + static_cast<size_t>(i) * out_stride + d0, acc, sizeof acc);
        }
    };
    for (int i0 = 0; i0 < n; i0 += kChunk) {
        const int i1 = std::min(n, i0 + kChunk);
        int d0 = 0;
        for (; d0 + kLanes <= dim; d0 += kLanes) block(std::integral_constant<int, kLanes>{}, d0, i0, i1);
        for (; d0 < dim; ++d0) block(std::integral_constant<int, 1>{}, d0, i0, i1);
    }
    // The state becomes the sequence's last rows: row j takes row n + j, which no
    // earlier row's copy has overwritten.
    for (int j = 0; j < rows; ++j) std::copy_n(sequence(n + j), dim, state + static_cast<size_t>(j) * stride);
}

namespace {

// The batch's tokens through conv_run, a run of one session's consecutive tokens at a
// time (scan_end), each run's state kept where the trail wants it: channels
// [c0, c0 + width) of layer `layer`'s state, whose rows are `stride` floats apart;
// w, in and out point at channel c0 (of token 0's rows).
void convolve(const Pass &p, int layer, const float *w, size_t c0, size_t stride, const float *in, size_t in_stride,
              float *out, size_t out_stride, int width) {
    const int conv_len = p.hp.conv_len;
    for (int t = 0, u = 0; t < p.n; t = u + 1) {
        u = scan_end(p, layer, t);
        conv_run(w, conv_len, p.batch[t].rs->layer(layer) + c0, stride, in + t * in_stride, in_stride,
                 out + t * out_stride, out_stride, u + 1 - t, width);
        keep(p.batch[u].rs, layer, p.batch[u].pos, c0, conv_len - 1, stride, width);
    }
}

} // namespace

void short_conv(const Pass &p, const LayerWeights &L, int layer) {
    const int dim = p.hp.n_embd;
    const size_t row = static_cast<size_t>(3) * dim;
    std::vector<float> &bcu = p.ws.recurrent;
    bcu.resize(p.n * row);
    rmsnorm_rows(p, p.xb, p.x, L.attn_norm);
    matmuls(p, p.xb, {project(L.conv_in, bcu.data())}); // (n, 3 dim): b, c, u
    // b * u for every token, then the runs of consecutive tokens of one session, each
    // continuing the state its predecessor left, so a token's result is the same in any batch.
    std::vector<float> &bu = p.ws.recurrent_in;
    bu.resize(static_cast<size_t>(p.n) * dim);
    for (int t = 0; t < p.n; ++t) {
        const float *b = bcu.data() + t * row, *u = b + 2 * dim;
        for (int d = 0; d < dim; ++d) bu[static_cast<size_t>(t) * dim + d] = b[d] * u[d];
    }
    convolve(p, layer, L.conv_w, 0, dim, bu.data(), dim, p.xb, dim, dim);
    for (int t = 0; t < p.n; ++t) {
        const float *c = bcu.data() + t * row + dim;
        float *y = p.xb + static_cast<size_t>(t) * dim;
        for (int d = 0; d < dim; ++d) y[d] *= c[d];
    }
    matmuls(p, p.xb, {residual(L.conv_out, p.x)}); // x += (c * conv) · conv_outᵀ
}

// ---- Gated DeltaNet (Qwen3.5) ------------------------------------------------

void delta_scan_ref(float *m, const DeltaTokens &x, int n, int hd, float scale) {
    for (int t = 0; t < n; ++t) {
        const float *q = x.q + t * x.stride, *k = x.k + t * x.stride, *v = x.v + t * x.stride;
        const float decay = x.decay[t * x.gate_stride], beta = x.beta[t * x.gate_stride];
        float *out = x.out + t * x.out_stride;
        for (int j = 0; j < hd; ++j) {
            float *row = m + static_cast<size_t>(j) * hd;
            float mk = 0.0f;
            for (int i = 0; i < hd; ++i) {
                row[i] *= decay;
                mk += row[i] * k[i];
            }
            const float delta = (v[j] - mk) * beta;
            float mq = 0.0f;
            for (int i = 0; i < hd; ++i) {
                row[i] += delta * k[i];
                mq += row[i] * q[i];
            }
            out[j] = mq * scale;
        }
    }
}

void delta_scan(float *m, const DeltaTokens &x, int n, int hd, float scale) { kernels().delta_scan(m, x, n, hd, scale); }

namespace {

// x (n) = x / sqrt(Σ x² + eps), as Qwen3.5 normalises its queries and keys.
void l2_normalize(float *x, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; ++i) ss += x[i] * x[i];
    const float r = 1.0f / std::sqrt(ss + eps);
    for (int i = 0; i < n; ++i) x[i] *= r;
}

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

} // namespace

void gated_delta_net(const Pass &p, const LayerWeights &L, int layer) {
    const HParams &hp = p.hp;
    const HParams::DeltaNet &dn = hp.delta;
    const int n = p.n, hd = dn.head_dim, n_v = dn.v_heads, n_k = dn.k_heads;
    const size_t conv_dim = dn.conv_dim(), v_dim = dn.v_dim();
    // Scratch per token: mixed q, k, v (conv_dim), z (v_dim), beta and alpha (v_heads),
    // the convolved q, k, v (conv_dim) and the heads' output (v_dim).
    const size_t row = 2 * conv_dim + 2 * v_dim + 2 * static_cast<size_t>(n_v);
    std::vector<float> &ws = p.ws.recurrent;
    ws.resize(n * row);
    float *mixed = ws.data(), *z = mixed + n * conv_dim, *beta = z + n * v_dim, *alpha = beta + n * n_v;
    float *qkv = alpha + n * n_v, *out = qkv + n * conv_dim;

    rmsnorm_rows(p, p.xb, p.x, L.attn_norm);
    matmuls(p, p.xb, {project(L.delta_in, mixed), project(L.delta_gate, z), project(L.delta_beta, beta),
                      project(L.delta_alpha, alpha)});
    // The convolution, SiLU and the q and k heads' L2 norm: a task per kConvHeads heads'
    // channels (of q, k or v: a long contiguous part of each token's row, which
    // prefetching follows) runs the batch's tokens in order, each continuing the
    // convolution window its predecessor in the session left.
    constexpr int kConvHeads = 8;
    const int heads = static_cast<int>(conv_dim / hd);
    const size_t conv_state = static_cast<size_t>(hp.conv_len - 1) * conv_dim;
    p.pool.run((heads + kConvHeads - 1) / kConvHeads, [&](int g) {
        const int h0 = g * kConvHeads, h1 = std::min(heads, h0 + kConvHeads);
        const size_t c0 = static_cast<size_t>(h0) * hd;
        const int width = (h1 - h0) * hd;
        convolve(p, layer, L.conv_w + c0 * hp.conv_len, c0, conv_dim, mixed + c0, conv_dim, qkv + c0, conv_dim, width);
        for (int t = 0; t < n; ++t) {
            float *c = qkv + t * conv_dim + c0;
            kernels().glu(false, c, nullptr, width); // SiLU
            for (int h = h0; h < std::min(h1, 2 * n_k); ++h) // the q and k heads
                l2_normalize(c + static_cast<size_t>(h - h0) * hd, hd, hp.norm_eps);
        }
    });
    // The scan: a task per value head runs the batch's tokens in order over their
    // sessions' states, so a token's result depends on nothing else in the batch; then
    // the head's output is RMS-normed and gated.
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    p.pool.run(n_v, [&](int h) {
        const int kh = h % n_k;
        for (int t = 0; t < n; ++t) {
            float &a = alpha[t * n_v + h], &b = beta[t * n_v + h];
            a = std::exp(softplus(a + L.delta_dt[h]) * L.delta_a[h]); // the decay
            b = sigmoid(b);
        }
        // Runs of consecutive tokens of one session, one kernel call each (cut after a
        // token whose state the trail keeps).
        for (int t = 0, u = 0; t < n; t = u + 1) {
            u = scan_end(p, layer, t);
            RecurrentState *rs = p.batch[t].rs;
            const float *c = qkv + t * conv_dim;
            const DeltaTokens run{c + static_cast<size_t>(kh) * hd, c + dn.qk_dim() + static_cast<size_t>(kh) * hd,
                                  c + 2 * dn.qk_dim() + static_cast<size_t>(h) * hd, conv_dim,
                                  alpha + t * n_v + h, beta + t * n_v + h, static_cast<size_t>(n_v),
                                  out + t * v_dim + static_cast<size_t>(h) * hd, v_dim};
            const size_t at = conv_state + static_cast<size_t>(h) * hd * hd;
            delta_scan(rs->layer(layer) + at, run, u + 1 - t, hd, scale);
            keep(rs, layer, p.batch[u].pos, at, 1, 0, static_cast<size_t>(hd) * hd);
        }
        for (int t = 0; t < n; ++t) {
            float *o = out + t * v_dim + static_cast<size_t>(h) * hd;
            float *g = z + t * v_dim + static_cast<size_t>(h) * hd;
            rmsnorm(o, o, L.delta_norm, hd, hp.norm_eps);
            kernels().glu(false, g, nullptr, hd); // SiLU
            for (int i = 0; i < hd; ++i) o[i] *= g[i];
        }
    });
    matmuls(p, out, {residual(L.delta_out, p.x)}); // x += gated output · delta_outᵀ
}

// ---- Mamba-2 (Granite 4.0-H) -------------------------------------------------

void ssm_scan_ref(float *s, const SsmTokens &x, int n, int head_dim, int d_state) {
    for (int t = 0; t < n; ++t) {
        const float *xt = x.x + t * x.stride, *b = x.b + t * x.stride, *c = x.c + t * x.stride;
        const float dt = x.dt[t * x.dt_stride], decay = x.decay[t * x.dt_stride];
        float *y = x.y + t * x.y_stride;
        for (int i = 0; i < head_dim; ++i) {
            float *row = s + static_cast<size_t>(i) * d_state;
            const float x_dt = xt[i] * dt;
            float sum = 0.0f;
            for (int j = 0; j < d_state; ++j) {
                row[j] = row[j] * decay + b[j] * x_dt;
                sum += row[j] * c[j];
            }
            y[i] = sum;
        }
    }
}

void ssm_scan(float *s, const SsmTokens &x, int n, int head_dim, int d_state) {
    kernels().ssm_scan(s, x, n, head_dim, d_state);
}

void mamba2(const Pass &p, const LayerWeights &L, int layer, float *out) {
    const HParams &hp = p.hp;
    const HParams::Mamba2 &mb = hp.mamba;
    const int n = p.n, hd = mb.head_dim, heads = mb.heads, d_state = mb.d_state;
    const size_t inner = mb.inner(), conv_dim = mb.conv_dim(), proj = inner + conv_dim + heads;
    // Scratch per token: z, x B C and dt as projected (proj), the convolved x B C
    // (conv_dim), the heads' output (inner), steps and decays (heads each).
    std::vector<float> &ws = p.ws.recurrent;
    ws.resize(n * (proj + conv_dim + inner + 2 * static_cast<size_t>(heads)));
    float *zxbcdt = ws.data(), *xbc = zxbcdt + n * proj, *y = xbc + n * conv_dim, *steps = y + n * inner;
    float *decays = steps + static_cast<size_t>(n) * heads;
    matmuls(p, p.xb, {project(L.ssm_in, zxbcdt)});
    // The convolution, its bias and SiLU: a task per kConvChannels channels runs the
    // batch's tokens in order, each continuing the window its predecessor in the
    // session left.
    constexpr size_t kConvChannels = 64;
    p.pool.run(static_cast<int>((conv_dim + kConvChannels - 1) / kConvChannels), [&](int g) {
        const size_t c0 = static_cast<size_t>(g) * kConvChannels;
        const int width = static_cast<int>(std::min(kConvChannels, conv_dim - c0));
        convolve(p, layer, L.conv_w + c0 * hp.conv_len, c0, conv_dim, zxbcdt + inner + c0, proj, xbc + c0, conv_dim,
                 width);
        for (int t = 0; t < n; ++t) {
            float *c = xbc + t * conv_dim + c0;
            if (L.conv_b != nullptr)
                for (int i = 0; i < width; ++i) c[i] += L.conv_b[c0 + i];
            kernels().glu(false, c, nullptr, width); // SiLU
        }
    });
    // The scan: a task per head runs the batch's tokens in order over their sessions'
    // states, so a token's result depends on nothing else in the batch; then the skip
    // and the gate.
    const size_t conv_state = static_cast<size_t>(hp.conv_len - 1) * conv_dim;
    const int per_group = heads / mb.groups;
    p.pool.run(heads, [&](int h) {
        const size_t g = static_cast<size_t>(h / per_group);
        float *dt = steps + h, *dA = decays + h; // token t's at [t * heads]
        for (int t = 0; t < n; ++t) {
            dt[t * heads] = softplus(zxbcdt[t * proj + inner + conv_dim + h] + L.ssm_dt[h]);
            dA[t * heads] = std::exp(dt[t * heads] * L.ssm_a[h]);
        }
        // Runs of consecutive tokens of one session, one scan each (cut after a token
        // whose state the trail keeps).
        for (int t = 0, u = 0; t < n; t = u + 1) {
            u = scan_end(p, layer, t);
            RecurrentState *rs = p.batch[t].rs;
            const float *c = xbc + t * conv_dim;
            const SsmTokens run{c + static_cast<size_t>(h) * hd, c + inner + g * d_state,
                                c + inner + (mb.groups + g) * d_state, conv_dim,
                                dt + t * heads, dA + t * heads, static_cast<size_t>(heads),
                                y + t * inner + static_cast<size_t>(h) * hd, inner};
            const size_t at = conv_state + static_cast<size_t>(h) * hd * d_state;
            ssm_scan(rs->layer(layer) + at, run, u + 1 - t, hd, d_state);
            keep(rs, layer, p.batch[u].pos, at, 1, 0, static_cast<size_t>(hd) * d_state);
        }
        for (int t = 0; t < n; ++t) {
            const size_t at = static_cast<size_t>(h) * hd;
            float *o = y + t * inner + at;
            const float *x = xbc + t * conv_dim + at;
            float *z = zxbcdt + t * proj + at;
            kernels().glu(false, z, nullptr, hd); // SiLU
            for (int i = 0; i < hd; ++i) o[i] = (o[i] + x[i] * L.ssm_d[h]) * z[i];
        }
    });
    // Each group's channels RMS-normed (a group may span several heads).
    const int group_dim = static_cast<int>(inner) / mb.groups;
    p.pool.run(n, [&](int t) {
        for (int g = 0; g < mb.groups; ++g) {
            float *o = y + t * inner + static_cast<size_t>(g) * group_dim;
            rmsnorm(o, o, L.ssm_norm + static_cast<size_t>(g) * group_dim, group_dim, hp.norm_eps);
        }
    });
    matmuls(p, y, {project(L.ssm_out, out)}); // out = y · ssm_outᵀ
}

} // namespace llmd
