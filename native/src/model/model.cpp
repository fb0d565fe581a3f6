// model.cpp — see model.h: the forward pass (embed, each layer as its architecture
// builds it, then the final norm and output head) and the shared ops layers are built
// from, over the kernels: matmuls split across threads, attention over the KV cache.
// Loading is load.cpp's; the KV cache, memory/kvcache.cpp's.
#include "model/model.h"

#include "arch/arch.h"
#include "kernels/kernels.h"
#include "memory/kvcache.h"
#include "ops/attention.h"
#include "ops/recurrent.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace llmd {

void Workspace::reserve(const HParams &hp, int n_tokens) {
    if (n_tokens <= capacity) return;
    const size_t n = static_cast<size_t>(n_tokens);
    x.resize(n * hp.n_embd);
    xb.resize(n * hp.n_embd);
    q.resize(n * hp.q_dim());
    q8.resize(n * (hp.q_dim() / QK));
    k.resize(n * hp.kv_dim());
    v.resize(n * hp.kv_dim());
    att.resize(n * hp.q_dim());
    hb.resize(n * hp.n_ff);
    hb2.resize(n * hp.n_ff);
    logits_in.resize(n * hp.n_embd);
    rope.resize(n * hp.rope_dim);
    rope_local.resize(n * hp.rope_dim);
    xq.resize(quantized_blocks(n_tokens, (hp.matrix_input + QK - 1) / QK * QK));
    per_layer.resize(n * hp.n_layer * hp.n_embd_per_layer);
    capacity = n_tokens;
}

namespace {

// Rows [r0, r1) of a job's product for n tokens, unscaled; r0 is a multiple of kPanel.
void matmul_product(const MatJob &job, int n, int64_t r0, int64_t r1) {
    const Matrix &w = *job.w;
    const int64_t cols = w.cols, rows = w.rows, nb = cols / QK;
    const TypeTraits &traits = *type_traits(w.type);
    const BlockQ8A *xq = traits.activation == Activation::F32 ? nullptr : activations_of(traits, job.xq, n, cols);
    const DotFn dot = kernels().dot[w.type];
    if (w.packed != nullptr) {
        matmul_packed(w.type, w.packed, rows, cols, r0 / kPanel, (r1 + kPanel - 1) / kPanel, xq, n, job.y, rows,
                      job.add);
        return;
    }
    constexpr int kTokenTile = 16; // tokens sharing one pass over the rows
    for (int t0 = 0; t0 < n; t0 += kTokenTile) {
        const int t1 = std::min(n, t0 + kTokenTile);
        for (int64_t r = r0; r < r1; ++r) {
            const uint8_t *row = w.row(r);
            for (int t = t0; t < t1; ++t) {
                const float v = dot(row, job.x + t * cols, xq != nullptr ? xq + t * nb : nullptr, cols);
                float &y = job.y[t * rows + r];
                y = job.add ? y + v : v;
            }
        }
    }
}

// Rows [r0, r1) of a job for n tokens. A matrix with a per-tensor scale has its product
// multiplied by it before it joins y, as llama.cpp scales it: y = s · (x wᵀ) or y += that.
void matmul_rows(const MatJob &job, int n, int64_t r0, int64_t r1) {
    const float s = job.w->scale;
    if (s == 1.0f) {
        matmul_product(job, n, r0, r1);
        return;
    }
    const int64_t rows = job.w->rows, width = r1 - r0;
    thread_local std::vector<float> kept; // y's rows before a residual product joins them
    if (job.add) {
        kept.resize(static_cast<size_t>(n) * width);
        for (int t = 0; t < n; ++t) std::copy_n(job.y + t * rows + r0, width, kept.data() + t * width);
    }
    MatJob product = job;
    product.add = false;
    matmul_product(product, n, r0, r1);
    for (int t = 0; t < n; ++t) {
        float *y = job.y + t * rows + r0;
        for (int64_t r = 0; r < width; ++r) y[r] = job.add ? kept[t * width + r] + s * y[r] : s * y[r];
    }
}

// y[t * rows + r] += scale · bias[r] for rows [r0, r1) of n tokens.
void add_bias(float *y, const float *bias, float scale, int n, int64_t rows, int64_t r0, int64_t r1) {
    for (int t = 0; t < n; ++t)
        for (int64_t r = r0; r < r1; ++r) y[t * rows + r] += scale == 1.0f ? bias[r] : scale * bias[r];
}

// gpt-oss's gated unit, elementwise in place of gate: the gate capped at 7 and the up
// projection clamped to [-7, 7], then gate · sigmoid(1.702 · gate) · (up + 1), with the
// constants llama.cpp's graph gives it (its SWIGLU_OAI_MOE). Each element on its own,
// in one order on every CPU: a token's bits never depend on its batch.
void swiglu_oai(float *gate, const float *up, int64_t n) {
    constexpr float kAlpha = 1.702f, kLimit = 7.0f;
    for (int64_t i = 0; i < n; ++i) {
        const float g = std::min(gate[i], kLimit), u = std::clamp(up[i], -kLimit, kLimit);
        gate[i] = g / (1.0f + std::exp(-kAlpha * g)) * (u + 1.0f);
    }
}

// Rows [r0, r1) of a job, with its biases and gated unit when it has them.
void run_job(const MatJob &j, int n, int64_t r0, int64_t r1) {
    matmul_rows(j, n, r0, r1);
    const int64_t rows = j.w->rows;
    if (j.bias != nullptr) add_bias(j.y, j.bias, j.scale_bias ? j.w->scale : 1.0f, n, rows, r0, r1);
    if (j.up == nullptr) return;
    matmul_rows({j.up, j.x, j.xq, j.scratch}, n, r0, r1);
    if (j.up_bias != nullptr) add_bias(j.scratch, j.up_bias, j.scale_bias ? j.up->scale : 1.0f, n, rows, r0, r1);
    const auto glu = kernels().glu;
    for (int t = 0; t < n; ++t) {
        float *gate = j.y + t * rows + r0;
        const float *up = j.scratch + t * rows + r0;
        if (j.act == Glu::relu) // exact in any order: no kernel of its own
            for (int64_t i = 0; i < r1 - r0; ++i) gate[i] = std::max(gate[i], 0.0f) * up[i];
        else if (j.act == Glu::swiglu_oai)
            swiglu_oai(gate, up, r1 - r0);
        else
            glu(j.act == Glu::gelu, gate, up, r1 - r0);
    }
}

// Runs the jobs (which share one input) as one parallel region. Their panels, taken
// as one sequence, are cut into two equal spans a thread: enough to balance the
// threads, and long enough that a decode step's span is one long stream from memory
// (claiming a task and restarting a stream cost more than 64 rows took to read).
// A prefill computes far longer on a panel than it takes to read: eight spans a
// thread, so that a thread which finishes early (or that the OS paused) is helped.
void run_matmuls(ThreadPool &pool, int n, const std::vector<MatJob> &jobs) {
    int64_t panels = 0;
    for (const MatJob &j : jobs) panels += (j.w->rows + kPanel - 1) / kPanel;
    const int spans = n >= kPanel ? 8 : 2;
    const int n_tasks = static_cast<int>(std::min<int64_t>(panels, spans * pool.size()));
    pool.run(n_tasks, [&](int task) {
        const int64_t p0 = panels * task / n_tasks, p1 = panels * (task + 1) / n_tasks;
        int64_t first = 0; // the job's first panel in the sequence
        for (const MatJob &j : jobs) {
            const int64_t own = (j.w->rows + kPanel - 1) / kPanel;
            const int64_t a = std::max(p0, first) - first, b = std::min(p1, first + own) - first;
            if (a < b) run_job(j, j.n > 0 ? j.n : n, a * kPanel, std::min(b * kPanel, j.w->rows));
            first += own;
        }
    });
}

} // namespace

