// kernel_test.cpp — every kernel variant this CPU runs against the scalar references
// (kernels/kernels.h), without Python: built with the engine's sources (native/tests/
// build_kernel_test.py) natively, or for another ISA and run under an emulator
// (.ci/arm64). For each variant: the row dots and panel kernels of every weight type
// on several shapes (partial panels; 1, 7 and 17 tokens), batch invariance (a token's
// bits alone, within any batch and any split of the panels among threads), attention
// (groups 1 to 8, runs, ranges, every KV type; with sinks), the Gated DeltaNet scan
// (and its run invariance), GLU, quantize_q8a (bit for bit), sum_squares and the KV
// cache's writes of every KV type (bit for bit); avx-vnni's panels bit for bit with
// avx512's where both run. On x86 CPUs with AVX-512 VNNI also avx-vnni's sources built
// with its instructions' EVEX form (build_kernel_test.py's AVX_VNNI_TWIN): its table's
// kernels, panels bit for bit with avx512's. Prints each
// check's worst difference; exits non-zero on any breach of tests/test_kernels.py's
// tolerances.
#include "kernels/kernels.h"
#include "llmd.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

using namespace llmd;

namespace {

int g_failures = 0;

// Deterministic pseudo-random numbers (splitmix64).
struct Rng {
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    float uniform() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f; } // [-1, 1)
    float gauss() { // the sum of 4 uniforms, variance 4/3: near enough
        return (uniform() + uniform() + uniform() + uniform()) * 0.866f;
    }
};

void check(bool ok, const char *variant, const char *what, double worst, double limit) {
    std::printf("  %-8s %-44s worst %.3g (limit %.3g)%s\n", variant, what, worst, limit, ok ? "" : "  FAIL");
    if (!ok) ++g_failures;
}

void put_f16(uint8_t *p, float v) {
    const uint16_t h = fp32_to_fp16(v);
    std::memcpy(p, &h, 2);
}

// Random rows of a type: random bytes (every quant and scale bit pattern), with the
// float fields set to finite values of a plausible size.
std::vector<uint8_t> random_rows(uint32_t type, int rows, int64_t cols, Rng &rng) {
    const TypeTraits &t = *type_traits(type);
    std::vector<uint8_t> w(row_bytes(type, cols) * rows);
    if (t.activation == Activation::F32) {
        for (size_t i = 0; i < w.size() / t.block_bytes; ++i) {
            const float v = rng.gauss();
            uint8_t *p = &w[i * t.block_bytes];
            if (type == GGML_F32) std::memcpy(p, &v, 4);
            else if (type == GGML_F16) put_f16(p, v);
            else { // BF16: the top half of the f32
                uint32_t bits;
                std::memcpy(&bits, &v, 4);
                const uint16_t b = static_cast<uint16_t>(bits >> 16);
                std::memcpy(p, &b, 2);
            }
        }
        return w;
    }
    for (uint8_t &b : w) b = static_cast<uint8_t>(rng.next());
    // The f16 fields of each block: d (and m), at these offsets.
    int at[2] = {0, -1};
    switch (type) {
    case GGML_Q4_1: case GGML_Q5_1: case GGML_Q4_K: case GGML_Q5_K: at[1] = 2; break;
    case GGML_Q2_K: at[0] = 80; at[1] = 82; break;
    case GGML_Q3_K: at[0] = 108; break;
    case GGML_Q6_K: at[0] = 208; break;
    case GGML_MXFP4: at[0] = -1; break;
    default: break;
    }
    for (size_t b = 0; b < w.size() / t.block_bytes; ++b) {
        uint8_t *blk = &w[b * t.block_bytes];
        if (type == GGML_MXFP4) { // e8m0 exponents near 2^0, and now and then the subnormal ones
            blk[0] = static_cast<uint8_t>(b % 7 == 3 ? b % 2 : 118 + rng.next() % 16);
            continue;
        }
        for (int f : at)
            if (f >= 0) put_f16(blk + f, 0.01f * rng.uniform());
    }
    return w;
}

