// kernels.cpp — the C ABI of llmd.h for tensor types and single kernels: a type's
// facts, dequantizing and quantizing rows, the kernel variants this build has, and
// each kernel of a named variant run alone (the tests' way to check every variant
// against the scalar references).
#include "abi/handles.h"

#include "kernels/kernels.h"
#include "ops/attention.h"
#include "quants/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

using namespace llmd;
using namespace llmd::abi;

namespace {

// The table a kernel entry point runs: the named variant, or the scalar references
// for NULL. nullptr (the failure recorded) when the CPU cannot run the variant.
const Kernels *kernels_for_test(const char *name) {
    if (name == nullptr) return &kernels_scalar();
    std::string why;
    const Kernels *k = kernels_named(name, why);
    if (k == nullptr) fail(LLMD_ERR_UNSUPPORTED, why);
    return k;
}

// A KV type by name for a test entry point; false (the failure recorded) for another.
bool kv_type_for_test(const char *name, int32_t n, uint32_t *type) {
    if (name == nullptr || !kv_type_from_name(name, type)) {
        fail(LLMD_ERR_INVALID_ARGUMENT, std::string("unknown KV type (allowed: ") + kKVTypeNames + ")");
        return false;
    }
    if (const char *why = nullptr; !kv_type_fits(*type, n, &why)) {
        fail(LLMD_ERR_INVALID_ARGUMENT, why);
        return false;
    }
    return true;
}

} // namespace

