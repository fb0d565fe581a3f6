// quants.h — tensor types: the traits table, activation quantization and row dot
// products.
//
// `type_traits(type)` is the one place a GGUF tensor type is described: its name,
// block size in elements and bytes, its scalar references (to_float and dot), the
// activations its kernels consume, its repacked panel layout and its quantizer
// (from_float, quantize.h). Its fast kernels are per CPU variant, in the kernel tables
// (kernels/kernels.h), indexed by the same type number.
// The GGUF reader sizes tensors from it; binding refuses a type whose row has no
// kernels; matmul and embedding lookups call through it. There is no switch on a
// type anywhere else.
//
// Weights stay in their GGUF block format. Activations are quantized per block of
// 32 into BlockQ8A, and every integer type is described by how it decodes one
// 32-element piece of a row (`Piece`): element i is d * scale[i / 16] * q[i] +
// m * mscale[i / 16] with q an int8. The scalar references are that definition summed in
// double; every variant's fast kernels (kernels/) are tested against them through
// llmd_kernel_matmul.
#pragma once

#include <cstddef>
#include <cstdint>

namespace llmd {

// Tensor element types, numbered as GGUF numbers them.
enum GGMLType : uint32_t {
    GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q5_0 = 6, GGML_Q5_1 = 7,
    GGML_Q8_0 = 8, GGML_Q8_1 = 9, GGML_Q2_K = 10, GGML_Q3_K = 11, GGML_Q4_K = 12, GGML_Q5_K = 13,
    GGML_Q6_K = 14, GGML_Q8_K = 15, GGML_IQ2_XXS = 16, GGML_IQ2_XS = 17, GGML_IQ3_XXS = 18,
    GGML_IQ1_S = 19, GGML_IQ4_NL = 20, GGML_IQ3_S = 21, GGML_IQ2_S = 22, GGML_IQ4_XS = 23,
    GGML_I8 = 24, GGML_I16 = 25, GGML_I32 = 26, GGML_I64 = 27, GGML_F64 = 28, GGML_IQ1_M = 29,
    GGML_BF16 = 30, GGML_TQ1_0 = 34, GGML_TQ2_0 = 35, GGML_MXFP4 = 39,
};
constexpr uint32_t kTypeCount = 43; // GGUF type numbers the traits table covers: 0 .. 42

constexpr int QK = 32;    // elements per activation block and per decoded piece
constexpr int QK_K = 256; // elements per K-quant super-block

// A quantized activation block: x[i] ≈ d * qs[i]; sum = sum(qs), sum_lo = the sum
// of the first 16 (for types whose mins change every 16 elements), s = d * sum.
struct BlockQ8A { float d; float s; int32_t sum; int32_t sum_lo; int8_t qs[QK]; };

// One 32-element piece of a quantized row, decoded:
// element i = d * scale[i / 16] * q[i] + m * mscale[i / 16], d and m f16 values
// (or MXFP4's power of two), the scales small integers.
struct Piece {
    float d;
    int32_t scale[2];
    float m;
    int32_t mscale[2];
    int8_t q[QK];
    float min(int half) const { return m * static_cast<float>(mscale[half]); }
};

// What a type's kernels take as the other operand.
enum class Activation : uint8_t {
    None, // the engine has no kernels for the type: binding refuses it
    F32,  // the float activations themselves
    Q8A,  // BlockQ8A blocks of 32, each with its own scale
    Q8K,  // BlockQ8A blocks of 32 sharing one scale per 256 elements, as llama.cpp's
          // Q8_K quantizes for the K-quants (so that results match its numerics)
};

// How a type is repacked into panels of kPanel rows for the tiled kernels of the
// variants that have them (kernels/x86/panels_avx512.h and panels_avx2.h,
// kernels/arm/panels_arm.h). Every panel-block is 16 rows × 32 elements: the weights as
// unsigned integers u = q + offset of `bits` bits, then the rows' scales d * scale
// (one set, or two when the scale changes every 16 elements), then their mins
// likewise when the type has them. The kernel multiplies 8 vectors w[g] of 64
// bytes, rows 0..15 × elements 4g..4g+3 (byte 4 i + k: row i, element 4 g + k).
// 8-bit layouts store them as they are. Narrower ones keep the file's size: the
// same byte positions hold a low plane of nibbles (4 slots of 64 bytes, slot j
// w[j] in bits 0..3 and w[j + 4] in bits 4..7) for 4 to 6 bits, or of bit pairs
// (2 slots, slot m w[4 m + c] in bits 2 c..2 c + 1) for 2 and 3 bits; then a high
// plane with u's remaining bits: pairs as above, or single bits (1 slot, w[g] in
// bit g).
// K-quants keep their two-level scales (`k_scales`): per panel-block the rows'
// integer scales (and min scales) as int8, and before every 8 panel-blocks (256
// elements) each row's d (and m) as f16, as compact as the file's own.
struct PanelLayout {
    uint8_t bits = 0;            // bits of u: 2 to 6 or 8; 0: no packed form
    int16_t offset = 0;          // u = q + offset
    bool split = false;          // separate scales (and mins) for elements 0..15 and 16..31
    bool mins = false;           // the type has additive mins
    bool f16 = false;            // scales and mins stored as f16 (they are f16 in the file)
    const int8_t *lut = nullptr; // 4-bit codes index this table of q (IQ4_NL, IQ4_XS, MXFP4)
    bool k_scales = false;       // two-level scales, as above
};

// 4-bit codes of IQ4_NL and IQ4_XS, and of MXFP4 (e2m1 values doubled; the scale
// is halved to match).
inline constexpr int8_t kIQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
inline constexpr int8_t kFP4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// Panel layouts: {bits, offset, split, mins, f16, lut, k_scales}.
inline constexpr PanelLayout kPanelQ4_0{4, 8, false, false, true, nullptr, false};
inline constexpr PanelLayout kPanelQ4_1{4, 0, false, true, true, nullptr, false};
inline constexpr PanelLayout kPanelQ5_0{5, 16, false, false, true, nullptr, false};
inline constexpr PanelLayout kPanelQ5_1{5, 0, false, true, true, nullptr, false};
inline constexpr PanelLayout kPanelQ8_0{8, 128, false, false, true, nullptr, false};
inline constexpr PanelLayout kPanelIQ4NL{4, 128, false, false, true, kIQ4NL, false};
inline constexpr PanelLayout kPanelMXFP4{4, 128, false, false, false, kFP4, false};
inline constexpr PanelLayout kPanelQ2_K{2, 0, true, true, true, nullptr, true};
inline constexpr PanelLayout kPanelQ3_K{3, 4, true, false, true, nullptr, true};
inline constexpr PanelLayout kPanelQ4_K{4, 0, false, true, true, nullptr, true};
inline constexpr PanelLayout kPanelQ5_K{5, 0, false, true, true, nullptr, true};
inline constexpr PanelLayout kPanelQ6_K{6, 32, true, false, true, nullptr, true};
inline constexpr PanelLayout kPanelIQ4XS{4, 128, false, false, true, kIQ4NL, true};

using DecodeFn = void (*)(const uint8_t *row, int64_t piece, Piece *out);
using ToFloatFn = void (*)(const uint8_t *row, float *y, int64_t n);
using FromFloatFn = void (*)(const float *x, uint8_t *row, int64_t n);
using DotFn = float (*)(const uint8_t *row, const float *x, const BlockQ8A *xq, int64_t n);
// Panels [p0, p1) of a packed matrix against n tokens (see matmul_packed).
using PanelFn = void (*)(const uint8_t *packed, int64_t rows, int64_t cols, int64_t p0, int64_t p1,
                         const BlockQ8A *xq, int n, float *y, int64_t y_stride, bool add);

struct TypeTraits {
    const char *name;
    int64_t block_elems;  // elements per block
    int64_t block_bytes;  // bytes per block
    Activation activation;
    DecodeFn decode;      // integer types: the definition of one piece (else nullptr)
    ToFloatFn to_float;   // scalar reference: a row as floats
    DotFn dot_ref;        // scalar reference: a row dotted with x (F32) or xq (Q8A)
    PanelLayout panel;    // the repacked form, for variants with a kernel over it
    FromFloatFn from_float = nullptr; // quantizer: n floats into a row (quantize.h), or nullptr
};

// The traits of a GGUF type, or nullptr for a number GGUF does not define.
const TypeTraits *type_traits(uint32_t type);
// Its name ("Q4_K"), or nullptr for a number GGUF does not define.
const char *type_name(uint32_t type);
// True when the engine has kernels for rows of `cols` elements of the type.
bool type_runs(uint32_t type, int64_t cols);

float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);