// S of tests/test_kernels.py for row r: Σ |w_i x_i| + Σ |min_i x_i| over the row, x as
// the kernels see it (xq's values for integer types).
double row_size(uint32_t type, const uint8_t *row, int64_t cols, const float *x, const BlockQ8A *xq) {
    const TypeTraits &t = *type_traits(type);
    double s = 0.0;
    if (t.activation == Activation::F32) {
        std::vector<float> w(cols);
        t.to_float(row, w.data(), cols);
        for (int64_t i = 0; i < cols; ++i) s += std::fabs(static_cast<double>(w[i]) * x[i]);
        return s;
    }
    Piece p;
    for (int64_t b = 0; b < cols / QK; ++b) {
        t.decode(row, b, &p);
        for (int i = 0; i < QK; ++i) {
            const double xv = static_cast<double>(xq[b].d) * xq[b].qs[i];
            s += std::fabs(static_cast<double>(p.d) * p.scale[i / 16] * p.q[i] * xv) + std::fabs(p.min(i / 16) * xv);
        }
    }
    return s;
}

// y[t * rows + r] by a table's row dots (rows) or its panels over [p0, p1) (packed).
void matmul(const Kernels &k, bool packed, uint32_t type, const uint8_t *w, const std::vector<uint8_t> &panels,
            int rows, int64_t cols, const float *x, const BlockQ8A *xa, int n, float *y, int64_t p0, int64_t p1,
            bool add) {
    if (packed) {
        k.panel[type](panels.data(), rows, cols, p0, p1, xa, n, y, rows, add);
        return;
    }
    const size_t rb = row_bytes(type, cols);
    const int64_t nb = cols / QK;
    for (int t = 0; t < n; ++t)
        for (int r = 0; r < rows; ++r)
            y[t * rows + r] = k.dot[type](w + r * rb, x + t * cols, xa != nullptr ? xa + t * nb : nullptr, cols);
}

// With same_as, k's panels must also give same_as's panels' bits.
void test_matmul(const Kernels &k, uint32_t type, Rng &rng, const Kernels *same_as) {
    const TypeTraits &t = *type_traits(type);
    const bool quantized = t.activation != Activation::F32;
    const bool k_type = t.block_elems == QK_K;
    struct Shape { int rows; int64_t cols; };
    const std::vector<Shape> shapes = t.activation == Activation::F32 ? std::vector<Shape>{{16, 256}, {3, 37}, {40, 64}}
                                      : k_type ? std::vector<Shape>{{16, 256}, {40, 512}, {3, 256}}
                                               : std::vector<Shape>{{16, 256}, {40, 64}, {5, 32}};
    for (const bool packed : {false, true}) {
        if (packed && k.panel[type] == nullptr) continue;
        double worst = 0.0, limit_at_worst = 0.0;
        bool ok = true, invariant = true, same = true;
        for (const Shape &s : shapes) {
            for (const int n : {1, 7, 17}) {
                const std::vector<uint8_t> w = random_rows(type, s.rows, s.cols, rng);
                std::vector<float> x(static_cast<size_t>(n) * s.cols);
                for (float &v : x) v = rng.gauss();
                const int64_t nb = s.cols / QK, panels = (s.rows + kPanel - 1) / kPanel;
                std::vector<BlockQ8A> xq(quantized ? quantized_blocks(n, s.cols) : 0);
                if (quantized) quantize_rows(x.data(), n, s.cols, xq.data());
                const BlockQ8A *xa = quantized ? activations_of(t, xq.data(), n, s.cols) : nullptr;
                std::vector<uint8_t> pk;
                if (packed) {
                    pk.resize(static_cast<size_t>(panels) * panel_bytes(t.panel, nb));
                    pack_rows(type, w.data(), s.rows, s.cols, pk.data());
                }
                std::vector<float> ref(static_cast<size_t>(n) * s.rows), got(ref.size());
                matmul(kernels_scalar(), false, type, w.data(), pk, s.rows, s.cols, x.data(), xa, n, ref.data(), 0, 0,
                       false);
                matmul(k, packed, type, w.data(), pk, s.rows, s.cols, x.data(), xa, n, got.data(), 0, panels, false);
                const double tol = (4.0 * std::max<int64_t>(1, nb) + 16) * std::ldexp(1.0, -24);
                for (int tk = 0; tk < n; ++tk)
                    for (int r = 0; r < s.rows; ++r) {
                        const size_t i = static_cast<size_t>(tk) * s.rows + r;
                        const double size = row_size(type, w.data() + r * row_bytes(type, s.cols), s.cols,
                                                     x.data() + tk * s.cols, xa != nullptr ? xa + tk * nb : nullptr);
                        // As test_kernels.py's worst(): what exceeds 2^-120, relative to S.
                        const double over = std::max(0.0, std::fabs(static_cast<double>(got[i]) - ref[i]) -
                                                              std::ldexp(1.0, -120));
                        const double rel = size > 0 ? over / size : over > 0 ? INFINITY : 0.0;
                        if (!std::isfinite(got[i]) || rel > tol) ok = false;
                        if (rel > worst) worst = rel, limit_at_worst = tol;
                    }
                // Batch invariance: each token alone gives its bits in the batch; the panels
                // split among "threads" at panel 1, and added onto y, likewise.
                for (int tk = 0; tk < n; ++tk) {
                    std::vector<float> alone(s.rows);
                    matmul(k, packed, type, w.data(), pk, s.rows, s.cols, x.data() + tk * s.cols,
                           xa != nullptr ? xa + tk * nb : nullptr, 1, alone.data(), 0, panels, false);
                    if (std::memcmp(alone.data(), &got[static_cast<size_t>(tk) * s.rows], s.rows * sizeof(float)) != 0)
                        invariant = false;
                }
                if (packed) {
                    std::vector<float> split(got.size(), 1.5f), added(got.size());
                    for (size_t i = 0; i < added.size(); ++i) added[i] = 1.5f + got[i];
                    matmul(k, true, type, w.data(), pk, s.rows, s.cols, x.data(), xa, n, split.data(), 0, 1, true);
                    matmul(k, true, type, w.data(), pk, s.rows, s.cols, x.data(), xa, n, split.data(), 1, panels, true);
                    if (split != added) invariant = false;
                    if (same_as != nullptr) {
                        std::vector<float> theirs(got.size());
                        matmul(*same_as, true, type, w.data(), pk, s.rows, s.cols, x.data(), xa, n, theirs.data(), 0,
                               panels, false);
                        if (theirs != got) same = false;
                    }
                }
            }
        }
        char what[64];
        std::snprintf(what, sizeof what, "%s %s (|diff| / S)", t.name, packed ? "panels" : "rows");
        check(ok, k.name, what, worst, limit_at_worst);
        std::snprintf(what, sizeof what, "%s %s batch invariance", t.name, packed ? "panels" : "rows");
        check(invariant, k.name, what, invariant ? 0.0 : 1.0, 0.0);
        if (packed && same_as != nullptr) {
            std::snprintf(what, sizeof what, "%s panels = %s's bits", t.name, same_as->name);
            check(same, k.name, what, same ? 0.0 : 1.0, 0.0);
        }
    }
}

