// quants.h — block formats, activation quantization and row dot products.
//
// Weights stay in their GGUF block format. Activations are quantized per block
// of 32 into BlockQ8A so quantized weights use integer dot products. Every dot
// product has a portable scalar reference (`*_ref`) and a fast path for the
// build machine; tests compare the two through llmd_kernel_matmul.
#pragma once

#include <cstddef>
#include <cstdint>

namespace llmd {

constexpr int QK = 32; // elements per quantized block

#pragma pack(push, 1)
struct BlockQ4_0 { uint16_t d; uint8_t qs[QK / 2]; };           // x = (q - 8) * d
struct BlockQ4_1 { uint16_t d; uint16_t m; uint8_t qs[QK / 2]; }; // x = q * d + m
struct BlockQ8_0 { uint16_t d; int8_t qs[QK]; };                // x = q * d
#pragma pack(pop)
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ8_0) == 34,
              "GGUF block sizes");

// A quantized activation block: d is the scale, sum = sum(qs), s = d * sum serves
// Q4_1's offset.
struct BlockQ8A { float d; float s; int32_t sum; int8_t qs[QK]; };

float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);

// Quantize n rows of `cols` floats (cols a multiple of QK), row t into
// xq + t * (cols / QK).
void quantize_rows(const float *x, int n, int64_t cols, BlockQ8A *xq);

// Dequantize row `row` of a weight matrix with n columns into y.
void dequantize_row(uint32_t type, const void *row, float *y, int64_t n);

// dot(weight row of n columns, activation). Quantized types read xq; F32/F16 read x.
float vec_dot(uint32_t type, const void *row, const float *x, const BlockQ8A *xq, int64_t n);
float vec_dot_ref(uint32_t type, const void *row, const float *x, const BlockQ8A *xq, int64_t n);

// True when the weight type is dotted against quantized activations.
bool type_uses_q8a(uint32_t type);
size_t row_bytes(uint32_t type, int64_t n);

// Name of the dot-product path this build uses ("avx512-vnni", "avx2", "scalar").
const char *kernel_path();

// ---- repacked weights (AVX-512 VNNI builds) -------------------------------
//
// Row dot products spend most of their instructions unpacking one row's blocks and
// reducing one accumulator. Packed weights interleave kPanel rows block by block so
// that one 512-bit VNNI instruction multiplies 16 rows by the same 4 activations.
// A panel holds, per block, 8 (Q8_0) or 4 (4-bit kinds) loads of 64 bytes where
// load j is rows 0..15 × elements 4j..4j+3 as unsigned bytes (a 4-bit byte also
// carries elements 16 + 4j.. in its high nibble, as GGUF pairs them; Q8_0 stores
// q + 128), followed by the block's 16 scales d as f16 and, for Q4_1, its 16
// offsets m. Scales next to their weights make one sequential stream, which the
// hardware prefetchers follow (scales gathered at the panel's end halved the rate
// at which one core streams a matrix from memory). Each type keeps its GGUF size.
// Rows past the end of the matrix are zero.
constexpr int kPanel = 16;

// Bytes of the packed form, or 0 when this build or type has none.
size_t packed_bytes(uint32_t type, int64_t rows, int64_t cols);
// Packs a GGUF matrix of `rows` rows of `cols` columns into `out` (packed_bytes long).
void pack_rows(uint32_t type, const void *w, int64_t rows, int64_t cols, uint8_t *out);
// For panels [p0, p1) of a packed matrix and n tokens whose activations are
// xq + t * (cols / QK): y[t * y_stride + r] = dot (or += dot when `add`).
void matmul_packed(uint32_t type, const uint8_t *packed, int64_t rows, int64_t cols, int64_t p0,
                   int64_t p1, const BlockQ8A *xq, int n, float *y, int64_t y_stride, bool add);

} // namespace llmd