// Quantize n rows of `cols` floats (cols a multiple of QK) for every integer
// kernel: row t's Q8A blocks into xq + t * (cols / QK), then, when cols is a whole
// number of 256-element groups, its Q8K blocks into xq + (n + t) * (cols / QK).
// xq holds quantized_blocks(n, cols).
void quantize_rows(const float *x, int n, int64_t cols, BlockQ8A *xq);
// Rows [t0, t1) of what quantize_rows writes for n rows, only the formats asked for
// (Q8K only where cols allows it): threads can share the rows, and a matrix input
// is quantized only as its kernels read it.
void quantize_rows_part(const float *x, int n, int64_t cols, BlockQ8A *xq, int t0, int t1, bool q8a, bool q8k);
inline size_t quantized_blocks(int n, int64_t cols) { return 2 * static_cast<size_t>(n) * static_cast<size_t>(cols / QK); }
// The blocks a type's kernels read from what quantize_rows wrote for n rows.
inline const BlockQ8A *activations_of(const TypeTraits &t, const BlockQ8A *xq, int n, int64_t cols) {
    return t.activation == Activation::Q8K ? xq + static_cast<size_t>(n) * static_cast<size_t>(cols / QK) : xq;
}

// Bytes of a row of n elements (n a whole number of blocks).
size_t row_bytes(uint32_t type, int64_t n);