void test_attention(const char *variant, Rng &rng) {
    // Keys and values of every KV type, alone and mixed (llama.cpp's -ctk / -ctv).
    const char *pairs[][2] = {{"f16", "f16"}, {"q8_0", "q8_0"}, {"q4_0", "q4_0"}, {"q8_0", "f16"}, {"f16", "q4_0"}};
    for (const auto &[kt, vt] : pairs) {
        const bool f16 = std::strcmp(kt, "f16") == 0 && std::strcmp(vt, "f16") == 0;
        double worst = 0.0;
        for (const int hd : {64, 32, 40}) { // 40: the reference's path (f16 only: quantized rows take 32s)
            if (hd == 40 && !f16) continue;
            for (int group = 1; group <= 8; ++group)
                for (const int n_pos : {1, 63, 65, 200}) {
                    const float spread = group == 8 ? 8.0f : 1.0f; // nearly one-hot softmax
                    std::vector<float> q(static_cast<size_t>(group) * hd);
                    for (float &v : q) v = spread * rng.gauss();
                    std::vector<float> k(static_cast<size_t>(n_pos) * hd), v(k.size());
                    for (float &x : k) x = rng.gauss();
                    for (float &x : v) x = rng.gauss();
                    const auto attend = [&](const float *qs, int n_q, int ranges, int run, float *out, const char *on) {
                        return llmd_kernel_attention(qs, n_q, k.data(), v.data(), n_pos, hd, kt, vt, ranges, run, nullptr,
                                                     0.0f, out, on);
                    };
                    std::vector<float> ref(q.size()), got(q.size()), again(q.size());
                    for (const int ranges : {1, std::min(3, n_pos)})
                        for (const int run : {0, 16, 64}) {
                            attend(q.data(), group, ranges, run, ref.data(), nullptr);
                            if (attend(q.data(), group, ranges, run, got.data(), variant) != LLMD_OK) {
                                check(false, variant, "attention call", 1.0, 0.0);
                                return;
                            }
                            for (size_t i = 0; i < got.size(); ++i)
                                worst = std::max(worst, std::isfinite(got[i]) ? std::fabs(static_cast<double>(got[i]) - ref[i])
                                                                              : INFINITY);
                            // Runs of whole 64-position blocks read as one buffer: the same bits (one
                            // range here: others may start inside a run, which then is not whole).
                            if (run == 64 && ranges == 1) {
                                attend(q.data(), group, ranges, 0, again.data(), variant);
                                if (again != got) check(false, variant, "attention runs of 64 = one buffer", 1.0, 0.0);
                            }
                        }
                    // Each head's bits whatever shares its call.
                    for (int g = 0; g < group; ++g) {
                        std::vector<float> one(hd);
                        attend(q.data() + g * hd, 1, 1, 0, one.data(), variant);
                        attend(q.data(), group, 1, 0, got.data(), variant);
                        if (std::memcmp(one.data(), got.data() + g * hd, hd * sizeof(float)) != 0)
                            check(false, variant, "attention head alone = in its group", 1.0, 0.0);
                    }
                }
        }
        const std::string what = std::string("attention ") + kt + "/" + vt + " (|diff|, outputs ~1)";
        check(worst < 4e-5, variant, what.c_str(), worst, 4e-5);
    }
}

