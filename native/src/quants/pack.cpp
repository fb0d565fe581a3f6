// pack.cpp — repacking GGUF matrices into panels (quants.h) for the
// kernels of the variants that have them, from each type's piece decoder.
#include "quants/quants.h"

#include "kernels/kernels.h"

#include <array>
#include <cstring>

namespace llmd {

size_t packed_bytes(uint32_t type, int64_t rows, int64_t cols) {
    const TypeTraits *t = type_traits(type);
    if (t == nullptr || kernels().panel[type] == nullptr || rows < 1 || !type_runs(type, cols)) return 0;
    return static_cast<size_t>((rows + kPanel - 1) / kPanel) * panel_bytes(t->panel, cols / QK);
}

namespace {

// The byte each weight value q (as a byte) is stored as: its code in the layout's
// table (the first, where two codes hold one value), or q + offset.
std::array<uint8_t, 256> stored_weights(const PanelLayout &l) {
    std::array<uint8_t, 256> stored{};
    for (int q = -128; q < 128; ++q) stored[static_cast<uint8_t>(q)] = static_cast<uint8_t>(q + l.offset);
    if (l.lut != nullptr)
        for (int code = 15; code >= 0; --code) stored[static_cast<uint8_t>(l.lut[code])] = static_cast<uint8_t>(code);
    return stored;
}

// Row i's 4 bytes of row r of a plane (64 bytes a row: 16 rows' 4 bytes each).
void put_word(uint8_t *plane, int r, int i, uint32_t v) { std::memcpy(plane + r * 64 + i * 4, &v, 4); }

// The n bits at `shift` of every byte of the words of groups g0 .. g0 + per - 1,
// side by side in each byte: group g0 + k's at bit n·k.
uint32_t bit_fields(const uint32_t *words, int g0, int per, int shift, int n) {
    const uint32_t mask = 0x01010101u * ((1u << n) - 1);
    uint32_t v = 0;
    for (int k = 0; k < per; ++k) v |= ((words[g0 + k] >> shift) & mask) << (n * k);
    return v;
}

// Row i's entry of a set of 16 floats: f16 (exact: such layouts hold values the
// file stores as f16) or f32.
void store_float(bool f16, uint8_t *set, int i, float v) {
    if (f16) {
        const uint16_t h = fp32_to_fp16(v);
        std::memcpy(set + 2 * i, &h, 2);
    } else {
        std::memcpy(set + 4 * i, &v, 4);
    }
}

} // namespace

void pack_rows(uint32_t type, const void *w, int64_t rows, int64_t cols, uint8_t *out) {
    const TypeTraits &t = *type_traits(type);
    const PanelLayout &l = t.panel;
    const int64_t nb = cols / QK, panels = (rows + kPanel - 1) / kPanel;
    const size_t pbytes = panel_bytes(l, nb), weights = panel_weight_bytes(l);
    const int low = panel_low_bits(l);
    const size_t set = kPanel * (l.k_scales ? 1 : l.f16 ? 2 : 4); // one set of 16 scales or mins
    const int sets = l.split ? 2 : 1;
    const size_t src_row = row_bytes(type, cols);
    std::memset(out, 0, static_cast<size_t>(panels) * pbytes);
    const std::array<uint8_t, 256> stored = stored_weights(l);
    Piece p;
    for (int64_t r = 0; r < rows; ++r) {
        const uint8_t *row = static_cast<const uint8_t *>(w) + static_cast<size_t>(r) * src_row;
        uint8_t *panel = out + static_cast<size_t>(r / kPanel) * pbytes;
        const int i = static_cast<int>(r % kPanel);
        for (int64_t b = 0; b < nb; ++b) {
            uint8_t *blk = panel + panel_piece_offset(l, b);
            t.decode(row, b, &p);
            // Element e's byte u sits in group g = e / 4 at byte e % 4 of the group's
            // word (little-endian); PanelLayout's planes hold its low bits, then the rest.
            uint32_t words[QK / 4];
            for (int g = 0; g < QK / 4; ++g) {
                words[g] = 0;
                for (int k = 0; k < 4; ++k) words[g] |= uint32_t{stored[static_cast<uint8_t>(p.q[4 * g + k])]} << 8 * k;
            }
            if (low == 8)
                for (int g = 0; g < QK / 4; ++g) put_word(blk, g, i, words[g]);
            else if (low == 4) // plane row r: group r's nibbles, then group r + 4's
                for (int r = 0; r < 4; ++r)
                    put_word(blk, r, i, bit_fields(words, r, 1, 0, 4) | bit_fields(words, r + 4, 1, 0, 4) << 4);
            else // plane row r: groups 4r..4r+3, 2 bits each
                for (int r = 0; r < 2; ++r) put_word(blk, r, i, bit_fields(words, 4 * r, 4, 0, 2));
            uint8_t *high = blk + 64 * low;
            if (l.bits - low == 2)
                for (int r = 0; r < 2; ++r) put_word(high, r, i, bit_fields(words, 4 * r, 4, low, 2));
            else if (l.bits - low == 1)
                put_word(high, 0, i, bit_fields(words, 0, QK / 4, low, 1));
            uint8_t *scales = blk + weights, *mins = scales + sets * set;
            for (int h = 0; h < sets; ++h) {
                if (l.k_scales) { // the integers; d and m once per 256 elements
                    scales[h * set + i] = static_cast<uint8_t>(static_cast<int8_t>(p.scale[h]));
                    if (l.mins) mins[h * set + i] = static_cast<uint8_t>(static_cast<int8_t>(p.mscale[h]));
                } else {
                    store_float(l.f16, scales + h * set, i, p.d * static_cast<float>(p.scale[h]));
                    if (l.mins) store_float(l.f16, mins + h * set, i, p.min(h));
                }
            }
            if (l.k_scales && b % 8 == 0) {
                uint8_t *header = blk - panel_header_bytes(l);
                store_float(true, header, i, p.d);
                if (l.mins) store_float(true, header + 2 * kPanel, i, p.m);
            }
        }
    }
}

void matmul_packed(uint32_t type, const uint8_t *packed, int64_t rows, int64_t cols, int64_t p0, int64_t p1,
                   const BlockQ8A *xq, int n, float *y, int64_t y_stride, bool add) {
    kernels().panel[type](packed, rows, cols, p0, p1, xq, n, y, y_stride, add);
}

} // namespace llmd