void rmsnorm(float *out, const float *x, const float *weight, int n, float eps,
             double (*sum_squares)(const float *x, int n)) {
    const float scale = static_cast<float>(1.0 / std::sqrt(sum_squares(x, n) / n + eps));
    for (int i = 0; i < n; ++i) out[i] = x[i] * scale * weight[i];
}

namespace {

// cs (rope_dim): cos and sin of each rotated pair's angle at position pos, times mscale.
void rope_angles(float *cs, const std::vector<float> &inv_freq, float mscale, int pos) {
    const float p = static_cast<float>(pos);
    for (size_t i = 0; i < inv_freq.size(); ++i) {
        const float theta = p * inv_freq[i];
        cs[2 * i] = std::cos(theta) * mscale;
        cs[2 * i + 1] = std::sin(theta) * mscale;
    }
}

// Query heads one kernel call attends at most: the kernel keeps two score
// accumulators per head in registers, and 8 heads (Qwen3-1.7B's 2 per KV head × 4
// tokens) scored a position in 0.56× the time of 2 heads; 16 spilled.
constexpr int kAttnQueries = 8;

// Tokens of one session one attention task takes at most (attention below): a
// verification of 15 drafts reads each range of the cache once.
constexpr int kAttnTokens = 16;

// Attention of n_q query heads over positions [p0, p1) of one KV head of a layer's
// cache into out/part (attend_range's partials), in kernel calls of at most
// kAttnQueries heads over the span's runs (attention.h: AttnRun): its pool blocks,
// or a ring's end and start; a call after the first finds them in cache, so only the
// first is cold (attend_range), and only when the span is: cold when no span of the
// same range was attended just before. Runs start at a key block, so a span that
// starts inside one (a sliding window's first positions) has that block's part
// copied into a block of its own first. The runs are fixed by the positions alone,
// never by the batch. A span lies inside one range of kAttnRange positions: at most
// kAttnRange / kKVBlock pool blocks or two pieces of a ring (whose slots are at
// least kMaxBatch, KVCache::layout) after the copied start.
void attend_span(const KVCache &kv, int layer, int head, int p0, int p1, const float *q, const BlockQ8A *q8,
                 int n_q, AttnScale score, float *out, AttnPartial *part, bool cold) {
    static_assert(kAttnRange % kKVBlock == 0 && kMaxBatch >= kAttnRange);
    const KVCache::Layer &L = kv.layers[layer];
    const int hd = L.hd;
    const KVTypes types = kv.types;
    const int head_end = std::min(p1, (p0 + kKeyBlock - 1) / kKeyBlock * kKeyBlock); // end of the unaligned part
    AttnRun runs[kAttnRange / kKVBlock + 1];
    int n_runs = 0;
    if (head_end > p0) {
        thread_local std::vector<uint8_t> keys, values, key;
        keys.assign(kKeyBlock * L.k_row, 0);
        values.resize(kKeyBlock * L.v_row);
        key.resize(L.k_row);
        for (int p = p0; p < head_end; ++p) {
            const int i = p - p0;
            kv.load(layer, head, p, key.data(), &values[i * L.v_row]);
            key_store(types.k, key.data(), keys.data(), i, hd);
        }
        runs[n_runs++] = {keys.data(), values.data(), head_end - p0};
    }
    // Whether positions of n_pos (whole kernel blocks) at run `r` continue in memory at k, v.
    const auto continues = [&L](const AttnRun &r, const uint8_t *k, const uint8_t *v) {
        return r.n_pos % kKVBlock == 0 && r.k + r.n_pos * L.k_row == k && r.v + r.n_pos * L.v_row == v;
    };
    for (int p = head_end; p < p1;) { // whole key blocks, up to the end of a run at a time
        const KVCache::Row r = kv.row(layer, head, p);
        const int n_pos = std::min(p1 - p, r.count - r.index);
        const uint8_t *k = r.keys + r.index * L.k_row, *v = r.values + r.index * L.v_row;
        if (n_runs > 0 && continues(runs[n_runs - 1], k, v)) // pool blocks placed in a row
            runs[n_runs - 1].n_pos += n_pos;
        else
            runs[n_runs++] = {k, v, n_pos};
        p += n_pos;
    }
    if (cold && L.paged >= 0 && static_cast<size_t>(p1 / kKVBlock) < kv.blocks.size()) {
        const KVCache::Row next = kv.row(layer, head, p1); // where the next range starts
        const uint8_t *k = next.keys + next.index * L.k_row, *v = next.values + next.index * L.v_row;
        if (n_runs == 0 || !continues(runs[n_runs - 1], k, v)) // else the stream goes on
            prefetch_run(k, v, next.count - next.index, hd, types);
    }
    const int calls = (n_q + kAttnQueries - 1) / kAttnQueries; // 15 heads: 7, then 8
    for (int c = 0; c < calls; ++c) {
        const int g0 = n_q * c / calls, g1 = n_q * (c + 1) / calls;
        attend_range(q + g0 * hd, q8 + g0 * (hd / QK), g1 - g0, runs, n_runs, hd, types, score, out + g0 * hd,
                     part + g0, cold && c == 0);
    }
}

// Each token's queries against its session's cache (which already holds this
// layer's K/V for the token), the query heads of a group sharing each key and value
// row. A token attends [first, pos] (first = 0, or the start of a sliding window),
// cut at fixed positions into ranges of kAttnRange (attention.h) counted from position
// 0, and the ranges' partials are folded in order: a token's output does not depend
// on the batch or the threads; only the schedule does.
//
// A task attends, against one KV head, a run of up to kAttnTokens consecutive tokens
// of one session: tokens that attend the same positions of a range (every range but
// a token's last, in a prefill or a verification of drafts) attend it in one
// attend_span call, their query heads side by side, so that the range's keys and
// values are read from memory once for all of them. The kernel computes every query
// head on its own, in the same order whatever else shares the call, so a token's
// bits stay those of its decode step. Few such runs over a long context: each run's
// ranges are split into spans, a task each, so that every thread gets a share; the
// tasks keep every range's partial, folded afterwards in range order.
void attention(const Model &model, const BatchToken *batch, int n, int layer, Workspace &ws, ThreadPool &pool) {
    const HParams &hp = model.hp;
    const int hd = hp.hd(layer), n_kv = hp.kv_heads(layer), group = hp.n_head / n_kv, q_dim = hp.n_head * hd;
    const AttnScale score{hp.attn_scale > 0.0f ? hp.attn_scale : 1.0f / std::sqrt(static_cast<float>(hd)),
                          hp.attn_softcap};
    const int window = hp.window[layer];
    const float *sinks = model.block(layer).attn_sinks; // (n_head), or null
    const auto first_attended = [&](int t) { return window > 0 ? std::max(0, batch[t].pos + 1 - window) : 0; };
    const auto first_range = [&](int t) { return first_attended(t) / kAttnRange; };
    const auto end_range = [&](int t) { return attn_range_count(batch[t].pos + 1); };
    // Range R's positions for token t, or {0, 0} when its context does not reach R.
    const auto span_of = [&](int t, int R) {
        const int len = batch[t].pos + 1, first = first_attended(t);
        if (R < first / kAttnRange || R * kAttnRange >= len) return std::pair<int, int>{0, 0};
        return std::pair<int, int>{std::max(first, R * kAttnRange), std::min(len, (R + 1) * kAttnRange)};
    };
    // Tokens a run takes at most: a few (a verification, a decode step) go in runs of
    // up to kAttnTokens whose ranges spans may share out; more go in runs short enough
    // that every thread still gets 4 tasks, so that spans, whose slots grow with the
    // tokens, serve only as few tokens as they did one token a task.
    const int threads = pool.size();
    const int per_run = n <= kAttnTokens ? kAttnTokens : std::clamp(n * n_kv / (4 * threads), 1, kAttnTokens);
    struct Run { int t0, t1, r0, r1; }; // tokens [t0, t1) of one session, attending ranges [r0, r1)
    std::vector<Run> runs;
    int r_min = first_range(0), r_max = 0, widest = 1;
    for (int t0 = 0; t0 < n;) {
        Run r{t0, t0, first_range(t0), 0};
        for (; r.t1 < n && r.t1 - t0 < per_run && batch[r.t1].kv == batch[t0].kv; ++r.t1) {
            r.r0 = std::min(r.r0, first_range(r.t1));
            r.r1 = std::max(r.r1, end_range(r.t1));
        }
        r_min = std::min(r_min, r.r0);
        r_max = std::max(r_max, r.r1);
        widest = std::max(widest, r.r1 - r.r0);
        runs.push_back(r);
        t0 = r.t1;
    }
    const int n_runs = static_cast<int>(runs.size());
    const int spans = attn_task_spans(n_runs * n_kv, widest, threads);
    // Where token t's output of range R against KV head h goes: with one span a task
    // folds each range as soon as it is attended, so a slot per (head, token) serves;
    // with more, a slot per (head, range, token). A call's tokens write adjacent slots.
    const size_t pairs = static_cast<size_t>(n) * n_kv, ranges = spans > 1 ? r_max - r_min : 1;
    const size_t slots = pairs * ranges;
    const auto slot_of = [&](int t, int h, int R) {
        return spans > 1 ? (static_cast<size_t>(h) * ranges + (R - r_min)) * n + t : static_cast<size_t>(h) * n + t;
    };
    // Per slot a range's output and partial, then per (token, head) a running result's partial.
    ws.att_parts.resize(slots * group * hd);
    ws.att_stats.resize((slots + pairs) * group);
    const float *q = ws.q.data();
    const BlockQ8A *q8 = ws.q8.data(); // read for quantized keys (attend)
    const int q8_head = hd / QK;       // Q8A blocks of a query head
    float *att = ws.att.data();
    const auto y_of = [&](int t, int h) { return att + t * q_dim + h * group * hd; };
    const auto acc_of = [&](int t, int h) { return ws.att_stats.data() + (slots + t * n_kv + h) * group; };
    const auto fold = [&](int t, int h, int R) {
        const size_t slot = slot_of(t, h, R);
        attend_fold(y_of(t, h), acc_of(t, h), ws.att_parts.data() + slot * group * hd,
                    ws.att_stats.data() + slot * group, group, hd);
    };
    const auto finish = [&](int t, int h) {
        if (sinks != nullptr) attend_sink(y_of(t, h), acc_of(t, h), sinks + h * group, group, hd);
        attend_finish(y_of(t, h), acc_of(t, h), group, hd);
    };
    pool.run(n_runs * n_kv * spans, [&](int task) {
        const int c = task % spans, h = task / spans % n_kv;
        const Run &run = runs[task / spans / n_kv];
        const int width = run.r1 - run.r0;
        thread_local std::vector<float> qs; // the call's query heads, token after token
        thread_local std::vector<BlockQ8A> q8s;
        qs.resize(static_cast<size_t>(run.t1 - run.t0) * group * hd);
        q8s.resize(static_cast<size_t>(run.t1 - run.t0) * group * q8_head);
        if (spans == 1)
            for (int t = run.t0; t < run.t1; ++t) attend_start(y_of(t, h), acc_of(t, h), group, hd);
        for (int R = run.r0 + width * c / spans; R < run.r0 + width * (c + 1) / spans; ++R) { // in order
            bool cold = true; // the range's first span; the next ones find its positions in cache
            for (int i = run.t0; i < run.t1;) {
                const std::pair<int, int> span = span_of(i, R);
                if (span.second == 0) {
                    ++i;
                    continue;
                }
                int j = i + 1; // tokens i..j-1 attend the same positions
                while (j < run.t1 && span_of(j, R) == span) ++j;
                for (int t = i; t < j; ++t) {
                    std::copy_n(q + t * q_dim + h * group * hd, group * hd, qs.data() + (t - i) * group * hd);
                    if (batch[i].kv->types.k != GGML_F16)
                        std::copy_n(q8 + (t * hp.n_head + h * group) * q8_head, group * q8_head,
                                    q8s.data() + (t - i) * group * q8_head);
                }
                const size_t slot = slot_of(i, h, R);
                attend_span(*batch[i].kv, layer, h, span.first, span.second, qs.data(), q8s.data(), (j - i) * group,
                            score, ws.att_parts.data() + slot * group * hd, ws.att_stats.data() + slot * group, cold);
                cold = false;
                if (spans == 1)
                    for (int t = i; t < j; ++t) fold(t, h, R);
                i = j;
            }
        }
        if (spans == 1)
            for (int t = run.t0; t < run.t1; ++t) finish(t, h);
    });
    if (spans == 1) return;
    for (int t = 0; t < n; ++t)
        for (int h = 0; h < n_kv; ++h) {
            attend_start(y_of(t, h), acc_of(t, h), group, hd);
            for (int R = first_range(t); R < end_range(t); ++R) fold(t, h, R);
            finish(t, h);
        }
}

} // namespace

