// quants.h — block formats, activation quantization and row dot products.
//
// Weights stay in their GGUF block format. Activations are quantized per block
// of 32 into BlockQ8A so quantized weights use integer dot products. Every dot
// product has a portable scalar reference (`*_ref`) and a fast path for the
// build machine; tests compare the two through llmd_kernel_matvec.
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

// A quantized activation block: d is the scale, s = d * sum(qs) serves Q4_1's offset.
struct BlockQ8A { float d; float s; int8_t qs[QK]; };

float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);

// Quantize n floats (n a multiple of QK) into n / QK blocks.
void quantize_row_q8a(const float *x, BlockQ8A *y, int64_t n);

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

} // namespace llmd
