// quantize.h — the from_float side of the tensor types: float rows into GGUF blocks.
//
// Each quantizer is the published reference algorithm of its format (the one
// llama-quantize runs without an importance matrix), scalar and deterministic, so
// the same floats always give the same bytes on every machine and thread count:
//   Q8_0            d = max|x| / 127, q = round(x / d) (halves away from zero)
//   Q4_0, Q5_0      d = -(the signed value of largest magnitude) / 8 (16), q truncated
//                   from x / d + 8.5 (16.5)
//   Q4_1, Q5_1      d = (max - min) / 15 (31), m = min, q = x / d rounded
//   Q6_K            per 16 elements a scale searched over 19 candidates for the least
//                   x²-weighted squared error, then the 16 scales as int8 of one f16 d
//   Q4_K, Q5_K      per 32 elements a scale and a min searched over 21 (16) candidates
//                   for the least (rms + |x|)-weighted squared error, then the 8 scales
//                   and 8 mins as 6-bit integers of two f16 super-scales
// Types listed in the traits table with a null from_float have no quantizer. The KV
// cache writes Q4_0 blocks of its own fit (quantize_row_q4_0_kv, below).
#pragma once

#include "quants/quants.h"

#include <cstdint>
#include <string>

namespace llmd {

class ThreadPool;

void quantize_row_q4_0(const float *x, uint8_t *out, int64_t n);
void quantize_row_q4_1(const float *x, uint8_t *out, int64_t n);
void quantize_row_q5_0(const float *x, uint8_t *out, int64_t n);
void quantize_row_q5_1(const float *x, uint8_t *out, int64_t n);
void quantize_row_q8_0(const float *x, uint8_t *out, int64_t n);
void quantize_row_q4_k(const float *x, uint8_t *out, int64_t n);
void quantize_row_q5_k(const float *x, uint8_t *out, int64_t n);
void quantize_row_q6_k(const float *x, uint8_t *out, int64_t n);
void quantize_row_f32(const float *x, uint8_t *out, int64_t n);
void quantize_row_f16(const float *x, uint8_t *out, int64_t n);
void quantize_row_bf16(const float *x, uint8_t *out, int64_t n);

// The KV cache's Q4_0 (kernels.h: kv_row), which fits each block's scale rather than
// taking the reference's d = m / -8 (m the signed value of largest magnitude): for
// each of kQ4KVCandidates inverse scales i_c = -s_c / m (s_c from 6.6 to 9.4) the codes
// l = clamp(nearest(i_c x), -8, 7), their least-squares scale Σxl / Σl² (both sums
// over the block in order, by fused multiply-adds), and of these the fit of least
// squared error. On Gaussian blocks (rotated keys and values are near Gaussian, see
// ops/attention.h) that is 11 % less squared error than the reference's; on SmolLM2
// it cut q4_0's perplexity cost from +7.20 % to +5.80 % at context 512 and from
// +8.45 % to +7.15 % at 4,096 (llama.cpp's: +7.59 %, +7.87 %). A block whose
// magnitude is below 1e-15 is stored as zeros. The variants' writers compute the sums
// with these candidates and this pick, so every variant writes the same bytes.
constexpr int kQ4KVCandidates = 8;
// Fills iscale with the candidates' inverse scales for a block of signed extreme m;
// false for a block stored as zeros.
bool q4_0_kv_candidates(float m, float *iscale);
// The candidate kept, given each one's Σxl and Σl²: the largest (Σxl)² / Σl² (the
// least squared error), the first on ties.
int q4_0_kv_pick(const float *sxl, const float *sll);
void quantize_row_q4_0_kv(const float *x, uint8_t *out, int64_t n);

// Converts `rows` rows of `cols` elements from src_type (a type with to_float) to
// dst_type (a type with from_float): each row is decoded, checked to be finite, and
// encoded. Rows are shared across the pool's threads; every row's bytes depend only
// on that row. Returns an empty string on success, else why the conversion cannot
// be done (a row length that is not whole blocks, a non-finite value and its row).
std::string convert_rows(uint32_t src_type, const uint8_t *src, int64_t rows, int64_t cols, uint32_t dst_type,
                         uint8_t *dst, ThreadPool &pool);

} // namespace llmd