// ---- shared ops ------------------------------------------------------------

MatJob project(const Matrix &w, float *y, const float *bias) { return {&w, nullptr, nullptr, y, false, bias}; }

MatJob residual(const Matrix &w, float *y, const float *bias) { return {&w, nullptr, nullptr, y, true, bias}; }

MatJob swiglu(const Matrix &gate, const Matrix &up, float *y, float *scratch, const float *gate_bias,
              const float *up_bias) {
    return {&gate, nullptr, nullptr, y, false, gate_bias, &up, up_bias, scratch};
}

MatJob geglu(const Matrix &gate, const Matrix &up, float *y, float *scratch) {
    MatJob job = swiglu(gate, up, y, scratch);
    job.act = Glu::gelu;
    return job;
}

namespace {

// fn(t0, t1) for the pass's tokens cut into one share a thread: per-token work that
// one thread alone made the others wait for in a prefill (norms, RoPE, quantization,
// the KV cache's new rows). A decode step's one token runs on the calling thread.
template <typename Fn> void per_token(const Pass &p, const Fn &fn) {
    const int n_tasks = std::min(p.n, p.pool.size());
    p.pool.run(n_tasks, [&](int task) { fn(p.n * task / n_tasks, p.n * (task + 1) / n_tasks); });
}

} // namespace

