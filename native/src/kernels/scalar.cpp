// scalar.cpp — the scalar variant: the references every other variant is tested
// against, and what runs on a CPU without any of the variants' instructions.
#include "kernels/kernels.h"
#include "quants/quantize.h"

#include <cmath>

namespace llmd {

namespace {
constexpr float kGeluK = 0.7978845608028654f; // √(2/π)
constexpr float kGeluC = 0.044715f;
} // namespace

void glu_ref(bool gelu, float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const float g = gate[i];
        const float act = gelu ? 0.5f * g * (1.0f + std::tanh(kGeluK * g * (1.0f + kGeluC * g * g)))
                               : g / (1.0f + std::exp(-g));
        gate[i] = up != nullptr ? act * up[i] : act;
    }
}

double sum_squares_ref(const float *x, int n) {
    double ss = 0.0;
    for (int i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
    return ss;
}

void to_f16_ref(const float *x, uint16_t *y, int n) {
    for (int i = 0; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

void kv_row_ref(uint32_t type, const float *x, uint8_t *y, int n) {
    if (type == GGML_Q8_0) return quantize_row_q8_0(x, y, n);
    if (type == GGML_Q4_0) return quantize_row_q4_0_kv(x, y, n);
    to_f16_ref(x, reinterpret_cast<uint16_t *>(y), n); // F16 rows lie at even addresses
}

const Kernels &kernels_scalar() {
    static const Kernels k = [] {
        Kernels s{};
        s.name = "scalar";
        for (uint32_t t = 0; t < kTypeCount; ++t)
            if (const TypeTraits *traits = type_traits(t); traits != nullptr && traits->activation != Activation::None)
                s.dot[t] = traits->dot_ref;
        s.quantize_q8a = quantize_q8a_ref;
        s.attend_range = attend_range_ref;
        s.attend_fold = attend_fold_ref;
        s.delta_scan = delta_scan_ref;
        s.ssm_scan = ssm_scan_ref;
        s.glu = glu_ref;
        s.sum_squares = sum_squares_ref;
        s.kv_row = kv_row_ref;
        return s;
    }();
    return k;
}

} // namespace llmd