// Attention with a sink logit per query head (gpt-oss), folded after the ranges, and
// attention whose scores are soft-capped (Gemma 2): the variant against the reference,
// and both (f16 keys and values) against softmax attention computed directly in double
// over the f16 rows, the sink's exp in the denominator, each score capped. Sinks below,
// near and far above the scores, so that the sink is nothing, a share, or nearly all of
// the denominator; caps over scores of about ±2: 5 bends the larger ones, 50 barely any.
void test_attention_sinks_and_caps(const char *variant, Rng &rng) {
    const char *pairs[][2] = {{"f16", "f16"}, {"q8_0", "q4_0"}};
    for (const float softcap : {0.0f, 5.0f, 50.0f}) {
        double worst = 0.0, worst_model = 0.0;
        for (const auto &[kt, vt] : pairs)
            for (const int group : {1, 3, 8})
                for (const int n_pos : {1, 65, 200}) {
                    const int hd = 64;
                    std::vector<float> q(static_cast<size_t>(group) * hd), k(static_cast<size_t>(n_pos) * hd),
                        v(k.size());
                    for (float &x : q) x = 2.0f * rng.gauss();
                    for (float &x : k) x = rng.gauss();
                    for (float &x : v) x = rng.gauss();
                    std::vector<float> sinks(group);
                    for (int g = 0; g < group; ++g)
                        sinks[g] = g % 3 == 0 ? -20.0f : g % 3 == 1 ? 3.0f * rng.gauss() : 30.0f;
                    const float *sink = softcap > 0.0f ? nullptr : sinks.data(); // a cap, or sinks
                    std::vector<float> ref(q.size()), got(q.size());
                    for (const int ranges : {1, std::min(3, n_pos)}) {
                        llmd_kernel_attention(q.data(), group, k.data(), v.data(), n_pos, hd, kt, vt, ranges, 0, sink,
                                              softcap, ref.data(), nullptr);
                        if (llmd_kernel_attention(q.data(), group, k.data(), v.data(), n_pos, hd, kt, vt, ranges, 0,
                                                  sink, softcap, got.data(), variant) != LLMD_OK) {
                            check(false, variant, "attention with sinks or a cap: call", 1.0, 0.0);
                            return;
                        }
                        for (size_t i = 0; i < got.size(); ++i) {
                            const double diff = std::fabs(static_cast<double>(got[i]) - ref[i]);
                            worst = std::max(worst, std::isfinite(got[i]) ? diff : INFINITY);
                        }
                        if (std::strcmp(kt, "f16") != 0) continue;
                        const auto f16 = [](float x) { return static_cast<double>(fp16_to_fp32(fp32_to_fp16(x))); };
                        for (int g = 0; g < group; ++g) {
                            std::vector<double> score(n_pos);
                            double mx = sink != nullptr ? sink[g] : -INFINITY;
                            for (int p = 0; p < n_pos; ++p) {
                                double s = 0.0;
                                for (int d = 0; d < hd; ++d)
                                    s += static_cast<double>(q[g * hd + d]) * f16(k[p * hd + d]);
                                s /= std::sqrt(static_cast<double>(hd));
                                if (softcap > 0.0f) s = softcap * std::tanh(s / softcap);
                                mx = std::max(mx, score[p] = s);
                            }
                            double sum = sink != nullptr ? std::exp(sink[g] - mx) : 0.0;
                            for (int p = 0; p < n_pos; ++p) sum += std::exp(score[p] - mx);
                            for (int d = 0; d < hd; ++d) {
                                double y = 0.0;
                                for (int p = 0; p < n_pos; ++p) y += std::exp(score[p] - mx) * f16(v[p * hd + d]);
                                for (const float *out : {ref.data(), got.data()})
                                    worst_model = std::max(worst_model, std::fabs(out[g * hd + d] - y / sum));
                            }
                        }
                    }
                }
        const std::string what = softcap > 0.0f ? "attention cap " + std::to_string(static_cast<int>(softcap))
                                                : std::string("attention with sinks");
        check(worst < 4e-5, variant, (what + " (|diff|, outputs <= ~1)").c_str(), worst, 4e-5);
        check(worst_model < 4e-5, variant, (what + " = the softmax model").c_str(), worst_model, 4e-5);
    }
}