void matmuls(const Pass &p, const float *x, std::initializer_list<MatJob> jobs) {
    BlockQ8A *xq = p.ws.xq.data();
    const int64_t cols = jobs.begin()->w->cols;
    bool q8a = false, q8k = false; // the activation formats the jobs' kernels read
    for (const MatJob &j : jobs)
        for (const Matrix *m : {j.w, j.up})
            if (m != nullptr) {
                const Activation a = type_traits(m->type)->activation;
                q8a |= a == Activation::Q8A;
                q8k |= a == Activation::Q8K;
            }
    per_token(p, [&](int t0, int t1) { quantize_rows_part(x, p.n, cols, xq, t0, t1, q8a, q8k); });
    std::vector<MatJob> &fed = p.ws.jobs; // kept between calls: no allocation per region
    fed.assign(jobs);
    for (MatJob &j : fed) {
        j.x = x;
        j.xq = xq;
    }
    run_matmuls(p.pool, p.n, fed);
}

void rmsnorm_rows(const Pass &p, float *out, const float *x, const float *weight) {
    const int dim = p.hp.n_embd;
    per_token(p, [&](int t0, int t1) {
        for (int t = t0; t < t1; ++t) rmsnorm(out + t * dim, x + t * dim, weight, dim, p.hp.norm_eps);
    });
}

void layernorm(float *out, const float *x, const float *weight, int n, float eps) {
    double sum = 0.0;
    for (int i = 0; i < n; ++i) sum += x[i];
    const float mean = static_cast<float>(sum / n);
    double squares = 0.0;
    for (int i = 0; i < n; ++i) squares += static_cast<double>(x[i] - mean) * (x[i] - mean);
    const float scale = static_cast<float>(1.0 / std::sqrt(squares / n + eps));
    for (int i = 0; i < n; ++i) out[i] = (x[i] - mean) * scale * weight[i];
}

void layernorm_rows(const Pass &p, float *out, const float *x, const float *weight) {
    const int dim = p.hp.n_embd;
    per_token(p, [&](int t0, int t1) {
        for (int t = t0; t < t1; ++t) layernorm(out + t * dim, x + t * dim, weight, dim, p.hp.norm_eps);
    });
}