// ---- repacked weights --------------------------------------------------------
//
// Row dot products spend most of their instructions unpacking one row's blocks and
// reducing one accumulator. Packed weights interleave kPanel rows piece by piece
// (PanelLayout) so that one 512-bit VNNI instruction multiplies 16 rows by the same
// 4 activations: w[g] of a piece's weights is rows 0..15 × elements 4g..4g+3 as
// unsigned bytes, unpacked from the layout's planes.
// Scales next to their weights make one sequential stream, which the hardware
// prefetchers follow (scales gathered at the panel's end halved the rate at which
// one core streams a matrix from memory). Rows past the end of the matrix are zero.
constexpr int kPanel = 16;

// Bits of a layout's low plane (PanelLayout): nibbles, bit pairs, or whole bytes.
constexpr int panel_low_bits(const PanelLayout &l) { return l.bits == 8 ? 8 : l.bits >= 4 ? 4 : 2; }
// Bytes of the weights of one panel-block: 16 × 32 of `bits` bits.
constexpr size_t panel_weight_bytes(const PanelLayout &l) { return size_t{64} * l.bits; }
// Bytes of one panel-block (16 rows × 32 elements) in a layout: weights, then
// scales and mins.
constexpr size_t panel_piece_bytes(const PanelLayout &l) {
    const size_t sets = (l.split ? 2 : 1) * (l.mins ? 2 : 1);
    return panel_weight_bytes(l) + sets * kPanel * (l.k_scales ? 1 : l.f16 ? 2 : 4);
}
// Bytes before every 8 panel-blocks of a k_scales layout: each row's d (and m) as f16.
constexpr size_t panel_header_bytes(const PanelLayout &l) {
    return l.k_scales ? (l.mins ? 2 : 1) * kPanel * 2 : 0;
}
// Offset of panel-block b within its panel.
constexpr size_t panel_piece_offset(const PanelLayout &l, int64_t b) {
    if (!l.k_scales) return static_cast<size_t>(b) * panel_piece_bytes(l);
    return static_cast<size_t>(b / 8) * (panel_header_bytes(l) + 8 * panel_piece_bytes(l)) + panel_header_bytes(l) +
           static_cast<size_t>(b % 8) * panel_piece_bytes(l);
}
// Where a k_scales super-block's header (the rows' f16 d, then m) sits in a panel,
// before its first panel-block b0.
inline const uint8_t *panel_header(const PanelLayout &l, const uint8_t *panel, int64_t b0) {
    return panel + panel_piece_offset(l, b0) - panel_header_bytes(l);
}
// Bytes of one panel of nb panel-blocks.
constexpr size_t panel_bytes(const PanelLayout &l, int64_t nb) {
    return l.k_scales ? static_cast<size_t>(nb / 8) * (panel_header_bytes(l) + 8 * panel_piece_bytes(l))
                      : static_cast<size_t>(nb) * panel_piece_bytes(l);
}

// Bytes of the packed form, or 0 when the kernels in use have no panel kernel for the type.
size_t packed_bytes(uint32_t type, int64_t rows, int64_t cols);
// Packs a GGUF matrix of `rows` rows of `cols` columns into `out` (packed_bytes long).
void pack_rows(uint32_t type, const void *w, int64_t rows, int64_t cols, uint8_t *out);
// For panels [p0, p1) of a packed matrix and n tokens whose activations are
// xq + t * (cols / QK): y[t * y_stride + r] = dot (or += dot when `add`).
void matmul_packed(uint32_t type, const uint8_t *packed, int64_t rows, int64_t cols, int64_t p0,
                   int64_t p1, const BlockQ8A *xq, int n, float *y, int64_t y_stride, bool add);

} // namespace llmd