// n tokens through a head by a variant against the reference, and the variant's run of
// n tokens against the same tokens one call each (bit for bit: a token's result does
// not depend on the run it is in).
void test_delta_scan(const char *variant, Rng &rng) {
    double worst = 0.0;
    bool invariant = true;
    for (const int hd : {64, 128, 37}) {
        const int n = 5;
        const size_t per = static_cast<size_t>(n) * hd;
        std::vector<float> m(static_cast<size_t>(hd) * hd), q(per), k(per), v(per), decay(n), beta(n);
        for (float &x : m) x = 0.2f * rng.gauss();
        for (float &x : q) x = rng.gauss();
        for (float &x : k) x = rng.gauss() / std::sqrt(static_cast<float>(hd));
        for (float &x : v) x = rng.gauss();
        for (int t = 0; t < n; ++t) decay[t] = 0.8f + 0.04f * t, beta[t] = 0.5f - 0.05f * t;
        std::vector<float> m_ref = m, m_one = m, out_ref(per), out(per), out_one(per);
        llmd_kernel_delta_scan(m_ref.data(), q.data(), k.data(), v.data(), decay.data(), beta.data(), n, hd,
                               out_ref.data(), nullptr);
        llmd_kernel_delta_scan(m.data(), q.data(), k.data(), v.data(), decay.data(), beta.data(), n, hd, out.data(),
                               variant);
        for (int t = 0; t < n; ++t) {
            const size_t at = static_cast<size_t>(t) * hd;
            llmd_kernel_delta_scan(m_one.data(), q.data() + at, k.data() + at, v.data() + at, decay.data() + t,
                                   beta.data() + t, 1, hd, out_one.data() + at, variant);
        }
        for (size_t i = 0; i < per; ++i) worst = std::max(worst, static_cast<double>(std::fabs(out[i] - out_ref[i])));
        for (size_t i = 0; i < m.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(m[i] - m_ref[i])));
        if (m != m_one || out != out_one) invariant = false;
    }
    check(worst < 1e-5, variant, "delta_scan (|diff|, values ~1)", worst, 1e-5);
    check(invariant, variant, "delta_scan run invariance", invariant ? 0.0 : 1.0, 0.0);
}