void moe(const Pass &p, const LayerWeights &L, const float *xb, float *x, const float *route) {
    const HParams &hp = p.hp;
    const int n = p.n, dim = hp.n_embd, n_exp = hp.n_expert, k = hp.n_expert_used;
    Workspace &ws = p.ws;
    const size_t ff = static_cast<size_t>(hp.n_ff_exp), shared_ff = static_cast<size_t>(hp.n_ff_shexp);
    ws.router.resize(static_cast<size_t>(n) * n_exp);
    const size_t rows = static_cast<size_t>(n) * k; // (token, chosen expert) pairs
    ws.moe_in.resize(rows * dim);
    ws.moe_out.resize(rows * dim);
    ws.moe_h.resize(rows * ff);
    ws.moe_h2.resize(std::max(rows * ff, n * shared_ff)); // the up-projection scratch of either
    ws.moe_xq.resize(std::max(quantized_blocks(static_cast<int>(rows), dim), quantized_blocks(static_cast<int>(rows), hp.n_ff_exp)));
    ws.moe_acc.assign(static_cast<size_t>(n) * dim, 0.0f);
    // The shared expert reads xb as the router mostly does: then one region computes
    // both, and its hidden rows wait in moe_shared until the routed experts are summed.
    const bool shared = L.up_shexp.data != nullptr;
    if (shared) ws.moe_shared.resize(n * shared_ff);
    const MatJob shared_job = L.gate_shexp.data != nullptr
                                  ? swiglu(L.gate_shexp, L.up_shexp, ws.moe_shared.data(), ws.moe_h2.data())
                                  : project(L.up_shexp, ws.moe_shared.data());
    const MatJob router_job = project(L.router, ws.router.data(), L.router_b);
    if (route != nullptr) {
        matmuls(p, route, {router_job});
        if (shared) matmuls(p, xb, {shared_job});
    } else if (shared) {
        matmuls(p, xb, {router_job, shared_job});
    } else {
        matmuls(p, xb, {router_job});
    }
    if (shared && L.gate_shexp.data == nullptr) relu_squared(ws.moe_shared.data(), n * shared_ff);
    // Per token: the experts' probabilities, the top k (ties to the lower index) by
    // probability plus bias, and their weights; chosen (n, n_expert) holds a token's
    // weight for each chosen expert. softmax_chosen: the top k by score, and the
    // softmax over their scores.
    std::vector<float> &chosen = ws.moe_weights;
    chosen.assign(static_cast<size_t>(n) * n_exp, 0.0f);
    std::vector<int> order(n_exp);
    std::vector<float> score(n_exp);
    const auto softmax = [](float *v, int m, const int *at) { // v[at[0..m)] := their softmax
        float mx = -INFINITY, sum = 0.0f;
        for (int i = 0; i < m; ++i) mx = std::max(mx, v[at[i]]);
        for (int i = 0; i < m; ++i) sum += v[at[i]] = std::exp(v[at[i]] - mx);
        for (int i = 0; i < m; ++i) v[at[i]] /= sum;
    };
    for (int t = 0; t < n; ++t) {
        float *prob = ws.router.data() + static_cast<size_t>(t) * n_exp;
        for (int e = 0; e < n_exp; ++e) order[e] = e;
        if (hp.gating == HParams::Gating::sigmoid) {
            for (int e = 0; e < n_exp; ++e) prob[e] = 1.0f / (1.0f + std::exp(-prob[e]));
        } else if (hp.gating == HParams::Gating::sqrt_softplus) { // softplus taken as the score past 20, as ggml does
            for (int e = 0; e < n_exp; ++e) prob[e] = std::sqrt(prob[e] > 20.0f ? prob[e] : std::log(1.0f + std::exp(prob[e])));
        } else if (hp.gating == HParams::Gating::softmax) {
            softmax(prob, n_exp, order.data());
        }
        for (int e = 0; e < n_exp; ++e) score[e] = L.expert_bias != nullptr ? prob[e] + L.expert_bias[e] : prob[e];
        std::partial_sort(order.begin(), order.begin() + k, order.end(),
                          [&](int a, int b) { return score[a] > score[b] || (score[a] == score[b] && a < b); });
        if (hp.gating == HParams::Gating::softmax_chosen) softmax(prob, k, order.data()); // the scores of the top k
        float total = 0.0f;
        for (int i = 0; i < k; ++i) total += prob[order[i]];
        total = std::max(total, 6.103515625e-5f); // as llama.cpp bounds it (the smallest normal half): sigmoids may all be tiny
        for (int i = 0; i < k; ++i) {
            const float w = hp.expert_norm ? prob[order[i]] / total : prob[order[i]];
            chosen[static_cast<size_t>(t) * n_exp + order[i]] = w * hp.expert_scale;
        }
    }
    // The tokens grouped per expert, expert after expert, in moe_in. Every group is
    // its jobs' whole batch (quantized on its own), and all groups run as one parallel
    // region for gate and up, then one for down: two regions however many experts the
    // batch reaches and however few tokens each gets (one, in a decode step).
    ws.moe_groups.clear();
    ws.moe_tokens.clear();
    for (int e = 0; e < n_exp; ++e) {
        const int row = static_cast<int>(ws.moe_tokens.size());
        for (int t = 0; t < n; ++t)
            if (chosen[static_cast<size_t>(t) * n_exp + e] != 0.0f) ws.moe_tokens.push_back(t);
        if (static_cast<int>(ws.moe_tokens.size()) > row)
            ws.moe_groups.push_back({e, row, static_cast<int>(ws.moe_tokens.size()) - row});
    }
    for (size_t i = 0; i < ws.moe_tokens.size(); ++i)
        std::copy_n(xb + static_cast<size_t>(ws.moe_tokens[i]) * dim, dim, ws.moe_in.data() + i * dim);
    // Each group's jobs over its rows of `in` (cols wide), quantized into moe_xq.
    const auto run_groups = [&](const float *in, int64_t cols, const auto &job_of) {
        ws.jobs.clear();
        size_t q = 0;
        for (const Workspace::ExpertGroup &g : ws.moe_groups) {
            MatJob job = job_of(g);
            job.x = in + static_cast<size_t>(g.row) * cols;
            job.xq = ws.moe_xq.data() + q;
            job.n = g.n;
            quantize_rows(job.x, g.n, cols, ws.moe_xq.data() + q);
            q += quantized_blocks(g.n, cols);
            ws.jobs.push_back(job);
        }
        run_matmuls(p.pool, n, ws.jobs);
    };
    // An expert's row of a stack of biases (n_expert, width), or null.
    const auto bias_of = [](const float *stack, int e, size_t width) { return stack ? stack + e * width : nullptr; };
    const bool gated = !L.gate_exps.empty();
    run_groups(ws.moe_in.data(), dim, [&](const Workspace::ExpertGroup &g) {
        if (!gated)
            return project(L.up_exps[g.expert], ws.moe_h.data() + g.row * ff, bias_of(L.b_up_exps, g.expert, ff));
        MatJob job = swiglu(L.gate_exps[g.expert], L.up_exps[g.expert], ws.moe_h.data() + g.row * ff,
                            ws.moe_h2.data() + g.row * ff, bias_of(L.b_gate_exps, g.expert, ff),
                            bias_of(L.b_up_exps, g.expert, ff));
        job.act = hp.expert_glu;
        return job;
    });
    if (!gated) relu_squared(ws.moe_h.data(), rows * ff);
    run_groups(ws.moe_h.data(), hp.n_ff_exp, [&](const Workspace::ExpertGroup &g) {
        return project(L.down_exps[g.expert], ws.moe_out.data() + static_cast<size_t>(g.row) * dim,
                       bias_of(L.b_down_exps, g.expert, dim));
    });
    for (const Workspace::ExpertGroup &g : ws.moe_groups) // each token sums its experts in expert order
        for (int i = g.row; i < g.row + g.n; ++i) {
            const int t = ws.moe_tokens[i];
            const float w = chosen[static_cast<size_t>(t) * n_exp + g.expert];
            float *acc = ws.moe_acc.data() + static_cast<size_t>(t) * dim;
            const float *y = ws.moe_out.data() + static_cast<size_t>(i) * dim;
            for (int d = 0; d < dim; ++d) acc[d] += w * y[d];
        }
    if (shared) {
        matmuls(p, ws.moe_shared.data(), {project(L.down_shexp, ws.moe_out.data())});
        for (int t = 0; t < n; ++t) {
            const float *in = xb + static_cast<size_t>(t) * dim, *y = ws.moe_out.data() + static_cast<size_t>(t) * dim;
            float w = 1.0f;
            if (L.shexp_gate != nullptr) {
                float gate = 0.0f;
                for (int d = 0; d < dim; ++d) gate += in[d] * L.shexp_gate[d];
                w = 1.0f / (1.0f + std::exp(-gate));
            }
            float *acc = ws.moe_acc.data() + static_cast<size_t>(t) * dim;
            for (int d = 0; d < dim; ++d) acc[d] += w * y[d];
        }
    }
    add_rows(p, x, ws.moe_acc.data());
}

