// attention.cpp — see attention.h.
#include "ops/attention.h"

#include "kernels/fold.h"
#include "kernels/kernels.h"
#include "quants/quants.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace llmd {

bool kv_type_from_name(const char *name, uint32_t *type) {
    for (const uint32_t t : {GGML_F16, GGML_Q8_0, GGML_Q4_0})
        if (std::strcmp(name, kv_type_name(t)) == 0) {
            *type = t;
            return true;
        }
    return false;
}

const char *kv_type_name(uint32_t type) {
    return type == GGML_Q8_0 ? "q8_0" : type == GGML_Q4_0 ? "q4_0" : "f16";
}

bool kv_type_fits(uint32_t t, int hd, const char **why) {
    if (t == GGML_F16 || hd % QK == 0) return true;
    *why = "a quantized KV type needs a head dimension that is a multiple of 32";
    return false;
}

int kv_rotation(uint32_t t, int hd, bool keys) {
    if (t == GGML_F16) return 0;
    if (!keys) return hd % 64 == 0 ? 64 : QK;
    int n = QK;
    while (hd % (2 * n) == 0) n *= 2;
    return n;
}

void kv_rotate(float *x, int hd, int n) {
    for (float *b = x; b < x + hd; b += n)
        for (int len = 1; len < n; len *= 2) // the fast Walsh-Hadamard transform's butterflies
            for (int i = 0; i < n; i += 2 * len)
                for (int j = i; j < i + len; ++j) {
                    const float a = b[j], c = b[j + len];
                    b[j] = a + c;
                    b[j + len] = a - c;
                }
}

// Where a quantized key group (attention.h) keeps byte j of position i's block quants:
// after the 16 f16 scales, in groups of 4 bytes a position.
static size_t key_quant_at(size_t j, int i) {
    return 2 * kKeyBlock + j / 4 * (4 * kKeyBlock) + static_cast<size_t>(i) * 4 + j % 4;
}

void key_store(uint32_t t, const uint8_t *row, uint8_t *kb, int i, int hd) {
    if (t == GGML_F16) {
        for (int d = 0; d < hd; ++d) std::memcpy(kb + (static_cast<size_t>(d) * kKeyBlock + i) * 2, row + 2 * d, 2);
        return;
    }
    const size_t block = kv_row_bytes(t, QK), quants = block - 2;
    for (int c = 0; c < hd / QK; ++c, row += block) {
        uint8_t *g = kb + c * kKeyBlock * block;
        std::memcpy(g + 2 * i, row, 2);
        for (size_t j = 0; j < quants; ++j) g[key_quant_at(j, i)] = row[2 + j];
    }
}

void key_load(uint32_t t, const uint8_t *kb, int i, int hd, uint8_t *row) {
    if (t == GGML_F16) {
        for (int d = 0; d < hd; ++d) std::memcpy(row + 2 * d, kb + (static_cast<size_t>(d) * kKeyBlock + i) * 2, 2);
        return;
    }
    const size_t block = kv_row_bytes(t, QK), quants = block - 2;
    for (int c = 0; c < hd / QK; ++c, row += block) {
        const uint8_t *g = kb + c * kKeyBlock * block;
        std::memcpy(row, g + 2 * i, 2);
        for (size_t j = 0; j < quants; ++j) row[2 + j] = g[key_quant_at(j, i)];
    }
}

