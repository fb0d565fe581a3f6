// attention.cpp — see attention.h.
#include "ops/attention.h"

#include "kernels/fold.h"
#include "kernels/kernels.h"
#include "quants/quants.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace llmd {

void attend_range_ref(const float *q, int n_q, const AttnRun *runs, int n_runs, int hd, float scale, float *out,
                      AttnPartial *part) {
    for (int g = 0; g < n_q; ++g) {
        const float *qg = q + g * hd;
        std::vector<double> scores;
        double mx = -INFINITY;
        for (int r = 0; r < n_runs; ++r)
            for (int p = 0; p < runs[r].n_pos; ++p) {
                double s = 0.0;
                for (int d = 0; d < hd; ++d) s += static_cast<double>(qg[d]) * fp16_to_fp32(runs[r].k[key_at(p, d, hd)]);
                scores.push_back(s * scale);
                mx = std::max(mx, scores.back());
            }
        double sum = 0.0;
        std::vector<double> acc(static_cast<size_t>(hd), 0.0);
        size_t i = 0;
        for (int r = 0; r < n_runs; ++r)
            for (int p = 0; p < runs[r].n_pos; ++p) {
                const double e = std::exp(scores[i++] - mx);
                sum += e;
                for (int d = 0; d < hd; ++d) acc[d] += e * fp16_to_fp32(runs[r].v[static_cast<size_t>(p) * hd + d]);
            }
        for (int d = 0; d < hd; ++d) out[g * hd + d] = static_cast<float>(acc[d]);
        part[g] = {static_cast<float>(mx), static_cast<float>(sum)};
    }
}

void attend_range(const float *q, int n_q, const AttnRun *runs, int n_runs, int hd, float scale, float *out,
                  AttnPartial *part) {
    kernels().attend_range(q, n_q, runs, n_runs, hd, scale, out, part);
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

void attend_finish(float *y, const AttnPartial *acc, int n_q, int hd) {
    for (int g = 0; g < n_q; ++g) {
        const float inv = acc[g].sum > 0.0f ? 1.0f / acc[g].sum : 0.0f;
        for (int d = 0; d < hd; ++d) y[static_cast<size_t>(g) * hd + d] *= inv;
    }
}

} // namespace llmd