void relu_squared(float *x, size_t n) {
    for (size_t i = 0; i < n; ++i) x[i] = x[i] > 0.0f ? x[i] * x[i] : 0.0f;
}

void add_rows(const Pass &p, float *x, const float *y, float scale) {
    const size_t n = static_cast<size_t>(p.n) * p.hp.n_embd;
    for (size_t i = 0; i < n; ++i) x[i] += scale * y[i]; // exact for a scale of 1
}

void rmsnorm_heads(const Pass &p, float *x, int n_heads, const float *weight, int hd) {
    if (hd == 0) hd = p.hp.head_dim;
    per_token(p, [&](int t0, int t1) {
        for (int i = t0 * n_heads; i < t1 * n_heads; ++i) rmsnorm(x + i * hd, x + i * hd, weight, hd, p.hp.norm_eps);
    });
}

void rope(const Pass &p, float *x, int n_heads, Rope style, bool local, int hd) {
    const HParams &hp = p.hp;
    if (hd == 0) hd = hp.head_dim;
    const int half = static_cast<int>((local ? p.model.inv_freq_local : p.model.inv_freq).size());
    // Pair i of a head: dims (2i, 2i + 1) adjacent, (i, i + half) NEOX.
    const int first = style == Rope::adjacent ? 2 : 1, second = style == Rope::adjacent ? 1 : half;
    per_token(p, [&](int t0, int t1) {
        for (int t = t0; t < t1; ++t) {
            const float *cs = (local ? p.ws.rope_local : p.ws.rope).data() + t * hp.rope_dim;
            float *xt = x + static_cast<size_t>(t) * n_heads * hd;
            for (int i = 0; i < half; ++i) {
                const float c = cs[2 * i], s = cs[2 * i + 1];
                for (int h = 0; h < n_heads; ++h) {
                    float *v = xt + h * hd + first * i;
                    const float a = v[0], b = v[second];
                    v[0] = a * c - b * s;
                    v[second] = a * s + b * c;
                }
            }
        }
    });
}

void project_qkv(const Pass &p, const LayerWeights &L) {
    rmsnorm_rows(p, p.xb, p.x, L.attn_norm);
    matmuls(p, p.xb, {project(L.wq, p.q, L.bq), project(L.wk, p.k, L.bk), project(L.wv, p.v, L.bv)});
}

void rope_attention(const Pass &p, const LayerWeights &L, int layer, Rope style, bool local) {
    project_qkv(p, L);
    rope(p, p.q, p.hp.n_head, style, local);
    rope(p, p.k, p.hp.n_head_kv, style, local);
    attend(p, layer);                               // att = softmax(q kᵀ / √hd) v
    matmuls(p, p.att, {residual(L.wo, p.x, L.bo)}); // x += att woᵀ
}

void qk_norm_attention(const Pass &p, const LayerWeights &L, int layer) {
    project_qkv(p, L);
    rmsnorm_heads(p, p.q, p.hp.n_head, L.q_norm); // each head to unit RMS, then scaled
    rmsnorm_heads(p, p.k, p.hp.n_head_kv, L.k_norm);
    rope(p, p.q, p.hp.n_head, Rope::neox);
    rope(p, p.k, p.hp.n_head_kv, Rope::neox);
    attend(p, layer);                         // att = softmax(q kᵀ / √hd) v
    matmuls(p, p.att, {residual(L.wo, p.x)}); // x += att woᵀ
}

void gated_attention(const Pass &p, const LayerWeights &L, int layer) {
    const HParams &hp = p.hp;
    const int hd = hp.head_dim, q_dim = hp.q_dim();
    std::vector<float> &qg = p.ws.recurrent; // (n, 2 · q_dim): per head, queries then gate
    qg.resize(static_cast<size_t>(p.n) * 2 * q_dim);
    rmsnorm_rows(p, p.xb, p.x, L.attn_norm);
    matmuls(p, p.xb, {project(L.wq, qg.data(), L.bq), project(L.wk, p.k, L.bk), project(L.wv, p.v, L.bv)});
    for (int t = 0; t < p.n; ++t)
        for (int h = 0; h < hp.n_head; ++h)
            std::memcpy(p.q + static_cast<size_t>(t) * q_dim + h * hd, qg.data() + (static_cast<size_t>(t) * hp.n_head + h) * 2 * hd,
                        hd * sizeof(float));
    rmsnorm_heads(p, p.q, hp.n_head, L.q_norm);
    rmsnorm_heads(p, p.k, hp.n_head_kv, L.k_norm);
    rope(p, p.q, hp.n_head, Rope::neox);
    rope(p, p.k, hp.n_head_kv, Rope::neox);
    attend(p, layer); // att = softmax(q kᵀ / √hd) v
    for (int t = 0; t < p.n; ++t)
        for (int h = 0; h < hp.n_head; ++h) {
            float *a = p.att + static_cast<size_t>(t) * q_dim + h * hd;
            const float *gate = qg.data() + (static_cast<size_t>(t) * hp.n_head + h) * 2 * hd + hd;
            for (int i = 0; i < hd; ++i) a[i] /= 1.0f + std::exp(-gate[i]);
        }
    matmuls(p, p.att, {residual(L.wo, p.x)}); // x += gated att · woᵀ
}