extern "C" {

llmd_status llmd_tensor_type(int32_t type, llmd_tensor_type_info *out) {
    return guarded([&]() -> llmd_status {
        const TypeTraits *traits = type >= 0 ? type_traits(static_cast<uint32_t>(type)) : nullptr;
        if (traits == nullptr || out == nullptr)
            return fail(LLMD_ERR_INVALID_ARGUMENT, "unknown tensor type " + std::to_string(type));
        *out = {traits->name, traits->block_elems, traits->block_bytes, traits->activation != Activation::None};
        return LLMD_OK;
    });
}

llmd_status llmd_kernel_dequantize(int32_t type, const void *data, int64_t n, float *out) {
    return guarded([&]() -> llmd_status {
        const TypeTraits *traits = type >= 0 ? type_traits(static_cast<uint32_t>(type)) : nullptr;
        if (traits == nullptr || traits->activation == Activation::None)
            return fail(LLMD_ERR_UNSUPPORTED, "unsupported tensor type " +
                                                  (traits != nullptr ? std::string(traits->name) : std::to_string(type)));
        if (data == nullptr || out == nullptr || !type_runs(type, n)) return fail(LLMD_ERR_INVALID_ARGUMENT, "bad dequantize arguments");
        traits->to_float(static_cast<const uint8_t *>(data), out, n);
        return LLMD_OK;
    });
}

llmd_status llmd_quantize_rows(int32_t src_type, const void *src, int64_t rows, int64_t cols, int32_t dst_type,
                               void *dst, int32_t n_threads) {
    return guarded([&]() -> llmd_status {
        const TypeTraits *from = src_type >= 0 ? type_traits(static_cast<uint32_t>(src_type)) : nullptr;
        const TypeTraits *to = dst_type >= 0 ? type_traits(static_cast<uint32_t>(dst_type)) : nullptr;
        if (from == nullptr || from->to_float == nullptr)
            return fail(LLMD_ERR_UNSUPPORTED, "cannot read tensors of type " +
                                                  (from != nullptr ? std::string(from->name) : std::to_string(src_type)));
        if (to == nullptr || to->from_float == nullptr)
            return fail(LLMD_ERR_UNSUPPORTED, "cannot quantize to type " +
                                                  (to != nullptr ? std::string(to->name) : std::to_string(dst_type)));
        if ((rows > 0 && (src == nullptr || dst == nullptr)) || n_threads < 0)
            return fail(LLMD_ERR_INVALID_ARGUMENT, "bad quantize arguments");
        if (const llmd_status st = check_threads(n_threads); st != LLMD_OK) return st;
        ThreadPool pool(pool_threads(n_threads));
        const std::string err = convert_rows(static_cast<uint32_t>(src_type), static_cast<const uint8_t *>(src), rows,
                                             cols, static_cast<uint32_t>(dst_type), static_cast<uint8_t *>(dst), pool);
        return err.empty() ? LLMD_OK : fail(LLMD_ERR_INVALID_ARGUMENT, err);
    });
}

int32_t llmd_kernel_variant_count(void) { return kernel_variant_count(); }

llmd_status llmd_kernel_variant(int32_t i, const char **name, int32_t *runs) {
    return guarded([&]() -> llmd_status {
        if (i < 0 || i >= kernel_variant_count() || name == nullptr || runs == nullptr)
            return fail(LLMD_ERR_INVALID_ARGUMENT, "no kernel variant " + std::to_string(i));
        *name = kernel_variant(i).name;
        *runs = kernel_variant(i).cpu_runs() ? 1 : 0;
        return LLMD_OK;
    });
}

llmd_status llmd_kernel_matmul(int32_t type, const void *weights, int32_t rows, int32_t cols, const float *x,
                               int32_t n, float *y, const char *kernels, int32_t packed) {
    return guarded([&]() -> llmd_status {
        const TypeTraits *traits = type >= 0 ? type_traits(static_cast<uint32_t>(type)) : nullptr;
        if (traits == nullptr || traits->activation == Activation::None)
            return fail(LLMD_ERR_UNSUPPORTED, "unsupported tensor type " +
                                                  (traits != nullptr ? std::string(traits->name) : std::to_string(type)));
        if (weights == nullptr || x == nullptr || y == nullptr || rows < 1 || n < 1 || !type_runs(type, cols))
            return fail(LLMD_ERR_INVALID_ARGUMENT, "bad matrix arguments");
        const Kernels *k = kernels_for_test(kernels);
        if (k == nullptr) return LLMD_ERR_UNSUPPORTED;
        const bool quantized = traits->activation != Activation::F32;
        const int64_t nb = cols / QK;
        std::vector<BlockQ8A> xq(quantized ? quantized_blocks(n, cols) : 0);
        if (quantized) quantize_rows(x, n, cols, xq.data());
        const BlockQ8A *xa = quantized ? activations_of(*traits, xq.data(), n, cols) : nullptr;
        const PanelFn panel = packed ? k->panel[type] : nullptr;
        if (panel != nullptr) {
            const int64_t panels = (rows + kPanel - 1) / kPanel;
            AlignedBytes buf(static_cast<size_t>(panels) * panel_bytes(traits->panel, nb));
            pack_rows(type, weights, rows, cols, buf.data);
            panel(buf.data, rows, cols, 0, panels, xa, n, y, rows, false);
            return LLMD_OK;
        }
        const size_t row = row_bytes(type, cols);
        for (int32_t t = 0; t < n; ++t)
            for (int32_t r = 0; r < rows; ++r)
                y[t * rows + r] = k->dot[type](static_cast<const uint8_t *>(weights) + r * row, x + t * cols,
                                               xa != nullptr ? xa + t * nb : nullptr, cols);
        return LLMD_OK;
    });
}

llmd_status llmd_kernel_attention(const float *q, int32_t n_q, const float *k, const float *v, int32_t n_pos,
                                  int32_t head_dim, const char *kv_type_k, const char *kv_type_v, int32_t n_ranges,
                                  int32_t run, const float *sinks, float softcap, float *out, const char *kernels) {
    return guarded([&]() -> llmd_status {
        if (q == nullptr || k == nullptr || v == nullptr || out == nullptr || n_q < 1 || n_q > 1024 ||
            n_pos < 1 || head_dim < 1 || head_dim > 1024 || n_ranges < 1 || n_ranges > n_pos || run < 0 ||
            run % kKeyBlock != 0 || !(softcap >= 0.0f) || std::isinf(softcap))
            return fail(LLMD_ERR_INVALID_ARGUMENT, "bad attention arguments");
        KVTypes types;
        if (!kv_type_for_test(kv_type_k, head_dim, &types.k) || !kv_type_for_test(kv_type_v, head_dim, &types.v))
            return LLMD_ERR_INVALID_ARGUMENT;
        const Kernels *table = kernels_for_test(kernels);
        if (table == nullptr) return LLMD_ERR_UNSUPPORTED;
        const size_t hd = static_cast<size_t>(head_dim);
        const size_t k_row = kv_row_bytes(types.k, head_dim), v_row = kv_row_bytes(types.v, head_dim);
        // The caller's rows written as the cache writes them (by the reference), keys
        // into key blocks (attention.h), in runs of `run` positions each in a buffer of
        // its own, as pool blocks are.
        const int32_t blocks = (n_pos + kKeyBlock - 1) / kKeyBlock, per_run = run > 0 ? run : blocks * kKeyBlock;
        std::vector<std::vector<uint8_t>> keys, values;
        std::vector<uint8_t> key(k_row);
        for (int32_t p = 0; p < n_pos; ++p) {
            const int32_t i = p % per_run;
            if (i == 0) {
                keys.emplace_back(static_cast<size_t>(per_run) * k_row);
                values.emplace_back(static_cast<size_t>(per_run) * v_row);
            }
            kv_row_ref(types.k, k + p * hd, key.data(), head_dim);
            key_store(types.k, key.data(), key_block(keys.back().data(), types.k, i, head_dim), i % kKeyBlock, head_dim);
            kv_row_ref(types.v, v + p * hd, &values.back()[i * v_row], head_dim);
        }
        // Quantized keys meet the queries quantized, as the engine's (model.h: attend).
        std::vector<BlockQ8A> q8(static_cast<size_t>(n_q) * (hd / QK));
        if (types.k != GGML_F16) table->quantize_q8a(q, q8.data(), int64_t{n_q} * head_dim, QK);
        std::vector<float> part_out(static_cast<size_t>(n_q) * hd);
        std::vector<AttnPartial> part(n_q), acc(n_q);
        const AttnScale score{1.0f / std::sqrt(static_cast<float>(head_dim)), softcap};
        attend_start(out, acc.data(), n_q, head_dim);
        for (int32_t r = 0; r < n_ranges; ++r) { // ranges of whole key blocks, some maybe empty
            const auto p0 = static_cast<int32_t>(std::min<int64_t>(n_pos, int64_t{blocks} * r / n_ranges * kKeyBlock));
            const auto p1 = static_cast<int32_t>(std::min<int64_t>(n_pos, int64_t{blocks} * (r + 1) / n_ranges * kKeyBlock));
            if (p1 == p0) continue;
            std::vector<AttnRun> runs;
            for (int32_t p = p0; p < p1;) {
                const int32_t n = std::min(p1 - p, per_run - p % per_run);
                const size_t at = static_cast<size_t>(p % per_run);
                runs.push_back({keys[p / per_run].data() + at * k_row, values[p / per_run].data() + at * v_row, n});
                p += n;
            }
            table->attend_range(q, q8.data(), n_q, runs.data(), static_cast<int>(runs.size()), head_dim, types, score,
                                part_out.data(), part.data(), r % 2 == 0); // cold or not, the same result
            table->attend_fold(out, acc.data(), part_out.data(), part.data(), n_q, head_dim);
        }
        if (sinks != nullptr) attend_sink(out, acc.data(), sinks, n_q, head_dim);
        attend_finish(out, acc.data(), n_q, head_dim);
        return LLMD_OK;
    });
}

llmd_status llmd_kernel_delta_scan(float *m, const float *q, const float *k, const float *v, const float *decay,
                                   const float *beta, int32_t n, int32_t hd, float *out, const char *kernels) {
    return guarded([&]() -> llmd_status {
        if (m == nullptr || q == nullptr || k == nullptr || v == nullptr || decay == nullptr || beta == nullptr ||
            out == nullptr || n < 1 || hd < 1 || hd > 1024)
            return fail(LLMD_ERR_INVALID_ARGUMENT, "bad delta scan arguments");
        const Kernels *table = kernels_for_test(kernels);
        if (table == nullptr) return LLMD_ERR_UNSUPPORTED;
        const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
        const size_t stride = static_cast<size_t>(hd);
        table->delta_scan(m, {q, k, v, stride, decay, beta, 1, out, stride}, n, hd, scale);
        return LLMD_OK;
    });
}

llmd_status llmd_kernel_ssm_scan(float *s, const float *x, const float *b, const float *c, const float *dt,
                                 const float *decay, int32_t n, int32_t head_dim, int32_t d_state, float *y,
                                 const char *kernels) {
    return guarded([&]() -> llmd_status {
        if (s == nullptr || x == nullptr || b == nullptr || c == nullptr || dt == nullptr || decay == nullptr ||
            y == nullptr || n < 1 || head_dim < 1 || head_dim > 1024 || d_state < 1 || d_state > 1024)
            return fail(LLMD_ERR_INVALID_ARGUMENT, "bad ssm scan arguments");
        const Kernels *table = kernels_for_test(kernels);
        if (table == nullptr) return LLMD_ERR_UNSUPPORTED;
        // A token's x, B and C lie in one row in the engine (the convolved channels): laid
        // out so here, all n tokens in one call, as the engine makes it.
        const size_t hd = static_cast<size_t>(head_dim), ds = static_cast<size_t>(d_state), row = hd + 2 * ds;
        std::vector<float> rows(static_cast<size_t>(n) * row);
        for (size_t t = 0; t < static_cast<size_t>(n); ++t) {
            std::copy_n(x + t * hd, hd, rows.data() + t * row);
            std::copy_n(b + t * ds, ds, rows.data() + t * row + hd);
            std::copy_n(c + t * ds, ds, rows.data() + t * row + hd + ds);
        }
        const float *r = rows.data();
        table->ssm_scan(s, {r, r + hd, r + hd + ds, row, dt, decay, 1, y, hd}, n, head_dim, d_state);
        return LLMD_OK;
    });
}

llmd_status llmd_kernel_glu(int32_t gelu, float *gate, const float *up, int64_t n, const char *kernels) {
    return guarded([&]() -> llmd_status {
        if (gate == nullptr || n < 0 || (gelu != 0 && gelu != 1))
            return fail(LLMD_ERR_INVALID_ARGUMENT, "bad glu arguments");
        const Kernels *table = kernels_for_test(kernels);
        if (table == nullptr) return LLMD_ERR_UNSUPPORTED;
        table->glu(gelu == 1, gate, up, n);
        return LLMD_OK;
    });
}

llmd_status llmd_kernel_rmsnorm(const float *x, const float *weight, int32_t n, float eps, float *out,
                                const char *kernels) {
    return guarded([&]() -> llmd_status {
        if (x == nullptr || weight == nullptr || out == nullptr || n < 1 || !(eps >= 0.0f))
            return fail(LLMD_ERR_INVALID_ARGUMENT, "bad rmsnorm arguments");
        const Kernels *table = kernels_for_test(kernels);
        if (table == nullptr) return LLMD_ERR_UNSUPPORTED;
        rmsnorm(out, x, weight, n, eps, table->sum_squares);
        return LLMD_OK;
    });
}

llmd_status llmd_kernel_kv_row(const char *type, const float *x, int32_t n, uint8_t *out, size_t capacity,
                               size_t *written, const char *kernels) {
    return guarded([&]() -> llmd_status {
        if (x == nullptr || out == nullptr || written == nullptr || n < 0)
            return fail(LLMD_ERR_INVALID_ARGUMENT, "bad KV row arguments");
        uint32_t t = GGML_F16;
        if (!kv_type_for_test(type, n, &t)) return LLMD_ERR_INVALID_ARGUMENT;
        if (capacity < kv_row_bytes(t, n)) return fail(LLMD_ERR_INVALID_ARGUMENT, "the KV row does not fit `out`");
        const Kernels *table = kernels_for_test(kernels);
        if (table == nullptr) return LLMD_ERR_UNSUPPORTED;
        table->kv_row(t, x, out, n);
        *written = kv_row_bytes(t, n);
        return LLMD_OK;
    });
}

llmd_status llmd_kernel_quantize(const float *x, int64_t n, int32_t group, int8_t *qs, float *d, int32_t *sums,
                                 const char *kernels) {
    return guarded([&]() -> llmd_status {
        if (x == nullptr || qs == nullptr || d == nullptr || sums == nullptr || (group != QK && group != QK_K) ||
            n < 1 || n % group != 0)
            return fail(LLMD_ERR_INVALID_ARGUMENT, "bad quantize arguments");
        const Kernels *table = kernels_for_test(kernels);
        if (table == nullptr) return LLMD_ERR_UNSUPPORTED;
        std::vector<BlockQ8A> blocks(static_cast<size_t>(n / QK));
        table->quantize_q8a(x, blocks.data(), n, group);
        for (size_t b = 0; b < blocks.size(); ++b) {
            std::copy_n(blocks[b].qs, QK, qs + b * QK);
            d[b] = blocks[b].d;
            sums[2 * b] = blocks[b].sum;
            sums[2 * b + 1] = blocks[b].sum_lo;
        }
        return LLMD_OK;
    });
}

} // extern "C"