// n tokens through a Mamba-2 head by a variant against the reference, and the
// variant's run of n tokens against the same tokens one call each (bit for bit).
void test_ssm_scan(const char *variant, Rng &rng) {
    double worst = 0.0;
    bool invariant = true;
    for (const auto &[hd, ds] : {std::pair{64, 128}, std::pair{32, 16}, std::pair{24, 37}}) {
        const int n = 5;
        const size_t xs = static_cast<size_t>(n) * hd, bs = static_cast<size_t>(n) * ds;
        std::vector<float> s(static_cast<size_t>(hd) * ds), x(xs), b(bs), c(bs), dt(n), decay(n);
        for (float &v : s) v = 0.2f * rng.gauss();
        for (float &v : x) v = rng.gauss();
        for (float &v : b) v = rng.gauss();
        for (float &v : c) v = rng.gauss() / std::sqrt(static_cast<float>(ds));
        for (int t = 0; t < n; ++t) dt[t] = 0.1f + 0.2f * t, decay[t] = std::exp(-dt[t]);
        std::vector<float> s_ref = s, s_one = s, y_ref(xs), y(xs), y_one(xs);
        llmd_kernel_ssm_scan(s_ref.data(), x.data(), b.data(), c.data(), dt.data(), decay.data(), n, hd, ds,
                             y_ref.data(), nullptr);
        llmd_kernel_ssm_scan(s.data(), x.data(), b.data(), c.data(), dt.data(), decay.data(), n, hd, ds, y.data(),
                             variant);
        for (int t = 0; t < n; ++t)
            llmd_kernel_ssm_scan(s_one.data(), x.data() + t * hd, b.data() + t * ds, c.data() + t * ds, dt.data() + t,
                                 decay.data() + t, 1, hd, ds, y_one.data() + t * hd, variant);
        for (size_t i = 0; i < xs; ++i) worst = std::max(worst, static_cast<double>(std::fabs(y[i] - y_ref[i])));
        for (size_t i = 0; i < s.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(s[i] - s_ref[i])));
        if (s != s_one || y != y_one) invariant = false;
    }
    check(worst < 1e-5, variant, "ssm_scan (|diff|, values ~1)", worst, 1e-5);
    check(invariant, variant, "ssm_scan run invariance", invariant ? 0.0 : 1.0, 0.0);
}

// With up, and without (act alone, as if up were all ones).
void test_glu(const Kernels &k, Rng &rng) {
    for (const bool gelu : {false, true})
        for (const bool with_up : {true, false}) {
            std::vector<float> gate = {-30.0f, -12.0f, -5.0f, -1e-3f, 0.0f, 1e-3f, 5.0f, 12.0f, 30.0f};
            while (gate.size() < 45) gate.push_back(3.0f * rng.gauss());
            std::vector<float> up(gate.size(), 1.0f);
            if (with_up)
                for (float &u : up) u = rng.gauss();
            const float *u = with_up ? up.data() : nullptr;
            std::vector<float> ref = gate, got = gate;
            glu_ref(gelu, ref.data(), u, static_cast<int64_t>(gate.size()));
            k.glu(gelu, got.data(), u, static_cast<int64_t>(gate.size()));
            double worst = 0.0;
            for (size_t i = 0; i < gate.size(); ++i)
                worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - ref[i]) /
                                            std::max(std::fabs(static_cast<double>(gate[i]) * up[i]), 1e-30));
            char what[64];
            std::snprintf(what, sizeof what, "glu %s%s (|diff| / |gate up|)", gelu ? "gelu" : "silu",
                          with_up ? "" : " alone");
            check(worst < 4e-7, k.name, what, worst, 4e-7);
        }
}