void swiglu_ffn(const Pass &p, const LayerWeights &L) {
    rmsnorm_rows(p, p.xb, p.x, L.ffn_norm);
    MatJob gate_up = swiglu(L.w_gate, L.w_up, p.hb, p.hb2, L.b_gate, L.b_up), down = residual(L.w_down, p.x, L.b_down);
    gate_up.scale_bias = down.scale_bias = true;
    matmuls(p, p.xb, {gate_up});
    matmuls(p, p.hb, {down});
}

void ffn_sublayer(const Pass &p, const LayerWeights &L) {
    if (L.router.data == nullptr) {
        swiglu_ffn(p, L);
        return;
    }
    rmsnorm_rows(p, p.xb, p.x, L.ffn_norm);
    moe(p, L, p.xb, p.x);
}

void post_norm_rest(const Pass &p, int l, const LayerWeights &L) {
    attend(p, l);                              // att = softmax(q kᵀ / √hd) v over the window
    matmuls(p, p.att, {project(L.wo, p.xb)});  // xb = att woᵀ
    rmsnorm_rows(p, p.xb, p.xb, L.attn_post_norm);
    add_rows(p, p.x, p.xb);                    // x += norm(att woᵀ)
    matmuls(p, p.x, {swiglu(L.w_gate, L.w_up, p.hb, p.hb2)}); // hb = silu(x gateᵀ) * (x upᵀ)
    matmuls(p, p.hb, {project(L.w_down, p.xb)});              // xb = hb downᵀ
    rmsnorm_rows(p, p.xb, p.xb, L.ffn_post_norm);
    add_rows(p, p.x, p.xb);                                   // x += norm(hb downᵀ)
}

void sandwich_attention(const Pass &p, int l, const LayerWeights &L) {
    attend(p, l);                              // att = softmax(score(q kᵀ)) v over the layer's cache
    matmuls(p, p.att, {project(L.wo, p.xb)});  // xb = att woᵀ
    rmsnorm_rows(p, p.xb, p.xb, L.attn_post_norm);
    add_rows(p, p.x, p.xb);                    // x += norm(att woᵀ)
}

void sandwich_norm_rest(const Pass &p, int l, const LayerWeights &L, Glu act) {
    sandwich_attention(p, l, L);
    rmsnorm_rows(p, p.xb, p.x, L.ffn_norm);
    MatJob ffn = swiglu(L.w_gate, L.w_up, p.hb, p.hb2);
    ffn.act = act;
    matmuls(p, p.xb, {ffn});                                   // hb = act(xb gateᵀ) * (xb upᵀ)
    matmuls(p, p.hb, {project(L.w_down, p.xb)});               // xb = hb downᵀ
    rmsnorm_rows(p, p.xb, p.xb, L.ffn_post_norm);
    add_rows(p, p.x, p.xb);                                    // x += norm(hb downᵀ)
}

void attend(const Pass &p, int layer) {
    const HParams &hp = p.hp;
    const int hd = hp.hd(layer), n_kv = hp.kv_heads(layer), kv_dim = n_kv * hd, q_dim = hp.n_head * hd;
    for (int t = 0; t < p.n; ++t) p.batch[t].kv->high = std::max(p.batch[t].kv->high, p.batch[t].pos);
    // A quantized cache holds its keys and values rotated (attention.h: kv_rotation):
    // the queries rotate alike, the outputs rotate back.
    const int rot_k = kv_rotation(p.batch[0].kv->types.k, hd, true), rot_v = kv_rotation(p.batch[0].kv->types.v, hd, false);
    const auto rotate_heads = [&](float *x, int n) { // every head of n tokens' rows of q_dim, divided by n
        per_token(p, [&](int t0, int t1) {
            for (float *h = x + static_cast<size_t>(t0) * q_dim; h < x + static_cast<size_t>(t1) * q_dim; h += hd) {
                kv_rotate(h, hd, n);
                for (int d = 0; d < hd; ++d) h[d] *= 1.0f / static_cast<float>(n); // a power of two: exact
            }
        });
    };
    if (hp.kv_from[layer] == layer) // else an earlier layer wrote the keys and values it attends
        per_token(p, [&](int t0, int t1) { // the tokens' rows are distinct: a batch never holds one position twice
            for (int t = t0; t < t1; ++t)
                for (int h = 0; h < n_kv; ++h) {
                    const size_t at = static_cast<size_t>(t) * kv_dim + static_cast<size_t>(h) * hd;
                    p.batch[t].kv->write(layer, h, p.batch[t].pos, p.ws.k.data() + at, p.ws.v.data() + at);
                }
        });
    if (rot_k > 0) rotate_heads(p.q, rot_k);
    if (p.batch[0].kv->types.k != GGML_F16) // quantized keys meet the queries quantized (attention.h)
        per_token(p, [&](int t0, int t1) {
            kernels().quantize_q8a(p.q + static_cast<size_t>(t0) * q_dim, p.ws.q8.data() + t0 * (q_dim / QK),
                                   static_cast<int64_t>(t1 - t0) * q_dim, QK);
        });
    attention(p.model, p.batch, p.n, layer, p.ws, p.pool);
    if (rot_v > 0) rotate_heads(p.att, rot_v);
}

// ---- the forward pass ------------------------------------------------------