void attend_range_ref(const float *q, const BlockQ8A *q8, int n_q, const AttnRun *runs, int n_runs, int hd,
                      KVTypes types, AttnScale score, float *out, AttnPartial *part, bool /*cold*/) {
    // Every position's key and value as floats, decoded from its row.
    const size_t k_row = kv_row_bytes(types.k, hd), v_row = kv_row_bytes(types.v, hd);
    std::vector<float> keys, values;
    std::vector<uint8_t> row(k_row);
    for (int r = 0; r < n_runs; ++r)
        for (int p = 0; p < runs[r].n_pos; ++p) {
            key_load(types.k, key_block(runs[r].k, types.k, p, hd), p % kKeyBlock, hd, row.data());
            keys.resize(keys.size() + hd);
            type_traits(types.k)->to_float(row.data(), keys.data() + keys.size() - hd, hd);
            values.resize(values.size() + hd);
            type_traits(types.v)->to_float(runs[r].v + p * v_row, values.data() + values.size() - hd, hd);
        }
    const size_t n_pos = keys.size() / static_cast<size_t>(hd);
    std::vector<double> query(q, q + static_cast<size_t>(n_q) * hd); // quantized keys meet q8's values
    if (types.k != GGML_F16)
        for (size_t i = 0; i < query.size(); ++i) query[i] = static_cast<double>(q8[i / QK].d) * q8[i / QK].qs[i % QK];
    for (int g = 0; g < n_q; ++g) {
        const double *qg = query.data() + static_cast<size_t>(g) * hd;
        std::vector<double> scores(n_pos);
        double mx = -INFINITY;
        for (size_t p = 0; p < n_pos; ++p) {
            double s = 0.0;
            for (int d = 0; d < hd; ++d) s += qg[d] * keys[p * hd + d];
            scores[p] = attn_score(s, score);
            mx = std::max(mx, scores[p]);
        }
        double sum = 0.0;
        std::vector<double> acc(static_cast<size_t>(hd), 0.0);
        for (size_t p = 0; p < n_pos; ++p) {
            const double e = std::exp(scores[p] - mx);
            sum += e;
            for (int d = 0; d < hd; ++d) acc[d] += e * values[p * hd + d];
        }
        for (int d = 0; d < hd; ++d) out[g * hd + d] = static_cast<float>(acc[d]);
        part[g] = {static_cast<float>(mx), static_cast<float>(sum)};
    }
}

void attend_range(const float *q, const BlockQ8A *q8, int n_q, const AttnRun *runs, int n_runs, int hd, KVTypes types,
                  AttnScale score, float *out, AttnPartial *part, bool cold) {
    kernels().attend_range(q, q8, n_q, runs, n_runs, hd, types, score, out, part, cold);
}

int attn_task_spans(int pairs, int ranges, int threads) {
    if (pairs >= 4 * threads) return 1;
    int spans = (4 * threads + pairs - 1) / pairs;
    while (pairs * spans % threads != 0) ++spans;
    return std::clamp(spans, 1, std::max(1, ranges));
}

void attend_start(float *y, AttnPartial *acc, int n_q, int hd) {
    std::fill(y, y + static_cast<size_t>(n_q) * hd, 0.0f);
    std::fill(acc, acc + n_q, AttnPartial{-INFINITY, 0.0f});
}

void attend_fold_ref(float *y, AttnPartial *acc, const float *out, const AttnPartial *part, int n_q, int hd) {
    fold_partial(y, acc, out, part, n_q, hd);
}

void attend_fold(float *y, AttnPartial *acc, const float *out, const AttnPartial *part, int n_q, int hd) {
    kernels().attend_fold(y, acc, out, part, n_q, hd);
}

void attend_sink(float *y, AttnPartial *acc, const float *sinks, int n_q, int hd) {
    for (int g = 0; g < n_q; ++g) {
        const float m0 = acc[g].max, m1 = sinks[g], mx = std::max(m0, m1);
        const float e = std::exp(std::min(m0, m1) - mx), a = m0 < m1 ? e : 1.0f, b = m0 < m1 ? 1.0f : e;
        if (a != 1.0f)
            for (int d = 0; d < hd; ++d) y[static_cast<size_t>(g) * hd + d] *= a;
        acc[g] = {mx, std::fma(acc[g].sum, a, b)};
    }
}

void attend_finish(float *y, const AttnPartial *acc, int n_q, int hd) {
    for (int g = 0; g < n_q; ++g) {
        const float inv = acc[g].sum > 0.0f ? 1.0f / acc[g].sum : 0.0f;
        for (int d = 0; d < hd; ++d) y[static_cast<size_t>(g) * hd + d] *= inv;
    }
}

} // namespace llmd