void test_vector_ops(const Kernels &k, Rng &rng) {
    // quantize_q8a: blocks of 32 and groups of 256, with ties to round (x / d = k + 0.5).
    std::vector<float> x(1024);
    for (float &v : x) v = rng.gauss();
    x[288] = 127.0f; // block 9 and its group of 256: d = 1, and ties to round
    for (int i = 0; i < 16; ++i) x[289 + i] = static_cast<float>(i - 8) + 0.5f;
    bool same = true;
    for (const int64_t group : {int64_t{QK}, int64_t{QK_K}}) {
        std::vector<BlockQ8A> ref(x.size() / QK), got(ref.size());
        quantize_q8a_ref(x.data(), ref.data(), static_cast<int64_t>(x.size()), group);
        k.quantize_q8a(x.data(), got.data(), static_cast<int64_t>(x.size()), group);
        same = same && std::memcmp(ref.data(), got.data(), ref.size() * sizeof(BlockQ8A)) == 0;
    }
    check(same, k.name, "quantize_q8a bits", same ? 0.0 : 1.0, 0.0);

    double worst = 0.0;
    for (const int n : {1, 7, 64, 1001}) {
        const double ref = sum_squares_ref(x.data(), n), got = k.sum_squares(x.data(), n);
        worst = std::max(worst, std::fabs(got - ref) / ref);
    }
    check(worst < 1e-12, k.name, "sum_squares (relative)", worst, 1e-12);

    std::vector<float> f(1003);
    for (size_t i = 0; i < f.size(); ++i) f[i] = rng.gauss() * std::ldexp(1.0f, static_cast<int>(i % 40) - 28);
    f[1] = 65520.0f; // rounds to infinity
    f[2] = 1.0f + std::ldexp(1.0f, -11); // a tie: to even
    // The quantized rows take whole blocks; ties of magnitude (Q4_0 takes the first),
    // an all-zero block and values whose quotient is near a half.
    const int blocks = static_cast<int>(f.size()) / QK * QK;
    f[40] = -3.0f;
    f[45] = 3.0f;
    std::fill(f.begin() + 64, f.begin() + 96, 0.0f);
    for (int i = 96; i < 128; ++i) f[i] = (i % 2 == 0 ? 0.5f : -1.5f) * (1.0f + std::ldexp(1.0f, -20) * (i % 5));
    for (const uint32_t type : {GGML_F16, GGML_Q8_0, GGML_Q4_0}) {
        const int n = type == GGML_F16 ? static_cast<int>(f.size()) : blocks;
        std::vector<uint8_t> ref(kv_row_bytes(type, n)), got(ref.size());
        kv_row_ref(type, f.data(), ref.data(), n);
        k.kv_row(type, f.data(), got.data(), n);
        const std::string what = std::string("kv_row ") + type_name(type) + " bits";
        check(ref == got, k.name, what.c_str(), ref == got ? 0.0 : 1.0, 0.0);
    }
}

// A table's kernels that take the table itself (not a variant's name through the ABI);
// with same_as, its panels must give same_as's bits.
void test_table(const Kernels &k, Rng &rng, const Kernels *same_as = nullptr) {
    const uint32_t types[] = {GGML_F32,  GGML_F16,    GGML_BF16,  GGML_Q4_0, GGML_Q4_1, GGML_Q5_0,
                              GGML_Q5_1, GGML_Q8_0,   GGML_IQ4_NL, GGML_MXFP4, GGML_Q2_K, GGML_Q3_K,
                              GGML_Q4_K, GGML_Q5_K,   GGML_Q6_K,  GGML_IQ4_XS};
    for (const uint32_t type : types) {
        if (k.dot[type] == nullptr) {
            check(false, k.name, type_name(type), 1.0, 0.0);
            continue;
        }
        test_matmul(k, type, rng, same_as);
    }
    test_glu(k, rng);
    test_vector_ops(k, rng);
}

} // namespace

#if defined(__x86_64__)
namespace llmd {
const Kernels &kernels_avx_vnni_evex(); // build_kernel_test.py's AVX_VNNI_TWIN
}
#endif

int main() {
    int ran = 0;
    // avx-vnni's panels are the avx512 panels' arithmetic 8 rows at a time (panels_avx2.h's
    // tile_vnni): where both run, avx-vnni must give avx512's bits.
    std::string lacks;
    const Kernels *avx512 = kernels_named("avx512", lacks);
    for (int i = 0; i < kernel_variant_count(); ++i) {
        const KernelVariant &v = kernel_variant(i);
        std::printf("%s: %s\n", v.name, v.cpu_runs() ? "runs" : "not run (this CPU lacks its instructions)");
        if (!v.cpu_runs()) continue;
        ++ran;
        const Kernels &k = v.table();
        Rng rng{1234};
        test_table(k, rng, std::strcmp(v.name, "avx-vnni") == 0 ? avx512 : nullptr);
        test_attention(k.name, rng);
        test_attention_sinks_and_caps(k.name, rng);
        test_delta_scan(k.name, rng);
        test_ssm_scan(k.name, rng);
    }
#if defined(__x86_64__)
    // avx-vnni's sources with the EVEX form of its instructions, where AVX-512 VNNI is (on a
    // CPU without AVX-VNNI, the only run its code gets).
    std::printf("avx-vnni as EVEX: %s\n", avx512 != nullptr ? "runs" : "not run (this CPU lacks AVX-512 VNNI)");
    if (avx512 != nullptr) {
        Rng rng{1234};
        test_table(kernels_avx_vnni_evex(), rng, avx512);
    }
#endif
    std::printf("the engine runs: %s\n", kernels().name);
    std::printf("%d variants run, %d failures\n", ran, g_failures);
    return g_failures == 0 ? 0 : 1;
}