namespace {

// Each token's RoPE angles, once for every block of the pass.
void rope_angles_of(const Pass &p) {
    const Model &model = p.model;
    const HParams &hp = p.hp;
    for (int t = 0; t < p.n; ++t) {
        rope_angles(p.ws.rope.data() + t * hp.rope_dim, model.inv_freq, hp.rope_mscale, p.batch[t].pos);
        if (!model.inv_freq_local.empty())
            rope_angles(p.ws.rope_local.data() + t * hp.rope_dim, model.inv_freq_local, hp.rope_mscale_local,
                        p.batch[t].pos);
    }
}

// The residual stream's rows normed by `norm`: every token's to `states` if given; for
// the tokens with logits set, in batch order, to `hidden`, or else through `head`
// (+ bias) to n_vocab logits each, the final soft-cap and scale applied.
void finish(const Pass &p, const float *norm, const Matrix &head, const float *bias, float *logits, float *hidden,
            float *states) {
    const HParams &hp = p.hp;
    const int dim = hp.n_embd;
    const auto norm_row = [&](float *out, const float *x) {
        if (hp.layer_norm) layernorm(out, x, norm, dim, hp.norm_eps);
        else rmsnorm(out, x, norm, dim, hp.norm_eps);
    };
    if (states != nullptr)
        for (int t = 0; t < p.n; ++t) norm_row(states + t * dim, p.x + t * dim);
    float *normed = hidden != nullptr ? hidden : p.ws.logits_in.data();
    int n_out = 0;
    for (int t = 0; t < p.n; ++t) {
        if (!p.batch[t].logits) continue;
        float *row = normed + static_cast<size_t>(n_out++) * dim;
        if (states != nullptr) std::copy_n(states + t * dim, dim, row);
        else norm_row(row, p.x + t * dim);
    }
    if (n_out == 0 || hidden != nullptr) return;
    const Pass out{p.model, hp, p.batch, n_out, p.ws, p.pool}; // only the rows that want logits
    matmuls(out, p.ws.logits_in.data(), {project(head, logits, bias)});
    if (hp.logit_softcap > 0.0f)
        for (size_t i = 0; i < static_cast<size_t>(n_out) * hp.n_vocab; ++i)
            logits[i] = hp.logit_softcap * std::tanh(logits[i] / hp.logit_softcap);
    if (hp.logit_scale != 1.0f)
        for (size_t i = 0; i < static_cast<size_t>(n_out) * hp.n_vocab; ++i) logits[i] *= 1.0f / hp.logit_scale;
}

} // namespace

void classify(const Classifier &head, const float *state, float *out) {
    const Matrix &w = head.out;
    std::vector<float> row(static_cast<size_t>(w.cols));
    std::vector<double> scores(static_cast<size_t>(w.rows));
    for (int64_t r = 0; r < w.rows; ++r) {
        type_traits(w.type)->to_float(w.row(r), row.data(), w.cols);
        double dot = 0.0;
        for (int64_t d = 0; d < w.cols; ++d) dot += static_cast<double>(row[d]) * state[d];
        scores[r] = dot * w.scale;
    }
    if (head.softmax) {
        const double top = *std::max_element(scores.begin(), scores.end());
        double sum = 0.0;
        for (double &x : scores) sum += x = std::exp(x - top);
        for (double &x : scores) x /= sum;
    }
    std::copy(scores.begin(), scores.end(), out);
}

void forward(const Model &model, const BatchToken *batch, int n, Workspace &ws, ThreadPool &pool,
             float *logits, float *hidden, float *states) {
    const HParams &hp = model.hp;
    const int dim = hp.n_embd;
    ws.reserve(hp, n);
    for (int t = 0; t < n; ++t) batch[t].kv->prepare(batch[t].pos); // every block the pass writes, before it writes
    const Pass pass{model, hp, batch, n, ws, pool};
    // A recurrent state holds positions 0..pos-1: each token must be the next one of
    // its session (in batch order), or its layers would fold it into the wrong state.
    for (int t = 0; t < n; ++t) {
        RecurrentState *rs = batch[t].rs;
        if (rs == nullptr || rs->empty()) continue;
        if (rs->pos != batch[t].pos)
            throw std::logic_error("recurrent state at position " + std::to_string(rs->pos) + " is fed position " +
                                   std::to_string(batch[t].pos));
        rs->pos = batch[t].pos + 1;
    }

    float *x = pass.x;
    for (int t = 0; t < n; ++t) {
        type_traits(model.tok_embd.type)->to_float(model.tok_embd.row(batch[t].token), x + t * dim, dim);
        if (hp.embd_scale != 1.0f)
            for (int i = 0; i < dim; ++i) x[t * dim + i] *= hp.embd_scale;
    }
    rope_angles_of(pass);
    for (int l = 0; l < hp.n_layer; ++l) model.arch->layer(pass, model.layers[l], l);
    finish(pass, model.output_norm, model.output, model.output_b, logits, hidden, states);
}

void forward_nextn(const Model &model, const BatchToken *batch, int n, const float *before, Workspace &ws,
                   ThreadPool &pool, float *logits, float *states) {
    const HParams &hp = model.hp;
    const NextNWeights &N = model.nextn.at(0);
    const int dim = hp.n_embd;
    ws.reserve(hp, n);
    for (int t = 0; t < n; ++t) batch[t].kv->prepare(batch[t].pos);
    const Pass pass{model, hp, batch, n, ws, pool};
    const Matrix &embd = N.embed_tokens.data != nullptr ? N.embed_tokens : model.tok_embd;
    ws.nextn_in.resize(static_cast<size_t>(n) * 2 * dim);
    for (int t = 0; t < n; ++t) {
        float *in = ws.nextn_in.data() + static_cast<size_t>(t) * 2 * dim;
        type_traits(embd.type)->to_float(embd.row(batch[t].token), in, dim);
        rmsnorm(in, in, N.enorm, dim, hp.norm_eps);
        rmsnorm(in + dim, before + static_cast<size_t>(t) * dim, N.hnorm, dim, hp.norm_eps);
    }
    matmuls(pass, ws.nextn_in.data(), {project(N.eh_proj, pass.x)});
    rope_angles_of(pass);
    model.arch->layer(pass, N.block, hp.n_layer);
    const bool own_head = N.head.data != nullptr;
    finish(pass, N.head_norm != nullptr ? N.head_norm : model.output_norm, own_head ? N.head : model.output,
           own_head ? nullptr : model.output_b, logits, nullptr, states);
}

} // namespace llmd
